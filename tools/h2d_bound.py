"""What the host can feed its GPUs: host-to-device copies with 1..N GPUs copying at once, a thread and a context each,
from page-locked memory, and from a mapped file in the page cache registered read-only with the driver.
The `gpus` stage of tools/gpu-check.sh runs it (BENCHMARKS.md, section 7).

    python3 tools/h2d_bound.py [--mb 512] [--copies 6] [--file /tmp/h2d.bin]

Each GPU copies `--copies` times `--mb` MB from a page-locked buffer of its own (allocated with its context current);
then, from its own part of a file of random bytes (written first, so in the page cache), the part registered
(cuMemHostRegister, read-only), copied and unregistered in series, each step timed apart. Prints GB/s in total and a
GPU. The driver is called through ctypes (each call releases the GIL), so nothing but numpy is needed.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import threading
import time
from collections.abc import Callable

import numpy as np

MB = 1 << 20
RANDOM = os.urandom(64 * MB)  # what every buffer and the file hold, over and over: fresh random bytes, never zeros
HOST_ALLOC_PORTABLE = 0x01
HOST_REGISTER_READ_ONLY = 0x08


def check(result: int, what: str) -> None:
    if result != 0:
        raise SystemExit(f"h2d_bound: {what} failed: CUDA error {result}")


class Gpu:
    """One GPU's context, a page-locked buffer and a device buffer of `nbytes` each."""

    def __init__(self, cuda: ctypes.CDLL, ordinal: int, nbytes: int) -> None:
        self.cuda, self.nbytes = cuda, nbytes
        device, self.context = ctypes.c_int(), ctypes.c_void_p()
        check(cuda.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), device), "cuDevicePrimaryCtxRetain")
        self.current()
        self.host, self.device = ctypes.c_void_p(), ctypes.c_uint64()
        check(cuda.cuMemHostAlloc(ctypes.byref(self.host), ctypes.c_size_t(nbytes), HOST_ALLOC_PORTABLE), "cuMemHostAlloc")
        for at in range(0, nbytes, len(RANDOM)):
            ctypes.memmove((self.host.value or 0) + at, RANDOM, min(len(RANDOM), nbytes - at))
        check(cuda.cuMemAlloc_v2(ctypes.byref(self.device), ctypes.c_size_t(nbytes)), "cuMemAlloc")

    def current(self) -> None:
        check(self.cuda.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def copy_from(self, address: int) -> None:
        check(self.cuda.cuMemcpyHtoD_v2(self.device, ctypes.c_void_p(address), ctypes.c_size_t(self.nbytes)), "cuMemcpyHtoD")


def at_once(gpus: list[Gpu], work: Callable[[int, Gpu], list[float]]) -> tuple[float, list[list[float]]]:
    """`work(index, gpu)` on every GPU at once, a thread each: the wall seconds, and what each returned."""
    results: list[list[float]] = [[] for _ in gpus]

    def run(index: int) -> None:
        gpus[index].current()
        results[index] = work(index, gpus[index])

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(gpus))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=512, help="MB a copy")
    parser.add_argument("--copies", type=int, default=6)
    parser.add_argument("--file", default="/tmp/h2d.bin", help="the file of random bytes the registered copies read")
    args = parser.parse_args()
    cuda = ctypes.CDLL("libcuda.so.1")
    check(cuda.cuInit(0), "cuInit")
    count = ctypes.c_int()
    check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    nbytes = args.mb * MB
    gpus = [Gpu(cuda, ordinal, nbytes) for ordinal in range(count.value)]
    with open(args.file, "wb") as file:
        for _ in range(-(-len(gpus) * nbytes // len(RANDOM))):  # whole blocks, rounded up: the file holds every part
            file.write(RANDOM)
    with open(args.file, "rb") as file:
        mapping = mmap.mmap(file.fileno(), len(gpus) * nbytes, prot=mmap.PROT_READ)
    file_base = np.frombuffer(mapping, dtype=np.uint8).ctypes.data
    gigabytes = args.copies * nbytes / 1e9

    def from_page_locked(index: int, gpu: Gpu) -> list[float]:
        start = time.perf_counter()
        for _ in range(args.copies):
            gpu.copy_from(gpu.host.value or 0)
        return [time.perf_counter() - start]

    def from_registered_file(index: int, gpu: Gpu) -> list[float]:
        part = ctypes.c_void_p(file_base + index * nbytes)
        steps = [0.0, 0.0, 0.0]  # register, copy, unregister
        for _ in range(args.copies):
            marks = [time.perf_counter()]
            check(cuda.cuMemHostRegister_v2(part, ctypes.c_size_t(nbytes), HOST_REGISTER_READ_ONLY), "cuMemHostRegister")
            marks.append(time.perf_counter())
            gpu.copy_from(part.value or 0)
            marks.append(time.perf_counter())
            check(cuda.cuMemHostUnregister(part), "cuMemHostUnregister")
            marks.append(time.perf_counter())
            for step in range(3):
                steps[step] += marks[step + 1] - marks[step]
        return steps

    print(f"{len(gpus)} GPUs, {args.mb} MB a copy, {args.copies} copies a GPU")
    for n in range(1, len(gpus) + 1):
        wall, results = at_once(gpus[:n], from_page_locked)
        each = ", ".join(f"{gigabytes / seconds[0]:.1f}" for seconds in results)
        print(f"page-locked, {n} GPU(s) at once: {n * gigabytes / wall:6.1f} GB/s in total ({each} a GPU)")
    for n in range(1, len(gpus) + 1):
        wall, results = at_once(gpus[:n], from_registered_file)
        steps = ["/".join(f"{gigabytes / step:.1f}" for step in seconds) for seconds in results]
        print(f"registered file, {n} GPU(s) at once: {n * gigabytes / wall:6.1f} GB/s in total "
              f"(register/copy/unregister a GPU: {', '.join(steps)})")
    mapping.close()
    os.unlink(args.file)


if __name__ == "__main__":
    main()
