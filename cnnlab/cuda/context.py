"""The CUDA backend (the lab's cuda.rs). Three small pieces, as tinygrad's runtime has them:

- `Allocator` (memory.py) owns device and page-locked host memory: what it gives out it can take
  back, and whatever is still out when the context closes it frees;
- `ChunkStreams` (chunk_streams.py) schedules: a call's chunks dealt round-robin to streams, each
  chunk's images in, the kernels of the chosen rung of the ladder (ladder.py; by default the design
  card's two), partials out, so the copy in of one chunk overlaps the kernels of another and the copy
  out of a third;
- `CudaContext` owns the driver context, the modules, the weights, the chunk streams and the
  allocator, and releases them in the reverse order of their making, the context last (`close()`).

As each chunk's partials arrive the host adds them up with numpy, while later chunks are still on
the device. forward(images, out=None) is the same schedule for the Python API: images from any host
array or from device memory (`__cuda_array_interface__`, read where they lie, as compute_resident
reads them), outputs to the host or, with `out`, added up on the device into the caller's array.

Threads: the driver context is current on a thread only while a call of CudaContext (or of a buffer it
made) runs there, and inside a `with CudaContext(...)` block on the thread that entered it: each call
pushes it and pops it (`_current()`), so no thread ends with it current, which PyCUDA punishes by
aborting the process. Its calls run one at a time (a lock), whatever thread makes them, while other
threads allocate, free, fill and parse its buffers (the run's reader, the file copier's threads). One
that is never closed is closed, with its context current so that nothing of it is released where
PyCUDA would warn, at the next call of any context once the collector finds it dropped, or as the
process ends (`_OPEN`). Several GPUs, and the Python API's kept contexts, give each context a thread
of its own (owner.BackendOwner).
"""

from __future__ import annotations

import atexit
import functools
import math
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from cnnlab import owner
from cnnlab.arrays import check_device_images, check_device_outputs, device_array, host_images
from cnnlab.backend import DeviceBatch, TextBatching
from cnnlab.constants import INPUT_DIM, OUT_LAYER_SIZE
from cnnlab.cuda import gpus
from cnnlab.cuda.builds import KERNEL_BUILD
from cnnlab.cuda.chunk_sources import CsvTextChunks, HostImages, ResidentImages
from cnnlab.cuda.chunk_streams import ChunkSource, ChunkStreams, DeviceOutputs
from cnnlab.cuda.csv_double_buffer import MIN_PARSE_ROWS, MIN_TEXT_BUFFER_BYTES, DeviceCsvDoubleBuffer, double_buffer_bytes
from cnnlab.cuda.device_setup import DeviceSetup
from cnnlab.cuda.driver import (
    DeviceAllocation,
    DriverContext,
    check_device_memory,
    check_free_memory,
    context_lost,
    device_errors,
    import_driver,
    refuse_a_forked_child,
    retain_context,
    synchronize_stream,
    visible_count,
)
from cnnlab.cuda.file_buffers import FileBuffers
from cnnlab.cuda.file_copier import DeviceImageBuffer
from cnnlab.cuda.kernels import FindNonFinite, SumSegments
from cnnlab.cuda.ladder import LaunchConfig, launcher
from cnnlab.cuda.launchers import Launcher
from cnnlab.cuda.memory import Allocator, HostCopier, is_page_locked
from cnnlab.cuda.nvcc import ensure_modules
from cnnlab.errors import ArrayError, UsageError
from cnnlab.network import Cnn, ImageBatch, OutputBatch, default_threads, require_finite
from cnnlab.tracing import NO_TRACE, Tracer

if TYPE_CHECKING:
    from cnnlab.backend import Batch

