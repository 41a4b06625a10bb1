"""Several GPUs as one backend (cnnlab/cuda/multi_gpu.py): a batch's shards in order, one output file, faults as one GPU's.

Where there is one GPU or none, stand-ins take the GPUs' places: CPU backends (the splitting, the ordering, the output
file and the faults, in CI) and several contexts on GPU 0 (the contexts' own threads and page-locked buffers shared
between them, on the GPU machine).
"""

from __future__ import annotations

import threading
import traceback
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, assert_within_rule, cnnlab, cpu_outputs, random_cnn, write_files

from cnnlab.cli import commands
from cnnlab.cli import main as cli
from cnnlab.cpu.backend import CpuBackend
from cnnlab.cuda.multi_gpu import MultiGpuBackend
from cnnlab.errors import ArrayError, DeviceError, InputFileError
from cnnlab.files.csv_reader import CsvImageReader
from cnnlab.files.labcsv import read_output_rows
from cnnlab.generate import random_values
from cnnlab.network import Cnn, ImageBatch
from cnnlab.owner import BackendOwner
from cnnlab.run import run_network


class StandIn(CpuBackend):
    """A GPU's place taken by a CPU backend on one thread, which notes the thread it computes on and may fail."""

    reads_in_place = False  # as a GPU: a .npy file's images go through allocate_images' buffers

    def __init__(self, cnn: Cnn, fail_at: int | None = None) -> None:
        super().__init__(cnn, threads=1)
        self.name, self.calls, self.fail_at, self.threads_seen = "cuda", 0, fail_at, set()
        self.made_on = threading.current_thread().name
        self.buffers_made, self.buffers_out = 0, []

    def allocate_images(self, count: int) -> np.ndarray:
        self.buffers_made += 1
        self.buffers_out.append(super().allocate_images(count))
        return self.buffers_out[-1]

    def free_images(self, buffer: np.ndarray) -> None:
        assert any(out is buffer for out in self.buffers_out)
        self.buffers_out = [out for out in self.buffers_out if out is not buffer]

    def compute(self, batch: ImageBatch, check_finite: bool = False):  # type: ignore[override]
        self.calls += 1
        self.threads_seen.add(threading.current_thread().name)
        if self.calls == self.fail_at:
            raise DeviceError("CUDA error while computing: an illegal memory access was encountered")
        return super().compute(batch, check_finite)


@pytest.mark.parametrize("gpus", [1, 2, 3])
def test_a_batch_sharded_over_stand_ins_gives_the_outputs_in_order(rng: np.random.Generator, gpus: int) -> None:
    cnn = random_cnn(rng)
    with MultiGpuBackend([partial(StandIn, cnn) for _ in range(gpus)]) as gpus_backend:
        for count in (1, 2, 5, 37):
            images = random_values(rng, count, 100, 100)
            got = gpus_backend.compute(ImageBatch(images)).values
            assert np.array_equal(got.view(np.uint64), cpu_outputs(cnn, images).view(np.uint64)), count
        backends = gpus_backend._backends
    for backend in backends:  # each computed on the thread that made it, its own
        assert backend.threads_seen == {backend.made_on} and backend.made_on.startswith("cnnlab-gpu-")
    assert len({backend.made_on for backend in backends}) == gpus


@pytest.mark.parametrize("name", ["in.csv", "in.npy"])
def test_a_run_sharded_over_stand_ins_writes_the_one_output_in_input_order(tmp_path: Path, rng: np.random.Generator, name: str) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 29, 100, 100)
    _, csv_path = write_files(tmp_path, cnn, images)
    np.save(tmp_path / "in.npy", images)
    with MultiGpuBackend([partial(StandIn, cnn) for _ in range(3)]) as gpus_backend:
        gpus_backend.batch_size = 7  # several batches, each split in three
        stats = run_network(gpus_backend, tmp_path / name, tmp_path / "out.csv")
    assert stats.images == 29 and stats.batch_size == 7
    assert np.array_equal(np.array(read_output_rows(tmp_path / "out.csv")), cpu_outputs(cnn, images))


