"""The CUDA backend (the lab's cuda.rs). Three small pieces, as tinygrad's runtime has them:

- `Allocator` owns device and page-locked host memory: what it gives out it can take back, and
  whatever is still out when the context closes it frees;
- `Lane` schedules one chunk at a time on its own stream: copy in, both kernels, partials out;
- `CudaContext` owns the driver context, the module, the weights, the lanes and the allocator,
  and frees them in order, the context last.

compute(batch) deals the batch's chunks round-robin to the lanes, so the copy in of one chunk
overlaps the kernels of another and the copy out of a third; as each chunk's partials arrive the
host adds them up with numpy while later chunks are still on the device.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from cnnlab.errors import DeviceError, DeviceLostError
from cnnlab.kernels import DENSE_MAX_THREADS, Conv2dRelu, FlattenedToDense
from cnnlab.network import IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM, Cnn, ImageBatch, OutputBatch
from cnnlab.ptx import ensure_ptx

# Images per compute() call from the command line: the run's two page-locked buffers stay at ~330 MB.
DEFAULT_BATCH_IMAGES = 2048


@dataclass(frozen=True)
class LaunchConfig:
    """How the work is spread: lanes (streams), images per chunk, segments, thread-block counts."""

    streams: int = 3
    chunk_images: int | None = None  # None: the batch dealt evenly over the lanes, so one batch already overlaps
    segments: int = 4  # partial sums per output: flattened_to_dense's gridDim.y
    dense_threads: int = 256
    conv_blocks: int | None = None  # None: sized to the device
    dense_blocks: int | None = None
    lane_bytes_cap: int | None = None  # the most device memory the lanes may take; None: what is free

    def __post_init__(self) -> None:
        if self.streams < 1 or (self.chunk_images is not None and self.chunk_images < 1):
            raise ValueError(f"invalid launch configuration {self}")
        if not 1 <= self.segments <= OUT_NEURON_DIM // 2:
            raise ValueError(f"segments must be between 1 and {OUT_NEURON_DIM // 2}, not {self.segments}")
        if self.dense_threads % 32 or not 32 <= self.dense_threads <= DENSE_MAX_THREADS:
            raise ValueError(f"dense_threads must be a multiple of 32 up to {DENSE_MAX_THREADS}")


def import_driver() -> Any:
    """pycuda.driver, or a one-line DeviceError saying what is missing."""
    try:
        import pycuda.driver as driver
    except ModuleNotFoundError:
        raise DeviceError("cuda mode needs pycuda: pip install 'cnnlab[cuda]'") from None
    except ImportError as error:  # pycuda is there but the driver library is not
        raise DeviceError(f"no CUDA driver: {error}") from None
    return driver


@contextmanager
def device_errors(what: str) -> Iterator[None]:
    """Turn the driver's exceptions into a one-line DeviceError saying what was being done."""
    driver = import_driver()
    try:
        yield
    except driver.Error as error:
        detail = " ".join(str(error).split())
        raise (DeviceLostError if _context_lost(driver) else DeviceError)(f"{what}: {detail}") from None


def _context_lost(driver: Any) -> bool:
    """Whether the current context has hit an error it cannot recover from (every later call fails)."""
    if driver.Context.get_current() is None:
        return False
    try:
        driver.Context.synchronize()
    except driver.Error:
        return True
    return False


class Allocator:
    """Device and page-locked host memory: alloc, free, and free_all for whatever is still out."""

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self._device: list[Any] = []
        self._host: list[np.ndarray] = []

    def device(self, nbytes: int) -> Any:
        allocation = self._driver.mem_alloc(nbytes)
        self._device.append(allocation)
        return allocation

    def host(self, shape: tuple[int, ...]) -> np.ndarray:
        buffer = self._driver.pagelocked_empty(shape, np.float64)
        self._host.append(buffer)
        return buffer

    def free(self, allocation: Any) -> None:
        """Give back a device allocation or a page-locked buffer made here."""
        if isinstance(allocation, np.ndarray):
            self._host = [buffer for buffer in self._host if buffer is not allocation]
            allocation.base.free()
        else:
            self._device = [held for held in self._device if held is not allocation]
            allocation.free()

    def is_page_locked(self, array: np.ndarray) -> bool:
        start = array.ctypes.data
        return any(buffer.ctypes.data <= start < buffer.ctypes.data + buffer.nbytes for buffer in self._host)

    def free_all(self) -> None:
        for allocation in [*self._device, *self._host]:
            self.free(allocation)


