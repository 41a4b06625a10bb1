"""What CudaContext schedules with: the memory allocator, the lanes, the sources a chunk's images
come from (a host batch, images already on the device, or CSV text parsed on the device), and where
a chunk's outputs go (added up on the host, or on the device into a caller's array).

A source is asked twice per chunk: `start(lane, index)` queues whatever brings the chunk's images to
the lane (copies, the parse), for every lane of a round before the first kernel is launched, so the
copies of one lane overlap the kernels of another; `images(lane, index)` then returns their device
address, once they are known to be right. Outputs are asked once per chunk, `take(lane, index,
count)`, once the chunk's kernels are queued, and once at the end, `finish(lanes)`.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import threading
from typing import Any, Protocol

import numpy as np

from cnnlab.csv_gpu import STATUS_DTYPE, CsvParser, host_values, read_status, scratch_bytes
from cnnlab.kernels import SumSegments
from cnnlab.network import IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM

# Page-locked buffers from this size on ask for huge pages (2 MB): fewer pages to fault in and to register.
HUGE_PAGES_FROM = 4 << 20


class Allocator:
    """Device and page-locked host memory: alloc, free, and free_all for whatever is still out.

    The reader's thread allocates page-locked text windows while the main thread frees: a lock keeps the lists whole.
    """

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._device: list[Any] = []
        self._host: list[np.ndarray] = []

    def device(self, nbytes: int) -> Any:
        allocation = self._driver.mem_alloc(nbytes)
        with self._lock:
            self._device.append(allocation)
        return allocation

    def host(self, shape: tuple[int, ...] | int, dtype: Any = np.float64) -> np.ndarray:
        """Page-locked host memory: pages of its own (an anonymous mapping, so that no other object shares a page
        with it), huge where the kernel gives them, registered with the driver (cuMemHostRegister). On the H100
        machine that made 64 MB in 10-13 ms, against 34 ms for the driver's own (cuMemHostAlloc, PyCUDA's
        pagelocked_empty): a run's text windows are made while it reads. PyCUDA's register_host_memory refuses
        numpy 2's arrays, hence the driver's call through ctypes."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape if isinstance(shape, tuple) else (shape,)) * dtype.itemsize
        pages = mmap.mmap(-1, max(nbytes, 1))
        if nbytes >= HUGE_PAGES_FROM and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                pages.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # no transparent huge pages here: ordinary ones
                pass
        buffer = np.frombuffer(pages, np.uint8, nbytes).view(dtype).reshape(shape)
        if nbytes:
            self._call("cuMemHostRegister_v2", ctypes.c_void_p(buffer.ctypes.data), ctypes.c_size_t(nbytes), ctypes.c_uint(0))
        with self._lock:
            self._host.append(buffer)
        return buffer

    def free(self, allocation: Any) -> None:
        """Give back a device allocation or a page-locked buffer made here."""
        with self._lock:
            if isinstance(allocation, np.ndarray):
                self._host = [buffer for buffer in self._host if buffer is not allocation]
            else:
                self._device = [held for held in self._device if held is not allocation]
        if not isinstance(allocation, np.ndarray):
            allocation.free()
        elif allocation.nbytes:  # the pages are unmapped once the last array on them is gone
            self._call("cuMemHostUnregister", ctypes.c_void_p(allocation.ctypes.data))

    def _call(self, name: str, *args: Any) -> None:
        """A driver call through ctypes (the GIL released), its error raised as PyCUDA raises the driver's errors."""
        cuda = ctypes.CDLL("libcuda.so.1")
        result = getattr(cuda, name)(*args)
        if result:
            text = ctypes.c_char_p()
            cuda.cuGetErrorString(result, ctypes.byref(text))
            raise self._driver.Error(f"{name} failed: {(text.value or b'error %d' % result).decode()}")

    def is_page_locked(self, array: np.ndarray) -> bool:
        start = array.ctypes.data
        with self._lock:
            return any(buffer.ctypes.data <= start < buffer.ctypes.data + buffer.nbytes for buffer in self._host)

    def free_all(self) -> None:
        for allocation in [*self._device, *self._host]:
            self.free(allocation)


