"""The native CSV parser, cnnlab._lab_csv (everything else about the package is in setup.cfg).

Built from native/lab_csv_module.cpp with kernel/lab_csv.h, the format's rules it shares with the
CUDA parser. It is optional: where it cannot be compiled the install still succeeds, with one line
saying what to install, and cnnlab parses CSV files in Python instead.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

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


setup(
    ext_modules=[
        Extension(
            "cnnlab._lab_csv",
            ["native/lab_csv_module.cpp"],
            include_dirs=["kernel"],
            depends=["kernel/lab_csv.h", "kernel/lab_pow5_table.h"],
            extra_compile_args=["-O3", "-std=c++17", "-fvisibility=hidden"],
            language="c++",
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
