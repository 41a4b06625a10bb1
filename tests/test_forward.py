"""The CPU forward, native and numpy: bit-exact against the loop reference and each other, hand-computed cases,
hostile values, every batch size, threads, types; the native forward with each instruction set's kernels this CPU
runs, and CNNLAB_CPU_ISA choosing them."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_one_line_error, cnnlab, random_cnn
from reference import reference_forward

from cnnlab.cpu import backend
from cnnlab.cpu.backend import ISA_VARIABLE, CpuBackend
from cnnlab.cpu.numpy_forward import NumpyForward
from cnnlab.errors import UsageError
from cnnlab.generate import random_values
from cnnlab.network import Cnn, ImageBatch, OutputBatch

NATIVE = pytest.mark.skipif(backend.Forward is None, reason="cnnlab.cpu._forward is not built (it needs a C++17 compiler)")
ALL_ISAS = ("avx512", "avx2", "x86-64")  # as CNNLAB_CPU_ISA names them, widest first


def _kernels(isa: str) -> pytest.param:
    """`isa` as a parameter: skipped, with the reason, where the native forward is not built or this CPU lacks it."""
    if backend.Forward is None:
        return pytest.param(isa, marks=pytest.mark.skip(reason="cnnlab.cpu._forward is not built (it needs a C++17 compiler)"))
    if isa not in backend.CPU_ISAS:
        reason = f"this CPU cannot run the {isa} kernels (it runs {', '.join(backend.CPU_ISAS)})"
        return pytest.param(isa, marks=pytest.mark.skip(reason=reason))
    return pytest.param(isa)


EVERY_ISA = pytest.mark.parametrize("isa", [_kernels(isa) for isa in ALL_ISAS])


def hostile_values(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Random values with signed zeros, subnormals and the smallest normals sprinkled in, a few percent of each."""
    values = rng.uniform(-10, 10, shape)
    specials = np.array([0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, -1e-310])
    where = rng.random(shape) < 0.05
    values[where] = rng.choice(specials, where.sum())
    return values


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bit for bit, NaNs (from inf - inf) equal to NaNs whatever their payload."""
    nan = np.isnan(got) & np.isnan(want)
    return bool((nan | (got.view(np.uint64) == want.view(np.uint64))).all())


def native_and_numpy(cnn: Cnn, images: np.ndarray, threads: int, isa: str, check: bool = False) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The outputs and the first non-finite image (or -1) from the native forward with `isa`'s kernels and from numpy's."""
    results = []
    native = backend.Forward(cnn.filters, cnn.weights, threads, isa)
    assert native.isa == isa
    for forward in (native, NumpyForward(cnn.filters, cnn.weights, threads)):
        out = np.full((len(images), 10), np.nan)
        with np.errstate(over="ignore", invalid="ignore"):
            bad = forward.compute(images, out, check)
        forward.close()
        results.append((out, bad))
    (native, native_bad), (numpy, numpy_bad) = results
    return native, numpy, native_bad, numpy_bad


@EVERY_ISA
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_native_forward_is_the_numpy_forward_bit_for_bit_at_every_batch_size(rng: np.random.Generator, isa: str, threads: int) -> None:
    """Every batch size from 1 to 33 (groups of 2, 4 or 8 images a vector, and every remainder), on values that cancel,
    underflow and overflow: the same bits as numpy's forward, the plain loop's and the loop reference's."""
    cnn = Cnn(hostile_values(rng, 10, 5, 5), hostile_values(rng, 10, 4000))
    images = hostile_values(rng, 33, 100, 100)
    images[5, 7, 11], images[20, 0, 0:3] = 1.7e308, [1e300, -1.7e308, 1e308]  # near the top: these images' sums overflow
    for count in range(1, 34):
        native, numpy, _, _ = native_and_numpy(cnn, images[:count], threads, isa)
        assert same_bits(native, numpy), count
    plain = np.full((33, 10), np.nan)
    forward = backend.Forward(cnn.filters, cnn.weights, threads, isa)
    assert forward.isa == isa  # the plain loop's instructions too
    forward.compute_plain(images, plain)
    forward.close()
    assert same_bits(plain, native)
    assert not np.isfinite(native).all() and np.isfinite(native).any()  # the overflowing values did overflow, not all of them
    for index in rng.choice(33, 2, replace=False):
        want = reference_forward(images[index].tolist(), cnn.filters.tolist(), cnn.weights.tolist())
        assert same_bits(native[index], np.array(want))


