"""Inputs, for every format: opened, and read, with the OS's refusals as one-line InputFileErrors naming the file."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager

from cnnlab.errors import STANDARD_STREAM, InputFileError


def open_for_reading(path: str | os.PathLike) -> io.BufferedReader:
    """Open `path` (`-`: standard input) in binary mode, turning the OS's refusal into an InputFileError."""
    try:
        if os.fspath(path) == STANDARD_STREAM:
            return os.fdopen(os.dup(0), "rb")  # its own descriptor: closing it leaves standard input open
        return open(path, "rb")
    except FileNotFoundError:
        raise InputFileError(path, "no such file") from None
    except IsADirectoryError:
        raise InputFileError(path, "is a directory, not a file") from None
    except OSError as error:
        raise InputFileError(path, error.strerror or str(error)) from None


@contextmanager
def reading(path: str | os.PathLike) -> Iterator[None]:
    """The OS's failure to read an open file (EIO from a failing disk, say) as an InputFileError naming it."""
    try:
        yield
    except OSError as error:
        raise InputFileError(path, f"cannot read: {error.strerror or error}") from None
