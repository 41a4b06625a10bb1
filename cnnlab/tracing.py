"""The Tracer protocol that a run's parts time themselves through (--trace records it: trace/recorder.py), and NO_TRACE,
the tracer of a run without --trace, which records nothing and imports nothing: a span then costs a call."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: the protocol itself needs no numpy
    import numpy as np


class Tracer(Protocol):
    """What a run's parts tell --trace of their time (cnnlab/trace/recorder.py records it). NO_TRACE, where no trace was
    asked for, records nothing and imports nothing: a span then costs a call."""

    enabled: bool

    @property
    def per_chunk(self) -> Tracer:
        """What gets each GPU chunk's spans (its copies, parse and kernels on its stream, the main thread's waits for it):
        the tracer itself where they were asked for (--trace-chunks), else NO_TRACE, and a span of each batch's work on
        each stream instead: a chunk's events cost the thread that queues the work more than the trace may (docs/trace.md)."""
        ...

    def span(self, name: str, stream: Any = None, **args: Any) -> AbstractContextManager[object]:
        """A span named `name` of this thread's time, or, given a CUDA stream, of the work queued on it meanwhile."""
        ...

    def group(self, name: str, stream: Any, follows: bool = False, **args: Any) -> AbstractContextManager[object]:
        """A span of a CUDA stream whose time is that of the stream spans it holds (no events of its own: they cost).
        `follows`: it is queued right after the stream's last span, so its first span starts at that one's end."""
        ...

    def pieces(self, name: str, times: np.ndarray, nbytes: np.ndarray, thread: str) -> None:
        """Spans timed in native code, one a row of `times` (pool worker, thread id, start and end ns on perf_counter_ns's
        clock), each of `nbytes` bytes, on its thread's track (named `thread`.format(worker=...) where it has no name)."""
        ...

    def launches(self, module: Any) -> Any:
        """A CUDA module whose kernels' launches are spans on their streams."""
        ...

    def settle(self, stream: Any) -> None:
        """Place the finished work of `stream`'s spans on the host's clock (while its context is current)."""
        ...


class _NoTrace:
    """The Tracer of a run without --trace."""

    enabled = False
    _nothing = nullcontext()

    @property
    def per_chunk(self) -> Tracer:
        return self

    def span(self, name: str, stream: Any = None, **args: Any) -> AbstractContextManager[object]:
        return self._nothing

    def group(self, name: str, stream: Any, follows: bool = False, **args: Any) -> AbstractContextManager[object]:
        return self._nothing

    def pieces(self, name: str, times: np.ndarray, nbytes: np.ndarray, thread: str) -> None:
        pass

    def launches(self, module: Any) -> Any:
        return module

    def settle(self, stream: Any) -> None:
        pass


NO_TRACE: Tracer = _NoTrace()
