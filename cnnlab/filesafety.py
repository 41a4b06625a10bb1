"""File safety, for every format: opening inputs with one-line errors, refusing to write over an
input, and outputs that appear only whole (written beside the target, renamed on success)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Any, BinaryIO

from cnnlab.errors import InputFileError, OutputFileError

# mkstemp makes files only the owner can read; outputs get the usual mode (0666 less the umask).
_UMASK = os.umask(0)
os.umask(_UMASK)


def open_for_reading(path: str | os.PathLike) -> BinaryIO:
    """Open `path` in binary mode, turning the OS's refusal into an InputFileError."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise InputFileError(path, "no such file") from None
    except IsADirectoryError:
        raise InputFileError(path, "is a directory, not a file") from None
    except OSError as error:
        raise InputFileError(path, error.strerror or str(error)) from None


def refuse_same_file(output: str | os.PathLike, *inputs: str | os.PathLike) -> None:
    """Raise an OutputFileError if `output` is one of `inputs` under another name (or the same)."""
    for input_path in inputs:
        try:
            same = os.path.samefile(output, input_path)
        except OSError:  # one of them does not exist (yet): they cannot be the same file
            continue
        if same:
            raise OutputFileError(f"{output}: is the input file {input_path}; refusing to write over it")


class AtomicOutput:
    """A file written beside `path` under a temporary name and renamed onto it only on success.

    A failure or interruption inside the `with` block removes the temporary file and leaves any
    existing file at `path` untouched.
    """

    def __init__(self, path: str | os.PathLike, binary: bool = False) -> None:
        self.path = Path(path)
        self._binary = binary
        self._file: IO[Any] | None = None

    def __enter__(self) -> IO[Any]:
        if self.path.is_dir():
            raise OutputFileError(f"{self.path}: is a directory, not a file")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            descriptor, temporary = tempfile.mkstemp(
                prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent
            )
        except OSError as error:
            raise OutputFileError(f"{self.path}: cannot write here: {error.strerror or error}") from None
        os.chmod(descriptor, 0o666 & ~_UMASK)
        self._temporary = Path(temporary)
        self._file = os.fdopen(descriptor, "wb") if self._binary else os.fdopen(descriptor, "w", newline="\n")
        return self._file

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        assert self._file is not None
        try:
            self._file.close()
            if exc_type is None:
                os.replace(self._temporary, self.path)
        except OSError as error:
            raise OutputFileError(f"{self.path}: cannot write: {error.strerror or error}") from None
        finally:
            self._temporary.unlink(missing_ok=True)
