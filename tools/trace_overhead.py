"""What --trace costs a run's loop: the same files through `cnnlab MODE` without a trace and with one (in cuda mode also
with --trace-chunks), in turns, the loop's seconds of each, and each traced run's ratio to the untraced run of its turn.
Run by tools/gpu-check.sh's `trace` stage.

    python tools/trace_overhead.py MODE CNN_FILE INPUT_FILE --trace PATH [--runs 3]

The runs are made in this one process (run.run_network, as the command line calls it, on backends made once: one that
tells nothing, one that tells a recorder each batch's span on each stream, and in cuda mode one that tells a recorder
each chunk's too), so that a turn takes the loop's time a few times and no process's start: a whole run's start-up
varies by more than the trace costs its loop, and this way a call holds several times the turns. The order within a
turn is reversed each turn, so that order cancels. A last run through the command line with --trace keeps its trace at
PATH (.json or .json.gz), for `cnnlab trace-plot`. Prints each turn's loop seconds, the median (min..max) of each, of
each ratio, and a 90% interval of the ratio's median (resampled turns): docs/trace.md's overhead figures are this.

A loop still varies by more than the trace costs it, so the tool also gives the main thread's share, steadier: each
turn's difference in compute()'s seconds (the main thread queues every chunk's copies and kernels and records every
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
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paired_wall import median_and_range

if TYPE_CHECKING:
    from cnnlab.run import RunStats


@dataclass
class Arm:
    """One way of running the job: its name, its backend and recorder (None: untraced), and its runs' figures."""

    name: str
    backend: Any
    recorder: Any
    runs: list[RunStats] = field(default_factory=list)

    def run(self, input_path: str, out: Path) -> None:
        from cnnlab.run import run_network
        from cnnlab.tracing import NO_TRACE

        if self.recorder is not None:
            self.recorder.clear()  # each run's spans alone, as the command line's recorder holds them
        self.runs.append(run_network(self.backend, input_path, out, trace=self.recorder or NO_TRACE))


def runs_in_turns(mode: str, cnn_path: str, input_path: str, runs: int, out: Path) -> list[Arm]:
    """`runs` runs of each arm (the untraced one first in the list), in turns, after one uncounted turn."""
    from cnnlab.files.labcsv import read_cnn
    from cnnlab.run import make_backend
    from cnnlab.trace.recorder import Recorder
    from cnnlab.tracing import NO_TRACE

    cnn = read_cnn(cnn_path)
    recorders = [None, Recorder()] + ([Recorder(chunks=True)] if mode == "cuda" else [])
    names = ["without --trace", "with --trace", "with --trace-chunks"]
    with ExitStack() as backends:
        arms = [Arm(name, backends.enter_context(make_backend(mode, cnn, None, trace=recorder or NO_TRACE)), recorder)
                for name, recorder in zip(names, recorders)]  # fmt: skip
        for arm in arms:  # not counted: a process's first runs fault in its pools and page-locked windows
            arm.run(input_path, out)
            arm.runs.clear()
        for turn in range(runs):
            for arm in reversed(arms) if turn % 2 else arms:
                arm.run(input_path, out)
            print(f"turn {turn + 1}: loop " + ", ".join(f"{arm.runs[-1].loop_seconds:.3f} s {arm.name}" for arm in arms), flush=True)
    return arms


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
    parser.add_argument("--runs", type=int, default=3, help="turns (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "out.csv"
        plain, *traced = runs_in_turns(args.mode, args.cnn, args.input, args.runs, out)
        command = [sys.executable, "-m", "cnnlab", args.mode, args.cnn, args.input, str(out), "--trace", args.trace]
        subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
    untraced_loop = statistics.median(run.loop_seconds for run in plain.runs)
    print(f"{plain.name:<20} loop s {median_and_range([run.loop_seconds for run in plain.runs])}")
    for arm in traced:
        ratios = [b.loop_seconds / a.loop_seconds for a, b in zip(plain.runs, arm.runs)]
        low, high = median_interval(ratios)
        main_thread = statistics.median(b.work_seconds - a.work_seconds for a, b in zip(plain.runs, arm.runs))  # compute()
        print(f"{arm.name:<20} loop s {median_and_range([run.loop_seconds for run in arm.runs])}")
        interval = f"the median's 90% interval {low:.3f}..{high:.3f}"
        print(f"  ratio to without   {median_and_range(ratios)}   ({args.runs} turns, {args.mode}; {interval})")
        print(f"  compute() with it  {main_thread * 1e3:+.1f} ms a run (median of the turns' differences), "
              f"{main_thread / untraced_loop:.1%} of the untraced loop's median, {untraced_loop:.3f} s")


if __name__ == "__main__":
    main()
