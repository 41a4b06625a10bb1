"""The copier that fills the GPU's page-locked staging from a caller's host arrays, a task a thread: the same bits as
np.copyto for every kind of array the API takes (no GPU needed: it copies between host arrays); and the file copier's
staging sized to its job, made by its threads, and given back whole where its making fails (a stand-in driver)."""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from cnnlab.cuda.file_copier import FileCopier, staging_shape
from cnnlab.cuda.memory import TASK_BYTES, HostCopier
from cnnlab.generate import random_values

IMAGE = (100, 100)
PART_IMAGES = TASK_BYTES // (np.prod(IMAGE) * 8)


@pytest.fixture
def copier():
    copier = HostCopier(4)
    yield copier
    copier.close()


def kinds(images: np.ndarray) -> dict[str, np.ndarray]:
    """The same values in the layouts and dtypes a caller may pass (those that convert, clipped to what they hold)."""
    held = images.clip(-10, 10)
    return {
        "float64": images,
        "fortran order": np.asfortranarray(images),
        "strided view": np.repeat(images, 2, axis=0)[::2],
        "big-endian": images.astype(">f8"),
        "float32": held.astype(np.float32),
        "int16": (held * 1000).astype(np.int16),
    }


@pytest.mark.parametrize("count", [1, PART_IMAGES - 1, PART_IMAGES, PART_IMAGES + 1, 3 * PART_IMAGES + 7])
def test_copy_is_np_copyto(copier: HostCopier, count: int) -> None:
    images = random_values(np.random.default_rng(), count, *IMAGE)
    images[0, 0, :3] = [-0.0, 5e-324, 1.7e308]  # a negative zero, a subnormal, a value near the largest
    for kind, source in kinds(images).items():
        want = np.empty((count, *IMAGE))
        np.copyto(want, source)
        got = np.full((count, *IMAGE), np.nan)
        copier.copy(got, source)
        assert got.view(np.uint64).tobytes() == want.view(np.uint64).tobytes(), kind


def test_one_thread_copies_in_the_caller() -> None:
    images = random_values(np.random.default_rng(), 2 * PART_IMAGES + 1, *IMAGE)
    before = set(threading.enumerate())  # other copiers' threads (a context the API keeps) may run: none is new
    alone = HostCopier(1)
    got = np.empty_like(images)
    alone.copy(got, images)
    started = [thread.name for thread in set(threading.enumerate()) - before if thread.name.startswith("cnnlab-copy")]
    alone.close()
    assert np.array_equal(got, images)
    assert not started


class SlowPart:
    """A part of a source that numpy converts slowly, in the copying thread (np.copyto calls __array__ there)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        time.sleep(0.05)
        return self.values


class FirstPartFails:
    """A source whose first part cannot be copied (its shape is wrong) and whose other parts are slow to convert."""

    def __init__(self, images: np.ndarray) -> None:
        self.images = images

    def __getitem__(self, part: slice) -> np.ndarray | SlowPart:
        return np.empty((1, 100, 99)) if part.start == 0 else SlowPart(self.images[part])


def test_a_failed_part_raises_once_no_part_still_writes(copier: HostCopier) -> None:
    images = random_values(np.random.default_rng(), 12 * PART_IMAGES, *IMAGE)
    target = np.zeros_like(images)
    with pytest.raises(ValueError):
        copier.copy(target, FirstPartFails(images))
    seen = target.copy()
    time.sleep(0.2)  # a part still running would write now, into a buffer its caller reuses
    assert np.array_equal(target, seen)


@pytest.mark.parametrize(
    ("threads", "job_bytes", "shape"),
    [
        (16, 760_000, (1, 761_856)),  # the default data's CSV file: one thread, its two staging buffers ~1.5 MB in all
        (16, 1, (1, 4096)),
        (16, 5 * TASK_BYTES + 1, (6, TASK_BYTES)),
        (16, 5_600_000_000, (12, TASK_BYTES)),  # a 30,000-image CSV file: every thread the copier may have
        (2, 5_600_000_000, (2, TASK_BYTES)),
    ],
)
def test_the_file_copier_s_staging_is_sized_to_the_job(threads: int, job_bytes: int, shape: tuple[int, int]) -> None:
    """The file copier pins two tasks a thread: a small file's copier pins its own size twice, not 96 MiB."""
    assert staging_shape(threads, job_bytes) == shape