class Lane:
    """A stream and the device buffers of one chunk: copy in, launch both kernels, copy the partials out."""

    def __init__(self, driver: Any, memory: Allocator, chunk: int, segments: int) -> None:
        self.stream = driver.Stream()
        self._driver, self._memory, self.chunk = driver, memory, chunk
        self.images = memory.device(chunk * IMAGE_BYTES)
        self.conv_out = memory.device(chunk * OUT_NEURON_DIM * 8)
        self.partials = memory.device(segments * chunk * OUT_LAYER_SIZE * 8)
        self._staging: np.ndarray | None = None  # page-locked copy of a pageable chunk, made on first need
        self._staging_free = driver.Event()  # the last copy out of the staging buffer has finished

    def copy_in(self, images: np.ndarray, page_locked: bool) -> int:
        """Copy a chunk of host images to the lane's device buffer (through staging if pageable); its address."""
        if not page_locked:
            if self._staging is None:
                self._staging = self._memory.host((self.chunk, INPUT_DIM, INPUT_DIM))
            self._staging_free.synchronize()
            staged = self._staging[: len(images)]
            np.copyto(staged, images)
            images = staged
        self._driver.memcpy_htod_async(self.images, images, self.stream)
        if not page_locked:
            self._staging_free.record(self.stream)
        return int(self.images)

    def run(self, conv: Conv2dRelu, dense: FlattenedToDense, images: int, weights: Any, count: int) -> None:
        conv(self.stream, images, self.conv_out, count)
        dense(self.stream, self.conv_out, weights, self.partials, count, self.chunk)

    def copy_out(self, partials: np.ndarray, done: Any) -> None:
        """Copy the chunk's partials to page-locked `partials` and record `done` when they are there."""
        self._driver.memcpy_dtoh_async(partials, self.partials, self.stream)
        done.record(self.stream)

    def free(self) -> None:
        for allocation in (self.images, self.conv_out, self.partials, self._staging):
            if allocation is not None:
                self._memory.free(allocation)


@dataclass
class DeviceImages:
    """Images in device memory (the benchmark's resident figure); context.free(images) gives them back."""

    allocation: Any
    count: int


@dataclass(frozen=True)
class CopyRates:
    """The copy bounds in bytes per second: host-to-device from page-locked memory, device-to-device (read + written)."""

    host_to_device: float
    device_to_device: float


