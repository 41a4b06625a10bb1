"""cnnlab on Dask (cnnlab/dask_forward.py), on a local cluster of processes: Dask arrays of images give cnnlab.forward's
outputs bit for bit, whatever their chunks; what is refused; the CNN once in the graph and one backend a worker; and a
folder of input files run through the cluster gives the command line's bytes for each file."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import assert_within_rule, cnnlab, random_cnn

import cnnlab as cnnlab_api
from cnnlab.errors import OutputFileError
from cnnlab.files.labcsv import read_output_rows, write_input_file
from cnnlab.generate import random_values, write_cnn_file
from cnnlab.network import Cnn

WHY = "the Dask tests need the dask extra: pip install -e '.[dask]'"
dask = pytest.importorskip("dask", reason=WHY)
da = pytest.importorskip("dask.array", reason=WHY)
distributed = pytest.importorskip("distributed", reason=WHY)
cloudpickle = pytest.importorskip("cloudpickle", reason=WHY)  # a dependency of dask's

from cnnlab import dask_forward, owner  # noqa: E402  (after the skips: dask_forward is imported only where Dask is)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """Two worker processes of one thread each, as a cluster of two hosts would run them."""
    with (
        distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client


def bits(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values).view(np.uint64)


@pytest.mark.parametrize(
    "chunks",
    [
        (7, 100, 100),  # 7, 7, 7 and a ragged 2
        (23, 100, 100),  # one block
        (1, 100, 100),
        ((5, 10, 8), 100, 100),
        (6, 50, 100),  # split images: rechunked whole
        (4, 100, 10),
    ],
)
def test_outputs_are_cnnlab_forwards_bit_for_bit(client: Any, rng: np.random.Generator, chunks: tuple[Any, ...]) -> None:
    cnn, images = random_cnn(rng), random_values(rng, 23, 100, 100)
    outputs = dask_forward.forward_blocks(da.from_array(images, chunks=chunks), cnn)
    assert outputs.dtype == np.float64 and outputs.shape == (23, 10)
    assert outputs.chunks == (da.from_array(images, chunks=chunks).chunks[0], (10,))
    got = client.compute(outputs).result()
    assert (bits(got) == bits(cnnlab_api.forward(images, cnn))).all()


def test_threads_in_this_process_and_other_dtypes_give_the_same_bits(rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    for images in (random_values(rng, 9, 100, 100), random_values(rng, 9, 100, 100).astype(np.float32)):
        got = dask_forward.forward_blocks(da.from_array(images, chunks=(2, 100, 100)), cnn).compute(scheduler="threads")
        assert (bits(got) == bits(cnnlab_api.forward(images, cnn))).all()
    image = random_values(rng, 100, 100)
    one = dask_forward.forward_blocks(da.from_array(image), cnn)
    assert one.shape == (10,)
    assert (bits(one.compute(scheduler="threads")) == bits(cnnlab_api.forward(image, cnn))).all()
    empty = dask_forward.forward_blocks(da.zeros((0, 100, 100)), cnn).compute(scheduler="threads")
    assert empty.shape == (0, 10)


def test_blocks_reach_the_backend_in_place(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    """No copy on the way: a copy of every block (what map_blocks makes of an axis it drops) costs more than the forward."""
    cnn, pieces = random_cnn(rng), [random_values(rng, 3, 100, 100), random_values(rng, 2, 100, 100)]
    images = da.concatenate([da.from_delayed(dask.delayed(piece), piece.shape, np.float64) for piece in pieces])
    in_place, outputs = [], dask_forward._outputs

    def watched(block: np.ndarray, backend: Any) -> np.ndarray:
        in_place.append(any(np.shares_memory(block, piece) for piece in pieces))
        return outputs(block, backend)

    monkeypatch.setattr(dask_forward, "_outputs", watched)
    got = dask_forward.forward_blocks(images, cnn).compute(scheduler="sync")
    assert in_place == [True, True]
    assert (bits(got) == bits(cnnlab_api.forward(np.concatenate(pieces), cnn))).all()


def test_each_worker_makes_its_backend_once(client: Any, rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    images = da.from_array(random_values(rng, 24, 100, 100), chunks=(3, 100, 100))

    def backends() -> dict[int | None, int]:
        from cnnlab.owner import _KEPT

        return {device: id(kept.owner) for device, kept in _KEPT.items()}

    client.compute(dask_forward.forward_blocks(images, cnn)).result()
    first = client.run(backends)
    client.compute(dask_forward.forward_blocks(images + 1, cnn)).result()  # another graph, the same CNN
    assert client.run(backends) == first
    assert all(list(held) == [None] for held in first.values())  # one backend, the CPU's


def tasks_holding_a_cnn(collection: Any) -> int:
    """How many of the graph's tasks carry a Cnn when serialized (as the scheduler ships them)."""

    class Finder(cloudpickle.Pickler):
        found = False

        def persistent_id(self, obj: object) -> str | None:
            if isinstance(obj, Cnn):
                self.found = True
                return "cnn"
            return None

    count = 0
    for task in dict(collection.__dask_graph__()).values():
        finder = Finder(io.BytesIO())
        finder.dump(task)
        count += finder.found
    return count


