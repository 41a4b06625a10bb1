"""Time the native CSV parser (cnnlab.files._lab_csv) in MB/s of text, on 1 thread and on several.
Run by tools/gpu-check.sh's `parsers` stage, on 1 to 16 threads.

    python tools/bench_lab_csv.py [--images 1000] [--dir /tmp/x] [--threads 1 2] [--repeats 5]

Writes an input file with `python -m cnnlab generate` unless DIR/in.csv is there already, reads
it into memory, drops the first line (N) and times parse_rows over all the images: on one thread,
then cut into one piece per thread at line ends and parsed by that many Python threads at once
(parse_rows releases the GIL). scan_rows, which cuts a file into blocks, is timed on its own.
numpy.loadtxt on a 50-image slice gives the scale. The first pass is checked against float() on
a sample of rows. Each figure is the median of --repeats runs, with the range (min..max).
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cnnlab.files import _lab_csv as native  # noqa: E402

WIDTH = 100
LINES_PER_IMAGE = 100


def input_file(directory: Path, images: int) -> Path:
    path = directory / "in.csv"
    if not path.exists() or int(path.open("rb").readline()) != images:
        cmd = [sys.executable, "-m", "cnnlab", "generate", "--images", str(images), "--out-dir", str(directory)]
        subprocess.run(cmd, check=True, cwd=ROOT)
    return path


def cuts(data: np.ndarray, start: int, pieces: int) -> list[tuple[int, int, int]]:
    """(start, end, rows) of `pieces` ranges of about equal bytes, each ending at a line end."""
    rows_total = native.scan_rows(data, start, 1 << 62, 1 << 30)[1]
    result, position, rows_left = [], start, rows_total
    for index in range(pieces):
        rows = rows_left if index == pieces - 1 else rows_total // pieces
        end, found, _ = native.scan_rows(data, position, rows, 1 << 30)
        result.append((position, end, found))
        position, rows_left = end, rows_left - found
    if result[-1][1] < len(data):  # trailing blank lines belong to the last piece
        result[-1] = (result[-1][0], len(data), result[-1][2])
    return result


def timed(function, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        function()
        times.append(time.perf_counter() - t0)
    return times


def describe(label: str, nbytes: int, times: list[float]) -> str:
    rates = sorted(nbytes / t / 1e6 for t in times)
    return f"{label:<28} {statistics.median(rates):8.1f} MB/s   (min {rates[0]:.1f} .. max {rates[-1]:.1f}, {len(rates)} runs)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/x"))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    path = input_file(args.dir, args.images)
    data = np.fromfile(path, np.uint8)
    start = int(np.argmax(data == ord("\n"))) + 1  # past the first line, N
    body = len(data) - start
    print(f"{path}: {len(data) / 1e6:.1f} MB, {args.images} images, {body / args.images / 1e3:.0f} KB of text per image")

    rows = args.images * LINES_PER_IMAGE
    out = np.empty(rows * WIDTH)
    assert native.parse_rows(data, start, len(data), WIDTH, out) == -1
    lines = bytes(data[start:]).split(b"\n")
    sample = [line for line in lines if line.strip()][:: max(1, rows // 500)]
    expected = np.array([[float(v) for v in line.split(b",")] for line in sample])
    got = out.reshape(rows, WIDTH)[:: max(1, rows // 500)][: len(sample)]
    assert np.array_equal(expected.view(np.uint64), got.view(np.uint64)), "values differ from float()"
    print(f"checked {len(sample)} rows against float(): bit-identical")

    print(describe("scan_rows (1 thread)", body, timed(lambda: native.scan_rows(data, start, rows, 1 << 20), args.repeats)))
    for threads in args.threads:
        pieces = cuts(data, start, threads)
        offsets = np.cumsum([0] + [rows_ for _, _, rows_ in pieces]) * WIDTH

        def parse_all(pieces=pieces, offsets=offsets, threads=threads) -> None:
            if threads == 1:
                assert native.parse_rows(data, start, len(data), WIDTH, out) == -1
                return
            with ThreadPoolExecutor(threads) as pool:
                jobs = [
                    pool.submit(native.parse_rows, data, a, b, WIDTH, out[offsets[i] : offsets[i + 1]])
                    for i, (a, b, _) in enumerate(pieces)
                ]
                assert all(job.result() == -1 for job in jobs)

        print(describe(f"parse_rows ({threads} thread{'s' if threads > 1 else ''})", body, timed(parse_all, args.repeats)))

    sample_images = min(50, args.images)
    end, _, _ = native.scan_rows(data, start, sample_images * LINES_PER_IMAGE, 1 << 20)
    text = bytes(data[start:end])
    loadtxt_times = timed(lambda: np.loadtxt(io.BytesIO(text), delimiter=",", dtype=np.float64), max(1, args.repeats // 2))
    print(describe(f"numpy.loadtxt ({sample_images} images)", len(text), loadtxt_times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
