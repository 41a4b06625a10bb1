"""`cnnlab bench`'s rows that read CSV text: the host reader against std::from_chars on the same text and threads,
numpy.loadtxt (and Polars, where installed), and `cnnlab cuda` on a CSV file against the GPU path's two bounds."""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from cnnlab.bench.report import BenchOptions, Figure, Traffic, alternated_seconds, median_rate, rate_and_range
from cnnlab.constants import INPUT_DIM
from cnnlab.files.csv_reader import CsvImageReader
from cnnlab.network import Cnn, default_threads

LOADTXT_IMAGES = 50  # numpy.loadtxt reads the first images only: on the whole file it would take minutes


def bench_reader(options: BenchOptions, seed: int | None) -> list[Figure]:
    """The CSV reader in MB/s on a file of --reader-images images in the page cache, with one parse thread and the run's
    threads, against the peer on the same text and threads: std::from_chars field by field, natively, as a C++ user
    would write it (the text in memory); the four in turns. numpy.loadtxt on the first images gives the scale, and
    Polars, where installed, reads the whole file."""
    from cnnlab.files import _lab_csv as native
    from cnnlab.generate import generate

    with tempfile.TemporaryDirectory() as folder:
        _, path = generate(folder, options.reader_images, seed)
        size = path.stat().st_size
        image_bytes = size / options.reader_images
        threads = options.threads or default_threads()
        data = np.fromfile(path, np.uint8)  # the peer's text, and the page cache warmed
        start = int(np.argmax(data == ord("\n"))) + 1
        pieces = _pieces(data, start, options.reader_images)
        values = np.empty(options.reader_images * INPUT_DIM * INPUT_DIM)

        def read(threads: int) -> None:
            with CsvImageReader(path, threads) as reader:
                buffer = np.empty((reader.step, INPUT_DIM, INPUT_DIM))
                while reader.read_into(buffer, len(buffer)):  # as a run reads: the next step taken while one parses
                    pass

        def peer(pool: Any) -> None:
            if native.from_chars_pieces(pool, data, pieces, INPUT_DIM, values) != len(values):
                raise RuntimeError("the from_chars peer refused the bench's own file")

        one, every = native.Pool(1), native.Pool(threads)
        try:
            runs: list[Callable[[], object]] = [partial(read, 1), partial(peer, one), partial(read, threads), partial(peer, every)]
            seconds = alternated_seconds(runs, min(options.repeats, 3))
        finally:
            one.close()
            every.close()
        loadtxt = _loadtxt_rate(data, start, min(LOADTXT_IMAGES, options.reader_images))
        polars = _polars_rate(path, options.reader_images, min(options.repeats, 3))
    text: Traffic = {"bytes_per_image": image_bytes}
    (read_one, read_one_range), (peer_one, peer_one_range), (read_every, read_every_range), (peer_every, peer_every_range) = (
        rate_and_range(options.reader_images, times) for times in seconds
    )
    file = f"{size / 1e9:.2f} GB file"
    figures = [
        Figure("reader", f"reference: numpy.loadtxt (one thread, the first {LOADTXT_IMAGES} images)", loadtxt, key="loadtxt", **text),
        Figure("reader", "peer: std::from_chars a field, one thread (text in memory)", peer_one, "loadtxt", "from_chars-1",
               repeat_range=peer_one_range, **text),
        Figure("reader", f"peer: std::from_chars a field, {threads} threads (text in memory)", peer_every, "loadtxt", "from_chars",
               repeat_range=peer_every_range, **text),
        Figure("reader", f"cnnlab CSV reader, one parse thread ({file})", read_one, "from_chars-1", repeat_range=read_one_range, **text),
        Figure("reader", f"cnnlab CSV reader, {threads} parse threads ({file})", read_every, "from_chars",
               repeat_range=read_every_range, **text),
    ]  # fmt: skip
    if polars is not None:
        figures.append(Figure("reader", f"peer: polars {polars[0]} read_csv, whole file, every thread", polars[1], "loadtxt", **text))
    return figures


def _pieces(data: np.ndarray, start: int, images: int) -> np.ndarray:
    """The text's rows as pieces for the peer's threads: (start, end, rows before) of ~1 MB of whole lines each."""
    from cnnlab.files.lines import scan_rows

    rows_each = max(1, (1 << 20) * images * INPUT_DIM // max(1, len(data) - start))
    result, before = [], 0
    while start < len(data):
        end, found, _ = scan_rows(data, start, rows_each)
        if not found:
            break
        result.append((start, end, before))
        start, before = end, before + found
    return np.array(result, np.int64).reshape(-1, 3)


def _loadtxt_rate(data: np.ndarray, start: int, images: int) -> float:
    """Images/s of numpy.loadtxt on the first `images` images' text (their lines, blank ones included), from memory."""
    from cnnlab.files.lines import scan_rows

    end = scan_rows(data, start, images * INPUT_DIM)[0]
    text = data[start:end].tobytes()
    return median_rate(images, lambda: np.loadtxt(io.BytesIO(text), delimiter=","), 1)


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


def bench_csv(cnn: Cnn, options: BenchOptions, seed: int | None) -> tuple[list[Figure], list[str]]:
    """`cnnlab cuda` on a CSV file in the page cache, a whole run (the file opened, its double buffer made, the
    read-compute-write loop, all freed), in images/s and GB/s of text: parsed on the GPU (the text copied straight to
    the device, against the host-to-device copy, with KvikIO's read of the same file as the peer) and parsed on the host
    (against reading the file into page-locked memory, which it does first), the bounds measured in the same run."""
    from cnnlab.bench.peers import run_peers
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
                bound = "h2d-text" if parse_csv else "read"  # what the run's text goes through
                name = f"cnnlab cuda on CSV, parsed {where}: whole run"
                figures.append(Figure("csv", name, rate, bound, device_bytes=context.peak_device_bytes, **text))
                if parse_csv:
                    read_rate, host_to_device = _text_bounds(context, path, threads, options.repeats)
        peer, notes = run_peers(("kvikio",), "csv", "h2d-text", options.csv_images, options.repeats, None, file=str(path),
                                bytes_per_image=text["bytes_per_image"], flops_per_image=None)  # fmt: skip
    per_image = text["bytes_per_image"]
    return figures + peer + [
        Figure("csv", f"bound: file (page cache) to page-locked memory, {threads} reads", read_rate / per_image, key="read", **text),
        Figure("csv", "bound: host-to-device copy of the text", host_to_device / per_image, key="h2d-text", **text),
    ], notes


def _text_bounds(context: Any, path: os.PathLike, threads: int, repeats: int) -> tuple[float, float]:
    """Bytes/s of reading the file into page-locked memory as the GPU path reads it, and of copying it to the device."""
    from cnnlab.bench.gpu import host_copy_rate
    from cnnlab.files.text import read_at

    size = os.path.getsize(path)
    pinned = context.allocate_text(size)
    with open(path, "rb") as file, ThreadPoolExecutor(threads) as pool:
        read_rate = median_rate(size, partial(read_at, file.fileno(), memoryview(pinned), 0, pool, threads), repeats)
    return read_rate, host_copy_rate(context, pinned, repeats)


