"""Several GPUs as one backend: each batch split in input order into shards, one a GPU, each computed on the thread that
owns its GPU's context, and the outputs joined in order.

A CudaContext's calls block, one at a time, so each GPU gets a thread of its own that makes its CudaContext, computes
its shards and closes it, and the GPUs compute at once. The buffers the reader fills are page-locked once (portable:
every GPU's copies read them directly); a host batch is split by images, a batch of CSV text by whole pieces of the
GPUs' chunk. A failure on any GPU ends the run as one on one GPU would: the error reaches the caller, every GPU's
context closes. The backends are made by the callables given, so that the splitting is tested with stand-ins where one
GPU (or none) is at hand.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from operator import methodcaller
from typing import Any

import numpy as np

from cnnlab.backend import Backend, Batch, DeviceBatch, TextBatching
from cnnlab.constants import IMAGE_BYTES
from cnnlab.files.csv_batch import CsvBatch
from cnnlab.interrupts import held
from cnnlab.network import Cnn, Filling, ImageBatch, ImageBuffer, OutputBatch
from cnnlab.owner import BackendOwner


class MultiGpuBackend:
    """Backends made by `makes`, one a thread, as one backend: a batch's shards computed at once, outputs in order."""

    name = "cuda"

    def __init__(self, makes: list[Callable[[], Backend]]) -> None:
        self._owners = [BackendOwner(make, f"cnnlab-gpu-{index}") for index, make in enumerate(makes)]
        self._filler = ThreadPoolExecutor(1, thread_name_prefix="cnnlab-shard-fills")  # every sharded buffer's fills, in turn
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

    @property
    def peak_device_bytes(self) -> int:
        """The GPUs' peaks, added up (each GPU's own is its backend's)."""
        return sum(backend.peak_device_bytes for backend in self._backends)

    def allocate_images(self, count: int) -> np.ndarray:
        """A buffer the first GPU allocates on its thread: page-locked and portable, so every GPU copies from it."""
        return self._owners[0].call(lambda backend: backend.allocate_images(count))

    def free_images(self, buffer: np.ndarray) -> None:
        self._owners[0].call(lambda backend: backend.free_images(buffer))

    def csv_double_buffer(self, file_bytes: int, images: int) -> None:
        """None: a CSV file's text comes to several GPUs through the host's windows, a batch's pieces dealt out."""
        return None

    def image_buffer(self, count: int) -> ShardedImageBuffer | None:
        """An image buffer on every GPU (made at once, each on its thread), a shard of each batch each, which the file's
        bytes are copied into one GPU's shard after another; None where a GPU's backend has none (stand-ins)."""
        shard = math.ceil(count / len(self._owners))
        kept: ShardedImageBuffer | None = None
        failure: BaseException | None = None
        try:
            # Every buffer made (or failed) before any error is raised, a signal's too (held: raised as the block ends,
            # where the command line's handlers are installed), so that those made are freed.
            with held():
                making = [owner.submit(lambda backend: backend.image_buffer(shard)) for owner in self._owners]
                try:
                    wait(making)
                except BaseException as interrupted:  # not held (the Python API): each buffer is still waited for below
                    failure = interrupted
                failure = failure or next((part.exception() for part in making if part.exception() is not None), None)
                buffers: list[ImageBuffer | None] = [None if part.exception() is not None else part.result() for part in making]
                made = [buffer for buffer in buffers if buffer is not None]
                if failure is None and len(made) == len(buffers):
                    kept = ShardedImageBuffer(made, self._owners, count, self._filler)
                else:  # a GPU failed, or one has no image buffers (stand-ins): none is kept
                    for owner, buffer in zip(self._owners, buffers):
                        if buffer is not None:
                            owner.call(partial(_free, buffer))
        except BaseException:  # a signal held until now: the buffers kept go too
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

    def load_cnn(self, cnn: Cnn) -> None:
        """Each GPU's backend loads `cnn`, on its own thread."""
        for owner in self._owners:
            owner.call(methodcaller("load_cnn", cnn))

    def compute(self, batch: Batch, check_finite: bool = False) -> OutputBatch:
        """The outputs of every image of the batch, in order, its shards computed on the GPUs at once."""
        if isinstance(batch, ImageBatch):
            shard = math.ceil(len(batch) / len(self._owners))
            shards: list[Any] = [ImageBatch(batch.images[at : at + shard]) for at in range(0, len(batch), shard)]
        elif isinstance(batch, DeviceBatch):
            assert isinstance(batch.buffer, ShardedImageBuffer)
            shards = batch.buffer.batches(len(batch))
        else:
            assert isinstance(batch, CsvBatch) and self.csv_text is not None
            shards = batch.split(len(self._owners), self.csv_text.chunk_images)
        running = [
            owner.submit(methodcaller("compute", shard, check_finite)) for owner, shard in zip(self._owners, shards)
        ]
        outputs, failure = [], None
        for future in running:  # every shard finishes (or fails) before the first failure is raised
            try:
                outputs.append(future.result().values)
            except BaseException as error:
                failure = failure or error
        if failure is not None:
            raise failure
        return OutputBatch(np.concatenate(outputs))

    def close(self) -> None:
        """Close every GPU's backend on its own thread (its context last, as CudaContext.close does)."""
        self._filler.shutdown()
        for owner in self._owners:
            owner.close()

    def __enter__(self) -> MultiGpuBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ShardedImageBuffer:
    """An image buffer on each GPU, a shard each, filled from consecutive parts of the file, the first GPU's the batch's
    first images: a network.ImageBuffer of several GPUs. The shards are filled one after another, each by its GPU's
    copier on every one of its threads: the host's reading of the file is what bounds a fill, and reading two at once
    measured slower (docs/gpu.md, "Sizes"). A copy's wait returns once its bytes are queued (file_copier.py), so the
    next GPU's shard starts while the last one's copies drain. Every sharded buffer's fills run on one thread (`filler`),
    so that a fill started while another runs begins as that one ends."""

    def __init__(self, buffers: list[ImageBuffer], owners: list[BackendOwner], count: int, filler: ThreadPoolExecutor) -> None:
        """`count`: the most images asked for (the buffers' shards, rounded up, may hold a few more)."""
        self._buffers, self._owners, self._filler = buffers, owners, filler
        self.capacity = min(count, sum(buffer.capacity for buffer in buffers))

    def _counts(self, count: int) -> list[int]:
        """The images of a batch of `count` (at most the capacity) each GPU's buffer holds: an even shard each, as far as
        its buffer goes, then what is left to the buffers with space, in order; a GPU with none is after those with some."""
        shard = math.ceil(count / len(self._buffers))
        counts = [min(buffer.capacity, shard) for buffer in self._buffers]
        for index, buffer in enumerate(self._buffers):
            counts[index] += min(buffer.capacity - counts[index], max(0, count - sum(counts)))
        left = sum(counts) - count  # too many: taken back from the last
        for index in reversed(range(len(counts))):
            taken = min(counts[index], left)
            counts[index], left = counts[index] - taken, left - taken
        return counts

    def start_fill(self, fd: int, offset: int, count: int, stop: threading.Event) -> Filling:
        return _ShardsFilling(self._filler.submit(self._fill, fd, offset, count, stop))

    def _fill(self, fd: int, offset: int, count: int, stop: threading.Event) -> int:
        copied = 0
        for buffer, images in zip(self._buffers, self._counts(count)):
            if not images:
                continue
            got = buffer.start_fill(fd, offset + copied, images, stop).wait()
            copied += got
            if got < images * IMAGE_BYTES or stop.is_set():  # the file ended in this shard (or the run is ending)
                break
        return copied

    def batches(self, count: int) -> list[DeviceBatch]:
        """Each GPU's shard of a batch of `count` images (the GPUs with none left out)."""
        return [DeviceBatch(buffer, images) for buffer, images in zip(self._buffers, self._counts(count)) if images]

    def host_copy(self, count: int) -> np.ndarray:
        """Each GPU's shard copied back on its own thread, in order."""
        parts = [owner.call(partial(_host_copy, batch)) for owner, batch in zip(self._owners, self.batches(count))]
        return np.concatenate(parts)

    def free(self) -> None:
        """Each GPU's buffer freed on its own thread."""
        for owner, buffer in zip(self._owners, self._buffers):
            owner.call(partial(_free, buffer))


@dataclass(frozen=True)
class _ShardsFilling:
    """A ShardedImageBuffer's fill under way on the fills' thread."""

    shards: Future[int]

    def wait(self) -> int:
        return self.shards.result()


def _host_copy(batch: DeviceBatch, backend: Backend) -> np.ndarray:
    return batch.buffer.host_copy(len(batch))


def _free(buffer: ImageBuffer, backend: Backend) -> None:
    buffer.free()
