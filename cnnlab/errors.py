"""The project's exceptions: raised where a problem is found, turned into one line only by the CLI."""

from __future__ import annotations

import os
import resource

STANDARD_STREAM = "-"  # as a file name: standard input, or standard output for an output


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def named(path: str | os.PathLike[str]) -> str:
    """A path as a user can type it back: as it is where every character is printable, else in the shell's $'...'
    quoting, each byte that is not printable text escaped (a name that is not UTF-8, or that holds a newline)."""
    text = os.fsdecode(path)
    if text.isprintable():
        return text
    shown = []
    for character in text:
        if character in _ESCAPES:
            shown.append(_ESCAPES[character])
        elif character.isprintable():
            shown.append(character)
        else:  # a control character, or a byte that is not UTF-8 (os.fsdecode's surrogate escape)
            shown += [f"\\x{byte:02x}" for byte in os.fsencode(character)]
    return "$'" + "".join(shown) + "'"


def shown(path: str | os.PathLike[str]) -> str:
    """An output path as messages name it: `-` is standard output."""
    return "<stdout>" if os.fspath(path) == STANDARD_STREAM else named(path)


def byte_size(nbytes: int) -> str:
    """A number of bytes as a message says it: 812 bytes, 3.4 MB, 190 TB (powers of 1000, as disks are sold)."""
    for unit, scale in (("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.0f} {unit}" if nbytes >= 1000 * scale else f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} bytes"


def memory_limit_note() -> str:
    """Where an address-space limit (ulimit -v) is set, words naming it, for a message about running out of memory."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    return "" if limit == resource.RLIM_INFINITY else f" under the address-space limit of {limit >> 20} MB (ulimit -v)"


class CnnlabError(Exception):
    """Any failure cnnlab reports to its user as one line."""


class UsageError(CnnlabError):
    """The command line (exit status 2) or the Python API asked for something that cannot be done."""


class ArrayError(CnnlabError, ValueError):
    """An array handed to the Python API that cnnlab cannot take: its shape, dtype, layout, memory or values,
    said together with what was expected. A ValueError too, as numpy's own such errors are."""


class InputFileError(CnnlabError):
    """A file that cannot be read as what it should be, with the line where that was found."""

    def __init__(self, path: str | os.PathLike[str], message: str, line: int | None = None) -> None:
        self.path = os.fspath(path)
        self.line = line
        self.message = message
        where = "<stdin>" if self.path == STANDARD_STREAM else named(self.path)
        where = where if line is None else f"{where}:{line}"
        super().__init__(f"{where}: {message}")

    def __reduce__(self) -> tuple[type[InputFileError], tuple[str, str, int | None]]:
        """Made again from its parts, so that it crosses a process boundary (Dask's workers) as itself."""
        return type(self), (self.path, self.message, self.line)


class OutputFileError(CnnlabError):
    """An output that cannot be written where it was asked for."""


class ResourceError(CnnlabError):
    """The machine cannot give a run what it needs: memory, under its limits."""


class DeviceError(CnnlabError):
    """The GPU path cannot run: no pycuda, no driver or device, no PTX, or a failed launch."""


class DeviceLostError(DeviceError):
    """The device faulted (a failed launch) or went away: its context and all in it are lost to this process."""
