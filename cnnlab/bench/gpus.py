"""What the host can feed its GPUs at once: host-to-device copies from page-locked memory with 1..N GPUs copying at the
same time, a thread and a context each (`cnnlab bench`'s gpus rows; tools/h2d_bound.py adds a registered file).

The bound of `--devices` with N GPUs is the host's, not N times one GPU's: the copies share the host's memory and its
links. The driver is called through ctypes (each call releases the GIL), so the threads copy at once.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable

from cnnlab.errors import DeviceError

MB = 1 << 20
AGGREGATE_BYTES = 256 * MB  # a copy, per GPU: long enough that a copy's start costs under 1% of it
HOST_ALLOC_PORTABLE = 0x01
_RANDOM = os.urandom(MB)  # what every page-locked buffer holds, over and over: random bytes, never zeros


def check_call(result: int, what: str) -> None:
    """A driver call's result, where it failed, as a DeviceError naming the call."""
    if result != 0:
        raise DeviceError(f"{what} failed: CUDA error {result}")


class Gpu:
    """One GPU's primary context, a page-locked buffer and a device buffer of `nbytes` each; free() gives them back."""

    def __init__(self, cuda: ctypes.CDLL, ordinal: int, nbytes: int) -> None:
        self.cuda, self.nbytes = cuda, nbytes
        device, self.context = ctypes.c_int(), ctypes.c_void_p()
        check_call(cuda.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        check_call(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), device), "cuDevicePrimaryCtxRetain")
        self.ordinal = device
        self.current()
        self.host, self.device = ctypes.c_void_p(), ctypes.c_uint64()
        check_call(cuda.cuMemHostAlloc(ctypes.byref(self.host), ctypes.c_size_t(nbytes), HOST_ALLOC_PORTABLE), "cuMemHostAlloc")
        for at in range(0, nbytes, len(_RANDOM)):
            ctypes.memmove((self.host.value or 0) + at, _RANDOM, min(len(_RANDOM), nbytes - at))
        check_call(cuda.cuMemAlloc_v2(ctypes.byref(self.device), ctypes.c_size_t(nbytes)), "cuMemAlloc")

    def current(self) -> None:
        check_call(self.cuda.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def copy_from(self, address: int) -> None:
        """A synchronous copy of `nbytes` from host memory at `address` (page-locked or registered) to the device."""
        check_call(self.cuda.cuMemcpyHtoD_v2(self.device, ctypes.c_void_p(address), ctypes.c_size_t(self.nbytes)), "cuMemcpyHtoD")

    def free(self) -> None:
        self.current()
        self.cuda.cuMemFree_v2(self.device)
        self.cuda.cuMemFreeHost(self.host)
        self.cuda.cuDevicePrimaryCtxRelease_v2(self.ordinal)


def at_once(gpus: list[Gpu], work: Callable[[int, Gpu], list[float]]) -> tuple[float, list[list[float]]]:
    """`work(index, gpu)` on every GPU at once, a thread each: the wall seconds, and what each returned (the first
    failure raised once every thread has ended)."""
    results: list[list[float]] = [[] for _ in gpus]
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            gpus[index].current()
            results[index] = work(index, gpus[index])
        except BaseException as error:  # raised on the caller's thread
            failures.append(error)

    threads = [threading.Thread(target=run, args=(index,), name=f"cnnlab-bench-gpu-{index}") for index in range(len(gpus))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return time.perf_counter() - start, results


def visible_gpus(cuda: ctypes.CDLL) -> int:
    check_call(cuda.cuInit(0), "cuInit")
    count = ctypes.c_int()
    check_call(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    return count.value


def aggregate_bound(nbytes: int, copies: int) -> list[float]:
    """GB/s in total of host-to-device copies from page-locked memory with 1, 2, ... N of the visible GPUs copying at
    once, `copies` copies of `nbytes` each (after one unseen), a thread each."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise DeviceError(f"no CUDA driver: {error}") from None
    gpus: list[Gpu] = []
    try:
        for ordinal in range(visible_gpus(cuda)):
            gpus.append(Gpu(cuda, ordinal, nbytes))

        def from_page_locked(times: int) -> Callable[[int, Gpu], list[float]]:
            def work(index: int, gpu: Gpu) -> list[float]:
                for _ in range(times):
                    gpu.copy_from(gpu.host.value or 0)
                return []

            return work

        totals = []
        for count in range(1, len(gpus) + 1):
            at_once(gpus[:count], from_page_locked(1))  # unseen: each link warmed
            wall, _ = at_once(gpus[:count], from_page_locked(copies))
            totals.append(count * copies * nbytes / wall / 1e9)
        return totals
    finally:
        for gpu in gpus:
            gpu.free()