def lane_bytes(chunk: int, launcher: Launcher) -> int:
    """Device memory one lane takes: its images, the activations where the kernels pass them on, its partials."""
    per_image = IMAGE_BYTES + (OUT_NEURON_DIM * 8 if launcher.needs_conv_out else 0) + launcher.segments * OUT_LAYER_SIZE * 8
    return chunk * per_image


class Launcher(Protocol):
    """A rung's launches for one chunk: images at device address `images`, partials[segments][stride][10] out."""

    segments: int
    needs_conv_out: bool  # whether the lane must hold the chunk's 4,000 activations an image
    checks_finite: bool  # whether it sets the setup's nonfinite flag where an image value is a NaN or an infinity

    def __call__(self, stream: Any, images: int, conv_out: Any, partials: Any, count: int, stride: int) -> None: ...


class Lane:
    """A stream and the device buffers of one chunk: its images in, the rung's kernels, its partials out."""

    def __init__(self, driver: Any, memory: Allocator, chunk: int, launcher: Launcher) -> None:
        self.stream = driver.Stream()
        self.driver, self.memory, self.chunk = driver, memory, chunk
        self.images = memory.device(chunk * IMAGE_BYTES)
        self.conv_out = memory.device(chunk * OUT_NEURON_DIM * 8) if launcher.needs_conv_out else None
        self.partials = memory.device(launcher.segments * chunk * OUT_LAYER_SIZE * 8)
        self._staging: np.ndarray | None = None  # page-locked images on their way in, made on first need
        self._staging_free = driver.Event()  # the last copy out of the staging buffer has finished
        self.text: CsvOnDevice | None = None  # the GPU CSV parser's buffers, made on first need

    def staging(self, count: int) -> np.ndarray:
        """The page-locked staging buffer, once the last copy out of it has finished."""
        if self._staging is None:
            self._staging = self.memory.host((self.chunk, INPUT_DIM, INPUT_DIM))
        self._staging_free.synchronize()
        return self._staging[:count]

    def copy_in(self, images: np.ndarray) -> None:
        """Queue the copy of page-locked `images` to the lane's device buffer."""
        self.driver.memcpy_htod_async(self.images, images, self.stream)
        # A slice of the staging buffer has the buffer itself as its base, not the buffer's base (numpy stops
        # collapsing views at an owner that is not an array): ask whether the memory is the staging buffer's.
        if self._staging is not None and np.may_share_memory(images, self._staging):
            self._staging_free.record(self.stream)

    def run(self, launcher: Launcher, images: int, count: int) -> None:
        launcher(self.stream, images, self.conv_out, self.partials, count, self.chunk)

    def copy_out(self, partials: np.ndarray, done: Any) -> None:
        """Copy the chunk's partials to page-locked `partials` and record `done` when they are there."""
        self.driver.memcpy_dtoh_async(partials, self.partials, self.stream)
        done.record(self.stream)

    def free(self) -> None:
        for allocation in (self.images, self.conv_out, self.partials, self._staging):
            if allocation is not None:
                self.memory.free(allocation)
        if self.text is not None:
            self.text.free()


class ChunkSource(Protocol):
    def start(self, lane: Lane, index: int) -> None: ...

    def images(self, lane: Lane, index: int) -> int: ...


class HostImages:
    """Chunks of a host batch: copied straight from page-locked memory, or staged there first."""

    def __init__(self, images: np.ndarray, chunk: int, page_locked: bool) -> None:
        self._images, self._chunk, self._page_locked = images, chunk, page_locked

    def start(self, lane: Lane, index: int) -> None:
        images = self._images[index * self._chunk : (index + 1) * self._chunk]
        if not self._page_locked:
            staged = lane.staging(len(images))
            np.copyto(staged, images)
            images = staged
        lane.copy_in(images)

    def images(self, lane: Lane, index: int) -> int:
        return int(lane.images)


class ResidentImages:
    """Chunks of images already in device memory: nothing to copy."""

    def __init__(self, address: int, chunk: int) -> None:
        self._address, self._chunk = address, chunk

    def start(self, lane: Lane, index: int) -> None:
        pass

    def images(self, lane: Lane, index: int) -> int:
        return self._address + index * self._chunk * IMAGE_BYTES


