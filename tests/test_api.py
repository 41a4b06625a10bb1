"""The Python API (`import cnnlab`) on the CPU: every input kind it takes against the plain-loop reference,
the files it loads, the errors it raises; and the README's example."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from operator import methodcaller
from pathlib import Path

import numpy as np
import pytest
from helpers import INPUT_KINDS, ROOT, in_forked_child, random_cnn, write_files
from reference import reference_forward

import cnnlab
import cnnlab.cpu.backend as cnnlab_cpu
from cnnlab import owner
from cnnlab.files.labcsv import read_output_rows
from cnnlab.generate import random_values
from cnnlab.network import ImageBatch


def reference(images: np.ndarray, cnn: cnnlab.Cnn) -> np.ndarray:
    """The loop reference on the float64 values of `images`, shape (N, 10)."""
    filters, weights = cnn.filters.tolist(), cnn.weights.tolist()
    return np.array([reference_forward(image, filters, weights) for image in np.asarray(images, dtype=np.float64).tolist()])


@pytest.mark.parametrize("kind", sorted(INPUT_KINDS))
def test_every_input_kind_gives_the_loop_reference_bit_for_bit(rng: np.random.Generator, kind: str) -> None:
    cnn = random_cnn(rng)
    given = INPUT_KINDS[kind](random_values(rng, 3, 100, 100))
    got = cnnlab.forward(given, cnn)
    assert got.shape == (3, 10) and got.dtype == np.float64
    assert got.tolist() == reference(np.asarray(given), cnn).tolist()  # its values converted to float64, then the lab's sums


def test_one_image_gives_one_row(rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    image = random_values(rng, 100, 100)
    assert cnnlab.forward(image, cnn).tolist() == reference(image[None], cnn)[0].tolist()
    assert cnnlab.forward(image.tolist(), cnn).shape == (10,)
    assert cnnlab.forward(np.empty((0, 100, 100)), cnn).shape == (0, 10)


def test_a_cnn_from_arrays_of_any_real_kind(rng: np.random.Generator) -> None:
    filters, weights = random_values(rng, 10, 5, 5), random_values(rng, 10, 4000)
    images = random_values(rng, 2, 100, 100)
    exact = cnnlab.Cnn(filters, weights)
    assert (exact.filters == filters).all() and exact.weights.flags.c_contiguous
    from_lists = cnnlab.Cnn(filters.tolist(), np.asfortranarray(weights))
    assert cnnlab.forward(images, from_lists).tolist() == reference(images, exact).tolist()
    single = cnnlab.Cnn(filters.astype(np.float32), weights.astype(np.float32))
    assert single.filters.dtype == np.float64
    assert cnnlab.forward(images, single).tolist() == reference(images, single).tolist()


def test_files_load_as_the_command_line_reads_them(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 5, 100, 100)
    cnn_path, input_path = write_files(tmp_path, cnn, images)
    np.save(tmp_path / "in.npy", images)
    loaded = cnnlab.load_cnn(cnn_path)
    assert (loaded.filters == cnn.filters).all() and (loaded.weights == cnn.weights).all()
    for path in (input_path, tmp_path / "in.npy"):
        assert (cnnlab.load_images(path) == images).all()
        batches = list(cnnlab.load_image_batches(path, batch=2))
        assert [len(batch) for batch in batches] == [2, 2, 1]
        assert (np.concatenate(batches) == images).all()
        assert not np.shares_memory(batches[0], batches[1])  # each batch its own array
    assert cnnlab.forward(cnnlab.load_images(input_path), loaded).tolist() == reference(images, cnn).tolist()


def test_data_after_the_announced_images_is_an_error(tmp_path: Path, rng: np.random.Generator) -> None:
    _, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 3, 100, 100))
    input_path.write_text("2" + input_path.read_text()[1:])
    with pytest.raises(cnnlab.InputFileError, match=r"in.csv:204: data after the 2 images the first line announces"):
        cnnlab.load_images(input_path)
    with pytest.raises(cnnlab.InputFileError, match="data after the 2 images"):
        list(cnnlab.load_image_batches(input_path, 1))


class FakeDeviceArray:
    """Anything with __cuda_array_interface__: the CPU path must refuse it, not read its pointer."""

    __cuda_array_interface__ = {"shape": (2, 100, 100), "typestr": "<f8", "data": (1 << 20, False), "version": 3}


@pytest.mark.parametrize(
    "images, message",
    [
        (np.zeros((3, 100, 99)), r"images must be one image \(100, 100\) or a batch \(N, 100, 100\), not shape \(3, 100, 99\)"),
        (np.zeros((100,)), r"not shape \(100,\)"),
        (np.zeros((2, 1, 100, 100)), r"not shape \(2, 1, 100, 100\)"),
        (np.zeros((2, 100, 100), dtype=complex), "must hold real numbers .* not complex128"),
        (np.array([["a"] * 100] * 100), "must hold real numbers"),
        (np.zeros((2, 100, 100), dtype=bool), "must hold real numbers"),
        ([[1.0] * 100] * 99 + [[1.0] * 99], "not an array of numbers"),
        (FakeDeviceArray(), r"device memory: forward\(\.\.\., device='cuda'\)"),
    ],
)
def test_what_it_refuses_is_an_array_error_saying_what_was_expected(rng: np.random.Generator, images: object, message: str) -> None:
    with pytest.raises(cnnlab.ArrayError, match=message):
        cnnlab.forward(images, random_cnn(rng))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_value_that_is_not_finite_is_named(rng: np.random.Generator, value: float) -> None:
    images = random_values(rng, 4, 100, 100)
    images[2, 31, 7] = value
    with pytest.raises(cnnlab.ArrayError, match=re.escape(f"images hold {value} at index (2, 31, 7)")) as raised:
        cnnlab.forward(images, random_cnn(rng))
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, cnnlab.CnnlabError)


def test_a_cnn_that_is_not_what_the_network_needs_is_refused(rng: np.random.Generator) -> None:
    filters, weights = random_values(rng, 10, 5, 5), random_values(rng, 10, 4000)
    with pytest.raises(cnnlab.ArrayError, match=r"weights must have shape \(10, 4000\), not \(10, 3999\)"):
        cnnlab.Cnn(filters, weights[:, :-1])
    weights[3, 17] = np.nan
    with pytest.raises(cnnlab.ArrayError, match=r"weights hold nan at index \(3, 17\)"):
        cnnlab.Cnn(filters, weights)
    with pytest.raises(cnnlab.UsageError, match="cnn must be a cnnlab.Cnn"):
        cnnlab.forward(random_values(rng, 100, 100), (filters, weights))  # type: ignore[arg-type]


def test_usage_errors(rng: np.random.Generator) -> None:
    cnn, images = random_cnn(rng), random_values(rng, 1, 100, 100)
    for device in ("gpu", "cuda:x", "cuda:-1", "cuda1", 1):
        with pytest.raises(cnnlab.UsageError, match=rf"device must be 'cpu', 'cuda' or 'cuda:N' \(GPU N, counted from 0\), not {device!r}"):
            cnnlab.forward(images, cnn, device=device)
    with pytest.raises(cnnlab.ArrayError, match="out takes a device array, with device='cuda'"):
        cnnlab.forward(images, cnn, out=np.empty((1, 10)))
    with pytest.raises(cnnlab.UsageError, match="batch must be a positive number"):
        next(cnnlab.load_image_batches(ROOT / "data" / "in.csv", 0))


def test_the_package_says_what_it_offers() -> None:
    assert set(cnnlab.__all__) <= set(dir(cnnlab))
    for name in cnnlab.__all__:
        assert getattr(cnnlab, name) is not None
    assert re.fullmatch(r"\d+\.\d+\.\d+", cnnlab.__version__)
    assert (Path(cnnlab.__file__).parent / "py.typed").exists()
    with pytest.raises(AttributeError):
        cnnlab.no_such_name  # noqa: B018


def test_the_readme_example_runs_and_gives_the_lab_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## From Python") :]
    example = re.search(r"```python\n(.*?)```", section, re.S)[1]
    assert len(example.strip().splitlines()) == 3
    monkeypatch.chdir(ROOT)
    names: dict[str, object] = {}
    exec(example, names)
    assert names["outputs"].tolist() == read_output_rows(ROOT / "data" / "out.csv")


def test_a_file_error_crosses_a_process_boundary_as_itself(tmp_path: Path) -> None:
    """Dask's process workers send exceptions back pickled: an InputFileError must come back whole, not as a TypeError."""
    import pickle

    bad = tmp_path / "bad.csv"
    bad.write_text("2\n1,2\n")
    with pytest.raises(cnnlab.InputFileError) as raised:
        cnnlab.load_images(bad)
    again = pickle.loads(pickle.dumps(raised.value))
    assert type(again) is cnnlab.InputFileError
    assert (again.path, again.line, again.message, str(again)) == (str(bad), 2, raised.value.message, str(raised.value))


