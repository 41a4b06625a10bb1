"""What --trace costs a run's loop: the same files through `cnnlab MODE` without and with a trace, in turns (A B B A A B
...), the loop's seconds of each, and the ratio with/without taken pair by pair.
Run by tools/gpu-check.sh's `trace` stage.

    python tools/trace_overhead.py MODE CNN_FILE INPUT_FILE --trace PATH [--runs 3]

The pairs run in this one process (run.run_network, as the command line calls it, on two backends made once: one whose
streams and kernels tell a recorder their time, one that tells nothing), so that a pair takes the loop's time twice and
no process's start: a whole run's start-up varies by more than the trace costs its loop, and this way a call holds
several times the pairs. A last run through the command line with --trace keeps its trace at PATH (.json or .json.gz),
for `cnnlab trace-plot`. Prints each pair's loop seconds, the median (min..max) of each side and of the ratio, and a 90%
interval of the ratio's median (resampled pairs): docs/trace.md's overhead figures are this.

A loop still varies by more than the trace costs it, so the tool also gives the main thread's share, steadier: each
pair's difference in compute()'s seconds (the main thread queues every chunk's copies and kernels and records every
stream span's CUDA events), its median over the untraced loop's. What a span costs measured alone, on an idle machine,
says little: beside the run's readers the same calls take about three times as long.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from paired_wall import spread

if TYPE_CHECKING:
    from cnnlab.run import RunStats


def paired_runs(mode: str, cnn_path: str, input_path: str, runs: int, out: Path) -> tuple[list[RunStats], list[RunStats]]:
    """`runs` untraced and `runs` traced runs of the job, in ABBA order, in this process."""
    from cnnlab.files.labcsv import read_cnn
    from cnnlab.run import make_backend, run_network
    from cnnlab.trace.recorder import Recorder

    cnn, recorder = read_cnn(cnn_path), Recorder()
    plain: list[RunStats] = []
    traced: list[RunStats] = []
    with make_backend(mode, cnn, None) as untraced_backend, make_backend(mode, cnn, None, trace=recorder) as traced_backend:
        def run_plain() -> None:
            plain.append(run_network(untraced_backend, input_path, out))

        def run_traced() -> None:
            recorder.clear()  # each run's spans alone, as the command line's recorder holds them
            traced.append(run_network(traced_backend, input_path, out, trace=recorder))

        run_plain()  # not counted: a process's first runs fault in its pools and page-locked windows
        run_traced()
        plain.clear()
        traced.clear()
        for run in range(runs):  # ABBA: each pair's order the other way from the last, so that order cancels
            for step in (run_traced, run_plain) if run % 2 else (run_plain, run_traced):
                step()
            without, with_trace = plain[-1].loop_seconds, traced[-1].loop_seconds
            print(f"run {run + 1}: loop {without:.3f} s without --trace, {with_trace:.3f} s with it", flush=True)
    return plain, traced


def median_interval(ratios: list[float], level: float = 0.9, resamples: int = 4000) -> tuple[float, float]:
    """A `level` interval of the median of `ratios`, by resampling them (a bootstrap, seeded: the same figures give the
    same interval)."""
    rng = random.Random(459)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    tail = int(resamples * (1 - level) / 2)
    return medians[tail], medians[-tail - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["cpu", "cuda"])
    parser.add_argument("cnn")
    parser.add_argument("input")
    parser.add_argument("--trace", required=True, help="where the command line's traced run keeps its trace")
    parser.add_argument("--runs", type=int, default=3, help="runs of each, in turns (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "out.csv"
        plain, traced = paired_runs(args.mode, args.cnn, args.input, args.runs, out)
        command = [sys.executable, "-m", "cnnlab", args.mode, args.cnn, args.input, str(out), "--trace", args.trace]
        subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
    ratios = [b.loop_seconds / a.loop_seconds for a, b in zip(plain, traced)]
    low, high = median_interval(ratios)
    untraced_loop = statistics.median(run.loop_seconds for run in plain)
    main_thread = statistics.median(b.work_seconds - a.work_seconds for a, b in zip(plain, traced))  # in compute()
    print(f"without --trace   loop s {spread([run.loop_seconds for run in plain])}")
    print(f"with --trace      loop s {spread([run.loop_seconds for run in traced])}")
    print(f"with/without      {spread(ratios)}   ({args.runs} pairs, {args.mode}; the median's 90% interval {low:.3f}..{high:.3f})")
    print(f"compute() with it {main_thread * 1e3:+.1f} ms a run (median of the pairs' differences), "
          f"{main_thread / untraced_loop:.1%} of the untraced loop's median, {untraced_loop:.3f} s")

if __name__ == "__main__":
    main()
