"""`cnnlab bench`: how fast each path is on this machine, next to the bounds measured in the same run.

Every figure is images per second, the median of several repeats after a warm-up, on fresh random
float64 data. Paths that end on the host (the backends' compute(), which returns finished outputs)
are timed with perf_counter; the copy bounds, pure device work, with CUDA events.

The bounds: a batch from page-locked host memory cannot beat the host-to-device copy of its
80,000 bytes per image; a batch resident on the device cannot beat reading its images once, at
the device-to-device copy rate (bytes read plus bytes written).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np

from cnnlab.cpu import CpuBackend
from cnnlab.errors import CnnlabError
from cnnlab.filesafety import AtomicOutput
from cnnlab.generate import random_values
from cnnlab.labcsv import CsvImageReader
from cnnlab.network import CONV_LAYER_SIZE, FLOPS_PER_IMAGE, IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE, Cnn, ImageBatch

ROWS = ("cpu", "reader", "csv", "lab", "pinned", "resident", "bounds", "torch")
GPU_ROWS = ("lab", "pinned", "resident", "bounds")


@dataclass(frozen=True)
class Figure:
    """One row of the table, with its traffic model: the bytes and FLOPs one image costs on that path."""

    row: str
    name: str
    images_per_second: float
    bound: str | None = None  # the key of the figure that bounds this one
    key: str | None = None  # for the figures others are measured against: "h2d", "d2d", "loadtxt"
    bytes_per_image: float | None = None  # bytes moved per image through what bounds the path
    flops_per_image: float | None = None

    @property
    def bytes_per_second(self) -> float | None:
        return None if self.bytes_per_image is None else self.images_per_second * self.bytes_per_image

    @property
    def flops_per_second(self) -> float | None:
        return None if self.flops_per_image is None else self.images_per_second * self.flops_per_image


@dataclass
class BenchOptions:
    images: int = 65536
    cpu_images: int = 2048
    lab_images: int = 2000
    reader_images: int = 500
    csv_images: int = 2000
    repeats: int = 5
    rows: tuple[str, ...] = ROWS
    sweep: tuple[int, ...] = ()  # batch sizes for the plot
    chunk_images: int | None = None  # the CUDA context's chunk and stream count; None: LaunchConfig's
    streams: int | None = None


@dataclass
class Sweep:
    """images/s against images per compute() call, for the plot: (images, images/s) pairs."""

    pinned: list[tuple[int, float]] = field(default_factory=list)
    resident: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class BenchReport:
    """Everything one `cnnlab bench` measured, where, and why any rows did not run."""

    options: BenchOptions
    figures: list[Figure] = field(default_factory=list)
    sweep: Sweep = field(default_factory=Sweep)
    notes: list[str] = field(default_factory=list)
    device: str | None = None
    machine: str = field(default_factory=platform.machine)
    python: str = field(default_factory=platform.python_version)
    numpy: str = np.__version__


def median_rate(images: int, run: Callable[[], object], repeats: int) -> float:
    """Images per second of `run` (which handles `images` images), median of `repeats` after one warm-up."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return images / statistics.median(times)


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


def bench_reader(options: BenchOptions, seed: int | None) -> list[Figure]:
    """The CSV reader in MB/s, with one parse thread and one per core, and numpy.loadtxt on the same file."""
    from cnnlab.generate import generate

    with tempfile.TemporaryDirectory() as folder:
        _, path = generate(folder, options.reader_images, seed)
        size = path.stat().st_size
        image_bytes = size / options.reader_images

        def read(threads: int | None) -> None:
            with CsvImageReader(path, threads) as reader:
                buffer = np.empty((reader.step, INPUT_DIM, INPUT_DIM))
                while reader.read_into(buffer):
                    pass

        repeats = min(options.repeats, 3)
        loadtxt, one, every = (
            median_rate(options.reader_images, run, repeats)
            for run in (lambda: np.loadtxt(path, delimiter=",", skiprows=1), partial(read, 1), partial(read, None))
        )
        peer = _polars_rate(path, options.reader_images, repeats)
    text = {"bytes_per_image": image_bytes}
    figures = [
        Figure("reader", "reference: numpy.loadtxt (one thread)", loadtxt, key="loadtxt", **text),
        Figure("reader", "cnnlab CSV reader, one parse thread", one, "loadtxt", **text),
        Figure("reader", f"cnnlab CSV reader, {os.cpu_count()} parse threads", every, "loadtxt", **text),
    ]
    if peer is not None:
        figures.append(Figure("reader", f"peer: polars {peer[0]} read_csv, whole file, every thread", peer[1], "loadtxt", **text))
    return figures


