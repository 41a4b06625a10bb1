"""A run's spans as Chrome trace events (the JSON that Perfetto and chrome://tracing open): a complete event ("ph": "X",
ts and dur in microseconds) per span, a track per host thread and per CUDA stream, and the threads' names as metadata
events ("ph": "M").

Host spans are timed with time.perf_counter_ns (CLOCK_MONOTONIC on Linux, the clock the native parser's spans are
timed with). A stream's spans are marks: CUDA events recorded on the stream, each ending the span that runs from the
mark before it. A span opens with a mark of its own, unless it is queued right after the work the last mark ends (a
group's spans after its first, and a group that follows the stream's last span): recording an event is most of what a
stream span costs the thread that queues the run's work. settle() places the marks on the host's clock through an
anchor: an event recorded on the idle stream and waited for, taken to have happened midway between its record and the
end of the wait (the tightest of a few such waits). Where the `nvtx` package imports, every span is also an NVTX range
of the same name on its thread, for Nsight Systems.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cnnlab.tracing import NO_TRACE, Tracer

HOST_PID, GPU_PID = 1, 2  # the trace's two processes: the host's threads and the GPU's streams
MAIN_THREAD = "main loop"  # the main thread's track: the loop and compute() (the writes too, where not on the writer's)


def _import_nvtx() -> Any:
    try:
        import nvtx
    except ImportError:
        return None
    return nvtx


class _HostSpan:
    """A span of the calling thread's time, appended to the recorder's events as it ends."""

    __slots__ = ("_recorder", "_name", "_args", "_start")

    def __init__(self, recorder: Recorder, name: str, args: dict[str, Any]) -> None:
        self._recorder, self._name, self._args = recorder, name, args

    def __enter__(self) -> None:
        if self._recorder.nvtx is not None:
            self._recorder.nvtx.push_range(self._name)
        self._start = time.perf_counter_ns()

    def __exit__(self, *exc_info: object) -> None:
        end = time.perf_counter_ns()
        recorder = self._recorder
        if recorder.nvtx is not None:
            recorder.nvtx.pop_range()
        recorder.spans.append((self._name, HOST_PID, recorder.thread_track(), self._start, end, self._args))


@dataclass
class _StreamTrack:
    """A stream's track: its anchor (an event and the host's time of it, ns), and its marks not yet placed: each a CUDA
    event recorded on the stream, with the span it ends (None where it starts one). A span runs from the mark before its
    end to its end."""

    tid: int
    stream: Any  # held: a stream freed and another made at its address must not take this track
    anchor: Any
    anchor_ns: int
    driver: Any
    marks: list[tuple[Any, tuple[str, dict[str, Any], _StreamGroup | None] | None]] = field(default_factory=list)
    group: _StreamGroup | None = None  # the group open on this stream
    chained: bool = False  # a span opened now starts at the last mark: it is queued right after the work that mark ends
    # Events settled and free again (of this stream's context): making one costs more than recording it.
    free: list[Any] = field(default_factory=list)

    def mark(self, ends: tuple[str, dict[str, Any], _StreamGroup | None] | None) -> None:
        event = self.free.pop() if self.free else self.driver.Event()
        event.record(self.stream)
        self.marks.append((event, ends))


class _StreamSpan:
    """A span of the work queued on a stream while it is open: an event recorded there as it opens (unless it is
    chained to the mark before) and as it closes."""

    __slots__ = ("_track", "_name", "_args", "_nvtx")

    # The run's main thread opens a few of these a chunk: they are kept to the calls that must happen now (the events'
    # records); the events' times are read in settle(), and the trace's JSON objects made only when it is written.
    def __init__(self, track: _StreamTrack, name: str, args: dict[str, Any], nvtx: Any) -> None:
        self._track, self._name, self._args, self._nvtx = track, name, args, nvtx

    def __enter__(self) -> None:
        if self._nvtx is not None:
            self._nvtx.push_range(self._name)
        if not self._track.chained:
            self._track.mark(None)

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        track = self._track
        if exc_type is None:  # a failing run's context may be lost: no event is recorded then, and the span is not kept
            track.mark((self._name, self._args, track.group))
            track.chained = track.group is not None  # a group's next span starts where this one ends
        if self._nvtx is not None:
            self._nvtx.pop_range()


class _StreamGroup:
    """A span of a stream with no events of its own: its time is that of the spans it holds, from the first's start to the
    last's end. What it holds is queued back to back: work between its spans would be counted in the next one. A group
    that `follows` is queued right after the stream's last span, and its first span starts at that one's end."""

    __slots__ = ("_track", "name", "args", "_follows", "_nvtx")

    def __init__(self, track: _StreamTrack, name: str, follows: bool, args: dict[str, Any], nvtx: Any) -> None:
        self._track, self.name, self._follows, self.args, self._nvtx = track, name, follows, args, nvtx

    def __enter__(self) -> None:
        if self._nvtx is not None:
            self._nvtx.push_range(self.name)
        track = self._track
        assert track.group is None, "stream groups do not nest"
        track.group, track.chained = self, self._follows and bool(track.marks)

    def __exit__(self, *exc_info: object) -> None:
        self._track.group, self._track.chained = None, False
        if self._nvtx is not None:
            self._nvtx.pop_range()


class _TracedKernel:
    """A PyCUDA kernel whose launches are stream spans named after it; everything else is the kernel's."""

    def __init__(self, function: Any, name: str, recorder: Recorder) -> None:
        self._function, self._name, self._recorder = function, name, recorder

    def prepared_async_call(self, grid: Any, block: Any, stream: Any, *args: Any, **options: Any) -> None:
        with self._recorder.span(self._name, stream):
            self._function.prepared_async_call(grid, block, stream, *args, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)


