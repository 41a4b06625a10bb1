#!/usr/bin/env python3
"""Tune the ladder's top rungs (fused_tiled and fused_tiled_fma, kernel/ladder/09_fused_tiled.cu) on a
GPU: built at several tile sizes and stage counts, with the bit-exact conv (rung 9) and with FMAs in
the conv (FT_EXACT_CONV=0, rung 11), each timed on the same resident images with CUDA events against
the device-to-device copy of those images, its outputs checked against the CPU's under the lab's rule.

    python tools/ladder_sweep.py [--images N] [--repeats R] [--seed S]

Prints one line a variant: images/s (median, slowest..fastest), share of the bound, registers a
thread and shared memory a block, blocks per multiprocessor, and the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from cnnlab.bench.gpu import device_copy_rate, time_kernels  # noqa: E402
from cnnlab.compare import rule_verdict  # noqa: E402
from cnnlab.cpu.backend import CpuBackend  # noqa: E402
from cnnlab.cuda import launchers  # noqa: E402
from cnnlab.cuda.context import CudaContext  # noqa: E402
from cnnlab.cuda.driver import device_errors  # noqa: E402
from cnnlab.cuda.ladder import LaunchConfig  # noqa: E402
from cnnlab.errors import CnnlabError  # noqa: E402
from cnnlab.generate import random_values  # noqa: E402
from cnnlab.network import IMAGE_BYTES, Cnn, ImageBatch  # noqa: E402

# (images per tile, stages, exact conv): 8 x 2 is the rungs' shape (two blocks a multiprocessor); 16 x 2
# fits one block, 8 x 3 and 8 x 4 one block with a deeper pipeline.
VARIANTS = ((8, 2, True), (16, 2, True), (8, 3, True), (8, 2, False), (16, 2, False), (8, 3, False))
CHECK_IMAGES = 256


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
        for tile, stages, exact in VARIANTS:
            sizes = launchers.fused_tiled_sizes(tile, stages, exact)
            build = launchers.Build(launchers.FUSED_TILED_BUILD.source, sizes, f"t{tile}s{stages}{'' if exact else 'fma'}")
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
            rates = sorted(len(timing.outputs) / seconds for seconds in timing.seconds)
            check = rule_verdict(timing.outputs.values[:CHECK_IMAGES], want)
            print(
                f"{name:<36} {timing.images_per_second:>12,.0f} images/s ({rates[0]:,.0f}..{rates[-1]:,.0f}) "
                f"{timing.images_per_second / bound:6.1%} of D2D; {registers} registers, {shared:,} B shared, "
                f"{context.setup.blocks_per_sm(tile * 20, shared)} blocks/SM; {check}"
            )
        context.free(resident)
    return 0


if __name__ == "__main__":
    sys.exit(main())
