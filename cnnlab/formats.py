"""Which format a path holds, by its extension: `.npy` is numpy's binary format, anything else the lab's CSV."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import numpy as np

from cnnlab.errors import InputFileError
from cnnlab.files import CsvImageReader, CsvOutputWriter, open_for_reading
from cnnlab.files import read_outputs as read_csv_outputs
from cnnlab.network import OutputBatch
from cnnlab.npy import NpyImageReader, npy_output, read_header


class ImageReader(Protocol):
    """An input file read a batch at a time: CSV or .npy."""

    count: int  # N, the images the file announces
    images_read: int
    step: int  # images per read_into() call that keep a read both efficient and quick to stop

    def read_into(self, out: np.ndarray) -> int: ...

    def trailing_data_line(self) -> int | None: ...

    def close(self) -> None: ...

    def __enter__(self) -> ImageReader: ...

    def __exit__(self, *exc_info: object) -> None: ...


class OutputWriter(Protocol):
    """An output file written a batch at a time, kept only if the `with` block succeeds."""

    def write(self, outputs: OutputBatch) -> None: ...

    def __enter__(self) -> OutputWriter: ...

    def __exit__(self, *exc_info: object) -> None: ...


def is_npy(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() == ".npy"


def open_images(path: str | os.PathLike) -> ImageReader:
    """The reader for an input file of either format."""
    return NpyImageReader(path) if is_npy(path) else CsvImageReader(path)


def open_outputs(path: str | os.PathLike, count: int) -> OutputWriter:
    """The writer for the `count` outputs of a run, in the format `path` names."""
    return npy_output(path, count) if is_npy(path) else CsvOutputWriter(path)


def read_outputs(path: str | os.PathLike) -> list[list[float]]:
    """An output file of either format as rows of floats."""
    if not is_npy(path):
        return read_csv_outputs(path)
    with open_for_reading(path) as file:
        shape, offset = read_header(path, file)
        if len(shape) != 2:
            raise InputFileError(path, f"holds an array of shape {shape}; outputs are (N, values per line)")
        file.seek(offset)
        return np.fromfile(file, np.float64, int(np.prod(shape))).reshape(shape).tolist()