def _polars_rate(path: os.PathLike, images: int, repeats: int) -> tuple[str, float] | None:
    """(version, images/s) of Polars' CSV reader on the file, the fastest exact library measured (BENCHMARKS.md),
    as its users would call it: the whole file at once, a Float64 schema, blank lines dropped; None without Polars."""
    try:
        import polars
    except ImportError:
        return None
    schema = {str(column): polars.Float64 for column in range(INPUT_DIM)}

    def read() -> np.ndarray:
        frame = polars.read_csv(path, has_header=False, skip_rows=1, schema=schema, quote_char=None).drop_nulls()
        return frame.to_numpy().reshape(images, INPUT_DIM, INPUT_DIM)

    return polars.__version__, median_rate(images, read, repeats)


def bench_csv(cnn: Cnn, options: BenchOptions, seed: int | None) -> list[Figure]:
    """`cnnlab cuda` on a CSV file in the page cache, the whole read-compute-write loop, in images/s
    and GB/s of text: parsed on the GPU and parsed on the host, against the two bounds of the GPU
    path measured in the same run: reading the file into page-locked memory, and copying it to the device."""
    from cnnlab.cuda import CudaContext
    from cnnlab.generate import generate
    from cnnlab.run import run_network

    threads = os.cpu_count() or 1
    repeats = min(options.repeats, 3)
    with tempfile.TemporaryDirectory() as folder:
        _, path = generate(folder, options.csv_images, seed)
        text = {"bytes_per_image": path.stat().st_size / options.csv_images}
        figures = []
        for parse_csv, where in ((True, "on the GPU"), (False, f"on the host ({threads} threads)")):
            with CudaContext(cnn, parse_csv=parse_csv) as context:
                loop = partial(run_network, context, path, os.path.join(folder, "out.npy"))
                rate = median_rate(options.csv_images, loop, repeats)
                figures.append(Figure("csv", f"cnnlab cuda on CSV, parsed {where}: whole loop", rate, "read", **text))
                if parse_csv:
                    read_rate, host_to_device = _text_bounds(context, path, threads, options.repeats)
    per_image = text["bytes_per_image"]
    return figures + [
        Figure("csv", f"bound: file (page cache) to page-locked memory, {threads} reads", read_rate / per_image, key="read", **text),
        Figure("csv", "bound: host-to-device copy of the text", host_to_device / per_image, key="h2d-text", **text),
    ]


def _text_bounds(context: Any, path: os.PathLike, threads: int, repeats: int) -> tuple[float, float]:
    """Bytes/s of reading the file into page-locked memory as the GPU path reads it, and of copying it to the device."""
    from cnnlab.csvtext import read_at

    size = os.path.getsize(path)
    pinned = context.allocate_text(size)
    with open(path, "rb") as file, ThreadPoolExecutor(threads) as pool:
        read_rate = median_rate(size, partial(read_at, file.fileno(), memoryview(pinned), 0, pool, threads), repeats)
    return read_rate, context.copy_rates(pinned, None, repeats).host_to_device


def bench_cuda(cnn: Cnn, options: BenchOptions, rng: np.random.Generator, report: BenchReport) -> None:
    """The GPU rows, the sweep and the device's name into `report`; raises CnnlabError without a usable GPU."""
    from cnnlab.cuda import CudaContext, DeviceImages, LaunchConfig
    from cnnlab.kernels import device_bytes_per_image

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
            bytes_per_image = device_bytes_per_image(config.segments)
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


