"""A whole run, as the lab's main.rs does it: read the input in batches, compute, write the outputs.

A reader thread reads the next batch while this one computes, where the backend reads fastest from
(run_inputs.py: the kinds of input): page-locked host buffers or device buffers for CUDA, a mapping
of a .npy file for the CPU. A writer thread writes each batch's outputs to a regular file while the
next computes.

Only backend.compute() is timed: the lab's "actual work", without reading or writing files.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import Any

from cnnlab.backend import Backend, Batch
from cnnlab.errors import ArrayError, InputFileError
from cnnlab.files.csv_batch import CsvBatch
from cnnlab.files.formats import OutputWriter, open_images, open_outputs
from cnnlab.files.safety import OutputSet
from cnnlab.interrupts import held, join_through_signals
from cnnlab.network import Cnn, ImageBatch, OutputBatch, first_nonfinite
from cnnlab.progress import Progress
from cnnlab.run_inputs import RunInput, open_input
from cnnlab.tracing import NO_TRACE, Tracer

# The inputs of runs whose process ends once they return (the command line's), kept until it does: their device buffers
# are left to the process's end, and so are the objects that hold them. Dropped as the run returns, several GPUs'
# buffers would release their events from the run's thread, not the one whose context made them, which PyCUDA refuses
# with a warning on stderr.
_LEFT_TO_THE_PROCESS_END: list[RunInput] = []


@dataclass(frozen=True)
class RunStats:
    """What a run did: images, the seconds spent in compute(), and a note about the input if any."""

    images: int
    work_seconds: float  # in compute() alone: the lab's "actual work"
    loop_seconds: float  # the whole loop: reading, computing and writing, as they overlap
    batch_size: int
    startup_seconds: float | None  # from the process's start to its first batch handed to the backend
    device_bytes: int = 0  # the most device memory the backend's buffers held at once (its driver context's own aside)

    @property
    def work_microseconds(self) -> int:
        return round(self.work_seconds * 1e6)

    @property
    def images_per_second(self) -> float:
        return self.images / self.work_seconds if self.work_seconds > 0 else float("inf")


class Prefetcher:
    """Reads batches on a thread (started as its `with` block begins), a slot ahead where the input has two, so that
    reading the next batch overlaps computing this one; yields them in input order. (An input that fills device buffers
    itself, ahead of its reads, has one slot: run_inputs.py.)

    `read(slot, stop)` fills a slot (a buffer, or only a turn: run_inputs.py) with the next batch, or returns None at
    the end; it checks `stop` between steps, so that leaving early never waits for a whole batch, and never leaves the
    thread writing into a freed buffer. `trace` gets a span for the thread's start, per batch read and per wait for one.
    """

    def __init__(
        self, read: Callable[[Any, threading.Event], Batch | None], slots: list[Any], reader_stop: threading.Event | None = None,
        trace: Tracer = NO_TRACE,
    ) -> None:
        self._read_batch = read
        self._trace = trace
        self._reader_stop = reader_stop  # the reader's own: set on an early close, it ends a read that waits on a pipe
        self._read_all = False  # the reader said it was done: nothing is left to stop, and the reader may read on
        self._empty: queue.Queue[tuple[Any] | None] = queue.Queue()
        self._full: queue.Queue[tuple[Any, Batch | None] | BaseException] = queue.Queue()
        for slot in slots:
            self._empty.put((slot,))
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, name="cnnlab-reader", daemon=True)

    def _read(self) -> None:
        try:
            for number in itertools.count():
                if (item := self._empty.get()) is None or self._closed.is_set():  # closed before this thread ran: no read
                    return
                with self._trace.span("read batch", batch=number):
                    batch = self._read_batch(item[0], self._closed)
                self._full.put((item[0], batch))
                if batch is None:
                    return
        except BaseException as error:  # handed to the consumer, raised there
            self._full.put(error)

    def __iter__(self) -> Iterator[Batch]:
        for number in itertools.count():
            with self._trace.span("wait for batch", batch=number):
                item = self._full.get()
            if isinstance(item, BaseException):
                raise item
            slot, batch = item
            if batch is None:
                self._read_all = True
                return
            yield batch
            self._empty.put((slot,))

    def close(self) -> None:
        """Stop the thread and wait for it, even through a second signal: until it has stopped it may write
        into the buffers (page-locked, for the GPU) that the caller frees next."""
        self._closed.set()
        if self._reader_stop is not None and not self._read_all:  # a run that ended whole leaves it: finish() reads on
            self._reader_stop.set()
        self._empty.put(None)
        join_through_signals(self._thread)

    def __enter__(self) -> Prefetcher:
        try:
            with self._trace.span("start reader"):  # start() waits for the new thread to run: milliseconds on a busy machine
                self._thread.start()
        except BaseException:  # a signal: __exit__ will not run, so the thread is stopped here (or, not yet running, reads nothing)
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class WriteBehind:
    """Writes each batch's outputs in order, on a thread of its own while the next batch computes: in cuda mode the main
    thread queues every chunk and is the loop's bound, and a write there left the GPU idle (docs/trace.md).

    Only to a regular file (`output.regular`) and where `threaded` (a run without read-ahead keeps the timed work alone);
    elsewhere write() writes on the caller's thread, as a write to a pipe or a terminal may wait on another program for
    ever, and the end of the `with` block waits for the write in progress (the file must not be closed under it). A
    failed write is raised on the caller's thread, at its next write() or at the block's end; after one, or once the
    block is left early, the batches still queued are dropped.
    """

    QUEUED = 2  # batches handed over and not yet written: write() waits beyond this (a slow disk holds the loop back)

    def __init__(self, output: OutputWriter, trace: Tracer = NO_TRACE, threaded: bool = True) -> None:
        self._output, self._trace = output, trace
        self._batches: queue.SimpleQueue[tuple[int, OutputBatch] | None] = queue.SimpleQueue()  # (batch number, outputs)
        self._queue_space = threading.Semaphore(self.QUEUED)
        self._error: BaseException | None = None
        self._dropping = False
        self._handed = 0  # batches handed to write()
        self._thread: threading.Thread | None = None
        if threaded and output.regular:
            self._thread = threading.Thread(target=self._write_queued, name="cnnlab-writer", daemon=True)
            with trace.span("start writer"):
                self._thread.start()

    def _write(self, number: int, outputs: OutputBatch) -> None:
        with self._trace.span("write", batch=number, images=len(outputs)):
            self._output.write(outputs)

    def _write_queued(self) -> None:
        while (queued := self._batches.get()) is not None:
            number, outputs = queued
            try:
                if self._error is None and not self._dropping:
                    self._write(number, outputs)
            except BaseException as error:  # raised on the caller's thread
                self._error = error
            finally:
                self._queue_space.release()

    def write(self, outputs: OutputBatch) -> None:
        number, self._handed = self._handed, self._handed + 1
        if self._thread is None:
            return self._write(number, outputs)
        if self._error is not None:
            raise self._error
        if not self._queue_space.acquire(blocking=False):
            with self._trace.span("wait for writer"):
                self._queue_space.acquire()
        self._batches.put((number, outputs))

    def __enter__(self) -> WriteBehind:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if self._thread is None:
            return
        with held():  # a signal cutting this short would leave the writer writing to a file its caller then closes
            self._dropping = exc_type is not None
            self._batches.put(None)
            with self._trace.span("wait for writer"):
                self._thread.join()
        if self._error is not None and exc_type is None:
            raise self._error


def make_backend(
    mode: str, cnn: Cnn, batch_size: int | None, host_parse: bool = False, kernel: str | None = None, threads: int | None = None,
    gpus: list[int] | None = None, trace: Tracer = NO_TRACE, copier_ahead: int | None = None,
) -> Backend:
    """The backend for `mode` on `threads` host threads; the CUDA one, running rung `kernel` of the ladder on the GPUs
    `gpus` (default GPU 0; several: each batch split into a shard a GPU), is imported only when asked for; its streams
    and kernels tell `trace` their time; `copier_ahead`: the bytes of the regular file the input will copy straight into
    device buffers, so the file copier that fills them is made, sized to it, while the kernels load."""
    if mode == "cpu":
        from cnnlab.cpu.backend import CpuBackend

        return CpuBackend(cnn, batch_size, threads)
    from cnnlab.cuda.context import CudaContext
    from cnnlab.cuda.ladder import DEFAULT_KERNEL, LaunchConfig

    gpus = gpus or [0]
    shard = None if batch_size is None else max(1, -(-batch_size // len(gpus)))  # a batch's images over the GPUs
    config = LaunchConfig(kernel=kernel or DEFAULT_KERNEL)
    make = partial(CudaContext, cnn, shard, config, parse_csv=not host_parse, threads=threads, trace=trace, copier_ahead=copier_ahead)
    if len(gpus) == 1:
        return make(device=gpus[0])
    from cnnlab.cuda.multi_gpu import MultiGpuBackend

    return MultiGpuBackend([partial(make, device=gpu) for gpu in gpus])


def run_network(
    backend: Backend, input_path: str | os.PathLike, output_path: str | os.PathLike, read_ahead: bool = True,
    together: OutputSet | None = None, trace: Tracer = NO_TRACE, process_ends: bool = False,
) -> RunStats:
    """Compute the outputs of every image in `input_path` and write them to `output_path` (where `together` is given, one
    of that set of outputs, placed with the others at the end of its `with` block); the loop, its reader and each
    batch's compute and write tell `trace` their time.

    The input's kind (run_inputs.py) decides where its batches go: CSV text to a backend that parses it itself (the
    GPU), a .npy file straight to its device memory or mapped in place, anything else into its host buffers. Without
    `read_ahead` the reader has one slot, so it reads a batch only while nothing computes, and the outputs are written
    on this thread: slower, but the timed work then has the machine to itself, as in the lab's program.
    `process_ends`: the process ends once this returns (the command line), so a run that succeeds leaves the input's
    device buffers to the process's end (cuda/teardown.py), as it leaves its backend, rather than free them first, and
    keeps them till then (_LEFT_TO_THE_PROCESS_END).
    """
    with (
        open_images(input_path, backend if backend.csv_text else None, backend.threads, trace) as reader,
        open_outputs(output_path, reader.count, together) as output,
    ):
        source = open_input(backend, reader, 2 if read_ahead else 1, trace)
        progress = Progress(f"cnnlab {backend.name}", reader.count)
        work_seconds, startup_seconds, images_done = 0.0, None, 0
        loop_start = time.perf_counter()
        try:
            with (
                trace.span("loop", images=reader.count),
                WriteBehind(output, trace, read_ahead) as writer,  # started first: a thread's start waits for the GIL
                Prefetcher(source.read, source.slots, reader.stop, trace) as batches,
            ):
                for number, batch in enumerate(batches):
                    with trace.span("batch", batch=number, images=len(batch)):
                        startup_seconds = process_age() if startup_seconds is None else startup_seconds
                        start = time.perf_counter()
                        try:
                            with trace.span("compute", batch=number, images=len(batch)):
                                outputs = backend.compute(batch, check_finite=not reader.values_finite)
                        except ArrayError:
                            raise _non_finite_image(input_path, batch, images_done) from None
                        work_seconds += time.perf_counter() - start
                        _refuse_non_finite(input_path, outputs, images_done)
                        writer.write(outputs)
                        images_done += len(outputs)
                        progress.update(images_done)
            loop_seconds = time.perf_counter() - loop_start
        except BaseException as error:
            source.free(failing=error)
            with suppress(OSError):  # a terminal gone (SIGHUP): the run's error is still the one told
                progress.finish()
            raise
        progress.finish()
        if process_ends:
            _LEFT_TO_THE_PROCESS_END.append(source)
        else:
            source.free()
        reader.finish()
    return RunStats(reader.count, work_seconds, loop_seconds, source.batch_size, startup_seconds, backend.peak_device_bytes)


def _non_finite_image(input_path: str | os.PathLike, batch: Batch, first_image: int) -> InputFileError:
    """The error naming the first image (counted from 1) of a batch that holds a NaN or an infinity."""
    assert not isinstance(batch, CsvBatch)  # CSV text is never refused here: its parsers refuse such values
    images = batch.images if isinstance(batch, ImageBatch) else batch.buffer.host_copy(len(batch))
    index = first_nonfinite(images)
    assert index is not None
    value = images[index]
    return InputFileError(input_path, f"image {first_image + index[0] + 1} holds {value}: the network takes finite values only")


def _refuse_non_finite(input_path: str | os.PathLike, outputs: OutputBatch, first_image: int) -> None:
    """Outputs that are not finite (finite inputs near 1e308 overflow on the way) are refused, naming the first
    such image (counted from 1), rather than written where `compare` and `convert` could not read them back."""
    index = first_nonfinite(outputs.values)
    if index is not None:
        image = first_image + index[0] + 1
        raise InputFileError(input_path, f"the outputs of image {image} are not finite: the network overflows float64 on it")


def process_age() -> float | None:
    """Seconds since this process started (Linux: its start time in /proc, in clock ticks since boot)."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
