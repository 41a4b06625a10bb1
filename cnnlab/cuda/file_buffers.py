"""The device buffers a file's bytes are copied straight into, and the file copier that fills them: image buffers for a
regular .npy file, a CSV double buffer for a regular CSV file. One a CudaContext, made with it; the copier is made with
the first buffer it fills (or ahead, on a thread, while the kernels load), and its threads serve every buffer."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, suppress
from typing import TYPE_CHECKING, Any

from cnnlab.constants import IMAGE_BYTES, INPUT_DIM
from cnnlab.cuda.csv_double_buffer import DeviceCsvDoubleBuffer, rows_per_parse, text_buffer_bytes, wanted_text_bytes
from cnnlab.cuda.driver import context_lost, device_errors
from cnnlab.cuda.file_copier import DeviceImageBuffer, FileCopier
from cnnlab.tracing import Tracer

if TYPE_CHECKING:
    from cnnlab.cuda.driver import Driver
    from cnnlab.cuda.memory import Allocator

DEFAULT_BUFFER_IMAGES = 6144  # images an image buffer holds (two a run; docs/gpu.md, "Sizes")
FREE_MEMORY_SHARE = 1 / 8  # the most of the device's free memory one image buffer, or a CSV double buffer, takes

# `free()` run with the context current (on any thread), unless it is lost: the context's _unless_lost.
Releaser = Callable[[str, Callable[[], None]], None]


class FileBuffers:
    """Image buffers and CSV double buffers of one context, filled by its file copier; `batch` the images a buffer
    holds where the user asked for a batch (None: DEFAULT_BUFFER_IMAGES, TEXT_BUFFER_BYTES)."""

    def __init__(
        self, driver: Driver, memory: Allocator, current: Callable[[], AbstractContextManager[None]], release: Releaser,
        threads: int, batch: int | None, trace: Tracer,
    ) -> None:
        self._driver, self._memory, self._current, self._release = driver, memory, current, release
        self._threads, self._batch, self._trace = threads, batch, trace
        self._copier: FileCopier | None = None
        self._making: Future[FileCopier] | None = None

    def make_copier_ahead(self, file_bytes: int) -> None:
        """Start making the copier for a file of `file_bytes` (its page-locked staging buffers) on a thread, while the
        caller goes on."""
        making = ThreadPoolExecutor(1, thread_name_prefix="cnnlab-copier")
        self._making = making.submit(self._make_copier, file_bytes)
        making.shutdown(wait=False)

    def _make_copier(self, job_bytes: int) -> FileCopier:
        with self._current():
            return FileCopier(self._driver, self._memory, self._current, self._threads, job_bytes)

    def copier(self, job_bytes: int) -> FileCopier:
        """The file copier, made now for copies of up to `job_bytes` where it was not made ahead."""
        if self._copier is None:
            making, self._making = self._making, None
            self._copier = making.result() if making is not None else self._make_copier(job_bytes)
        return self._copier

    def image_buffer(self, count: int) -> DeviceImageBuffer:
        """Device memory for `count` images, at most the batch (DEFAULT_BUFFER_IMAGES) and FREE_MEMORY_SHARE of the
        device's free memory."""
        with device_errors("cannot make an image buffer on the device for a batch of the file's images"):
            free = self._driver.mem_get_info()[0]
            capacity = max(1, min(count, self._batch or DEFAULT_BUFFER_IMAGES, int(free * FREE_MEMORY_SHARE) // IMAGE_BYTES))
            copier = self.copier(capacity * IMAGE_BYTES)
            return DeviceImageBuffer(
                self._memory.device(capacity * IMAGE_BYTES), capacity, self._driver, copier, self._current, self._free_image_buffer
            )

    def csv_double_buffer(self, file_bytes: int, images: int, module: Any) -> DeviceCsvDoubleBuffer:
        """Text buffers for ranges of a regular CSV file of `file_bytes` holding `images`, parsed by `module`'s kernels:
        TEXT_BUFFER_BYTES (the batch asked for, where one was), no more than the file and than FREE_MEMORY_SHARE of the
        device's free memory allow; its image buffers sized for the file's mean row (rows_per_parse)."""
        row_bytes = file_bytes / max(1, images * INPUT_DIM)  # the count line and any blank lines included: longer, if anything
        wanted = wanted_text_bytes(file_bytes, images, self._batch)
        with device_errors("cannot make buffers on the device for the file's text"):
            copier = self.copier(wanted)
            free = self._driver.mem_get_info()[0]
            text_bytes = text_buffer_bytes(free, FREE_MEMORY_SHARE, wanted, copier.round_bytes, row_bytes)
            rows = rows_per_parse(text_bytes, row_bytes)
            return DeviceCsvDoubleBuffer(
                self._driver, self._memory, copier, module, text_bytes, rows, self._current, self._free_double_buffer, self._trace
            )

    def _free_image_buffer(self, buffer: DeviceImageBuffer) -> None:
        """Give an image buffer's memory back once its last fill's copies have arrived (a batch filled but never
        computed may still be arriving); its event goes too, while the context is current."""

        def free() -> None:
            buffer.ready.synchronize()
            self._memory.free(buffer.allocation)
            buffer.ready = None

        self._release("cannot free device memory", free)

    def _free_double_buffer(self, buffers: DeviceCsvDoubleBuffer) -> None:
        """Give a CSV double buffer back once what was queued on it is done."""

        def free() -> None:
            buffers.synchronize()
            buffers.close()

        self._release("cannot free device memory", free)

    def close(self) -> None:
        """Stop the copier's threads (one made ahead and never used too); its streams and events go with it, while the
        context is current, unless the context is lost (its memory goes with the context's)."""
        if self._making is not None:
            with suppress(Exception):
                self._copier = self._making.result()
            self._making = None
        if self._copier is not None:
            self._copier.close()
            if not context_lost(self._driver):
                self._copier = None
