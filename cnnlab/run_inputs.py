"""The kinds of input a run reads, one object each, and the one place that picks the kind (`open_input`).

Each says the batch it reads, the slots its reader fills (a host buffer each, or only a turn where nothing on the host
is filled), how it reads the next batch into a slot, and what it frees when the run ends:

- CsvParsedOnDevice: a regular CSV file's text copied to the GPU's double buffer and parsed there;
- CsvTextFromHost: CSV text (a pipe's, or --batch's windows) read into page-locked host windows, parsed on the GPU;
- MappedNpy: a regular .npy file mapped, its batches handed to the CPU in place;
- NpyToDevice: a regular .npy file copied straight into the GPU's image buffers;
- ImagesInHostBuffers: any other input parsed or read into host buffers (page-locked ones for the GPU).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from operator import methodcaller
from typing import Any, Protocol

import numpy as np

from cnnlab.backend import Backend, Batch, DeviceBatch
from cnnlab.constants import IMAGE_BYTES
from cnnlab.errors import DeviceError
from cnnlab.files.csv_batch import CsvBatch
from cnnlab.files.csv_on_device import CsvRangeReader, text_start
from cnnlab.files.csv_reader import CsvImageReader
from cnnlab.files.formats import ImageReader
from cnnlab.files.npy import VIEW_IMAGES, NpyImageReader
from cnnlab.network import ImageBatch, ImageBuffer, fits
from cnnlab.tracing import Tracer


class RunInput(Protocol):
    """What run_network needs of an input: its batch, its slots, a read into a slot, and a free at the end."""

    batch_size: int
    slots: list[Any]

    def read(self, slot: Any, stop: threading.Event) -> Batch | None:
        """The next batch, read into `slot`; None at the end. Checks `stop` between steps, so that leaving early never
        waits for a whole batch."""
        ...

    def free(self, failing: BaseException | None = None) -> None:
        """Give back what the input made (its reader has stopped; a fill it started ahead is stopped and waited for first)."""
        ...


class CsvParsedOnDevice:
    """A regular CSV file's text, a range at a time, copied straight into a backend's double buffer and parsed there."""

    def __init__(self, ranges: CsvRangeReader, slots: int) -> None:
        self._ranges, self.slots = ranges, [None] * slots
        self.batch_size = ranges.images_a_fill

    def read(self, slot: Any, stop: threading.Event) -> DeviceBatch | None:
        found = self._ranges.read(stop)
        return None if found is None else DeviceBatch(*found)

    def free(self, failing: BaseException | None = None) -> None:
        free_each([self._ranges.buffers.free], failing)


class CsvTextFromHost:
    """CSV text read into the reader's page-locked windows, a batch at a time, for a backend that parses it itself."""

    def __init__(self, reader: CsvImageReader, batch_images: int, chunk_images: int, slots: int) -> None:
        self._reader, self._chunk, self.slots = reader, chunk_images, [None] * slots
        self.batch_size = min(batch_images, reader.count, reader.capacity)
        reader.reserve_text(self.batch_size)

    def read(self, slot: Any, stop: threading.Event) -> CsvBatch | None:
        return self._reader.read_text(self.batch_size, self._chunk)

    def free(self, failing: BaseException | None = None) -> None:
        """Nothing: the reader keeps its windows, and frees them as it closes."""


class MappedNpy:
    """A regular .npy file mapped, its batches views of the mapping, for a backend that reads them in place."""

    def __init__(self, reader: NpyImageReader, batch_size: int | None, slots: int) -> None:
        self._reader, self.slots = reader, [None] * slots
        self.batch_size = min(batch_size or VIEW_IMAGES, reader.count, reader.capacity)

    def read(self, slot: Any, stop: threading.Event) -> ImageBatch | None:
        view = self._reader.next_view(self.batch_size)
        return ImageBatch(view) if len(view) else None

    def free(self, failing: BaseException | None = None) -> None:
        """Nothing: the mapping goes as the reader closes."""


class NpyToDevice:
    """A regular .npy file's bytes copied straight into a backend's image buffers, filled in turn: a read starts the next
    buffer's fill before it waits for the oldest, so that the copier's threads go from one fill to the next without a
    pause. One turn: a read comes once the batch before it is computed, and refills that batch's buffer. The reads stop
    with the reader's `stop`, which is the run's."""

    def __init__(self, reader: NpyImageReader, buffers: list[ImageBuffer]) -> None:
        self._reader, self._buffers = reader, buffers
        self.slots: list[Any] = [None]
        self.batch_size = buffers[0].capacity
        self._next = 0  # the buffer the next fill goes to

    def read(self, slot: Any, stop: threading.Event) -> DeviceBatch | None:
        while self._reader.fills_under_way < len(self._buffers) and self._reader.start_to_device(self._buffers[self._next]):
            self._next = (self._next + 1) % len(self._buffers)
        found = self._reader.read_to_device()
        return None if found is None else DeviceBatch(*found)

    def free(self, failing: BaseException | None = None) -> None:
        free_each([self._reader.stop_to_device, *(buffer.free for buffer in self._buffers)], failing)


