"""A file's bytes copied straight into device memory: what a CUDA context's device rooms are filled with.

Each of the copier's threads takes the next task (TASK_BYTES of the file) in turn, reads it with os.preadv into one of
its two small page-locked bounce buffers, and queues that buffer's copy to the device on its own stream while it reads
the next task into the other. A bounce buffer is rewritten while it is still in the host's caches, so the DMA engine
reads it there and each byte crosses the host's memory once; a batch-sized page-locked buffer (the copied path's) is
written out to memory and read back by the DMA engine, three crossings. This is KvikIO's way where GPUDirect Storage is
absent, and it measured the same: 43-46 GB/s on 12-16 threads with 4 MiB tasks on the H100 machine (0.85-0.90 of the
bus, KvikIO's read 44.8-46.1 GB/s in the same call), against 7.5-24 GB/s with 1-2 MiB tasks, 35-38 with 16 MiB, and
29-30 GB/s with one bounce buffer a thread (no read while its copy runs).

A copy returns once every byte is read and its copy queued, not once the copies have reached the device: the room's
`ready` event is recorded after the last of them, and the kernels that read the room wait for it on the device. So the
threads go on to the next room while the DMA engine drains this one's last copies (up to two tasks a thread, 96 MiB:
1.8 ms at 54 GB/s, 5% of a 16,384-image room's 33 ms when the threads waited for it). The bounce buffers are one
page-locked block, made with the copier: 128 MiB took 85-88 ms on an H200's host, 32 buffers of 4 MiB 87-120 ms.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from cnnlab.constants import IMAGE_BYTES, INPUT_DIM
from cnnlab.cuda.driver import device_errors

if TYPE_CHECKING:
    from cnnlab.cuda.driver import DeviceAllocation, Driver
    from cnnlab.cuda.memory import Allocator

TASK_BYTES = 4 << 20  # a thread's read and copy at a time (module docstring: the measured sizes)
MAX_THREADS = 12  # on 16 cores: 12 threads 46.0-46.1 GB/s, 16 43.2-44.3, 8 39.2-41.5; each costs two bounce buffers
IN_FLIGHT = 2  # copies under way at once: a thread done with one copy's tasks takes the next copy's at once


class _Bouncer:
    """A thread's share while it drains a copy: two page-locked bounce buffers (`block`, halved), a stream, an event per
    buffer (its copy is done), and IN_FLIGHT events that its drains take in turn, each recorded after a drain's last
    task (what the copy's `ready` event waits for)."""

    def __init__(self, driver: Driver, block: np.ndarray) -> None:
        self.buffers = [block[:TASK_BYTES], block[TASK_BYTES:]]
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


class FileCopier:
    """Copies byte ranges of files into device memory on `threads` threads (at most MAX_THREADS), with the context
    made current on each by `current`; its buffers are `memory`'s, given back when the context frees its memory. Up to
    IN_FLIGHT copies at once (a run's reader thread asks): the threads' bounce buffers serve every copy. Made on the
    context's thread (its join stream is the context's)."""

    def __init__(self, driver: Driver, memory: Allocator, current: Callable[[], AbstractContextManager[None]], threads: int) -> None:
        self._driver, self._current = driver, current
        count = min(threads, MAX_THREADS)
        block = memory.host(count * 2 * TASK_BYTES, "u1")
        self._bouncers = [_Bouncer(driver, block[index * 2 * TASK_BYTES : (index + 1) * 2 * TASK_BYTES]) for index in range(count)]
        self._joined = driver.Stream()  # waits for every thread's last copy, then records a room's ready event
        self._pool = ThreadPoolExecutor(len(self._bouncers), thread_name_prefix="cnnlab-copy-in")
        self._free: queue.SimpleQueue[_Bouncer] = queue.SimpleQueue()  # bouncers no drain holds
        for bouncer in self._bouncers:
            self._free.put(bouncer)
        self._under_way = threading.Semaphore(IN_FLIGHT)
        self.round_bytes = len(self._bouncers) * TASK_BYTES  # a task for each thread
        # Every thread started now, the context made current on it once: on the H100 machine the first copy otherwise
        # spent ~7 ms of the loop starting them. All wait at the barrier, so that each task takes a thread of its own.
        started = threading.Barrier(len(self._bouncers))
        wait([self._pool.submit(self._start_thread, started) for _ in self._bouncers])

    def _start_thread(self, started: threading.Barrier) -> None:
        try:
            with self._current():
                started.wait()
        except BaseException:
            started.abort()  # the others wait no longer
            raise

    def copy(self, fd: int, offset: int, nbytes: int, address: int, ready: Any, stop: threading.Event) -> int:
        """Copy `nbytes` of the file `fd` from `offset` to device address `address`: the bytes copied, fewer where the
        file ends first. Returns once every byte is read and its copy queued; `ready` is recorded after the last copy,
        for whatever reads the memory to wait for on the device. Where `stop` is set (a run ending) no more tasks are
        taken and the count says nothing: the caller, which set it, drops the room's batch; where a thread fails, its
        error is raised. On both ways out every copy queued has reached the device first."""
        return self.start(fd, offset, nbytes, address, ready, stop).wait()

    def start(self, fd: int, offset: int, nbytes: int, address: int, ready: Any, stop: threading.Event) -> Copying:
        """Start a copy(): its threads read and copy while the caller does other work, and its Copying's wait() ends it
        as copy() does. Up to IN_FLIGHT copies are under way at once: a start() past them waits for the oldest's wait()."""
        tasks = iter(range(0, nbytes, TASK_BYTES))
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
            for _ in self._bouncers:
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
                if halt.is_set() or stop.is_set():  # nothing may still be copying into a room that is dropped
                    for bouncer in self._bouncers:
                        bouncer.stream.synchronize()
                else:
                    for future in work:
                        self._joined.wait_for_event(future.result()[1])
                    ready.record(self._joined)
            return min(future.result()[0] for future in work)  # where the file ended on a thread first, else nbytes
        finally:
            self._under_way.release()

    def _drain(self, tasks: Iterator[int], copy: _Copy, halt: threading.Event) -> tuple[int, Any]:
        """Take tasks, with a bouncer no other drain holds, until none are left or the file ends: where it ended (the
        offset of the first byte missing), else `nbytes`, and the event recorded after the last task's copy. A failure
        sets `halt`, so that the others take no more."""
        end = copy.nbytes
        bouncer = self._free.get()  # never waits: a drain a thread, and a bouncer a thread
        try:
            with self._current(), device_errors("cannot copy the file's images to the device"):
                for turn, at in enumerate(tasks):
                    side = turn % 2
                    buffer = bouncer.buffers[side]
                    bouncer.copied[side].synchronize()  # this buffer's last copy has left it
                    wanted = min(TASK_BYTES, copy.nbytes - at)
                    got = os.preadv(copy.fd, [buffer[:wanted].data], copy.offset + at)
                    if got:
                        self._driver.memcpy_htod_async(copy.address + at, buffer[:got], bouncer.stream)
                        bouncer.copied[side].record(bouncer.stream)
                    if got < wanted:
                        end = at + got
                        break
                # The bouncer's drains take its events in turn. Where one is recorded again before the copy that took
                # it is waited for (a bouncer can serve two drains of one copy), the wait is only for more of the same
                # stream's work: a copy's ready event can come later, never sooner.
                queued = bouncer.queued[bouncer.drains % IN_FLIGHT]
                bouncer.drains += 1
                queued.record(bouncer.stream)
        except BaseException:
            halt.set()
            raise
        finally:
            self._free.put(bouncer)
        return end, queued

    def close(self) -> None:
        """Stop the threads (the buffers go with the context's memory)."""
        self._pool.shutdown()


class Room:
    """Device memory for `capacity` images that kernels read where they lie, with the event they wait for (`ready`: what
    fills the room has reached the device)."""

    def __init__(self, allocation: DeviceAllocation, capacity: int, driver: Driver) -> None:
        self.allocation, self.capacity, self._driver = allocation, capacity, driver
        self.ready = driver.Event(driver.event_flags.DISABLE_TIMING)

    def host_copy(self, count: int) -> np.ndarray:
        """On the context's thread (it is current there)."""
        images = np.empty((count, INPUT_DIM, INPUT_DIM))
        with device_errors("cannot copy images back from the device"):
            self.ready.synchronize()
            self._driver.memcpy_dtoh(images, self.allocation)
        return images


class FileRoom(Room):
    """A room the copier fills from a file: a backend.DeviceRoom of a CUDA context."""

    def __init__(
        self, copier: FileCopier, allocation: DeviceAllocation, capacity: int, driver: Driver, release: Callable[[FileRoom], None]
    ) -> None:
        """`release` gives the room's memory back (the context's, which knows whether it still can)."""
        super().__init__(allocation, capacity, driver)
        self._copier, self._release = copier, release

    def fill(self, fd: int, offset: int, count: int, stop: threading.Event) -> int:
        return self._copier.copy(fd, offset, count * IMAGE_BYTES, int(self.allocation), self.ready, stop)

    def free(self) -> None:
        self._release(self)
