#!/usr/bin/env python3
"""Tune the ladder's rungs on a GPU, each variant timed on the same resident images with CUDA events against the
device-to-device copy of those images, its outputs checked against the CPU's under the lab's rule:

- fused: fused_tiled and fused_tiled_fma (kernel/ladder/09_fused_tiled.cu) at several tile sizes and stage
  counts, with the bit-exact conv (rung 9) and with FMAs in the conv (FT_EXACT_CONV=0, rung 11);
- two: each kernel of the two-kernel rungs alone; rung 12 (kernel/ladder/12_two_kernels.cu: rung 9's conv alone
  and rung 7's dense kernel, a pass at a time) at several pass sizes, beside rungs 6 and 7;
  then the resident row (CudaContext.compute_resident, three chunk streams) with rung 6 and with rung 12.

    python tools/ladder_sweep.py [fused] [two] [--images N] [--repeats R] [--seed S]

Prints one line a variant: images/s (median, slowest..fastest), share of the bound, and the check; for the
fused rungs also registers a thread, shared memory a block and blocks per multiprocessor. Run by tools/gpu-check.sh's
`ladder` stage (both sweeps) and `two` stage (`two` alone: BENCHMARKS.md section 4).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from cnnlab.bench.gpu import device_copy_rate, event_seconds, time_kernels  # noqa: E402
from cnnlab.bench.report import median_rate  # noqa: E402
from cnnlab.compare import rule_verdict  # noqa: E402
from cnnlab.constants import IMAGE_BYTES  # noqa: E402
from cnnlab.cpu.backend import CpuBackend  # noqa: E402
from cnnlab.cuda import builds, kernels, ladder, launchers, nvcc  # noqa: E402
from cnnlab.cuda.context import CudaContext  # noqa: E402
from cnnlab.cuda.driver import device_errors  # noqa: E402
from cnnlab.cuda.ladder import LaunchConfig  # noqa: E402
from cnnlab.errors import CnnlabError  # noqa: E402
from cnnlab.generate import random_values  # noqa: E402
from cnnlab.network import Cnn, ImageBatch  # noqa: E402

# (images per tile, stages, exact conv): 8 x 2 is the rungs' shape (two blocks a multiprocessor); 16 x 2
# fits one block, 8 x 3 and 8 x 4 one block with a deeper pipeline.
VARIANTS = ((8, 2, True), (16, 2, True), (8, 3, True), (8, 2, False), (16, 2, False), (8, 3, False))
PASSES = (None, 1024, 2048, 8192, 65536)  # rung 12's images a pass (None: its own, a wave of the device's conv blocks)
CHECK_IMAGES = 256


def stage_times(context: CudaContext, resident: Any, bound: float, repeats: int) -> None:
    """Each kernel of the two-kernel rungs alone over every resident image, timed with CUDA events: where their time goes
    (the activations to and from device memory, a chunk of every image)."""
    driver, setup, count = context.driver, context.setup, resident.count
    conv_out = context.memory.device(count * 4000 * 8)
    partials = context.memory.device(4 * count * 10 * 8)
    stream = driver.Stream()
    conv = kernels.Conv2dRelu(setup.module(builds.KERNEL_BUILD), setup.sm_count)
    dense = kernels.FlattenedToDense(setup.module(builds.KERNEL_BUILD), setup.sm_count, 4, 256)
    coarse = setup.function(builds.COARSE_BUILD, "dense_coarsened", "PPPii")
    tiled_shared = launchers.fused_tiled_shared_bytes(builds.TWO_KERNELS_BUILD.sizes)
    tiled = setup.function(builds.TWO_KERNELS_BUILD, "conv_tiled", "PPi", tiled_shared)
    tiled_blocks = setup.sm_count * setup.blocks_per_sm(160, tiled_shared)
    blocks = max(1, setup.sm_count * kernels.BLOCKS_PER_SM // 4)
    stages = (
        ("conv2d_relu alone (rung 6's)", lambda: conv(stream, int(resident.allocation), conv_out, count, setup.nonfinite)),
        ("conv_tiled alone (rung 9's conv, rung 12's)", lambda: tiled.prepared_async_call(
            (min(count // 8, tiled_blocks), 1), (160, 1, 1), stream, resident.allocation, conv_out, np.int32(count),
            shared_size=tiled_shared)),
        ("flattened_to_dense alone (rung 6's)", lambda: dense(stream, conv_out, setup.weights, partials, count, count)),
        ("dense_coarsened alone (rung 7's)", lambda: coarse.prepared_async_call(
            (min(count // 4, blocks), 4), (256, 1, 1), stream, conv_out, setup.weights, partials, np.int32(count), np.int32(count))),
    )
    for name, run in stages:
        seconds = event_seconds(driver, stream, run, repeats)
        rate = count / sorted(seconds)[len(seconds) // 2]
        print(f"{name:<40} {rate:>12,.0f} images/s {rate / bound:6.1%} of D2D")
    context.memory.free(conv_out)
    context.memory.free(partials)


def report(name: str, timing: Any, bound: float, want: np.ndarray, extra: str = "") -> None:
    rates = sorted(len(timing.outputs) / seconds for seconds in timing.seconds)
    check = rule_verdict(timing.outputs.values[:CHECK_IMAGES], want)
    print(
        f"{name:<40} {timing.images_per_second:>12,.0f} images/s ({rates[0]:,.0f}..{rates[-1]:,.0f}) "
        f"{timing.images_per_second / bound:6.1%} of D2D;{extra} {check}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", nargs="*", choices=("fused", "two"), default=("fused", "two"), help="which rungs to sweep (default both)")
    parser.add_argument("--images", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    cnn = Cnn(random_values(rng, 10, 5, 5), random_values(rng, 10, 4000))
    images = random_values(rng, args.images, 100, 100)
    with CpuBackend(cnn) as cpu:
        want = cpu.compute(ImageBatch(images[:CHECK_IMAGES])).values
    with CudaContext(cnn, 1, LaunchConfig(streams=1, chunk_images=1)) as context:
        resident = context.upload(ImageBatch(images))
        bound = device_copy_rate(context, resident, args.repeats) / IMAGE_BYTES
        print(f"{context.device}: device-to-device copy bound {bound:,.0f} images/s")
        for tile, stages, exact in VARIANTS if "fused" in args.parts else ():
            sizes = builds.fused_tiled_sizes(tile, stages, exact)
            build = nvcc.Build(builds.FUSED_TILED_BUILD.source, sizes, f"t{tile}s{stages}{'' if exact else 'fma'}")
            shared = launchers.fused_tiled_shared_bytes(sizes)
            name = f"tile {tile:>2}, {stages} stages, {'exact conv' if exact else 'FMA conv'}"
            try:
                with device_errors(f"cannot load {build.variant}"):
                    launcher = launchers.fused_tiled(context.setup, build)
                    registers = context.setup.module(build).get_function("fused_tiled").num_regs
                timing = time_kernels(context, launcher, resident, args.repeats)
            except CnnlabError as error:
                print(f"{name}: not run: {error}")
                continue
            blocks = context.setup.blocks_per_sm(tile * 20, shared)
            report(name, timing, bound, want, f" {registers} registers, {shared:,} B shared, {blocks} blocks/SM;")
        if "two" in args.parts:
            stage_times(context, resident, bound, args.repeats)
            for name, make in (
                ("rung 6 warp_shuffle (activations to HBM)", lambda: ladder.launcher("warp_shuffle", context.setup, LaunchConfig())),
                ("rung 7 coarsened (activations to HBM)", lambda: ladder.launcher("coarsened", context.setup, LaunchConfig())),
                *((f"rung 12, {passes or 'a wave'} a pass", partial(launchers.TwoKernels, context.setup, passes)) for passes in PASSES),
            ):
                try:
                    with device_errors(f"cannot load {name}"):
                        launcher = make()
                    report(name, time_kernels(context, launcher, resident, args.repeats), bound, want)
                except CnnlabError as error:
                    print(f"{name}: not run: {error}")
        context.free(resident)
    if "two" in args.parts:  # the resident row's schedule: three chunk streams of a third of the images each, compute_resident
        for kernel in ("warp_shuffle", "coarsened", "two_kernels"):
            with CudaContext(cnn, args.images, LaunchConfig(kernel=kernel)) as context:
                resident = context.upload(ImageBatch(images))
                rate = median_rate(args.images, lambda context=context, resident=resident: context.compute_resident(resident), args.repeats)
                print(f"resident row, {kernel:<14} {rate:>12,.0f} images/s {rate / bound:6.1%} of D2D (chunk {context.chunk_images})")
                context.free(resident)
    return 0


if __name__ == "__main__":
    sys.exit(main())