class ImagesInHostBuffers:
    """Images parsed or read into host buffers the backend allocates (page-locked for a GPU), one a slot."""

    def __init__(self, reader: ImageReader, backend: Backend, batch_size: int, slots: int) -> None:
        self._reader, self._backend = reader, backend
        self.batch_size = fit_batch(reader, batch_size, slots, backend.threads)
        self.slots = one_a_slot(lambda made: backend.allocate_images(self.batch_size), backend.free_images, slots)

    def read(self, slot: np.ndarray, stop: threading.Event) -> ImageBatch | None:
        return fill_images(self._reader, slot, stop)

    def free(self, failing: BaseException | None = None) -> None:
        free_each([partial(self._backend.free_images, buffer) for buffer in self.slots], failing)


def fill_images(reader: ImageReader, buffer: np.ndarray, stop: threading.Event) -> ImageBatch | None:
    """Read the next images into `buffer`, a reader's step at a time; None when there are none left."""
    count = 0
    while count < len(buffer) and not stop.is_set():
        part = buffer[count : count + reader.step]
        # The next call's images: the rest of this buffer's, a step at most, else the next buffer's (the slots are alike).
        next_images = min(reader.step, len(buffer) - count - len(part) or len(buffer))
        step = reader.read_into(part, next_images)
        if not step:
            break
        count += step
    return ImageBatch(buffer[:count]) if count else None


def open_input(backend: Backend, reader: ImageReader, slots: int, trace: Tracer) -> RunInput:
    """The kind of input `reader` is for `backend`, with its buffers made: the first of the module's list that fits."""
    text = backend.csv_text
    if text and isinstance(reader, CsvImageReader):
        ranges = _csv_ranges(backend, reader, trace)
        if ranges is not None:
            return CsvParsedOnDevice(ranges, slots)
        return CsvTextFromHost(reader, text.batch_images, text.chunk_images, slots)
    if isinstance(reader, NpyImageReader):
        if backend.reads_in_place and reader.map():
            return MappedNpy(reader, backend.batch_size, slots)
        if reader.seekable:
            buffers = one_a_slot(lambda made: backend.image_buffer(made[0].capacity if made else reader.count), methodcaller("free"), slots)
            if buffers:
                return NpyToDevice(reader, buffers)
    batch_size = min(backend.batch_size or reader.step, reader.count, reader.capacity)  # never more than the file holds
    return ImagesInHostBuffers(reader, backend, batch_size, slots)


def _csv_ranges(backend: Backend, reader: CsvImageReader, trace: Tracer) -> CsvRangeReader | None:
    """The reader of a regular CSV file's ranges into the backend's double buffer, where the backend has one (a GPU
    that parses CSV) and the file's head says where its images begin; else None."""
    if (start := text_start(reader)) is None:
        return None
    try:
        buffers = backend.csv_double_buffer(reader.size, reader.count)
    except DeviceError:  # no space on the device for it: the text goes through the host's windows
        return None
    return None if buffers is None else CsvRangeReader(reader, buffers, *start, trace)


def fit_batch(reader: ImageReader, batch_size: int, slots: int, threads: int) -> int:
    """The batch, halved (and the reader's step with it) until `slots` image buffers of it and the reader's own memory fit
    under an address-space limit (ulimit -v), where one is set: a modest file then runs under a modest limit, in smaller
    steps, and only what cannot fit in a batch of one image is refused (as the allocation fails, in one line)."""
    while batch_size > 1 and not fits(slots * batch_size * IMAGE_BYTES + reader.text_memory(min(reader.step, batch_size)), threads):
        batch_size = (batch_size + 1) // 2
    reader.step = min(reader.step, batch_size)
    return batch_size


def one_a_slot(make: Callable[[list[Any]], Any], free: Callable[[Any], None], slots: int) -> list[Any]:
    """What `make` makes (told what it made before) for each of `slots`, until it makes None; where one cannot be made,
    those made before it are freed with `free`."""
    made: list[Any] = []
    try:
        while len(made) < slots and (each := make(made)) is not None:
            made.append(each)
    except BaseException:
        for each in made:
            free(each)
        raise
    return made


def free_each(frees: list[Callable[[], None]], failing: BaseException | None) -> None:
    """Call every free. Where the run is `failing`, a free that fails too is passed over (noted on the run's error), so
    that the run's own error is the one told: the backend's close, or the process's end, takes what is left."""
    for free in frees:
        try:
            free()
        except Exception as error:
            if failing is None:
                raise
            vars(failing).setdefault("__notes__", []).append(f"and a free failed after it: {error!r}")  # add_note's, on 3.10 too
