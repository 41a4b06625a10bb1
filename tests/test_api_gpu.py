"""The Python API on the GPU (needs pycuda and a GPU; PyTorch and CuPy where installed): host arrays of every
kind, device arrays read where they lie, outputs written into a caller's device array, and what is refused."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from helpers import INPUT_KINDS, SUBPROCESS_ENV, assert_lab_close, assert_within_rule, cpu_outputs, random_cnn, write_files
from reference import reference_forward

import cnnlab
from cnnlab.generate import random_values

pytestmark = pytest.mark.gpu


class Library:
    """PyTorch or CuPy, seen through the few calls these tests make."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "torch":
            torch = pytest.importorskip("torch")
            if not torch.cuda.is_available():
                pytest.skip("PyTorch sees no CUDA device")
            self.module = torch
        else:
            self.module = pytest.importorskip("cupy")

    def to_device(self, array: np.ndarray) -> Any:
        if self.name == "torch":
            return self.module.from_numpy(np.ascontiguousarray(array)).to("cuda")
        return self.module.asarray(array)

    def empty(self, shape: tuple[int, ...], dtype: Any = np.float64) -> Any:
        if self.name == "torch":
            return self.module.empty(shape, dtype=getattr(self.module, np.dtype(dtype).name), device="cuda")
        return self.module.empty(shape, dtype=dtype)

    def to_host(self, array: Any) -> np.ndarray:
        return array.cpu().numpy() if self.name == "torch" else self.module.asnumpy(array)


@pytest.fixture(params=["torch", "cupy"])
def library(request: pytest.FixtureRequest) -> Library:
    return Library(request.param)


def bits(values: np.ndarray) -> list[int]:
    return np.ascontiguousarray(values).view(np.uint64).ravel().tolist()


def test_every_host_input_kind_against_the_loop_reference(rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    filters, weights = cnn.filters.tolist(), cnn.weights.tolist()
    with cnnlab.CudaContext(cnn) as gpu:
        for kind, make in INPUT_KINDS.items():
            given = make(random_values(rng, 3, 100, 100))
            values = np.asarray(given, dtype=np.float64)
            want = np.array([reference_forward(image, filters, weights) for image in values.tolist()])
            got = gpu.forward(given)
            assert got.dtype == np.float64, kind
            assert_lab_close(got, want)
            assert bits(got) == bits(gpu.forward(values)), kind  # converted as staged: the same bits as float64 input
        image = random_values(rng, 100, 100)
        assert bits(gpu.forward(image)) == bits(gpu.forward(image[None])[0])
        assert gpu.forward(np.empty((0, 100, 100))).shape == (0, 10)
    once = cnnlab.forward(values, cnn, device="cuda")
    assert bits(once) == bits(got)


def test_device_arrays_are_read_where_they_lie_and_outputs_written_there(rng: np.random.Generator, library: Library) -> None:
    """More images than a chunk (683 by default), from device memory: the host path's bits; into a device out: the same bits,
    so the device's sum of the segments adds as the host's numpy does."""
    cnn = random_cnn(rng)
    images = random_values(rng, 1500, 100, 100)
    with cnnlab.CudaContext(cnn) as gpu:
        from_host = gpu.forward(images)
        on_device = library.to_device(images)
        assert bits(gpu.forward(on_device)) == bits(from_host)
        out = library.empty((1500, 10))
        assert gpu.forward(on_device, out=out) is out
        assert bits(library.to_host(out)) == bits(from_host)
        out_from_host = library.empty((1500, 10))
        gpu.forward(images, out=out_from_host)  # host images, device outputs
        assert bits(library.to_host(out_from_host)) == bits(from_host)
        tail = on_device[700:]  # a view that starts inside the allocation
        assert bits(gpu.forward(tail)) == bits(from_host[700:])
        one = library.empty((10,))
        gpu.forward(on_device[3], out=one)
        assert bits(library.to_host(one)) == bits(from_host[3])
    assert_within_rule(from_host, cpu_outputs(cnn, images), cnn, images)
    assert bits(cnnlab.forward(on_device, cnn, device="cuda")) == bits(from_host)


def test_device_arrays_the_kernels_cannot_read_are_refused(rng: np.random.Generator, library: Library) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 4, 100, 100)
    on_device = library.to_device(images)
    flat = library.to_device(random_values(rng, 4 * 10000 + 1))
    if library.name == "torch":
        single, transposed, misaligned = on_device.float(), on_device.transpose(1, 2), flat[1:].view(4, 100, 100)
    else:
        single, transposed, misaligned = on_device.astype(np.float32), on_device.transpose(0, 2, 1), flat[1:].reshape(4, 100, 100)
    with cnnlab.CudaContext(cnn) as gpu:
        want = gpu.forward(images)
        for given, message in (
            (single, r"device images must be float64 \('<f8'\), not '<f4'"),
            (transposed, "device images must be C-contiguous"),
            (misaligned, "device images must start on a 16-byte boundary"),
            (library.to_device(images[:, :, :99].copy()), r"not shape \(4, 100, 99\)"),
        ):
            with pytest.raises(cnnlab.ArrayError, match=message):
                gpu.forward(given)
        for out, message in (
            (library.empty((4, 10), np.float32), r"out must be a writable, C-contiguous float64 device array of shape \(4, 10\)"),
            (library.empty((4, 11)), r"not '<f8' of shape \(4, 11\)"),
            (library.empty((10, 4)).T, "with strides"),
            (np.empty((4, 10)), "out must be a device array"),
        ):
            with pytest.raises(cnnlab.ArrayError, match=message):
                gpu.forward(on_device, out=out)
        unallocated = {"shape": (4, 100, 100), "typestr": "<f8", "data": (1 << 44, False), "version": 2}
        nowhere = SimpleNamespace(__cuda_array_interface__=unallocated)
        with pytest.raises(cnnlab.ArrayError, match="is not device memory of GPU 0's primary context"):
            gpu.forward(nowhere)
        interface = dict(on_device.__cuda_array_interface__, shape=(10**6, 100, 100))  # 80 GB: past any allocation
        with pytest.raises(cnnlab.ArrayError, match="run past the end of their allocation"):
            gpu.forward(SimpleNamespace(__cuda_array_interface__=interface))
        with pytest.raises(cnnlab.ArrayError, match="device memory: forward"):
            cnnlab.forward(on_device, cnn)  # device="cpu"
        assert bits(gpu.forward(on_device)) == bits(want)  # the context is whole after every refusal


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("kernel", ["warp_shuffle", "fused_tiled_fma", "lab"])
def test_values_that_are_not_finite_are_found_by_the_kernel(rng: np.random.Generator, library: Library, value: float, kernel: str) -> None:
    """-inf would even vanish in the ReLU: the convolution kernel flags it as it reads it (the default rung), or
    find_nonfinite does before the rung's kernels (rungs that make no check of their own)."""
    from cnnlab.cuda.ladder import LaunchConfig

    cnn = random_cnn(rng)
    images = random_values(rng, 900, 100, 100)
    images[801, 99, 98] = value
    with cnnlab.CudaContext(cnn, config=LaunchConfig(kernel=kernel)) as gpu:
        with pytest.raises(cnnlab.ArrayError, match=r"images hold (nan|-?inf) at index \(801, 99, 98\)"):
            gpu.forward(images)  # from the host: the host's copy names where
        with pytest.raises(cnnlab.ArrayError, match="images hold a NaN or an infinity: the network takes finite values only"):
            gpu.forward(library.to_device(images), out=library.empty((900, 10)))
        images[801, 99, 98] = 1.0
        # The flag is cleared for the next call.
        assert_within_rule(gpu.forward(library.to_device(images)), cpu_outputs(cnn, images), cnn, images)


