"""--trace and trace-plot end to end: the file follows the trace-event format's rules (phases, fields, timestamps, spans
nested per track), the main loop's spans cover its time, the run's outputs do not change, a failed run leaves no
trace, a run without --trace imports nothing of it; on a GPU, each stream's copies and the rung's kernels."""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import SUBPROCESS_ENV, assert_one_line_error, cnnlab, random_cnn, write_files

# Nanoseconds become microseconds in floats: a span's end, ts + dur, may pass its parent's by a rounding.
ROUNDING_US = 1e-3


def assert_trace_format(trace: dict[str, Any]) -> dict[tuple[int, int], str]:
    """The format's rules for what a Recorder writes: complete (X) events with a name, ts, dur >= 0, pid and tid;
    metadata (M) events naming processes and threads; spans of one track nested, never partly overlapping. Returns the
    tracks' names."""
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    names, spans = {}, {}
    for event in events:
        assert event["ph"] in ("X", "M"), event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int) and isinstance(event["name"], str), event
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "thread_name", "thread_sort_index"), event
            if event["name"] == "thread_name":
                names[(event["pid"], event["tid"])] = event["args"]["name"]
            continue
        assert isinstance(event["ts"], int | float) and isinstance(event["dur"], int | float), event
        assert event["dur"] >= 0, event
        spans.setdefault((event["pid"], event["tid"]), []).append(event)
    for track, events_of_track in spans.items():
        assert track in names, f"track {track} has no thread_name"
        stack: list[float] = []  # the ends of the spans open at this point
        for event in sorted(events_of_track, key=lambda event: (event["ts"], -event["dur"])):
            while stack and stack[-1] <= event["ts"] + ROUNDING_US:
                stack.pop()
            end = event["ts"] + event["dur"]
            assert not stack or end <= stack[-1] + ROUNDING_US, f"{event} overlaps the span around it on {names[track]}"
            stack.append(end)
    return names


def spans_named(trace: dict[str, Any], names: dict[tuple[int, int], str], track: str) -> list[dict[str, Any]]:
    return [event for event in trace["traceEvents"] if event["ph"] == "X" and names.get((event["pid"], event["tid"])) == track]


def coverage(spans: list[dict[str, Any]], within: dict[str, Any]) -> float:
    """The share of span `within` that the spans directly inside it (on its track) cover."""
    start, end = within["ts"], within["ts"] + within["dur"]
    inside = sorted((s["ts"], s["ts"] + s["dur"]) for s in spans if start <= s["ts"] and s["ts"] + s["dur"] <= end + ROUNDING_US)
    covered, reach = 0.0, start
    for begin, finish in inside:
        if finish > reach:
            covered += finish - max(begin, reach)
            reach = finish
    return covered / within["dur"]


@pytest.fixture
def files(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, Path]:
    images = rng.uniform(-10, 10, (300, 100, 100))
    return write_files(tmp_path, random_cnn(rng), images)


