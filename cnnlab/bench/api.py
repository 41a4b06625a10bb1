"""`cnnlab bench`'s api rows: the Python API's one-liner on the GPU, `cnnlab.forward(x, cnn, device="cuda")`, a call
after the first (the context the process keeps), against the same work in a CudaContext made beforehand and on the CPU:
host arrays in, numpy outputs back, each call timed whole, in turns."""

from __future__ import annotations

from functools import partial

import numpy as np

from cnnlab.bench.report import API_IMAGES, BenchOptions, Figure, Traffic, alternated_seconds, rate_and_range
from cnnlab.compare import rule_verdict
from cnnlab.constants import FLOPS_PER_IMAGE, IMAGE_BYTES, INPUT_DIM
from cnnlab.generate import random_values
from cnnlab.network import Cnn


def bench_api(cnn: Cnn, options: BenchOptions, rng: np.random.Generator) -> list[Figure]:
    """At each of API_IMAGES: the one-liner and the CPU's forward as multiples of the kept CudaContext's rate."""
    import cnnlab
    from cnnlab.cuda.context import CudaContext

    figures = []
    traffic: Traffic = {"bytes_per_image": IMAGE_BYTES, "flops_per_image": FLOPS_PER_IMAGE}
    try:
        with CudaContext(cnn) as gpu:
            for count in API_IMAGES:
                images = random_values(rng, count, INPUT_DIM, INPUT_DIM)
                one_liner_call, cpu_call = partial(cnnlab.forward, images, cnn, device="cuda"), partial(cnnlab.forward, images, cnn)
                timed = alternated_seconds([one_liner_call, partial(gpu.forward, images), cpu_call], options.repeats)
                one_liner, kept, cpu = (rate_and_range(count, seconds) for seconds in timed)
                verdict = rule_verdict(one_liner_call(), cpu_call())
                key = f"context-{count}"
                figures += [
                    Figure("api", f"cuda, CudaContext.forward(x), the context made beforehand, {count:,} images", kept[0],
                           key=key, repeat_range=kept[1], **traffic),
                    Figure("api", f"cuda, cnnlab.forward(x, cnn, device='cuda'), a call after the first, {count:,} images",
                           one_liner[0], key, repeat_range=one_liner[1], check=verdict, **traffic),
                    Figure("api", f"cpu, cnnlab.forward(x, cnn), {count:,} images", cpu[0], key, repeat_range=cpu[1], **traffic),
                ]  # fmt: skip
    finally:
        cnnlab.release_backends()
    return figures
