"""BackendOwner: a backend made, used and closed on a thread of its own, for the GPUs of a MultiGpuBackend
(cuda/multi_gpu.py) and the backends of Dask's workers (dask_forward.py).

Not in run.py, beside the Prefetcher, the run's other thread: run.py imports cuda/multi_gpu.py (for --devices), and
multi_gpu.py importing run.py back would close a circle. It imports only what a backend is (backend.py).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cnnlab.backend import Backend
from cnnlab.interrupts import join_through_signals

if TYPE_CHECKING:
    from concurrent.futures import Future


class BackendOwner:
    """A backend made (at once), used and closed on a thread of its own, named `name`: a CudaContext computes and closes
    on the thread that made it (cuda/context.py says the rule), and a backend computes one call at a time, whatever
    threads submit them."""

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
            self._made.set_exception(error)
        try:
            while (call := self._calls.get()) is not None:
                work, done = call
                try:
                    done.set_result(work(self._made.result()))
                except BaseException as error:
                    done.set_exception(error)
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
