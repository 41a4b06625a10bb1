"""What setup.cfg cannot say: the native CSV parser, cnnlab._lab_csv, and the kernels' fatbins.

The parser is built from native/lab_csv_module.cpp with kernel/lab_csv.h, the format's rules it
shares with the CUDA parser. It is optional: where it cannot be compiled the install still
succeeds, with one line saying what to install, and cnnlab parses CSV files in Python instead.

The fatbins are built with nvcc, where it is on the PATH, before a wheel or an sdist is made, so
that the package carries them (setup.cfg's package data) and `cnnlab cuda` runs where only the
driver is. Where nvcc is not, or fails, one line says so and the package carries the sources alone.
"""

from __future__ import annotations

import os
import shutil
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HINT = (
    "cnnlab: building the native CSV parser failed: install a C++17 compiler (g++ >= 11) and reinstall; "
    "CSV files will be parsed in Python, about 50x slower"
)


class OptionalBuildExt(build_ext):
    """build_ext that, when the compiler is missing or fails, leaves the extension out and says why in one line."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # no compiler at all: distutils raises before compiling anything
            self._skip(error)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:  # CompileError, LinkError, a missing Python.h ...
            self._skip(error)

    def _skip(self, error: BaseException) -> None:
        detail = str(error).strip().splitlines()
        print(f"{HINT} ({type(error).__name__}{': ' + detail[-1] if detail else ''})", file=sys.stderr)


def build_kernels() -> None:
    """The fatbins beside kernel/*.cu, built where missing or stale (cnnlab.cuda.nvcc, as build.py builds them)."""
    if shutil.which("nvcc") is None:
        print("cnnlab: nvcc is not on the PATH: this package carries no kernel fatbins (cuda mode will need nvcc)", file=sys.stderr)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cnnlab.cuda.buildstep import main as build_fatbins
    from cnnlab.cuda.nvcc import SOURCES, is_stale, kernel_source

    if build_fatbins([]) != 0:  # an nvcc too old for the architectures, say: the package is still usable on the CPU
        for source in map(kernel_source, SOURCES):  # an installed package trusts its fatbins: never ship a stale one
            if is_stale(source, source.with_suffix(".fatbin")):
                source.with_suffix(".fatbin").unlink(missing_ok=True)
        print("cnnlab: building the kernels' fatbins failed (see above): the package carries only up-to-date ones", file=sys.stderr)


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
    ext_modules=[
        Extension(
            "cnnlab._lab_csv",
            ["native/lab_csv_module.cpp"],
            include_dirs=["kernel"],
            depends=["kernel/lab_csv.h", "kernel/lab_pow5_table.h"],
            extra_compile_args=["-O3", "-std=c++17", "-fvisibility=hidden", "-pthread"],
            extra_link_args=["-pthread"],
            language="c++",
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPyWithKernels, "sdist": SdistWithKernels},
)
