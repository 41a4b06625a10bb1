"""`cnnlab bench`'s GPU rows: the lab's one image per launch, batches from page-locked memory, a .npy file in the page
cache as the command line runs it (and KvikIO's read of it, the peer), images resident on the device, the copy bounds
(with every GPU copying at once too), and the ladder's rungs, each timed against the bound measured in the same run.

Paths that end on the host (compute(), which returns finished outputs) are timed with perf_counter;
the copy bounds and the ladder's kernels, pure device work, with CUDA events.
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cnnlab.bench.gpus import COPY_BYTES, aggregate_bound
from cnnlab.bench.peers import run_peers
from cnnlab.bench.report import D2D_BOUND, BenchOptions, BenchReport, Figure, median_rate, rate_and_range
from cnnlab.compare import rule_verdict
from cnnlab.constants import FLOPS_PER_IMAGE, IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM
from cnnlab.cpu.backend import CpuBackend
from cnnlab.cuda import ladder
from cnnlab.cuda.builds import SWEEP_BANDS
from cnnlab.cuda.driver import device_errors
from cnnlab.cuda.launchers import SWEEP_THREADS, activation_images, block_sweep
from cnnlab.errors import CnnlabError, ResourceError
from cnnlab.generate import random_values
from cnnlab.network import Cnn, ImageBatch, OutputBatch

if TYPE_CHECKING:
    from cnnlab.backend import Backend
    from cnnlab.cuda.context import CudaContext, DeviceImages
    from cnnlab.cuda.device_setup import DeviceSetup
    from cnnlab.cuda.launchers import Launcher

# FP64 units per multiprocessor, by compute capability: the data-centre chips; others run FP64 at 1/64 of FP32 or less.
FP64_UNITS_PER_SM = {(6, 0): 32, (7, 0): 32, (8, 0): 32, (9, 0): 64}


@dataclass(frozen=True)
class KernelTiming:
    """A rung's kernels over resident images: each timed run's seconds (CUDA events) and the last run's outputs."""

    seconds: list[float]
    outputs: OutputBatch

    @property
    def images_per_second(self) -> float:
        return len(self.outputs) / statistics.median(self.seconds)


def time_kernels(context: CudaContext, rung: Launcher, images: DeviceImages, repeats: int) -> KernelTiming:
    """`rung`'s kernels over resident images as one chunk, timed with CUDA events: a warm-up run, then
    `repeats` timed runs; the outputs are the last run's partials added up on the host as the chunk streams add them."""
    driver, count = context.driver, images.count
    with device_errors("CUDA error while timing kernels"):
        activations = activation_images(rung, count)
        conv_out = context.memory.device(activations * OUT_NEURON_DIM * 8) if activations else None
        partials = context.memory.device(rung.segments * count * OUT_LAYER_SIZE * 8)
        try:
            stream = driver.Stream()
            driver.memset_d8_async(partials, 0xFF, rung.segments * count * OUT_LAYER_SIZE * 8, stream)  # NaN: unwritten shows
            seconds = event_seconds(driver, stream, lambda: rung(stream, int(images.allocation), conv_out, partials, count, count), repeats)
            host = np.empty((rung.segments, count, OUT_LAYER_SIZE))
            driver.memcpy_dtoh(host, partials)
        finally:
            for allocation in (conv_out, partials):
                if allocation is not None:
                    context.memory.free(allocation)
    return KernelTiming(seconds, OutputBatch(np.sum(host, axis=0)))


def host_copy_rate(context: CudaContext, host: np.ndarray, repeats: int) -> float:
    """Bytes per second of copying `host` (page-locked) to the device: the bound of the batches from host memory."""

    def copy(target: Any, stream: Any) -> None:
        context.driver.memcpy_htod_async(target, host, stream)

    return host.nbytes / _copy_seconds(context, host.nbytes, copy, repeats)


def device_copy_rate(context: CudaContext, images: DeviceImages, repeats: int) -> float:
    """Bytes per second (read + written) of copying `images` within the device (cuMemcpyDtoD): what reading each image
    once costs at most, the bound of every figure on resident images."""
    nbytes = images.count * IMAGE_BYTES

    def copy(target: Any, stream: Any) -> None:
        context.driver.memcpy_dtod_async(target, images.allocation, nbytes, stream)

    return 2 * nbytes / _copy_seconds(context, nbytes, copy, repeats)


