"""`cnnlab bench`'s rows that read CSV text: the host reader against numpy.loadtxt (and Polars, where
installed), and `cnnlab cuda` on a CSV file against the GPU path's two bounds."""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from cnnlab.bench.report import BenchOptions, Figure, Traffic, median_rate
from cnnlab.files.csv_reader import CsvImageReader
from cnnlab.network import INPUT_DIM, Cnn, default_threads


def bench_reader(options: BenchOptions, seed: int | None) -> list[Figure]:
    """The CSV reader in MB/s, with one parse thread and one per core, and numpy.loadtxt on the same file."""
    from cnnlab.generate import generate

    with tempfile.TemporaryDirectory() as folder:
        _, path = generate(folder, options.reader_images, seed)
        size = path.stat().st_size
        image_bytes = size / options.reader_images
        threads = options.threads or default_threads()

        def read(threads: int | None) -> None:
            with CsvImageReader(path, threads) as reader:
                buffer = np.empty((reader.step, INPUT_DIM, INPUT_DIM))
                while reader.read_into(buffer, len(buffer)):  # as a run reads: the next step taken while one parses
                    pass

        repeats = min(options.repeats, 3)
        loadtxt, one, every = (
            median_rate(options.reader_images, run, repeats)
            for run in (lambda: np.loadtxt(path, delimiter=",", skiprows=1), partial(read, 1), partial(read, threads))
        )
        peer = _polars_rate(path, options.reader_images, repeats)
    text: Traffic = {"bytes_per_image": image_bytes}
    figures = [
        Figure("reader", "reference: numpy.loadtxt (one thread)", loadtxt, key="loadtxt", **text),
        Figure("reader", "cnnlab CSV reader, one parse thread", one, "loadtxt", **text),
        Figure("reader", f"cnnlab CSV reader, {threads} parse threads", every, "loadtxt", **text),
    ]
    if peer is not None:
        figures.append(Figure("reader", f"peer: polars {peer[0]} read_csv, whole file, every thread", peer[1], "loadtxt", **text))
    return figures


def _polars_rate(path: os.PathLike, images: int, repeats: int) -> tuple[str, float] | None:
    """(version, images/s) of Polars' CSV reader on the file, the fastest exact CSV library we measured,
    as its users would call it: the whole file at once, a Float64 schema, blank lines dropped; None without Polars."""
    try:
        import polars
    except Exception:  # not installed, or failing to load (under a memory limit, it warns and then fails oddly)
        return None
    schema = {str(column): polars.Float64 for column in range(INPUT_DIM)}

    def read() -> np.ndarray:
        frame = polars.read_csv(path, has_header=False, skip_rows=1, schema=schema, quote_char=None).drop_nulls()
        return frame.to_numpy().reshape(images, INPUT_DIM, INPUT_DIM)

    return polars.__version__, median_rate(images, read, repeats)


def bench_csv(cnn: Cnn, options: BenchOptions, seed: int | None) -> list[Figure]:
    """`cnnlab cuda` on a CSV file in the page cache, a whole run (the file opened, its page-locked windows made,
    the read-compute-write loop, all freed; the command line's loop figure leaves out the windows), in images/s
    and GB/s of text: parsed on the GPU and parsed on the host, against the two bounds of the GPU
    path measured in the same run: reading the file into page-locked memory, and copying it to the device."""
    from cnnlab.cuda.context import CudaContext
    from cnnlab.generate import generate
    from cnnlab.run import run_network

    threads = options.threads or default_threads()
    repeats = min(options.repeats, 3)
    with tempfile.TemporaryDirectory() as folder:
        _, path = generate(folder, options.csv_images, seed)
        text: Traffic = {"bytes_per_image": path.stat().st_size / options.csv_images}
        figures = []
        for parse_csv, where in ((True, "on the GPU"), (False, f"on the host ({threads} threads)")):
            with CudaContext(cnn, parse_csv=parse_csv) as context:
                loop = partial(run_network, context, path, os.path.join(folder, "out.npy"))
                rate = median_rate(options.csv_images, loop, repeats)
                figures.append(Figure("csv", f"cnnlab cuda on CSV, parsed {where}: whole run", rate, "read", **text))
                if parse_csv:
                    read_rate, host_to_device = _text_bounds(context, path, threads, options.repeats)
    per_image = text["bytes_per_image"]
    return figures + [
        Figure("csv", f"bound: file (page cache) to page-locked memory, {threads} reads", read_rate / per_image, key="read", **text),
        Figure("csv", "bound: host-to-device copy of the text", host_to_device / per_image, key="h2d-text", **text),
    ]


def _text_bounds(context: Any, path: os.PathLike, threads: int, repeats: int) -> tuple[float, float]:
    """Bytes/s of reading the file into page-locked memory as the GPU path reads it, and of copying it to the device."""
    from cnnlab.bench.gpu import host_copy_rate
    from cnnlab.files.text import read_at

    size = os.path.getsize(path)
    pinned = context.allocate_text(size)
    with open(path, "rb") as file, ThreadPoolExecutor(threads) as pool:
        read_rate = median_rate(size, partial(read_at, file.fileno(), memoryview(pinned), 0, pool, threads), repeats)
    return read_rate, host_copy_rate(context, pinned, repeats)


