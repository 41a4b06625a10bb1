"""The chunk streams and the schedule over them: what CudaContext computes with.

A chunk stream is a CUDA stream with the device buffers of one chunk. `ChunkStreams.schedule` deals a
call's chunks to the streams round-robin, a round of one chunk per stream at a time, so that the copy in
of one chunk overlaps the kernels of another and the copy out of a third.

Where a chunk's images come from is its source (chunk_sources.py): a host batch, images already on the
device, or CSV text parsed on the device. A source is asked twice per chunk: `start(stream, index)` queues whatever
brings the chunk's images to the stream's buffers (copies, the parse), for every stream of a round
before the first kernel is launched; `images(stream, index)` then returns their device address, once
they are known to be right. Where a chunk's outputs go is its sink (added up on the host, or on the
device into a caller's array): asked once per chunk, `take(stream, index, count)`, once the chunk's
kernels are queued, and once at the end, `finish(streams)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, Protocol

import numpy as np

from cnnlab.constants import IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM
from cnnlab.cuda.csv_parser import CsvParse
from cnnlab.cuda.driver import DeviceAllocation, Driver, device_errors
from cnnlab.cuda.kernels import FindNonFinite, SumSegments
from cnnlab.cuda.launchers import Launcher, activation_images
from cnnlab.cuda.memory import Allocator
from cnnlab.errors import DeviceError
from cnnlab.network import OutputBatch, nonfinite_error
from cnnlab.tracing import NO_TRACE, Tracer

# The most of the device's free memory the chunk streams' buffers may come to, at their largest: the rest is left to
# the image and text buffers a file's bytes go straight into (file_buffers.py), and to other processes.
STREAMS_MEMORY_SHARE = 1 / 4


def chunk_stream_bytes(chunk: int, launcher: Launcher) -> int:
    """Device memory one chunk stream takes at most: its images (where chunks are copied in), the activations where the
    kernels pass them on, its partials."""
    per_image = IMAGE_BYTES + launcher.segments * OUT_LAYER_SIZE * 8
    return chunk * per_image + activation_images(launcher, chunk) * OUT_NEURON_DIM * 8


class GrowingBuffer:
    """Memory for items (images, or a pass's activations), `make(count)` made on first need and made anew, larger,
    where a chunk needs more than it holds (as a caching allocator grows): a stream holds what its largest chunk so far
    needed, up to `limit` items, not what the largest chunk it may ever get would."""

    def __init__(self, make: Callable[[int], Any], free: Callable[[Any], None], limit: int) -> None:
        self._make, self._free, self._limit = make, free, limit
        self.held: Any = None
        self.capacity = 0

    def at_least(self, items: int, stream: Any) -> Any:
        """The buffer, holding at least `items` (at most the limit); where it grows, once the work queued on `stream`
        (which may still read the old one) is done."""
        assert 0 < items <= self._limit, f"{items} items for a buffer of {self._limit} at most"
        if items > self.capacity:
            if self.held is not None:
                stream.synchronize()
                self.free()
            capacity = min(self._limit, max(items, 2 * self.capacity))
            self.held = self._make(capacity)
            self.capacity = capacity
        return self.held

    def free(self) -> None:
        if self.held is not None:
            self._free(self.held)
        self.held, self.capacity = None, 0


class ChunkStream:
    """A CUDA stream and the device buffers of one chunk: its images in, the rung's kernels, its partials out. The
    images' and activations' buffers (and the page-locked staging buffer) are made on first need, as large as the
    chunk then needs, and grow with the chunks (GrowingBuffer): a run whose images lie in an image buffer already
    makes no images' buffer, and a call of four images holds four images' worth."""

    def __init__(self, driver: Driver, memory: Allocator, chunk: int, launcher: Launcher, trace: Tracer = NO_TRACE) -> None:
        self.driver, self.memory, self.chunk, self.trace = driver, memory, chunk, trace
        self.partials = memory.device(launcher.segments * chunk * OUT_LAYER_SIZE * 8)  # its stride is the chunk
        self._images = GrowingBuffer(lambda count: memory.device(count * IMAGE_BYTES), memory.free, chunk)
        activations = activation_images(launcher, chunk)
        self._activations = GrowingBuffer(lambda count: memory.device(count * OUT_NEURON_DIM * 8), memory.free, activations)
        self._staging = GrowingBuffer(lambda count: memory.host((count, INPUT_DIM, INPUT_DIM)), memory.free, chunk)
        # The stream and the event after the memory, and dropped here where one fails: none is left for the collector
        # to find once the context is no longer current (PyCUDA would warn).
        try:
            self.stream = driver.Stream()
            self._staging_free = driver.Event()  # the last copy out of the staging buffer has finished
        except BaseException:
            self.stream = None
            memory.free(self.partials)
            raise
        self.csv: CsvParse | None = None  # the GPU CSV parse's buffers, made on first need

    @property
    def images(self) -> DeviceAllocation:
        """The device buffer the last chunk's images were copied or parsed into (images_for made it)."""
        assert self._images.held is not None
        return self._images.held

    def images_for(self, count: int) -> DeviceAllocation:
        """The device buffer a chunk of `count` images is copied or parsed into."""
        return self._images.at_least(count, self.stream)

    def csv_parse(self, module: Any, nbytes: int) -> CsvParse:
        """The GPU CSV parse's buffers, for a text of at least `nbytes` (made anew, larger, where they are smaller)."""
        if self.csv is None or self.csv.text_bytes < nbytes:
            if self.csv is not None:
                self.csv.free()
                self.csv = None
            self.csv = CsvParse(self.driver, self.memory, module, max(nbytes, 1 << 20), self.chunk * INPUT_DIM)
        return self.csv

    def staging(self, count: int) -> np.ndarray:
        """The page-locked staging buffer for `count` images, once the last copy out of it has finished."""
        self._staging_free.synchronize()
        return self._staging.at_least(count, self.stream)[:count]

    def copy_in(self, images: np.ndarray) -> None:
        """Queue the copy of page-locked `images` to the stream's device buffer."""
        target = self.images_for(len(images))
        with self.trace.span("copy in", self.stream, bytes=images.nbytes):
            self.driver.memcpy_htod_async(target, images, self.stream)
        # A slice of the staging buffer has the buffer itself as its base, not the buffer's base (numpy stops
        # collapsing views at an owner that is not an array): ask whether the memory is the staging buffer's.
        if self._staging.held is not None and np.may_share_memory(images, self._staging.held):
            self._staging_free.record(self.stream)

    def run(self, launcher: Launcher, images: int, count: int) -> None:
        activations = activation_images(launcher, count)
        conv_out = self._activations.at_least(activations, self.stream) if activations else None
        launcher(self.stream, images, conv_out, self.partials, count, self.chunk)

    def copy_out(self, partials: np.ndarray, done: Any) -> None:
        """Copy the chunk's partials to page-locked `partials` and record `done` when they are there."""
        with self.trace.span("copy out", self.stream, bytes=partials.nbytes):
            self.driver.memcpy_dtoh_async(partials, self.partials, self.stream)
        done.record(self.stream)

    def free(self) -> None:
        for buffer in (self._images, self._activations, self._staging):
            buffer.free()
        self.memory.free(self.partials)
        if self.csv is not None:
            self.csv.free()


class ChunkSource(Protocol):
    def start(self, chunk_stream: ChunkStream, index: int) -> None: ...

    def images(self, chunk_stream: ChunkStream, index: int) -> int: ...


class OutputSink(Protocol):
    def take(self, chunk_stream: ChunkStream, index: int, count: int) -> None: ...

    def finish(self, streams: list[ChunkStream]) -> None: ...


class HostOutputs:
    """Each chunk's partials copied to page-locked host memory and added up there with numpy, while later
    chunks are still on the device; `values` holds the outputs once finish() returns."""

    def __init__(self, partials: np.ndarray, done: list[Any], count: int, chunk: int, trace: Tracer = NO_TRACE) -> None:
        self._partials, self._done, self._chunk, self._trace = partials, done, chunk, trace
        self.values = np.empty((math.ceil(count / chunk) * chunk, OUT_LAYER_SIZE))

    def take(self, chunk_stream: ChunkStream, index: int, count: int) -> None:
        chunk_stream.copy_out(self._partials[index], self._done[index])

    def finish(self, streams: list[ChunkStream]) -> None:
        chunk = self._chunk
        # Sums that overflow are infinities (or NaN: inf - inf), as the CPU's forward gives them, without numpy's warning.
        with np.errstate(over="ignore", invalid="ignore"):
            for index in range(len(self.values) // chunk):
                with self._trace.span("wait for chunk", chunk=index):
                    self._done[index].synchronize()
                # Sum over the segments axis (the leading one): numpy adds whole rows in segment order.
                with self._trace.span("reduce", chunk=index, images=chunk):
                    np.sum(self._partials[index, :, :chunk], axis=0, out=self.values[index * chunk : (index + 1) * chunk])


class DeviceOutputs:
    """Each chunk's partials added up on the device (sum_segments, in the host's order, so the same bits)
    straight into (count, 10) float64 device memory at `address`, a caller's array: nothing comes back."""

    def __init__(self, sum_segments: SumSegments, address: int, chunk: int) -> None:
        self._sum, self._address, self._chunk = sum_segments, address, chunk

    def take(self, chunk_stream: ChunkStream, index: int, count: int) -> None:
        outputs = self._address + index * self._chunk * OUT_LAYER_SIZE * 8
        self._sum(chunk_stream.stream, chunk_stream.partials, outputs, count, chunk_stream.chunk)

    def finish(self, streams: list[ChunkStream]) -> None:
        for chunk_stream in streams:
            chunk_stream.stream.synchronize()


class ChunkStreams:
    """A context's streams and the schedule over them: each call's chunks through the streams, round-robin."""

    def __init__(
        self, driver: Driver, memory: Allocator, launcher: Launcher, streams: int, chunk: int, cap: int | None,
        nonfinite: Any, find_nonfinite: FindNonFinite, trace: Tracer = NO_TRACE,
    ) -> None:
        """`streams` streams of up to `chunk` images, the chunk halved until their buffers at their largest fit in
        STREAMS_MEMORY_SHARE of the device's free memory, and under `cap` bytes where it is given; `nonfinite`: the
        device flag the kernels set where an image value is a NaN or an infinity; `trace` gets spans of each chunk's
        copies and kernels on its stream, and of the host's waits and reduction."""
        self._driver, self._memory, self._launcher, self._trace = driver, memory, launcher, trace
        self._nonfinite, self._find_nonfinite = nonfinite, find_nonfinite
        self._host_partials: np.ndarray | None = None  # page-locked (chunks, segments, chunk, 10), grown as needed
        self._chunk_done: list[Any] = []  # an event per chunk: its partials are on the host
        self._batches = 0  # the batches scheduled so far: a stream span names its batch, as chunks count from 0 in each
        self.streams: list[ChunkStream] = []
        with device_errors("cannot allocate device buffers"):
            budget = int(driver.mem_get_info()[0] * STREAMS_MEMORY_SHARE)
            budget = budget if cap is None else min(cap, budget)
            while chunk > 1 and streams * chunk_stream_bytes(chunk, launcher) > budget:
                chunk //= 2
            if cap is not None and streams * chunk_stream_bytes(chunk, launcher) > cap:
                raise DeviceError(f"{streams} streams of one image need more than {cap} bytes")
            self.chunk = chunk
            try:
                for _ in range(streams):
                    self.streams.append(ChunkStream(driver, memory, chunk, launcher, trace.per_chunk))
            except BaseException:
                self.free()
                raise

    def __len__(self) -> int:
        return len(self.streams)

    def run(self, count: int, source: ChunkSource, chunk: int | None = None, check_finite: bool = False) -> OutputBatch:
        """The outputs of `count` images from `source`, added up on the host as each chunk's partials arrive."""
        chunk = chunk or self.chunk
        outputs = HostOutputs(self._partials_for(math.ceil(count / chunk)), self._chunk_done, count, chunk, self._trace.per_chunk)
        self.schedule(count, source, chunk, outputs, check_finite)
        return OutputBatch(outputs.values[:count])

    def schedule(self, count: int, source: ChunkSource, chunk: int, outputs: OutputSink, check_finite: bool) -> None:
        """Every chunk (of `chunk` images, at most the streams' size) through a stream, a round of one chunk
        per stream at a time: first every stream's images are brought in, then each stream's kernels are
        queued and `outputs` takes its partials. `check_finite`: raise ArrayError if any image value
        was a NaN or an infinity (found by conv2d_relu as it loads them, or, for a rung whose kernels make
        no such check, by find_nonfinite before them)."""
        batch, flag = self._batches, np.zeros(1, np.int32)
        self._batches += 1
        try:
            self._queue(count, source, chunk, outputs, check_finite, batch, flag)
        except BaseException:
            self._settle()  # no copy queued reads the caller's images (or writes its outputs) once this has returned
            raise
        if flag[0]:
            raise nonfinite_error("images")

    def _queue(
        self, count: int, source: ChunkSource, chunk: int, outputs: OutputSink, check_finite: bool, batch: int, flag: np.ndarray
    ) -> None:
        """schedule()'s rounds, and the wait for the last of them; the check's flag read into `flag`."""
        width, trace = len(self.streams), self._trace
        per_chunk = trace.per_chunk  # the trace of each chunk's spans, or NO_TRACE and a span of the batch on each stream
        chunks = math.ceil(count / chunk)
        separate_check = check_finite and not self._launcher.checks_finite
        with device_errors("CUDA error while computing"), ExitStack() as batch_spans:
            if check_finite:
                self._driver.memset_d32(self._nonfinite, 0, 1)
            for first in range(0, chunks, width):
                round_ = range(first, min(first + width, chunks))
                for index in round_:
                    chunk_stream = self.streams[index % width]
                    if index < width and trace.enabled and per_chunk is NO_TRACE:  # the stream's first chunk: its batch span opens
                        own = range(index, chunks, width)
                        images = sum(min(chunk, count - mine * chunk) for mine in own)
                        batch_spans.enter_context(trace.span("batch", chunk_stream.stream, batch=batch, chunks=len(own), images=images))
                    images = min(chunk, count - index * chunk)
                    with per_chunk.group("chunk in", chunk_stream.stream, batch=batch, chunk=index, images=images):
                        source.start(chunk_stream, index)
                for index in round_:
                    chunk_stream = self.streams[index % width]
                    images = min(chunk, count - index * chunk)
                    with per_chunk.span("images ready", chunk=index):
                        address = source.images(chunk_stream, index)
                    with per_chunk.group("kernels", chunk_stream.stream, batch=batch, chunk=index, images=images):
                        if separate_check:
                            self._find_nonfinite(chunk_stream.stream, address, images, self._nonfinite)
                        chunk_stream.run(self._launcher, address, images)
                    # Queued right after the kernels: its copy starts at their end, with no event of its own.
                    with per_chunk.group("chunk out", chunk_stream.stream, follows=True, batch=batch, chunk=index, images=images):
                        outputs.take(chunk_stream, index, images)
            batch_spans.close()  # each ends with the last work queued on its stream, before the wait for it
            outputs.finish(self.streams)
            for chunk_stream in self.streams:
                trace.settle(chunk_stream.stream)
            if check_finite:
                self._driver.memcpy_dtoh(flag, self._nonfinite)

    def _settle(self) -> None:
        """Wait for what is queued on every stream, even through a signal (raised once every stream is waited for); in a
        lost context each wait fails at once, and nothing runs on."""
        interrupted: BaseException | None = None
        for chunk_stream in self.streams:
            try:
                chunk_stream.stream.synchronize()
            except self._driver.Error:
                pass
            except BaseException as error:  # KeyboardInterrupt, or SIGTERM's exception
                interrupted = interrupted or error
        if interrupted is not None:
            raise interrupted

    def _partials_for(self, chunks: int) -> np.ndarray:
        """Page-locked memory for the partials of `chunks` chunks, and an event for each; grown as needed."""
        if self._host_partials is None or len(self._host_partials) < chunks:
            with device_errors("cannot allocate page-locked host memory"):
                if self._host_partials is not None:
                    self._memory.free(self._host_partials)
                    self._host_partials = None
                self._host_partials = self._memory.host((chunks, self._launcher.segments, self.chunk, OUT_LAYER_SIZE))
                no_timing = self._driver.event_flags.DISABLE_TIMING
                self._chunk_done += [self._driver.Event(no_timing) for _ in range(chunks - len(self._chunk_done))]
        return self._host_partials

    def free(self) -> None:
        """Give back every stream's buffers (the partials' page-locked memory goes with the allocator's free_all)."""
        for chunk_stream in self.streams:
            chunk_stream.free()
        self.streams = []