def test_cpu_trace_follows_the_format_and_changes_no_output(files: tuple[Path, Path], tmp_path: Path) -> None:
    cnn_path, input_path = files
    plain = cnnlab("cpu", cnn_path, input_path, tmp_path / "plain.csv", "--threads", "2", "--batch", "64")
    assert plain.returncode == 0, plain.stderr
    top = ("start writer", "start reader", "batch", "wait for batch", "wait for writer")  # the main loop's spans, in turn
    for _ in range(3):  # the best of up to three runs: a busy host may take the main thread away between two spans
        traced = cnnlab("cpu", cnn_path, input_path, tmp_path / "traced.csv", "--threads", "2", "--batch", "64",
                        "--trace", tmp_path / "t.json")  # fmt: skip
        assert traced.returncode == 0, traced.stderr
        assert (tmp_path / "traced.csv").read_bytes() == (tmp_path / "plain.csv").read_bytes()
        trace = json.loads((tmp_path / "t.json").read_text())
        names = assert_trace_format(trace)
        main = spans_named(trace, names, "main loop")
        [loop] = [span for span in main if span["name"] == "loop"]
        if (covered := coverage([span for span in main if span["name"] in top], loop)) >= 0.95:
            break
    assert covered >= 0.95
    assert {"main loop", "cnnlab-reader", "cnnlab-writer", "cnnlab-parse-native-1"} <= set(names.values())
    assert trace["otherData"]["mode"] == "cpu" and trace["otherData"]["images"] == 300
    batches = [span for span in main if span["name"] == "batch"]
    assert [span["args"]["batch"] for span in batches] == list(range(5)) and sum(span["args"]["images"] for span in batches) == 300
    assert {"compute", "wait for batch"} <= {span["name"] for span in main}
    # Each batch written on the writer's track, in order, after its compute (a regular file: the writer thread writes it).
    writes = spans_named(trace, names, "cnnlab-writer")
    computes = [span for span in main if span["name"] == "compute"]
    assert [span["args"]["batch"] for span in writes] == list(range(5)) and sum(span["args"]["images"] for span in writes) == 300
    assert all(write["ts"] + ROUNDING_US >= compute["ts"] + compute["dur"] for write, compute in zip(writes, computes))
    # The pieces parsed (the first step's, cut from a take, and the walks' parts) hold the images' text once: from the
    # count line's end to the last row's.
    pieces = [event for event in trace["traceEvents"] if event["name"] == "parse piece"]
    text = input_path.read_bytes()
    assert sum(piece["args"]["bytes"] for piece in pieces) == len(text.rstrip(b"\n")) + 1 - len(text.split(b"\n")[0]) - 1
    assert {"take", "parse", "walk"} <= {span["name"] for span in spans_named(trace, names, "cnnlab-reader")}  # the first step taken
    assert {names[(piece["pid"], piece["tid"])] for piece in pieces} <= {"cnnlab-reader", "cnnlab-parse-native-1"}
    # A native piece's times are on the Python spans' clock: inside the parse or walk of its step, on the reader's track.
    parses = [span for span in spans_named(trace, names, "cnnlab-reader") if span["name"] in ("parse", "walk")]
    assert all(any(p["ts"] <= piece["ts"] + ROUNDING_US and piece["ts"] + piece["dur"] <= p["ts"] + p["dur"] + ROUNDING_US
                   for p in parses) for piece in pieces)  # fmt: skip


def test_without_read_ahead_the_outputs_are_written_on_the_main_thread(files: tuple[Path, Path], tmp_path: Path) -> None:
    """--no-read-ahead keeps the timed work alone: no writer thread writes beside it."""
    result = cnnlab("cpu", *files, tmp_path / "out.csv", "--batch", "64", "--no-read-ahead", "--trace", tmp_path / "t.json")
    assert result.returncode == 0, result.stderr
    trace = json.loads((tmp_path / "t.json").read_text())
    names = assert_trace_format(trace)
    writes = [event for event in trace["traceEvents"] if event["ph"] == "X" and event["name"] == "write"]
    assert len(writes) == 5 and {names[(event["pid"], event["tid"])] for event in writes} == {"main loop"}


def test_gz_name_compresses(files: tuple[Path, Path], tmp_path: Path) -> None:
    result = cnnlab("cpu", *files, tmp_path / "out.csv", "--trace", tmp_path / "t.json.gz")
    assert result.returncode == 0, result.stderr
    assert_trace_format(json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes())))


def test_failed_run_leaves_no_trace(files: tuple[Path, Path], tmp_path: Path) -> None:
    cnn_path, input_path = files
    lines = input_path.read_text().splitlines(keepends=True)
    lines[-5] = "oops," + lines[-5]  # a bad value in the last image: found after most of the run
    input_path.write_text("".join(lines))
    result = cnnlab("cpu", cnn_path, input_path, tmp_path / "out" / "out.csv", "--trace", tmp_path / "out" / "t.json")
    assert "expected 100 comma-separated values" in assert_one_line_error(result)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_without_trace_nothing_of_it_is_imported(files: tuple[Path, Path], tmp_path: Path) -> None:
    command = [sys.executable, "-X", "importtime", "-m", "cnnlab", "cpu", *map(str, files), str(tmp_path / "out.csv")]
    result = subprocess.run(command, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line]
    assert "cnnlab.cli.commands" in imported  # the check sees cnnlab's modules
    assert not [name for name in imported if name.startswith("cnnlab.trace") or name in ("nvtx", "gzip", "json")]


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed: the plot extra")
def test_trace_plot_draws_the_tracks(files: tuple[Path, Path], tmp_path: Path) -> None:
    assert cnnlab("cpu", *files, tmp_path / "out.csv", "--trace", tmp_path / "t.json").returncode == 0
    result = cnnlab("trace-plot", tmp_path / "t.json", tmp_path / "t.png")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "busy share" in result.stdout and "parse" in result.stdout


