"""`cnnlab bench`: how fast each path is on this machine, next to the bounds measured in the same run.

Every figure is images per second, the median of several repeats after a warm-up, on fresh random
float64 data: the cpu row here, the rows that read CSV (text.py), the GPU rows and the ladder (gpu.py),
and the peers (`--rows peers`: PyTorch and JAX, peers.py), each run in a subprocess of its own.

The bounds: a batch from page-locked host memory cannot beat the host-to-device copy of its
80,000 bytes per image; a batch resident on the device cannot beat reading its images once, at
the device-to-device copy rate (bytes read plus bytes written).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np

from cnnlab.bench.gpu import bench_cuda, bench_kernels
from cnnlab.bench.peers import FRAMEWORKS, PeerResult
from cnnlab.bench.report import GPU_ROWS, LADDER_BOUND, BenchOptions, BenchReport, Figure, median_rate
from cnnlab.bench.text import bench_csv, bench_reader
from cnnlab.cpu.backend import CpuBackend
from cnnlab.errors import CnnlabError
from cnnlab.generate import random_values
from cnnlab.network import CONV_LAYER_SIZE, FLOPS_PER_IMAGE, INPUT_DIM, OUT_LAYER_SIZE, Cnn, ImageBatch
from cnnlab.progress import Progress

PEER_SECONDS = 420  # a framework's import, compiles and timing; past that it is reported as not run


def _random_cnn(rng: np.random.Generator) -> Cnn:
    return Cnn(random_values(rng, CONV_LAYER_SIZE, 5, 5), random_values(rng, OUT_LAYER_SIZE, 4000))


def bench_cpu(cnn: Cnn, options: BenchOptions, rng: np.random.Generator) -> Figure:
    batch = ImageBatch(random_values(rng, options.cpu_images, INPUT_DIM, INPUT_DIM))
    with CpuBackend(cnn) as backend:
        rate = median_rate(len(batch), lambda: backend.compute(batch), options.repeats)
    return Figure("cpu", f"cpu: numpy forward ({backend.device})", rate, flops_per_image=FLOPS_PER_IMAGE)


def bench_peers(options: BenchOptions, seed: int | None) -> tuple[list[Figure], list[str]]:
    """The peers (cnnlab/bench/peers.py), a subprocess per framework on as many images as the ladder; figures
    for those that ran, and a note for each that did not, saying why."""
    figures, notes = [], []
    environment = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    for framework in FRAMEWORKS:
        command = [sys.executable, "-m", "cnnlab.bench.peers", framework, "--images", str(options.images)]
        command += ["--repeats", str(options.repeats)]
        try:
            done = subprocess.run(
                command + ([] if seed is None else ["--seed", str(seed)]),
                capture_output=True, text=True, timeout=PEER_SECONDS, env=environment,
            )
        except subprocess.TimeoutExpired:
            notes.append(f"peer {framework} not run: it took more than {PEER_SECONDS} s")
            continue
        results = [PeerResult(**json.loads(line)) for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not results:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            notes.append(f"peer {framework} not run: exit status {done.returncode}: {last[:200]}")
        for result in results:
            if result.skipped is not None or result.images_per_second is None:
                notes.append(f"peer {result.name} not run: {result.skipped}")
            else:
                spread = (result.slowest, result.fastest) if result.slowest and result.fastest else None
                figures.append(Figure(
                    "peers", f"peer: {result.name}", result.images_per_second, LADDER_BOUND, flops_per_image=FLOPS_PER_IMAGE,
                    spread=spread, check=result.check,
                ))
    return figures, notes


def run_bench(options: BenchOptions, seed: int | None = None) -> BenchReport:
    """Measure the chosen rows; the report holds every figure, with notes on rows that did not run."""
    rng = np.random.default_rng(seed)
    cnn = _random_cnn(rng)
    report = BenchReport(options)
    # Each part that runs: the rows it measures, what it returns, and the errors that only leave a note.
    parts: list[tuple[str, Callable[[], list[Figure] | None], tuple[type[BaseException], ...]]] = []
    if "cpu" in options.rows:
        parts.append(("cpu", lambda: [bench_cpu(cnn, options, rng)], ()))
    if "reader" in options.rows:
        parts.append(("reader", lambda: bench_reader(options, seed), ()))
    if "csv" in options.rows:
        parts.append(("csv", lambda: bench_csv(cnn, options, seed), (CnnlabError,)))
    if set(GPU_ROWS) & set(options.rows) or options.sweep:
        parts.append(("cuda", lambda: bench_cuda(cnn, options, rng, report), (CnnlabError,)))
    if "kernels" in options.rows:
        parts.append(("kernels", lambda: bench_kernels(cnn, options, rng, report), (CnnlabError,)))
    if "peers" in options.rows:

        def measure_peers() -> list[Figure]:
            figures, notes = bench_peers(options, seed)
            report.notes.extend(notes)
            return figures

        parts.append(("peers", measure_peers, ()))
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
