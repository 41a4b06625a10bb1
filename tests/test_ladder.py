"""The optimization ladder (cnnlab/cuda/ladder.py and launchers.py, kernel/ladder/): every rung's source builds and holds what
its header claims (runs where nvcc is), and on a GPU every rung computes the CPU's outputs from fresh
random data: bit for bit where the rung claims it, the conv bit for bit where it claims that, within
the lab's rule otherwise; `cnnlab cuda --kernel NAME` end to end; the ladder's bench rows."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import (
    SUBPROCESS_ENV,
    TIMING_LINE,
    assert_one_line_error,
    assert_within_rule,
    cnnlab,
    random_cnn,
    write_files,
)

from cnnlab.bench.report import D2D_BOUND, BenchOptions, BenchReport, Figure, format_ladder
from cnnlab.compare import compare_files
from cnnlab.cpu.backend import CpuBackend
from cnnlab.cuda import builds, ladder, launchers, nvcc
from cnnlab.errors import DeviceError
from cnnlab.generate import random_values
from cnnlab.network import Cnn, ImageBatch

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not installed here")


ENTRY_POINTS = {
    "ladder/01_lab.cu": ("conv_lab", "dense_lab"),
    "ladder/02_batched_global.cu": ("conv_global", "dense_global"),
    "ladder/03_constant_filters.cu": ("conv_constant", "dense_global"),
    "ladder/04_shared_tiles.cu": ("dense_tree",),
    "ladder/05_block_sweep.cu": ("conv2d_relu", "dense_tree"),
    "ladder/07_coarsened.cu": ("dense_coarsened",),
    "ladder/08_fused.cu": ("fused",),
    "ladder/09_fused_tiled.cu": ("fused_tiled",),
    "ladder/10_im2col_mma.cu": ("conv_mma", "dense_mma"),
    "ladder/11_fused_tiled_fma.cu": ("fused_tiled",),
    "ladder/12_two_kernels.cu": ("conv_tiled", "dense_coarsened"),
}


def entry(ptx: str, name: str) -> str:
    """The PTX of one entry point."""
    start = ptx.index(f".entry {name}(")
    end = ptx.find(".entry ", start + 1)
    return ptx[start : end if end > 0 else None]


# Without a GPU: the sources, the builds, the registry.


def test_every_rung_is_registered_once_with_a_source_that_says_what_it_changes() -> None:
    assert [rung.number for rung in ladder.RUNGS] == list(range(1, 13))
    assert len(ladder.BY_NAME) == len(ladder.RUNGS) and ladder.DEFAULT_KERNEL in ladder.BY_NAME
    for rung in ladder.RUNGS:
        text = nvcc.kernel_source(rung.source).read_text()
        if rung.source.startswith("ladder/"):
            assert text.startswith(f"// Rung {rung.number}, {rung.name}:"), rung.source
            header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("//")).lower()
            for part in ("what changes", "threads to data", "exactness", "napkin math"):
                assert part in header, f"{rung.source}'s header says nothing of {part}"
    assert sorted(ENTRY_POINTS) == sorted({build.source for build in builds.every_build()})
    assert {rung.source for rung in ladder.RUNGS} - {"kernel.cu"} == set(ENTRY_POINTS), "a rung the build step does not build"


@needs_nvcc
@pytest.mark.parametrize("arch", ["compute_75", "compute_90"])
@pytest.mark.parametrize("source", sorted(ENTRY_POINTS))
def test_every_rung_builds_for_the_oldest_and_the_newest_target(tmp_path: Path, source: str, arch: str) -> None:
    """compute_75 takes each source's fallbacks (no cp.async, no tensor cores), compute_90 the code the H100 runs."""
    build = next(build for build in builds.every_build() if build.source == source)
    ptx = nvcc.build_ptx(nvcc.kernel_source(source), tmp_path / "rung.ptx", arch, build.sizes).read_text()
    for name in ENTRY_POINTS[source]:
        assert f".entry {name}(" in ptx


