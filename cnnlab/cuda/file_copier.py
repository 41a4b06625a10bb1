"""A file's bytes copied straight into device memory: what a CUDA context's image and text buffers are filled with.

Each of the copier's threads has two small page-locked staging buffers (KvikIO calls them bounce buffers), A and B,
and a stream of its own. A thread drains a copy's tasks (TASK_BYTES of the file each), taken in turn with the others:

    1. wait for A's last copy to the device to finish (A's `copied` event);
    2. read the next task into A (os.preadv, the GIL released);
    3. queue A's copy to the device buffer on the thread's stream, and record A's `copied` event;
    4. the same with B for the next task, while A's copy runs; and so on, A and B in turn.

A staging buffer is rewritten while it is still in the host's caches, so the DMA engine reads it there and each byte
crosses the host's memory once; a batch-sized page-locked buffer is written out to memory and read back by the DMA
engine, three crossings. A copy's wait() returns once every byte is read and its copy queued, not once the copies have
reached the device: the buffer's `ready` event is recorded after the last of them (on a stream that waits for every
thread's), and the kernels that read the buffer wait for it on the device, so the threads go on to the next copy while
the DMA engine drains this one's last copies. A .npy file's reader starts the next copy before it waits for this one,
so that a thread out of this copy's tasks takes the next one's at once. Each thread makes its own staging buffers, one
page-locked block, as the copier starts it. Sizes and their measurements: docs/gpu.md, "Sizes".
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from cnnlab.constants import IMAGE_BYTES, INPUT_DIM
from cnnlab.cuda.driver import device_errors
from cnnlab.cuda.memory import TASK_BYTES

if TYPE_CHECKING:
    from cnnlab.cuda.driver import DeviceAllocation, Driver
    from cnnlab.cuda.memory import Allocator

MAX_THREADS = 12  # the most copy threads (measured against 8 and 16 on 16 cores); each costs two staging buffers
IN_FLIGHT = 2  # copies under way at once: a thread done with one copy's tasks takes the next copy's at once


class _StagingPair:
    """A thread's own while it drains a copy: two page-locked staging buffers (`block`, halved), a stream, an event per
    buffer (its copy is done), and IN_FLIGHT events that its drains take in turn, each recorded after a drain's last
    task (what the copy's `ready` event waits for)."""

    def __init__(self, driver: Driver, block: np.ndarray) -> None:
        half = len(block) // 2
        self.buffers = [block[:half], block[half:]]
        self.stream = driver.Stream()
        no_timing = driver.event_flags.DISABLE_TIMING
        self.copied = [driver.Event(no_timing) for _ in range(2)]
        self.queued = [driver.Event(no_timing) for _ in range(IN_FLIGHT)]
        self.drains = 0


@dataclass(frozen=True)
class _Copy:
    """`nbytes` of the file `fd` from `offset`, to device address `address`."""

    fd: int
    offset: int
    nbytes: int
    address: int


class Copying:
    """A copy under way (FileCopier.start): wait() ends it, once; stop() before it makes the threads take no more tasks
    (the count then says nothing)."""

    def __init__(self, finish: Callable[[], int], halt: threading.Event) -> None:
        self._finish, self._halt = finish, halt

    def stop(self) -> None:
        self._halt.set()

    def wait(self) -> int:
        return self._finish()


def staging_shape(threads: int, job_bytes: int) -> tuple[int, int]:
    """The copier's threads and task bytes for copies of up to `job_bytes`: tasks of TASK_BYTES, or of the job's whole
    pages where it is smaller, and a thread a task, up to `threads` and MAX_THREADS."""
    task = min(TASK_BYTES, -(-max(job_bytes, 1) // 4096) * 4096)
    return max(1, min(threads, MAX_THREADS, -(-job_bytes // task))), task


class FileCopier:
    """Copies byte ranges of files into device memory on `threads` threads (at most MAX_THREADS), with the context
    made current on each by `current`; its buffers are `memory`'s, given back when the context frees its memory. Up to
    IN_FLIGHT copies at once (a run's reader thread asks): the threads' staging buffers serve every copy. Made with the
    context current (its join stream is the context's).

    Sized to the job, `job_bytes` (the most one copy moves): no more threads than it has tasks, and tasks no larger
    than it, so that a small file pins kilobytes, not every thread's two tasks."""

    def __init__(
        self, driver: Driver, memory: Allocator, current: Callable[[], AbstractContextManager[None]], threads: int, job_bytes: int
    ) -> None:
        self._driver, self._current = driver, current
        count, self.task_bytes = staging_shape(threads, job_bytes)
        self._pool = ThreadPoolExecutor(count, thread_name_prefix="cnnlab-copy-in")
        # Every thread started now, the context made current on it for the start, rather than in the first copy's time, its
        # two staging buffers made there: the threads fault their pages in at once, where the driver faults one block's
        # in one after another (docs/gpu.md, "MAX_THREADS"). All wait at the barrier, so that each makes a pair.
        blocks: list[np.ndarray] = []
        started = threading.Barrier(count)
        try:
            starts = [self._pool.submit(self._start_thread, memory, 2 * self.task_bytes, blocks, started) for _ in range(count)]
            wait(starts)
            if failures := [error for start in starts if (error := start.exception()) is not None]:
                raise next((error for error in failures if not isinstance(error, threading.BrokenBarrierError)), failures[0])
            self._pairs = [_StagingPair(driver, block) for block in blocks]
            self._joined = driver.Stream()  # waits for every thread's last copy, then records a buffer's ready event
        except BaseException:
            started.abort()  # no thread waits for others that will not come
            self._pool.shutdown()  # every start ended, so that `blocks` holds every block made
            for block in blocks:
                with suppress(driver.Error):  # a context that failed may fail this too: the first error is the one told
                    memory.free(block)
            raise
        self._free: queue.SimpleQueue[_StagingPair] = queue.SimpleQueue()  # pairs no drain holds
        for pair in self._pairs:
            self._free.put(pair)
        self._under_way = threading.Semaphore(IN_FLIGHT)
        self.round_bytes = count * self.task_bytes  # a task for each thread

    def _start_thread(self, memory: Allocator, pair_bytes: int, blocks: list[np.ndarray], started: threading.Barrier) -> None:
        try:
            with self._current():
                blocks.append(memory.host(pair_bytes, "u1", fault_first=True))
                started.wait()
        except BaseException:
            started.abort()  # the others wait no longer
            raise

    def start(self, fd: int, offset: int, nbytes: int, address: int, ready: Any, stop: threading.Event) -> Copying:
        """Start copying `nbytes` of the file `fd` from `offset` to device address `address`: its threads read and copy
        while the caller does other work. Its Copying's wait() gives the bytes copied, fewer where the file ends first,
        once every byte is read and its copy queued; `ready` is recorded after the last copy, for whatever reads the
        memory to wait for on the device. Where `stop` is set (a run ending) no more tasks are taken and the count says
        nothing: the caller, which set it, drops the buffer's batch; where a thread fails, its error is raised. On both
        ways out every copy queued has reached the device first. Up to IN_FLIGHT copies are under way at once: a
        start() past them waits for the oldest's wait()."""
        tasks = iter(range(0, nbytes, self.task_bytes))
        taking, halt = threading.Lock(), threading.Event()  # halt: a thread failed, or Copying.stop()

        def next_task() -> Iterator[int]:
            while not (stop.is_set() or halt.is_set()):
                with taking:
                    at = next(tasks, None)
                if at is None:
                    return
                yield at

        copy = _Copy(fd, offset, nbytes, address)
        self._under_way.acquire()
        work: list[Future[tuple[int, Any]]] = []
        try:
            for _ in self._pairs:
                work.append(self._pool.submit(self._drain, next_task(), copy, halt))
        except BaseException:  # the pool refused (shut down): those submitted end before the copy is given up
            halt.set()
            wait(work)
            self._under_way.release()
            raise
        return Copying(partial(self._finish, work, ready, stop, halt), halt)

    def _finish(self, work: list[Future[tuple[int, Any]]], ready: Any, stop: threading.Event, halt: threading.Event) -> int:
        try:
            wait(work)  # every drain done before any error is raised: none is still reading into its buffers
            with self._current(), device_errors("cannot copy the file's images to the device"):
                if halt.is_set() or stop.is_set():  # nothing may still be copying into a buffer that is dropped
                    for pair in self._pairs:
                        pair.stream.synchronize()
                else:
                    for future in work:
                        self._joined.wait_for_event(future.result()[1])
                    ready.record(self._joined)
            return min(future.result()[0] for future in work)  # where the file ended on a thread first, else nbytes
        finally:
            self._under_way.release()

    def _drain(self, tasks: Iterator[int], copy: _Copy, halt: threading.Event) -> tuple[int, Any]:
        """Take tasks, with a pair no other drain holds, until none are left or the file ends: where it ended (the
        offset of the first byte missing), else `nbytes`, and the event recorded after the last task's copy. A failure
        sets `halt`, so that the others take no more."""
        end = copy.nbytes
        pair = self._free.get()  # never waits: a drain a thread, and a pair a thread
        try:
            with self._current(), device_errors("cannot copy the file's images to the device"):
                for turn, at in enumerate(tasks):
                    side = turn % 2
                    buffer = pair.buffers[side]
                    pair.copied[side].synchronize()  # this buffer's last copy has left it
                    wanted = min(self.task_bytes, copy.nbytes - at)
                    got = os.preadv(copy.fd, [buffer[:wanted].data], copy.offset + at)
                    if got:
                        self._driver.memcpy_htod_async(copy.address + at, buffer[:got], pair.stream)
                        pair.copied[side].record(pair.stream)
                    if got < wanted:
                        end = at + got
                        break
                # The pair's drains take its events in turn. Where one is recorded again before the copy that took
                # it is waited for (a pair can serve two drains of one copy), the wait is only for more of the same
                # stream's work: a copy's ready event can come later, never sooner.
                queued = pair.queued[pair.drains % IN_FLIGHT]
                pair.drains += 1
                queued.record(pair.stream)
        except BaseException:
            halt.set()
            raise
        finally:
            self._free.put(pair)
        return end, queued

    def close(self) -> None:
        """Stop the threads (the buffers go with the context's memory)."""
        self._pool.shutdown()


class DeviceImageBuffer:
    """Device memory for `capacity` images that kernels read where they lie, and the event they wait for (`ready`: what
    filled the buffer has reached the device): a network.ImageBuffer of one GPU. `copier` fills it from a file; a CSV
    double buffer's image buffers are parsed into instead. `release` gives its memory back (the context's, which knows
    whether it still can); None where its owner frees it (the double buffer)."""

    def __init__(
        self, allocation: DeviceAllocation, capacity: int, driver: Driver, copier: FileCopier,
        current: Callable[[], AbstractContextManager[None]], release: Callable[[DeviceImageBuffer], None] | None = None,
    ) -> None:
        self.allocation, self.capacity, self._driver, self._copier, self._release = allocation, capacity, driver, copier, release
        self._current = current
        self.ready = driver.Event(driver.event_flags.DISABLE_TIMING)

    def start_fill(self, fd: int, offset: int, count: int, stop: threading.Event) -> Copying:
        return self._copier.start(fd, offset, count * IMAGE_BYTES, int(self.allocation), self.ready, stop)

    def host_copy(self, count: int) -> np.ndarray:
        images = np.empty((count, INPUT_DIM, INPUT_DIM))
        with self._current(), device_errors("cannot copy images back from the device"):
            self.ready.synchronize()
            self._driver.memcpy_dtoh(images, self.allocation)
        return images

    def free(self) -> None:
        if self._release is not None:
            self._release(self)
