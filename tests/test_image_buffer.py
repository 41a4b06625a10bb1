"""A regular .npy file's images copied straight into a backend's device memory (its image buffers) rather than through
host buffers: the run's plumbing with a CPU stand-in (an image buffer of host memory filled by os.preadv, in CI), and on a GPU the
copier's bytes, cuda mode's outputs against the copied path's, and a file that ends or holds a NaN under a run.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import warnings
import weakref
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
from helpers import assert_one_line_error, cnnlab, cpu_outputs, random_cnn, write_files

from cnnlab.backend import Batch, DeviceBatch, TextBatching
from cnnlab.constants import IMAGE_BYTES, INPUT_DIM
from cnnlab.cpu.backend import CpuBackend
from cnnlab.cuda.multi_gpu import MultiGpuBackend
from cnnlab.errors import DeviceError, InputFileError
from cnnlab.files.csv_batch import CsvBatch
from cnnlab.generate import random_values, write_cnn_file
from cnnlab.network import Cnn, ImageBatch, OutputBatch
from cnnlab.run import run_network
from cnnlab.run_inputs import open_input


@dataclass(frozen=True)
class Done:
    """A fill done as it started, its wait told to the buffer's events."""

    got: int
    buffer: HostImageBuffer

    def wait(self) -> int:
        self.buffer.events.append(("wait", self.buffer))
        return self.got


