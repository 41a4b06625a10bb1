"""The CSV parser's rate on one core and on many, against std::from_chars on the same text and threads.
Run by tools/gpu-check.sh's `parser` stage (BENCHMARKS.md section 2); on a machine without a GPU, by hand.

    python tools/bench_parser.py [--images 2000] [--dir /tmp/parser] [--core 0] [--threads 1 2 4 8 16] [--pairs 7]

Writes cnn.csv and in.csv with `cnnlab generate` (and in.npy with `cnnlab convert`) unless DIR holds them, then:

1. The run, pinned (`taskset -c CORE python -m cnnlab cpu --threads 1`): the CSV input and the .npy input in turns,
   --pairs pairs; the parse's rate is the text's bytes over the CSV run's wall time less the .npy run's, pair by pair.
2. On that core (this process pinned): the row parsers this CPU runs (the reader's path, parse_pieces on the text in
   memory, cut at ~1 MB line ends as a read cuts it) and the bench's peer, std::from_chars field by field on the same
   pieces (native from_chars_pieces), in turns; each turn's ratio.
3. Unpinned, on each of --threads: the widest row parser and from_chars, in turns; MB/s, the scaling against one
   thread (1.0: linear) and the ratio.

Every figure is the median of its turns with the range (min..max); the values are checked bit-identical to from_chars's
(correctly rounded: float()'s) on every pass.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cnnlab.files import _lab_csv as native  # noqa: E402

WIDTH = 100
PIECE_BYTES = 1 << 20  # as read_summarized's pieces: the runs the reader's parse claims


def files(directory: Path, images: int) -> tuple[Path, Path, Path]:
    csv, npy = directory / "in.csv", directory / "in.npy"
    if not csv.exists() or int(csv.open("rb").readline()) != images:
        run = [sys.executable, "-m", "cnnlab", "generate", "--images", str(images), "--out-dir", str(directory)]
        subprocess.run(run, check=True, cwd=ROOT)
        npy.unlink(missing_ok=True)
    if not npy.exists():
        subprocess.run([sys.executable, "-m", "cnnlab", "convert", str(csv), str(npy)], check=True, cwd=ROOT)
    return directory / "cnn.csv", csv, npy


def pieces_of(data: np.ndarray, start: int) -> np.ndarray:
    """(start, end, rows before) of ~PIECE_BYTES runs of whole lines from `start`."""
    rows_each = max(1, PIECE_BYTES // int((len(data) - start) / native.scan_rows(data, start, 1 << 62, 1 << 30)[1]))
    result, before = [], 0
    while start < len(data):
        end, found, _ = native.scan_rows(data, start, rows_each, 1 << 30)
        if not found:
            break
        result.append((start, end, before))
        start, before = end, before + found
    return np.array(result, np.int64)


def rate_line(label: str, nbytes: int, seconds: list[float]) -> str:
    rates = sorted(nbytes / s / 1e6 for s in seconds)
    return f"{label:<44} {statistics.median(rates):9.1f} MB/s ({rates[0]:.1f}..{rates[-1]:.1f})"


def ratios(label: str, a: list[float], b: list[float]) -> str:
    turns = sorted(y / x for x, y in zip(a, b))
    return f"{label:<44} {statistics.median(turns):9.2f}x    ({turns[0]:.2f}..{turns[-1]:.2f}, {len(turns)} turns)"


def whole_run(cnn: Path, csv: Path, npy: Path, core: int, pairs: int, text_bytes: int, directory: Path) -> None:
    print(f"-- the run, pinned to core {core}, one thread: CSV against .npy, {pairs} pairs (and a warm-up)")
    seconds: dict[str, list[float]] = {"csv": [], "npy": []}
    for turn in range(pairs + 1):
        for name, path in (("csv", csv), ("npy", npy)):
            command = ["taskset", "-c", str(core), sys.executable, "-m", "cnnlab", "cpu", "--threads", "1", str(cnn), str(path)]
            start = time.perf_counter()
            subprocess.run([*command, str(directory / f"out_{name}.csv")], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            if turn:
                seconds[name].append(time.perf_counter() - start)
    for name, times in seconds.items():
        print(f"  {name} run wall {statistics.median(times):.3f} s ({min(times):.3f}..{max(times):.3f})")
    extra = [a - b for a, b in zip(seconds["csv"], seconds["npy"])]
    print(rate_line("  parse (CSV wall less .npy wall, pair by pair)", text_bytes, extra))


def in_process(data: np.ndarray, pieces: np.ndarray, rows: int, threads: int, turns: int, isas: tuple[str, ...]) -> dict[str, list[float]]:
    """Seconds a turn of each row parser in `isas` and of from_chars, on a pool of `threads`, in turns."""
    pool = native.Pool(threads)
    outs = {name: np.zeros(rows * WIDTH) for name in (*isas, "from_chars")}
    seconds: dict[str, list[float]] = {name: [] for name in outs}
    before = native.parser_isa()
    try:
        for turn in range(turns + 1):
            for name, out in outs.items():
                start = time.perf_counter()
                if name == "from_chars":
                    assert native.from_chars_pieces(pool, data, pieces, WIDTH, out) == rows * WIDTH
                else:
                    native.use_isa(name)
                    assert native.parse_pieces(pool, data, pieces, WIDTH, out) == -1
                if turn:
                    seconds[name].append(time.perf_counter() - start)
            for name, out in outs.items():
                assert np.array_equal(out.view(np.uint64), outs["from_chars"].view(np.uint64)), f"{name} differs from from_chars"
    finally:
        native.use_isa(before)
        pool.close()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/parser"))
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--no-run", action="store_true", help="leave out the whole run (1.)")
    args = parser.parse_args()

    args.dir.mkdir(parents=True, exist_ok=True)
    cnn, csv, npy = files(args.dir, args.images)
    data = np.fromfile(csv, np.uint8)
    start = int(np.argmax(data == ord("\n"))) + 1  # past N
    text_bytes, rows = len(data) - start, args.images * WIDTH
    pieces = pieces_of(data, start)
    print(f"{csv}: {len(data) / 1e6:.1f} MB, {args.images} images, {len(pieces)} pieces; {os.cpu_count()} cores; "
          f"row parsers {', '.join(native.CPU_ISAS)}")  # fmt: skip
    if not args.no_run:
        whole_run(cnn, csv, npy, args.core, args.pairs, text_bytes, args.dir)

    every = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {args.core})
    print(f"-- pinned to core {args.core}, one thread, the text in memory: each row parser and from_chars in turns")
    seconds = in_process(data, pieces, rows, 1, args.pairs, native.CPU_ISAS)
    for name, times in seconds.items():
        print(rate_line(f"  {name}", text_bytes, times))
    for name in native.CPU_ISAS:
        print(ratios(f"  {name} / from_chars, turn by turn", seconds[name], seconds["from_chars"]))
    os.sched_setaffinity(0, every)

    widest = native.CPU_ISAS[0]
    print(f"-- unpinned, the text in memory: {widest} and from_chars on each thread count, in turns")
    one: dict[str, float] = {}
    for threads in args.threads:
        seconds = in_process(data, pieces, rows, threads, args.pairs, (widest,))
        for name, times in seconds.items():
            rate = text_bytes / statistics.median(times)
            one.setdefault(name, rate / threads)
            print(rate_line(f"  {name}, {threads} threads", text_bytes, times) + f"  scaling {rate / (one[name] * threads):.2f} of linear")
        print(ratios(f"  {widest} / from_chars, {threads} threads", seconds[widest], seconds["from_chars"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
