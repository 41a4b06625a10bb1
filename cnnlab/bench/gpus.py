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
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial

from cnnlab.cuda.driver import checked
from cnnlab.errors import DeviceError

MIB = 1 << 20
COPY_BYTES = 256 * MIB  # a copy, per GPU: long enough that a copy's start costs under 1% of it
HOST_ALLOC_PORTABLE = 0x01


def driver() -> ctypes.CDLL:
    """The driver's library, started: a DeviceError where there is none."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise DeviceError(f"no CUDA driver: {error}") from None
    checked(cuda.cuInit(0), "cuInit")
    return cuda


def visible_gpus(cuda: ctypes.CDLL) -> int:
    """How many GPUs the driver sees (CUDA_VISIBLE_DEVICES's, where it is set)."""
    count = ctypes.c_int()
    checked(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    return count.value


class Gpu:
    """One GPU's primary context, with a page-locked buffer and a device buffer of `nbytes` each, filled with random
    bytes (never zeros). Made by `open_gpus`, which gives everything back, on every path out."""

    def __init__(self, cuda: ctypes.CDLL, ordinal: int, nbytes: int, owned: ExitStack) -> None:
        """Everything made here is handed to `owned` as it is made: a failure part way leaves nothing behind."""
        self.cuda, self.nbytes = cuda, nbytes
        handle, self.context = ctypes.c_int(), ctypes.c_void_p()
        checked(cuda.cuDeviceGet(ctypes.byref(handle), ordinal), "cuDeviceGet")
        name = ctypes.create_string_buffer(256)
        checked(cuda.cuDeviceGetName(name, len(name), handle), "cuDeviceGetName")
        self.name = name.value.decode(errors="replace")
        checked(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), handle), "cuDevicePrimaryCtxRetain")
        owned.callback(cuda.cuDevicePrimaryCtxRelease_v2, handle)
        self.current()
        self.host_buffer, self.device_buffer = ctypes.c_void_p(), ctypes.c_uint64()
        flags = HOST_ALLOC_PORTABLE
        checked(cuda.cuMemHostAlloc(ctypes.byref(self.host_buffer), ctypes.c_size_t(nbytes), flags), "cuMemHostAlloc")
        owned.callback(self._in_context, cuda.cuMemFreeHost, self.host_buffer)
        random = os.urandom(min(nbytes, MIB))
        for at in range(0, nbytes, len(random)):
            ctypes.memmove((self.host_buffer.value or 0) + at, random, min(len(random), nbytes - at))
        checked(cuda.cuMemAlloc_v2(ctypes.byref(self.device_buffer), ctypes.c_size_t(nbytes)), "cuMemAlloc")
        owned.callback(self._in_context, cuda.cuMemFree_v2, self.device_buffer)

    def current(self) -> None:
        """Make this GPU's context current on the calling thread (each thread that copies to it)."""
        checked(self.cuda.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def _in_context(self, free: Callable[[object], int], what: object) -> None:
        """Give one thing back with this GPU's context current, whatever else failed (its result ignored: best effort)."""
        self.cuda.cuCtxSetCurrent(self.context)
        free(what)
        self.cuda.cuCtxSetCurrent(None)

    def copy_from(self, address: int) -> None:
        """A synchronous copy of `nbytes` from host memory at `address` (page-locked or registered) to the device."""
        checked(
            self.cuda.cuMemcpyHtoD_v2(self.device_buffer, ctypes.c_void_p(address), ctypes.c_size_t(self.nbytes)), "cuMemcpyHtoD"
        )


@contextmanager
def open_gpus(nbytes: int) -> Iterator[tuple[ctypes.CDLL, list[Gpu]]]:
    """Every visible GPU with buffers of `nbytes`, given back when the block is left."""
    cuda = driver()
    with ExitStack() as owned:
        yield cuda, [Gpu(cuda, ordinal, nbytes, owned) for ordinal in range(visible_gpus(cuda))]


def at_once(gpus: list[Gpu], work: Callable[[int, Gpu], list[float]]) -> tuple[float, list[list[float]]]:
    """`work(index, gpu)` on every GPU at once, a thread each, started together: the wall seconds from the start to the
    last one's end, and what each returned; the first failure is raised once every thread has ended."""
    results: list[list[float]] = [[] for _ in gpus]
    failures: list[BaseException] = []
    start = threading.Barrier(len(gpus) + 1)

    def run(index: int) -> None:
        try:
            gpus[index].current()
            start.wait()
            results[index] = work(index, gpus[index])
        except BaseException as error:  # raised on the caller's thread
            start.abort()
            failures.append(error)

    threads = [threading.Thread(target=run, args=(index,), name=f"cnnlab-bench-gpu-{index}") for index in range(len(gpus))]
    for thread in threads:
        thread.start()
    try:
        start.wait()
    except threading.BrokenBarrierError:  # a thread failed before its copies: its error is raised below
        pass
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    if failures:  # the error that broke the start, not the others' BrokenBarrierError
        raise next((error for error in failures if not isinstance(error, threading.BrokenBarrierError)), failures[0])
    return time.perf_counter() - began, results


@dataclass(frozen=True)
class CopiesAtOnce:
    """Host-to-device copies from page-locked memory with `gpus` GPUs copying at once: GB/s in total and on each, and
    the name of the first (the device the rows are of)."""

    gpus: int
    total: float
    each: tuple[float, ...]
    device: str


def aggregate_bound(nbytes: int, copies: int) -> list[CopiesAtOnce]:
    """With 1, 2, ... N of the visible GPUs copying at once: `copies` copies of `nbytes` a GPU (after one unseen, which
    wakes each link), timed as one run from the common start to the last GPU's end."""
    figures = []
    with open_gpus(nbytes) as (_, gpus):
        for count in range(1, len(gpus) + 1):
            at_once(gpus[:count], partial(_copies, 1))
            wall, seconds = at_once(gpus[:count], partial(_copies, copies))
            gigabytes = copies * nbytes / 1e9
            each = tuple(gigabytes / gpu_seconds[0] for gpu_seconds in seconds)
            figures.append(CopiesAtOnce(count, count * gigabytes / wall, each, gpus[0].name))
    return figures


def _copies(times: int, index: int, gpu: Gpu) -> list[float]:
    """`times` copies of the GPU's page-locked buffer to it, back to back: their seconds (at_once's work)."""
    began = time.perf_counter()
    for _ in range(times):
        gpu.copy_from(gpu.host_buffer.value or 0)
    return [time.perf_counter() - began]