@EVERY_ISA
def test_native_forward_names_the_first_image_that_is_not_finite(rng: np.random.Generator, isa: str) -> None:
    """The first image holding a NaN or an infinity, wherever it sits in its image and its group; an image whose sums
    overflow holds neither, and a -inf that ReLU turns to 0 is still found."""
    cnn = random_cnn(rng)
    images = random_values(rng, 21, 100, 100)  # 21: a last group of 1 (2 or 4 elements a vector) or 5 (8 elements)
    images[6, 50:55, 50:55] = 1.7e308  # finite, but its sums overflow to infinities
    assert native_and_numpy(cnn, images, 2, isa, check=True)[2:] == (-1, -1)
    images[20, 99, 99] = np.nan  # the last image, alone in its group
    assert native_and_numpy(cnn, images, 2, isa, check=True)[2:] == (20, 20)
    images[13, 99, 0], images[17, 40, 96] = np.inf, np.nan  # the last column block overlaps the one before it
    assert native_and_numpy(cnn, images, 2, isa, check=True)[2:] == (13, 13)
    images[3, 0, 99] = -np.inf
    assert native_and_numpy(cnn, images, 3, isa, check=True)[2:] == (3, 3)
    cnn.filters[:, 0, 0] = np.abs(cnn.filters[:, 0, 0])  # every filter's tap at (0, 0) positive: -inf there sums to -inf,
    images = random_values(rng, 5, 100, 100)
    images[1, 95, 45] = -np.inf  # which ReLU makes 0: the outputs stay finite
    native, numpy, _, _ = native_and_numpy(cnn, images, 1, isa)
    assert same_bits(native, numpy) and np.isfinite(native).all()
    assert native_and_numpy(cnn, images, 1, isa, check=True)[2:] == (1, 1)


@EVERY_ISA
def test_native_relu_keeps_minus_zero_and_zeroes_negative_sums(rng: np.random.Generator, isa: str) -> None:
    """Image i's patch (0, i % 10) is all -0.0 and its patch (0, (i + 5) % 10) negative; filter 0 is positive, so their
    sums are -0.0, which ReLU keeps (a max with 0.0 would not), and a negative number, which ReLU makes +0.0. Output
    n is activation n (filter 0's at patch (0, n)) with its sign: every other weight is -0.0, and every other
    activation is positive or +0.0, so their terms are all -0.0."""
    filters = random_values(rng, 10, 5, 5)
    filters[0] = rng.uniform(0.5, 1.0, (5, 5))
    weights = np.full((10, 4000), -0.0)
    weights[np.arange(10), np.arange(10)] = 1.0
    images = random_values(rng, 11, 100, 100)  # 11: a last group of 1, 3 or 3 images
    for i, image in enumerate(images):
        zero, negative = i % 10, (i + 5) % 10
        image[0:5, 5 * zero : 5 * zero + 5] = -0.0
        image[0:5, 5 * negative : 5 * negative + 5] = -np.abs(image[0:5, 5 * negative : 5 * negative + 5])
    native, numpy, _, _ = native_and_numpy(Cnn(filters, weights), images, 2, isa)
    assert same_bits(native, numpy)
    for i in (0, 7, 10):
        assert same_bits(native[i], np.array(reference_forward(images[i].tolist(), filters.tolist(), weights.tolist())))
    for i, outputs in enumerate(native):
        zero, negative = i % 10, (i + 5) % 10
        assert outputs[zero] == 0 and np.signbit(outputs[zero])  # -0.0 kept
        assert outputs[negative] == 0 and (zero < negative or not np.signbit(outputs[negative]))  # made +0.0
        assert (outputs[[n for n in range(10) if n not in (zero, negative)]] >= 0).all()
    assert (native > 0).sum() >= 20  # the random patches' positive sums kept (about half of 88)


@NATIVE
@pytest.mark.parametrize("isa", ["avx1024", "AVX2", "avx512"])
def test_cnnlab_cpu_isa_refuses_kernels_that_cannot_run(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, isa: str) -> None:
    """CNNLAB_CPU_ISA: an unknown name is a UsageError, and so are kernels above what this CPU runs (no quiet fallback)."""
    if isa in backend.CPU_ISAS:
        pytest.skip(f"this CPU runs the {isa} kernels: there is nothing above it to refuse")
    monkeypatch.setenv(ISA_VARIABLE, isa)
    with pytest.raises(UsageError, match=f"^{ISA_VARIABLE}={isa}: "):
        CpuBackend(random_cnn(rng), threads=1)


@EVERY_ISA
def test_cnnlab_cpu_isa_chooses_the_kernels(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, isa: str) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 9, 100, 100)
    monkeypatch.delenv(ISA_VARIABLE, raising=False)  # a suite run under CNNLAB_CPU_ISA: the widest first all the same
    with CpuBackend(cnn, threads=2) as widest:
        want = widest.compute(ImageBatch(images)).values
        assert widest.device.endswith(f", {backend.CPU_ISAS[0]}")
    monkeypatch.setenv(ISA_VARIABLE, isa)
    with CpuBackend(cnn, threads=2) as chosen:
        assert chosen.device.endswith(f", {isa}")
        assert same_bits(chosen.compute(ImageBatch(images)).values, want)


@NATIVE
def test_a_run_asking_for_unknown_kernels_ends_in_one_line() -> None:
    result = cnnlab("cpu", env={ISA_VARIABLE: "sse9"})
    assert "CNNLAB_CPU_ISA=sse9: not one of avx512, avx2, x86-64" in assert_one_line_error(result)


