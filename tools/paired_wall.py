"""Two commands timed as whole processes in turns, A B A B ..., and the ratio A/B taken pair by pair.
The `gpus` stage of tools/gpu-check.sh runs it; otherwise it is run by hand, on any machine (the 2-core machine, which
has no GPU, among them); tools/trace_overhead.py and tools/against.py take its median_and_range().

    python tools/paired_wall.py [--pairs 25] [--settle 0] --a "COMMAND A" --b "COMMAND B"

Each command is one string split as a shell splits words, run with its output thrown away, after one uncounted
pair that warms the caches and the bytecode (cnnlab.bench.report.alternated_seconds, as `cnnlab bench` times its
peers). Taking turns keeps the ratio meaningful on a machine whose speed drifts during the call (a shared one):
each pair runs in the same spell. Prints the median (min..max) wall seconds of A and of B, and of A/B over the
pairs: quote the median. BENCHMARKS.md's 2-core whole-process runs (cpu mode on 2,000 .npy images) are this, and so
are the several-GPU start-up rows, with --settle: a cuda run's helper tears the
driver down just after the run ends, and without a wait the next run would share the GPU with that.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
from functools import partial

from cnnlab.bench.report import alternated_seconds


def median_and_range(values: list[float]) -> str:
    """The median of the runs, and the least and the most of them."""
    return f"{statistics.median(values):.3f} ({min(values):.3f}..{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="command A, one string")
    parser.add_argument("--b", required=True, help="command B (the baseline), one string")
    parser.add_argument("--pairs", type=int, default=25)
    parser.add_argument("--settle", type=float, default=0.0, help="seconds waited, untimed, before each run")
    args = parser.parse_args()
    run = partial(subprocess.run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    a, b = alternated_seconds([partial(run, shlex.split(args.a)), partial(run, shlex.split(args.b))], args.pairs, args.settle)
    print(f"A wall s   {median_and_range(a)}")
    print(f"B wall s   {median_and_range(b)}")
    print(f"A/B wall   {median_and_range([x / y for x, y in zip(a, b)])}   ({args.pairs} pairs)")


if __name__ == "__main__":
    main()