def test_the_cnn_is_in_the_graph_once(rng: np.random.Generator) -> None:
    outputs = dask_forward.forward_blocks(da.from_array(random_values(rng, 20, 100, 100), chunks=(2, 100, 100)), random_cnn(rng))
    assert outputs.numblocks == (10, 1)
    assert tasks_holding_a_cnn(outputs) == 1
    (optimized,) = dask.optimize(outputs)
    assert tasks_holding_a_cnn(optimized) == 1


def test_building_the_graph_computes_nothing(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("a backend was asked for while the graph was built")

    monkeypatch.setattr(dask_forward, "_on_backend", refuse)
    images = da.from_array(random_values(rng, 5, 100, 100), chunks=(2, 100, 50))
    for device in ("cpu", "cuda", "cuda:1"):
        assert dask_forward.forward_blocks(images, random_cnn(rng), device).shape == (5, 10)


@pytest.mark.parametrize(
    "images, message",
    [
        (da.zeros((3, 100, 99)), r"images must be one image \(100, 100\) or a batch \(N, 100, 100\), not shape \(3, 100, 99\)"),
        (da.zeros((2, 1, 100, 100)), r"not shape \(2, 1, 100, 100\)"),
        (da.zeros((2, 100, 100), dtype=complex), "must hold real numbers .* not complex128"),
        (da.zeros((2, 100, 100), dtype=bool), "must hold real numbers"),
    ],
)
def test_a_wrong_shape_or_dtype_is_an_array_error(rng: np.random.Generator, images: Any, message: str) -> None:
    with pytest.raises(cnnlab_api.ArrayError, match=message):
        dask_forward.forward_blocks(images, random_cnn(rng))


def test_chunks_of_unknown_size_are_refused(rng: np.random.Generator) -> None:
    images = da.from_array(random_values(rng, 4, 100, 100), chunks=(2, 100, 100))
    with pytest.raises(cnnlab_api.ArrayError, match=r"unknown size along N: images.compute_chunk_sizes\(\) first"):
        dask_forward.forward_blocks(images[images[:, 0, 0] > 0], random_cnn(rng))


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cuda:-1", "CUDA", "cpu:0", 0])
def test_a_bad_device_is_a_usage_error(rng: np.random.Generator, device: Any) -> None:
    message = f"device must be 'cpu', 'cuda' or 'cuda:N' (GPU N, counted from 0), not {device!r}"
    with pytest.raises(cnnlab_api.UsageError, match=re.escape(message)):
        dask_forward.forward_blocks(da.zeros((1, 100, 100)), random_cnn(rng), device)


def test_a_cnn_that_is_not_one_is_a_usage_error(rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    with pytest.raises(cnnlab_api.UsageError, match="cnn must be a cnnlab.Cnn"):
        dask_forward.forward_blocks(da.zeros((1, 100, 100)), (cnn.filters, cnn.weights))  # type: ignore[arg-type]


def test_a_value_that_is_not_finite_is_named_by_its_index_in_the_array(client: Any, rng: np.random.Generator) -> None:
    images = random_values(rng, 12, 100, 100)
    images[8, 31, 7] = np.inf
    outputs = dask_forward.forward_blocks(da.from_array(images, chunks=(5, 100, 100)), random_cnn(rng))
    with pytest.raises(cnnlab_api.ArrayError, match=re.escape("images hold inf at index (8, 31, 7)")):
        client.compute(outputs).result()


def test_cnnlab_forward_takes_a_dask_array(rng: np.random.Generator) -> None:
    images = random_values(rng, 4, 100, 100)
    cnn = random_cnn(rng)
    outputs = cnnlab_api.forward(da.from_array(images, chunks=(2, 100, 100)), cnn)
    assert isinstance(outputs, da.Array)
    assert np.array_equal(outputs.compute(), cnnlab_api.forward(images, cnn))
    with pytest.raises(cnnlab_api.ArrayError, match="out takes a device array"):
        cnnlab_api.forward(da.from_array(images, chunks=(2, 100, 100)), cnn, out=np.empty((4, 10)))


def write_inputs(folder: Path, cnn: Cnn, rng: np.random.Generator) -> tuple[Path, dict[Path, np.ndarray]]:
    """A CNN file and three input files, two CSV and one .npy, of different sizes; the images of each."""
    folder.mkdir()
    cnn_path = folder / "cnn.csv"
    write_cnn_file(cnn_path, cnn.filters, cnn.weights)
    inputs = {folder / "a.csv": random_values(rng, 3, 100, 100), folder / "b.csv": random_values(rng, 1, 100, 100)}
    for path, images in inputs.items():
        write_input_file(path, len(images), images)
    inputs[folder / "c.npy"] = random_values(rng, 4, 100, 100)
    np.save(folder / "c.npy", inputs[folder / "c.npy"])
    return cnn_path, inputs


def test_a_folder_through_the_cluster_gives_the_command_lines_bytes(client: Any, tmp_path: Path, rng: np.random.Generator) -> None:
    cnn_path, inputs = write_inputs(tmp_path / "in", random_cnn(rng), rng)
    outputs = dask_forward.run_files(client, cnn_path, sorted(inputs), tmp_path / "out")
    assert outputs == [tmp_path / "out" / name for name in ("a.csv", "b.csv", "c.csv")]
    for input_path, output in zip(sorted(inputs), outputs):
        want = tmp_path / f"cli-{output.name}"
        result = cnnlab("cpu", cnn_path, input_path, want)
        assert result.returncode == 0, result.stderr
        assert output.read_bytes() == want.read_bytes()
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["a.csv", "b.csv", "c.csv"]  # no temporary left


def test_the_folder_recipe_warns_refuses_and_passes_on_errors(client: Any, tmp_path: Path, rng: np.random.Generator) -> None:
    cnn_path, inputs = write_inputs(tmp_path / "in", random_cnn(rng), rng)
    a = tmp_path / "in" / "a.csv"
    a.write_text("2" + a.read_text()[1:])  # announces 2 of its 3 images
    with pytest.raises(cnnlab_api.InputFileError, match=r"a.csv:\d+: data after the 2 images"):
        dask_forward.run_files(client, cnn_path, [a], tmp_path / "out")
    with pytest.raises(cnnlab_api.UsageError, match="share a name"):
        dask_forward.run_files(client, cnn_path, [a, tmp_path / "in" / "a.npy"], tmp_path / "out")
    with pytest.raises(OutputFileError, match=r"is the input file .*a.csv; refusing to write over it"):
        dask_forward.run_files(client, cnn_path, sorted(inputs), tmp_path / "in")
    (tmp_path / "in" / "short.csv").write_text(a.read_text()[:50_000])
    with pytest.raises(cnnlab_api.InputFileError, match=r"short.csv:\d+: "):
        dask_forward.run_files(client, cnn_path, [tmp_path / "in" / "short.csv"], tmp_path / "out")
    assert not (tmp_path / "out" / "short.csv").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_on_the_gpu_within_the_lab_rule(client: Any, tmp_path: Path, rng: np.random.Generator, device: str) -> None:
    cnn, images = random_cnn(rng), random_values(rng, 300, 100, 100)
    outputs = dask_forward.forward_blocks(da.from_array(images, chunks=(128, 100, 100)), cnn, device)
    assert_within_rule(client.compute(outputs).result(), cnnlab_api.forward(images, cnn), cnn, images)
    # Threads of this process, several at once: each block reaches the GPU through the thread that made its context.
    assert_within_rule(outputs.compute(scheduler="threads"), cnnlab_api.forward(images, cnn), cnn, images)
    cnn_path, inputs = write_inputs(tmp_path / "in", cnn, rng)
    for input_path, output in zip(sorted(inputs), dask_forward.run_files(client, cnn_path, sorted(inputs), tmp_path / "out", device)):
        got = np.array(read_output_rows(output))
        assert_within_rule(got, cnnlab_api.forward(inputs[input_path], cnn), cnn, inputs[input_path])


def test_the_pages_examples_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rng: np.random.Generator) -> None:
    """docs/dask.md's two examples, on a CNN file and images of their own."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "dask.md").read_text()
    on_an_array, on_a_folder = re.findall(r"```python\n(.*?)```", page, re.S)
    monkeypatch.chdir(tmp_path)
    cnn = random_cnn(rng)
    (tmp_path / "data").mkdir()
    write_cnn_file(tmp_path / "data" / "cnn.csv", cnn.filters, cnn.weights)
    images = random_values(rng, 9, 100, 100)
    da.to_npy_stack(tmp_path / "images", da.from_array(images, chunks=(4, 100, 100)))
    with dask.config.set(scheduler="threads"):  # its paths are relative: read here, not in the cluster's working directory
        exec(on_an_array, {})
    got = np.concatenate([np.load(tmp_path / "outputs" / f"{block}.npy") for block in range(3)])
    assert (bits(got) == bits(cnnlab_api.forward(images, cnn))).all()
    (tmp_path / "input").mkdir()
    write_cnn_file(tmp_path / "input" / "cnn.csv", cnn.filters, cnn.weights)
    for name, count in (("in1", 2), ("in2", 3)):
        write_input_file(tmp_path / "input" / f"{name}.csv", count, random_values(rng, count, 100, 100))
    names: dict[str, Any] = {}
    exec(on_a_folder, names)
    assert names["outputs"] == [Path("out") / "in1.csv", Path("out") / "in2.csv"]
    for name in ("in1", "in2"):
        want = cnnlab_api.forward(cnnlab_api.load_images(tmp_path / "input" / f"{name}.csv"), cnn)
        assert read_output_rows(tmp_path / "out" / f"{name}.csv") == want.tolist()


def test_a_backend_that_failed_to_be_made_is_made_again_for_the_next_job(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    """A worker whose backend could not be made (a GPU busy for a moment) fails that job only: the next makes another."""
    from cnnlab.cpu.backend import CpuBackend
    from cnnlab.errors import DeviceError

    attempts: list[int] = []

    def flaky(cnn: Cnn, gpu: int | None) -> CpuBackend:
        attempts.append(gpu)
        if len(attempts) == 1:
            raise DeviceError("GPU 3: busy")
        return CpuBackend(cnn)

    monkeypatch.setattr(dask_forward, "_worker_backend", flaky)
    monkeypatch.setattr(owner, "_KEPT", {})
    cnn = random_cnn(rng)
    with pytest.raises(DeviceError, match="busy"):
        dask_forward._on_backend(cnn, "token", 3, lambda backend: backend.threads).result()
    assert dask_forward._on_backend(cnn, "token", 3, lambda backend: backend.threads).result() >= 1
    assert dask_forward._on_backend(cnn, "token", 3, lambda backend: backend.threads).result() >= 1
    assert attempts == [3, 3]  # made again once, then kept
    owner.release_backends()