# Sizes, each measured against its neighbours: docs/gpu.md, "Sizes".
DEFAULT_BATCH_IMAGES = 2048  # images per compute() call from host buffers: the run's two page-locked ones stay at ~330 MB
DEFAULT_TEXT_BATCH_IMAGES = 256  # images per compute() call of CSV text from host windows, parsed on the device
TEXT_CHUNKS = 2  # chunks a text batch is dealt in, one a stream, so that one chunk's copy overlaps the other's parse
CLOSED = "this CudaContext is closed"  # what a call after close() raises (UsageError)
# The least device memory a run works in besides its context: the smallest CSV double buffer (a file's text parsed on
# the device), space for the chunk streams' partials and a chunk's activations, and the weights.
MIN_RUN_BYTES = double_buffer_bytes(MIN_TEXT_BUFFER_BYTES, MIN_PARSE_ROWS) + (4 << 20)


P = ParamSpec("P")
R = TypeVar("R")


def _in_context(method: Callable[Concatenate[CudaContext, P], R]) -> Callable[Concatenate[CudaContext, P], R]:
    """`method` run with the context current on the calling thread (pushed before it, popped after), one call of the
    context at a time; contexts dropped unclosed are closed first."""

    def run(self: CudaContext, /, *args: P.args, **kwargs: P.kwargs) -> R:
        _close_dropped()
        with self._calls, self._current():
            return method(self, *args, **kwargs)

    functools.update_wrapper(run, method)  # its name and docstring, for help()
    return run


@dataclass
class DeviceImages:
    """Images in device memory (the benchmark's resident figure); context.free(images) gives them back."""

    allocation: DeviceAllocation
    count: int


