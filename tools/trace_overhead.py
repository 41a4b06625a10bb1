"""What --trace costs a run's loop: the same files through `cnnlab MODE` without and with a trace, in turns (A B B A A B
...), the loop's seconds of each, and the ratio with/without taken pair by pair.

    python tools/trace_overhead.py MODE CNN_FILE INPUT_FILE --trace PATH [--runs 3]

The pairs run in this one process (run.run_network, as the command line calls it, on two backends made once: one whose
streams and kernels tell a recorder their time, one that tells nothing), so that a pair takes the loop's time twice and
no process's start: a whole run's start-up varies by more than the trace costs its loop, and this way a call holds
several times the pairs. A last run through the command line with --trace keeps its trace at PATH (.json or .json.gz),
for `cnnlab trace-plot`. Prints each pair's loop seconds, the median (min..max) of each side and of the ratio, and a 90%
interval of the ratio's median (resampled pairs): docs/trace.md's overhead figures are this (tools/gpu-check.sh trace).

A loop still varies by more than the trace costs it, so the tool also gives the recorder's own time: what a span
costs here (host spans; in cuda mode, stream spans with their CUDA events, recorded, then settled), times the spans of
the command line's trace that the main thread recorded, over the untraced loop's median. The main thread records every
stream span: where it is the loop's bound, all of that time is added to the loop.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from paired_wall import spread


def paired_loops(mode: str, cnn_path: str, input_path: str, runs: int, out: Path) -> tuple[list[float], list[float]]:
    """The loop's seconds of `runs` untraced and `runs` traced runs of the job, in ABBA order, in this process."""
    from cnnlab.files.labcsv import read_cnn
    from cnnlab.run import make_backend, run_network
    from cnnlab.trace.recorder import Recorder

    cnn, recorder = read_cnn(cnn_path), Recorder()
    plain: list[float] = []
    traced: list[float] = []
    with make_backend(mode, cnn, None) as untraced_backend, make_backend(mode, cnn, None, trace=recorder) as traced_backend:
        def run_plain() -> None:
            plain.append(run_network(untraced_backend, input_path, out).loop_seconds)

        def run_traced() -> None:
            recorder.clear()  # each run's spans alone, as the command line's recorder holds them
            traced.append(run_network(traced_backend, input_path, out, trace=recorder).loop_seconds)

        run_plain()  # not counted: a process's first runs fault in its pools and page-locked windows
        run_traced()
        plain.clear()
        traced.clear()
        for run in range(runs):  # ABBA: each pair's order the other way from the last, so that order cancels
            for step in (run_traced, run_plain) if run % 2 else (run_plain, run_traced):
                step()
            print(f"run {run + 1}: loop {plain[-1]:.3f} s without --trace, {traced[-1]:.3f} s with it", flush=True)
    return plain, traced


def median_interval(ratios: list[float], level: float = 0.9, resamples: int = 4000) -> tuple[float, float]:
    """A `level` interval of the median of `ratios`, by resampling them (a bootstrap, seeded: the same figures give the
    same interval)."""
    rng = random.Random(459)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    tail = int(resamples * (1 - level) / 2)
    return medians[tail], medians[-tail - 1]


@dataclass(frozen=True)
class SpanCosts:
    """What a span costs the thread that records it on this machine, in microseconds."""

    host: float
    stream: float  # its two CUDA events recorded, then their times read and placed (settle)
    chained: float  # a group's span after its first: one event, its start the end of the span before
    group: float  # a stream span timed by those it holds: no events, Python only


@dataclass(frozen=True)
class TraceCost:
    """The main thread's time in the recorder during a traced run, estimated from its spans and their cost here."""

    host_spans: int
    stream_spans: int
    chained: int  # of the stream spans
    groups: int
    costs: SpanCosts
    loop_seconds: float  # the untraced loop's median in the same call: what the recorder's time adds to

    @property
    def seconds(self) -> float:
        costs, unchained = self.costs, self.stream_spans - self.chained
        spent = self.host_spans * costs.host + unchained * costs.stream + self.chained * costs.chained + self.groups * costs.group
        return spent / 1e6

    def __str__(self) -> str:
        costs = self.costs
        return (
            f"{self.host_spans} host spans x {costs.host:.2f} us + {self.stream_spans - self.chained} stream spans x "
            f"{costs.stream:.2f} us + {self.chained} chained x {costs.chained:.2f} us + {self.groups} groups x {costs.group:.2f} us"
            f" = {self.seconds * 1e3:.1f} ms, {self.seconds / self.loop_seconds:.1%} of the untraced loop's median, "
            f"{self.loop_seconds:.3f} s"
        )


def span_costs(cuda: bool, spans: int = 64 * 320) -> SpanCosts:
    """What each kind of span costs on this machine: the least of three rounds of `spans`. Stream spans are recorded as
    the runs record them, and settled every 64 (a batch's worth); a group holds two spans, or one."""
    from cnnlab.trace.recorder import Recorder

    recorder = Recorder()

    def microseconds(record: Callable[[], None], settle: Callable[[], None] = lambda: None) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(spans // 64):
                for _ in range(64):
                    record()
                settle()
            best = min(best, (time.perf_counter() - start) / spans * 1e6)
        return best

    def host() -> None:
        with recorder.span("x"):
            pass

    host_cost = microseconds(host)
    if not cuda:
        return SpanCosts(host_cost, 0.0, 0.0, 0.0)
    import pycuda.autoinit  # noqa: F401  (a context for the stream)
    import pycuda.driver as driver

    stream = driver.Stream()

    def stream_span() -> None:
        with recorder.span("x", stream):
            pass

    def group(held: int) -> None:
        with recorder.group("g", stream):
            for _ in range(held):
                stream_span()

    settle = partial(recorder.settle, stream)
    single, one, two = microseconds(stream_span, settle), microseconds(partial(group, 1), settle), microseconds(partial(group, 2), settle)
    return SpanCosts(host_cost, single, two - one, one - single)


def trace_cost(path: Path, cuda: bool, loop_seconds: float) -> TraceCost:
    """The cost of the trace at `path` to its run's main thread (see TraceCost). A group starts where the first span it
    holds starts: of the stream spans that start at one time on one stream, all but the innermost are groups. A stream
    span records two events, or one where it starts at the end of the span before: the trace counts its events."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        trace = json.load(file)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    host = sum(1 for event in spans if names.get((event["pid"], event["tid"])) == "main loop")
    starts = Counter((event["tid"], event["ts"]) for event in spans if names.get((event["pid"], event["tid"]), "").startswith("stream "))
    groups = sum(starts.values()) - len(starts)
    chained = 2 * len(starts) - trace["otherData"].get("stream_events", 2 * len(starts))
    return TraceCost(host, len(starts), chained, groups, span_costs(cuda), loop_seconds)


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
        plain, traced = paired_loops(args.mode, args.cnn, args.input, args.runs, out)
        command = [sys.executable, "-m", "cnnlab", args.mode, args.cnn, args.input, str(out), "--trace", args.trace]
        subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
    ratios = [b / a for a, b in zip(plain, traced)]
    low, high = median_interval(ratios)
    print(f"without --trace   loop s {spread(plain)}")
    print(f"with --trace      loop s {spread(traced)}")
    print(f"with/without      {spread(ratios)}   ({args.runs} pairs, {args.mode}; the median's 90% interval {low:.3f}..{high:.3f})")
    print(f"recorder's time   {trace_cost(Path(args.trace), args.mode == 'cuda', statistics.median(plain))}")


if __name__ == "__main__":
    main()
