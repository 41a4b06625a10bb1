"""The build step (`python build.py`, and setup.py before a wheel): every kernel source and every ladder variant
compiled by nvcc (cnnlab.cuda.nvcc) to its fatbin, where missing or stale, one nvcc per core."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cnnlab.cuda import nvcc  # through the module: a test that points nvcc.kernel_source elsewhere points it here too
from cnnlab.cuda.builds import every_build
from cnnlab.errors import CnnlabError


def main(argv: Sequence[str] | None = None) -> int:
    """`python build.py [--arch sm_XX ...] [--force] [--no-ladder]`: build the kernels' fatbins where they are stale."""
    parser = argparse.ArgumentParser(prog="build.py", description="Compile kernel/*.cu and kernel/ladder/*.cu to fatbins with nvcc.")
    parser.add_argument("--arch", action="append", help=f"machine architecture, repeatable (default {' '.join(nvcc.MACHINE_ARCHS)})")
    parser.add_argument("--force", action="store_true", help="build even where the fatbins are newer than their sources")
    parser.add_argument("--no-ladder", action="store_true", help="only the CNN's and the CSV parser's kernels, not the ladder's")
    args = parser.parse_args(argv)
    archs = args.arch or nvcc.MACHINE_ARCHS

    def build(source: Path, fatbin: Path, sizes: Mapping[str, int], extra: Sequence[Path]) -> str:
        if args.force or args.arch or nvcc.is_stale(source, fatbin, extra):
            nvcc.build_fatbin(source, fatbin, archs, sizes)
            return f"built {fatbin} ({', '.join(archs)} and {nvcc.DEFAULT_ARCH} PTX)"
        return f"{fatbin} is up to date"

    jobs: list[tuple[Path, Path, Mapping[str, int], Sequence[Path]]] = [
        (nvcc.kernel_source(name), nvcc.kernel_source(name).with_suffix(".fatbin"), {}, ()) for name in nvcc.SOURCES
    ]
    if not args.no_ladder:
        for variant in every_build():
            source = nvcc.kernel_source(variant.source)
            jobs.append((source, nvcc.fatbin_path(variant), variant.sizes, nvcc.ladder_inputs(source)))
    try:
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:  # one nvcc per core
            for line in pool.map(lambda job: build(*job), jobs):
                print(line, file=sys.stderr)
    except CnnlabError as error:
        print(f"build.py: {error}", file=sys.stderr)
        return 2
    return 0