def bench_torch(cnn: Cnn, options: BenchOptions, rng: np.random.Generator) -> list[Figure]:
    """The same network in PyTorch float64, as a peer: resident and from page-locked memory."""
    import torch

    if not torch.cuda.is_available():
        raise CnnlabError("torch sees no CUDA device")
    device = torch.device("cuda")
    filters = torch.from_numpy(cnn.filters).reshape(CONV_LAYER_SIZE, 1, 5, 5).to(device)
    weights = torch.from_numpy(cnn.weights).to(device)
    host = torch.from_numpy(random_values(rng, options.images, INPUT_DIM, INPUT_DIM)).reshape(-1, 1, INPUT_DIM, INPUT_DIM)
    host = host.pin_memory()
    resident = host.to(device)

    def forward(images: torch.Tensor) -> np.ndarray:
        conv = torch.relu(torch.nn.functional.conv2d(images, filters, stride=5))
        return (conv.reshape(len(images), -1) @ weights.T).cpu().numpy()

    with torch.no_grad():
        pinned = median_rate(options.images, lambda: forward(host.to(device, non_blocking=True)), options.repeats)
        on_device = median_rate(options.images, lambda: forward(resident), options.repeats)
    model = {"flops_per_image": FLOPS_PER_IMAGE}
    return [
        Figure("torch", f"pytorch {torch.__version__} float64, from page-locked memory", pinned, "h2d", **model),
        Figure("torch", f"pytorch {torch.__version__} float64, resident", on_device, "d2d", **model),
    ]


def run_bench(options: BenchOptions, seed: int | None = None) -> BenchReport:
    """Measure the chosen rows; the report holds every figure, with notes on rows that did not run."""
    rng = np.random.default_rng(seed)
    cnn = _random_cnn(rng)
    report = BenchReport(options)
    if "cpu" in options.rows:
        report.figures.append(bench_cpu(cnn, options, rng))
    if "reader" in options.rows:
        report.figures += bench_reader(options, seed)
    if "csv" in options.rows:
        try:
            report.figures += bench_csv(cnn, options, seed)
        except CnnlabError as error:
            report.notes.append(f"csv rows not run: {error}")
    if set(GPU_ROWS) & set(options.rows) or options.sweep:
        try:
            bench_cuda(cnn, options, rng, report)
        except CnnlabError as error:
            report.notes.append(f"cuda rows not run: {error}")
    if "torch" in options.rows:
        try:
            report.figures += bench_torch(cnn, options, rng)
        except (ImportError, CnnlabError) as error:
            report.notes.append(f"torch rows not run: {error}")
    return report


def ratios(report: BenchReport) -> list[dict[str, Any]]:
    """Each figure as a dict, with its throughput and its ratios to its bound and to the lab scheme."""
    keyed = {figure.key: figure for figure in report.figures if figure.key}
    lab = next((figure.images_per_second for figure in report.figures if figure.row == "lab"), None)
    rows = []
    for figure in report.figures:
        bound = keyed.get(figure.bound) if figure.bound else None
        rows.append(
            {
                **asdict(figure),
                "bytes_per_second": figure.bytes_per_second,
                "flops_per_second": figure.flops_per_second,
                "of_bound": figure.images_per_second / bound.images_per_second if bound else None,
                "of_lab": figure.images_per_second / lab if lab else None,
            }
        )
    return rows


def format_table(report: BenchReport) -> str:
    lines = [f"{'figure':<66} {'MB/s':>10} {'images/s':>14} {'of bound':>9} {'x lab':>8}"]
    for row in ratios(report):
        of_bound = f"{row['of_bound']:.1%}" if row["of_bound"] is not None else "-"
        of_lab = f"{row['of_lab']:.1f}" if row["of_lab"] is not None else "-"
        rate = f"{row['bytes_per_second'] / 1e6:,.0f}" if row["bytes_per_second"] else "-"
        lines.append(f"{row['name'][:66]:<66} {rate:>10} {row['images_per_second']:>14,.0f} {of_bound:>9} {of_lab:>8}")
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines)


def write_report(report: BenchReport, json_path: str | None, plot_path: str | None) -> None:
    if json_path:
        with AtomicOutput(json_path) as out:
            json.dump({**asdict(report), "figures": ratios(report)}, out, indent=2)
            out.write("\n")
    if plot_path:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("cnnlab: note: --plot needs matplotlib; no plot drawn", file=sys.stderr)
            return
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for row, points in asdict(report.sweep).items():
            if points:
                axes.plot(*zip(*points), "o-", label=f"cuda, {row}")
        lines = [row for row in ratios(report) if row["row"] in ("lab", "bounds")]
        for color, row in enumerate(lines, start=2):
            axes.axhline(row["images_per_second"], color=f"C{color}", linestyle="--", linewidth=1, label=row["name"][:50])
        axes.set(xscale="log", yscale="log", xlabel="images per compute() call", ylabel="images/s", title=report.device or "")
        axes.legend(fontsize=7)
        figure.tight_layout()
        with AtomicOutput(plot_path, binary=True) as out:
            figure.savefig(out, format="png", dpi=120)
