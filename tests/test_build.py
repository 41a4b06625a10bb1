"""The build step: nvcc turns each kernel source into a fatbin, and kernel.cu's PTX holds both entry points (runs where nvcc is)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cnnlab.cuda import buildstep, nvcc
from cnnlab.errors import DeviceError
from cnnlab.resources import is_checkout

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not installed here")


@needs_nvcc
def test_build_makes_ptx_with_both_entry_points(tmp_path: Path) -> None:
    out = nvcc.build_ptx(nvcc.kernel_source(), tmp_path / "kernel.ptx")
    text = out.read_text()
    for entry in nvcc.ENTRY_POINTS:
        assert f".entry {entry}(" in text
    assert ".target sm_75" in text
    assert ".const .align 8 .b8 filters[2000]" in text
    assert [p.name for p in tmp_path.iterdir()] == ["kernel.ptx"]


@needs_nvcc
@pytest.mark.slow
@pytest.mark.skipif(not is_checkout(), reason="an installed package uses its fatbins as they are: a checkout's are rebuilt where stale")
def test_build_rebuilds_only_when_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in nvcc.SOURCES:
        shutil.copy(nvcc.kernel_source(name), tmp_path / name)
    for header in nvcc.kernel_source().parent.glob("*.h"):
        shutil.copy(header, tmp_path / header.name)
    monkeypatch.setattr(nvcc, "kernel_source", lambda name="kernel.cu": tmp_path / name)
    source = tmp_path / "kernel.cu"
    assert buildstep.main(["--arch", "sm_90", "--no-ladder"]) == 0
    built = source.with_suffix(".fatbin")
    first = built.stat().st_mtime_ns
    assert buildstep.main(["--no-ladder"]) == 0 and built.stat().st_mtime_ns == first  # up to date: untouched
    os.utime(source, ns=(first + 10**9, first + 10**9))
    assert nvcc.is_stale(source, built)
    assert nvcc.ensure_modules().cnn == built and built.stat().st_mtime_ns != first
    assert set(re.findall(rb"sm_\d+", built.read_bytes())) == {arch.encode() for arch in nvcc.MACHINE_ARCHS}
    assert buildstep.main(["--arch", "sm_90", "--no-ladder"]) == 0
    assert set(re.findall(rb"sm_\d+", built.read_bytes())) == {b"sm_90", b"sm_75"}  # sm_90's code, compute_75's PTX (.target)
    source.with_suffix(".ptx").unlink()  # the PTX is part of the build: missing, the build is stale
    assert nvcc.ensure_modules().cnn == built and source.with_suffix(".ptx").exists()


@needs_nvcc
def test_the_fatbin_carries_the_ptx_file_beside_the_source(tmp_path: Path) -> None:
    """As the lab's build.rs: kernel.ptx beside kernel.cu, and the fatbin's fallback is that PTX (fatbinary keeps it
    uncompressed, without its comments)."""

    def code(ptx: bytes) -> list[bytes]:  # the lines that are not comments, their white space folded
        return [b" ".join(line.split()) for line in ptx.split(b"\n") if line.strip() and not line.strip().startswith(b"//")]

    built = nvcc.build_fatbin(nvcc.kernel_source(), tmp_path / "kernel.fatbin", ["sm_90"])
    ptx = (tmp_path / "kernel.ptx").read_bytes()
    fatbin = built.read_bytes()
    start = fatbin.index(b".version")
    assert code(fatbin[start : fatbin.index(b"\0", start)]) == code(ptx)
    for entry in nvcc.ENTRY_POINTS:
        assert f".entry {entry}(".encode() in ptx
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kernel.fatbin", "kernel.ptx"]


def test_missing_nvcc_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    (tmp_path / "kernel.cu").write_text("// empty\n")
    (tmp_path / "csv.cu").write_text("// empty\n")
    monkeypatch.setattr(nvcc, "kernel_source", lambda name="kernel.cu": tmp_path / name)
    hint = "run `python build.py`" if is_checkout() else "this package was built where nvcc was not"
    with pytest.raises(DeviceError, match=re.escape(f"kernel.fatbin is missing: {hint}")):
        nvcc.ensure_modules()
    assert buildstep.main(["--no-ladder"]) == 2
    assert capsys.readouterr().err.startswith("build.py: nvcc not found on PATH")


@needs_nvcc
def test_compile_error_is_reported(tmp_path: Path) -> None:
    source = tmp_path / "kernel.cu"
    source.write_text("this is not CUDA\n")
    with pytest.raises(DeviceError, match="nvcc failed"):
        nvcc.build_ptx(source, tmp_path / "kernel.ptx")
    assert [p.name for p in tmp_path.iterdir()] == ["kernel.cu"]


@needs_nvcc
def test_kernel_sizes_come_from_python_alone(tmp_path: Path) -> None:
    """The PTX's launch bounds and shared arrays are the sizes cnnlab/constants.py and cnnlab/cuda/kernels.py define;
    without the build step's -D flags the kernel does not compile at all."""
    from cnnlab.constants import CONV_BANDS_PER_BLOCK, CONV_LAYER_SIZE, DENSE_MAX_THREADS, FILTER_DIM, INPUT_DIM
    from cnnlab.cuda.kernels import CONV_THREADS

    text = nvcc.build_ptx(nvcc.kernel_source(), tmp_path / "kernel.ptx").read_text()
    conv = text[text.index(".entry conv2d_relu(") :]
    assert re.search(r"\.maxntid (\d+), 1, 1", conv)[1] == str(CONV_THREADS)
    tile_bytes = CONV_BANDS_PER_BLOCK * FILTER_DIM * INPUT_DIM * 8
    assert re.search(rf"\.shared \.align 16 \.b8 [\w$]*tile\[{tile_bytes}\]", text), "conv2d_relu's tile"
    warp_sums_bytes = DENSE_MAX_THREADS // 32 * CONV_LAYER_SIZE * 8
    assert re.search(rf"\.shared \.align 8 \.b8 [\w$]*warp_sums\[{warp_sums_bytes}\]", text), "flattened_to_dense's warp sums"
    result = subprocess.run(["nvcc", "-ptx", "-o", str(tmp_path / "bare.ptx"), str(nvcc.kernel_source())], capture_output=True, text=True)
    assert result.returncode != 0 and "kernel sizes missing" in result.stderr
