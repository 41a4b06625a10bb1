"""Several GPUs as one backend: each batch split in input order over them, each share computed on the thread that owns
its GPU's context, and the outputs joined in order.

A CUDA context is current on the thread that made it, so each GPU gets a thread of its own that makes its CudaContext,
computes its shares and closes it. The buffers the reader fills are page-locked once (portable: every GPU's copies
read them directly); a host batch is split by images, a batch of CSV text by whole pieces of the GPUs' chunk. A
failure on any GPU ends the run as one on one GPU would: the error reaches the caller, every GPU's context closes.
The backends are made by the callables given, so that the splitting is tested with stand-ins where one GPU (or none)
is at hand.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import wait
from functools import partial
from operator import methodcaller
from typing import Any

import numpy as np

from cnnlab.backend import Backend, Batch, DeviceBatch, TextBatching
from cnnlab.constants import IMAGE_BYTES
from cnnlab.files.csv_batch import CsvBatch
from cnnlab.interrupts import held
from cnnlab.network import DeviceRoom, ImageBatch, OutputBatch
from cnnlab.owner import BackendOwner


class Spread:
    """Backends made by `makes`, one a thread, as one backend: a batch's shares computed at once, outputs in order."""

    name = "cuda"

    def __init__(self, makes: list[Callable[[], Backend]]) -> None:
        self._owners = [BackendOwner(make, f"cnnlab-gpu-{index}") for index, make in enumerate(makes)]
        try:
            self._backends = [owner.backend() for owner in self._owners]
        except BaseException:
            self.close()
            raise
        first = self._backends[0]
        self.threads = first.threads
        self.device = f"{len(self._backends)} x {first.device}"
        self.batch_size = None if first.batch_size is None else first.batch_size * len(self._backends)
        text = first.csv_text
        self.csv_text = None if text is None else TextBatching(text.batch_images * len(self._backends), text.chunk_images)
        self.reads_in_place = first.reads_in_place

    def allocate_images(self, count: int) -> np.ndarray:
        """A buffer the first GPU allocates on its thread: page-locked and portable, so every GPU copies from it."""
        return self._owners[0].call(lambda backend: backend.allocate_images(count))

    def free_images(self, buffer: np.ndarray) -> None:
        self._owners[0].call(lambda backend: backend.free_images(buffer))

    def text_rooms(self, image_bytes: float) -> None:
        """None: a CSV file's text comes to several GPUs through the host's windows, a batch's pieces shared out."""
        return None

    def device_room(self, count: int) -> SpreadRoom | None:
        """A room on every GPU (made at once, each on its thread), a share of each batch each, which the file's bytes
        are copied into one GPU's part after another; None where a GPU's backend has no rooms (stand-ins)."""
        share = math.ceil(count / len(self._owners))
        kept: SpreadRoom | None = None
        failure: BaseException | None = None
        try:
            # Every room made (or failed) before any error is raised, a signal's too (held: raised as the block ends,
            # where the command line's handlers are installed), so that those made are freed.
            with held():
                making = [owner.submit(lambda backend: backend.device_room(share)) for owner in self._owners]
                try:
                    wait(making)
                except BaseException as interrupted:  # not held (the Python API): each room is still waited for below
                    failure = interrupted
                failure = failure or next((part.exception() for part in making if part.exception() is not None), None)
                rooms: list[DeviceRoom | None] = [None if part.exception() is not None else part.result() for part in making]
                made = [room for room in rooms if room is not None]
                if failure is None and len(made) == len(rooms):
                    kept = SpreadRoom(made, self._owners, count)
                else:  # a GPU failed, or one has no rooms (stand-ins): none is kept
                    for owner, room in zip(self._owners, rooms):
                        if room is not None:
                            owner.call(partial(_free, room))
        except BaseException:  # a signal held until now: the rooms kept go too
            if kept is not None:
                kept.free()
            raise
        if failure is not None:
            raise failure
        return kept

    def allocate_text(self, nbytes: int) -> np.ndarray:
        """The first GPU's page-locked window (made current on the caller's thread, as a CudaContext's are)."""
        return self._backends[0].allocate_text(nbytes)

    def free_text(self, buffer: np.ndarray) -> None:
        self._backends[0].free_text(buffer)

    def compute(self, batch: Batch, check_finite: bool = False) -> OutputBatch:
        """The outputs of every image of the batch, in order, its shares computed on the GPUs at once."""
        if isinstance(batch, ImageBatch):
            share = math.ceil(len(batch) / len(self._owners))
            shares: list[Any] = [ImageBatch(batch.images[at : at + share]) for at in range(0, len(batch), share)]
        elif isinstance(batch, DeviceBatch):
            assert isinstance(batch.room, SpreadRoom)
            shares = batch.room.batches(len(batch))
        else:
            assert isinstance(batch, CsvBatch) and self.csv_text is not None  # no device rooms here: device_room() gives none
            shares = batch.split(len(self._owners), self.csv_text.chunk_images)
        running = [
            owner.submit(methodcaller("compute", share, check_finite)) for owner, share in zip(self._owners, shares)
        ]
        outputs, failure = [], None
        for future in running:  # every share finishes (or fails) before the first failure is raised
            try:
                outputs.append(future.result().values)
            except BaseException as error:
                failure = failure or error
        if failure is not None:
            raise failure
        return OutputBatch(np.concatenate(outputs))

    def close(self) -> None:
        """Close every GPU's backend on its own thread (its context last, as CudaContext.close does)."""
        for owner in self._owners:
            owner.close()

    def __enter__(self) -> Spread:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SpreadRoom:
    """A room on each GPU, filled from consecutive parts of the file, the first GPU's the batch's first images: a
    backend.DeviceRoom of several GPUs. The parts are filled one after another, each by its GPU's copier on every one of
    its threads: the host's reading of the file is what bounds a fill. On the 2 x H200 host (200,000 images, three
    turns) two GPUs' loop ran 42.8-43.8 GB/s so, against 36.8-37.6 with both copiers reading at once (32 threads on 32
    cores). A copy returns once its bytes are queued (file_copier.py), so the next GPU's part starts while the last
    one's copies drain."""

    def __init__(self, rooms: list[DeviceRoom], owners: list[BackendOwner], count: int) -> None:
        """`count`: the most images asked for (the rooms' shares, rounded up, may hold a few more)."""
        self._rooms, self._owners = rooms, owners
        self.capacity = min(count, sum(room.capacity for room in rooms))

    def _counts(self, count: int) -> list[int]:
        """The images of a batch of `count` (at most the capacity) each GPU's room holds: an even share each, as far as
        its room goes, then what is left to the rooms with space, in order; a GPU with none is after those with some."""
        share = math.ceil(count / len(self._rooms))
        counts = [min(room.capacity, share) for room in self._rooms]
        for index, room in enumerate(self._rooms):
            counts[index] += min(room.capacity - counts[index], max(0, count - sum(counts)))
        left = sum(counts) - count  # too many: taken back from the last
        for index in reversed(range(len(counts))):
            taken = min(counts[index], left)
            counts[index], left = counts[index] - taken, left - taken
        return counts

    def fill(self, fd: int, offset: int, count: int, stop: threading.Event) -> int:
        copied = 0
        for room, images in zip(self._rooms, self._counts(count)):
            if not images:
                continue
            got = room.fill(fd, offset + copied, images, stop)
            copied += got
            if got < images * IMAGE_BYTES or stop.is_set():  # the file ended in this part (or the run is ending)
                break
        return copied

    def batches(self, count: int) -> list[DeviceBatch]:
        """Each GPU's share of a batch of `count` images (the GPUs with none left out)."""
        return [DeviceBatch(room, images) for room, images in zip(self._rooms, self._counts(count)) if images]

    def host_copy(self, count: int) -> np.ndarray:
        """Each GPU's part copied back on its own thread, in order."""
        parts = [owner.call(partial(_host_copy, batch)) for owner, batch in zip(self._owners, self.batches(count))]
        return np.concatenate(parts)

    def free(self) -> None:
        """Each GPU's room freed on its own thread."""
        for owner, room in zip(self._owners, self._rooms):
            owner.call(partial(_free, room))


def _host_copy(batch: DeviceBatch, backend: Backend) -> np.ndarray:
    return batch.room.host_copy(len(batch))


def _free(room: DeviceRoom, backend: Backend) -> None:
    room.free()
