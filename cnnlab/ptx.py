"""The build step: kernel/kernel.cu compiled by nvcc to kernel/kernel.ptx, rebuilt only when stale.

PTX for a virtual architecture is portable: the driver compiles it for the GPU it is loaded on.
compute_75 (Turing) is the oldest architecture CUDA 13 supports, so the default PTX runs on any
GPU that CUDA 13 does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from cnnlab.errors import CnnlabError, DeviceError
from cnnlab.kernels import nvcc_defines
from cnnlab.resources import resource_dir

DEFAULT_ARCH = "compute_75"
ENTRY_POINTS = ("conv2d_relu", "flattened_to_dense")
BUILD_HINT = "run `python build.py` in a checkout (needs nvcc, the CUDA toolkit's compiler)"


def kernel_source() -> Path:
    return resource_dir("kernel") / "kernel.cu"


# The Python files that define the sizes the build passes to nvcc: a change there is a change of the kernel.
SIZE_SOURCES = (Path(__file__).with_name("network.py"), Path(__file__).with_name("kernels.py"))


def is_stale(source: Path, ptx: Path) -> bool:
    """True when `ptx` is missing or older than `source` or the files that define its sizes."""
    newest = max(path.stat().st_mtime for path in (source, *SIZE_SOURCES))
    return not ptx.exists() or ptx.stat().st_mtime < newest


def build_ptx(source: Path, ptx: Path, arch: str = DEFAULT_ARCH) -> Path:
    """Run nvcc on `source`, writing `ptx` (atomically, so a failed build leaves no half file)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise DeviceError(f"nvcc not found on PATH: cannot build {ptx} from {source}; install the CUDA toolkit")
    partial = ptx.with_name(f".{ptx.name}.{os.getpid()}.tmp")
    command = [nvcc, "-ptx", f"-arch={arch}", "-O3", *nvcc_defines(), "-o", str(partial), str(source)]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            first_error = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip())
            raise DeviceError(f"nvcc failed on {source}: {first_error}")
        os.replace(partial, ptx)
    finally:
        partial.unlink(missing_ok=True)
    return ptx


def ensure_ptx() -> Path:
    """The PTX beside kernel.cu, built first if it is missing or older than the source."""
    source = kernel_source()
    ptx = source.with_suffix(".ptx")
    if not is_stale(source, ptx):
        return ptx
    if shutil.which("nvcc") is None or not os.access(ptx.parent, os.W_OK):
        state = "missing" if not ptx.exists() else "older than kernel.cu"
        raise DeviceError(f"{ptx} is {state}: {BUILD_HINT}")
    return build_ptx(source, ptx)


def main(argv: Sequence[str] | None = None) -> int:
    """`python build.py [--arch ARCH] [--force]`: build kernel/kernel.ptx when it is stale."""
    parser = argparse.ArgumentParser(prog="build.py", description="Compile kernel/kernel.cu to kernel/kernel.ptx with nvcc.")
    parser.add_argument("--arch", default=DEFAULT_ARCH, help=f"virtual architecture for nvcc -arch (default {DEFAULT_ARCH})")
    parser.add_argument("--force", action="store_true", help="build even if kernel.ptx is newer than kernel.cu")
    args = parser.parse_args(argv)
    source = kernel_source()
    ptx = source.with_suffix(".ptx")
    try:
        if args.force or args.arch != DEFAULT_ARCH or is_stale(source, ptx):
            build_ptx(source, ptx, args.arch)
            print(f"built {ptx} ({args.arch})", file=sys.stderr)
        else:
            print(f"{ptx} is up to date", file=sys.stderr)
    except CnnlabError as error:
        print(f"build.py: {error}", file=sys.stderr)
        return 2
    return 0