class CudaContext:
    """The GPU backend. Use as a context manager: leaving it frees everything, the context last."""

    name = "cuda"
    reads_in_place = False  # images cross to the device from page-locked buffers only

    def __init__(
        self, cnn: Cnn, batch_size: int | None = None, config: LaunchConfig | None = None, parse_csv: bool = True,
        threads: int | None = None, device: int = 0, trace: Tracer = NO_TRACE, copier_ahead: int | None = None,
    ) -> None:
        """Start the driver, load the kernels, put the weights on GPU `device` and make the chunk streams.

        `batch_size`: images per compute() call from the command line; `config`: how the work is dealt out;
        `parse_csv`: whether CSV text is parsed on the device (the command line's cuda mode); `threads`: the host
        threads that read the input and copy host arrays into page-locked memory (default: every core); `device`: which
        GPU, counted from 0 as nvidia-smi does; `trace`: what gets a span of each batch's work on each stream (--trace),
        or of each chunk's copies, kernels and reduction (--trace-chunks); `copier_ahead`: the bytes of a file the run
        copies straight into image or text buffers (the command line's), for which the file copier (its page-locked
        staging buffers, sized to the file) is made on a thread while the kernels load, rather than with the first
        buffer; None: none.
        """
        refuse_a_forked_child()
        self._calls = threading.RLock()  # one call at a time, close() too, whatever threads call
        self.config = config or LaunchConfig()
        self._trace = trace
        self._parse_csv = parse_csv  # CSV input parsed here on the device; False: by the host's reader
        self._batch_asked = batch_size  # None: each kind of input takes the batch that suits it
        self.batch_size = batch_size or DEFAULT_BATCH_IMAGES
        self.threads = threads or default_threads()
        self.driver = driver = import_driver()
        self.memory = Allocator(driver)
        modules = ensure_modules()
        self._context: DriverContext | None = None
        self._streams: ChunkStreams | None = None  # made last: None until then, and once closed
        self._file_buffers = FileBuffers(driver, self.memory, self._current, self._unless_lost, self.threads, batch_size, trace)
        # What close() releases, in the reverse order of these callbacks: the context, made first, goes last.
        self._resources = ExitStack()
        ordinal = gpus.ordinal(device, partial(visible_count, driver))
        self.device_index = device
        with device_errors("cannot start CUDA"):
            gpu = driver.Device(ordinal)
            # The primary context, as the CUDA runtime uses: other libraries in the process share it.
            self._context = context = retain_context(driver, gpu, device, MIN_RUN_BYTES)
        try:
            with device_errors("cannot start CUDA"):
                check_free_memory(driver, gpu, device, MIN_RUN_BYTES)
            self._on_close(self.memory.free_all)  # after everything below: what is still out
            self._resources.callback(self._file_buffers.close)
            self._copier = HostCopier(self.threads)  # host arrays into page-locked staging, on the host threads
            self._resources.callback(self._copier.close)
            if copier_ahead is not None:
                self._file_buffers.make_copier_ahead(copier_ahead)
            self.device = gpu.name()
            with device_errors(f"cannot load {modules.cnn}"):
                self._module = trace.per_chunk.launches(driver.module_from_file(str(modules.cnn)))
                self._csv_module = driver.module_from_file(str(modules.csv))  # one span a chunk ("parse text"), not five
                # Modules, kernels and the setup's streams go with their last reference, while the context is current.
                self._on_close(partial(self._forget, "_launcher", "setup", "_sum_segments", "_module", "_csv_module"))
                driver.memcpy_htod(self._module.get_global("filters")[0], cnn.filters)
                self._weights = self.memory.device(cnn.weights.nbytes)
                driver.memcpy_htod(self._weights, cnn.weights)
            with device_errors(f"cannot load kernel {self.config.kernel}"):
                self.setup = DeviceSetup(driver, gpu, self.memory, cnn, self._weights, trace)
                self.setup.add_module(KERNEL_BUILD, self._module)
                self._launcher: Launcher = launcher(self.config.kernel, self.setup, self.config)
                self._sum_segments = SumSegments(self._module, self.setup.sm_count, self._launcher.segments)
                find_nonfinite = FindNonFinite(self._module, self.setup.sm_count)
            chunk = self.config.chunk_images or math.ceil(self.batch_size / self.config.streams)
            self._streams = ChunkStreams(
                driver, self.memory, self._launcher, self.config.streams, chunk, self.config.stream_bytes_cap, self.setup.nonfinite,
                find_nonfinite, trace,
            )
            self._on_close(self._free_streams)
        except BaseException:
            self.close()
            raise
        context.pop()  # current from now on only while a call runs (or inside a `with` block)
        _OPEN.add(self)

    @property
    def csv_text(self) -> TextBatching | None:
        """How CSV text comes to the device: a batch dealt over the streams; None where the host's reader parses CSV."""
        if not self._parse_csv:
            return None
        batch = self._batch_asked or DEFAULT_TEXT_BATCH_IMAGES
        chunks = min(TEXT_CHUNKS, len(self._open_streams))
        return TextBatching(batch, min(self.chunk_images, math.ceil(batch / chunks)))

    @property
    def peak_device_bytes(self) -> int:
        """The most device memory this context's buffers held at once so far (its driver context's own aside)."""
        return self.memory.peak_device_bytes

    @property
    def chunk_images(self) -> int:
        """Images per chunk: the configured size, or less where device memory did not hold it."""
        return self._open_streams.chunk

    @property
    def _open_streams(self) -> ChunkStreams:
        if self._streams is None:
            raise UsageError(CLOSED)
        return self._streams

    @_in_context
    def allocate_images(self, count: int) -> np.ndarray:
        """A page-locked host buffer: chunks copy from it straight to the device, with no staging."""
        with device_errors("cannot allocate page-locked host memory"):
            return self.memory.host((count, INPUT_DIM, INPUT_DIM))

    def free_images(self, buffer: np.ndarray) -> None:
        self._free_page_locked(buffer)

    @_in_context
    def image_buffer(self, count: int) -> DeviceImageBuffer:
        """Device memory for up to `count` images of a regular .npy file, filled straight from it (FileBuffers)."""
        return self._file_buffers.image_buffer(count)

    @_in_context
    def csv_double_buffer(self, file_bytes: int, images: int) -> DeviceCsvDoubleBuffer | None:
        """A double buffer for a regular CSV file's text, copied straight to the device and parsed there (FileBuffers);
        None where the host parses CSV."""
        return self._file_buffers.csv_double_buffer(file_bytes, images, self._csv_module) if self._parse_csv else None

    @_in_context
    def load_cnn(self, cnn: Cnn) -> None:
        """Compute with `cnn` from now on: its filters and weights copied to the device (320 KB)."""
        with device_errors("cannot copy the CNN to the device"):
            self.setup.load_cnn(cnn)

    @_in_context
    def upload(self, batch: ImageBatch) -> DeviceImages:
        """Copy a batch to device memory once, for compute_resident(); free() gives the memory back."""
        with device_errors("cannot copy images to the device"):
            allocation = self.memory.device(batch.images.nbytes)
            self.driver.memcpy_htod(allocation, batch.images)
        return DeviceImages(allocation, len(batch))

    @_in_context
    def free(self, images: DeviceImages) -> None:
        self.memory.free(images.allocation)

    @_in_context
    def compute(self, batch: Batch, check_finite: bool = False) -> OutputBatch:
        """Outputs for a host batch of images, a batch of a file's images in one of this context's image buffers, or CSV
        text (csv_batch.CsvBatch) parsed here on the device (its values are finite: the parser refuses the rest).
        `check_finite`: an ArrayError where an image holds a NaN or an infinity."""
        if isinstance(batch, ImageBatch):
            source = HostImages(batch.images, self.chunk_images, is_page_locked(batch.images), self._copier)
            return self._open_streams.run(len(batch), source, check_finite=check_finite)
        if isinstance(batch, DeviceBatch):
            assert isinstance(batch.buffer, DeviceImageBuffer)  # this context's: filled from a file, or parsed from its text
            resident = ResidentImages(int(batch.buffer.allocation), self.chunk_images, batch.buffer.ready)
            return self._open_streams.run(len(batch), resident, check_finite=check_finite)
        text = self.csv_text
        assert text is not None  # CSV text comes only where csv_text said it may
        return self._open_streams.run(len(batch), CsvTextChunks(batch, text.chunk_images, self._csv_module), text.chunk_images)

    @_in_context
    def compute_resident(self, images: DeviceImages) -> OutputBatch:
        """Outputs for images already on the device: the kernels, the partials' copy and the reduction."""
        return self._open_streams.run(images.count, ResidentImages(int(images.allocation), self.chunk_images))

    @_in_context
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
            source: ChunkSource = ResidentImages(source_array.address, self.chunk_images)
        else:
            host, single = host_images(images)
            count = len(host)
            page_locked = host.dtype == np.float64 and host.flags.c_contiguous and is_page_locked(host)
            source = HostImages(host, self.chunk_images, page_locked, self._copier)
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
                    check_device_memory(self.driver, array, what, self.device_index)
                    if array.stream is not None:
                        synchronize_stream(array.stream)
        try:
            if target is None:
                values = self._open_streams.run(count, source, check_finite=True).values
                return values[0] if single else values
            chunk = self.chunk_images
            self._open_streams.schedule(count, source, chunk, DeviceOutputs(self._sum_segments, target.address, chunk), True)
            return out
        except ArrayError:
            if host is not None:  # the host copy says where: worth a pass over it only now that it failed
                require_finite("images", host)
            raise

    def allocate_text(self, nbytes: int) -> np.ndarray:
        """A page-locked byte buffer, for CSV text the device copies straight from.

        The reader's thread calls it too: the context is made current there for the allocation.
        """
        with self._current(), device_errors("cannot allocate page-locked host memory"):
            return self.memory.host(nbytes, np.uint8)

    def free_text(self, buffer: np.ndarray) -> None:
        self._free_page_locked(buffer)

    def _free_page_locked(self, buffer: np.ndarray) -> None:
        """Give a page-locked buffer back."""
        self._unless_lost("cannot free page-locked host memory", partial(self.memory.free, buffer))

    def _unless_lost(self, what: str, free: Callable[[], None]) -> None:
        """`free()` with the context current (on any thread), `what` the error's words; in a lost context nothing is
        freed (see close())."""
        with self._current(), device_errors(what):  # current: device_errors tells a lost context by it
            if not context_lost(self.driver):
                free()

    @contextmanager
    def _current(self) -> Iterator[None]:
        """The context made current on this thread for a while (pushed, then popped unless closed meanwhile)."""
        context = self._context
        if context is None:
            raise UsageError(CLOSED)
        context.push()
        try:
            yield
        finally:
            if self._context is context:
                context.pop()
            else:  # closed meanwhile: gone from this thread's stack where this thread closed it, dead on it elsewhere
                self._drop_dead_entry()

    def _drop_dead_entry(self) -> None:
        """Where another thread closed the context, this thread's stack still holds it, dead, which PyCUDA would abort
        the process for as the thread ends: asking what is current drops it."""
        self.driver.Context.get_current()

    def _on_close(self, release: Callable[[], None]) -> None:
        """Have close() call `release` (in the reverse order of these calls), unless the context is lost by then: in a
        lost context every free fails, so nothing is freed, and the process's end takes it all."""
        self._resources.callback(lambda: None if context_lost(self.driver) else release())

    def _forget(self, *names: str) -> None:
        for name in names:
            vars(self).pop(name, None)

    def _free_streams(self) -> None:
        if self._streams is not None:
            self._streams.free()
            self._streams = None

    def close(self) -> None:
        """Release what __init__ made, in the reverse order, with the context current on this thread: the chunk
        streams, the modules, the file copier and host copier, the memory still out, then the context itself, which
        leaves this thread's stack of current contexts (whatever thread closes). Waits for a call under way on another
        thread. A second close() does nothing."""
        with self._calls:
            context = self._context
            if context is None:
                return
            context.push()
            try:
                self._resources.close()
            finally:
                self._context = None
                _OPEN.discard(self)
                context.detach()  # current here: the primary context released, and popped from this thread's stack

    def __enter__(self) -> CudaContext:
        """The context made current on this thread until the block's end closes it (as before every call): for code
        that calls the driver itself, as the benchmarks do."""
        if self._context is None:
            raise UsageError(CLOSED)
        self._context.push()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
        self._drop_dead_entry()

    def __del__(self) -> None:
        """A context dropped without close() (a notebook's, rebound) is closed at the next call of any context, or as
        the process ends: the collector runs this on any thread, in the middle of any code and holding its locks,
        where a whole close() could wait for one of them forever."""
        if getattr(self, "_context", None) is not None:
            _DROPPED.put(self)  # SimpleQueue.put: safe in a finalizer