def test_trace_plot_refuses_what_is_not_a_trace(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text('{"traceEvents": [{"ph": "X", "name": "x"}]}')
    assert "event 0 is a span without" in assert_one_line_error(cnnlab("trace-plot", tmp_path / "t.json", tmp_path / "t.png"))
    assert not (tmp_path / "t.png").exists()


class FakeEvent:
    """A CUDA event on a fake GPU clock (milliseconds, as PyCUDA's time_since gives them): `record` reads the clock."""

    made = 0
    clock_ms = 0.0

    def __init__(self) -> None:
        FakeEvent.made += 1
        self.at_ms: float | None = None

    def record(self, stream: object) -> None:
        self.at_ms = FakeEvent.clock_ms

    def synchronize(self) -> None:
        assert self.at_ms is not None

    def time_since(self, other: FakeEvent) -> float:
        assert self.at_ms is not None and other.at_ms is not None
        return self.at_ms - other.at_ms


class FakeDriver:
    Event = FakeEvent


@pytest.mark.parametrize(
    ("waits_us", "tries", "kept"),
    [([5_000, 3_000, 10, 1], 3, 2),  # the third is under ANCHOR_WAIT_NS: no fourth try
     ([5_000, 3_000, 4_000, 6_000, 7_000, 1], 5, 1)],  # every wait long: five tries, the tightest (the second) kept
)  # fmt: skip
def test_a_stream_s_anchor_is_the_tightest_of_its_waits(
    monkeypatch: pytest.MonkeyPatch, waits_us: list[int], tries: int, kept: int
) -> None:
    """The anchor is taken again while its wait is long (the waiting thread preempted), at most ANCHOR_TRIES times, and
    the tightest is kept: its host time midway through that wait, hand-computed on a fake clock."""
    from types import SimpleNamespace

    from cnnlab.trace import recorder as module

    record_ns = 1_000  # what a record takes on the fake clock
    clock_ns = [0]
    waits_ns = iter(wait * 1_000 for wait in waits_us)

    class WaitedEvent:
        made: list[WaitedEvent] = []

        def __init__(self) -> None:
            WaitedEvent.made.append(self)

        def record(self, stream: object) -> None:
            clock_ns[0] += record_ns

        def synchronize(self) -> None:
            clock_ns[0] += next(waits_ns)

    monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter_ns=lambda: clock_ns[0]))
    event, anchor_ns = module._anchor(SimpleNamespace(Event=WaitedEvent), object())
    assert len(WaitedEvent.made) == tries and event is WaitedEvent.made[kept]
    before = sum(record_ns + wait * 1_000 for wait in waits_us[:kept])
    after = before + record_ns + waits_us[kept] * 1_000
    assert anchor_ns == (before + after) // 2


