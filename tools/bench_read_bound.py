"""The bound of cuda mode's CSV loop: how fast the host reads a file into page-locked windows, alone and while the GPU
copies each window in, as the loop does (without the parse, the network or any Python between reads).
No stage of tools/gpu-check.sh runs it: it is run by hand beside `cnnlab cuda` on the same file
(BENCHMARKS.md sections 3 and 8).

    python3 tools/bench_read_bound.py IN_CSV [--mb 48] [--threads 16] [--repeats 3]

Windows of `--mb` MB (cuda mode's batch of 256 images is ~48 MB of repr text), three of them, made as cuda mode makes
its text windows (memory.Allocator: pages of their own, registered with the driver), read back to back by
the native reader (read_summarized: `--threads` preadv threads, each piece's lines counted as it lands); the H2D copy
and the pipelined pair on one stream, a window handed back to the reader once its copy has ended. GB/s of the file.
"""

from __future__ import annotations

import argparse
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cnnlab.cuda.memory import Allocator
from cnnlab.files.lines import native

WINDOWS = 3  # as many as cuda mode's reader takes turns with


@dataclass(frozen=True)
class Bound:
    """One way of moving the file, its rate in each repeat."""

    name: str
    gigabytes_per_second: list[float]

    def __str__(self) -> str:
        return f"{self.name:<44} GB/s " + " ".join(f"{rate:6.1f}" for rate in self.gigabytes_per_second)


def read_only(fd: int, size: int, windows: list[np.ndarray], threads: int) -> None:
    """Read the whole file into the windows in turn, back to back."""
    offset, turn = 0, 0
    while offset < size:
        count, _ = native.read_summarized(fd, windows[turn % len(windows)], 0, len(windows[0]), offset, threads)
        if not count:
            break
        offset, turn = offset + count, turn + 1


def copy_only(driver: Any, size: int, windows: list[np.ndarray], device: list[Any], stream: Any) -> None:
    """Copy the file's worth of bytes from the windows to the device, as one stream queues them."""
    for turn, offset in enumerate(range(0, size, len(windows[0]))):
        count = min(len(windows[0]), size - offset)
        driver.memcpy_htod_async(device[turn % 2], windows[turn % len(windows)][:count], stream)
    stream.synchronize()


def read_and_copy(driver: Any, fd: int, size: int, windows: list[np.ndarray], device: list[Any], stream: Any, threads: int) -> None:
    """Read on a thread and copy each filled window on this one; the reader waits for a window only until its copy ends."""
    copied = [driver.Event() for _ in windows]
    for event in copied:
        event.record(stream)
    free: queue.Queue[int] = queue.Queue()
    full: queue.Queue[tuple[int, int] | None] = queue.Queue()

    def reader() -> None:
        for index in range(len(windows)):
            free.put(index)
        offset = 0
        while offset < size:
            index = free.get()
            copied[index].synchronize()
            count, _ = native.read_summarized(fd, windows[index], 0, len(windows[0]), offset, threads)
            full.put((index, count))
            offset += count
            if not count:
                break
        full.put(None)

    thread = threading.Thread(target=reader)
    thread.start()
    turn = 0
    while (item := full.get()) is not None:
        index, count = item
        driver.memcpy_htod_async(device[turn % 2], windows[index][:count], stream)
        copied[index].record(stream)
        free.put(index)
        turn += 1
    stream.synchronize()
    thread.join()


def rate(size: int, run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return size / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("--mb", type=int, default=48)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import pycuda.driver as driver

    driver.init()
    context = driver.Device(0).make_context()
    memory = Allocator(driver)
    try:
        nbytes, size = args.mb << 20, os.path.getsize(args.input)
        windows = [memory.host(nbytes, np.uint8) for _ in range(WINDOWS)]
        device, stream = [memory.device(nbytes) for _ in range(2)], driver.Stream()
        with open(args.input, "rb") as file:
            fd, repeats = file.fileno(), range(args.repeats)
            runs: dict[str, Callable[[], None]] = {
                f"read into page-locked windows, {args.threads} threads": lambda: read_only(fd, size, windows, args.threads),
                "H2D copy from page-locked windows": lambda: copy_only(driver, size, windows, device, stream),
                "read + H2D copy of each window, pipelined": lambda: read_and_copy(driver, fd, size, windows, device, stream, args.threads),
            }
            bounds = [Bound(name, [rate(size, run) for _ in repeats]) for name, run in runs.items()]
        print(f"{args.input}: {size / 1e9:.2f} GB, {WINDOWS} windows of {args.mb} MB")
        for bound in bounds:
            print(f"  {bound}")
    finally:
        memory.free_all()
        context.pop()


if __name__ == "__main__":
    main()