def test_finite_extremes_are_not_refused(rng: np.random.Generator) -> None:
    """Values near the largest double are finite: their sums may overflow, as on the CPU, but the images are taken."""
    cnn = random_cnn(rng)
    images = random_values(rng, 2, 100, 100)
    images[0, :5, :5] = 1.7e308
    images[1, 0, :3] = [5e-324, -0.0, -1.7e308]
    with cnnlab.CudaContext(cnn) as gpu:
        got = gpu.forward(images)
    want = cnnlab.forward(images, cnn)
    assert (np.isnan(got) == np.isnan(want)).all() and (np.isinf(got) == np.isinf(want)).all()


def test_the_process_keeps_one_context_a_gpu_and_each_call_computes_with_its_own_cnn(rng: np.random.Generator) -> None:
    """forward(device="cuda") makes GPU 0's context at its first call and keeps it: a later call with another CNN uses the
    same context and that CNN's weights (never the last call's), within the lab's rule of the CPU's outputs;
    release_backends() gives the context back."""
    from cnnlab import owner

    images = random_values(rng, 1500, 100, 100)
    cnns = [random_cnn(rng) for _ in range(2)]
    first = cnnlab.forward(images, cnns[0], device="cuda")
    kept = owner._KEPT[0].owner
    second = cnnlab.forward(images, cnns[1], device="cuda")
    assert owner._KEPT[0].owner is kept
    for cnn, got in zip(cnns, (first, second)):
        assert_within_rule(got, cnnlab.forward(images, cnn), cnn, images)
    again = cnnlab.forward(images, cnns[0], device="cuda")
    assert_within_rule(again, cnnlab.forward(images, cnns[0]), cnns[0], images)
    cnnlab.release_backends()
    assert not owner._KEPT


