"""The CUDA backend (the lab's cuda.rs): CudaContext owns the driver context, the module, the
streams and every device and page-locked host buffer, and frees them in order.

compute(batch) cuts the batch into chunks and deals them round-robin to a few "lanes", each a
stream with its own device buffers. On a lane a chunk is copied in, run through conv2d_relu and
flattened_to_dense, and its partial sums copied back, so the copy in of one chunk overlaps the
kernels of another and the copy out of a third. As each chunk's partials arrive, the host adds
them up with numpy while the later chunks are still on the device.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from cnnlab.errors import DeviceError, DeviceLostError
from cnnlab.network import (
    CONV_OUT_DIM,
    IMAGE_BYTES,
    INPUT_DIM,
    OUT_LAYER_SIZE,
    OUT_NEURON_DIM,
    Cnn,
    ImageBatch,
    OutputBatch,
)
from cnnlab.ptx import ensure_ptx

CONV_THREADS = 160  # CONV_BANDS_PER_BLOCK * CONV_OUT_DIM in kernel.cu
CONV_BANDS_PER_BLOCK = 8
DENSE_MAX_THREADS = 1024
BLOCKS_PER_SM = 8  # grid-stride kernels: enough resident blocks to hide memory latency
DEFAULT_BATCH_IMAGES = 2048


@dataclass(frozen=True)
class LaunchConfig:
    """How the work is spread: lanes (streams), images per chunk, partials per output, grid sizes."""

    streams: int = 3
    chunk_images: int = 2048  # the most images a lane's device buffers hold
    segments: int = 4  # partial sums per output: flattened_to_dense's gridDim.y
    dense_threads: int = 256
    conv_blocks: int | None = None  # None: sized to the device
    dense_blocks: int | None = None
    lane_bytes_cap: int | None = None  # the most device memory the lanes may take; None: what is free

    def __post_init__(self) -> None:
        if min(self.streams, self.chunk_images, self.segments) < 1 or self.segments > OUT_NEURON_DIM // 2:
            raise ValueError(f"invalid launch configuration {self}")
        if self.dense_threads % 32 or not 32 <= self.dense_threads <= DENSE_MAX_THREADS:
            raise ValueError(f"dense_threads must be a multiple of 32 up to {DENSE_MAX_THREADS}")


def _import_driver() -> Any:
    try:
        import pycuda.driver as driver
    except ModuleNotFoundError:
        raise DeviceError("cuda mode needs pycuda: pip install 'cnnlab[cuda]'") from None
    except ImportError as error:  # pycuda is there but the driver library is not
        raise DeviceError(f"no CUDA driver: {error}") from None
    return driver


@contextmanager
def _device_errors(what: str) -> Iterator[None]:
    """Turn the driver's exceptions into a one-line DeviceError saying what was being done."""
    driver = _import_driver()
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


@dataclass
class _Lane:
    """One stream and the device buffers of the chunk in flight on it."""

    stream: Any
    images: Any  # chunk x 100 x 100
    conv_out: Any  # chunk x 4000
    partials: Any  # segments x chunk x 10
    staging: np.ndarray | None = None  # page-locked copy of a pageable chunk, made on first need
    staging_free: Any = None  # event: the last copy out of `staging` has finished


@dataclass
class DeviceImages:
    """Images already in device memory (for the benchmark's resident figure); owned by the context."""

    allocation: Any
    count: int