class CudaContext:
    """The GPU backend. Use as a context manager: leaving it frees everything, the context last."""

    name = "cuda"

    def __init__(self, cnn: Cnn, batch_size: int | None = None, config: LaunchConfig | None = None) -> None:
        self.config = config or LaunchConfig()
        self.batch_size = batch_size or DEFAULT_BATCH_IMAGES
        self._chunk = self.config.chunk_images or math.ceil(self.batch_size / self.config.streams)
        self._driver = driver = import_driver()
        self._memory = Allocator(driver)
        ptx = ensure_ptx()
        self._context = None
        self._lanes: list[Lane] = []
        self._host_partials: np.ndarray | None = None  # page-locked (chunks, segments, chunk, 10), grown as needed
        self._chunk_done: list[Any] = []  # an event per chunk: its partials are on the host
        with device_errors("cannot start CUDA"):
            driver.init()
            if driver.Device.count() == 0:
                raise DeviceError("no CUDA device found")
            device = driver.Device(0)
            # The primary context, as the CUDA runtime uses: other libraries in the process share it.
            self._context = device.retain_primary_context()
            self._context.push()
        try:
            self.device = device.name()
            sm_count = device.get_attribute(driver.device_attribute.MULTIPROCESSOR_COUNT)
            with device_errors(f"cannot load {ptx}"):
                self._module = driver.module_from_file(str(ptx))
                self._conv = Conv2dRelu(self._module, sm_count, self.config.conv_blocks)
                self._dense = FlattenedToDense(
                    self._module, sm_count, self.config.segments, self.config.dense_threads, self.config.dense_blocks
                )
                driver.memcpy_htod(self._module.get_global("filters")[0], cnn.filters)
                self._weights = self._memory.device(cnn.weights.nbytes)
                driver.memcpy_htod(self._weights, cnn.weights)
            self._make_lanes()
        except BaseException:
            self.close()
            raise

    def _make_lanes(self) -> None:
        """Make the lanes, halving the chunk until their device buffers fit (or fit under the cap)."""
        streams, cap = self.config.streams, self.config.lane_bytes_cap
        while True:
            try:
                lane_bytes = self._chunk * (IMAGE_BYTES + OUT_NEURON_DIM * 8 + self.config.segments * OUT_LAYER_SIZE * 8)
                if cap is not None and streams * lane_bytes > cap:
                    raise DeviceError(f"{streams} lanes of {self._chunk} images need more than {cap} bytes")
                with device_errors("cannot allocate device buffers"):
                    for _ in range(streams):
                        self._lanes.append(Lane(self._driver, self._memory, self._chunk, self.config.segments))
                return
            except DeviceError:
                self._free_lanes()
                if self._chunk == 1:
                    raise
                self._chunk //= 2

    @property
    def chunk_images(self) -> int:
        """Images per chunk: the configured size, or less where device memory did not hold it."""
        return self._chunk

    def allocate_images(self, count: int) -> np.ndarray:
        """A page-locked host buffer: chunks copy from it straight to the device, with no staging."""
        with device_errors("cannot allocate page-locked host memory"):
            return self._memory.host((count, INPUT_DIM, INPUT_DIM))

    def upload(self, batch: ImageBatch) -> DeviceImages:
        """Copy a batch to device memory once, for compute_resident(); free() gives the memory back."""
        with device_errors("cannot copy images to the device"):
            allocation = self._memory.device(batch.images.nbytes)
            self._driver.memcpy_htod(allocation, batch.images)
        return DeviceImages(allocation, len(batch))

    def free(self, images: DeviceImages) -> None:
        self._memory.free(images.allocation)

    def compute(self, batch: ImageBatch) -> OutputBatch:
        """Outputs for a host batch: copies in, both kernels, partials back, reduction on the host."""
        page_locked = self._memory.is_page_locked(batch.images)
        return self._run(len(batch), lambda lane, first, count: lane.copy_in(batch.images[first : first + count], page_locked))

    def compute_resident(self, images: DeviceImages) -> OutputBatch:
        """Outputs for images already on the device: the kernels, the partials' copy and the reduction."""
        return self._run(images.count, lambda lane, first, count: int(images.allocation) + first * IMAGE_BYTES)

    def _run(self, count: int, images_on: Callable[[Lane, int, int], int]) -> OutputBatch:
        """Every chunk through a lane in turn; `images_on(lane, first, count)` gives the chunk's device address."""
        chunk = self._chunk
        chunks = math.ceil(count / chunk)
        partials = self._partials_for(chunks)
        outputs = np.empty((chunks * chunk, OUT_LAYER_SIZE))
        with device_errors("CUDA error while computing"):
            for index in range(chunks):
                lane, first = self._lanes[index % len(self._lanes)], index * chunk
                size = min(chunk, count - first)
                lane.run(self._conv, self._dense, images_on(lane, first, size), self._weights, size)
                lane.copy_out(partials[index], self._chunk_done[index])
            for index in range(chunks):
                self._chunk_done[index].synchronize()
                # Sum over the segments axis (the leading one): numpy adds whole rows in segment order.
                np.sum(partials[index], axis=0, out=outputs[index * chunk : (index + 1) * chunk])
        return OutputBatch(outputs[:count])

    def _partials_for(self, chunks: int) -> np.ndarray:
        """Page-locked room for the partials of `chunks` chunks, and an event for each; grown as needed."""
        if self._host_partials is None or len(self._host_partials) < chunks:
            with device_errors("cannot allocate page-locked host memory"):
                if self._host_partials is not None:
                    self._memory.free(self._host_partials)
                    self._host_partials = None
                self._host_partials = self._memory.host((chunks, self.config.segments, self._chunk, OUT_LAYER_SIZE))
                no_timing = self._driver.event_flags.DISABLE_TIMING
                self._chunk_done += [self._driver.Event(no_timing) for _ in range(chunks - len(self._chunk_done))]
        return self._host_partials

    def copy_rates(self, host: np.ndarray, images: DeviceImages, repeats: int) -> CopyRates:
        """The copy bounds, timed with CUDA events: `host` (page-locked) to the device, and `images` within it."""
        driver, nbytes = self._driver, host.nbytes
        with device_errors("cannot time the copy bounds"):
            target = self._memory.device(nbytes)
            try:
                stream, start, end = driver.Stream(), driver.Event(), driver.Event()

                def seconds(copy: Callable[[], None]) -> float:
                    copy()
                    times = []
                    for _ in range(repeats):
                        start.record(stream)
                        copy()
                        end.record(stream)
                        end.synchronize()
                        times.append(end.time_since(start) / 1e3)
                    return statistics.median(times)

                h2d = nbytes / seconds(lambda: driver.memcpy_htod_async(target, host, stream))
                d2d = 2 * nbytes / seconds(lambda: driver.memcpy_dtod_async(target, images.allocation, nbytes, stream))
            finally:
                self._memory.free(target)
        return CopyRates(h2d, d2d)

    def _free_lanes(self) -> None:
        for lane in self._lanes:
            lane.free()
        self._lanes = []

    def close(self) -> None:
        """Free device memory, then page-locked memory, the module and streams, and the context last.

        In a lost context every free fails, so nothing is freed: the process's end takes it all.
        """
        if self._context is None:
            return
        try:
            if not _context_lost(self._driver):
                self._free_lanes()
                self._memory.free_all()
                self._host_partials, self._chunk_done = None, []
                self._conv = self._dense = self._module = None
        finally:
            self._context.pop()
            self._context.detach()
            self._context = None

    def __enter__(self) -> CudaContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
