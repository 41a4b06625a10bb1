"""Two commands timed as whole processes in turns, A B A B ..., and the ratio A/B taken pair by pair.

    python tools/paired_wall.py [--pairs 25] [--warmup 1] --a "COMMAND A" --b "COMMAND B"

Each command is one string split as a shell splits words, run with its output thrown away. Taking turns keeps
the ratio meaningful on a machine whose speed drifts during the call (a shared one): each pair runs in the same
spell. Prints the median (min..max) wall seconds of A and of B, and of A/B over the pairs: quote the median.
BENCHMARKS.md's 2-core whole-process comparisons (cpu mode on 2,000 .npy or CSV images against an older tree)
are this, with each tree on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """A figure over the runs: the median, the least and the most."""

    median: float
    least: float
    most: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def __str__(self) -> str:
        return f"{self.median:.3f} ({self.least:.3f}..{self.most:.3f})"


def wall_seconds(command: list[str]) -> float:
    """One run's wall time, from its start to its exit; an error if it fails."""
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="command A, one string")
    parser.add_argument("--b", required=True, help="command B (the baseline), one string")
    parser.add_argument("--pairs", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=1, help="pairs run first and not counted (caches, bytecode)")
    args = parser.parse_args()
    a, b = shlex.split(args.a), shlex.split(args.b)
    for _ in range(args.warmup):
        wall_seconds(a), wall_seconds(b)
    pairs = [(wall_seconds(a), wall_seconds(b)) for _ in range(args.pairs)]
    print(f"A wall s   {Spread.of([x for x, _ in pairs])}")
    print(f"B wall s   {Spread.of([y for _, y in pairs])}")
    print(f"A/B wall   {Spread.of([x / y for x, y in pairs])}   ({args.pairs} pairs)")


if __name__ == "__main__":
    main()