class CudaContext:
    """The GPU backend. Use as a context manager: leaving it frees everything, the context last."""

    name = "cuda"

    def __init__(self, cnn: Cnn, batch_size: int | None = None, config: LaunchConfig | None = None) -> None:
        self.config = config or LaunchConfig()
        # The command line's batches: the run's two page-locked buffers stay at ~330 MB.
        self.batch_size = batch_size or DEFAULT_BATCH_IMAGES
        # A batch is spread over every lane, so that even one batch overlaps copies with kernels.
        self._chunk = min(self.config.chunk_images, math.ceil(self.batch_size / self.config.streams))
        self._driver = driver = _import_driver()
        ptx = ensure_ptx()
        self._context = None
        self._lanes: list[_Lane] = []
        self._host: list[np.ndarray] = []  # page-locked buffers, freed on close
        self._device: list[Any] = []  # device allocations other than the lanes'
        self._host_partials: np.ndarray | None = None  # page-locked (chunks, segments, chunk, 10)
        self._chunk_done: list[Any] = []  # an event per chunk: its partials are on the host
        with _device_errors("cannot start CUDA"):
            driver.init()
            if driver.Device.count() == 0:
                raise DeviceError("no CUDA device found")
            device = driver.Device(0)
            # The primary context, as the CUDA runtime uses: other libraries in the process share it.
            self._context = device.retain_primary_context()
            self._context.push()
        try:
            self.device = device.name()
            self._sm_count = device.get_attribute(driver.device_attribute.MULTIPROCESSOR_COUNT)
            with _device_errors(f"cannot load {ptx}"):
                self._module = driver.module_from_file(str(ptx))
                self._conv = self._module.get_function("conv2d_relu")
                self._conv.prepare("PPi")
                self._dense = self._module.get_function("flattened_to_dense")
                self._dense.prepare("PPPii")
                filters, _ = self._module.get_global("filters")
                driver.memcpy_htod(filters, cnn.filters)
                self._weights = self._device_alloc(cnn.weights.nbytes)
                driver.memcpy_htod(self._weights, cnn.weights)
            self._make_lanes()
        except BaseException:
            self.close()
            raise

    def _device_alloc(self, nbytes: int) -> Any:
        allocation = self._driver.mem_alloc(nbytes)
        self._device.append(allocation)
        return allocation

    def _make_lanes(self) -> None:
        """Allocate each lane's device buffers, halving the chunk until they fit in device memory."""
        driver = self._driver
        streams, segments, cap = self.config.streams, self.config.segments, self.config.lane_bytes_cap
        while True:
            try:
                lane_bytes = self._chunk * (IMAGE_BYTES + OUT_NEURON_DIM * 8 + segments * OUT_LAYER_SIZE * 8)
                if cap is not None and streams * lane_bytes > cap:
                    raise DeviceError(f"{streams} lanes of {self._chunk} images need more than {cap} bytes")
                with _device_errors("cannot allocate device buffers"):
                    for _ in range(streams):
                        self._lanes.append(
                            _Lane(
                                stream=driver.Stream(),
                                images=driver.mem_alloc(self._chunk * IMAGE_BYTES),
                                conv_out=driver.mem_alloc(self._chunk * OUT_NEURON_DIM * 8),
                                partials=driver.mem_alloc(segments * self._chunk * OUT_LAYER_SIZE * 8),
                            )
                        )
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
        with _device_errors("cannot allocate page-locked host memory"):
            buffer = self._driver.pagelocked_empty((count, INPUT_DIM, INPUT_DIM), np.float64)
        self._host.append(buffer)
        return buffer

    def _is_page_locked(self, array: np.ndarray) -> bool:
        start = array.ctypes.data
        return any(buffer.ctypes.data <= start < buffer.ctypes.data + buffer.nbytes for buffer in self._host)

    def upload(self, batch: ImageBatch) -> DeviceImages:
        """Copy a batch to device memory once, for compute_resident()."""
        with _device_errors("cannot copy images to the device"):
            allocation = self._device_alloc(batch.images.nbytes)
            self._driver.memcpy_htod(allocation, batch.images)
        return DeviceImages(allocation, len(batch))

    def compute(self, batch: ImageBatch) -> OutputBatch:
        """Outputs for a host batch: copies in, both kernels, partials back, reduction on the host."""
        return self._run(len(batch), host_images=batch.images)

    def compute_resident(self, images: DeviceImages) -> OutputBatch:
        """Outputs for images already on the device: the kernels, the partials' copy and the reduction."""
        return self._run(images.count, device_images=int(images.allocation))

    def _run(self, count: int, host_images: np.ndarray | None = None, device_images: int | None = None) -> OutputBatch:
        chunk, segments = self._chunk, self.config.segments
        chunks = math.ceil(count / chunk)
        host_partials = self._host_partials_for(chunks)
        page_locked = host_images is not None and self._is_page_locked(host_images)
        driver = self._driver
        outputs = np.empty((chunks * chunk, OUT_LAYER_SIZE))
        with _device_errors("CUDA error while computing"):
            for index in range(chunks):
                lane = self._lanes[index % len(self._lanes)]
                first = index * chunk
                images_now = min(chunk, count - first)
                if host_images is not None:
                    source = host_images[first : first + images_now]
                    if not page_locked:
                        source = self._stage(lane, source)
                    driver.memcpy_htod_async(lane.images, source, lane.stream)
                    if not page_locked:
                        lane.staging_free.record(lane.stream)
                    images = int(lane.images)
                else:
                    images = device_images + first * IMAGE_BYTES
                conv_blocks = self.config.conv_blocks or min(
                    math.ceil(images_now * CONV_OUT_DIM / CONV_BANDS_PER_BLOCK), self._sm_count * BLOCKS_PER_SM
                )
                self._conv.prepared_async_call(
                    (conv_blocks, 1), (CONV_THREADS, 1, 1), lane.stream, images, lane.conv_out, np.int32(images_now)
                )
                dense_blocks = self.config.dense_blocks or min(
                    images_now, max(1, self._sm_count * BLOCKS_PER_SM // segments)
                )
                self._dense.prepared_async_call(
                    (dense_blocks, segments),
                    (self.config.dense_threads, 1, 1),
                    lane.stream,
                    lane.conv_out,
                    self._weights,
                    lane.partials,
                    np.int32(images_now),
                    np.int32(chunk),
                )
                driver.memcpy_dtoh_async(host_partials[index], lane.partials, lane.stream)
                self._chunk_done[index].record(lane.stream)
            for index in range(chunks):
                self._chunk_done[index].synchronize()
                # Sum over the segments axis (the leading one): numpy adds whole rows in segment order.
                np.sum(host_partials[index], axis=0, out=outputs[index * chunk : (index + 1) * chunk])
        return OutputBatch(outputs[:count])

    def _stage(self, lane: _Lane, source: np.ndarray) -> np.ndarray:
        """Copy a pageable chunk into the lane's page-locked staging buffer, once the last copy from it is done."""
        if lane.staging is None:
            lane.staging = self.allocate_images(self._chunk)
            lane.staging_free = self._driver.Event()
        else:
            lane.staging_free.synchronize()
        staged = lane.staging[: len(source)]
        np.copyto(staged, source)
        return staged

    def _host_partials_for(self, chunks: int) -> np.ndarray:
        """Page-locked room for the partials of `chunks` chunks, and an event for each; grown as needed."""
        if self._host_partials is None or len(self._host_partials) < chunks:
            with _device_errors("cannot allocate page-locked host memory"):
                if self._host_partials is not None:
                    self._host_partials.base.free()
                    self._host_partials = None
                self._host_partials = self._driver.pagelocked_empty(
                    (chunks, self.config.segments, self._chunk, OUT_LAYER_SIZE), np.float64
                )
                no_timing = self._driver.event_flags.DISABLE_TIMING
                self._chunk_done += [self._driver.Event(no_timing) for _ in range(chunks - len(self._chunk_done))]
        return self._host_partials

    def _free_lanes(self) -> None:
        for lane in self._lanes:
            for allocation in (lane.images, lane.conv_out, lane.partials):
                allocation.free()
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
                for allocation in self._device:
                    allocation.free()
                for buffer in self._host:
                    buffer.base.free()
                if self._host_partials is not None:
                    self._host_partials.base.free()
                self._lanes, self._device, self._host, self._host_partials, self._chunk_done = [], [], [], None, []
                self._conv = self._dense = self._module = None
        finally:
            self._context.pop()
            self._context.detach()
            self._context = None

    def __enter__(self) -> CudaContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