@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("fail_at", [None, 2])
def test_a_run_gives_back_the_host_buffers_it_made(tmp_path: Path, rng: np.random.Generator, gpus: int, fail_at: int | None) -> None:
    """The buffers the reader fills (page-locked on a GPU) are given back as the run ends, well or in an error: a
    long-lived backend (a Dask worker's) would otherwise keep them, run after run."""
    cnn = random_cnn(rng)
    images = random_values(rng, 29, 100, 100)
    _, csv_path = write_files(tmp_path, cnn, images)
    stand_ins = [partial(StandIn, cnn, fail_at)] + [partial(StandIn, cnn) for _ in range(gpus - 1)]
    with MultiGpuBackend(stand_ins) if gpus > 1 else StandIn(cnn, fail_at) as backend:
        backend.batch_size = 7
        with pytest.raises(DeviceError) if fail_at else nullcontext():  # the second batch fails on the first GPU
            run_network(backend, csv_path, tmp_path / "out.csv")
        run_network(backend, csv_path, tmp_path / "out.csv")  # the next run computes every batch
        assert np.array_equal(np.array(read_output_rows(tmp_path / "out.csv")), cpu_outputs(cnn, images))
        first = backend._backends[0] if isinstance(backend, MultiGpuBackend) else backend
        assert first.buffers_made == 4 and first.buffers_out == []  # type: ignore[attr-defined]


def test_a_gpu_that_fails_ends_the_run_in_one_line_with_nothing_written(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 12, 100, 100))
    (tmp_path / "out.csv").write_text("old\n")

    def several(mode: str, cnn: Cnn, batch: int | None, *options: object) -> MultiGpuBackend:
        made = MultiGpuBackend([partial(StandIn, cnn), partial(StandIn, cnn, fail_at=2)])  # the second GPU fails on its second shard
        made.batch_size = 4
        return made

    monkeypatch.setattr(commands, "make_backend", several)
    assert cli.main(["cuda", str(cnn_path), str(input_path), str(tmp_path / "out.csv"), "--devices", "0,1"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "cnnlab: CUDA error while computing: an illegal memory access was encountered\n" and captured.out == ""
    assert (tmp_path / "out.csv").read_text() == "old\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cnn.csv", "in.csv", "out.csv"]


def test_a_gpu_that_cannot_start_closes_the_others(rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    closed = []

    class Closing(StandIn):
        def close(self) -> None:
            closed.append(self.made_on)
            super().close()

    def cannot_start() -> StandIn:
        raise DeviceError("there is no GPU 5: this machine has 2 (GPUs 0 to 1)")

    with pytest.raises(DeviceError, match="there is no GPU 5"):
        MultiGpuBackend([partial(Closing, cnn), cannot_start, partial(Closing, cnn)])
    assert sorted(closed) == ["cnnlab-gpu-0", "cnnlab-gpu-2"]


def test_csv_text_splits_into_whole_pieces_in_order(tmp_path: Path, rng: np.random.Generator) -> None:
    """A batch of CSV text as shards of whole pieces of the chunk, for the GPUs: in order, covering the batch, each
    shard's pieces the batch's own."""
    _, path = write_files(tmp_path, random_cnn(rng), random_values(rng, 23, 100, 100))
    with CsvImageReader(path) as reader:
        batch = reader.read_text(23, 3)
    assert batch is not None
    pieces = batch.span.pieces(300)
    for parts in (1, 2, 3, 5, 8, 20):
        shards = batch.split(parts, 3)
        assert len(shards) == min(parts, len(pieces))
        assert [piece for shard in shards for piece in shard.span.pieces(300)] == pieces
        assert sum(len(shard) for shard in shards) == 23 and shards[0].span.start == batch.span.start
        assert all(a.span.end == b.span.start for a, b in zip(shards, shards[1:])) and shards[-1].span.end == batch.span.end
        assert max(len(shard) for shard in shards) - min(len(shard) for shard in shards) <= 3  # as even as whole pieces allow


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--devices", "0,x"], "expected all, or GPU indices"),
        (["--device", "-1"], "expected a GPU's index"),
        (["--device", "1", "--devices", "all"], "not allowed with argument --device"),
    ],
)
def test_gpus_are_named_by_index(arguments: list[str], message: str) -> None:
    assert message in assert_one_line_error(cnnlab("cuda", *arguments))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["in.csv", "in.npy"])
