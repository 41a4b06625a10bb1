"""`cnnlab convert IN OUT`: an input or output file from CSV to .npy or back, every value exact.

What IN holds is read from it: a .npy array of shape (N, 100, 100) or a CSV file whose first line
is a single count is an input file; a 2-D .npy array or any other CSV file is an output file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from cnnlab.constants import CONV_LAYER_SIZE, FILTER_DIM, INPUT_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM
from cnnlab.errors import InputFileError
from cnnlab.files.formats import ImageReader, holds_images, is_npy, open_images, read_outputs
from cnnlab.files.labcsv import format_rows, write_input_file
from cnnlab.files.npy import NpyWriter
from cnnlab.files.safety import AtomicOutput
from cnnlab.network import first_nonfinite
from cnnlab.progress import Progress

# A CNN file's values per line: the filters', then the output weights'.
CNN_FILE_WIDTHS = [FILTER_DIM * FILTER_DIM] * CONV_LAYER_SIZE + [OUT_NEURON_DIM] * OUT_LAYER_SIZE


@dataclass(frozen=True)
class Conversion:
    """What was converted: "input" or "output" rows, and how many."""

    kind: str
    rows: int


def _batches(reader: ImageReader) -> Iterator[np.ndarray]:
    """The reader's images a buffer at a time, then its end-of-input check: inside the writer's `with`, so that a file
    with data after its images leaves no output."""
    buffer = np.empty((min(reader.step, reader.count), INPUT_DIM, INPUT_DIM))
    progress = Progress("cnnlab convert", reader.count)
    try:
        while count := reader.read_into(buffer, len(buffer)):  # a buffer's worth next, prepared meanwhile
            yield buffer[:count]
            progress.update(reader.images_read)
        reader.finish()
    finally:
        progress.finish()


def _refuse_non_finite(input_path: str | os.PathLike, values: np.ndarray, what: str, first: int = 0) -> None:
    """CSV holds finite values only (its readers refuse the rest): a NaN or an infinity is not written there."""
    index = first_nonfinite(values)
    if index is not None:
        value = values[index]
        raise InputFileError(input_path, f"{what} {first + index[0] + 1} holds {value}, which CSV cannot hold (finite values only)")


def _finite_images(input_path: str | os.PathLike, batches: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    done = 0
    for batch in batches:
        _refuse_non_finite(input_path, batch, "image", done)
        yield from batch
        done += len(batch)


def convert(input_path: str | os.PathLike, output_path: str | os.PathLike) -> Conversion:
    """Write the contents of `input_path` to `output_path` in the format its extension names."""
    if not holds_images(input_path):
        rows = read_outputs(input_path)
        if [len(row) for row in rows] == CNN_FILE_WIDTHS:
            raise InputFileError(
                input_path,
                "this is a CNN file (10 lines of 25 filter values, then 10 of 4000 weights); convert converts input files "
                "(N images) and output files (rows of values) between CSV and .npy, and CNN files are read as CSV only",
            )
        if not rows or len({len(row) for row in rows}) != 1 or not rows[0]:
            raise InputFileError(input_path, "an output file to convert needs one or more lines, all of the same length")
        values = np.array(rows, dtype=np.float64)
        if is_npy(output_path):
            with NpyWriter(output_path, values.shape) as npy:
                npy.write_rows(values)
        else:
            _refuse_non_finite(input_path, values, "row")
            with AtomicOutput(output_path) as out:
                out.write(format_rows(values))
        return Conversion("output", len(values))
    with open_images(input_path) as reader:
        if is_npy(output_path):
            with NpyWriter(output_path, (reader.count, INPUT_DIM, INPUT_DIM)) as npy:
                for batch in _batches(reader):
                    npy.write_rows(batch)
        else:
            write_input_file(output_path, reader.count, _finite_images(input_path, _batches(reader)))
        return Conversion("input", reader.count)
