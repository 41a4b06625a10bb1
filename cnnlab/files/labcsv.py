"""The lab's CSV formats: the CNN file, the input file (read in batches) and the output file.

Every problem with a file is raised as an InputFileError naming the file and line.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from cnnlab.constants import CONV_LAYER_SIZE, FILTER_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM
from cnnlab.errors import InputFileError
from cnnlab.files.inputs import open_for_reading
from cnnlab.files.lines import native
from cnnlab.files.rows import Layout, RowPlace, check_lines, parse_rows
from cnnlab.files.safety import AtomicOutput, OutputSet
from cnnlab.files.text import TextSource
from cnnlab.network import Cnn, OutputBatch


def read_cnn(path: str | os.PathLike) -> Cnn:
    """Read a CNN file: 10 lines of 25 filter values, then 10 lines of 4000 output weights."""
    filters = np.empty((CONV_LAYER_SIZE, FILTER_DIM, FILTER_DIM))
    weights = np.empty((OUT_LAYER_SIZE, OUT_NEURON_DIM))
    with open_for_reading(path) as file:
        source = TextSource(path, file)
        for target, rows, what in ((filters, CONV_LAYER_SIZE, "convolution filters"), (weights, OUT_LAYER_SIZE, "output-layer weights")):
            span = source.take(rows)
            place = RowPlace(Layout(rows, what, numbered=False), 0, span.start)  # blank lines around the matrix, none inside
            if span.rows < rows:
                check_lines(path, span, target[0].size, place)
                raise InputFileError(path, f"file ends after {span.rows} of the {rows} lines of {what}", source.lines_taken or None)
            parse_rows(path, span, target[0].size, target.reshape(-1), place)
        extra = source.take(1)
        if extra.rows:
            raise InputFileError(path, "unexpected data after the 10 lines of output-layer weights", source.lines_taken)
    return Cnn(filters, weights)


def format_rows(rows: np.ndarray) -> str:
    """CSV lines of a 2-D array, each value in shortest round-trip form (as repr writes it): natively,
    the GIL released (~7x faster, and a reader thread keeps running), or with repr itself."""
    if native is not None:
        return native.format_rows(np.ascontiguousarray(rows, dtype=np.float64))
    return "".join(",".join(map(repr, row)) + "\n" for row in rows.tolist())


class CsvOutputWriter:
    """The lab's output file: one line of 10 values per image, in shortest round-trip form (one of a set `together`)."""

    def __init__(self, path: str | os.PathLike, together: OutputSet | None = None) -> None:
        self._output = AtomicOutput(path, together=together)

    def __enter__(self) -> CsvOutputWriter:
        self._file = self._output.__enter__()
        return self

    @property
    def regular(self) -> bool:
        return self._output.regular

    def write(self, outputs: OutputBatch) -> None:
        self._file.write(format_rows(outputs.values))

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._output.__exit__(exc_type, *rest)


def write_images(out: Any, count: int, images: Iterable[np.ndarray]) -> None:
    """Write an input file's text to the stream `out`: the count, then the `count` (100, 100) images `images` yields."""
    out.write(f"{count}\n")
    for image in images:
        out.write(format_rows(image))
        out.write("\n")


def write_input_file(path: str | os.PathLike, count: int, images: Iterable[np.ndarray]) -> None:
    """Write an input file of the `count` (100, 100) images that `images` yields."""
    with AtomicOutput(path) as out:
        write_images(out, count, images)


def read_output_rows(path: str | os.PathLike) -> list[list[float]]:
    """Read an output file as rows of floats, for the comparison (any number of values per line)."""
    rows = []
    with open_for_reading(path) as file:
        source = TextSource(path, file)
        while (span := source.take(1)).rows:
            width = span.data[span.start : span.end].tobytes().count(b",") + 1
            row = np.empty(width)
            parse_rows(path, span, width, row)
            rows.append(row.tolist())
    return rows
