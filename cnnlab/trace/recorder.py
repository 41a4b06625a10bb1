"""A run's spans as Chrome trace events (the JSON that Perfetto and chrome://tracing open): a complete event ("ph": "X",
ts and dur in microseconds) per span, a track per host thread and per CUDA stream, and the threads' names as metadata
events ("ph": "M").

Host spans are timed with time.perf_counter_ns (CLOCK_MONOTONIC on Linux, the clock the native parser's spans are
timed with). Stream spans are pairs of CUDA events recorded on the stream around the work queued meanwhile; settle()
places them on the host's clock through an anchor: an event recorded on the idle stream and waited for, taken to have
happened midway between its record and the end of the wait. Where the `nvtx` package imports, every span is also an
NVTX range of the same name on its thread, for Nsight Systems.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

HOST_PID, GPU_PID = 1, 2  # the trace's two processes: the host's threads and the GPU's streams
MAIN_THREAD = "main loop"  # the main thread's track: the loop, compute() and the writes


def _import_nvtx() -> Any:
    try:
        import nvtx
    except ImportError:
        return None
    return nvtx


@dataclass
class _StreamTrack:
    """A stream's track: its anchor (an event and the host's time of it, ns) and its spans not yet placed."""

    tid: int
    stream: Any  # held: a stream freed and another made at its address must not take this track
    anchor: Any
    anchor_ns: int
    # name, args, start and end events (a group's: the index of its first span in this list, and None)
    pending: list[tuple[str, dict[str, Any], Any, Any]] = field(default_factory=list)
    open: list[dict[str, Any]] = field(default_factory=list)  # the args of the stream spans open now, outermost first
    # Events settled and free again (of this stream's context): making one costs more than recording it.
    free: list[Any] = field(default_factory=list)


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
        recorder.add(self._name, HOST_PID, recorder.thread_track(), self._start, end, self._args)


class _StreamSpan:
    """A span of the work queued on a stream while it is open: an event recorded there as it opens and as it closes;
    or, for a group, none: its time is that of the spans it holds, from the first's start to the last's end."""

    __slots__ = ("_recorder", "_name", "_args", "_stream", "_track", "_start", "_first", "_group")

    def __init__(self, recorder: Recorder, name: str, stream: Any, args: dict[str, Any], group: bool = False) -> None:
        self._recorder, self._name, self._stream, self._args, self._group = recorder, name, stream, args, group

    # The run's main thread opens a few of these a chunk: they are kept to the calls that must happen now (the events'
    # records); the events' times are read in settle(), and the trace's JSON objects made only when it is written.
    def __enter__(self) -> None:
        recorder = self._recorder
        if recorder.nvtx is not None:
            recorder.nvtx.push_range(self._name)
        track = self._track = recorder._streams.get(id(self._stream)) or recorder.stream_track(self._stream)
        if track.open:  # a kernel inside "kernels" names its chunk as the span around it does (the same dict: never changed)
            self._args = {**track.open[-1], **self._args} if self._args else track.open[-1]
        track.open.append(self._args)
        if self._group:
            self._first = len(track.pending)  # its spans are those pending from here on
        else:
            self._start = start = track.free.pop() if track.free else recorder.driver.Event()
            start.record(self._stream)

    def __exit__(self, *exc_info: object) -> None:
        track = self._track
        if self._group:
            track.pending.append((self._name, self._args, self._first, None))
        else:
            end = track.free.pop() if track.free else self._recorder.driver.Event()
            end.record(self._stream)
            track.pending.append((self._name, self._args, self._start, end))
        track.open.pop()
        if self._recorder.nvtx is not None:
            self._recorder.nvtx.pop_range()


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


def _metadata(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    """A metadata event: a process's or a thread's name, or a track's place."""
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


