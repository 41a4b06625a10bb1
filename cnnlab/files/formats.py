"""Which format a file holds: by its path's extension (`.npy` is numpy's binary format, anything else
the lab's CSV), and, for `convert`, whether its content is images or output rows."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from cnnlab.files import csv_reader, labcsv, npy
from cnnlab.files.safety import OutputSet
from cnnlab.files.text import TextMemory
from cnnlab.network import OutputBatch
from cnnlab.tracing import NO_TRACE, Tracer

if TYPE_CHECKING:
    from typing import Self


class ImageReader(Protocol):
    """An input file read a batch at a time: CSV or .npy."""

    count: int  # N, the images the file announces
    stop: threading.Event  # set to end a read that waits on a pipe (the run is stopping)
    values_finite: bool  # every value it reads is known finite (CSV's parsers refuse the rest; a .npy file may hold any)
    capacity: int  # the most images the file's size leaves space for (N where it cannot be known): buffers need no more
    images_read: int
    step: int  # images per read_into() call that keep a read both efficient and quick to stop

    def text_memory(self, images: int) -> int:
        """The memory the reader takes, besides the caller's buffers, for steps of `images` images (a CSV file's text)."""
        ...

    def read_into(self, out: np.ndarray, next_images: int = 0) -> int:
        """Fill the leading images of `out` with the next ones; return how many. `next_images`: how many the next call
        will ask for (0: unknown), which a reader may prepare meanwhile; the next call must then ask for that many."""
        ...

    def finish(self) -> None:
        """After all N images: what a reader must check before the outputs are kept, an error where it fails (a CSV
        file holds nothing after them; a mapped .npy file stayed whole)."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> ImageReader: ...

    def __exit__(self, *exc_info: object) -> None: ...


class OutputWriter(Protocol):
    """An output file written a batch at a time, kept only if the `with` block succeeds."""

    def write(self, outputs: OutputBatch) -> None: ...

    @property
    def regular(self) -> bool:
        """Whether the outputs go to a regular file (through a temporary one), not to a pipe, a terminal or a device."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None: ...


def is_npy(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() == ".npy"


def open_images(
    path: str | os.PathLike, text_memory: TextMemory | None = None, threads: int | None = None, trace: Tracer = NO_TRACE
) -> ImageReader:
    """The reader for an input file of either format, reading on `threads` threads (default: every core), CSV text into
    `text_memory`'s windows where given; a CSV reader's reads, takes and parses tell `trace` their time."""
    return npy.NpyImageReader(path, threads) if is_npy(path) else csv_reader.CsvImageReader(path, threads, text_memory, trace)


def open_outputs(path: str | os.PathLike, count: int, together: OutputSet | None = None) -> OutputWriter:
    """The writer for the `count` outputs of a run, in the format `path` names; kept with the set `together`, if given."""
    return npy.npy_output(path, count, together) if is_npy(path) else labcsv.CsvOutputWriter(path, together)


def read_outputs(path: str | os.PathLike) -> list[list[float]]:
    """An output file of either format as rows of floats."""
    return npy.read_output_rows(path) if is_npy(path) else labcsv.read_output_rows(path)


def holds_images(path: str | os.PathLike) -> bool:
    """Whether `path` is an input file (images) rather than an output file (rows of values): a 3-D
    .npy array, or a CSV file whose first line is a lone count."""
    return len(npy.read_shape(path)) == 3 if is_npy(path) else csv_reader.starts_with_count(path)

