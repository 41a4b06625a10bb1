"""Where `cnnlab cuda` spends its time on a CSV file: each step's total per thread, for a few text batches.
No stage of tools/gpu-check.sh runs it: it is run by hand after tools/bench_read_bound.py (BENCHMARKS.md
sections 3 and 8).

    python tools/profile_cuda_csv.py CNN_CSV IN_CSV [--batches 256 512] [--runs 2]

Every function below is wrapped to add up its wall time per thread (the reader's thread, the main
one); one CudaContext per batch size, `--runs` whole runs each (run_network, as the command line
runs it), then the totals of the last run. Also: how fast page-locked memory is made here, the way
the context makes its text windows (pinning, not the copies, was the reader's largest cost once).
"""

from __future__ import annotations

import argparse
import collections
import functools
import threading
import time
from typing import Any

from cnnlab.cuda import chunk_sources, chunk_streams
from cnnlab.cuda import context as cuda
from cnnlab.files import labcsv, text
from cnnlab.files.labcsv import read_cnn
from cnnlab.run import run_network

TOTALS: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0])
WRAPPED = [
    (text.TextSource, "take"),
    (text.TextSource, "_read_into"),
    (text.TextSource, "_turn"),
    (text.TextSource, "_read_summarized"),  # on the pool's threads when it reads ahead
    (text, "cut_summarized"),  # the name text.py calls
    (cuda.CudaContext, "allocate_text"),
    (cuda.CudaContext, "free_text"),
    (cuda.CudaContext, "compute"),
    (chunk_sources.CsvTextChunks, "start"),
    (chunk_sources.CsvTextChunks, "images"),
    (chunk_streams.ChunkStream, "run"),
    (chunk_streams.HostOutputs, "finish"),
    (labcsv.CsvOutputWriter, "write"),
]


def wrap(owner: Any, name: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            entry = TOTALS[(f"{getattr(owner, '__name__', owner)}.{name}", threading.current_thread().name[:16])]
            entry[0] += time.perf_counter() - start
            entry[1] += 1

    setattr(owner, name, timed)


def pinning_rate(context: cuda.CudaContext, nbytes: int) -> float:
    """Bytes per second of making page-locked memory as the context makes a text window."""
    start = time.perf_counter()
    window = context.allocate_text(nbytes)
    seconds = time.perf_counter() - start
    context.free_text(window)
    return nbytes / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cnn")
    parser.add_argument("input")
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    for owner, name in WRAPPED:
        wrap(owner, name)
    cnn = read_cnn(args.cnn)
    for batch in args.batches:
        with cuda.CudaContext(cnn, batch) as context:
            rates = [pinning_rate(context, 64 << 20) / 1e9 for _ in range(3)]
            print(f"text batch {batch}: pinning 64 MB windows {', '.join(f'{rate:.2f}' for rate in rates)} GB/s")
            for run in range(args.runs):
                TOTALS.clear()
                start = time.perf_counter()
                stats = run_network(context, args.input, "/tmp/cnnlab_profile_out.csv")
                seconds = time.perf_counter() - start
                print(
                    f"  run {run}: {seconds:.3f} s, loop {stats.loop_seconds:.3f} s "
                    f"({stats.images / stats.loop_seconds:,.0f} images/s), compute() {stats.work_seconds:.3f} s"
                )
        for (label, thread), (total, calls) in sorted(TOTALS.items(), key=lambda item: -item[1][0]):
            print(f"    {label:<32} {thread:<16} {total * 1e3:8.1f} ms {calls:6d} calls")


if __name__ == "__main__":
    main()