def test_stream_spans_share_a_group_s_boundaries_and_reuse_settled_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's spans queued back to back: each after the first starts at its predecessor's end (one event a span), and
    a group that follows starts at the stream's last span's end, but never at one settled before it; a group runs from
    its first span's start to its last one's end; settled events are recorded again, not made anew."""
    from cnnlab.trace import recorder as module
    from cnnlab.trace.recorder import GPU_PID, Recorder

    recorder, stream = Recorder(), object()
    recorder.nvtx, recorder.driver = None, FakeDriver()
    monkeypatch.setattr(module, "ANCHOR_TRIES", 1)  # one anchor event, however long a busy host's wait for it
    monkeypatch.setattr(FakeEvent, "made", 0)
    monkeypatch.setattr(FakeEvent, "clock_ms", 1.0)
    track = recorder.stream_track(stream)  # its anchor at 1.0 ms on the fake clock

    def chunk(batch: int) -> None:
        with recorder.span("copy in", stream, bytes=8):
            FakeEvent.clock_ms += 0.5
        FakeEvent.clock_ms += 0.25  # the stream idle: the next span starts later
        with recorder.group("kernels", stream, batch=batch):
            for kernel, ms in (("conv", 1.0), ("dense", 2.0)):
                with recorder.span(kernel, stream):
                    FakeEvent.clock_ms += ms
        copy_out()

    def copy_out() -> None:
        with recorder.group("chunk out", stream, follows=True), recorder.span("copy out", stream):
            FakeEvent.clock_ms += 0.25
        FakeEvent.clock_ms += 0.125  # the stream idle: a group ends with its last span, not where the next span starts

    chunk(0)
    recorder.settle(stream)
    made = FakeEvent.made
    chunk(1)
    recorder.settle(stream)
    # the anchor, then two events for "copy in", three for the two kernels and one for "copy out"
    assert FakeEvent.made == made == 1 + 6
    assert recorder.stream_events == 12
    FakeEvent.clock_ms += 0.5  # the stream idle: a group that follows what has settled starts with an event of its own
    copy_out()
    with recorder.span("copy in", stream, bytes=8):  # settled with the group before it, which ends where its last span did
        FakeEvent.clock_ms += 0.5
    recorder.settle(stream)
    assert recorder.stream_events == 16
    spans = [(name, (start - track.anchor_ns) / 1e6, (end - track.anchor_ns) / 1e6, args) for name, pid, tid, start, end, args
             in recorder.spans if pid == GPU_PID]  # fmt: skip
    assert [(name, pytest.approx(start), pytest.approx(end), args) for name, start, end, args in spans] == [
        ("copy in", 0.0, 0.5, {"bytes": 8}), ("conv", 0.75, 1.75, {"batch": 0}), ("dense", 1.75, 3.75, {"batch": 0}),
        ("kernels", 0.75, 3.75, {"batch": 0}), ("copy out", 3.75, 4.0, {}), ("chunk out", 3.75, 4.0, {}),
        ("copy in", 4.125, 4.625, {"bytes": 8}), ("conv", 4.875, 5.875, {"batch": 1}), ("dense", 5.875, 7.875, {"batch": 1}),
        ("kernels", 4.875, 7.875, {"batch": 1}), ("copy out", 7.875, 8.125, {}), ("chunk out", 7.875, 8.125, {}),
        ("copy out", 8.75, 9.0, {}), ("chunk out", 8.75, 9.0, {}), ("copy in", 9.125, 9.625, {"bytes": 8}),
    ]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("host_parse", [False, True], ids=["gpu-parse", "host-parse"])
def test_cuda_trace_chunks_has_each_stream_s_copies_and_the_rung_s_kernels(
    files: tuple[Path, Path], tmp_path: Path, host_parse: bool
) -> None:
    options = ["--batch", "64", "--kernel", "two_kernels", *(["--host-parse"] if host_parse else [])]
    result = cnnlab("cuda", *files, tmp_path / "out.csv", *options, "--trace", tmp_path / "t.json", "--trace-chunks")
    assert result.returncode == 0, result.stderr
    trace = json.loads((tmp_path / "t.json").read_text())
    names = assert_trace_format(trace)
    streams = sorted(name for name in names.values() if name.startswith("stream "))
    assert streams, names
    gpu = [event for event in trace["traceEvents"] if event["ph"] == "X" and names[(event["pid"], event["tid"])] in streams]
    kinds = {event["name"] for event in gpu}
    assert {"conv_tiled", "dense_coarsened", "kernels", "copy out"} <= kinds
    # Parsed here, the images are copied in a chunk at a time; parsed on the device, the CSV parser's kernels are a span
    # a range of the file, on the double buffer's parse stream, and the chunks read the images where they lie.
    assert ("copy in" if host_parse else "parse text") in kinds
    # A group ("kernels") has no events of its own: it runs from its first span's start to its last one's end.
    for group in (event for event in gpu if event["name"] == "kernels"):
        held = [event for event in gpu if event["tid"] == group["tid"] and event["name"] in ("conv_tiled", "dense_coarsened")
                and (event["args"]["batch"], event["args"]["chunk"]) == (group["args"]["batch"], group["args"]["chunk"])]
        assert len(held) == 2
        first, second = sorted(held, key=lambda event: event["ts"])
        assert second["ts"] == pytest.approx(first["ts"] + first["dur"])  # queued back to back: one event between them
        assert group["ts"] == min(event["ts"] for event in held)
        assert group["ts"] + group["dur"] == pytest.approx(max(event["ts"] + event["dur"] for event in held))
        [copy_out] = [event for event in gpu if event["tid"] == group["tid"] and event["name"] == "copy out"
                      and (event["args"]["batch"], event["args"]["chunk"]) == (group["args"]["batch"], group["args"]["chunk"])]
        assert copy_out["ts"] == pytest.approx(group["ts"] + group["dur"])  # chunk out follows the kernels: no event between
    assert all({"batch", "chunk"} <= event.get("args", {}).keys() for event in gpu if event["name"] in ("conv_tiled", "dense_coarsened"))
    # The events placed on the host's clock: inside the run's loop (its anchor is midway through a wait of microseconds).
    [loop] = [event for event in trace["traceEvents"] if event["name"] == "loop"]
    assert all(loop["ts"] - 100 <= event["ts"] and event["ts"] + event["dur"] <= loop["ts"] + loop["dur"] + 100 for event in gpu)
    reduces = [event for event in trace["traceEvents"] if event["name"] == "reduce"]
    assert reduces and names[(reduces[0]["pid"], reduces[0]["tid"])] == "main loop"


@pytest.mark.gpu
@pytest.mark.parametrize("host_parse", [False, True], ids=["gpu-parse", "host-parse"])
def test_cuda_trace_has_a_span_of_each_batch_on_each_stream_and_no_chunk_s(
    files: tuple[Path, Path], tmp_path: Path, host_parse: bool
) -> None:
    """Without --trace-chunks a stream has a span of each batch's work on it (two events: its start and end), inside the
    batch's compute(), its images adding up to the batch's; no chunk's spans on the streams or the main thread."""
    options = ["--batch", "64", *(["--host-parse"] if host_parse else [])]
    result = cnnlab("cuda", *files, tmp_path / "out.csv", *options, "--trace", tmp_path / "t.json")
    assert result.returncode == 0, result.stderr
    plain = cnnlab("cuda", *files, tmp_path / "plain.csv", *options)
    assert plain.returncode == 0, plain.stderr
    assert (tmp_path / "out.csv").read_bytes() == (tmp_path / "plain.csv").read_bytes()
    trace = json.loads((tmp_path / "t.json").read_text())
    names = assert_trace_format(trace)
    gpu = [event for event in trace["traceEvents"] if event["ph"] == "X" and names[(event["pid"], event["tid"])].startswith("stream ")]
    assert gpu and {event["name"] for event in gpu} == ({"batch"} if host_parse else {"batch", "parse text"})
    assert trace["otherData"]["stream_events"] == 2 * len(gpu)
    computes = [span for span in spans_named(trace, names, "main loop") if span["name"] == "compute"]
    # 64 images a batch, the last 44; parsed on the device, a batch is the whole images of a range of ~64 images' text.
    assert sum(compute["args"]["images"] for compute in computes) == 300 and (len(computes) == 5 or not host_parse)
    for number, compute in enumerate(computes):
        spans = [event for event in gpu if event["name"] == "batch" and event["args"]["batch"] == number]
        assert len({event["tid"] for event in spans}) == len(spans) >= 1  # one a stream that got chunks
        assert sum(event["args"]["images"] for event in spans) == compute["args"]["images"]
        early = max(compute["ts"] - event["ts"] for event in spans)  # µs before compute() began, at most
        late = max(event["ts"] + event["dur"] - compute["ts"] - compute["dur"] for event in spans)  # µs after it ended
        assert early <= ROUNDING_US and late <= 100, f"batch {number}: a span {early:.1f} µs early, {late:.1f} µs late: {spans}"
    assert not {"images ready", "wait for chunk", "reduce"} & {event["name"] for event in trace["traceEvents"]}
    from cnnlab.trace.plot import summarize

    assert 0 < summarize(trace).busy["stream"] <= 1


