"""A whole run, as the lab's main.rs does it: read the input in batches, compute, write the outputs.

Only backend.compute() is timed: the lab's "actual work", without reading or writing files.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from cnnlab.files import AtomicOutput, CsvImageReader, format_outputs
from cnnlab.network import Backend, ImageBatch


@dataclass(frozen=True)
class RunStats:
    """What a run did: images, the seconds spent in compute(), and a note about the input if any."""

    images: int
    work_seconds: float
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


def run_network(backend: Backend, input_path: str | os.PathLike, output_path: str | os.PathLike) -> RunStats:
    """Compute the outputs of every image in `input_path` and write them to `output_path`."""
    with CsvImageReader(input_path) as reader, AtomicOutput(output_path) as out:
        buffer = backend.allocate_images(min(backend.batch_size, reader.count))
        progress = Progress(reader.count)
        work_seconds = 0.0
        try:
            while count := reader.read_into(buffer):
                batch = ImageBatch(buffer[:count])
                start = time.perf_counter()
                outputs = backend.compute(batch)
                work_seconds += time.perf_counter() - start
                out.write(format_outputs(outputs))
                progress.update(reader.images_read)
        finally:
            progress.finish()
        trailing = reader.trailing_data_line()
    return RunStats(reader.count, work_seconds, len(buffer), trailing)