class Recorder:
    """The spans of a run, from any thread (list.append is atomic under the GIL), written as JSON by write()."""

    enabled = True

    def __init__(self) -> None:
        self.spans: list[tuple[str, int, int, float, float, dict[str, Any]]] = []  # name, pid, tid, start and end ns, args
        self.metadata: dict[str, Any] = {}  # the run's figures, as the trace's otherData
        self.nvtx = _import_nvtx()
        self.driver: Any = None  # pycuda.driver, once a stream span needs events
        self._names: dict[tuple[int, int], str] = {}
        self._naming = threading.Lock()
        self._streams: dict[int, _StreamTrack] = {}
        self._origin = time.perf_counter_ns()  # the trace's time 0
        self.main_tid = threading.get_native_id()

    def span(self, name: str, stream: Any = None, **args: Any) -> _HostSpan | _StreamSpan:
        return _HostSpan(self, name, args) if stream is None else _StreamSpan(self, name, stream, args)

    def group(self, name: str, stream: Any, **args: Any) -> _StreamSpan:
        return _StreamSpan(self, name, stream, args, group=True)

    def complete(self, name: str, tid: int, start_ns: int, end_ns: int, thread: str, **args: Any) -> None:
        self._name(HOST_PID, tid, thread)
        self.add(name, HOST_PID, tid, start_ns, end_ns, args)

    def launches(self, module: Any) -> Any:
        return _TracedModule(module, self)

    def add(self, name: str, pid: int, tid: int, start_ns: float, end_ns: float, args: dict[str, Any]) -> None:
        """A complete event, its times given on perf_counter_ns's clock."""
        self.spans.append((name, pid, tid, start_ns, end_ns, args))

    def events(self) -> list[dict[str, Any]]:
        """The spans as the format's complete events ("ph": "X"), ts and dur in microseconds from the trace's time 0."""
        events = []
        for name, pid, tid, start_ns, end_ns, args in self.spans:
            ts, dur = (start_ns - self._origin) / 1000, (end_ns - start_ns) / 1000
            event = {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid}
            if args:
                event["args"] = args
            events.append(event)
        return events

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
        anchor = self.driver.Event()
        before = time.perf_counter_ns()
        anchor.record(stream)
        anchor.synchronize()
        anchor_ns = (before + time.perf_counter_ns()) // 2
        with self._naming:  # several GPUs' threads (--devices) number their streams at once
            track = self._streams[id(stream)] = _StreamTrack(len(self._streams) + 1, stream, anchor, anchor_ns)
            self._names[(GPU_PID, track.tid)] = f"stream {track.tid}"
        return track

    def settle(self, stream: Any) -> None:
        """Place the stream's spans on the host's clock, once their work is done; their events are free again."""
        track = self._streams.get(id(stream))
        if track is None:
            return
        times: list[tuple[float, float] | None] = []  # each pending span's, on the host's clock (None: a group of none)
        last = next((end for *_, end in reversed(track.pending) if end is not None), None)
        if last is not None:
            last.synchronize()  # a stream runs its work in order: every event recorded before it has happened too
        anchor, anchor_ns, tid, spans, free = track.anchor, track.anchor_ns, track.tid, self.spans, track.free
        for name, args, start, end in track.pending:
            if end is None:  # a group: from its first span's start to its last one's end
                held = [span for span in times[start:] if span is not None]
                times.append((held[0][0], max(stop for _, stop in held)) if held else None)
            else:
                start_ns = anchor_ns + start.time_since(anchor) * 1e6
                times.append((start_ns, start_ns + end.time_since(start) * 1e6))
                free += (start, end)
            if times[-1] is not None:
                spans.append((name, GPU_PID, tid, *times[-1], args))
        track.pending.clear()

    def trace(self) -> dict[str, Any]:
        """The trace as the format's JSON object: the spans, then the processes' and threads' names."""
        names = [_metadata("process_name", HOST_PID, 0, name=f"cnnlab (pid {os.getpid()})")]
        if self._streams:
            names.append(_metadata("process_name", GPU_PID, 0, name=f"GPU ({self.metadata.get('device')})"))
        for index, ((pid, tid), name) in enumerate(self._names.items()):  # tracks in the order they first appeared
            names += [_metadata("thread_name", pid, tid, name=name), _metadata("thread_sort_index", pid, tid, sort_index=index)]
        return {"traceEvents": self.events() + names, "displayTimeUnit": "ms", "otherData": self.metadata}

    def write(self, out: Any, compress: bool) -> None:
        """Write the trace to the binary stream `out`, gzip-compressed where `compress`."""
        import json

        text = json.dumps(self.trace(), separators=(",", ":")).encode()
        if compress:
            import gzip

            text = gzip.compress(text, mtime=0)
        out.write(text)