def test_two_contexts_on_one_gpu_write_what_one_context_writes(tmp_path: Path, rng: np.random.Generator, name: str) -> None:
    """GPU 0 named twice: two contexts, each on its own thread, splitting each batch (CSV parsed on the device, or
    .npy from page-locked memory the first one made): the same bytes as one context's run, within the lab's rule."""
    cnn, images = random_cnn(rng), random_values(rng, 700, 100, 100)
    cnn_path, _ = write_files(tmp_path, cnn, images)
    np.save(tmp_path / "in.npy", images)
    for out, gpus in (("one.csv", "0"), ("two.csv", "0,0")):
        result = cnnlab("cuda", cnn_path, tmp_path / name, tmp_path / out, "--devices", gpus, "--batch", "300")
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "two.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()
    assert_within_rule(np.array(read_output_rows(tmp_path / "two.csv")), cpu_outputs(cnn, images), cnn, images)


@pytest.mark.gpu
def test_a_gpu_that_does_not_exist_is_one_line_naming_how_many_there_are(rng: np.random.Generator) -> None:
    import pycuda.driver as driver

    from cnnlab.cuda.context import CudaContext

    driver.init()
    count = driver.Device.count()
    with pytest.raises(DeviceError, match=rf"there is no GPU {count}: this machine has {count} \(GPU"):
        CudaContext(random_cnn(rng), device=count)
    assert f"there is no GPU {count}: this machine has {count}" in assert_one_line_error(cnnlab("cuda", "--device", str(count)))


@pytest.mark.parametrize("chained", [False, True])
def test_what_a_failed_call_held_is_let_go_on_the_owner_s_thread(rng: np.random.Generator, chained: bool) -> None:
    """A call that fails with a GPU's event in one of its frames (here a stand-in that notes the thread it goes on), or in
    a frame of the error it failed during: the event goes on the owner's thread, whose context made it, before the error
    reaches the caller, whose thread PyCUDA would refuse; the error's message and lines are kept. The same where making
    the backend fails so."""
    released: list[str] = []

    class Event:
        def __del__(self) -> None:
            released.append(threading.current_thread().name)

    def compute() -> None:
        ready = Event()  # noqa: F841 (held by the frame, as a GPU's compute holds its buffer's event)
        raise ArrayError("image 3 holds nan")

    def failing(backend: StandIn) -> None:
        if not chained:
            compute()
        try:
            compute()
        except ArrayError:
            raise InputFileError("in.npy", "image 3 holds nan") from None

    owner = BackendOwner(partial(StandIn, random_cnn(rng)), "cnnlab-gpu-0")
    try:
        with pytest.raises(InputFileError if chained else ArrayError, match="image 3 holds nan") as raised:
            owner.call(failing)
        assert released == ["cnnlab-gpu-0"]
        assert ", in failing\n" in "".join(traceback.format_exception(raised.value))  # its lines kept
    finally:
        owner.close()

    def cannot_make() -> StandIn:  # a backend whose making fails with an event in a frame, as a half-made context's
        failing(None)
        raise AssertionError("failing() returned")

    released.clear()
    unmade = BackendOwner(cannot_make, "cnnlab-gpu-1")
    with pytest.raises(InputFileError if chained else ArrayError, match="image 3 holds nan"):
        unmade.backend()
    assert released == ["cnnlab-gpu-1"]
    unmade.close()


def test_an_owner_whose_backend_cannot_be_made_raises_that_error_for_every_call(rng: np.random.Generator) -> None:
    """The error making the backend raised, from backend() and from every call; close() returns, with nothing to close."""

    def cannot_start() -> StandIn:
        raise DeviceError("GPU 1: no such device")

    owner = BackendOwner(cannot_start, "cnnlab-gpu-1")
    with pytest.raises(DeviceError, match="no such device"):
        owner.backend()
    assert owner.failed
    with pytest.raises(DeviceError, match="no such device"):
        owner.call(lambda backend: backend.compute(ImageBatch(random_values(rng, 1, 100, 100))))
    owner.close()
    made = BackendOwner(partial(StandIn, random_cnn(rng)), "cnnlab-gpu-0")
    assert made.call(lambda backend: threading.current_thread().name) == "cnnlab-gpu-0" and not made.failed
    made.close()
