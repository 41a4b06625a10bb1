"""The build step: nvcc turns kernel.cu into PTX holding both entry points (runs where nvcc is)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cnnlab import ptx
from cnnlab.errors import DeviceError

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not installed here")


@needs_nvcc
def test_build_makes_ptx_with_both_entry_points(tmp_path: Path) -> None:
    out = ptx.build_ptx(ptx.kernel_source(), tmp_path / "kernel.ptx")
    text = out.read_text()
    for entry in ptx.ENTRY_POINTS:
        assert f".entry {entry}(" in text
    assert ".target sm_75" in text
    assert ".const .align 8 .b8 filters[2000]" in text
    assert [p.name for p in tmp_path.iterdir()] == ["kernel.ptx"]


@needs_nvcc
def test_build_rebuilds_only_when_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "kernel.cu"
    shutil.copy(ptx.kernel_source(), source)
    monkeypatch.setattr(ptx, "kernel_source", lambda: source)
    assert ptx.main([]) == 0
    built = source.with_suffix(".ptx")
    first = built.stat().st_mtime_ns
    assert ptx.main([]) == 0 and built.stat().st_mtime_ns == first  # up to date: untouched
    os.utime(source, ns=(first + 10**9, first + 10**9))
    assert ptx.is_stale(source, built)
    assert ptx.ensure_ptx() == built and built.stat().st_mtime_ns != first
    assert ptx.main(["--arch", "compute_90"]) == 0 and ".target sm_90" in built.read_text()


def test_missing_nvcc_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    source = tmp_path / "kernel.cu"
    source.write_text("// empty\n")
    monkeypatch.setattr(ptx, "kernel_source", lambda: source)
    with pytest.raises(DeviceError, match="kernel.ptx is missing: run `python build.py`"):
        ptx.ensure_ptx()
    assert ptx.main([]) == 2
    assert capsys.readouterr().err.startswith("build.py: nvcc not found on PATH")


@needs_nvcc
def test_compile_error_is_reported(tmp_path: Path) -> None:
    source = tmp_path / "kernel.cu"
    source.write_text("this is not CUDA\n")
    with pytest.raises(DeviceError, match="nvcc failed"):
        ptx.build_ptx(source, tmp_path / "kernel.ptx")
    assert [p.name for p in tmp_path.iterdir()] == ["kernel.cu"]


@needs_nvcc
def test_kernel_sizes_come_from_python_alone(tmp_path: Path) -> None:
    """The PTX's launch bounds and shared arrays are the sizes cnnlab/kernels.py and network.py define;
    without the build step's -D flags the kernel does not compile at all."""
    from cnnlab.kernels import CONV_BANDS_PER_BLOCK, CONV_THREADS, DENSE_MAX_THREADS
    from cnnlab.network import CONV_LAYER_SIZE, FILTER_DIM, INPUT_DIM

    text = ptx.build_ptx(ptx.kernel_source(), tmp_path / "kernel.ptx").read_text()
    conv = text[text.index(".entry conv2d_relu(") :]
    assert re.search(r"\.maxntid (\d+), 1, 1", conv)[1] == str(CONV_THREADS)
    tile_bytes = CONV_BANDS_PER_BLOCK * FILTER_DIM * INPUT_DIM * 8
    assert re.search(rf"\.shared \.align 16 \.b8 [\w$]*tile\[{tile_bytes}\]", text), "conv2d_relu's tile"
    warp_sums_bytes = DENSE_MAX_THREADS // 32 * CONV_LAYER_SIZE * 8
    assert re.search(rf"\.shared \.align 8 \.b8 [\w$]*warp_sums\[{warp_sums_bytes}\]", text), "flattened_to_dense's warp sums"
    result = subprocess.run(["nvcc", "-ptx", "-o", str(tmp_path / "bare.ptx"), str(ptx.kernel_source())], capture_output=True, text=True)
    assert result.returncode != 0 and "kernel sizes missing" in result.stderr
