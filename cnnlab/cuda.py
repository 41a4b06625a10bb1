"""The CUDA backend (the lab's cuda.rs). Three small pieces, as tinygrad's runtime has them:

- `Allocator` (lanes.py) owns device and page-locked host memory: what it gives out it can take
  back, and whatever is still out when the context closes it frees;
- `Lane` (lanes.py) schedules one chunk at a time on its own stream: images in, the kernels of the
  chosen rung of the ladder (ladder.py; by default the design card's two), partials out;
- `CudaContext` owns the driver context, the modules, the weights, the lanes and the allocator,
  and frees them in order, the context last.

compute(batch) deals the batch's chunks round-robin to the lanes, so the copy in of one chunk
overlaps the kernels of another and the copy out of a third; as each chunk's partials arrive the
host adds them up with numpy while later chunks are still on the device.

forward(images, out=None) is the same schedule for the Python API: images from any host array or
from device memory (`__cuda_array_interface__`, read where they lie, as compute_resident reads
them), outputs to the host or, with `out`, added up on the device into the caller's array.
"""

from __future__ import annotations

import ctypes
import math
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from cnnlab.arrays import DeviceArray, check_device_images, check_device_outputs, device_array, host_images
from cnnlab.errors import ArrayError, DeviceError, DeviceLostError, memory_limit_note
from cnnlab.kernels import FindNonFinite, SumSegments
from cnnlab.ladder import KERNEL_BUILD, DeviceSetup, LaunchConfig, launcher
from cnnlab.lanes import (
    Allocator,
    ChunkSource,
    CsvText,
    DeviceOutputs,
    HostImages,
    HostOutputs,
    Lane,
    Launcher,
    OutputSink,
    ResidentImages,
    lane_bytes,
)
from cnnlab.network import (
    IMAGE_BYTES,
    INPUT_DIM,
    OUT_LAYER_SIZE,
    OUT_NEURON_DIM,
    Cnn,
    ImageBatch,
    OutputBatch,
    TextBatching,
    nonfinite_error,
    require_finite,
)
from cnnlab.nvcc import ensure_modules
from cnnlab.resources import install_command

# Images per compute() call from the command line: the run's two page-locked buffers stay at ~330 MB.
DEFAULT_BATCH_IMAGES = 2048
# Images per compute() call when CSV text is parsed on the device: ~50 MB of text a batch, read into one of
# two page-locked windows (made before the run, ~60 MB each) while the other's batch is on the device, and
# dealt over the lanes so that one lane's copy overlaps another's parse. On the H100 machine (10,000 images,
# tools/profile_cuda_csv.py): 256 a batch loop 0.16-0.19 s, 512 0.27-0.31 s, where making the larger
# windows page-locked cost more than the fewer hand-offs saved.
DEFAULT_TEXT_BATCH_IMAGES = 256


def _synchronize_stream(handle: int) -> None:
    """Wait for the work queued on a stream that another library made (a device array's producer, which
    `__cuda_array_interface__` names as a driver handle: 1 and 2 are the default streams). PyCUDA wraps
    only streams it made, so the driver's own call."""
    synchronize = ctypes.CDLL("libcuda.so.1").cuStreamSynchronize
    synchronize.argtypes = [ctypes.c_void_p]
    result = synchronize(handle)
    if result != 0:
        raise DeviceError(f"cannot wait for the device array's stream {handle:#x}: CUDA error {result}")


def import_driver() -> Any:
    """pycuda.driver, or a one-line DeviceError saying what is missing."""
    try:
        import pycuda.driver as driver
    except ModuleNotFoundError:
        hint = f"{install_command('cuda')} (builds PyCUDA from source: needs the CUDA toolkit)"
        raise DeviceError(f"the GPU path needs pycuda: {hint}") from None
    except ImportError as error:  # pycuda is there but the driver library is not, or cannot be mapped (ulimit -v)
        note = memory_limit_note() if "failed to map" in str(error) else ""
        raise DeviceError(f"no CUDA driver: {error}{note}") from None
    return driver


@contextmanager
def device_errors(what: str) -> Iterator[None]:
    """Turn the driver's exceptions into a one-line DeviceError saying what was being done."""
    driver = import_driver()
    try:
        yield
    except driver.Error as error:
        detail = " ".join(str(error).split())
        if "out of memory" in detail:  # the driver reserves far more address space than it uses
            detail += memory_limit_note()
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
class DeviceImages:
    """Images in device memory (the benchmark's resident figure); context.free(images) gives them back."""

    allocation: Any
    count: int


@dataclass(frozen=True)
class KernelTiming:
    """A rung's kernels over resident images: each timed run's seconds (CUDA events) and the last run's outputs."""

    seconds: list[float]
    outputs: OutputBatch

    @property
    def images_per_second(self) -> float:
        return len(self.outputs) / statistics.median(self.seconds)


