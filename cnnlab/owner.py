"""BackendOwner: a backend made, used and closed on a thread of its own, for the GPUs of a MultiGpuBackend
(cuda/multi_gpu.py); and the process's backends, one a device, each with its owner (`on_device`), which the Python API's
forward() and Dask's workers share, as PyTorch and CuPy keep one context a GPU for the process.

Not in run.py, beside the Prefetcher, the run's other thread: run.py imports cuda/multi_gpu.py (for --devices), and
multi_gpu.py importing run.py back would close a circle. It imports only what a backend is (backend.py).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import queue
import threading
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from cnnlab.backend import Backend
from cnnlab.interrupts import join_through_signals

if TYPE_CHECKING:
    from concurrent.futures import Future

    from cnnlab.network import Cnn

T = TypeVar("T")


class BackendOwner:
    """A backend made (at once), used and closed on a thread of its own, named `name`: a backend computes one call at a
    time, whatever threads submit them, and what a CudaContext's call leaves behind is released by PyCUDA without a
    warning on the thread that made the context (_without_locals)."""

    def __init__(self, make: Callable[[], Backend], name: str) -> None:
        # Imported here, as in submit(): a run on the CPU from a mapped .npy file owns no backend on a thread, and its
        # start-up then imports no concurrent.futures (nor logging, which that imports).
        from concurrent.futures import Future

        self._calls: queue.SimpleQueue[tuple[Callable[[Backend], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._made: Future[Backend] = Future()
        # A daemon: the interpreter's exit does not wait for it, and it still runs when atexit closes it.
        self._thread = threading.Thread(target=self._serve, args=(make,), name=name, daemon=True)
        self._thread.start()

    def _serve(self, make: Callable[[], Backend]) -> None:
        try:
            self._made.set_result(make())
        except BaseException as error:  # backend() and every call raise it, until close()
            self._made.set_exception(_without_locals(error))
        try:
            while (call := self._calls.get()) is not None:
                work, done = call
                try:
                    done.set_result(work(self._made.result()))
                except BaseException as error:
                    done.set_exception(_without_locals(error))
        finally:
            if self._made.exception() is None:
                self._made.result().close()

    @property
    def failed(self) -> bool:
        """Whether making the backend failed (False while it is being made), so that a caller can make another."""
        return self._made.done() and self._made.exception() is not None

    def backend(self) -> Backend:
        """The backend, once made (its error, where making it failed), for what may run on any thread."""
        return self._made.result()

    def submit(self, work: Callable[[Backend], Any]) -> Future[Any]:
        """`work(backend)` run on the backend's thread, after every call submitted before it."""
        from concurrent.futures import Future

        done: Future[Any] = Future()
        self._calls.put((work, done))
        return done

    def call(self, work: Callable[[Backend], Any]) -> Any:
        """`work(backend)`'s result, run on the backend's thread, for a caller with nothing to do meanwhile."""
        return self.submit(work).result()

    def close(self) -> None:
        """Close the backend on its thread once the calls already submitted are done, and wait for it even through a
        second signal: the backend (a GPU's context) is always closed."""
        self._calls.put(None)
        join_through_signals(self._thread)


def _without_locals(error: BaseException) -> BaseException:
    """`error`, the frames of its traceback (and of the errors it was raised from or during) let go of their locals here,
    on the backend's thread: what a failed call's frames held (a GPU's event or buffer) is then released on the thread
    whose context made it, not on the thread that drops the error, which PyCUDA refuses with a warning. The traceback's
    lines stay; the frame still running (this thread's loop) keeps its own."""
    errors: list[BaseException | None] = [error]
    seen: set[int] = set()
    while errors:
        link = errors.pop()
        if link is not None and id(link) not in seen:
            seen.add(id(link))
            traceback.clear_frames(link.__traceback__)
            errors += [link.__cause__, link.__context__]
    return error


class _Kept:
    """A backend the process keeps for a device, and the token of the CNN it holds (None: none known)."""

    def __init__(self, owner: BackendOwner, token: object) -> None:
        """`token`: that of the CNN the backend is made with, its first job's."""
        self.owner, self.token = owner, token

    def run(self, cnn: Cnn, token: object, job: Callable[[Backend], Any], backend: Backend) -> Any:
        """`job(backend)` with `cnn` loaded first, unless the backend already holds the CNN of `token` (None: load it)."""
        if token is None or token != self.token:
            self.token = None  # until the load is done: a load that fails leaves no CNN known
            backend.load_cnn(cnn)
            self.token = token
        return job(backend)


def held_in_a_forked_child(disown: Callable[[], Iterable[T]]) -> list[T]:
    """The list a child this process forks keeps what `disown()` takes (in the child, as it starts) of what the parent
    made: never used, closed or freed there, not even by the interpreter's end, for its freeing would call the parent's
    driver or join the parent's threads, which the child has not."""
    held: list[T] = []
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(held))  # a reference never given back
    os.register_at_fork(after_in_child=lambda: held.extend(disown()))
    return held


# This process's backends, one a device (a GPU's index; None: the CPU), each on its own thread.
_KEPT: dict[int | None, _Kept] = {}
_KEPT_LOCK = threading.Lock()


def _disown_kept() -> list[_Kept]:
    """The backends a forked child's parent kept, taken from the child's own: it has none of their threads."""
    global _KEPT_LOCK
    _KEPT_LOCK = threading.Lock()  # one of the parent's threads may have held it as the process forked
    kept = list(_KEPT.values())
    _KEPT.clear()
    return kept


_LEFT_TO_THE_PARENT = held_in_a_forked_child(_disown_kept)


def on_device(device: int | None, make: Callable[[], Backend], cnn: Cnn, token: object, job: Callable[[Backend], Any]) -> Future[Any]:
    """`job(backend)` on this process's backend for `device`, made by `make` at the first job (and again after one that
    could not be made; where `token` is given, `make` makes it with the CNN of `token`), with `cnn` loaded into it first
    unless it holds the CNN of `token` already (None: a CNN with no token, loaded every time). Jobs from any thread run
    on the backend's own thread, one at a time, in the order given. The backend is kept until release_backends() or the
    process's end."""
    with _KEPT_LOCK:  # submitted under the lock: a job is never queued behind a released backend's close
        kept = _KEPT.get(device)
        if kept is None or kept.owner.failed:
            if kept is not None:
                kept.owner.close()
            kept = _KEPT[device] = _Kept(BackendOwner(make, f"cnnlab-backend-{'cpu' if device is None else device}"), token)
        return kept.owner.submit(lambda backend: kept.run(cnn, token, job, backend))


@atexit.register
def release_backends() -> None:
    """Close every backend the process keeps (a GPU's context, modules and buffers), once the jobs queued on each are
    done; the next job makes its device's backend again. Called as the process ends."""
    with _KEPT_LOCK:
        for kept in _KEPT.values():
            kept.owner.close()
        _KEPT.clear()