class StandInError(Exception):
    """The stand-in driver's errors, as PyCUDA's driver.Error."""


class StandInDriver:
    """What FileCopier asks of the driver: streams (the `stream_fails`th one made fails) and events."""

    Error = StandInError
    event_flags = SimpleNamespace(DISABLE_TIMING=2)

    def __init__(self, stream_fails: int | None = None) -> None:
        self.streams, self._stream_fails = 0, stream_fails

    def Stream(self) -> object:  # noqa: N802 (PyCUDA's name)
        self.streams += 1
        if self.streams == self._stream_fails:
            raise StandInError("cuStreamCreate failed: out of memory")
        return object()

    def Event(self, flags: int) -> object:  # noqa: N802
        return object()


class StandInMemory:
    """Page-locked memory that is host memory: the `host_fails`th block asked for fails, and freeing fails where
    `free_fails`; records the blocks made, freed, and the threads that made them."""

    def __init__(self, host_fails: int | None = None, free_fails: bool = False) -> None:
        self.made: list[np.ndarray] = []
        self.freed: list[np.ndarray] = []
        self.makers: set[str] = set()
        self._host_fails, self._free_fails, self._lock, self._calls = host_fails, free_fails, threading.Lock(), 0

    def host(self, nbytes: int, dtype: Any, fault_first: bool = False) -> np.ndarray:
        assert fault_first  # each thread faults its own block's pages in
        with self._lock:
            call, self._calls = self._calls, self._calls + 1
            self.makers.add(threading.current_thread().name)
        if call == self._host_fails:
            raise StandInError("cuMemHostRegister failed: out of memory")
        block = np.full(nbytes, 7, np.uint8)
        with self._lock:
            self.made.append(block)
        return block

    def free(self, block: np.ndarray) -> None:
        self.freed.append(block)
        if self._free_fails:
            raise StandInError("cuMemHostUnregister failed: context is destroyed")


def make_copier(driver: StandInDriver, memory: StandInMemory) -> FileCopier:
    return FileCopier(driver, memory, nullcontext, 4, 64 << 20)  # type: ignore[arg-type]


def test_the_file_copier_s_threads_make_a_staging_block_each() -> None:
    memory = StandInMemory()
    copier = make_copier(StandInDriver(), memory)
    try:
        assert len(memory.made) == 4 and all(block.nbytes == 2 * TASK_BYTES for block in memory.made)
        assert len(memory.makers) == 4 and all(name.startswith("cnnlab-copy-in") for name in memory.makers)
        assert copier.round_bytes == 4 * TASK_BYTES and not memory.freed
    finally:
        copier.close()


@pytest.mark.parametrize("failing", [*(("host", call) for call in range(4)), ("stream", 2), ("stream", 5)])
@pytest.mark.parametrize("free_fails", [False, True])
def test_a_file_copier_that_cannot_be_made_raises_the_first_error_and_leaves_nothing(failing: tuple[str, int], free_fails: bool) -> None:
    """Whichever thread's block cannot be made (the others then see a broken barrier), or whichever stream cannot be made
    once every block is: that error is raised, every block made is given back (each tried where freeing fails too), and
    no thread of the copier's is left."""
    kind, call = failing
    driver = StandInDriver(stream_fails=call if kind == "stream" else None)
    memory = StandInMemory(host_fails=call if kind == "host" else None, free_fails=free_fails)
    threads = set(threading.enumerate())
    with pytest.raises(StandInError, match="cuMemHostRegister" if kind == "host" else "cuStreamCreate"):
        make_copier(driver, memory)
    assert len(memory.made) == (3 if kind == "host" else 4)
    assert {id(block) for block in memory.freed} == {id(block) for block in memory.made}
    assert set(threading.enumerate()) <= threads