@dataclass(frozen=True)
class CopyRates:
    """The copy bounds in bytes per second: host-to-device from page-locked memory, device-to-device (read + written)."""

    host_to_device: float
    device_to_device: float


class CudaContext:
    """The GPU backend. Use as a context manager: leaving it frees everything, the context last."""

    name = "cuda"

    def __init__(
        self, cnn: Cnn, batch_size: int | None = None, config: LaunchConfig | None = None, parse_csv: bool = True
    ) -> None:
        """Start the driver, load the kernels, put the weights on device 0 and make the lanes.

        `batch_size`: images per compute() call from the command line; `config`: how the work is spread;
        `parse_csv`: whether CSV text is parsed on the device (the command line's cuda mode).
        """
        self.config = config or LaunchConfig()
        self._parse_csv = parse_csv  # CSV input parsed here on the device; False: by the host's reader
        self.batch_size = batch_size or DEFAULT_BATCH_IMAGES
        self._text_batch = batch_size or DEFAULT_TEXT_BATCH_IMAGES
        self._chunk = self.config.chunk_images or math.ceil(self.batch_size / self.config.streams)
        self._driver = driver = import_driver()
        self._memory = Allocator(driver)
        modules = ensure_modules()
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
            with device_errors(f"cannot load {modules.cnn}"):
                self._module = driver.module_from_file(str(modules.cnn))
                self._csv_module = driver.module_from_file(str(modules.csv))
                driver.memcpy_htod(self._module.get_global("filters")[0], cnn.filters)
                self._weights = self._memory.device(cnn.weights.nbytes)
                driver.memcpy_htod(self._weights, cnn.weights)
            with device_errors(f"cannot load kernel {self.config.kernel}"):
                self.setup = DeviceSetup(driver, device, self._memory, cnn, self._weights)
                self.setup.add_module(KERNEL_BUILD, self._module)
                self._launcher: Launcher = launcher(self.config.kernel, self.setup, self.config)
                self._sum_segments = SumSegments(self._module, self.setup.sm_count, self._launcher.segments)
                self._find_nonfinite = FindNonFinite(self._module, self.setup.sm_count)
            self._make_lanes()
        except BaseException:
            self.close()
            raise

    def _make_lanes(self) -> None:
        """Make the lanes, halving the chunk until their device buffers fit (or fit under the cap)."""
        streams, cap = self.config.streams, self.config.lane_bytes_cap
        while True:
            try:
                if cap is not None and streams * lane_bytes(self._chunk, self._launcher) > cap:
                    raise DeviceError(f"{streams} lanes of {self._chunk} images need more than {cap} bytes")
                with device_errors("cannot allocate device buffers"):
                    for _ in range(streams):
                        self._lanes.append(Lane(self._driver, self._memory, self._chunk, self._launcher))
                return
            except DeviceError:
                self._free_lanes()
                if self._chunk == 1:
                    raise
                self._chunk //= 2

    @property
    def csv_text(self) -> TextBatching | None:
        """How CSV text comes to the device: a batch dealt over the lanes; None where the host's reader parses CSV."""
        if not self._parse_csv:
            return None
        return TextBatching(self._text_batch, min(self._chunk, math.ceil(self._text_batch / len(self._lanes))))

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

    def compute(self, batch: ImageBatch | Any, check_finite: bool = False) -> OutputBatch:
        """Outputs for a host batch of images, or of CSV text (labcsv.CsvBatch) parsed here on the device (its values
        are finite: the parser refuses the rest). `check_finite`: an ArrayError where an image holds a NaN or an infinity."""
        if isinstance(batch, ImageBatch):
            source = HostImages(batch.images, self._chunk, self._memory.is_page_locked(batch.images))
            return self._run(len(batch), source, check_finite=check_finite)
        chunk = self.csv_text.chunk_images
        return self._run(len(batch), CsvText(batch, chunk, self._csv_module), chunk)

    def compute_resident(self, images: DeviceImages) -> OutputBatch:
        """Outputs for images already on the device: the kernels, the partials' copy and the reduction."""
        return self._run(images.count, ResidentImages(int(images.allocation), self._chunk))

    def forward(self, images: Any, out: Any = None) -> Any:
        """The network's outputs for `images`, as cnnlab.forward gives them, with this context's kernels and buffers.

        `images`: one (100, 100) image or a batch (N, 100, 100), either anything numpy reads (any real
        dtype and layout, converted to float64 as it is copied to the device) or a device array
        (`__cuda_array_interface__`: CuPy, PyTorch CUDA tensors, Numba), read where it lies with no
        trip through the host; it must be C-ordered float64 then. Returns a (N, 10) float64 numpy
        array, (10,) for one image; or, given `out`, a device array of that shape (float64,
        C-contiguous), writes the outputs there on the device and returns `out`. A NaN or an infinity
        in the images (found by conv2d_relu as it reads them, or by find_nonfinite for a rung
        that makes no such check) raises ArrayError, and leaves `out` undefined. Returns once the outputs are written.
        """
        source_array = device_array(images)
        host: np.ndarray | None = None
        if source_array is not None:
            count, single = check_device_images(source_array)
        else:
            host, single = host_images(images)
            count = len(host)
        target = None if out is None else device_array(out)
        if out is not None:
            if target is None:
                raise ArrayError("out must be a device array (__cuda_array_interface__); without out, forward returns a numpy array")
            check_device_outputs(target, count, single)
        if count == 0:
            return out if out is not None else np.empty((0, OUT_LAYER_SIZE))
        with device_errors("cannot read the caller's device arrays"):
            for array, what in ((source_array, "images"), (target, "out")):
                if array is not None:
                    self._check_device_memory(array, what)
                    if array.stream is not None:
                        _synchronize_stream(array.stream)
        if host is not None:
            page_locked = host.dtype == np.float64 and host.flags.c_contiguous and self._memory.is_page_locked(host)
            source: ChunkSource = HostImages(host, self._chunk, page_locked)
        else:
            source = ResidentImages(source_array.address, self._chunk)
        try:
            if target is None:
                values = self._run(count, source, check_finite=True).values
                return values[0] if single else values
            self._schedule(count, source, self._chunk, DeviceOutputs(self._sum_segments, target.address, self._chunk), True)
            return out
        except ArrayError:
            if host is not None:  # the host copy says where: worth a pass over it only now that it failed
                require_finite("images", host)
            raise

    def _check_device_memory(self, array: DeviceArray, what: str) -> None:
        """An ArrayError unless `array` lies wholly in one allocation of this context (device 0's primary one):
        a kernel that read elsewhere would fault and lose the context."""
        try:
            base, size = self._driver.mem_get_address_range(array.address)
        except self._driver.Error:
            raise ArrayError(
                f"{what} at {array.address:#x} is not device memory of GPU 0's primary context, which cnnlab uses"
            ) from None
        if array.address + array.nbytes > int(base) + size:
            raise ArrayError(f"{what} ({array.nbytes} bytes at {array.address:#x}) run past the end of their allocation")

    def allocate_text(self, nbytes: int) -> np.ndarray:
        """A page-locked byte buffer, for CSV text the device copies straight from.

        The reader's thread calls it too: the context is made current there for the allocation.
        """
        with device_errors("cannot allocate page-locked host memory"), self._current():
            return self._memory.host(nbytes, np.uint8)

    def free_text(self, buffer: np.ndarray) -> None:
        """Give a text window back; in a lost context nothing is freed (see close())."""
        with device_errors("cannot free page-locked host memory"), self._current():
            if not _context_lost(self._driver):
                self._memory.free(buffer)

    @contextmanager
    def _current(self) -> Iterator[None]:
        """The context made current in this thread for a while (the reader's thread has none of its own)."""
        self._context.push()
        try:
            yield
        finally:
            self._context.pop()

    def _run(self, count: int, source: ChunkSource, chunk: int | None = None, check_finite: bool = False) -> OutputBatch:
        """The outputs of `count` images from `source`, added up on the host as each chunk's partials arrive."""
        chunk = chunk or self._chunk
        outputs = HostOutputs(self._partials_for(math.ceil(count / chunk)), self._chunk_done, count, chunk)
        self._schedule(count, source, chunk, outputs, check_finite)
        return OutputBatch(outputs.values[:count])

    def _schedule(self, count: int, source: ChunkSource, chunk: int, outputs: OutputSink, check_finite: bool) -> None:
        """Every chunk (of `chunk` images, at most the lanes' size) through a lane, a round of one chunk
        per lane at a time: first every lane's images are brought in, then each lane's kernels are
        queued and `outputs` takes its partials. `check_finite`: raise ArrayError if any image value
        was a NaN or an infinity (found by conv2d_relu as it loads them, or, for a rung whose kernels make
        no such check, by find_nonfinite before them)."""
        lanes = len(self._lanes)
        chunks = math.ceil(count / chunk)
        flag = np.zeros(1, np.int32)
        separate_check = check_finite and not self._launcher.checks_finite
        with device_errors("CUDA error while computing"):
            if check_finite:
                self._driver.memset_d32(self.setup.nonfinite, 0, 1)
            for first in range(0, chunks, lanes):
                round_ = range(first, min(first + lanes, chunks))
                for index in round_:
                    source.start(self._lanes[index % lanes], index)
                for index in round_:
                    lane = self._lanes[index % lanes]
                    images, address = min(chunk, count - index * chunk), source.images(lane, index)
                    if separate_check:
                        self._find_nonfinite(lane.stream, address, images, self.setup.nonfinite)
                    lane.run(self._launcher, address, images)
                    outputs.take(lane, index, images)
            outputs.finish(self._lanes)
            if check_finite:
                self._driver.memcpy_dtoh(flag, self.setup.nonfinite)
        if flag[0]:
            raise nonfinite_error("images")

    def _partials_for(self, chunks: int) -> np.ndarray:
        """Page-locked room for the partials of `chunks` chunks, and an event for each; grown as needed."""
        if self._host_partials is None or len(self._host_partials) < chunks:
            with device_errors("cannot allocate page-locked host memory"):
                if self._host_partials is not None:
                    self._memory.free(self._host_partials)
                    self._host_partials = None
                self._host_partials = self._memory.host((chunks, self._launcher.segments, self._chunk, OUT_LAYER_SIZE))
                no_timing = self._driver.event_flags.DISABLE_TIMING
                self._chunk_done += [self._driver.Event(no_timing) for _ in range(chunks - len(self._chunk_done))]
        return self._host_partials

    def time_kernels(self, rung: Launcher, images: DeviceImages, repeats: int) -> KernelTiming:
        """`rung`'s kernels over resident images as one chunk, timed with CUDA events: a warm-up run, then
        `repeats` timed runs; the outputs are the last run's partials added up on the host as _run adds them."""
        driver, count = self._driver, images.count
        with device_errors("CUDA error while timing kernels"):
            conv_out = self._memory.device(count * OUT_NEURON_DIM * 8) if rung.needs_conv_out else None
            partials = self._memory.device(rung.segments * count * OUT_LAYER_SIZE * 8)
            try:
                stream, start, end = driver.Stream(), driver.Event(), driver.Event()
                driver.memset_d8_async(partials, 0xFF, rung.segments * count * OUT_LAYER_SIZE * 8, stream)  # NaN: unwritten shows
                rung(stream, int(images.allocation), conv_out, partials, count, count)
                seconds = []
                for _ in range(repeats):
                    start.record(stream)
                    rung(stream, int(images.allocation), conv_out, partials, count, count)
                    end.record(stream)
                    end.synchronize()
                    seconds.append(end.time_since(start) / 1e3)
                host = np.empty((rung.segments, count, OUT_LAYER_SIZE))
                driver.memcpy_dtoh(host, partials)
            finally:
                for allocation in (conv_out, partials):
                    if allocation is not None:
                        self._memory.free(allocation)
        return KernelTiming(seconds, OutputBatch(np.sum(host, axis=0)))

    def copy_rates(self, host: np.ndarray, images: DeviceImages | None, repeats: int) -> CopyRates:
        """The copy bounds: `host` (page-locked) to the device, and `images` within it (device_to_device is
        0.0 without them)."""

        def copy(target: Any, stream: Any) -> None:
            self._driver.memcpy_htod_async(target, host, stream)

        h2d = host.nbytes / self._copy_seconds(host.nbytes, copy, repeats)
        return CopyRates(h2d, self.device_copy_rate(images, repeats) if images is not None else 0.0)

    def device_copy_rate(self, images: DeviceImages, repeats: int) -> float:
        """Bytes per second (read + written) of copying `images` within the device: the bound of the resident figures."""
        nbytes = images.count * IMAGE_BYTES

        def copy(target: Any, stream: Any) -> None:
            self._driver.memcpy_dtod_async(target, images.allocation, nbytes, stream)

        return 2 * nbytes / self._copy_seconds(nbytes, copy, repeats)

    def _copy_seconds(self, nbytes: int, copy: Callable[[Any, Any], None], repeats: int) -> float:
        """The median seconds of `copy(target, stream)` into a fresh device buffer of `nbytes`, timed with
        CUDA events after a warm-up."""
        driver = self._driver
        with device_errors("cannot time the copy bounds"):
            target = self._memory.device(nbytes)
            try:
                stream, start, end = driver.Stream(), driver.Event(), driver.Event()
                copy(target, stream)
                times = []
                for _ in range(repeats):
                    start.record(stream)
                    copy(target, stream)
                    end.record(stream)
                    end.synchronize()
                    times.append(end.time_since(start) / 1e3)
            finally:
                self._memory.free(target)
        return statistics.median(times)

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
                self._launcher = self.setup = self._sum_segments = self._find_nonfinite = self._module = self._csv_module = None
        finally:
            self._context.pop()
            self._context.detach()
            self._context = None

    def __enter__(self) -> CudaContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