@NATIVE
def test_native_forward_refuses_arrays_of_another_shape_or_dtype(rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    forward = backend.Forward(cnn.filters, cnn.weights, 1)
    with pytest.raises(ValueError):
        forward.compute(np.zeros((2, 100, 99)), np.empty((2, 10)), False)
    with pytest.raises(ValueError):
        forward.compute(np.zeros((2, 100, 100)), np.empty((3, 10)), False)
    with pytest.raises(ValueError):
        forward.compute(np.zeros((2, 100, 100), np.float32), np.empty((2, 10)), False)
    forward.close()
    with pytest.raises(ValueError):
        forward.compute(np.zeros((2, 100, 100)), np.empty((2, 10)), False)
    assert forward.threads == 0


def test_matches_loop_reference_bit_for_bit(rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 3, 100, 100)
    with CpuBackend(cnn) as backend:
        got = backend.compute(ImageBatch(images)).values
    for image, row in zip(images, got):
        want = reference_forward(image.tolist(), cnn.filters.tolist(), cnn.weights.tolist())
        assert row.tolist() == want


def _hand_case() -> tuple[Cnn, np.ndarray]:
    """image[i][j] = i - j; filter 0 all ones, filter 1 all minus ones, the rest zero.

    conv0[r][c] = sum over the 5x5 patch of (5r+x) - (5c+y) = 125 (r - c), so after ReLU it is
    125 (r - c) below the diagonal and 0 elsewhere; conv1 is the mirror, 125 (c - r) above it.
    """
    rows = np.arange(100, dtype=np.float64)
    image = rows[:, None] - rows[None, :]
    filters = np.zeros((10, 5, 5))
    filters[0], filters[1] = 1.0, -1.0
    weights = np.zeros((10, 4000))
    weights[0, 0:400] = 1.0  # sum of conv0
    weights[1, 0:400] = -1.0
    weights[2, 400:800] = 1.0  # sum of conv1
    weights[3, 0 * 400 + 19 * 20 + 0] = 1.0  # conv0[19][0]: checks the flattening order
    weights[4, 1 * 400 + 0 * 20 + 19] = 2.0  # conv1[0][19]
    weights[5, 1 * 400 + 19 * 20 + 0] = 7.0  # conv1[19][0] is negative before ReLU
    weights[6, 2 * 400 : 3 * 400] = 3.0  # filter 2 is all zeros
    return Cnn(filters, weights), image[None].copy()


def test_hand_computed_case() -> None:
    cnn, images = _hand_case()
    # sum over r > c of 125 (r - c) = 125 * sum_{d=1..19} d (20 - d) = 125 * 1330
    expected = [166250.0, -166250.0, 166250.0, 2375.0, 4750.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    with CpuBackend(cnn) as backend:
        assert backend.compute(ImageBatch(images)).values.tolist() == [expected]
    assert reference_forward(images[0].tolist(), cnn.filters.tolist(), cnn.weights.tolist()) == expected


def test_relu_zeroes_negative_convolutions_only(rng: np.random.Generator) -> None:
    """One tap and one weight: the output is the patch's corner value if positive, else 0."""
    filters = np.zeros((10, 5, 5))
    filters[0, 0, 0] = 1.0
    weights = np.zeros((10, 4000))
    weights[np.arange(10), np.arange(10)] = 1.0  # output n = conv0[0][n]
    images = random_values(rng, 2, 100, 100)
    images[0, 0, 0], images[0, 0, 5] = -abs(images[0, 0, 0]), abs(images[0, 0, 5])  # corners of either sign, always
    with CpuBackend(Cnn(filters, weights)) as backend:
        got = backend.compute(ImageBatch(images)).values
    corners = images[:, 0, 0:50:5]
    assert (got == np.where(corners < 0, 0.0, corners)).all()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_batching_and_threads_never_change_a_result(rng: np.random.Generator, threads: int) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 37, 100, 100)
    with CpuBackend(cnn, threads=threads) as backend:
        whole = backend.compute(ImageBatch(images)).values
        cuts = sorted(rng.choice(np.arange(1, 37), 5, replace=False))
        pieces = [backend.compute(ImageBatch(part.copy())).values for part in np.split(images, cuts)]
        one_by_one = [backend.compute(ImageBatch(images[i : i + 1].copy())).values for i in range(3)]
    assert (np.concatenate(pieces) == whole).all()
    assert (np.concatenate(one_by_one) == whole[:3]).all()


def test_containers_check_their_data() -> None:
    with pytest.raises(TypeError):
        ImageBatch(np.zeros((2, 100, 100), dtype=np.float32))
    with pytest.raises(ValueError):
        ImageBatch(np.zeros((2, 100, 99)))
    with pytest.raises(ValueError):
        ImageBatch(np.zeros((0, 100, 100)))
    with pytest.raises(ValueError):
        ImageBatch(np.zeros((2, 100, 200))[:, :, ::2])
    with pytest.raises(ValueError):
        Cnn(np.zeros((10, 5, 5)), np.zeros((10, 3999)))
    with pytest.raises(ValueError):
        OutputBatch(np.zeros((3, 9)))
    assert len(ImageBatch(np.ones((3, 100, 100)))) == 3
