"""`cnnlab bench`: how fast each path is on this machine, next to the bounds measured in the same run.

Every figure is images per second, the median of several repeats after a warm-up, on fresh random
float64 data. Paths that end on the host (the backends' compute(), which returns finished outputs)
are timed with perf_counter; the copy bounds, pure device work, with CUDA events.

The bounds: a batch from page-locked host memory cannot beat the host-to-device copy of its
80,000 bytes per image; a batch resident on the device cannot beat reading its images once, at
the device-to-device copy rate (bytes read plus bytes written).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from cnnlab.benchreport import GPU_ROWS, BenchOptions, BenchReport, Figure, median_rate
from cnnlab.benchtext import bench_csv, bench_reader
from cnnlab.cpu import CpuBackend
from cnnlab.errors import CnnlabError
from cnnlab.generate import random_values
from cnnlab.network import CONV_LAYER_SIZE, FLOPS_PER_IMAGE, IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE, Cnn, ImageBatch
from cnnlab.progress import Progress


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
    if "torch" in options.rows:
        parts.append(("torch", lambda: bench_torch(cnn, options, rng), (ImportError, CnnlabError)))
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
