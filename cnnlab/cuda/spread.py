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
from collections.abc import Callable
from operator import methodcaller
from typing import Any

import numpy as np

from cnnlab.backend import Backend, Batch, TextBatching
from cnnlab.files.csv_batch import CsvBatch
from cnnlab.network import ImageBatch, OutputBatch
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

    def device_room(self, count: int) -> None:
        """None: the GPUs share each batch, so its images come through page-locked host memory, which each copies from."""
        return None

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