class HostImageBuffer:
    """An image buffer's place taken by host memory: filled by one os.preadv, as the copier's threads fill a GPU's."""

    def __init__(self, capacity: int, cut: Path | None, events: list[tuple[str, HostImageBuffer]]) -> None:
        """`events`: its backend's, where each fill, wait, compute and free is told in turn."""
        self.capacity, self.images, self._cut, self.fills = capacity, np.full((capacity, INPUT_DIM, INPUT_DIM), np.pi), cut, 0
        self.freed, self.events = False, events

    def start_fill(self, fd: int, offset: int, count: int, stop: threading.Event) -> Done:
        self.fills += 1
        self.events.append(("fill", self))
        if self._cut is not None and self.fills == 2:  # another program cuts the file short under the run
            os.truncate(self._cut, offset + IMAGE_BYTES // 2)
        return Done(os.preadv(fd, [self.images[:count].data], offset), self)

    def host_copy(self, count: int) -> np.ndarray:
        return self.images[:count].copy()

    def free(self) -> None:
        self.events.append(("free", self))
        self.freed = True


class StandIn(CpuBackend):
    """A backend with a device: its image buffers are host memory, and compute() takes their batches."""

    reads_in_place = False

    def __init__(self, cnn: Cnn, cut: Path | None = None, buffers_made: int | None = None) -> None:
        """`buffers_made`: how many image buffers it makes before the next cannot be (as device memory runs out), None: no end."""
        super().__init__(cnn, batch_size=16, threads=1)
        self.buffers: list[HostImageBuffer] = []
        self.events: list[tuple[str, HostImageBuffer]] = []  # its buffers' fills, waits, computes and frees, in turn
        self._cut, self._buffers_made = cut, buffers_made

    def image_buffer(self, count: int) -> HostImageBuffer:  # type: ignore[override]
        if len(self.buffers) == self._buffers_made:
            raise DeviceError("cannot make an image buffer on the device for a batch of the file's images: out of memory")
        # a buffer of at most 16 images, as a GPU's of its own size
        self.buffers.append(HostImageBuffer(min(count, 16), self._cut, self.events))
        return self.buffers[-1]

    def compute(self, batch: Batch, check_finite: bool = False) -> OutputBatch:
        assert isinstance(batch, DeviceBatch) and isinstance(batch.buffer, HostImageBuffer)
        self.events.append(("compute", batch.buffer))
        return super().compute(ImageBatch(batch.buffer.images[: len(batch)]), check_finite)


def save(path: Path, images: np.ndarray) -> Path:
    np.save(path, images)
    return path


@pytest.mark.parametrize("count", [1, 16, 17, 50])
def test_a_npy_file_goes_through_image_buffers_with_the_outputs_of_the_cpu(tmp_path: Path, rng: np.random.Generator, count: int) -> None:
    cnn, images = random_cnn(rng), random_values(rng, count, INPUT_DIM, INPUT_DIM)
    with StandIn(cnn) as backend:
        stats = run_network(backend, save(tmp_path / "in.npy", images), tmp_path / "out.npy")
        buffers = backend.buffers
    assert len(buffers) == 2 and sum(buffer.fills for buffer in buffers) == -(-count // 16)  # a fill a batch
    assert all(buffer.freed for buffer in buffers)  # given back when the run is over
    assert stats.images == count
    assert np.array_equal(np.load(tmp_path / "out.npy").view(np.uint64), cpu_outputs(cnn, images).view(np.uint64))


@pytest.mark.parametrize("process_ends", [False, True])
def test_a_run_whose_process_ends_keeps_its_input_to_the_end(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, process_ends: bool
) -> None:
    """The command line's run leaves its input's buffers to the process's end, unfreed and still referenced (several
    GPUs' buffers dropped on the run's thread would release their events from the wrong one); any other run frees them
    and lets them go."""
    from cnnlab import run

    monkeypatch.setattr(run, "_LEFT_TO_THE_PROCESS_END", [])
    sources: list[weakref.ref[Any]] = []

    def recorded(*args: Any) -> Any:
        source = open_input(*args)
        sources.append(weakref.ref(source))
        return source

    monkeypatch.setattr(run, "open_input", recorded)
    with StandIn(random_cnn(rng)) as backend:
        run_network(backend, save(tmp_path / "in.npy", random_values(rng, 40, INPUT_DIM, INPUT_DIM)), tmp_path / "out.npy",
                    process_ends=process_ends)  # fmt: skip
    gc.collect()
    assert len(sources) == 1 and (sources[0]() is not None) == process_ends
    assert all(buffer.freed != process_ends for buffer in backend.buffers) and len(backend.buffers) == 2


def test_the_next_buffer_fills_while_the_oldest_is_waited_for_and_never_before_its_batch_is_computed(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """Four batches through two buffers: a read starts the next fill before it waits for the oldest, so that the
    copier goes from one fill to the next; a buffer is filled again only once its batch is computed."""
    cnn, images = random_cnn(rng), random_values(rng, 50, INPUT_DIM, INPUT_DIM)
    with StandIn(cnn) as backend:
        run_network(backend, save(tmp_path / "in.npy", images), tmp_path / "out.npy")
    a, b = backend.buffers
    assert backend.events == [
        ("fill", a), ("fill", b), ("wait", a), ("compute", a),
        ("fill", a), ("wait", b), ("compute", b),
        ("fill", b), ("wait", a), ("compute", a),
        ("wait", b), ("compute", b),
        ("free", a), ("free", b),
    ]  # fmt: skip
    assert np.array_equal(np.load(tmp_path / "out.npy").view(np.uint64), cpu_outputs(cnn, images).view(np.uint64))


def waited_before_freed(events: list[tuple[str, HostImageBuffer]]) -> bool:
    """Whether every fill of a buffer was waited for before the buffer was freed."""
    under_way: dict[int, int] = {}
    for event, buffer in events:
        under_way[id(buffer)] = under_way.get(id(buffer), 0) + {"fill": 1, "wait": -1}.get(event, 0)
        if event == "free" and under_way[id(buffer)]:
            return False
    return True


@pytest.mark.parametrize("count, nan_at, under_way", [(40, 37, 0), (50, 20, 1)])
def test_a_nan_in_a_image_buffer_is_named_from_its_host_copy(
    tmp_path: Path, rng: np.random.Generator, count: int, nan_at: int, under_way: int
) -> None:
    """In the last batch, or in the second while the third fills (`under_way` fills left when the run fails): every
    fill is waited for before the buffers are freed."""
    images = random_values(rng, count, INPUT_DIM, INPUT_DIM)
    images[nan_at, 5, 6] = np.nan
    with StandIn(random_cnn(rng)) as backend, pytest.raises(InputFileError, match=f"image {nan_at + 1} holds nan"):
        run_network(backend, save(tmp_path / "in.npy", images), tmp_path / "out.npy")
    assert not (tmp_path / "out.npy").exists()
    events = [event for event, _ in backend.events]
    after_last_compute = events[len(events) - events[::-1].index("compute") :]
    assert after_last_compute.count("wait") == under_way
    assert waited_before_freed(backend.events) and events.count("free") == 2


@dataclass(frozen=True)
class Failed:
    """A fill whose copy failed (a read error on a copier's thread): its wait raises."""

    buffer: HostImageBuffer

    def wait(self) -> int:
        self.buffer.events.append(("wait", self.buffer))
        raise OSError(5, "Input/output error")


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # nor a thread's traceback
def test_a_fill_left_under_way_by_a_failing_run_is_waited_for_and_its_error_goes_unsaid(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """The run fails on its second batch while the third fills, and that fill fails too: the run's error is the one told,
    with no note of the fill's, and both buffers are freed once it is waited for."""
    images = random_values(rng, 50, INPUT_DIM, INPUT_DIM)
    images[20, 5, 6] = np.nan
    original = HostImageBuffer.start_fill

    def third_fails(buffer: HostImageBuffer, *args: Any) -> Done | Failed:
        done = original(buffer, *args)
        return Failed(buffer) if buffer.fills == 2 and buffer is backend.buffers[0] else done

    with StandIn(random_cnn(rng)) as backend, patch.object(HostImageBuffer, "start_fill", third_fails):
        with pytest.raises(InputFileError, match="image 21 holds nan") as raised:
            run_network(backend, save(tmp_path / "in.npy", images), tmp_path / "out.npy")
    assert not getattr(raised.value, "__notes__", None)
    assert waited_before_freed(backend.events) and [event for event, _ in backend.events].count("free") == 2
    assert not (tmp_path / "out.npy").exists()


def test_a_file_cut_short_under_a_run_is_an_error_and_no_output(tmp_path: Path, rng: np.random.Generator) -> None:
    path = save(tmp_path / "in.npy", random_values(rng, 40, INPUT_DIM, INPUT_DIM))
    with StandIn(random_cnn(rng), cut=path) as backend, pytest.raises(InputFileError, match="file ends after 32 of the 40 images"):
        run_network(backend, path, tmp_path / "out.npy")
    assert not (tmp_path / "out.npy").exists()


@pytest.mark.parametrize("gpus, buffers_made", [(1, 0), (1, 1), (2, 0), (2, 1)])
def test_buffers_made_before_one_that_cannot_be_are_freed(tmp_path: Path, rng: np.random.Generator, gpus: int, buffers_made: int) -> None:
    """The last GPU runs out of device memory at its first or second buffer: the run ends in that error, with every buffer
    made before it (the other GPUs' and its own) freed and nothing written."""
    cnn, path = random_cnn(rng), save(tmp_path / "in.npy", random_values(rng, 40, INPUT_DIM, INPUT_DIM))
    makes = [partial(StandIn, cnn) for _ in range(gpus - 1)] + [partial(StandIn, cnn, buffers_made=buffers_made)]
    with MultiGpuBackend(makes) as gpus_backend, pytest.raises(DeviceError, match="out of memory"):
        run_network(gpus_backend, path, tmp_path / "out.npy")
    buffers = [buffer for backend in gpus_backend._backends for buffer in backend.buffers]  # type: ignore[attr-defined]
    assert len(buffers) == gpus * buffers_made + gpus - 1 and all(buffer.freed for buffer in buffers)
    assert not (tmp_path / "out.npy").exists()


class Interrupting(StandIn):
    """A GPU whose first buffer is made as a signal reaches the main thread (a simulated SIGINT, or where `real` a SIGTERM
    from the system), while another GPU is still making its own."""

    real = False

    def image_buffer(self, count: int) -> HostImageBuffer:  # type: ignore[override]
        import _thread

        if self.real:
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            _thread.interrupt_main()
        return super().image_buffer(count)


class Terminating(Interrupting):
    real = True


class Slow(StandIn):
    def image_buffer(self, count: int) -> HostImageBuffer:  # type: ignore[override]
        time.sleep(0.2)
        return super().image_buffer(count)


@pytest.mark.parametrize("handlers", ["python's", "the command line's"])
def test_a_signal_while_the_gpus_make_their_buffers_frees_every_one_made(tmp_path: Path, rng: np.random.Generator, handlers: str) -> None:
    """A signal while several GPUs make their buffers: the run ends in the signal's exception, once every GPU's buffer is
    made and freed (none is left to the context's close). Under Python's own handler (the API) the KeyboardInterrupt
    is caught and each buffer waited for; under the command line's (interrupts.install) the SIGTERM is held until they
    are made and raised as the buffers are freed."""
    from cnnlab import interrupts

    cnn, path = random_cnn(rng), save(tmp_path / "in.npy", random_values(rng, 40, INPUT_DIM, INPUT_DIM))
    first, expected = (Interrupting, KeyboardInterrupt) if handlers == "python's" else (Terminating, interrupts.Terminated)
    previous = {signum: signal.getsignal(signum) for signum in interrupts.SIGNAL_EXITS}
    try:
        if first is Terminating:
            interrupts.install()
        with MultiGpuBackend([partial(first, cnn), partial(Slow, cnn)]) as gpus_backend, pytest.raises(expected):
            run_network(gpus_backend, path, tmp_path / "out.npy")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        interrupts._received.clear()
    buffers = [buffer for backend in gpus_backend._backends for buffer in backend.buffers]  # type: ignore[attr-defined]
    assert len(buffers) == 2 and all(buffer.freed for buffer in buffers)
    assert not (tmp_path / "out.npy").exists()


class FailingFree(StandIn):
    """A GPU that cannot give its buffers back (its context lost, say)."""

    def image_buffer(self, count: int) -> HostImageBuffer:  # type: ignore[override]
        buffer = super().image_buffer(count)
        buffer.free = self._fail  # type: ignore[method-assign]
        return buffer

    def _fail(self) -> None:
        raise DeviceError("cannot free device memory: an illegal memory access was encountered")


def test_a_free_that_fails_after_the_run_failed_leaves_the_run_s_own_error(tmp_path: Path, rng: np.random.Generator) -> None:
    """A run that fails (a NaN in the file) and whose buffers then cannot be freed ends in its own error, the one the
    user needs; a run that succeeds and cannot free them ends in that error."""
    cnn, images = random_cnn(rng), random_values(rng, 40, INPUT_DIM, INPUT_DIM)
    path = save(tmp_path / "in.npy", images)
    with FailingFree(cnn) as backend, pytest.raises(DeviceError, match="cannot free"):
        run_network(backend, path, tmp_path / "out.npy")
    images[30, 5, 5] = np.nan
    save(path, images)
    with FailingFree(cnn) as backend, pytest.raises(InputFileError, match="image 31 holds nan") as raised:
        run_network(backend, path, tmp_path / "out.npy")
    assert any("cannot free device memory" in note for note in raised.value.__notes__)  # kept for a traceback's reader
    assert not (tmp_path / "out.npy").exists()


@pytest.mark.parametrize("gpus", [2, 3])
@pytest.mark.parametrize("count", [1, 5, 40, 97])
def test_several_gpus_buffers_take_the_batch_s_shards_in_order(tmp_path: Path, rng: np.random.Generator, gpus: int, count: int) -> None:
    """MultiGpuBackend over stand-ins: a buffer on each, filled from consecutive parts of the file, the outputs in order."""
    cnn, images = random_cnn(rng), random_values(rng, count, INPUT_DIM, INPUT_DIM)
    with MultiGpuBackend([partial(StandIn, cnn) for _ in range(gpus)]) as gpus_backend:
        stats = run_network(gpus_backend, save(tmp_path / "in.npy", images), tmp_path / "out.npy")
        fills = [buffer.fills for backend in gpus_backend._backends for buffer in backend.buffers]  # type: ignore[attr-defined]
    assert stats.images == count and stats.batch_size == min(count, 16 * gpus)
    assert len(fills) == 2 * gpus and sum(fills) >= -(-count // (16 * gpus))
    assert np.array_equal(np.load(tmp_path / "out.npy").view(np.uint64), cpu_outputs(cnn, images).view(np.uint64))


def test_several_gpus_image_buffers_name_a_nan_and_refuse_a_cut_file(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn, images = random_cnn(rng), random_values(rng, 70, INPUT_DIM, INPUT_DIM)
    images[53, 0, 1] = -np.inf
    stand_ins = [partial(StandIn, cnn) for _ in range(2)]
    with MultiGpuBackend(stand_ins) as gpus_backend, pytest.raises(InputFileError, match="image 54 holds -inf"):
        run_network(gpus_backend, save(tmp_path / "in.npy", images), tmp_path / "out.npy")
    path = save(tmp_path / "in.npy", random_values(rng, 100, INPUT_DIM, INPUT_DIM))
    cut_at_the_third_batch = [partial(StandIn, cnn, cut=path), partial(StandIn, cnn)]  # the first GPU's first buffer, again
    cut_file = pytest.raises(InputFileError, match="file ends after 64 of the 100 images")
    with MultiGpuBackend(cut_at_the_third_batch) as gpus_backend, cut_file:
        run_network(gpus_backend, path, tmp_path / "out.npy")
    assert not (tmp_path / "out.npy").exists()
    assert all(buffer.freed for backend in gpus_backend._backends for buffer in backend.buffers)  # type: ignore[attr-defined]


@pytest.mark.gpu
@pytest.mark.parametrize("nbytes", [1, 4 << 20, (4 << 20) + 8, (37 << 20) + 123])
def test_the_copier_puts_a_file_s_bytes_on_the_device(tmp_path: Path, nbytes: int) -> None:
    """Ranges of a file at odd offsets and sizes (a task, less, more, many tasks and a tail) reach the device whole once
    the buffer's ready event has passed (read back on a stream that waits for it and for nothing else); a range past the
    file's end copies what there is and says how much."""
    from cnnlab.cuda.context import CudaContext

    data = np.frombuffer(os.urandom(nbytes + 4096), np.uint8)
    (tmp_path / "f").write_bytes(data.tobytes())
    with CudaContext(random_cnn(np.random.default_rng(1))) as context, open(tmp_path / "f", "rb") as file:
        buffer = context.image_buffer(-(-(nbytes + 4096) // IMAGE_BYTES))
        # A stream of the test's (CU_STREAM_NON_BLOCKING): it waits for the copier's streams only through `ready`, where a
        # copy on the legacy default stream would wait for them all. The 37 MiB range is long enough to catch a `ready`
        # recorded before the last copies; a few MiB may land before the read-back is queued.
        reader = context.driver.Stream(flags=1)
        back = context.memory.host(nbytes, "u1")

        def copy(offset: int) -> int:
            return buffer._copier.start(file.fileno(), offset, nbytes, int(buffer.allocation), buffer.ready, threading.Event()).wait()

        for offset in (0, 7, 4096):
            back[:] = 0
            assert copy(offset) == nbytes
            reader.wait_for_event(buffer.ready)
            context.driver.memcpy_dtoh_async(back, buffer.allocation, reader)
            reader.synchronize()
            assert np.array_equal(back, data[offset : offset + nbytes])
        copied = copy(4096 + 5)
        assert copied == max(nbytes - 5, 0)
        buffer.free()


@pytest.mark.gpu
def test_a_copier_thread_that_cannot_make_its_staging_fails_the_copier_and_leaves_nothing() -> None:
    """Each copier thread makes its own staging buffers as it starts: where one cannot (the host's page-locked memory
    used up), that error is raised, not the broken barrier the others then see, and the others' buffers and threads
    are given back."""
    from cnnlab.cuda import memory
    from cnnlab.cuda.context import CudaContext
    from cnnlab.cuda.file_copier import FileCopier

    with CudaContext(random_cnn(np.random.default_rng(2))) as context:
        real_host, made = memory.Allocator.host, []
        calls = iter(range(1_000))

        def host(allocator: memory.Allocator, *args: Any, **kwargs: Any) -> np.ndarray:
            if next(calls) == 2:
                raise context.driver.Error("cuMemHostRegister failed: out of memory (a page-locked buffer of 8 MiB)")
            made.append(real_host(allocator, *args, **kwargs))
            return made[-1]

        threads = set(threading.enumerate())
        with patch.object(memory.Allocator, "host", host), pytest.raises(context.driver.Error, match="out of memory"):
            FileCopier(context.driver, context.memory, context._current, 4, 64 << 20)
        assert len(made) == 3 and not any(memory.is_page_locked(block) for block in made)  # every thread but one made its block
        assert set(threading.enumerate()) <= threads


@pytest.mark.gpu
def test_cuda_mode_on_a_npy_file_gives_the_copied_path_s_outputs(tmp_path: Path, rng: np.random.Generator) -> None:
    """The same images through the buffers (cnnlab cuda on a regular file) and through page-locked buffers (the Python
    API on the host array): the same kernels on the same values, so the same bytes; a NaN is named from the buffer's
    copy, and nothing is written."""
    from cnnlab.cuda.context import CudaContext

    cnn = random_cnn(rng)
    write_cnn_file(tmp_path / "cnn.csv", cnn.filters, cnn.weights)
    images = random_values(rng, 5000, INPUT_DIM, INPUT_DIM)
    path = save(tmp_path / "in.npy", images)
    with CudaContext(cnn) as context:
        want = context.forward(images)
    result = cnnlab("cuda", tmp_path / "cnn.csv", path, tmp_path / "out.npy")
    assert result.returncode == 0, result.stderr
    assert np.load(tmp_path / "out.npy").tobytes() == want.tobytes()
    images[4321, 99, 99] = np.inf
    save(path, images)
    assert "image 4322 holds inf" in assert_one_line_error(cnnlab("cuda", tmp_path / "cnn.csv", path, tmp_path / "bad.npy"))
    assert not (tmp_path / "bad.npy").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("process_ends", [False, True])
def test_two_contexts_image_buffers_leave_pycuda_nothing_to_warn_of(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, process_ends: bool
) -> None:
    """Several GPUs' buffers, two contexts on GPU 0 standing in, each made on a thread of its own: as the run ends,
    nothing of theirs is released from another thread, which PyCUDA refuses with a warning ("event in out-of-thread
    context could not be cleaned up"), the command line's run (its input kept to the process's end) included."""
    from cnnlab import run
    from cnnlab.cuda.context import CudaContext

    monkeypatch.setattr(run, "_LEFT_TO_THE_PROCESS_END", [])
    cnn = random_cnn(rng)
    path = save(tmp_path / "in.npy", random_values(rng, 3001, INPUT_DIM, INPUT_DIM))
    gc.collect()  # earlier tests' garbage gone first: its warnings are not this run's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with MultiGpuBackend([partial(CudaContext, cnn, 500) for _ in range(2)]) as gpus_backend:
            run_network(gpus_backend, path, tmp_path / "out.npy", process_ends=process_ends)
            gc.collect()
            assert len(run._LEFT_TO_THE_PROCESS_END) == process_ends
            for source in run._LEFT_TO_THE_PROCESS_END:  # where this process goes on, freed on each GPU's thread
                source.free()
        gc.collect()
    assert [str(warning.message) for warning in caught if "could not be cleaned up" in str(warning.message)] == []


@pytest.mark.gpu
def test_two_contexts_image_buffers_give_one_context_s_outputs(tmp_path: Path, rng: np.random.Generator) -> None:
    """Several GPUs' buffers, two contexts on GPU 0 standing in: each fills its shard in turn, the outputs the same bytes
    as one context's."""
    from cnnlab.cuda.context import CudaContext

    cnn = random_cnn(rng)
    path = save(tmp_path / "in.npy", random_values(rng, 3001, INPUT_DIM, INPUT_DIM))
    with CudaContext(cnn, batch_size=1000) as context:
        run_network(context, path, tmp_path / "one.npy")
    with MultiGpuBackend([partial(CudaContext, cnn, 500) for _ in range(2)]) as gpus_backend:
        stats = run_network(gpus_backend, path, tmp_path / "two.npy")
    assert stats.batch_size == 1000
    assert np.load(tmp_path / "two.npy").tobytes() == np.load(tmp_path / "one.npy").tobytes()


class TextStandIn(CpuBackend):
    """A backend that takes CSV text as the GPU does (csv_text set), its pieces parsed here: the run's text branch."""

    reads_in_place = False
    csv_text = TextBatching(batch_images=16, chunk_images=4)  # type: ignore[assignment]

    def compute(self, batch: Batch, check_finite: bool = False) -> OutputBatch:
        assert isinstance(batch, CsvBatch)
        images = np.empty((len(batch), INPUT_DIM, INPUT_DIM))
        for index, piece in enumerate(batch.span.pieces(4 * INPUT_DIM)):
            batch.parse_on_host(piece, batch.first_row(index, 4), images[4 * index : 4 * index + piece.rows // INPUT_DIM].reshape(-1))
        return super().compute(ImageBatch(images), check_finite)


def test_a_backend_that_parses_csv_itself_runs_with_no_image_buffers(tmp_path: Path, rng: np.random.Generator) -> None:
    """The text branch of a run makes no buffers and frees none: its outputs are the CPU's."""
    cnn, images = random_cnn(rng), random_values(rng, 37, INPUT_DIM, INPUT_DIM)
    _, path = write_files(tmp_path, cnn, images)
    with TextStandIn(cnn, threads=1) as backend:
        stats = run_network(backend, path, tmp_path / "out.npy")
    assert stats.images == 37 and stats.batch_size == 16
    assert np.array_equal(np.load(tmp_path / "out.npy").view(np.uint64), cpu_outputs(cnn, images).view(np.uint64))
