"""The build step: each kernel source compiled by nvcc to a fatbin beside it, rebuilt only when stale.

A fatbin holds machine code for the common architectures (Turing to Hopper), so the driver loads
it at once instead of compiling PTX at every start (a JIT that cost a large part of cuda mode's
start-up), and compute_75 PTX as the fallback for any newer GPU, which the driver compiles once and
keeps in its cache. `build_ptx` gives the PTX alone, for reading what the compiler made of the sizes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cnnlab.errors import CnnlabError, DeviceError
from cnnlab.kernels import nvcc_defines
from cnnlab.resources import is_checkout, resource_dir

DEFAULT_ARCH = "compute_75"  # the oldest architecture CUDA 13 supports: its PTX runs on any GPU CUDA 13 does
MACHINE_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
ENTRY_POINTS = ("conv2d_relu", "flattened_to_dense", "sum_segments")
SOURCES = ("kernel.cu", "csv.cu")  # the CNN's kernels; the CSV parser's
BUILD_HINT = "run `python build.py` in a checkout (needs nvcc, the CUDA toolkit's compiler)"
PACKAGE_BUILD_HINT = (
    "this package was built where nvcc was not: put nvcc (the CUDA toolkit's compiler) on the PATH, or install a wheel built where it is"
)
# The Python files and headers that define what the kernels are built with: a change there is a change of the kernels.
INPUTS = (Path(__file__).with_name("network.py"), Path(__file__).with_name("kernels.py"))


@dataclass(frozen=True)
class Modules:
    """The built modules: the CNN's kernels and the CSV parser's."""

    cnn: Path
    csv: Path


def kernel_source(name: str = "kernel.cu") -> Path:
    return resource_dir("kernel") / name


def is_stale(source: Path, built: Path) -> bool:
    """True when `built` is missing or older than `source`, the headers beside it or the files that define its sizes."""
    inputs = (source, *source.parent.glob("*.h"), *INPUTS)
    return not built.exists() or built.stat().st_mtime < max(path.stat().st_mtime for path in inputs)


def _nvcc(source: Path, target: Path, flags: list[str]) -> Path:
    """Run nvcc on `source` with `flags`, writing `target` atomically, so a failed build leaves no half file."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise DeviceError(f"nvcc not found on PATH: cannot build {target} from {source}; install the CUDA toolkit")
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    command = [nvcc, *flags, "-O3", "-std=c++17", f"-I{source.parent}", *nvcc_defines(), "-o", str(partial), str(source)]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            first_error = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip())
            raise DeviceError(f"nvcc failed on {source}: {first_error}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def build_ptx(source: Path, ptx: Path, arch: str = DEFAULT_ARCH) -> Path:
    """PTX for one virtual architecture."""
    return _nvcc(source, ptx, ["-ptx", f"-arch={arch}"])


def build_fatbin(source: Path, fatbin: Path, archs: Sequence[str] = MACHINE_ARCHS) -> Path:
    """Machine code for `archs` and DEFAULT_ARCH's PTX, in one fatbin."""
    targets = [f"-gencode=arch=compute_{arch[3:]},code={arch}" for arch in archs]
    ptx = f"-gencode=arch={DEFAULT_ARCH},code={DEFAULT_ARCH}"
    return _nvcc(source, fatbin, ["-fatbin", *targets, ptx])


def ensure_modules() -> Modules:
    """The fatbins beside the kernel sources, built first where missing or (in a checkout) older than their sources.

    An installed package's fatbins were built from its own sources when its wheel was made, and pip
    gives the files it unpacks new times in any order: there a fatbin is used as it is.
    """
    built = []
    for name in SOURCES:
        source = kernel_source(name)
        fatbin = source.with_suffix(".fatbin")
        if not fatbin.exists() or (is_checkout() and is_stale(source, fatbin)):
            if shutil.which("nvcc") is None or not os.access(fatbin.parent, os.W_OK):
                state = "missing" if not fatbin.exists() else f"older than {name}"
                raise DeviceError(f"{fatbin} is {state}: {BUILD_HINT if is_checkout() else PACKAGE_BUILD_HINT}")
            build_fatbin(source, fatbin)
        built.append(fatbin)
    return Modules(*built)


def main(argv: Sequence[str] | None = None) -> int:
    """`python build.py [--arch sm_XX ...] [--force]`: build the kernels' fatbins where they are stale."""
    parser = argparse.ArgumentParser(prog="build.py", description="Compile kernel/*.cu to fatbins with nvcc.")
    parser.add_argument("--arch", action="append", help=f"machine architecture, repeatable (default {' '.join(MACHINE_ARCHS)})")
    parser.add_argument("--force", action="store_true", help="build even where the fatbins are newer than their sources")
    args = parser.parse_args(argv)
    try:
        for name in SOURCES:
            source = kernel_source(name)
            fatbin = source.with_suffix(".fatbin")
            if args.force or args.arch or is_stale(source, fatbin):
                build_fatbin(source, fatbin, args.arch or MACHINE_ARCHS)
                print(f"built {fatbin} ({', '.join(args.arch or MACHINE_ARCHS)} and {DEFAULT_ARCH} PTX)", file=sys.stderr)
            else:
                print(f"{fatbin} is up to date", file=sys.stderr)
    except CnnlabError as error:
        print(f"build.py: {error}", file=sys.stderr)
        return 2
    return 0
