"""The build step: nvcc turns kernel.cu into PTX holding both entry points (runs where nvcc is)."""

from __future__ import annotations

import os
import shutil
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
