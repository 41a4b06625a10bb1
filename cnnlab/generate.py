"""Random CNN and input files in the lab's layout, as the lab's generate.py writes them.

Values are uniform in [-10, 10] and written in shortest round-trip form, one matrix row a line;
the input file has a blank line after each matrix, the CNN file one between its two parts.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from cnnlab.constants import CONV_LAYER_SIZE, FILTER_DIM, INPUT_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM
from cnnlab.errors import OutputFileError, byte_size, named
from cnnlab.files.labcsv import format_rows, write_images
from cnnlab.files.safety import AtomicOutput, OutputSet
from cnnlab.progress import Progress

VALUE_BOUND = 10.0
DEFAULT_IMAGES = 250
_IMAGES_PER_WRITE = 64  # bounds the memory used while writing a large input file
# The bytes an image's text takes, as written here: 100 rows of 100 values (repr of uniform [-10, 10]: 18.8 characters
# on average) and their commas, and a blank line; 187,700 on average over 5,000 images. The CNN file: 40,250 values.
IMAGE_TEXT_BYTES = 187_000
CNN_TEXT_BYTES = 760_000


def random_values(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Fresh float64 values, uniform in [-10, 10] like the lab's generator."""
    return rng.uniform(-VALUE_BOUND, VALUE_BOUND, shape)


def write_cnn(out: Any, filters: np.ndarray, weights: np.ndarray) -> None:
    """Write a CNN file's text to the stream `out`: 10 lines of 25 filter values, a blank line, 10 lines of 4000 weights."""
    out.write(format_rows(filters.reshape(CONV_LAYER_SIZE, FILTER_DIM * FILTER_DIM)))
    out.write("\n")
    out.write(format_rows(weights.reshape(OUT_LAYER_SIZE, OUT_NEURON_DIM)))


def write_cnn_file(path: str | os.PathLike, filters: np.ndarray, weights: np.ndarray) -> None:
    """Write a CNN file."""
    with AtomicOutput(path) as out:
        write_cnn(out, filters, weights)


def refuse_what_will_not_fit(out_dir: str | os.PathLike, nbytes: int) -> None:
    """An OutputFileError, before anything is written, where `nbytes` of files in `out_dir` (made if missing) would not
    fit: more than its file system has free for this user, or past the file-size limit (ulimit -f)."""
    folder = os.path.abspath(out_dir)
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        status = os.statvfs(folder)
    except OSError:  # no file system to ask: the writes will say what fails
        return
    free, where = status.f_bavail * status.f_frsize, named(out_dir)
    if nbytes > free:
        raise OutputFileError(f"{where}: the files would take about {byte_size(nbytes)}, and its file system has {byte_size(free)} free")
    limit, largest = resource.getrlimit(resource.RLIMIT_FSIZE)[0], nbytes - CNN_TEXT_BYTES
    if limit != resource.RLIM_INFINITY and largest > limit:
        past = f"past the file-size limit of {byte_size(limit)} (ulimit -f)"
        raise OutputFileError(f"{where}: in.csv would take about {byte_size(largest)}, {past}")


def generate(out_dir: str | os.PathLike, images: int, seed: int | None) -> tuple[Path, Path]:
    """Write out_dir/cnn.csv and out_dir/in.csv, both or neither; the same seed gives the same files."""
    rng = np.random.default_rng(seed)
    cnn_path, input_path = Path(out_dir) / "cnn.csv", Path(out_dir) / "in.csv"
    refuse_what_will_not_fit(out_dir, images * IMAGE_TEXT_BYTES + CNN_TEXT_BYTES)
    progress = Progress("cnnlab generate", images)

    def random_images() -> Iterator[np.ndarray]:
        for start in range(0, images, _IMAGES_PER_WRITE):
            progress.update(start)
            yield from random_values(rng, min(_IMAGES_PER_WRITE, images - start), INPUT_DIM, INPUT_DIM)

    try:
        with OutputSet() as together:
            with AtomicOutput(cnn_path, together=together) as cnn_out:
                write_cnn(
                    cnn_out,
                    random_values(rng, CONV_LAYER_SIZE, FILTER_DIM, FILTER_DIM),
                    random_values(rng, OUT_LAYER_SIZE, OUT_NEURON_DIM),
                )
            with AtomicOutput(input_path, together=together) as input_out:
                write_images(input_out, images, random_images())
    finally:
        progress.finish()
    return cnn_path, input_path
