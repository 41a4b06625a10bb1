"""The CUDA backend (the lab's cuda.rs). Three small pieces, as tinygrad's runtime has them:

- `Allocator` (memory.py) owns device and page-locked host memory: what it gives out it can take
  back, and whatever is still out when the context closes it frees;
- `Lanes` (lanes.py) schedules: a call's chunks dealt round-robin to streams, each chunk's images
  in, the kernels of the chosen rung of the ladder (ladder.py; by default the design card's two),
  partials out, so the copy in of one chunk overlaps the kernels of another and the copy out of a
  third;
- `CudaContext` owns the driver context, the modules, the weights, the lanes and the allocator,
  and frees them in order, the context last.

As each chunk's partials arrive the host adds them up with numpy, while later chunks are still on
the device. forward(images, out=None) is the same schedule for the Python API: images from any host
array or from device memory (`__cuda_array_interface__`, read where they lie, as compute_resident
reads them), outputs to the host or, with `out`, added up on the device into the caller's array.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from cnnlab.arrays import DeviceArray, check_device_images, check_device_outputs, device_array, host_images
from cnnlab.backend import DeviceBatch, TextBatching
from cnnlab.constants import IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE
from cnnlab.cuda import gpus
from cnnlab.cuda.builds import KERNEL_BUILD
from cnnlab.cuda.csv_rooms import TEXT_ROOM_BYTES, CsvRooms, text_room_bytes
from cnnlab.cuda.device_setup import DeviceSetup
from cnnlab.cuda.driver import (
    DeviceAllocation,
    DriverContext,
    context_lost,
    device_errors,
    import_driver,
    pointer_device,
    synchronize_stream,
    visible_count,
)
from cnnlab.cuda.file_copier import FileCopier, FileRoom, Room
from cnnlab.cuda.kernels import FindNonFinite, SumSegments
from cnnlab.cuda.ladder import LaunchConfig, launcher
from cnnlab.cuda.lanes import ChunkSource, CsvText, DeviceOutputs, HostImages, Lanes, ResidentImages
from cnnlab.cuda.launchers import Launcher
from cnnlab.cuda.memory import Allocator, HostCopier, is_page_locked
from cnnlab.cuda.nvcc import ensure_modules
from cnnlab.errors import ArrayError, UsageError
from cnnlab.network import NO_TRACE, Cnn, ImageBatch, OutputBatch, Tracer, default_threads, require_finite

if TYPE_CHECKING:
    from cnnlab.backend import Batch

# Images per compute() call from the command line: the run's two page-locked buffers stay at ~330 MB.
DEFAULT_BATCH_IMAGES = 2048
# Images a device room holds (a batch of a regular .npy file, copied straight to the device), two rooms a run: at a
# room's end the copier's threads wait for the slowest one's last task, so a room is many of their tasks. On the H200
# machine (200,000 images, three turns, when the threads also waited for their copies to land) the loop ran 31.4-31.9
# GB/s with rooms of 2,048 images, 41.8-42.8 with 8,192 and 42.9-45.7 with 16,384 (1.3 GB of device memory a room; a
# room takes at most ROOM_SHARE of the free device memory).
DEFAULT_ROOM_IMAGES = 16384
ROOM_SHARE = 1 / 8
# Images per compute() call when CSV text is parsed on the device: ~50 MB of text a batch, read into one of
# two page-locked windows (made before the run, ~60 MB each) while the other's batch is on the device. On the
# H100 machine (10,000 images, tools/profile_cuda_csv.py): 256 a batch loop 0.16-0.19 s, 512 0.27-0.31 s,
# where making the larger windows page-locked cost more than the fewer hand-offs saved.
DEFAULT_TEXT_BATCH_IMAGES = 256
# Chunks a text batch is dealt in, one a lane, so that one chunk's copy overlaps the other's parse: each chunk
# is a hand-off the main thread queues and waits for, while the GPU idles most of the loop (docs/trace.md). A
# chunk is at most the lanes' (with --batch N, a third of N: three chunks then).
# On the H100 machine (30,000 images, 8 rounds in turns) 2 ran the loop at 0.957 (0.889..1.154) of 3, 1 at 1.021.
TEXT_CHUNKS = 2
CLOSED = "this CudaContext is closed"  # what a call after close() raises (UsageError)


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
        threads: int | None = None, device: int = 0, trace: Tracer = NO_TRACE, copier_ahead: bool = False,
    ) -> None:
        """Start the driver, load the kernels, put the weights on GPU `device` and make the lanes.

        `batch_size`: images per compute() call from the command line; `config`: how the work is spread;
        `parse_csv`: whether CSV text is parsed on the device (the command line's cuda mode); `threads`: the host
        threads that read the input and copy host arrays into page-locked memory (default: every core); `device`: which
        GPU, counted from 0 as nvidia-smi does; `trace`: what gets a span of each batch's work on each stream (--trace),
        or of each chunk's copies, kernels and reduction (--trace-chunks); `copier_ahead`: make the file copier (its
        page-locked bounce buffers, ~50 ms) on a thread while the kernels load, for a run that reads a file into device
        rooms (the command line's), rather than with the first room.
        """
        self.config = config or LaunchConfig()
        self._trace = trace
        self._parse_csv = parse_csv  # CSV input parsed here on the device; False: by the host's reader
        self.batch_size = batch_size or DEFAULT_BATCH_IMAGES
        self.threads = threads or default_threads()
        self._copier = HostCopier(self.threads)  # host arrays into page-locked staging, on the host threads
        self._file_copier: FileCopier | None = None  # a file's bytes into device rooms, made with the first room
        self._copier_making: Future[FileCopier] | None = None  # or made ahead, on a thread (copier_ahead)
        self._text_batch = batch_size or DEFAULT_TEXT_BATCH_IMAGES
        self._room_images = batch_size or DEFAULT_ROOM_IMAGES
        self._batch_asked = batch_size  # None: each kind of input takes the batch that suits it
        self.driver = driver = import_driver()
        self.memory = Allocator(driver)
        modules = ensure_modules()
        self._context: DriverContext | None = None
        self._lanes: Lanes | None = None  # made last: None until then, and once closed
        ordinal = gpus.ordinal(device, partial(visible_count, driver))
        self.device_index = device
        with device_errors("cannot start CUDA"):
            gpu = driver.Device(ordinal)
            # The primary context, as the CUDA runtime uses: other libraries in the process share it.
            self._context = gpu.retain_primary_context()
            self._context.push()
        try:
            if copier_ahead:
                making = ThreadPoolExecutor(1, thread_name_prefix="cnnlab-copier")
                self._copier_making = making.submit(self._make_copier)
                making.shutdown(wait=False)
            self.device = gpu.name()
            with device_errors(f"cannot load {modules.cnn}"):
                self._module = trace.per_chunk.launches(driver.module_from_file(str(modules.cnn)))
                self._csv_module = driver.module_from_file(str(modules.csv))  # one span a chunk ("parse text"), not five
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
            self._lanes = Lanes(
                driver, self.memory, self._launcher, self.config.streams, chunk, self.config.lane_bytes_cap, self.setup.nonfinite,
                find_nonfinite, trace,
            )
        except BaseException:
            self.close()
            raise

    @property
    def csv_text(self) -> TextBatching | None:
        """How CSV text comes to the device: a batch dealt over the lanes; None where the host's reader parses CSV."""
        if not self._parse_csv:
            return None
        chunks = min(TEXT_CHUNKS, len(self._open_lanes))
        return TextBatching(self._text_batch, min(self.chunk_images, math.ceil(self._text_batch / chunks)))

    @property
    def chunk_images(self) -> int:
        """Images per chunk: the configured size, or less where device memory did not hold it."""
        return self._open_lanes.chunk

    @property
    def _open_lanes(self) -> Lanes:
        if self._lanes is None:
            raise UsageError(CLOSED)
        return self._lanes

    def allocate_images(self, count: int) -> np.ndarray:
        """A page-locked host buffer: chunks copy from it straight to the device, with no staging."""
        with device_errors("cannot allocate page-locked host memory"):
            return self.memory.host((count, INPUT_DIM, INPUT_DIM))

    def free_images(self, buffer: np.ndarray) -> None:
        self._free_page_locked(buffer)

    def device_room(self, count: int) -> FileRoom:
        """Device memory for `count` images, at most a room's (DEFAULT_ROOM_IMAGES, or the batch asked for, and no more
        than ROOM_SHARE of the device's free memory), filled straight from a file by the context's copier (made with the
        first room: its threads and bounce buffers serve every room)."""
        with device_errors("cannot make room on the device for a batch of the file's images"):
            free = self.driver.mem_get_info()[0]
            capacity = max(1, min(count, self._room_images, int(free * ROOM_SHARE) // IMAGE_BYTES))
            copier = self._copier_for_rooms()
            return FileRoom(copier, self.memory.device(capacity * IMAGE_BYTES), capacity, self.driver, self._free_room)

    def text_rooms(self, image_bytes: float) -> CsvRooms | None:
        """Device rooms for a regular CSV file's text, copied straight in by the context's copier and parsed there, for a
        file of `image_bytes` of text an image: a fill is TEXT_ROOM_BYTES (the batch asked for, where one was), no more
        than the rooms' ROOM_SHARE of the device's free memory allows; None where the host parses CSV (--host-parse)."""
        if not self._parse_csv:
            return None
        wanted = TEXT_ROOM_BYTES if self._batch_asked is None else int(self._batch_asked * image_bytes * 1.05)
        with device_errors("cannot make room on the device for the file's text"):
            copier = self._copier_for_rooms()
            text_bytes = text_room_bytes(self.driver.mem_get_info()[0], ROOM_SHARE, wanted, copier.round_bytes)
            return CsvRooms(
                self.driver, self.memory, copier, self._csv_module, text_bytes, self._current, self._free_text_rooms, self._trace
            )

    def _free_text_rooms(self, rooms: CsvRooms) -> None:
        """Give text rooms back once what was queued on them is done."""

        def free() -> None:
            rooms.synchronize()
            rooms.close()

        self._unless_lost("cannot free device memory", free)

    def _copier_for_rooms(self) -> FileCopier:
        """The copier that fills device rooms from files, made with the first room: its threads and bounce buffers serve
        every room."""
        if self._file_copier is None:
            making, self._copier_making = self._copier_making, None
            self._file_copier = making.result() if making is not None else self._make_copier()
        return self._file_copier

    def _make_copier(self) -> FileCopier:
        with self._current():
            return FileCopier(self.driver, self.memory, self._current, self.threads)

    def _free_room(self, room: FileRoom) -> None:
        """Give a room's memory back once its last fill's copies have arrived (a batch filled but never computed may
        still be arriving); its event goes too, while the context is current."""

        def free() -> None:
            room.ready.synchronize()
            self.memory.free(room.allocation)
            room.ready = None

        self._unless_lost("cannot free device memory", free)

    def upload(self, batch: ImageBatch) -> DeviceImages:
        """Copy a batch to device memory once, for compute_resident(); free() gives the memory back."""
        with device_errors("cannot copy images to the device"):
            allocation = self.memory.device(batch.images.nbytes)
            self.driver.memcpy_htod(allocation, batch.images)
        return DeviceImages(allocation, len(batch))

    def free(self, images: DeviceImages) -> None:
        self.memory.free(images.allocation)

    def compute(self, batch: Batch, check_finite: bool = False) -> OutputBatch:
        """Outputs for a host batch of images, a batch of a file's images in one of this context's device rooms, or CSV
        text (csv_batch.CsvBatch) parsed here on the device (its values are finite: the parser refuses the rest).
        `check_finite`: an ArrayError where an image holds a NaN or an infinity."""
        if isinstance(batch, ImageBatch):
            source = HostImages(batch.images, self.chunk_images, is_page_locked(batch.images), self._copier)
            return self._open_lanes.run(len(batch), source, check_finite=check_finite)
        if isinstance(batch, DeviceBatch):
            assert isinstance(batch.room, Room)  # a room of this context's: filled from a file, or parsed from its text
            resident = ResidentImages(int(batch.room.allocation), self.chunk_images, batch.room.ready)
            return self._open_lanes.run(len(batch), resident, check_finite=check_finite)
        text = self.csv_text
        assert text is not None  # CSV text comes only where csv_text said it may
        return self._open_lanes.run(len(batch), CsvText(batch, text.chunk_images, self._csv_module), text.chunk_images)

    def compute_resident(self, images: DeviceImages) -> OutputBatch:
        """Outputs for images already on the device: the kernels, the partials' copy and the reduction."""
        return self._open_lanes.run(images.count, ResidentImages(int(images.allocation), self.chunk_images))

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
                    self._check_device_memory(array, what)
                    if array.stream is not None:
                        synchronize_stream(array.stream)
        try:
            if target is None:
                values = self._open_lanes.run(count, source, check_finite=True).values
                return values[0] if single else values
            chunk = self.chunk_images
            self._open_lanes.schedule(count, source, chunk, DeviceOutputs(self._sum_segments, target.address, chunk), True)
            return out
        except ArrayError:
            if host is not None:  # the host copy says where: worth a pass over it only now that it failed
                require_finite("images", host)
            raise

    def _check_device_memory(self, array: DeviceArray, what: str) -> None:
        """An ArrayError unless `array` lies wholly in one allocation of this GPU's memory: a kernel that read elsewhere
        would fault and lose the context."""
        holder = pointer_device(array.address)
        if holder is not None:
            holder = gpus.number(holder)
        if holder is not None and holder != self.device_index:
            raise ArrayError(
                f"{what} lie on GPU {holder}, and this context computes on GPU {self.device_index}: use device='cuda:{holder}' "
                f"(CudaContext(cnn, device={holder})), or copy them to GPU {self.device_index}"
            )
        try:
            base, size = self.driver.mem_get_address_range(array.address)
        except self.driver.Error:
            raise ArrayError(
                f"{what} at {array.address:#x} is not device memory of GPU {self.device_index}'s primary context, which cnnlab uses"
            ) from None
        if array.address + array.nbytes > int(base) + size:
            raise ArrayError(f"{what} ({array.nbytes} bytes at {array.address:#x}) run past the end of their allocation")

    def allocate_text(self, nbytes: int) -> np.ndarray:
        """A page-locked byte buffer, for CSV text the device copies straight from.

        The reader's thread calls it too: the context is made current there for the allocation.
        """
        with device_errors("cannot allocate page-locked host memory"), self._current():
            return self.memory.host(nbytes, np.uint8)

    def free_text(self, buffer: np.ndarray) -> None:
        self._free_page_locked(buffer)

    def _free_page_locked(self, buffer: np.ndarray) -> None:
        """Give a page-locked buffer back."""
        self._unless_lost("cannot free page-locked host memory", partial(self.memory.free, buffer))

    def _unless_lost(self, what: str, free: Callable[[], None]) -> None:
        """`free()` with the context current (on any thread), `what` the error's words; in a lost context nothing is
        freed (see close())."""
        with device_errors(what), self._current():
            if not context_lost(self.driver):
                free()

    @contextmanager
    def _current(self) -> Iterator[None]:
        """The context made current in this thread for a while (the reader's thread has none of its own)."""
        context = self._context
        if context is None:
            raise UsageError(CLOSED)
        context.push()
        try:
            yield
        finally:
            context.pop()

    def close(self) -> None:
        """Free device memory, then page-locked memory, the module and streams, and the context last.

        In a lost context every free fails, so nothing is freed: the process's end takes it all.
        """
        self._copier.close()
        if self._copier_making is not None:  # made ahead and never used: it goes as if used
            with suppress(Exception):
                self._file_copier = self._copier_making.result()
            self._copier_making = None
        if self._file_copier is not None:
            self._file_copier.close()
        if self._context is None:
            return
        try:
            if not context_lost(self.driver):
                if self._lanes is not None:
                    self._lanes.free()
                self.memory.free_all()
                self._lanes = None
                self._file_copier = None  # its streams and events go now, while the context is current
                # What holds modules, kernels and streams: each goes with its last reference, which must be now, while the
                # context is current (and only where __init__ got as far as making it).
                for name in ("_launcher", "setup", "_sum_segments", "_module", "_csv_module"):
                    vars(self).pop(name, None)
        finally:
            self._context.pop()
            self._context.detach()
            self._context = None

    def __enter__(self) -> CudaContext:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
