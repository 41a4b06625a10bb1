"""Where cpu mode's CSV reading goes as the threads grow: each stage of the reader alone, in GB/s of text.
Run by tools/gpu-check.sh's `parsers` stage (1 to 16 threads) and `tune` stage (the shares and steps).

    python tools/profile_cpu_csv.py IN_CSV [--threads 1 2 4 8 16] [--repeats 3] [--ahead-share 1 4] [--step 16 64]

For each thread count: memory (every byte of a 1 GB array read once, the native forward's threads), read
(the file from the page cache into a window, native.read_summarized), parse (native.parse_rows on the text
in memory, one equal piece per thread: the parser alone), pieces (the same text cut into the reader's
16-image pieces, parsed on a pool of that many threads: what the reader does after reading), and reader
(CsvImageReader over the whole file: reading, cutting and parsing as a run does). Each is the median of
--repeats; the last column is the reader's scaling against its one-thread rate (1.0: linear). Then, on the most
threads, the reader again with other shares of its threads reading ahead (csv_reader.READ_AHEAD_SHARE) and other
images a step per thread (its STEP_IMAGES), to choose them.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cnnlab.bench.report import median_rate  # noqa: E402
from cnnlab.constants import INPUT_DIM  # noqa: E402
from cnnlab.cpu._forward import Forward  # noqa: E402
from cnnlab.files import csv_reader  # noqa: E402
from cnnlab.files.csv_reader import PARSE_IMAGES, STEP_IMAGES, CsvImageReader  # noqa: E402
from cnnlab.files.lines import native  # noqa: E402


def cuts(data: np.ndarray, start: int, rows_each: int) -> list[tuple[int, int, int]]:
    """(start, end, rows) of pieces of `rows_each` non-blank lines from `start` to the end."""
    pieces = []
    while start < len(data):
        end, found, _ = native.scan_rows(data, start, rows_each, 1 << 30)
        if not found:
            break
        pieces.append((start, end, found))
        start = end
    return pieces


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ahead-share", type=int, nargs="*", default=[], help="READ_AHEAD_SHARE values to try on the most threads")
    parser.add_argument("--step", type=int, nargs="*", default=[], help="images a step per thread to try on the most threads")
    args = parser.parse_args()

    data = np.fromfile(args.path, np.uint8)
    body = int(np.argmax(data == ord("\n"))) + 1  # past N
    text = len(data) - body
    images = int(bytes(data[:body]))
    memory = np.ones(1 << 27)  # 1 GB
    window = np.empty(64 << 20, np.uint8)
    out = np.empty(images * INPUT_DIM * INPUT_DIM)
    print(f"{args.path}: {len(data) / 1e9:.2f} GB, {images} images; {os.cpu_count()} cores, affinity {len(os.sched_getaffinity(0))}")
    print(f"{'threads':>7} {'memory GB/s':>12} {'read GB/s':>10} {'parse GB/s':>11} {'pieces GB/s':>12} {'reader GB/s':>12} {'scaling':>8}")
    one = None
    for threads in args.threads:
        forward = Forward(np.zeros((10, 5, 5)), np.zeros((10, 4000)), threads)
        memory_rate = median_rate(memory.nbytes, lambda: forward.read(memory), args.repeats)  # noqa: B023
        forward.close()
        with open(args.path, "rb") as file:
            fd = file.fileno()

            def read_file(fd: int = fd, threads: int = threads) -> None:
                for offset in range(0, len(data), len(window)):
                    native.read_summarized(fd, window, 0, min(len(window), len(data) - offset), offset, threads)

            read_rate = median_rate(len(data), read_file, args.repeats)
        equal = cuts(data, body, -(-images * INPUT_DIM // threads))
        small = cuts(data, body, PARSE_IMAGES * INPUT_DIM)
        offsets = np.cumsum([0] + [rows for _, _, rows in small]) * INPUT_DIM
        equal_offsets = np.cumsum([0] + [rows for _, _, rows in equal]) * INPUT_DIM
        with ThreadPoolExecutor(threads) as pool:

            def parse(pieces: list, at: np.ndarray, pool: ThreadPoolExecutor = pool) -> None:
                jobs = [pool.submit(native.parse_rows, data, a, b, INPUT_DIM, out[at[i] : at[i + 1]]) for i, (a, b, _) in enumerate(pieces)]
                assert all(job.result() == -1 for job in jobs)

            parse_rate = median_rate(text, lambda: parse(equal, equal_offsets), args.repeats)  # noqa: B023
            pieces_rate = median_rate(text, lambda: parse(small, offsets), args.repeats)  # noqa: B023

        def read_all(threads: int = threads, per_thread: int = STEP_IMAGES) -> None:
            with CsvImageReader(args.path, threads) as reader:
                buffer = np.empty((per_thread * threads, INPUT_DIM, INPUT_DIM))
                while reader.read_into(buffer, len(buffer)):  # as a run reads: the next step taken while one parses
                    pass

        reader_rate = median_rate(text, read_all, args.repeats)
        one = one or reader_rate / threads
        print(
            f"{threads:>7} {memory_rate / 1e9:>12.1f} {read_rate / 1e9:>10.1f} {parse_rate / 1e9:>11.2f} {pieces_rate / 1e9:>12.2f} "
            f"{reader_rate / 1e9:>12.2f} {reader_rate / (one * threads):>8.2f}"
        )
    threads = max(args.threads)
    for share in args.ahead_share:
        csv_reader.READ_AHEAD_SHARE = share
        rate = median_rate(text, lambda: read_all(threads), args.repeats)  # noqa: B023
        print(f"reader on {threads} threads, a 1/{share} of them reading ahead: {rate / 1e9:.2f} GB/s")
    for per_thread in args.step:
        rate = median_rate(text, lambda: read_all(threads, per_thread), args.repeats)  # noqa: B023
        print(f"reader on {threads} threads, {per_thread} images a step per thread: {rate / 1e9:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
