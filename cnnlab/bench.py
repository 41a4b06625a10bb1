"""`cnnlab bench`: how fast each path is on this machine, next to the bounds measured in the same run.

Every figure is images per second, the median of several repeats after a warm-up, on fresh random
float64 data. Paths that end on the host (the backends' compute(), which returns finished outputs)
are timed with perf_counter; the copy bounds and the ladder's kernels (`--rows kernels`), pure device
work, with CUDA events; the peers (`--rows peers`: PyTorch and JAX, cnnlab/peers.py) each as its
framework allows.

The bounds: a batch from page-locked host memory cannot beat the host-to-device copy of its
80,000 bytes per image; a batch resident on the device cannot beat reading its images once, at
the device-to-device copy rate (bytes read plus bytes written).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from cnnlab import ladder
from cnnlab.benchreport import GPU_ROWS, LADDER_BOUND, BenchOptions, BenchReport, Figure, median_rate
from cnnlab.benchtext import bench_csv, bench_reader
from cnnlab.compare import rule_verdict
from cnnlab.cpu import CpuBackend
from cnnlab.errors import CnnlabError
from cnnlab.generate import random_values
from cnnlab.network import CONV_LAYER_SIZE, FLOPS_PER_IMAGE, IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE, Cnn, ImageBatch
from cnnlab.peers import FRAMEWORKS, PeerResult
from cnnlab.progress import Progress

if TYPE_CHECKING:
    from cnnlab.cuda import KernelTiming
    from cnnlab.ladder import DeviceSetup

# FP64 lanes per multiprocessor, by compute capability: the data-centre chips; others run FP64 at 1/64 of FP32 or less.
FP64_LANES_PER_SM = {(6, 0): 32, (7, 0): 32, (8, 0): 32, (9, 0): 64}
PEER_SECONDS = 420  # a framework's import, compiles and timing; past that it is reported as not run


def _repeat(run: Callable[[], object], times: int) -> None:
    for _ in range(times):
        run()


def _random_cnn(rng: np.random.Generator) -> Cnn:
    return Cnn(random_values(rng, CONV_LAYER_SIZE, 5, 5), random_values(rng, OUT_LAYER_SIZE, 4000))


def bench_cpu(cnn: Cnn, options: BenchOptions, rng: np.random.Generator) -> Figure:
    batch = ImageBatch(random_values(rng, options.cpu_images, INPUT_DIM, INPUT_DIM))
    with CpuBackend(cnn) as backend:
        rate = median_rate(len(batch), lambda: backend.compute(batch), options.repeats)
    return Figure("cpu", f"cpu: numpy forward ({backend.device})", rate, flops_per_image=FLOPS_PER_IMAGE)


def bench_cuda(cnn: Cnn, options: BenchOptions, rng: np.random.Generator, report: BenchReport) -> None:
    """The GPU rows, the sweep and the device's name into `report`; raises CnnlabError without a usable GPU."""
    from cnnlab.cuda import CudaContext, DeviceImages, LaunchConfig

    chosen = {"chunk_images": options.chunk_images, "streams": options.streams}
    config = LaunchConfig(**{key: value for key, value in chosen.items() if value is not None})
    host_bytes = IMAGE_BYTES + config.segments * OUT_LAYER_SIZE * 8  # images in, partials out
    model = {"flops_per_image": FLOPS_PER_IMAGE}
    if "lab" in options.rows:
        images = random_values(rng, options.lab_images, INPUT_DIM, INPUT_DIM)
        singles = [ImageBatch(image[None]) for image in images]
        with CudaContext(cnn, batch_size=1) as context:
            rate = median_rate(len(singles), lambda: [context.compute(single) for single in singles], options.repeats)
            report.device = context.device
        report.figures.append(Figure("lab", "cuda, one image per launch (the lab's scheme)", rate, bytes_per_image=host_bytes, **model))
    if not {"pinned", "resident", "bounds"} & set(options.rows) and not options.sweep:
        return
    # The command line's batch size, so the figures are what `cnnlab cuda` gets; a batch here is all the images.
    with CudaContext(cnn, config=config) as context:
        report.device = context.device
        host = context.allocate_images(options.images)
        host[:] = random_values(rng, options.images, INPUT_DIM, INPUT_DIM)
        batch = ImageBatch(host)
        resident = context.upload(batch)
        if "pinned" in options.rows:
            rate = median_rate(options.images, lambda: context.compute(batch), options.repeats)
            name = "cuda, batched from page-locked memory, copies included"
            report.figures.append(Figure("pinned", name, rate, "h2d", bytes_per_image=host_bytes, **model))
        if "resident" in options.rows:
            rate = median_rate(options.images, lambda: context.compute_resident(resident), options.repeats)
            bytes_per_image = ladder.BY_NAME[config.kernel].device_bytes
            report.figures.append(
                Figure("resident", "cuda, images resident on the device", rate, "d2d", bytes_per_image=bytes_per_image, **model)
            )
        if "bounds" in options.rows:
            rates = context.copy_rates(host, resident, options.repeats)
            report.figures += [
                Figure(
                    "bounds",
                    "bound: host-to-device copy from page-locked memory",
                    rates.host_to_device / IMAGE_BYTES,
                    key="h2d",
                    bytes_per_image=IMAGE_BYTES,
                ),
                Figure(
                    "bounds",
                    "bound: device-to-device copy (read + written)",
                    rates.device_to_device / IMAGE_BYTES,
                    key="d2d",
                    bytes_per_image=IMAGE_BYTES,
                ),
            ]
        for size in options.sweep:
            part, resident_part = ImageBatch(host[:size]), DeviceImages(resident.allocation, size)
            calls = max(1, min(options.images, 8192) // size)
            for points, run in (
                (report.sweep.pinned, partial(context.compute, part)),
                (report.sweep.resident, partial(context.compute_resident, resident_part)),
            ):
                points.append((size, median_rate(size * calls, partial(_repeat, run, calls), 3)))
        context.free(resident)


def fp64_peak(setup: DeviceSetup) -> float | None:
    """FLOP/s of the device's FP64 units at their top clock (FMAs counted as two), where the FP64 lanes per
    multiprocessor of its architecture are known here and nvidia-smi gives the clock; None otherwise."""
    lanes = FP64_LANES_PER_SM.get(setup.capability)
    try:
        answer = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30
        )
        megahertz = float(answer.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None
    return None if lanes is None else 2 * lanes * setup.sm_count * megahertz * 1e6


def check_outputs(got: np.ndarray, want: np.ndarray, exactness: str) -> str:
    """What the outputs of a rung are, against the CPU's: bit-exact, within the lab's rule, or how many are not."""
    got = got[: len(want)]
    if exactness == ladder.BIT_EXACT and (got.view(np.uint64) == want.view(np.uint64)).all():
        return "bit-exact"
    verdict = rule_verdict(got, want)
    return verdict if exactness != ladder.BIT_EXACT else f"NOT bit-exact ({verdict})"


def _kernel_figure(rung: ladder.Rung, name: str, timing: KernelTiming, want: np.ndarray) -> Figure:
    count = len(timing.outputs)
    spread = (count / max(timing.seconds), count / min(timing.seconds))
    return Figure(
        "kernels", name, timing.images_per_second, LADDER_BOUND, bytes_per_image=rung.device_bytes, flops_per_image=FLOPS_PER_IMAGE,
        spread=spread, check=check_outputs(timing.outputs.values, want, rung.exactness),
    )


def bench_kernels(cnn: Cnn, options: BenchOptions, rng: np.random.Generator, report: BenchReport) -> None:
    """The ladder: every rung's kernels over images resident on the device, timed with CUDA events, its
    outputs checked against the CPU's; rung 5 at every block-size pair of its sweep; the device-to-device
    bound measured on the same images. Raises CnnlabError without a usable GPU."""
    from cnnlab.cuda import CudaContext, DeviceImages, LaunchConfig, device_errors

    images = random_values(rng, options.images, INPUT_DIM, INPUT_DIM)
    with CpuBackend(cnn) as cpu:
        want = cpu.compute(ImageBatch(images[: options.check_images])).values
    # One-image lanes: the context's own lanes are not used here, only its device, modules and memory.
    with CudaContext(cnn, batch_size=1, config=LaunchConfig(streams=1, chunk_images=1)) as context:
        report.device, report.fp64_peak = context.device, fp64_peak(context.setup)
        resident = context.upload(ImageBatch(images))
        d2d = context.device_copy_rate(resident, options.repeats)
        # The ladder's own bound, measured as its rungs read (each image once), under a key of its own: the bounds row's
        # copy of one large buffer is another measurement, and the rungs and peers are shares of this one.
        report.figures.append(
            Figure(
                "kernels", "bound: device-to-device copy, images read once", d2d / IMAGE_BYTES, key=LADDER_BOUND,
                bytes_per_image=IMAGE_BYTES,
            )
        )
        for rung in ladder.RUNGS:
            count = min(options.images, rung.max_bench_images or options.images)
            part = DeviceImages(resident.allocation, count)
            try:
                if rung.name == "block_sweep":
                    timings = {}
                    for bands, threads in itertools.product(ladder.SWEEP_BANDS, ladder.SWEEP_THREADS):
                        try:  # a pair this GPU cannot run (too little shared memory for 1,024 threads' tree) is left out
                            with device_errors(f"cannot load kernel {rung.name}"):
                                launcher = ladder.block_sweep(context.setup, bands, threads)
                            timings[bands, threads] = context.time_kernels(launcher, part, options.repeats)
                        except CnnlabError as error:
                            report.notes.append(f"block sweep {bands}x{threads} not run: {error}")
                    (bands, threads), timing = max(timings.items(), key=lambda item: item[1].images_per_second)
                    sweep = ", ".join(f"{b}x{t}: {value.images_per_second / 1e6:.2f}M" for (b, t), value in timings.items())
                    report.notes.append(f"block sweep (conv bands per block x dense threads, images/s): {sweep}")
                    name = f"{rung.number} {rung.name} ({bands * 20}/{threads} threads)"
                else:
                    with device_errors(f"cannot load kernel {rung.name}"):
                        launcher = ladder.launcher(rung.name, context.setup, context.config)
                    timing, name = context.time_kernels(launcher, part, options.repeats), f"{rung.number} {rung.name}"
            except CnnlabError as error:
                report.notes.append(f"rung {rung.number} {rung.name} not run: {error}")
                continue
            report.figures.append(_kernel_figure(rung, name, timing, want))
        context.free(resident)


def bench_peers(options: BenchOptions, seed: int | None) -> tuple[list[Figure], list[str]]:
    """The peers (cnnlab/peers.py), a subprocess per framework on as many images as the ladder; figures
    for those that ran, and a note for each that did not, saying why."""
    figures, notes = [], []
    environment = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    for framework in FRAMEWORKS:
        command = [sys.executable, "-m", "cnnlab.peers", framework, "--images", str(options.images), "--repeats", str(options.repeats)]
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