@needs_nvcc
def test_each_rung_does_what_its_header_says(tmp_path: Path) -> None:
    def ptx(build: nvcc.Build, arch: str) -> str:
        return nvcc.build_ptx(nvcc.kernel_source(build.source), tmp_path / "rung.ptx", arch, build.sizes).read_text()

    constant = ptx(builds.CONSTANT_BUILD, "compute_90")
    assert "ld.const.f64" in entry(constant, "conv_constant") and "ld.const" not in entry(constant, "conv_global")
    tiled = ptx(builds.FUSED_TILED_BUILD, "compute_90")
    assert "cp.async.cg.shared.global" in tiled and "fma.rn.f64" in tiled
    assert "cp.async" not in ptx(builds.FUSED_TILED_BUILD, "compute_75")
    # The bit-exact conv: separately rounded multiplies and adds, 250 of each for 10 filters (less the first adds);
    # rung 11's: 10 multiplies, the rest FMAs (the dense layer's 100 besides).
    assert (tiled.count("mul.rn.f64"), tiled.count("add.rn.f64"), tiled.count("fma.rn.f64")) == (250, 240, 100)
    fma = ptx(builds.FUSED_TILED_FMA_BUILD, "compute_90")
    assert (fma.count("mul.f64"), fma.count("add.rn.f64"), fma.count("fma.rn.f64")) == (10, 0, 340)
    mma = ptx(builds.MMA_BUILD, "compute_90")
    assert "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64" in entry(mma, "conv_mma")
    assert "mma.sync.aligned.m8n8k4" in entry(mma, "dense_mma")
    assert "mma.sync" not in ptx(builds.MMA_BUILD, "compute_75")
    # Rung 12: rung 9's conv alone, bit-exact (the dense layer's FMAs are dense_coarsened's), streamed by cp.async.
    conv = entry(ptx(builds.TWO_KERNELS_BUILD, "compute_90"), "conv_tiled")
    assert (conv.count("mul.rn.f64"), conv.count("add.rn.f64"), conv.count("fma.rn.f64")) == (250, 240, 0)
    assert "cp.async.cg.shared.global" in conv and "st.global.f64" in conv