class _TracedModule:
    """A PyCUDA module whose get_function gives traced kernels; everything else is the module's."""

    def __init__(self, module: Any, recorder: Recorder) -> None:
        self._module, self._recorder = module, recorder

    def get_function(self, name: str) -> _TracedKernel:
        return _TracedKernel(self._module.get_function(name), name, self._recorder)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


ANCHOR_TRIES = 5  # at most, until a wait is under ANCHOR_WAIT_NS: the tightest wait is kept
ANCHOR_WAIT_NS = 20_000  # an event on an idle stream is waited for in a few microseconds where the thread is not preempted


def _anchor(driver: Any, stream: Any) -> tuple[Any, int]:
    """An event recorded on the idle stream and waited for, and the host's time of it: midway through the tightest of
    a few waits. On a busy host the waiting thread may run again only milliseconds after the event, and a midpoint half
    of that late would place every span of the stream as late."""
    best: tuple[int, Any, int] | None = None  # the wait's ns, its event, its midpoint
    for _ in range(ANCHOR_TRIES):
        event = driver.Event()
        before = time.perf_counter_ns()
        event.record(stream)
        event.synchronize()
        after = time.perf_counter_ns()
        if best is None or after - before < best[0]:
            best = (after - before, event, (before + after) // 2)
        if best[0] < ANCHOR_WAIT_NS:
            break
    assert best is not None
    return best[1], best[2]


def _metadata(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    """A metadata event: a process's or a thread's name, or a track's place."""
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


class Recorder:
    """The spans of a run, from any thread (list.append is atomic under the GIL), written as JSON by write(); each GPU
    chunk's spans too where `chunks` (--trace-chunks), else a span of each batch's work on each stream."""

    enabled = True

    def __init__(self, chunks: bool = False) -> None:
        self.per_chunk: Tracer = self if chunks else NO_TRACE
        self.spans: list[tuple[str, int, int, float, float, dict[str, Any]]] = []  # name, pid, tid, start and end ns, args
        self._pieces: list[tuple[str, np.ndarray, np.ndarray]] = []  # spans timed in native code, as pieces() was given them
        self.metadata: dict[str, Any] = {}  # the run's figures, as the trace's otherData
        self.nvtx = _import_nvtx()
        self.driver: Any = None  # pycuda.driver, once a stream span needs events
        self._names: dict[tuple[int, int], str] = {}
        self._naming = threading.Lock()
        self._streams: dict[int, _StreamTrack] = {}
        self._origin = time.perf_counter_ns()  # the trace's time 0
        self.stream_events = 0  # the CUDA events the stream spans recorded: what they cost the thread that queues work
        self.main_tid = threading.get_native_id()

    def span(self, name: str, stream: Any = None, **args: Any) -> _HostSpan | _StreamSpan:
        if stream is None:
            return _HostSpan(self, name, args)
        return _StreamSpan(self._streams.get(id(stream)) or self.stream_track(stream), name, args, self.nvtx)

    def group(self, name: str, stream: Any, follows: bool = False, **args: Any) -> _StreamGroup:
        return _StreamGroup(self._streams.get(id(stream)) or self.stream_track(stream), name, follows, args, self.nvtx)

    def pieces(self, name: str, times: np.ndarray, nbytes: np.ndarray, thread: str) -> None:
        # Kept as given, made into spans as the trace is written: a step's hundred pieces one by one cost the reader's
        # thread, which hands out the next step's parse, ~2% of cpu mode's loop.
        for worker, tid in sorted({(worker, tid) for worker, tid in times[:, :2].tolist()}):  # tracks in the workers' order
            self._name(HOST_PID, tid, thread.format(worker=worker))
        self._pieces.append((name, times, nbytes))

    def launches(self, module: Any) -> Any:
        return _TracedModule(module, self)

    def clear(self) -> None:
        """Forget the spans recorded so far (a tool's runs in turns, each traced alone); the tracks stay."""
        self.spans.clear()
        self._pieces.clear()

    def events(self) -> list[dict[str, Any]]:
        """The spans as the format's complete events ("ph": "X"), ts and dur in microseconds from the trace's time 0."""
        events = []
        for name, pid, tid, start_ns, end_ns, args in itertools.chain(self.spans, self._native_spans()):
            ts, dur = (start_ns - self._origin) / 1000, (end_ns - start_ns) / 1000
            event = {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid}
            if args:
                event["args"] = args
            events.append(event)
        return events

    def _native_spans(self) -> Iterator[tuple[str, int, int, int, int, dict[str, Any]]]:
        """The spans that pieces() was given, as `spans` holds spans."""
        for name, times, nbytes in self._pieces:
            for (_, tid, start_ns, end_ns), size in zip(times.tolist(), nbytes.tolist()):
                yield name, HOST_PID, tid, start_ns, end_ns, {"bytes": size}

    def thread_track(self) -> int:
        """The calling thread's track (its thread id), named after the thread the first time."""
        tid = threading.get_native_id()
        if (HOST_PID, tid) not in self._names:
            self._name(HOST_PID, tid, MAIN_THREAD if tid == self.main_tid else threading.current_thread().name)
        return tid

    def _name(self, pid: int, tid: int, name: str) -> None:
        with self._naming:
            self._names.setdefault((pid, tid), name)

    def stream_track(self, stream: Any) -> _StreamTrack:
        """The stream's track, made with its anchor the first time (the stream is idle then: nothing was queued on it yet
        in this trace that a span did not wait for)."""
        track = self._streams.get(id(stream))
        if track is not None:
            return track
        if self.driver is None:
            from cnnlab.cuda.driver import import_driver

            self.driver = import_driver()
        anchor, anchor_ns = _anchor(self.driver, stream)
        with self._naming:  # several GPUs' threads (--devices) number their streams at once
            track = self._streams[id(stream)] = _StreamTrack(len(self._streams) + 1, stream, anchor, anchor_ns, self.driver)
            self._names[(GPU_PID, track.tid)] = f"stream {track.tid}"
        return track

    def settle(self, stream: Any) -> None:
        """Place the stream's spans on the host's clock, once their work is done; their events are free again."""
        track = self._streams.get(id(stream))
        if track is None or not track.marks:
            return
        track.marks[-1][0].synchronize()  # a stream runs its work in order: every event recorded before it has happened too
        anchor, anchor_ns, tid, spans = track.anchor, track.anchor_ns, track.tid, self.spans
        start_ns = 0.0  # the last mark's time: where the next span starts
        group: _StreamGroup | None = None  # the group of the span placed last, and its start and end
        group_ns = group_end_ns = 0.0
        for event, ends in track.marks:
            at_ns = anchor_ns + event.time_since(anchor) * 1e6
            if ends is not None:
                name, args, held_by = ends
                if held_by is not group:
                    if group is not None:
                        spans.append((group.name, GPU_PID, tid, group_ns, group_end_ns, group.args))
                    group, group_ns = held_by, start_ns
                if held_by is not None:  # a kernel inside "kernels" names its chunk as the group does
                    args = {**held_by.args, **args} if args else held_by.args
                spans.append((name, GPU_PID, tid, start_ns, at_ns, args))
                group_end_ns = at_ns
            start_ns = at_ns
        if group is not None:
            spans.append((group.name, GPU_PID, tid, group_ns, group_end_ns, group.args))
        self.stream_events += len(track.marks)
        track.free += [event for event, _ in track.marks]
        track.marks.clear()
        track.chained = False

    def trace(self) -> dict[str, Any]:
        """The trace as the format's JSON object: the spans, then the processes' and threads' names."""
        names = [_metadata("process_name", HOST_PID, 0, name=f"cnnlab (pid {os.getpid()})")]
        if self._streams:
            names.append(_metadata("process_name", GPU_PID, 0, name=f"GPU ({self.metadata.get('device')})"))
        for index, ((pid, tid), name) in enumerate(self._names.items()):  # tracks in the order they first appeared
            names += [_metadata("thread_name", pid, tid, name=name), _metadata("thread_sort_index", pid, tid, sort_index=index)]
        other = {**self.metadata, "stream_events": self.stream_events} if self._streams else self.metadata
        return {"traceEvents": self.events() + names, "displayTimeUnit": "ms", "otherData": other}

    def write(self, out: Any, compress: bool) -> None:
        """Write the trace to the binary stream `out`, gzip-compressed where `compress`."""
        import json

        text = json.dumps(self.trace(), separators=(",", ":")).encode()
        if compress:
            import gzip

            text = gzip.compress(text, mtime=0)
        out.write(text)
