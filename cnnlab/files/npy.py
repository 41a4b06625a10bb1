"""Binary files for large runs: numpy's .npy format, (N, 100, 100) images in and (N, 10) outputs out.

Inputs are read a batch at a time straight into the batch's buffer, with one os.preadv per core
(it releases the GIL), so a file in the page cache moves at memory speed in one copy; a pipe or a
FIFO is read in order. For a backend with a device of its own (the GPU), a regular file's batches
are copied straight into its device memory instead (`start_to_device`: the backend's image buffer does
the copy). For a backend that reads any memory as fast as its own (the CPU), a regular file is instead
mapped and its images handed over in place, with no copy at all (`map`). Every way a file
truncated while it is read is an error naming the file, never a crash: a read comes up short, or
the mapping's guard (native/mapped_guard.cpp) turns the lost pages into zeros that
`finish` refuses. The header is checked before anything else: numpy's own parser, never pickle,
within numpy's 10,000-byte limit. Outputs are streamed after a header that already holds N.
"""

from __future__ import annotations

import io
import math
import os
import stat
import struct
import threading
from collections import deque
from contextlib import suppress
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from cnnlab.constants import IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE
from cnnlab.errors import InputFileError
from cnnlab.files.inputs import open_for_reading, reading
from cnnlab.files.safety import AtomicOutput, OutputSet
from cnnlab.files.text import READ_BYTES, read_at, wait_readable
from cnnlab.interrupts import join_through_signals
from cnnlab.network import Filling, ImageBuffer, OutputBatch, default_threads, unsized_capacity

if TYPE_CHECKING:
    from cnnlab.files import _mapped_guard

MappedFile: type[_mapped_guard.MappedFile] | None
try:
    from cnnlab.files._mapped_guard import MappedFile
except ImportError:  # no C++ compiler at install time: .npy inputs are read (copied), never mapped
    MappedFile = None

DTYPE = np.dtype("<f8")
MAGIC = b"\x93NUMPY"
STEP_IMAGES_PER_THREAD = 32
# Images a batch of a mapped file views where the backend names no batch: a view costs nothing to make, so a batch's
# fixed costs (a compute() call, its outputs written, the pages behind it dropped) are spread over more images than a
# read's step, while two batches' pages resident stay small (docs/cpu.md, "Reading .npy").
VIEW_IMAGES = 512
MAX_HEADER_BYTES = 10_000  # numpy's own limit for a header it parses safely (np.load's max_header_size)
_HEADER_LENGTH = {1: "<H", 2: "<I", 3: "<I"}  # by the format's major version: how the header's length is stored


def read_shape(path: str | os.PathLike) -> tuple[int, ...]:
    """The shape of the array a .npy file holds, from its header."""
    with open_for_reading(path) as file:
        return read_header(path, file)[0]


def read_header(path: str | os.PathLike, file: IO[bytes]) -> tuple[tuple[int, ...], int]:
    with reading(path):
        return _read_header(path, file)


def _read_header(path: str | os.PathLike, file: IO[bytes]) -> tuple[tuple[int, ...], int]:
    """The shape of a C-ordered little-endian float64 .npy file and the offset of its data, read from
    the file's start (a pipe too) and checked: the header's size and syntax, the type, the shape, and
    for a regular file that the data is all there."""
    preamble = file.read(len(MAGIC) + 2)
    if len(preamble) < len(MAGIC) + 2 or not preamble.startswith(MAGIC) or preamble[-2] not in _HEADER_LENGTH:
        raise InputFileError(path, "not a .npy file (it does not start with numpy's magic string and a known version)")
    length_format = _HEADER_LENGTH[preamble[-2]]
    length_bytes = file.read(struct.calcsize(length_format))
    [length] = struct.unpack(length_format, length_bytes) if len(length_bytes) == struct.calcsize(length_format) else [-1]
    if length > MAX_HEADER_BYTES:
        raise InputFileError(path, f"its .npy header of {length} bytes is over the {MAX_HEADER_BYTES:,} bytes numpy reads safely")
    header = file.read(length) if length >= 0 else b""
    if len(header) != length:
        raise InputFileError(path, "not a .npy file: it ends inside its header")
    try:
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(io.BytesIO(struct.pack("<I", length) + header))
    except Exception:  # hostile bytes fail in numpy's parser as ValueError, SyntaxError, tokenize's TokenError, ...
        raise InputFileError(path, "not a .npy file: its header cannot be parsed") from None
    if dtype != DTYPE or fortran_order:
        raise InputFileError(path, f"holds {dtype} in {'Fortran' if fortran_order else 'C'} order; cnnlab needs float64 in C order")
    if not all(type(size) is int for size in shape):  # numpy's parser takes True for 1
        raise InputFileError(path, f"its header announces the shape {shape}, not one of whole numbers")
    if any(size < 0 for size in shape):
        raise InputFileError(path, f"its header announces the shape {shape}, with a negative size")
    offset = len(preamble) + len(length_bytes) + length
    expected = offset + DTYPE.itemsize * math.prod(shape)  # a Python int: a shape whose size overflows 64 bits is just large
    status = os.fstat(file.fileno())
    if stat.S_ISREG(status.st_mode) and status.st_size < expected:
        raise InputFileError(path, f"file ends after {status.st_size} of the {expected} bytes its header announces")
    if stat.S_ISREG(status.st_mode) and status.st_size > expected:  # two files run together (cat a.npy b.npy): not one
        raise InputFileError(path, f"file goes on after the {expected} bytes its header announces ({status.st_size} bytes)")
    return shape, offset


