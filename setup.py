"""What setup.cfg cannot say: the native code (the CSV parser and the CPU forward) and the kernels' fatbins.

The CSV parser, cnnlab.files._lab_csv, is built from native/lab_csv_module.cpp, the stages it includes
(native/lab_csv_*.h) and kernel/lab_csv.h, the format's rules it shares with the CUDA parser; the CPU
forward, cnnlab.cpu._forward, from native/cpu_forward.cpp, with the network's sizes from
cnnlab/constants.py and -ffp-contract=off (every multiply and add rounded on its own, as cpu.rs
computes); the guard that lets cpu mode map .npy files, cnnlab.files._mapped_guard, from
native/mapped_guard.cpp. All are optional: where one cannot be compiled the install still succeeds,
with one line saying what to install and what it costs (cnnlab.extensions), and cnnlab uses its
Python and numpy twin instead (for the guard: the file is read, not mapped).

The fatbins are built with nvcc, where it is on the PATH, before a wheel or an sdist is made, so
that the package carries them (setup.cfg's package data) and `cnnlab cuda` runs where only the
driver is. Where nvcc is not, or fails, one line says so and the package carries the sources alone.
They are written where a checkout's `cnnlab cuda` and `python build.py` look for them, beside each
kernel/*.cu with its PTX (docs/packaging.md).

The long description is README.md without its links into the repository, which lead nowhere where an
index shows it.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from glob import glob
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cnnlab.constants import network_sizes  # noqa: E402
from cnnlab.extensions import EXTENSIONS, fallback_note  # noqa: E402


class OptionalBuildExt(build_ext):
    """build_ext that compiles the extensions at once, one a core, and, when the compiler is missing or fails, leaves
    the extensions out and says so in one line (cnnlab.extensions's, as a run says it)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:  # unless -j says otherwise: on 2 cores the install's build takes 2.5 s, not 4.5 s
            self.parallel = True

    def run(self) -> None:
        self.failed: list[str] = []
        try:
            super().run()
        except Exception:  # no compiler at all: distutils raises before compiling anything
            self.failed = list(EXTENSIONS)
        if self.failed:
            print(fallback_note(self.failed), file=sys.stderr)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception:  # CompileError, LinkError, a missing Python.h ... (the compiler has said why, above)
            self.failed.append(ext.name)


def build_kernels() -> None:
    """The fatbins beside kernel/*.cu, built where missing or stale (cnnlab.cuda.nvcc, as build.py builds them)."""
    if shutil.which("nvcc") is None:
        print("cnnlab: nvcc is not on the PATH: this package carries no kernel fatbins (cuda mode will need nvcc)", file=sys.stderr)
        return
    from cnnlab.cuda.buildstep import main as build_fatbins
    from cnnlab.cuda.nvcc import SOURCES, is_stale, kernel_source

    if build_fatbins([]) != 0:  # an nvcc too old for the architectures, say: the package is still usable on the CPU
        for source in map(kernel_source, SOURCES):  # an installed package trusts its fatbins: never ship a stale one
            if is_stale(source, source.with_suffix(".fatbin")):
                source.with_suffix(".fatbin").unlink(missing_ok=True)
                source.with_suffix(".ptx").unlink(missing_ok=True)
        print("cnnlab: building the kernels' fatbins failed (see above): the package carries only up-to-date ones", file=sys.stderr)


def long_description() -> str:
    """README.md with each relative link as its text alone: the files they name (docs/, BENCHMARKS.md) are in the
    repository and the sdist, not beside an index's page."""
    readme = Path(__file__).with_name("README.md").read_text(encoding="utf-8")
    return re.sub(r"\[([^\]]+)\]\((?![a-z]+://)[^)]*\)", r"\1", readme)


class BuildPyWithKernels(build_py):
    """build_py, with the fatbins built first (not for an editable install: a checkout builds them when stale)."""

    def run(self) -> None:
        if not self.editable_mode:
            build_kernels()
        super().run()


class SdistWithKernels(sdist):
    """sdist, with the fatbins built first, so that an install from it needs no nvcc either."""

    def run(self) -> None:
        build_kernels()
        super().run()


setup(
    long_description=long_description(),
    ext_modules=[
        Extension(
            "cnnlab.files._lab_csv",
            ["native/lab_csv_module.cpp"],
            include_dirs=["kernel", "native"],
            depends=["kernel/lab_csv.h", "kernel/lab_pow5_table.h", "native/isa_table.h", "native/pool.h", *glob("native/lab_csv_*.h")],
            extra_compile_args=["-O3", "-std=c++17", "-fvisibility=hidden", "-pthread"],
            extra_link_args=["-pthread"],
            language="c++",
        ),
        Extension(
            "cnnlab.cpu._forward",
            ["native/cpu_forward.cpp"],
            depends=["native/cpu_forward_kernels.h", "native/isa_table.h", "native/pool.h", "cnnlab/constants.py"],
            define_macros=[(name, str(value)) for name, value in network_sizes().items()],
            # -fno-wrapv undoes Python's -fwrapv, which keeps gcc from turning the kernels' int indices into pointer
            # steps: the AVX2 forward spills and runs 0.8x without it.
            extra_compile_args=["-O3", "-std=c++17", "-ffp-contract=off", "-fno-wrapv", "-fvisibility=hidden", "-pthread", "-Wno-psabi"],
            extra_link_args=["-pthread"],
            language="c++",
        ),
        Extension(
            "cnnlab.files._mapped_guard",
            ["native/mapped_guard.cpp"],
            extra_compile_args=["-O2", "-std=c++17", "-fvisibility=hidden"],
            language="c++",
        ),
    ],
    cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPyWithKernels, "sdist": SdistWithKernels},
)
