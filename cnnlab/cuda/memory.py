"""Device and page-locked host memory for a CUDA context: the allocator, which can take back what it gives out and
frees whatever is still out when the context closes, and the copier that fills page-locked buffers from a caller's.

Page-locked buffers are the process's own pages registered with the driver (cuMemHostRegister), not the driver's own
allocations, which took longer to make (docs/gpu.md, "Sizes").
"""

from __future__ import annotations

import ctypes
import math
import mmap
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import numpy as np

from cnnlab.cuda.driver import checked
from cnnlab.errors import byte_size
from cnnlab.network import own_pages

if TYPE_CHECKING:
    from cnnlab.cuda.driver import DeviceAllocation, Driver

# Page-locked buffers are registered portable: every context of the process (a GPU each, with several GPUs) copies
# from them directly. Which ranges are page-locked is the process's to know, not one allocator's.
HOST_REGISTER_PORTABLE = 0x01  # CU_MEMHOSTREGISTER_PORTABLE
_PAGE_LOCKED: list[tuple[int, int]] = []  # (start, end) of every page-locked buffer out
_PAGE_LOCKED_LOCK = threading.Lock()


def is_page_locked(array: np.ndarray) -> bool:
    """Whether `array` starts in a page-locked buffer some Allocator of this process made."""
    start = array.ctypes.data
    with _PAGE_LOCKED_LOCK:
        return any(low <= start < high for low, high in _PAGE_LOCKED)


class Allocator:
    """Device and page-locked host memory: alloc, free, and free_all for whatever is still out.

    The reader's thread allocates page-locked text windows while the main thread frees: a lock keeps the lists whole.
    """

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self._device: dict[int, tuple[DeviceAllocation, int]] = {}  # by address: the allocation and its bytes
        self._host: list[np.ndarray] = []
        self.device_bytes = self.peak_device_bytes = 0  # device memory out, and the most that was out at once

    def device(self, nbytes: int) -> DeviceAllocation:
        try:
            allocation = self._driver.mem_alloc(nbytes)
        except self._driver.Error as error:  # the driver's words, how much was asked, and how much the GPU has free
            asked = f"device memory of {byte_size(nbytes)}"
            if "out of memory" in str(error):
                with suppress(self._driver.Error):
                    asked += f", with {byte_size(self._driver.mem_get_info()[0])} of the GPU's free"
            raise type(error)(f"{error} ({asked})") from None
        with self._lock:
            self._device[int(allocation)] = allocation, nbytes
            self.device_bytes += nbytes
            self.peak_device_bytes = max(self.peak_device_bytes, self.device_bytes)
        return allocation

    def host(self, shape: tuple[int, ...] | int, dtype: Any = np.float64, fault_first: bool = False) -> np.ndarray:
        """Page-locked host memory: pages of its own (an anonymous mapping, so that no other object shares a page
        with it), huge where the kernel gives them, registered with the driver (cuMemHostRegister), faster to make
        than the driver's own (cuMemHostAlloc, PyCUDA's pagelocked_empty): a run's text windows are made while it
        reads. PyCUDA's register_host_memory refuses numpy 2's arrays, hence the driver's call through ctypes.
        `fault_first`: the calling thread faults the pages in before they are registered (numpy writes a byte a page,
        without the GIL from 500 pages), so that threads making buffers at once fault theirs at once, where the driver's
        registration faults them more slowly (docs/gpu.md, "MAX_THREADS")."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape if isinstance(shape, tuple) else (shape,)) * dtype.itemsize
        pages = own_pages(nbytes, "a page-locked buffer")
        if fault_first:
            pages[:: mmap.PAGESIZE] = 0
        buffer = pages.view(dtype).reshape(shape)
        if nbytes:
            address = buffer.ctypes.data
            try:
                self._call("cuMemHostRegister_v2", ctypes.c_void_p(address), ctypes.c_size_t(nbytes), ctypes.c_uint(HOST_REGISTER_PORTABLE))
            except self._driver.Error as error:
                raise type(error)(f"{error} (a page-locked buffer of {byte_size(nbytes)})") from None
            with _PAGE_LOCKED_LOCK:
                _PAGE_LOCKED.append((address, address + nbytes))
        with self._lock:
            self._host.append(buffer)
        return buffer

    def free(self, allocation: DeviceAllocation | np.ndarray) -> None:
        """Give back a device allocation or a page-locked buffer made here."""
        with self._lock:
            if isinstance(allocation, np.ndarray):
                self._host = [buffer for buffer in self._host if buffer is not allocation]
            elif (held := self._device.get(int(allocation))) is not None and held[0] is allocation:
                del self._device[int(allocation)]
                self.device_bytes -= held[1]
        if not isinstance(allocation, np.ndarray):
            allocation.free()
        elif allocation.nbytes:  # the pages are unmapped once the last array on them is gone
            address = allocation.ctypes.data
            with _PAGE_LOCKED_LOCK:
                _PAGE_LOCKED.remove((address, address + allocation.nbytes))
            self._call("cuMemHostUnregister", ctypes.c_void_p(address))

    def _call(self, name: str, *args: Any) -> None:
        """A driver call through ctypes (the GIL released), its error raised as PyCUDA raises the driver's errors."""
        checked(getattr(ctypes.CDLL("libcuda.so.1"), name)(*args), name, self._driver.Error)

    def free_all(self) -> None:
        with self._lock:
            allocations: list[DeviceAllocation | np.ndarray] = [held for held, _ in self._device.values()] + self._host
        for allocation in allocations:
            self.free(allocation)


# A task: the bytes a copy thread takes at a time, here and in the file copier. Here, 4 MiB tasks spread a chunk of
# ~55 MB (2,048 images over three chunk streams) over a dozen threads, each long enough that handing it to a thread
# costs under 1% of copying it; for the file copier, docs/gpu.md, "Sizes".
TASK_BYTES = 4 << 20


class HostCopier:
    """Copies a caller's images (pageable memory, any real dtype and layout) into page-locked memory, a task a thread.

    One thread's copy runs at a fraction of what the host-to-device link takes (docs/gpu.md, "Sizes"); numpy releases
    the GIL while it copies, so the tasks run at once.
    """

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="cnnlab-copy") if threads > 1 else None

    def copy(self, target: np.ndarray, source: np.ndarray) -> None:
        """target[...] = source, converted to target's dtype as np.copyto converts, split along the leading axis."""
        rows = max(1, TASK_BYTES // max(1, target[:1].nbytes))
        if self._pool is None or len(target) <= rows:
            np.copyto(target, source)
            return
        parts = [slice(start, start + rows) for start in range(0, len(target), rows)]
        copies = [self._pool.submit(np.copyto, target[part], source[part]) for part in parts]
        try:
            for done in copies:
                done.result()
        finally:  # a failure (or a signal) returns only once no part can still write into target, which is reused
            for done in copies:
                done.cancel()
            wait(copies)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
