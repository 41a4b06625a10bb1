"""A whole run, as the lab's main.rs does it: read the input in batches, compute, write the outputs.

A reader thread parses the next batch while this one computes, straight into the buffers the
backend reads fastest from (page-locked ones for CUDA).

Only backend.compute() is timed: the lab's "actual work", without reading or writing files.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO

import numpy as np

from cnnlab.formats import ImageReader, open_images, open_outputs
from cnnlab.network import Backend, ImageBatch


@dataclass(frozen=True)
class RunStats:
    """What a run did: images, the seconds spent in compute(), and a note about the input if any."""

    images: int
    work_seconds: float  # in compute() alone: the lab's "actual work"
    loop_seconds: float  # the whole loop: reading, computing and writing, as they overlap
    batch_size: int
    trailing_data_line: int | None  # first line after the N-th matrix that holds data, if any

    @property
    def work_microseconds(self) -> int:
        return round(self.work_seconds * 1e6)

    @property
    def images_per_second(self) -> float:
        return self.images / self.work_seconds if self.work_seconds > 0 else float("inf")


class Progress:
    """A one-line count of images done on a terminal's stderr, for runs long enough to wait for."""

    DELAY_SECONDS = 1.0  # stay quiet for runs shorter than this
    INTERVAL_SECONDS = 0.2

    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self._total = total
        self._stream = stream
        self._enabled = stream.isatty()
        self._start = time.monotonic()
        self._last = self._start
        self._shown = False

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self._enabled and now - self._start >= self.DELAY_SECONDS and now - self._last >= self.INTERVAL_SECONDS:
            self._stream.write(f"\rcnnlab: {done}/{self._total} images")
            self._stream.flush()
            self._last, self._shown = now, True

    def finish(self) -> None:
        if self._shown:
            self._stream.write("\r\033[K")
            self._stream.flush()


class Prefetcher:
    """Reads batches on a thread, into two buffers in turn, so that reading the next batch overlaps
    computing this one; yields them in input order.

    The thread reads `reader.step` images at a time and stops between steps when closed, so that
    leaving early never waits for a whole batch, and never leaves it writing into a freed buffer.
    """

    def __init__(self, reader: ImageReader, buffers: list[np.ndarray]) -> None:
        self._reader = reader
        self._empty: queue.Queue[np.ndarray | None] = queue.Queue()
        self._full: queue.Queue[tuple[np.ndarray, int] | BaseException] = queue.Queue()
        for buffer in buffers:
            self._empty.put(buffer)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, name="cnnlab-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while (buffer := self._empty.get()) is not None:
                count = 0
                while count < len(buffer) and not self._closed.is_set():
                    step = self._reader.read_into(buffer[count : count + self._reader.step])
                    if not step:
                        break
                    count += step
                self._full.put((buffer, count))
                if count < len(buffer):
                    return
        except BaseException as error:  # handed to the consumer, raised there
            self._full.put(error)

    def __iter__(self) -> Iterator[ImageBatch]:
        while True:
            item = self._full.get()
            if isinstance(item, BaseException):
                raise item
            buffer, count = item
            if count:
                yield ImageBatch(buffer[:count])
            if count < len(buffer):
                return
            self._empty.put(buffer)

    def close(self) -> None:
        self._closed.set()
        self._empty.put(None)
        self._thread.join()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def run_network(
    backend: Backend, input_path: str | os.PathLike, output_path: str | os.PathLike, read_ahead: bool = True
) -> RunStats:
    """Compute the outputs of every image in `input_path` and write them to `output_path`.

    Without `read_ahead` the reader has one buffer, so it reads a batch only while nothing computes:
    slower, but the timed work then has the machine to itself, as in the lab's program.
    """
    with open_images(input_path) as reader, open_outputs(output_path, reader.count) as output:
        buffers = [backend.allocate_images(min(backend.batch_size, reader.count)) for _ in range(2 if read_ahead else 1)]
        progress = Progress(reader.count)
        work_seconds = 0.0
        loop_start = time.perf_counter()
        try:
            with Prefetcher(reader, buffers) as batches:
                for batch in batches:
                    start = time.perf_counter()
                    outputs = backend.compute(batch)
                    work_seconds += time.perf_counter() - start
                    output.write(outputs)
                    progress.update(reader.images_read)
            loop_seconds = time.perf_counter() - loop_start
        finally:
            progress.finish()
        trailing = reader.trailing_data_line()
    return RunStats(reader.count, work_seconds, loop_seconds, len(buffers[0]), trailing)
