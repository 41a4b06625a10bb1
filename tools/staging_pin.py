"""What the file copier's page-locked staging costs to make, first in a fresh process as a run makes it: the 12 threads'
two 4 MiB tasks each (96 MiB) as one block registered on one thread, against a block a thread, each faulted in by its
thread before it is registered (as FileCopier makes them), and a block a thread left to the driver to fault in.

    python3 tools/staging_pin.py [--processes 5]

Prints, a way, the seconds until every block is registered (median and range of the processes) and, for the
threads, until the first is (a copy can start). Run from a checkout with PyCUDA and a GPU (docs/gpu.md, "MAX_THREADS").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from paired_wall import median_and_range  # noqa: E402

from cnnlab.cuda.file_copier import MAX_THREADS  # noqa: E402
from cnnlab.cuda.memory import TASK_BYTES  # noqa: E402

WAYS = {
    "one block, one thread": "block",
    "a block a thread, faulted by it": "faulted",
    "a block a thread, faulted by the driver": "unfaulted",
}


def sample(way: str) -> tuple[float, float]:
    """Seconds to the first and the last block registered, in this process (its first page-locked memory)."""
    import pycuda.driver as cuda

    from cnnlab.cuda.memory import Allocator

    cuda.init()
    context = cuda.Device(0).retain_primary_context()
    context.push()
    memory, done, start = Allocator(cuda), [], time.perf_counter()
    if way == "block":
        memory.host(MAX_THREADS * 2 * TASK_BYTES, "u1")
        done.append(time.perf_counter() - start)
    else:
        def make() -> None:
            context.push()
            try:
                memory.host(2 * TASK_BYTES, "u1", fault_first=way == "faulted")
                done.append(time.perf_counter() - start)
            finally:
                context.pop()

        threads = [threading.Thread(target=make) for _ in range(MAX_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(done) == MAX_THREADS, "a thread failed to make its block"
    memory.free_all()
    context.pop()
    return min(done), max(done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--way", choices=WAYS.values(), help=argparse.SUPPRESS)  # a sample, in a process of its own
    args = parser.parse_args()
    if args.way:
        print(*sample(args.way))
        return
    runs: dict[str, list[list[str]]] = {way: [] for way in WAYS.values()}
    for _ in range(args.processes):  # the ways in turns, so that each takes the machine in the same spells
        for way in WAYS.values():
            sample_run = subprocess.run([sys.executable, __file__, "--way", way], capture_output=True, text=True, check=True)
            runs[way].append(sample_run.stdout.split())
    for name, way in WAYS.items():
        first, last = ([float(run[index]) for run in runs[way]] for index in (0, 1))
        line = f"{name:42} all {median_and_range(last)} s"
        print(line if way == "block" else f"{line}, the first {median_and_range(first)} s")


if __name__ == "__main__":
    main()
