"""nvcc: a kernel source compiled to PTX and a fatbin beside it, rebuilt only when stale (cnnlab.cuda.buildstep builds them all).

As the lab's build.rs did, the build step writes the source's PTX beside it (kernel/kernel.ptx, for
compute_75: what a reader opens to see what the compiler made of the kernels and their sizes). The
fatbin is assembled (fatbinary) from that PTX file, uncompressed, the fallback the driver compiles once
for any GPU newer than Hopper, and machine code for the common architectures (Turing to Hopper),
compiled from the source for each (so each keeps its own __CUDA_ARCH__ paths: cp.async from sm_80), so
that the driver loads it at once instead of compiling PTX at every start (a JIT that cost a large part
of cuda mode's start-up).

The optimization ladder's kernels (kernel/ladder/, ladder.py and builds.py) are built the same way, one
fatbin per `Build`: a source and the -D sizes of its own, added to kernel.cu's (cnnlab/constants.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cnnlab.constants import kernel_sizes
from cnnlab.errors import DeviceError
from cnnlab.resources import is_checkout, resource_dir

DEFAULT_ARCH = "compute_75"  # the oldest architecture CUDA 13 supports: its PTX runs on any GPU CUDA 13 does
MACHINE_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
ENTRY_POINTS = ("conv2d_relu", "flattened_to_dense", "sum_segments", "find_nonfinite")
SOURCES = ("kernel.cu", "csv.cu")  # the CNN's kernels; the CSV parser's
BUILD_HINT = "run `python build.py` in a checkout (needs nvcc, the CUDA toolkit's compiler)"
PACKAGE_BUILD_HINT = (
    "this package was built where nvcc was not: put nvcc (the CUDA toolkit's compiler) on the PATH, or install a wheel built where it is"
)
# The Python files that define what the kernels are built with: a change there is a change of the kernels.
INPUTS = (Path(__file__).parents[1] / "constants.py",)
# A ladder kernel also takes sizes from builds.py, and may include any source of kernel/ or kernel/ladder/.
LADDER_INPUTS = (Path(__file__).with_name("builds.py"),)


@dataclass(frozen=True)
class Build:
    """One fatbin: a source under kernel/, the -D sizes of its own, and a name for the variant."""

    source: str
    sizes: Mapping[str, int] = field(default_factory=dict)
    variant: str = ""


@dataclass(frozen=True)
class Modules:
    """The built modules: the CNN's kernels and the CSV parser's."""

    cnn: Path
    csv: Path


def nvcc_defines(sizes: Mapping[str, int] | None = None) -> list[str]:
    """kernel_sizes() as nvcc -D flags, with `sizes` added or put in their place (the ladder's builds)."""
    return [f"-D{name}={value}" for name, value in {**kernel_sizes(), **(sizes or {})}.items()]


def kernel_source(name: str = "kernel.cu") -> Path:
    return resource_dir("kernel") / name


def is_stale(source: Path, built: Path, extra: Sequence[Path] = ()) -> bool:
    """True when `built` is missing or older than `source`, the headers beside it, `extra` or the files that define its sizes."""
    inputs = (source, *source.parent.glob("*.h"), *extra, *INPUTS)
    return not built.exists() or built.stat().st_mtime < max(path.stat().st_mtime for path in inputs)


def _nvcc(source: Path, target: Path, flags: list[str], sizes: Mapping[str, int] | None = None) -> Path:
    """Run nvcc on `source` with `flags` and the sizes as -D flags, writing `target` atomically, so a
    failed build leaves no half file."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise DeviceError(f"nvcc not found on PATH: cannot build {target} from {source}; install the CUDA toolkit")
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    command = [nvcc, *flags, "-O3", "-std=c++17", f"-I{source.parent}", *nvcc_defines(sizes), "-o", str(partial), str(source)]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            first_error = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip())
            raise DeviceError(f"nvcc failed on {source}: {first_error}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def build_ptx(source: Path, ptx: Path, arch: str = DEFAULT_ARCH, sizes: Mapping[str, int] | None = None) -> Path:
    """PTX for one virtual architecture."""
    return _nvcc(source, ptx, ["-ptx", f"-arch={arch}"], sizes)


def build_fatbin(source: Path, fatbin: Path, archs: Sequence[str] = MACHINE_ARCHS, sizes: Mapping[str, int] | None = None) -> Path:
    """The PTX beside the fatbin (DEFAULT_ARCH's), then the fatbin: machine code for `archs` and that PTX file."""
    ptx = build_ptx(source, fatbin.with_suffix(".ptx"), DEFAULT_ARCH, sizes)
    fatbinary = shutil.which("fatbinary")
    if fatbinary is None:
        raise DeviceError(f"fatbinary not found on PATH: cannot build {fatbin}; install the CUDA toolkit")
    partial = fatbin.with_name(f".{fatbin.name}.{os.getpid()}.tmp")
    with tempfile.TemporaryDirectory(prefix="cnnlab-build-") as folder:
        images = [f"--image3=kind=ptx,sm={DEFAULT_ARCH[8:]},file={ptx}"]
        for arch in archs:
            cubin = _nvcc(source, Path(folder) / f"{arch}.cubin", ["-cubin", f"-arch={arch}"], sizes)
            images.append(f"--image3=kind=elf,sm={arch[3:]},file={cubin}")
        try:
            result = subprocess.run([fatbinary, "--64", "--compress=false", f"--create={partial}", *images], capture_output=True, text=True)
            if result.returncode != 0:
                raise DeviceError(f"fatbinary failed on {fatbin}: {result.stderr.strip() or result.returncode}")
            os.replace(partial, fatbin)
        finally:
            partial.unlink(missing_ok=True)
    return fatbin


def ladder_inputs(source: Path) -> list[Path]:
    """What a ladder kernel may include: every source of kernel/ and kernel/ladder/, and ladder.py."""
    kernel = source.parent.parent
    return [*kernel.glob("*.cu"), *kernel.glob("*.h"), *source.parent.glob("*.cu"), *LADDER_INPUTS]


def fatbin_path(build: Build) -> Path:
    source = kernel_source(build.source)
    return source.with_name(f"{source.stem}{'.' + build.variant if build.variant else ''}.fatbin")


def _ensure(source: Path, fatbin: Path, extra: Sequence[Path] = (), sizes: Mapping[str, int] | None = None) -> Path:
    """`fatbin`, built first where missing or (in a checkout) older than its inputs.

    An installed package's fatbins were built from its own sources when its wheel was made, and pip
    gives the files it unpacks new times in any order: there a fatbin is used as it is.
    """
    if not fatbin.exists() or (is_checkout() and (is_stale(source, fatbin, extra) or not fatbin.with_suffix(".ptx").exists())):
        if shutil.which("nvcc") is None or not os.access(fatbin.parent, os.W_OK):
            state = "missing" if not fatbin.exists() else f"older than {source.name}"
            raise DeviceError(f"{fatbin} is {state}: {BUILD_HINT if is_checkout() else PACKAGE_BUILD_HINT}")
        build_fatbin(source, fatbin, sizes=sizes)
    return fatbin


def ensure_fatbin(build: Build) -> Path:
    """The fatbin of one ladder build (see _ensure)."""
    source = kernel_source(build.source)
    return _ensure(source, fatbin_path(build), ladder_inputs(source), build.sizes)


def ensure_modules() -> Modules:
    """The fatbins of the CNN's kernels and the CSV parser's (see _ensure)."""
    return Modules(*(_ensure(kernel_source(name), kernel_source(name).with_suffix(".fatbin")) for name in SOURCES))
