"""`cnnlab trace-plot`: a --trace file's tracks as a Gantt chart, each resource's busy share of the loop beside it.

A resource is what a kind of span occupies: the file's reads, the host's parse, the forward (cpu's compute(); the GPU's
kernels), the copies each way, the host's reduction, the writes; in a cuda trace without --trace-chunks, the chunk
streams (a stream's batch span: from its first chunk's work queued to its last one's end, so its copies, parse and
kernels and the gaps between them: an upper bound of the stream's work). Its busy share is the union of its spans over the
loop's wall time: the resource near 100% is the bound, and the others wait on it. Where a track's innermost spans carry
bytes, its rate of each kind (bytes over the time its spans of that kind ran) is written beside it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from cnnlab.errors import InputFileError
from cnnlab.files.inputs import open_for_reading, reading
from cnnlab.trace.recorder import GPU_PID, MAIN_THREAD

# Each span's kind, by its name; any other span on a stream is a kernel. Containers (a batch, a chunk's copies and
# kernels together, the loop) are drawn behind what they hold and count toward no resource.
KINDS = {
    "read": "read", "take": "read", "take ahead": "read",
    "parse": "parse", "walk": "parse", "parse piece": "parse",
    "compute": "compute", "kernels": "container",
    "write": "write",
    "copy in": "copy H2D", "copy text in": "copy H2D",
    "copy out": "copy D2H",
    "reduce": "reduce",
    "wait for batch": "wait", "wait for chunk": "wait", "images ready": "wait", "wait for writer": "wait",
    "start reader": "wait", "start writer": "wait",
    "loop": "container", "batch": "container", "read batch": "container", "chunk in": "container", "chunk out": "container",
}  # fmt: skip
COLORS = {
    "read": "tab:blue", "parse": "tab:orange", "compute": "tab:green", "kernel": "tab:red", "write": "tab:purple",
    "copy H2D": "tab:cyan", "copy D2H": "tab:brown", "reduce": "tab:olive", "stream": "tab:pink", "wait": "0.8",
    "container": "0.93",
}  # fmt: skip
RESOURCES = ("read", "parse", "compute", "kernel", "copy H2D", "copy D2H", "reduce", "stream", "write")


@dataclass
class Span:
    """A complete event of the trace: its track's name, kind, start and end (microseconds), bytes where it names them, and
    where it stands among its track's spans (depth: how many hold it; leaf: it holds none)."""

    track: str
    name: str
    kind: str
    start: float
    end: float
    nbytes: int | None
    depth: int = 0
    leaf: bool = True


@dataclass(frozen=True)
class TraceSummary:
    """What a trace says of its loop: the spans, the loop's bounds, each resource's busy share of it, the run's figures."""

    spans: list[Span]
    tracks: list[str]  # in the order they first appear: the main loop, the reader, the parse threads, the streams
    loop_start: float
    loop_end: float
    busy: dict[str, float]  # resource -> the share of the loop's wall time that some span of it was running
    figures: dict[str, Any]  # the run's figures (the trace's otherData)

    def track_rates(self, track: str) -> dict[str, float]:
        """Bytes per second of each kind of the track's innermost spans that name bytes, over the time they ran."""
        rates = {}
        for kind in RESOURCES:
            spans = [span for span in self.spans if span.track == track and span.kind == kind and span.leaf and span.nbytes is not None]
            busy = union_seconds([(span.start, span.end) for span in spans])
            if busy > 0:
                rates[kind] = sum(span.nbytes or 0 for span in spans) / busy
        return rates


def load_trace(path: str | os.PathLike) -> dict[str, Any]:
    """A --trace file (gzip-compressed where its name ends in .gz) as its JSON object."""
    with open_for_reading(path) as file, reading(path):
        data = file.read()
    try:
        if os.fspath(path).endswith(".gz"):
            import gzip

            data = gzip.decompress(data)
        trace = json.loads(data)
    except (OSError, EOFError, ValueError) as error:
        raise InputFileError(path, f"not a trace-event JSON file: {error}") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise InputFileError(path, "not a trace-event JSON file: no traceEvents list")
    spans = 0
    for index, event in enumerate(trace["traceEvents"]):
        if isinstance(event, dict) and event.get("ph") == "X":
            if not all(isinstance(event.get(key), int | float) for key in ("ts", "dur", "pid", "tid")) or "name" not in event:
                raise InputFileError(path, f"event {index} is a span without a name, ts, dur, pid and tid")
            spans += 1
    if not spans:
        raise InputFileError(path, "the trace holds no spans (complete events)")
    return trace