def device_bound(report: BenchReport, context: CudaContext, images: DeviceImages, repeats: int) -> None:
    """The one device-to-device bound of the report (D2D_BOUND), measured on the resident images where no row has yet:
    the resident row, the ladder and the peers are shares of the same figure."""
    if not any(figure.key == D2D_BOUND for figure in report.figures):
        rate = device_copy_rate(context, images, repeats) / IMAGE_BYTES
        name = f"bound: device-to-device copy of {images.count:,} images, read + written (cuMemcpyDtoD)"
        report.figures.append(Figure("bounds", name, rate, key=D2D_BOUND, bytes_per_image=IMAGE_BYTES))


def _copy_seconds(context: CudaContext, nbytes: int, copy: Callable[[Any, Any], None], repeats: int) -> float:
    """The median seconds of `copy(target, stream)` into a fresh device buffer of `nbytes`, timed with
    CUDA events after a warm-up."""
    driver = context.driver
    with device_errors("cannot time the copy bounds"):
        target = context.memory.device(nbytes)
        try:
            stream = driver.Stream()
            times = event_seconds(driver, stream, lambda: copy(target, stream), repeats)
        finally:
            context.memory.free(target)
    return statistics.median(times)


def event_seconds(driver: Any, stream: Any, run: Callable[[], object], repeats: int) -> list[float]:
    """The seconds of each of `repeats` calls of `run` (which queues work on `stream`), timed with CUDA events on the
    stream, after one more call that warms up and is not counted: the device's time, not the host's."""
    start, end = driver.Event(), driver.Event()
    run()
    seconds = []
    for _ in range(repeats):
        start.record(stream)
        run()
        end.record(stream)
        end.synchronize()
        seconds.append(end.time_since(start) / 1e3)
    return seconds


def _repeat(run: Callable[[], object], times: int) -> None:
    for _ in range(times):
        run()


def bench_cuda(cnn: Cnn, options: BenchOptions, rng: np.random.Generator, report: BenchReport) -> None:
    """The GPU rows, the sweep and the device's name into `report`; raises CnnlabError without a usable GPU."""
    from cnnlab.cuda.context import CudaContext

    config = ladder.LaunchConfig(chunk_images=options.chunk_images)
    if options.streams is not None:
        config = replace(config, streams=options.streams)
    host_bytes = IMAGE_BYTES + config.segments * OUT_LAYER_SIZE * 8  # images in, partials out
    if "lab" in options.rows:
        images = random_values(rng, options.lab_images, INPUT_DIM, INPUT_DIM)
        singles = [ImageBatch(image[None]) for image in images]
        with CudaContext(cnn, batch_size=1) as context:
            rate = median_rate(len(singles), lambda: [context.compute(single) for single in singles], options.repeats)
            report.device = context.device
        name = "cuda, one image per launch (the lab's scheme)"
        report.figures.append(Figure("lab", name, rate, bytes_per_image=host_bytes, flops_per_image=FLOPS_PER_IMAGE))
    if {"pinned", "npy", "resident", "bounds"} & set(options.rows) or options.sweep:
        batched_rows(cnn, options, config, host_bytes, rng, report)


def bench_gpus(options: BenchOptions, report: BenchReport) -> list[Figure]:
    """The gpus rows: what the host feeds 1..N of its GPUs copying at once (bench/gpus.py); needs the driver alone."""
    figures = []
    for copies in aggregate_bound(COPY_BYTES, options.repeats):
        report.device = report.device or copies.device
        name = f"bound: host-to-device copies, {copies.gpus} GPU{'s' * (copies.gpus > 1)} at once"
        rate = copies.total * 1e9 / IMAGE_BYTES
        figures.append(Figure("gpus", name, rate, key=f"h2d-{copies.gpus}", bytes_per_image=IMAGE_BYTES))
    return figures


