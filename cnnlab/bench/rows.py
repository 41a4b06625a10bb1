"""`cnnlab bench`: how fast each path is on this machine, next to the bounds measured in the same run.

Every figure is images per second, the median of several repeats after a warm-up, on fresh random
float64 data: the cpu rows (cpu.py), the rows that read CSV (text.py), the GPU rows and the ladder
(gpu.py), and the ladder's peers (`--rows peers`: PyTorch and JAX, peers.py), each framework run in a
subprocess of its own.

The bounds: the CPU's forward cannot beat reading its images once from memory; a batch from
page-locked host memory cannot beat the host-to-device copy of its 80,000 bytes per image; a batch
resident on the device cannot beat reading its images once, at the device-to-device copy rate
(bytes read plus bytes written).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cnnlab.bench.api import bench_api
from cnnlab.bench.cpu import bench_cpu
from cnnlab.bench.gpu import bench_cuda, bench_gpus, bench_kernels
from cnnlab.bench.peers import FRAMEWORKS, run_peers
from cnnlab.bench.report import D2D_BOUND, GPU_ROWS, BenchOptions, BenchReport, Figure
from cnnlab.bench.startup import bench_startup
from cnnlab.bench.text import bench_csv, bench_reader
from cnnlab.constants import CONV_LAYER_SIZE, OUT_LAYER_SIZE
from cnnlab.errors import CnnlabError
from cnnlab.generate import random_values
from cnnlab.network import Cnn
from cnnlab.progress import Progress


def _random_cnn(rng: np.random.Generator) -> Cnn:
    return Cnn(random_values(rng, CONV_LAYER_SIZE, 5, 5), random_values(rng, OUT_LAYER_SIZE, 4000))


def run_bench(options: BenchOptions, seed: int | None = None) -> BenchReport:
    """Measure the chosen rows; the report holds every figure, with notes on rows that did not run."""
    rng = np.random.default_rng(seed)
    cnn = _random_cnn(rng)
    report = BenchReport(options)

    def with_notes(measured: tuple[list[Figure], list[str]]) -> list[Figure]:
        report.notes.extend(measured[1])
        return measured[0]

    # Each part that runs: the rows it measures, what it returns, and the errors that only leave a note.
    parts: list[tuple[str, Callable[[], list[Figure] | None], tuple[type[BaseException], ...]]] = []
    if "cpu" in options.rows:
        parts.append(("cpu", lambda: with_notes(bench_cpu(cnn, options, rng, seed)), ()))
    if "reader" in options.rows:
        parts.append(("reader", lambda: bench_reader(options, seed), ()))
    if "csv" in options.rows:
        parts.append(("csv", lambda: with_notes(bench_csv(cnn, options, seed)), (CnnlabError,)))
    if "startup" in options.rows:

        def measure_startup() -> list[Figure]:
            report.startup, notes = bench_startup(options)
            report.notes.extend(notes)
            return []

        parts.append(("startup", measure_startup, ()))
    if set(GPU_ROWS) & set(options.rows) or options.sweep:
        parts.append(("cuda", lambda: bench_cuda(cnn, options, rng, report), (CnnlabError,)))
    if "api" in options.rows:
        parts.append(("api", lambda: bench_api(cnn, options, rng), (CnnlabError,)))
    if "gpus" in options.rows:
        parts.append(("gpus", lambda: bench_gpus(options, report), (CnnlabError,)))
    if "kernels" in options.rows:
        parts.append(("kernels", lambda: bench_kernels(cnn, options, rng, report), (CnnlabError,)))
    if "peers" in options.rows:
        parts.append(("peers", lambda: with_notes(run_peers(FRAMEWORKS, "peers", D2D_BOUND, options.images, options.repeats, seed)), ()))
    progress = Progress("cnnlab bench", len(parts), "parts")
    try:
        for done, (name, measure, noted) in enumerate(parts, start=1):
            try:
                report.figures += measure() or []
            except noted as error:
                report.notes.append(f"{name} rows not run: {error}")
            progress.update(done)
    finally:
        progress.finish()
    return report
