"""What the host can feed its GPUs: host-to-device copies with 1..N GPUs copying at once, a thread and a context each,
from page-locked memory (what `cnnlab bench --rows gpus` measures, a GPU's share beside each total), and from a mapped
file in the page cache registered read-only with the driver. The `gpus` stage of tools/gpu-check.sh runs it
(BENCHMARKS.md, section 7).

    python3 tools/h2d_bound.py [--mb 512] [--copies 6] [--file /tmp/h2d.bin]

Each GPU copies `--copies` times `--mb` MiB from a page-locked buffer of its own (allocated with its context current);
then, from its own part of a file of random bytes (written first, so in the page cache), the part registered
(cuMemHostRegister, read-only), copied and unregistered in series, each step timed apart. Prints GB/s in total and a
GPU. The driver is called through ctypes (each call releases the GIL); run from a checkout (it imports cnnlab.bench.gpus)
with numpy installed.
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
from cnnlab.bench.gpus import MIB, Gpu, aggregate_bound, at_once, open_gpus  # noqa: E402
from cnnlab.cuda.driver import checked  # noqa: E402

HOST_REGISTER_READ_ONLY = 0x08


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=512, help="MiB a copy")
    parser.add_argument("--copies", type=int, default=6)
    parser.add_argument("--file", default="/tmp/h2d.bin", help="the file of random bytes the registered copies read")
    args = parser.parse_args()
    nbytes = args.mb * MIB
    gigabytes = args.copies * nbytes / 1e9
    for copies in aggregate_bound(nbytes, args.copies):
        each = ", ".join(f"{rate:.1f}" for rate in copies.each)
        print(f"page-locked, {copies.gpus} GPU(s) at once: {copies.total:6.1f} GB/s in total ({each} a GPU)")
    with open_gpus(nbytes) as (cuda, gpus):
        random = os.urandom(64 * MIB)  # what the file holds, over and over: fresh random bytes, never zeros
        with open(args.file, "wb") as file:
            for _ in range(-(-len(gpus) * nbytes // len(random))):  # whole blocks, rounded up: the file holds every part
                file.write(random)
        with open(args.file, "rb") as file:
            mapping = mmap.mmap(file.fileno(), len(gpus) * nbytes, prot=mmap.PROT_READ)
        file_base = np.frombuffer(mapping, dtype=np.uint8).ctypes.data

        def from_registered_file(index: int, gpu: Gpu) -> list[float]:
            part = ctypes.c_void_p(file_base + index * nbytes)
            steps = [0.0, 0.0, 0.0]  # register, copy, unregister
            for _ in range(args.copies):
                marks = [time.perf_counter()]
                checked(cuda.cuMemHostRegister_v2(part, ctypes.c_size_t(nbytes), HOST_REGISTER_READ_ONLY), "cuMemHostRegister")
                marks.append(time.perf_counter())
                gpu.copy_from(part.value or 0)
                marks.append(time.perf_counter())
                checked(cuda.cuMemHostUnregister(part), "cuMemHostUnregister")
                marks.append(time.perf_counter())
                for step in range(3):
                    steps[step] += marks[step + 1] - marks[step]
            return steps

        for n in range(1, len(gpus) + 1):
            wall, results = at_once(gpus[:n], from_registered_file)
            steps = ["/".join(f"{gigabytes / step:.1f}" for step in seconds) for seconds in results]
            print(f"registered file, {n} GPU(s) at once: {n * gigabytes / wall:6.1f} GB/s in total "
                  f"(register/copy/unregister a GPU: {', '.join(steps)})")
        mapping.close()
        os.unlink(args.file)


if __name__ == "__main__":
    main()