# The contexts made and not yet closed: those still open as the process ends are closed then, the Python API's kept
# ones first, on their own threads (owner.release_backends), then any a caller never closed.
_OPEN: weakref.WeakSet[CudaContext] = weakref.WeakSet()
_DROPPED: queue.SimpleQueue[CudaContext] = queue.SimpleQueue()  # collected unclosed, to be closed (__del__)


def _take_dropped() -> list[CudaContext]:
    """The contexts the collector found unclosed, taken from the queue without waiting (another thread may be taking
    them too)."""
    taken = []
    while True:
        try:
            taken.append(_DROPPED.get_nowait())
        except queue.Empty:
            return taken


def _close_dropped() -> None:
    """Close the contexts the collector found unclosed, on this thread."""
    for dropped in _take_dropped():
        with suppress(Exception):  # as a file object's finalizer: nothing to tell, nobody to tell it to
            dropped.close()


def _disown_contexts() -> list[CudaContext]:
    """The contexts a forked child's parent had open or dropped, taken from the child's own: the driver refuses the
    child their use and their closing."""
    contexts = list(_OPEN)
    _OPEN.clear()
    return contexts + _take_dropped()


_LEFT_TO_THE_PARENT = owner.held_in_a_forked_child(_disown_contexts)


@atexit.register
def _close_open_contexts() -> None:
    owner.release_backends()
    _close_dropped()
    for context in list(_OPEN):
        with suppress(Exception):
            context.close()
