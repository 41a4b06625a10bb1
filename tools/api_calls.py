"""The Python API's one-liner on the GPU against the same work inside one CudaContext and on the CPU: host arrays in,
numpy outputs back, each call timed whole, in turns.

    python tools/api_calls.py [--images 100 1000 10000] [--repeats 5]

For each size: `cnnlab.forward(x, cnn, device="cuda")` after its first call (the context the process keeps),
`gpu.forward(x)` in a CudaContext made beforehand, and `cnnlab.forward(x, cnn)` on the CPU, each the median of
--repeats calls after a warm-up, taken in turns (one call of each a round), with the one-liner's ratio to the kept
context and to the CPU; then whether the GPU's outputs pass the lab's comparison against the CPU's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import cnnlab
from cnnlab.compare import rule_verdict
from cnnlab.generate import random_values


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng()
    cnn = cnnlab.Cnn(random_values(rng, 10, 5, 5), random_values(rng, 10, 4000))
    print(f"{'images':>8} {'one-liner ms':>13} {'CudaContext ms':>15} {'cpu ms':>9} {'one-liner/context':>18} {'one-liner/cpu':>14}")
    with cnnlab.CudaContext(cnn) as gpu:
        for count in args.images:
            images = random_values(rng, count, 100, 100)
            calls = {
                "one-liner": partial(cnnlab.forward, images, cnn, device="cuda"),
                "context": partial(gpu.forward, images),
                "cpu": partial(cnnlab.forward, images, cnn),
            }
            for call in calls.values():  # warm-up: the kept context made, buffers grown, caches warm
                call()
            seconds: dict[str, list[float]] = {name: [] for name in calls}
            for _ in range(args.repeats):
                for name, call in calls.items():
                    seconds[name].append(timed(call))
            ms = {name: statistics.median(values) * 1e3 for name, values in seconds.items()}
            print(
                f"{count:>8,} {ms['one-liner']:>13.2f} {ms['context']:>15.2f} {ms['cpu']:>9.2f} "
                f"{ms['one-liner'] / ms['context']:>18.2f} {ms['one-liner'] / ms['cpu']:>14.2f}"
            )
            verdict = rule_verdict(cnnlab.forward(images, cnn, device="cuda"), cnnlab.forward(images, cnn))
            print(f"{'':>8} outputs against the CPU's: {verdict}")
    cnnlab.release_backends()


if __name__ == "__main__":
    main()