class CsvOnDevice:
    """A lane's buffers for CSV text: the text, the parser's scratch and status, grown to the largest chunk."""

    def __init__(self, lane: Lane, module: Any, nbytes: int, rows: int) -> None:
        self._memory = lane.memory
        self.text = self._memory.device(nbytes)
        self.scratch = self._memory.device(scratch_bytes(nbytes, rows))
        self.status = self._memory.device(STATUS_DTYPE.itemsize)
        self.host_status = self._memory.host(1, STATUS_DTYPE)
        self.status_ready = lane.driver.Event(lane.driver.event_flags.DISABLE_TIMING)
        self.parser = CsvParser(module, self.scratch, nbytes, rows)
        self.capacity = nbytes

    def free(self) -> None:
        for allocation in (self.text, self.scratch, self.status, self.host_status):
            self._memory.free(allocation)


class CsvText:
    """Chunks of a batch of CSV text (labcsv.CsvBatch): copied to the lane, parsed there into its images.

    Whatever the device could not take (a bad line, a value it cannot prove correctly rounded) is
    done on the host: the values it lists are converted with float() and patched in; anything else
    sends the chunk to the host's parser, which names a bad line as it always has, or converts it.
    """

    def __init__(self, batch: Any, chunk: int, module: Any) -> None:
        self._batch, self._module = batch, module
        self._pieces = batch.span.pieces(chunk * INPUT_DIM)

    def start(self, lane: Lane, index: int) -> None:
        piece = self._pieces[index]
        nbytes = piece.end - piece.start
        if lane.text is None or lane.text.capacity < nbytes:
            if lane.text is not None:
                lane.text.free()
            lane.text = CsvOnDevice(lane, self._module, max(nbytes, 1 << 20), lane.chunk * INPUT_DIM)
        text = lane.text
        lane.driver.memcpy_htod_async(text.text, piece.data[piece.start : piece.end], lane.stream)
        text.parser.parse(lane.stream, text.text, nbytes, lane.images, 0, piece.rows, text.status)
        text.parser.fetch_status(lane.stream, text.host_status, text.status)
        text.status_ready.record(lane.stream)

    def images(self, lane: Lane, index: int) -> int:
        piece, text = self._pieces[index], lane.text
        assert text is not None
        text.status_ready.synchronize()
        result = read_status(text.host_status)
        if result.ok:
            text.parser.patch(lane.stream, lane.images, 0, text.status, host_values(piece.data[piece.start : piece.end], result))
        else:
            staged = lane.staging(piece.rows // INPUT_DIM)
            self._batch.parse_on_host(piece, staged.reshape(-1))
            lane.copy_in(staged)
        return int(lane.images)


class OutputSink(Protocol):
    def take(self, lane: Lane, index: int, count: int) -> None: ...

    def finish(self, lanes: list[Lane]) -> None: ...


class HostOutputs:
    """Each chunk's partials copied to page-locked host memory and added up there with numpy, while later
    chunks are still on the device; `values` holds the outputs once finish() returns."""

    def __init__(self, partials: np.ndarray, done: list[Any], count: int, chunk: int) -> None:
        self._partials, self._done, self._chunk = partials, done, chunk
        self.values = np.empty((math.ceil(count / chunk) * chunk, OUT_LAYER_SIZE))

    def take(self, lane: Lane, index: int, count: int) -> None:
        lane.copy_out(self._partials[index], self._done[index])

    def finish(self, lanes: list[Lane]) -> None:
        chunk = self._chunk
        for index in range(len(self.values) // chunk):
            self._done[index].synchronize()
            # Sum over the segments axis (the leading one): numpy adds whole rows in segment order.
            np.sum(self._partials[index, :, :chunk], axis=0, out=self.values[index * chunk : (index + 1) * chunk])


class DeviceOutputs:
    """Each chunk's partials added up on the device (sum_segments, in the host's order, so the same bits)
    straight into (count, 10) float64 device memory at `address`, a caller's array: nothing comes back."""

    def __init__(self, sum_segments: SumSegments, address: int, chunk: int) -> None:
        self._sum, self._address, self._chunk = sum_segments, address, chunk

    def take(self, lane: Lane, index: int, count: int) -> None:
        self._sum(lane.stream, lane.partials, self._address + index * self._chunk * OUT_LAYER_SIZE * 8, count, lane.chunk)

    def finish(self, lanes: list[Lane]) -> None:
        for lane in lanes:
            lane.stream.synchronize()
