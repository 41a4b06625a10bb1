"""Binary files for large runs: numpy's .npy format, (N, 100, 100) images in and (N, 10) outputs out.

Inputs are memory-mapped one batch at a time and copied by several threads (numpy releases the
GIL while it copies), so a file in the page cache moves at memory speed and the process maps no
more than a batch of it at once. Outputs are streamed after a header that already holds N.
"""

from __future__ import annotations

import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import numpy as np

from cnnlab.errors import InputFileError
from cnnlab.filesafety import AtomicOutput, open_for_reading
from cnnlab.network import IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE, OutputBatch

DTYPE = np.dtype("<f8")
COPY_IMAGES = 64  # images per copy task: 5 MB, large enough to amortise a task, small enough to spread


def read_shape(path: str | os.PathLike) -> tuple[int, ...]:
    """The shape of the array a .npy file holds, from its header."""
    with open_for_reading(path) as file:
        return read_header(path, file)[0]


def read_header(path: str | os.PathLike, file: IO[bytes]) -> tuple[tuple[int, ...], int]:
    """The shape of a C-ordered little-endian float64 .npy file and the offset of its data."""
    try:
        version = np.lib.format.read_magic(file)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = reader(file)
    except ValueError as error:
        raise InputFileError(path, f"not a .npy file: {error}") from None
    if dtype != DTYPE or fortran_order:
        raise InputFileError(path, f"holds {dtype} in {'Fortran' if fortran_order else 'C'} order; cnnlab needs float64 in C order")
    offset = file.tell()
    expected = offset + DTYPE.itemsize * int(np.prod(shape))
    size = os.fstat(file.fileno()).st_size
    if size < expected:
        raise InputFileError(path, f"file ends after {size} of the {expected} bytes its header announces")
    return shape, offset


class NpyImageReader:
    """A (N, 100, 100) float64 .npy file, read a batch at a time through a memory map of that batch."""

    step = 1024  # images per read_into() call that a reader thread makes: 80 MB mapped at a time

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = path
        self._file = open_for_reading(path)
        try:
            shape, self._offset = read_header(path, self._file)
            if len(shape) != 3 or shape[1:] != (INPUT_DIM, INPUT_DIM) or shape[0] < 1:
                raise InputFileError(path, f"holds an array of shape {shape}; input images must be (N, {INPUT_DIM}, {INPUT_DIM}), N >= 1")
        except BaseException:
            self._file.close()
            raise
        self.count = shape[0]
        self.images_read = 0
        self._pool = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="cnnlab-npy")

    def read_into(self, out: np.ndarray) -> int:
        """Copy the next images into the leading images of `out`; return how many."""
        count = min(len(out), self.count - self.images_read)
        if count <= 0:
            return 0
        start = self._offset + self.images_read * IMAGE_BYTES
        aligned = start - start % mmap.ALLOCATIONGRANULARITY
        # The map is unmapped when the last view of it goes, as soon as the copying threads let go.
        window = mmap.mmap(self._file.fileno(), start - aligned + count * IMAGE_BYTES, access=mmap.ACCESS_READ, offset=aligned)
        window.madvise(mmap.MADV_SEQUENTIAL)
        images = np.frombuffer(window, DTYPE, count * INPUT_DIM * INPUT_DIM, start - aligned)
        self._copy(images.reshape(count, INPUT_DIM, INPUT_DIM), out[:count])
        window.madvise(mmap.MADV_DONTNEED)  # the copied pages leave this process now, not when the map goes
        self.images_read += count
        return count

    def _copy(self, source: np.ndarray, target: np.ndarray) -> None:
        """Copy `source` into `target`, COPY_IMAGES at a time over the pool's threads."""

        def copy_part(first: int) -> None:
            np.copyto(target[first : first + COPY_IMAGES], source[first : first + COPY_IMAGES])

        list(self._pool.map(copy_part, range(0, len(source), COPY_IMAGES)))

    def trailing_data_line(self) -> int | None:
        """A .npy file holds exactly the images its header announces: never anything after them."""
        return None

    def close(self) -> None:
        self._pool.shutdown()
        self._file.close()

    def __enter__(self) -> NpyImageReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class NpyWriter:
    """A .npy file of `shape`, written in row batches behind a header that already holds the full shape."""

    def __init__(self, path: str | os.PathLike, shape: tuple[int, ...]) -> None:
        self._output = AtomicOutput(path, binary=True)
        self._shape = shape
        self._rows = 0

    def __enter__(self) -> NpyWriter:
        self._file = self._output.__enter__()
        np.lib.format.write_array_header_2_0(self._file, {"descr": DTYPE.str, "fortran_order": False, "shape": self._shape})
        return self

    def write_rows(self, rows: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(rows, DTYPE).data)
        self._rows += len(rows)

    def write(self, outputs: OutputBatch) -> None:
        self.write_rows(outputs.values)

    def __exit__(self, exc_type: type[BaseException] | None, *rest: Any) -> None:
        complete = exc_type is not None or self._rows == self._shape[0]
        self._output.__exit__(exc_type if complete else AssertionError, *rest)  # an incomplete file is not kept
        if not complete:
            raise AssertionError(f"{self._rows} rows written where the header announces {self._shape[0]}")


def npy_output(path: str | os.PathLike, count: int) -> NpyWriter:
    """The (count, 10) outputs of a run as a .npy file."""
    return NpyWriter(path, (count, OUT_LAYER_SIZE))


def read_output_rows(path: str | os.PathLike) -> list[list[float]]:
    """A 2-D .npy file of outputs as rows of floats."""
    with open_for_reading(path) as file:
        shape, offset = read_header(path, file)
        if len(shape) != 2:
            raise InputFileError(path, f"holds an array of shape {shape}; outputs are (N, values per line)")
        file.seek(offset)
        return np.fromfile(file, DTYPE, int(np.prod(shape))).reshape(shape).tolist()
