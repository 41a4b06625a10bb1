"""What --trace costs a run's loop: cnnlab MODE on the same files without and with --trace, in turns (A B B A A B ...), the
loop's seconds of each from --timing-json, and the ratio with/without taken pair by pair.

    python tools/trace_overhead.py MODE CNN_FILE INPUT_FILE --trace PATH [--runs 3] [-- MORE CNNLAB OPTIONS]

PATH (.json or .json.gz) keeps the last traced run's trace, for `cnnlab trace-plot`. Prints each run's loop seconds, the
median (min..max) of each side and of the ratio: docs/trace.md's overhead figures are this (tools/gpu-check.sh trace).

A whole run's loop varies by more than the trace costs it, so the tool also gives the recorder's own time: what a span
costs here (host spans; in cuda mode, stream spans with their CUDA events, recorded, then settled), times the spans of
the last trace that the main thread recorded, over the untraced loop's median. The main thread records every stream
span: where it is the loop's bound (cuda mode, docs/trace.md), all of that time is added to the loop.
"""

from __future__ import annotations

import argparse
import gzip
import json
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


def loop_seconds(command: list[str], timing: Path) -> float:
    subprocess.run([*command, "--timing-json", str(timing)], stdout=subprocess.DEVNULL, check=True)
    return float(json.loads(timing.read_text())["loop_seconds"])


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
    parser.add_argument("--trace", required=True, help="where the last traced run's trace is kept")
    parser.add_argument("--runs", type=int, default=3, help="runs of each, in turns (default 3)")
    # More options for cnnlab MODE come after --: split off here, as argparse would take a positional list too early.
    argv, options = sys.argv[1:], []
    if "--" in argv:
        argv, options = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        command = [sys.executable, "-m", "cnnlab", args.mode, args.cnn, args.input, str(Path(work) / "out.csv"), *options]
        plain, traced = [], []
        run_plain = partial(loop_seconds, command, Path(work) / "plain.json")
        run_traced = partial(loop_seconds, [*command, "--trace", args.trace], Path(work) / "traced.json")
        for run in range(args.runs):  # ABBA: each pair's order the other way from the last, so that order cancels
            if run % 2:
                traced.append(run_traced())
                plain.append(run_plain())
            else:
                plain.append(run_plain())
                traced.append(run_traced())
            print(f"run {run + 1}: loop {plain[-1]:.3f} s without --trace, {traced[-1]:.3f} s with it", flush=True)
    print(f"without --trace   loop s {spread(plain)}")
    print(f"with --trace      loop s {spread(traced)}")
    print(f"with/without      {spread([b / a for a, b in zip(plain, traced)])}   ({args.runs} pairs, {args.mode})")
    print(f"recorder's time   {trace_cost(Path(args.trace), args.mode == 'cuda', statistics.median(plain))}")


if __name__ == "__main__":
    main()