def test_trace_chunks_without_a_trace_is_refused(files: tuple[Path, Path], tmp_path: Path) -> None:
    message = assert_one_line_error(cnnlab("cuda", *files, tmp_path / "out.csv", "--trace-chunks"))
    assert message == "cnnlab: --trace-chunks adds to a trace: give --trace FILE too\n"
    assert not (tmp_path / "out.csv").exists()


def test_a_stream_s_batch_spans_are_the_chunk_streams_busy_share_and_the_main_loop_s_are_containers() -> None:
    """trace-plot's resources: on a stream, a batch span (the default cuda trace) is the chunk streams' work; on the main loop, a
    batch holds its compute and counts toward nothing."""
    from cnnlab.trace.plot import summarize
    from cnnlab.trace.recorder import GPU_PID, HOST_PID

    def span(name: str, pid: int, ts: float, dur: float) -> dict[str, Any]:
        return {"name": name, "ph": "X", "pid": pid, "tid": 7, "ts": ts, "dur": dur}

    names = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": 7, "args": {"name": name}}
             for pid, name in ((HOST_PID, "main loop"), (GPU_PID, "stream 1"))]  # fmt: skip
    events = [span("loop", HOST_PID, 0, 100), span("batch", HOST_PID, 0, 60), span("compute", HOST_PID, 10, 40),
              span("batch", GPU_PID, 20, 25), span("batch", GPU_PID, 70, 5)]  # fmt: skip
    summary = summarize({"traceEvents": events + names})
    assert summary.busy == {"compute": pytest.approx(0.4), "stream": pytest.approx(0.3)}