def batched_rows(
    cnn: Cnn, options: BenchOptions, config: ladder.LaunchConfig, host_bytes: int, rng: np.random.Generator, report: BenchReport,
) -> None:
    """The rows of one context over a batch of every image (`host_bytes` crossing the bus an image): from page-locked
    memory, from a .npy file, resident on the device, the copy bounds, and the sweep of batch sizes."""
    from cnnlab.cuda.context import CudaContext, DeviceImages

    # The command line's batch size, so the figures are what `cnnlab cuda` gets; a batch here is all the images.
    with CudaContext(cnn, config=config) as context:
        report.device = context.device
        host = context.allocate_images(options.images)
        host[:] = random_values(rng, options.images, INPUT_DIM, INPUT_DIM)
        batch = ImageBatch(host)
        resident = context.upload(batch)
        # The device-to-device bound first: once the host-to-device bound had copied the page-locked batch in on a stream
        # (the upload's synchronous copy did not), each later copy within the device ran 13% slower on the H100 (37.8M
        # against 32.7M images/s, three rounds), a state of the context whose cause was not found; the ladder, in a
        # context of its own, reads the first figure.
        if {"bounds", "resident"} & set(options.rows):
            device_bound(report, context, resident, options.repeats)
        if "pinned" in options.rows:
            rate = median_rate(options.images, lambda: context.compute(batch), options.repeats)
            name = "cuda, batched from page-locked memory, copies included"
            report.figures.append(Figure("pinned", name, rate, "h2d", bytes_per_image=host_bytes, flops_per_image=FLOPS_PER_IMAGE))
        if "npy" in options.rows:
            with npy_in_page_cache(host) as path:
                rate, repeat_range, device_bytes = npy_file_rate(partial(CudaContext, cnn, config=config), path, len(host), options.repeats)
                name = "cuda, a .npy file in the page cache, as `cnnlab cuda` runs it"
                report.figures.append(Figure(
                    "npy", name, rate, "h2d", bytes_per_image=host_bytes, flops_per_image=FLOPS_PER_IMAGE, repeat_range=repeat_range,
                    device_bytes=device_bytes,
                ))  # fmt: skip
                peer, notes = run_peers(("kvikio",), "npy", "h2d", len(host), options.repeats, None, file=str(path),
                                        bytes_per_image=IMAGE_BYTES, flops_per_image=None)  # fmt: skip
                report.figures += peer
                report.notes += notes
        if "resident" in options.rows:
            rate = median_rate(options.images, lambda: context.compute_resident(resident), options.repeats)
            bytes_per_image = ladder.BY_NAME[config.kernel].device_bytes
            report.figures.append(
                Figure("resident", "cuda, images resident on the device", rate, D2D_BOUND, bytes_per_image=bytes_per_image,
                       flops_per_image=FLOPS_PER_IMAGE)
            )
        if "bounds" in options.rows:
            host_to_device = host_copy_rate(context, host, options.repeats)
            report.figures.append(
                Figure("bounds", "bound: host-to-device copy from page-locked memory", host_to_device / IMAGE_BYTES, key="h2d",
                       bytes_per_image=IMAGE_BYTES)
            )
        for size in options.sweep:
            part, resident_part = ImageBatch(host[:size]), DeviceImages(resident.allocation, size)
            calls = max(1, min(options.images, 8192) // size)
            for points, run in (
                (report.sweep.pinned, partial(context.compute, part)),
                (report.sweep.resident, partial(context.compute_resident, resident_part)),
            ):
                points.append((size, median_rate(size * calls, partial(_repeat, run, calls), 3)))
        context.free(resident)


@contextmanager
def npy_in_page_cache(images: np.ndarray) -> Iterator[Path]:
    """`images` saved as a .npy file in a folder of its own, written back to the disk (whose writes would compete with
    the runs) and left in the page cache; removed after. A file that cannot be written (a full disk) is a ResourceError,
    a note in the report."""
    with tempfile.TemporaryDirectory(prefix="cnnlab-bench-") as folder:
        path = Path(folder) / "in.npy"
        try:
            with path.open("wb") as file:
                np.save(file, images)
                file.flush()
                os.fsync(file.fileno())
        except OSError as error:
            raise ResourceError(f"cannot write {len(images):,} images to {folder} for the npy row: {error.strerror or error}") from None
        yield path


def npy_file_rate(
    make_backend: Callable[[], Backend], path: Path, count: int, repeats: int
) -> tuple[float, tuple[float, float], int]:
    """Images/s of a run over the .npy file of `count` images at `path`: the loop of run_network (as --timing-json gives
    it) on a backend of its own (its buffers go with it), median and range of `repeats` after one warm-up; and the
    most device memory a run's buffers held."""
    from cnnlab.run import run_network

    with make_backend() as backend:
        loops = [run_network(backend, path, path.with_name("out.npy")).loop_seconds for _ in range(repeats + 1)][1:]
        return *rate_and_range(count, loops), backend.peak_device_bytes


def fp64_peak(setup: DeviceSetup) -> float | None:
    """FLOP/s of the device's FP64 units at their top clock (FMAs counted as two), where the FP64 units per
    multiprocessor of its architecture are known here and nvidia-smi gives the clock; None otherwise."""
    units = FP64_UNITS_PER_SM.get(setup.capability)
    try:
        answer = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30
        )
        megahertz = float(answer.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None
    return None if units is None else 2 * units * setup.sm_count * megahertz * 1e6


def check_outputs(got: np.ndarray, want: np.ndarray, exactness: str) -> str:
    """What the outputs of a rung are, against the CPU's: bit-exact, within the lab's rule, or how many are not."""
    got = got[: len(want)]
    if exactness == ladder.BIT_EXACT and (got.view(np.uint64) == want.view(np.uint64)).all():
        return "bit-exact"
    verdict = rule_verdict(got, want)
    return verdict if exactness != ladder.BIT_EXACT else f"NOT bit-exact ({verdict})"


def _kernel_figure(rung: ladder.Rung, name: str, timing: KernelTiming, want: np.ndarray) -> Figure:
    count = len(timing.outputs)
    repeat_range = (count / max(timing.seconds), count / min(timing.seconds))
    return Figure(
        "kernels", name, timing.images_per_second, D2D_BOUND, bytes_per_image=rung.device_bytes, flops_per_image=FLOPS_PER_IMAGE,
        repeat_range=repeat_range, check=check_outputs(timing.outputs.values, want, rung.exactness),
    )


def bench_kernels(cnn: Cnn, options: BenchOptions, rng: np.random.Generator, report: BenchReport) -> None:
    """The ladder: every rung's kernels over images resident on the device, timed with CUDA events, its
    outputs checked against the CPU's; rung 5 at every block-size pair of its sweep; the device-to-device
    bound measured on the same images. Raises CnnlabError without a usable GPU."""
    from cnnlab.cuda.context import CudaContext, DeviceImages

    images = random_values(rng, options.images, INPUT_DIM, INPUT_DIM)
    with CpuBackend(cnn) as cpu:
        want = cpu.compute(ImageBatch(images[: options.check_images])).values
    # One-image chunk streams: the context's own are not used here, only its device, modules and memory.
    with CudaContext(cnn, batch_size=1, config=ladder.LaunchConfig(streams=1, chunk_images=1)) as context:
        report.device, report.fp64_peak = context.device, fp64_peak(context.setup)
        resident = context.upload(ImageBatch(images))
        device_bound(report, context, resident, options.repeats)
        for rung in ladder.RUNGS:
            count = min(options.images, rung.max_bench_images or options.images)
            part = DeviceImages(resident.allocation, count)
            try:
                if rung.name == "block_sweep":
                    timings = {}
                    for bands, threads in itertools.product(SWEEP_BANDS, SWEEP_THREADS):
                        try:  # a pair this GPU cannot run (too little shared memory for 1,024 threads' tree) is left out
                            with device_errors(f"cannot load kernel {rung.name}"):
                                launcher = block_sweep(context.setup, bands, threads)
                            timings[bands, threads] = time_kernels(context, launcher, part, options.repeats)
                        except CnnlabError as error:
                            report.notes.append(f"block sweep {bands}x{threads} not run: {error}")
                    (bands, threads), timing = max(timings.items(), key=lambda item: item[1].images_per_second)
                    sweep = ", ".join(f"{b}x{t}: {value.images_per_second / 1e6:.2f}M" for (b, t), value in timings.items())
                    report.notes.append(f"block sweep (conv bands per block x dense threads, images/s): {sweep}")
                    name = f"{rung.number} {rung.name} ({bands * 20}/{threads} threads)"
                else:
                    with device_errors(f"cannot load kernel {rung.name}"):
                        launcher = ladder.launcher(rung.name, context.setup, context.config)
                    timing, name = time_kernels(context, launcher, part, options.repeats), f"{rung.number} {rung.name}"
            except CnnlabError as error:
                report.notes.append(f"rung {rung.number} {rung.name} not run: {error}")
                continue
            report.figures.append(_kernel_figure(rung, name, timing, want))
        context.free(resident)