def summarize(trace: dict[str, Any]) -> TraceSummary:
    """The trace's spans by track, and the busy share of each resource over its loop (else over all its spans), of a trace
    load_trace read."""
    events = [event for event in trace["traceEvents"] if isinstance(event, dict)]
    named = [event for event in events if event.get("name") == "thread_name"]
    names = {(event.get("pid"), event.get("tid")): str(event.get("args", {}).get("name")) for event in named}
    spans: list[Span] = []
    tracks: dict[str, None] = {}  # insertion-ordered set
    for event in events:
        if event.get("ph") != "X":
            continue
        track = names.get((event["pid"], event["tid"]), f"thread {event['tid']}")
        tracks.setdefault(track, None)  # threads of one name (a take per step) share a row
        on_stream = event["pid"] == GPU_PID
        kind = "stream" if on_stream and event["name"] == "batch" else KINDS.get(event["name"], "kernel" if on_stream else "other")
        nbytes = event.get("args", {}).get("bytes")
        spans.append(Span(track, event["name"], kind, event["ts"], event["ts"] + event["dur"], nbytes))
    loop = [span for span in spans if span.name == "loop" and span.track == MAIN_THREAD]
    start, end = (loop[0].start, loop[0].end) if loop else (min(s.start for s in spans), max(s.end for s in spans))
    spans = [span for span in spans if span.end >= start and span.start <= end]  # the loop's (not the start-up's)
    _place(spans)
    wall = max(end - start, 1e-9)
    busy = {}
    for resource in RESOURCES:
        intervals = [(max(s.start, start), min(s.end, end)) for s in spans if s.kind == resource and s.end > start and s.start < end]
        if intervals:
            busy[resource] = union_seconds(intervals) * 1e6 / wall
    return TraceSummary(spans, list(tracks), start, end, busy, dict(trace.get("otherData") or {}))


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """The seconds some interval (in microseconds) covers, overlaps counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


def describe(summary: TraceSummary) -> str:
    """The busy shares as lines of text: what trace-plot prints, the busiest first."""
    wall = (summary.loop_end - summary.loop_start) / 1e6
    lines = [f"loop {wall:.3f} s; busy share of it, per resource:"]
    for resource, share in sorted(summary.busy.items(), key=lambda item: -item[1]):
        lines.append(f"  {resource:<9} {share:6.1%}")
    return "\n".join(lines)


def _place(spans: list[Span]) -> None:
    """Set each span's depth among the spans of its track that hold it, and whether it holds any."""
    open_spans: dict[str, list[Span]] = {}
    for span in sorted(spans, key=lambda span: (span.start, -span.end)):
        stack = open_spans.setdefault(span.track, [])
        while stack and stack[-1].end <= span.start:
            stack.pop()
        if stack:
            stack[-1].leaf = False
        span.depth = len(stack)
        stack.append(span)


def draw(summary: TraceSummary, plt: Any) -> Any:
    """The Gantt chart: a row per track (main loop at the top), spans colored by kind and nested ones drawn thinner on
    top; each row's rate where its spans name bytes; the resources' busy shares in the legend. Returns the figure."""
    rows = {track: row for row, track in enumerate(summary.tracks)}
    figure, axes = plt.subplots(figsize=(12, 1.2 + 0.32 * len(rows)))
    origin = summary.loop_start
    bars: dict[tuple[int, str, str], list[tuple[float, float]]] = {}  # (depth, track, kind) -> (start, width) in ms
    for span in summary.spans:
        bars.setdefault((span.depth, span.track, span.kind), []).append(((span.start - origin) / 1e3, (span.end - span.start) / 1e3))
    for (depth, track, kind), ranges in sorted(bars.items(), key=lambda item: item[0][0]):  # the outer first, the inner on top
        height = max(0.25, 0.8 - 0.2 * depth)
        axes.broken_barh(ranges, (rows[track] - height / 2, height), color=COLORS.get(kind, "0.5"), linewidth=0)
    end = (summary.loop_end - origin) / 1e3
    for track, row in rows.items():
        rates = ", ".join(f"{kind} {rate / 1e9:.2f} GB/s" for kind, rate in summary.track_rates(track).items())
        axes.text(end, row, f" {rates}", va="center", fontsize=6)
    axes.set_yticks(range(len(rows)), list(rows), fontsize=7)
    axes.invert_yaxis()
    axes.set_xlim(0, end * 1.15)
    axes.set_xlabel("ms since the loop began")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[kind]) for kind in COLORS]
    labels = [f"{kind} ({summary.busy[kind]:.0%} busy)" if kind in summary.busy else kind for kind in COLORS]
    axes.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    figures = summary.figures
    title = f"cnnlab {figures.get('mode', '?')} on {figures.get('device', '?')}: {figures.get('images', '?')} images"
    if "loop_seconds" in figures and "work_seconds" in figures:
        title += f", loop {figures['loop_seconds']:.3f} s, compute() {figures['work_seconds']:.3f} s"
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    return figure