def test_the_tiled_rungs_image_stride_shardeds_each_half_warp_over_every_bank() -> None:
    for tile in (8, 16):
        stride, columns = builds.conflict_free_stride(tile), 32 // tile
        assert stride % 2 == 0  # 16-byte copies
        for half in (0, 16):
            # 8-byte loads: lane -> image lane / columns, column lane % columns; a double covers banks 2k, 2k + 1.
            banks = [((lane // columns) * stride + lane % columns * 5) * 2 % 32 for lane in range(half, half + 16)]
            assert sorted(banks) == list(range(0, 32, 2))
    assert launchers.fused_tiled_shared_bytes(builds.fused_tiled_sizes(16, 2)) <= 227 * 1024  # what an H100 block may take


def test_an_unknown_kernel_is_one_line_and_status_2() -> None:
    message = assert_one_line_error(cnnlab("cuda", "--kernel", "fastest"))
    assert "invalid choice: 'fastest'" in message and "fused_tiled" in message


def test_a_rung_the_gpu_cannot_run_is_refused_in_one_line() -> None:
    setup = SimpleNamespace(capability=(7, 5))
    with pytest.raises(DeviceError, match="kernel im2col_mma needs compute capability 8.0 or newer; this GPU has 7.5"):
        ladder.launcher("im2col_mma", setup, None)


def test_the_ladder_table_measures_each_rung_against_the_bound_the_rung_below_and_the_best_peer() -> None:
    report = BenchReport(BenchOptions(), fp64_peak=1e12)
    report.figures += [
        Figure("kernels", "bound: device-to-device copy", 1000.0, key=D2D_BOUND),
        Figure("kernels", "1 lab", 10.0, D2D_BOUND, bytes_per_image=100, flops_per_image=1e6, repeat_range=(9.0, 11.0),
               check="within rule"),
        Figure("kernels", "2 batched_global", 40.0, D2D_BOUND, bytes_per_image=100, flops_per_image=1e6, check="bit-exact"),
        Figure("peers", "peer: a", 8.0, D2D_BOUND, flops_per_image=1e6, check="within rule"),
        Figure("peers", "peer: b", 20.0, D2D_BOUND, flops_per_image=1e6, check="within rule"),
    ]
    table = format_ladder(report).splitlines()
    lab = next(line for line in table if line.startswith("1 lab"))
    assert "(9..11)" in lab and "1.0%" in lab and "within rule" in lab  # 10 of 1,000; 1e7 of 1e12 FLOP/s
    assert next(line for line in table if line.startswith("2 batched_global")).split()[-2] == "4.00"  # x below
    assert table[-1] == "best rung: 2 batched_global, 40 images/s, 4.0% of the D2D bound, 2.00x the best peer (peer: b)"


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_peer_that_is_not_installed_is_skipped_with_its_reason(framework: str) -> None:
    if importlib.util.find_spec(framework) is not None:
        pytest.skip(f"{framework} is installed here: the bench runs it")
    done = subprocess.run(
        [sys.executable, "-m", "cnnlab.bench.peers", framework, "--images", "2"],
        capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert json.loads(line)["skipped"].startswith("not installed")


# On a GPU: every rung against the CPU backend.


def cpu_outputs(cnn: Cnn, images: np.ndarray) -> np.ndarray:
    with CpuBackend(cnn) as backend:
        return backend.compute(ImageBatch(images)).values


def gpu_outputs(cnn: Cnn, images: np.ndarray, kernel: str, chunk: int, streams: int = 2) -> np.ndarray:
    from cnnlab.cuda.context import CudaContext
    from cnnlab.cuda.ladder import LaunchConfig

    with CudaContext(cnn, len(images), LaunchConfig(kernel=kernel, chunk_images=chunk, streams=streams)) as gpu:
        return gpu.compute(ImageBatch(images)).values


def counts(rung: ladder.Rung) -> tuple[int, int]:
    """Images and chunk: tails of every tile size (16, 32 ...), and few for the rung that launches per image."""
    return (23, 10) if rung.name == "lab" else (333, 150)


@pytest.mark.gpu
@pytest.mark.parametrize("rung", ladder.RUNGS, ids=lambda rung: rung.name)
def test_every_rung_computes_the_cpus_outputs(rng: np.random.Generator, rung: ladder.Rung) -> None:
    cnn = random_cnn(rng)
    count, chunk = counts(rung)
    images = random_values(rng, count, 100, 100)
    got, want = gpu_outputs(cnn, images, rung.name, chunk), cpu_outputs(cnn, images)
    if rung.exactness == ladder.BIT_EXACT:
        assert got.view(np.uint64).tolist() == want.view(np.uint64).tolist()
    else:
        assert_within_rule(got, want, cnn, images)


@pytest.mark.gpu
@pytest.mark.parametrize("rung", ladder.RUNGS, ids=lambda rung: rung.name)
def test_the_conv_is_bit_exact_where_the_rung_says_so(rng: np.random.Generator, rung: ladder.Rung) -> None:
    """With one weight of 1 per neuron and the rest 0, every dense sum is exact in any order: output n
    is the activation its 1 picks, so the outputs equal the CPU's exactly if and only if those
    activations do (a zero's sign aside). Two draws of 10 positions each, fresh every run."""
    count, chunk = counts(rung)
    images = random_values(rng, count, 100, 100)
    filters = random_values(rng, 10, 5, 5)
    for _ in range(2):
        weights = np.zeros((10, 4000))
        weights[np.arange(10), rng.choice(4000, 10, replace=False)] = 1.0
        cnn = Cnn(filters, weights)
        got, want = gpu_outputs(cnn, images, rung.name, chunk), cpu_outputs(cnn, images)
        if rung.conv_exact:
            assert (got == want).all(), f"{(got != want).sum()} activations differ from the CPU's"
        else:
            assert_within_rule(got, want, cnn, images)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["lab", "fused_tiled", "im2col_mma"])
def test_cli_cuda_kernel_end_to_end_passes_compare(tmp_path: Path, rng: np.random.Generator, kernel: str) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 37, 100, 100)
    cnn_path, input_path = write_files(tmp_path, cnn, images)
    assert cnnlab("cpu", cnn_path, input_path, tmp_path / "cpu.csv").returncode == 0
    result = cnnlab("cuda", "--kernel", kernel, cnn_path, input_path, tmp_path / "cuda.csv", "--batch", "16")
    assert result.returncode == 0, result.stderr
    assert TIMING_LINE.match(result.stdout) and result.stderr == ""
    comparison = compare_files(tmp_path / "cpu.csv", tmp_path / "cuda.csv")
    assert comparison.matches and comparison.values == 370, comparison.problem


@pytest.mark.gpu
def test_time_kernels_gives_the_outputs_compute_gives(rng: np.random.Generator) -> None:
    from cnnlab.bench.gpu import time_kernels
    from cnnlab.cuda.context import CudaContext, DeviceImages
    from cnnlab.cuda.ladder import LaunchConfig

    cnn = random_cnn(rng)
    images = random_values(rng, 100, 100, 100)
    with CudaContext(cnn, 100, LaunchConfig(kernel="fused_tiled", chunk_images=100, streams=1)) as gpu:
        want = gpu.compute(ImageBatch(images)).values
        resident = gpu.upload(ImageBatch(images))
        timing = time_kernels(gpu, launchers.fused_tiled(gpu.setup), DeviceImages(resident.allocation, 100), 3)
    assert len(timing.seconds) == 3 and all(seconds > 0 for seconds in timing.seconds)
    assert timing.outputs.values.view(np.uint64).tolist() == want.view(np.uint64).tolist()


@pytest.mark.gpu
def test_rung_12_gives_the_same_bits_whatever_its_passes(rng: np.random.Generator) -> None:
    """The passes of rung 12 cut a chunk where they may: each image's sums are the same whichever pass holds it."""
    from cnnlab.bench.gpu import time_kernels
    from cnnlab.cuda.context import CudaContext, DeviceImages
    from cnnlab.cuda.ladder import LaunchConfig

    cnn = random_cnn(rng)
    images = random_values(rng, 101, 100, 100)
    with CudaContext(cnn, 101, LaunchConfig(kernel="two_kernels", streams=1)) as gpu:
        resident = DeviceImages(gpu.upload(ImageBatch(images)).allocation, 101)
        outputs = [time_kernels(gpu, launchers.TwoKernels(gpu.setup, passes), resident, 1).outputs.values for passes in (4, 28, 1000)]
    for got in outputs[1:]:
        assert got.view(np.uint64).tolist() == outputs[0].view(np.uint64).tolist()
    assert_within_rule(outputs[0], cpu_outputs(cnn, images), cnn, images)


@pytest.mark.gpu
def test_bench_kernels_rows_hold_every_rung_checked(tmp_path: Path) -> None:
    result = cnnlab("bench", "--rows", "kernels", "--images", "2048", "--repeats", "2", "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    rungs = [figure for figure in report["figures"] if figure["row"] == "kernels" and figure["key"] is None]
    assert [int(figure["name"].split()[0]) for figure in rungs] == list(range(1, 13))
    for figure in rungs:
        assert figure["check"] in ("bit-exact", "within rule"), figure
        assert 0 < figure["of_bound"] < 1.5 and figure["repeat_range"][0] <= figure["images_per_second"] <= figure["repeat_range"][1]
    assert "block sweep" in " ".join(report["notes"]) and re.search(r"best rung: \d+ \w+", result.stdout)
    print(result.stdout)
