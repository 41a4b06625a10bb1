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
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cnnlab.bench.gpus import MB, Gpu, at_once, check_call, visible_gpus  # noqa: E402

RANDOM = os.urandom(64 * MB)  # what the file holds, over and over: fresh random bytes, never zeros
HOST_REGISTER_READ_ONLY = 0x08


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=512, help="MB a copy")
    parser.add_argument("--copies", type=int, default=6)
    parser.add_argument("--file", default="/tmp/h2d.bin", help="the file of random bytes the registered copies read")
    args = parser.parse_args()
    cuda = ctypes.CDLL("libcuda.so.1")
    nbytes = args.mb * MB
    gpus = [Gpu(cuda, ordinal, nbytes) for ordinal in range(visible_gpus(cuda))]
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
            check_call(cuda.cuMemHostRegister_v2(part, ctypes.c_size_t(nbytes), HOST_REGISTER_READ_ONLY), "cuMemHostRegister")
            marks.append(time.perf_counter())
            gpu.copy_from(part.value or 0)
            marks.append(time.perf_counter())
            check_call(cuda.cuMemHostUnregister(part), "cuMemHostUnregister")
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
    for gpu in gpus:
        gpu.free()


if __name__ == "__main__":
    main()
