#!/usr/bin/env python3
"""The Dask path on one GPU against CudaContext.forward, on the same images from a .npy file in the page cache.
Run by tools/gpu-check.sh's `dask` stage, after the Dask tests (BENCHMARKS.md section 5).

    python tools/bench_dask.py [--images N] [--block B] [--repeats R] [--seed S] [--device cpu|cuda]

Rows, each images/s (median, slowest..fastest of --repeats after a warm-up):
- forward: CudaContext.forward (cnnlab.forward with --device cpu) on the images already in memory: the figure to match;
- dask, in memory: cnnlab.forward on a Dask array of the same images in memory (da.from_array, --block images a block),
  computed by Dask's threaded scheduler in this process: what Dask itself costs (timed in turns with forward, and its
  ratio to forward taken turn by turn, printed last);
- load + forward: forward with the .npy file read into memory first (np.load), as a script would;
- forward, 1 thread (the GPU only): forward with its images copied into page-locked memory on one thread, not on every
  core;
- dask, from file: cnnlab.forward on a Dask array read from the file a block at a time, on a local cluster of one worker
  process (the GPU's worker, as dask-cuda would make it), outputs gathered to the client: the many-hosts recipe, bound
  by reading the file, as the load + forward row is.
Then each row's ratio to the first, and the Dask rows' outputs checked against forward's (the CPU: bit for bit; the
GPU: identical, the same kernels on the same images).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cnnlab  # noqa: E402
from cnnlab.bench.report import alternated_seconds, repeat_seconds  # noqa: E402
from cnnlab.constants import IMAGE_BYTES, INPUT_DIM  # noqa: E402
from cnnlab.generate import random_values  # noqa: E402


@dataclass(frozen=True)
class Rate:
    """Images per second of one row: the median and the range of its repeats."""

    row: str
    median: float
    slowest: float
    fastest: float

    def line(self, against: Rate | None) -> str:
        ratio = f"  {self.median / against.median:.2f}x {against.row}" if against else ""
        return f"{self.row:<16} {self.median:>12,.0f} images/s  ({self.slowest:,.0f}..{self.fastest:,.0f}){ratio}"


def rate_of(row: str, images: int, seconds: list[float]) -> Rate:
    return Rate(row, images / statistics.median(seconds), images / max(seconds), images / min(seconds))


def timed(row: str, images: int, run: Callable[[], object], repeats: int) -> Rate:
    return rate_of(row, images, repeat_seconds(run, repeats))


def npy_blocks(path: Path, count: int, block: int):  # noqa: ANN201  (a dask.array.Array: Dask is imported here only)
    """The images of a .npy file as a Dask array, each block read from the file by the worker that computes it."""
    import dask
    import dask.array as da

    offset = np.load(path, mmap_mode="r").offset  # where the data starts, past the header

    def read(start: int, stop: int) -> np.ndarray:  # one read() into a new array: no page faults on a mapping
        values = np.fromfile(path, np.float64, (stop - start) * INPUT_DIM * INPUT_DIM, offset=offset + start * IMAGE_BYTES)
        return values.reshape(stop - start, INPUT_DIM, INPUT_DIM)

    parts = [
        da.from_delayed(dask.delayed(read)(start, min(start + block, count)), (min(block, count - start), INPUT_DIM, INPUT_DIM), np.float64)
        for start in range(0, count, block)
    ]
    return da.concatenate(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=65_536)
    parser.add_argument("--block", type=int, default=8_192, help="images a Dask block (default 8,192: 655 MB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=459)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    from distributed import Client, LocalCluster

    rng = np.random.default_rng(args.seed)
    cnn = cnnlab.Cnn(random_values(rng, 10, 5, 5), random_values(rng, 10, 4000))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "images.npy"
        np.save(path, random_values(rng, args.images, INPUT_DIM, INPUT_DIM))
        images = np.load(path)
        import dask.array as da

        # Dask on the same images in memory, computed by its threaded scheduler in this process: what Dask itself costs,
        # timed in turns with forward, and its ratio to forward taken turn by turn.
        in_memory = cnnlab.forward(da.from_array(images, chunks=(args.block, INPUT_DIM, INPUT_DIM)), cnn, device=args.device)
        with nullcontext() if args.device == "cpu" else cnnlab.CudaContext(cnn) as gpu:
            forward = partial(cnnlab.forward, cnn=cnn) if gpu is None else gpu.forward
            expected = forward(images)
            computed_in_memory = in_memory.compute(scheduler="threads")
            turns = alternated_seconds([lambda: forward(images), lambda: in_memory.compute(scheduler="threads")], args.repeats)
            ratios = sorted(alone / dask for alone, dask in zip(*turns))
            rows = [
                rate_of("forward", args.images, turns[0]),
                rate_of("dask, in memory", args.images, turns[1]),
                timed("load + forward", args.images, lambda: forward(np.load(path)), args.repeats),
            ]
        if gpu is not None:  # what the copier's threads buy: the same forward staging its images on one thread
            with cnnlab.CudaContext(cnn, threads=1) as alone:
                rows.append(timed("forward, 1 thread", args.images, lambda: alone.forward(images), args.repeats))
        # One worker process, as dask-cuda makes one a GPU; threads enough to read the next blocks while one computes.
        with LocalCluster(n_workers=1, threads_per_worker=4, processes=True, dashboard_address=None) as cluster, Client(cluster) as client:
            outputs = cnnlab.forward(npy_blocks(path, args.images, args.block), cnn, device=args.device)
            computed = client.compute(outputs).result()
            rows.append(timed("dask, from file", args.images, lambda: client.compute(outputs).result(), args.repeats))
    device = "the CPU" if args.device == "cpu" else args.device
    print(f"{args.images:,} images (fresh random, float64) from a .npy file in the page cache, on {device}; Dask blocks of {args.block:,}")
    for rate in rows:
        print(rate.line(None if rate is rows[0] else rows[0]))
    print(f"dask, in memory, against forward turn by turn: {statistics.median(ratios):.2f}x ({ratios[0]:.2f}..{ratios[-1]:.2f})")
    same = np.array_equal(computed, expected) and np.array_equal(computed_in_memory, expected)
    print(f"dask's outputs {'identical to' if same else 'DIFFER from'} forward's")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