class NpyImageReader:
    """A (N, 100, 100) float64 .npy file, read a batch at a time into the caller's buffer."""

    values_finite = False  # a .npy file may hold NaNs and infinities: the backend checks as it computes


    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
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
        self._fills: deque[tuple[ImageBuffer, int, Filling]] = deque()  # fills into device image buffers under way, oldest first
        self.stop = threading.Event()  # set when the run stops: a read waiting on a pipe gives up
        self._threads = threads or default_threads()
        # Images per read_into() call: 2.5 MB a thread, in cache when the CPU computes them next, and a read per core.
        self.step = STEP_IMAGES_PER_THREAD * self._threads
        self._pool: Any = None  # the read pool, made at the first read (a mapped file needs none)
        self.seekable = stat.S_ISREG(os.fstat(self._file.fileno()).st_mode)
        self.capacity = self.count if self.seekable else unsized_capacity(self.count)  # a file's size was checked against N
        self._mapped: Any = None  # the MappedFile once map() succeeds
        self._images: np.ndarray | None = None  # its images, in place
        self._dropped = self._last_view = 0  # the images whose pages are unmapped again; the first of the last view

    def text_memory(self, images: int) -> int:
        """No text: a .npy file is read straight into the image buffers."""
        return 0

    def map(self) -> bool:
        """Map the file, so that next_view() hands its images over in place: no copy out of the page cache. False where
        read_into() stays the way: a pipe, no native guard built, or a file the system will not map (ENODEV, ENOMEM)."""
        if not self.seekable or MappedFile is None:
            return False
        self._end = self._offset + self.count * IMAGE_BYTES  # the file's size was checked to hold it
        try:
            self._mapped = MappedFile(self._file.fileno(), self._end)
        except OSError:
            return False
        self._images = np.frombuffer(self._mapped, DTYPE, offset=self._offset).reshape(self.count, INPUT_DIM, INPUT_DIM)
        return True

    def next_view(self, count: int) -> np.ndarray:
        """The next `count` images (fewer at the end, none past it) of the mapped file, in place; an error where the
        file has shrunk since it was mapped. Their pages are mapped as the backend first reads them, on its threads.

        A run asks for the next view once it has given back the slot of the batch before the one it computes, so the
        images before that one are done: their pages are unmapped again (the page cache keeps them), and a run keeps
        at most two batches of the file resident however large it is."""
        assert self._images is not None, "next_view() needs map() first"
        self._check_whole()
        first = self.images_read
        count = max(0, min(count, self.count - first))
        self._mapped.drop(self._offset + self._dropped * IMAGE_BYTES, (self._last_view - self._dropped) * IMAGE_BYTES)
        self._dropped, self._last_view = self._last_view, first
        self.images_read += count
        return self._images[first : first + count]

    def read_into(self, out: np.ndarray, next_images: int = 0) -> int:
        """Copy the next images into the leading images of `out`; return how many (a read needs nothing prepared ahead)."""
        count = min(len(out), self.count - self.images_read)
        if count <= 0:
            return 0
        target = out[:count].data.cast("B")
        with reading(self.path):
            got = self._read(target)
        return self._read_whole(count, got)

    def start_to_device(self, buffer: ImageBuffer) -> bool:
        """Start copying the next images (as many as `buffer` holds, fewer at the end) from a regular file (seekable)
        straight into a backend's image buffer, while the caller goes on; False where none are left to start."""
        first = self.images_read + sum(count for _, count, _ in self._fills)
        count = min(buffer.capacity, self.count - first)
        if count <= 0:
            return False
        with reading(self.path):
            filling = buffer.start_fill(self._file.fileno(), self._offset + first * IMAGE_BYTES, count, self.stop)
        self._fills.append((buffer, count, filling))
        return True

    @property
    def fills_under_way(self) -> int:
        """Fills started and not yet waited for."""
        return len(self._fills)

    def read_to_device(self) -> tuple[ImageBuffer, int] | None:
        """The images of the oldest fill started, once it is done: their buffer and count; None where no fill is under
        way, or once the run stops."""
        if not self._fills:
            return None
        buffer, count, filling = self._fills.popleft()
        with reading(self.path):
            got = filling.wait()
        return None if self.stop.is_set() else (buffer, self._read_whole(count, got))

    def stop_to_device(self) -> None:
        """Stop the fills still under way (a run that ended early) and wait for each, so that their buffers can be freed:
        on a thread of its own, joined through signals, since a signal's exception inside a wait would leave its copy
        running. What they raise is not the run's error (the run ended first), and goes unsaid."""
        if not self._fills:
            return
        self.stop.set()
        waiting = threading.Thread(target=self._wait_for_fills, name="cnnlab-fills-stop")
        waiting.start()
        join_through_signals(waiting)

    def _wait_for_fills(self) -> None:
        while self._fills:
            with suppress(Exception):
                self._fills.popleft()[2].wait()

    def _read_whole(self, count: int, got: int) -> int:
        """`count` images read, where `got` bytes came: an error where the file ended before them."""
        if got < count * IMAGE_BYTES:
            complete = self.images_read + got // IMAGE_BYTES
            raise InputFileError(self.path, f"file ends after {complete} of the {self.count} images its header announces")
        self.images_read += count
        return count

    def _read(self, target: memoryview) -> int:
        """Fill `target` with the next images' bytes, as far as the file goes: a read per core, or in order from a pipe."""
        if self.seekable:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor  # here: with logging, ~4 ms of a mapped run's start-up

                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="cnnlab-npy")
            return read_at(self._file.fileno(), target, self._offset + self.images_read * IMAGE_BYTES, self._pool, self._threads)
        got = 0
        while got < len(target):
            wait_readable(self._file.fileno(), self.stop)
            if not (part := self._file.readinto(target[got:])):
                break
            got += part
        return got

    def finish(self) -> None:
        """After all N images: a .npy file holds exactly the images its header announces (a file's size was checked
        at its header; a pipe's end is read for here); a mapped one is checked whole, so that no output computed from
        a lost page is kept."""
        self._check_whole()
        if not self.seekable:
            wait_readable(self._file.fileno(), self.stop)
            with reading(self.path):
                more = self._file.read(1)
            if more:
                raise InputFileError(self.path, f"data after the {self.count} images its header announces")

    def _check_whole(self) -> None:
        """Where a page was lost (the guard read it as zeros), or the file is shorter than mapped (its last page
        holds zeros past the new end without a fault), what was computed from it is wrong: the run is refused."""
        if self._mapped is not None and (self._mapped.faulted or os.fstat(self._file.fileno()).st_size < self._end):
            self._refuse_shrunk()

    def _refuse_shrunk(self) -> None:
        raise InputFileError(self.path, "file was cut short while it was read (another program truncated it)")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        self._file.close()

    def __enter__(self) -> NpyImageReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class NpyWriter:
    """A .npy file of `shape`, written in row batches behind a header that already holds the full shape (one of a set
    `together`)."""

    def __init__(self, path: str | os.PathLike, shape: tuple[int, ...], together: OutputSet | None = None) -> None:
        self._output = AtomicOutput(path, binary=True, together=together)
        self._shape = shape
        self._rows = 0

    def __enter__(self) -> NpyWriter:
        self._file = self._output.__enter__()
        try:
            np.lib.format.write_array_header_2_0(self._file, {"descr": DTYPE.str, "fortran_order": False, "shape": self._shape})
        except BaseException:  # a full disk already: the temporary file goes
            self._output.discard()
            raise
        return self

    def write_rows(self, rows: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(rows, DTYPE).data)
        self._rows += len(rows)

    @property
    def regular(self) -> bool:
        return self._output.regular

    def write(self, outputs: OutputBatch) -> None:
        self.write_rows(outputs.values)

    def __exit__(self, exc_type: type[BaseException] | None, *rest: Any) -> None:
        complete = exc_type is not None or self._rows == self._shape[0]
        self._output.__exit__(exc_type if complete else AssertionError, *rest)  # an incomplete file is not kept
        if not complete:
            raise AssertionError(f"{self._rows} rows written where the header announces {self._shape[0]}")


def npy_output(path: str | os.PathLike, count: int, together: OutputSet | None = None) -> NpyWriter:
    """The (count, 10) outputs of a run as a .npy file."""
    return NpyWriter(path, (count, OUT_LAYER_SIZE), together)


def read_output_rows(path: str | os.PathLike) -> list[list[float]]:
    """A 2-D .npy file of outputs as rows of floats."""
    with open_for_reading(path) as file:
        shape, _ = read_header(path, file)
        if len(shape) != 2:
            raise InputFileError(path, f"holds an array of shape {shape}; outputs are (N, values per line)")
        wanted, data = DTYPE.itemsize * math.prod(shape), bytearray()
        with reading(path):
            while len(data) < wanted and (part := file.read(min(wanted - len(data), READ_BYTES))):  # a pipe, bit by bit
                data += part
            more = file.read(1)  # a file's size was checked at its header; a pipe's end is read for
        if len(data) < wanted:
            raise InputFileError(path, f"file ends after {len(data)} of the {wanted} data bytes its header announces")
        if more:
            raise InputFileError(path, f"data after the {wanted} data bytes its header announces")
        return np.frombuffer(data, DTYPE).reshape(shape).tolist()