class CountingBackend(cnnlab_cpu.CpuBackend):
    """The CPU backend, counting the backends made and the CNNs loaded, and the threads its jobs ran on."""

    made: list[CountingBackend] = []

    def __init__(self, cnn: cnnlab.Cnn) -> None:
        super().__init__(cnn, threads=1)
        self.loads, self.threads_seen = 0, set()
        CountingBackend.made.append(self)

    def load_cnn(self, cnn: cnnlab.Cnn) -> None:
        super().load_cnn(cnn)
        self.loads += 1


def test_the_process_keeps_a_backend_a_device_and_loads_each_call_s_cnn(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    """on_device (forward(device="cuda")'s and Dask's): one backend a device, made at the first job and kept; each job
    computes with its own CNN (never a stale one), from any thread, one job at a time; release_backends() closes it and
    the next job makes another."""
    monkeypatch.setattr(owner, "_KEPT", {})
    monkeypatch.setattr(CountingBackend, "made", [])
    images = random_values(rng, 5, 100, 100)
    cnns = [random_cnn(rng) for _ in range(3)]

    def job(cnn: cnnlab.Cnn) -> np.ndarray:
        def compute(backend: CountingBackend) -> np.ndarray:
            backend.threads_seen.add(threading.get_ident())
            return backend.compute(ImageBatch(images)).values

        return owner.on_device(7, partial(CountingBackend, cnns[0]), cnn, None, compute).result()

    with ThreadPoolExecutor(4) as callers:
        got = list(callers.map(job, [cnns[k % 3] for k in range(12)]))
    for k, values in enumerate(got):
        assert np.array_equal(values, reference(images, cnns[k % 3]))
    (backend,) = CountingBackend.made
    assert backend.loads == 12 and len(backend.threads_seen) == 1  # one thread of its own, whatever thread called
    token_job = partial(owner.on_device, 7, partial(CountingBackend, cnns[0]), cnns[1], "token-1", lambda backend: backend.loads)
    assert token_job().result() == 13 and token_job().result() == 13  # a token held already: no load
    owner.release_backends()
    assert not owner._KEPT
    assert np.array_equal(job(cnns[2]), reference(images, cnns[2])) and len(CountingBackend.made) == 2
    owner.release_backends()


def test_a_forked_child_makes_its_own_backend_and_leaves_its_parents_alone(
    monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    """A child forked after on_device kept a backend has none of its thread: its first job makes a backend of its own
    (rather than wait forever on the parent's), and the parent's is held there, never closed. Forked while one of the
    parent's threads holds the kept backends' lock, the child still gets on (its lock is a new one)."""
    monkeypatch.setattr(owner, "_KEPT", {})
    monkeypatch.setattr(CountingBackend, "made", [])
    images, cnn = random_values(rng, 5, 100, 100), random_cnn(rng)

    def job() -> np.ndarray:
        compute = methodcaller("compute", ImageBatch(images))
        return owner.on_device(None, partial(CountingBackend, cnn), cnn, None, compute).result(timeout=60).values

    parents = job()
    (parent_backend,) = CountingBackend.made

    def in_the_child() -> bool:
        values = job()
        held = [kept.owner.backend() for kept in owner._LEFT_TO_THE_PARENT]
        return np.array_equal(values, parents) and len(CountingBackend.made) == 2 and held == [parent_backend]

    try:
        assert in_forked_child(in_the_child)
        held, release = threading.Event(), threading.Event()

        def hold_the_lock() -> None:
            with owner._KEPT_LOCK:
                held.set()
                release.wait()

        holder = threading.Thread(target=hold_the_lock)
        holder.start()
        held.wait()
        try:
            assert in_forked_child(in_the_child, timeout=20)
        finally:
            release.set()
            holder.join()
        assert np.array_equal(parents, reference(images, cnn))
        assert np.array_equal(job(), parents) and CountingBackend.made == [parent_backend]  # the parent's serves on
    finally:
        owner.release_backends()


def test_a_forked_child_frees_a_cpu_backend_its_parent_made(rng: np.random.Generator) -> None:
    """The native forward's thread pool, copied into a forked child without its threads, is left there as the child
    closes the backend (joining or destroying the parent's threads would hang or end the child); the child computes
    with a backend of its own."""
    images, cnn = random_values(rng, 64, 100, 100), random_cnn(rng)
    want = reference(images, cnn)
    with cnnlab_cpu.CpuBackend(cnn, threads=2) as parents:  # two threads: a batch of 64 starts the pool's worker
        assert np.array_equal(parents.compute(ImageBatch(images)).values, want)

        def in_the_child() -> bool:
            parents.close()
            with cnnlab_cpu.CpuBackend(cnn, threads=2) as own:
                return np.array_equal(own.compute(ImageBatch(images)).values, want)

        assert in_forked_child(in_the_child, timeout=20)
        assert np.array_equal(parents.compute(ImageBatch(images)).values, want)