UNCLOSED = """
import gc
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import cnnlab

gc.disable()  # a dropped context is taken only where the script says: on another thread
closes = []
close = cnnlab.CudaContext.close
cnnlab.CudaContext.close = lambda context: closes.append(context._context is not None) or close(context)
cnn = cnnlab.load_cnn(sys.argv[1])
images = np.load(sys.argv[2])
gpu = cnnlab.CudaContext(cnn)
outputs = [gpu.forward(images)]
with ThreadPoolExecutor(1) as pool:  # another thread calls it, one call at a time, and then ends
    outputs.append(pool.submit(gpu.forward, images).result())
kept = []
maker = threading.Thread(target=lambda: kept.append(cnnlab.CudaContext(cnn)))  # ends with its context open
maker.start()
maker.join()
outputs.append(kept[0].forward(images))
with cnnlab.CudaContext(cnn) as entered:  # closed by another thread inside its with block
    outputs.append(entered.forward(images))
    closer = threading.Thread(target=entered.close)
    closer.start()
    closer.join()
gpu = cnnlab.CudaContext(cnn)  # the first one dropped without close()
collector = threading.Thread(target=gc.collect)
collector.start()
collector.join()
open_before = closes.count(True)
outputs.append(gpu.forward(images))  # closes the dropped one first
print(closes.count(True) - open_before)
np.save(sys.argv[3], np.stack(outputs))
"""


@pytest.mark.parametrize("count", [4, 3000])
def test_contexts_never_closed_made_called_and_dropped_on_other_threads_end_cleanly(
    tmp_path: Path, rng: np.random.Generator, count: int
) -> None:
    """A script's CudaContexts: one never closed and called from another thread, one made on a thread that then ends,
    one closed by another thread inside its with block, one dropped and collected on another thread, which the next
    call closes. Each computes the CPU's outputs, and the process ends with status 0 and nothing on stderr: no abort for
    a context left current on a thread, no PyCUDA warning for what was released out of its context's thread."""
    cnn, images = random_cnn(rng), random_values(rng, count, 100, 100)
    cnn_path, _ = write_files(tmp_path, cnn, images[:1])
    np.save(tmp_path / "images.npy", images)
    command = [sys.executable, "-c", UNCLOSED, str(cnn_path), str(tmp_path / "images.npy"), str(tmp_path / "outputs.npy")]
    result = subprocess.run(command, capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=300)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "1\n")
    want = cpu_outputs(cnn, images)
    outputs = np.load(tmp_path / "outputs.npy")
    assert len(outputs) == 5
    for each in outputs:
        assert_within_rule(each, want, cnn, images)


def test_a_context_collected_while_a_lock_is_held_is_closed_by_the_next_call(rng: np.random.Generator) -> None:
    """The collector may finalize a dropped context in the middle of any code: here while the page-locked ranges' lock
    is held, as is_page_locked holds it. The finalizer returns at once, and the next call of another context closes it."""
    from cnnlab.cuda import memory

    cnn, images = random_cnn(rng), random_values(rng, 20, 100, 100)
    dropped = cnnlab.CudaContext(cnn)
    dropped.forward(images)

    def finalize_holding_the_lock() -> None:
        with memory._PAGE_LOCKED_LOCK:
            dropped.__del__()

    finalizer = threading.Thread(target=finalize_holding_the_lock, daemon=True)
    finalizer.start()
    finalizer.join(timeout=60)
    assert not finalizer.is_alive(), "the finalizer waited for a lock its own thread holds"
    with cnnlab.CudaContext(cnn) as gpu:
        assert_within_rule(gpu.forward(images), cpu_outputs(cnn, images), cnn, images)
    with pytest.raises(cnnlab.UsageError, match="closed"):
        dropped.forward(images)


def test_a_context_is_current_only_in_its_calls_and_its_with_block(rng: np.random.Generator) -> None:
    """The driver context is pushed and popped round each call, and stays pushed inside a with block, so that a thread
    that made or called a context never ends with it current."""
    import pycuda.driver as driver

    cnn, images = random_cnn(rng), random_values(rng, 50, 100, 100)
    before = driver.Context.get_current()
    gpu = cnnlab.CudaContext(cnn)
    try:
        assert driver.Context.get_current() == before
        assert_within_rule(gpu.forward(images), cpu_outputs(cnn, images), cnn, images)
        assert driver.Context.get_current() == before
    finally:
        gpu.close()
    with cnnlab.CudaContext(cnn) as gpu:
        assert driver.Context.get_current() not in (None, before)
        assert_within_rule(gpu.forward(images), cpu_outputs(cnn, images), cnn, images)
        assert driver.Context.get_current() not in (None, before)
    assert driver.Context.get_current() == before
    with pytest.raises(cnnlab.UsageError, match="closed"):
        gpu.forward(images)
