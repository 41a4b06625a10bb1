"""Output safety, for every format: refusing to write over an input, and outputs that appear only whole.

Where an output goes depends on what its path names (`output_target`):
  a regular file, or nothing yet   written beside it under a temporary name, renamed onto it on success;
  a symbolic link                  the same, beside the file the link leads to: the link stays a link,
                                   and a dangling link's target is created;
  a FIFO, a device, /dev/stdout    written to directly: such a node cannot be replaced, and must never be
                                   (cnnlab cpu ... /dev/null, as root, would otherwise replace /dev/null);
  `-`                              standard output, directly.
A direct output cannot be taken back: a run that fails half-way has already written what it wrote.
"""

from __future__ import annotations

import enum
import errno
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cnnlab.errors import STANDARD_STREAM, OutputFileError, named, shown
from cnnlab.interrupts import held

# The temporary file is made readable by its owner only; outputs get the usual mode (0666 less the umask).
_UMASK = os.umask(0)
os.umask(_UMASK)
_TEMPORARY_SUFFIX = ".tmp"
_RANDOM_CHARACTERS = 12  # what _create_temporary puts between the prefix and the suffix


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """The OS's failure to write an output (a full disk, a file-size limit) as an OutputFileError naming it. A
    closed pipe stays a BrokenPipeError: the command line ends quietly on it, as Unix tools do."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as error:
        raise OutputFileError(f"{shown(path)}: cannot write: {error.strerror or error}") from None


class Placement(enum.Enum):
    """How an output reaches its target."""

    REPLACE = "written beside the target and renamed onto it"
    DIRECT = "written to the target itself"


@dataclass(frozen=True)
class OutputTarget:
    """Where an output path leads: `target` is the file written (a link's target), `path` what was asked for;
    `descriptor` a file descriptor this process inherited, written through (`-` is 1, so is /dev/stdout)."""

    path: str
    target: str
    placement: Placement
    descriptor: int | None = None

    def fail(self, what: str, error: OSError | None = None) -> OutputFileError:
        reason = f": {error.strerror or error}" if error is not None else ""
        return OutputFileError(f"{shown(self.path)}: {what}{reason}")


# /dev/stdout, /dev/fd/N, /proc/self/fd/N: a descriptor of this process's own, open already.
_DESCRIPTOR_LINK = re.compile(r"/(?:dev|proc/(?:self|thread-self|(?P<pid>\d+)))/fd/(?P<fd>\d+)")


def _inherited_descriptor(path: str) -> int | None:
    """The descriptor `path` names through /dev/fd or /proc (following links to it), or None. Such a path is
    written through its descriptor, never reopened: reopened, a shell's `>> log` would be written from its
    start, and resolved, its file would be replaced under the shell's feet."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on a chain of links
        match = _DESCRIPTOR_LINK.fullmatch(current)
        if match and match["pid"] in (None, str(os.getpid())):
            return int(match["fd"])
        if not os.path.islink(current):
            return None
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
    return None


def output_target(path: str | os.PathLike) -> OutputTarget:
    """Where `path` leads, checked before anything is written: a folder that can take the file, a name the
    file system allows, and no directory in the way. Creates nothing."""
    path = os.fspath(path)
    if path == STANDARD_STREAM:
        return OutputTarget(path, path, Placement.DIRECT, descriptor=1)
    if not path:
        raise OutputFileError("an output's file name is empty")
    if path.endswith(os.sep):
        raise OutputFileError(f"{named(path)}: names a directory (it ends in {os.sep}), not a file")
    descriptor = _inherited_descriptor(path)
    if descriptor is not None:
        return OutputTarget(path, path, Placement.DIRECT, descriptor)
    try:
        status = os.stat(path)  # through any links
    except FileNotFoundError:
        status = None
    except OSError as error:  # a loop of links, a file where a folder should be, ...
        raise OutputFileError(f"{named(path)}: cannot write here: {error.strerror or error}") from None
    target = os.path.realpath(path)
    if (status is not None and stat.S_ISDIR(status.st_mode)) or os.path.isdir(target):  # `missing/..` too
        raise OutputFileError(f"{named(path)}: is a directory, not a file")
    if status is not None and not stat.S_ISREG(status.st_mode):  # a FIFO, a device, a socket: written through
        return OutputTarget(path, path, Placement.DIRECT)
    _check_folder(path, target)
    return OutputTarget(path, target, Placement.REPLACE)


def _check_folder(path: str, target: str) -> None:
    """The target's nearest existing folder must be a folder this process can write to, and its name short enough."""
    folder = os.path.dirname(target)
    while not os.path.lexists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise OutputFileError(f"{named(path)}: cannot write here: {named(folder)} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputFileError(f"{named(path)}: cannot write here: {named(folder)} is not writable")
    name_bytes, limit = len(os.fsencode(os.path.basename(target))), _name_limit(folder)
    if name_bytes > limit:
        raise OutputFileError(f"{named(path)}: file name too long ({name_bytes} bytes; this file system allows {limit})")


def _name_limit(folder: str) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _temporary_prefix(name: str, limit: int) -> str:
    """`.name.`, shortened so that the temporary file's name (prefix, random characters, suffix) fits the file system."""
    longest = limit - _RANDOM_CHARACTERS - len(_TEMPORARY_SUFFIX) - 2
    while len(os.fsencode(name)) > longest:
        name = name[:-1]
    return f".{name}."


def _create_temporary(folder: str, prefix: str) -> tuple[int, str]:
    """A new file of this process's own in `folder` (O_EXCL: never one that exists), readable by its owner only until
    _take_mode gives it the target's mode, as tempfile.mkstemp makes one; without importing tempfile, which imports
    random, shutil, bz2 and lzma: 6 ms of a 0.2 s run of cpu mode."""
    for _ in range(100):
        path = os.path.join(folder, f"{prefix}{os.urandom(_RANDOM_CHARACTERS // 2).hex()}{_TEMPORARY_SUFFIX}")
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", folder)


STDOUT_FILE = "/dev/stdout"  # standard output's file by name: `-` as an output is checked as this path is


def refuse_same_file(output: str | os.PathLike, others: Mapping[str, str | os.PathLike]) -> None:
    """Raise an OutputFileError if `output` is one of `others` (by role: "input file", ...), as refuse_same_files says."""
    refuse_same_files([output], others.items())


def refuse_same_files(outputs: Iterable[str | os.PathLike], others: Iterable[tuple[str, str | os.PathLike]]) -> None:
    """Raise an OutputFileError where an output is one of `others` ((role, path) pairs, the first named): the same file
    under another name, or the same path once links are followed, whether or not it exists yet; each file looked at once
    rather than once a pair, since a folder may hold thousands of inputs."""
    known: dict[tuple[int, int] | str, tuple[int, str, str | os.PathLike]] = {}
    for index, (role, other) in enumerate(others):
        if os.fspath(other) != STANDARD_STREAM:
            for key in _identities(other):
                known.setdefault(key, (index, role, other))
    for output in outputs:
        found = [known[key] for key in _identities(output) if key in known]
        if found:
            _, role, other = min(found, key=lambda entry: entry[0])
            raise OutputFileError(f"{shown(output)}: is the {role} {named(other)}; refusing to write over it")


def _identities(path: str | os.PathLike) -> list[tuple[int, int] | str]:
    """What two names of one file share: the path their links lead to, and where the file exists its device and inode
    (os.path.samefile's test, with its fallback to the path for a file not there yet). `-`, standard output: what
    /dev/stdout leads to, the file the shell opened it on (`>> in.csv`)."""
    if os.fspath(path) == STANDARD_STREAM:
        path = STDOUT_FILE
    try:
        status = os.stat(path)
    except OSError:  # it does not exist (yet)
        return [os.path.realpath(path)]
    return [os.path.realpath(path), (status.st_dev, status.st_ino)]


def _take_mode(descriptor: int, target: str) -> None:
    """Give the new file what the file it replaces had (its mode, and its owner where this process may), or the
    usual mode of a new file (0666 less the umask): replacing a private file must not make it readable to all."""
    try:
        status = os.stat(target)
        mode, owner = stat.S_IMODE(status.st_mode), (status.st_uid, status.st_gid)
    except FileNotFoundError:
        mode, owner = 0o666 & ~_UMASK, None
    # Both where the file system lets us: one that keeps no modes (vfat), or an owner not ours to give, is no failure.
    with suppress(OSError):
        os.fchmod(descriptor, mode)
    if owner is not None:
        with suppress(OSError):
            os.fchown(descriptor, *owner)


class _GuardedStream:
    """A file whose write errors are OutputFileErrors naming the output (see writing)."""

    def __init__(self, file: IO[Any], target: OutputTarget) -> None:
        self._file = file
        self._target = target

    def write(self, data: Any) -> int:
        with writing(self._target.path):
            return self._file.write(data)


class AtomicOutput:
    """An output file that appears only whole (see the module's docstring for links, devices and `-`).

    A failure or interruption inside the `with` block removes the temporary file and leaves any
    existing file at the target untouched. Where it is one of a set (`together`), the end of its
    `with` block only finishes the file, and the set renames it with the others once all are written.
    """

    def __init__(self, path: str | os.PathLike, binary: bool = False, together: OutputSet | None = None) -> None:
        self.path = path
        self._binary = binary
        self._together = together
        self._file: IO[Any] | None = None
        self._descriptor: int | None = None  # the file's, closed here where no file object holds it yet (a failure first)
        self._temporary: str | None = None

    def open(self) -> _GuardedStream:
        if self._together is not None:
            self._together.add(self)
        target = self._target = output_target(self.path)
        try:
            return self._open(target)
        except BaseException:  # a failure (or a signal) after the temporary file was made: it goes
            self.discard()
            raise

    def _open(self, target: OutputTarget) -> _GuardedStream:
        try:
            if target.descriptor is not None:
                for stream in (sys.stdout, sys.stderr):  # what was printed before comes first
                    if stream is not None and target.descriptor == stream.fileno():
                        stream.flush()
                self._descriptor = os.dup(target.descriptor)
            elif target.placement is Placement.DIRECT:
                self._descriptor = os.open(target.target, os.O_WRONLY | os.O_CLOEXEC)  # never created: it exists
            else:
                folder = Path(target.target).parent
                folder.mkdir(parents=True, exist_ok=True)
                prefix = _temporary_prefix(os.path.basename(target.target), _name_limit(str(folder)))
                with held():  # a signal as the file is made is raised once its name is known, so that it is removed
                    self._descriptor, self._temporary = _create_temporary(str(folder), prefix)
                _take_mode(self._descriptor, target.target)
        except OSError as error:
            raise target.fail("cannot write here", error) from None
        with held():  # the descriptor and its file object change hands whole: discard() closes one or the other, once
            self._file = os.fdopen(self._descriptor, "wb") if self._binary else os.fdopen(self._descriptor, "w", newline="\n")
        return _GuardedStream(self._file, target)

    @property
    def regular(self) -> bool:
        """Whether the file (open) is a temporary regular file, whose writes never wait on another program."""
        return self._temporary is not None

    def finish(self) -> None:
        """Flush and close the file: where a full disk or a file-size limit shows itself last."""
        assert self._file is not None
        with writing(self._target.path):
            self._file.close()

    def place(self) -> None:
        """Rename the finished file onto its target (nothing to do for a direct output)."""
        assert self._file is None or self._file.closed, "place() before finish()"
        if self._temporary is not None:
            with writing(self._target.path):
                os.replace(self._temporary, self._target.target)
            self._temporary = None

    def commit(self) -> None:
        try:
            self.finish()
            self.place()
        finally:
            self.discard()

    def discard(self) -> None:
        """Close the file (what its buffer holds may be lost: the run failed) and remove the temporary file."""
        with held():  # a signal now is raised once the temporary file is gone
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
            elif self._descriptor is not None:
                os.close(self._descriptor)
            self._descriptor = None
            if self._temporary is not None:
                Path(self._temporary).unlink(missing_ok=True)
                self._temporary = None

    def __enter__(self) -> _GuardedStream:
        return self.open()

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is not None:
            self.discard()
        elif self._together is not None:
            self.finish()
        else:
            self.commit()


class OutputSet:
    """Outputs that appear together, once the last of them is written, or not at all: each is written to its temporary
    file as it comes (AtomicOutput(path, together=the set)), and all are renamed at the end of the set's `with` block, one
    after another with signals held (a signal may reach any thread, OpenBLAS's too, so blocking it in this one would not
    do). A failure or a signal before then leaves every path as it was."""

    def __init__(self) -> None:
        self._outputs: list[AtomicOutput] = []

    def add(self, output: AtomicOutput) -> None:
        self._outputs.append(output)

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        try:
            if exc_type is None:
                with held():
                    for output in self._outputs:
                        output.place()
        finally:
            for output in self._outputs:
                output.discard()
