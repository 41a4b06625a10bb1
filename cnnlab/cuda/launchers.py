"""The optimization ladder's launchers: each rung's launch sizes and one small launcher per rung, all behind one
interface (Launcher), so that a chunk stream runs any rung as it runs the default. What they need of the context is a
DeviceSetup (device_setup.py); the sizes the rungs are built with, and their builds, are builds.py's.

cnnlab/cuda/ladder.py lists the rungs, with what each teaches and how exact it is; the kernels are
in kernel/ladder/ (rung 6 is kernel/kernel.cu, the default design).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from cnnlab.constants import CONV_BANDS_PER_BLOCK, CONV_OUT_DIM, IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM
from cnnlab.cuda.builds import (
    COARSE_IMAGES,
    COARSE_THREADS,
    CONSTANT_BUILD,
    FUSED_BUILD,
    FUSED_TILED_BUILD,
    GLOBAL_BUILD,
    KERNEL_BUILD,
    LAB_BUILD,
    LAB_CONV_BLOCKS,
    LAB_SEGMENTS,
    LAB_THREADS,
    MMA_BUILD,
    MMA_IMAGES,
    TREE_BUILD,
    TWO_KERNELS_BUILD,
    sweep_build,
)
from cnnlab.cuda.kernels import BLOCKS_PER_SM, Conv2dRelu, FlattenedToDense
from cnnlab.cuda.nvcc import Build

if TYPE_CHECKING:
    from cnnlab.cuda.device_setup import DeviceSetup

# The rungs' launch sizes; those nvcc builds them with are builds.py's.
GLOBAL_THREADS = 256  # rungs 2 and 3: threads per block, a thread per output
TREE_THREADS, TREE_SEGMENTS = 256, 4  # rung 4's dense_tree
SWEEP_THREADS = (64, 128, 256, 512, 1024)  # rung 5: dense_tree's threads per block
BLOCK_SWEEP_BEST = (12, 128)  # rung 5's (bands, threads) for `cnnlab cuda`: the fastest pair of the H100 sweep (BENCHMARKS.md)
COARSE_SEGMENTS = 4  # rung 7 (and rung 12's dense kernel)
FUSED_THREADS = 256  # rung 8
MMA_THREADS = 256  # rung 10's dense_mma: 8 warps
MAP_SIZE = CONV_OUT_DIM * CONV_OUT_DIM  # patches per image


def fused_tiled_shared_bytes(sizes: Mapping[str, int]) -> int:
    """The stages (each: the tile's bands and, fused, the band's 2,000 weights) and, fused, the column sums."""
    fused = not sizes["FT_CONV_ONLY"]
    stage = sizes["FT_TILE_IMAGES"] * sizes["FT_IMAGE_STRIDE"] + fused * OUT_LAYER_SIZE * OUT_NEURON_DIM // CONV_OUT_DIM
    return 8 * (sizes["FT_STAGES"] * stage + fused * OUT_LAYER_SIZE * sizes["FT_TILE_IMAGES"] * CONV_OUT_DIM)


class Launcher(Protocol):
    """A rung's launches for one chunk: images at device address `images`, partials[segments][stride][10] out."""

    segments: int
    needs_conv_out: bool  # whether the chunk stream must hold 4,000 activations an image, between the rung's two kernels

    @property
    def pass_images(self) -> int | None:
        """The images whose activations it holds at once, a pass of the chunk at a time; None: all."""
        ...

    checks_finite: bool  # whether it sets the setup's nonfinite flag where an image value is a NaN or an infinity

    def __call__(self, stream: Any, images: int, conv_out: Any, partials: Any, count: int, stride: int) -> None: ...


def activation_images(launcher: Launcher, chunk: int) -> int:
    """The images whose activations a buffer must hold for `launcher` over chunks of `chunk` images (0: none)."""
    return min(chunk, launcher.pass_images or chunk) if launcher.needs_conv_out else 0


def _grid(count: int, limit: int) -> int:
    return max(1, min(count, limit))


class Lab:
    """Rung 1: per image, conv_lab on 32 x 1024 threads, then dense_lab's (segment, neuron) blocks."""

    segments, needs_conv_out, checks_finite = LAB_SEGMENTS, True, False
    pass_images = None

    def __init__(self, setup: DeviceSetup) -> None:
        self._conv = setup.function(LAB_BUILD, "conv_lab", "PPP")
        self._dense = setup.function(LAB_BUILD, "dense_lab", "PPPi")
        self._filters, self._weights = setup.global_filters(), setup.weights

    def __call__(self, stream: Any, images: int, conv_out: Any, partials: Any, count: int, stride: int) -> None:
        block = (LAB_THREADS, 1, 1)
        for index in range(count):  # two launches an image: the lab's host loop
            self._conv.prepared_async_call((LAB_CONV_BLOCKS, 1), block, stream, images + index * IMAGE_BYTES, self._filters, conv_out)
            row = int(partials) + index * OUT_LAYER_SIZE * 8
            self._dense.prepared_async_call((LAB_SEGMENTS, OUT_LAYER_SIZE), block, stream, conv_out, self._weights, row, np.int32(stride))


class BatchedGlobal:
    """Rungs 2 and 3: a thread per conv output (filters from global or constant memory), a thread per network output."""

    segments, needs_conv_out, checks_finite = 1, True, False
    pass_images = None

    def __init__(self, setup: DeviceSetup, constant_filters: bool) -> None:
        build = CONSTANT_BUILD if constant_filters else GLOBAL_BUILD
        self._filters: tuple[Any, ...]  # the filters' device memory, where the kernel reads them there
        if constant_filters:
            self._conv, self._filters = setup.function(build, "conv_constant", "PPi"), ()
        else:
            self._conv, self._filters = setup.function(build, "conv_global", "PPPi"), (setup.global_filters(),)
        self._dense = setup.function(build, "dense_global", "PPPi")
        self._weights = setup.weights

    def __call__(self, stream: Any, images: int, conv_out: Any, partials: Any, count: int, stride: int) -> None:
        block, n = (GLOBAL_THREADS, 1, 1), np.int32(count)
        conv_grid, dense_grid = (math.ceil(count * size / GLOBAL_THREADS) for size in (OUT_NEURON_DIM, OUT_LAYER_SIZE))
        self._conv.prepared_async_call((conv_grid, 1), block, stream, images, *self._filters, conv_out, n)
        self._dense.prepared_async_call((dense_grid, 1), block, stream, conv_out, self._weights, partials, n)


class ConvThenDense:
    """Rungs 4 to 7: conv2d_relu, then a dense kernel of signature (conv_out, weights, partials, count, stride)
    on a grid of (image blocks, segments); `images_per_block` images share one block's pass over the weights."""

    needs_conv_out = checks_finite = True
    pass_images = None

    def __init__(
        self, setup: DeviceSetup, conv_build: Build, bands: int, dense_build: Build, dense: str, threads: int, segments: int,
        shared: int = 0, images_per_block: int = 1,
    ) -> None:
        self._conv = Conv2dRelu(setup.module(conv_build), setup.sm_count, bands=bands)
        self._dense = setup.function(dense_build, dense, "PPPii", shared)
        self._weights, self._threads, self._shared, self.segments = setup.weights, threads, shared, segments
        self._nonfinite = setup.nonfinite
        self._images_per_block = images_per_block
        self._blocks = max(1, setup.sm_count * BLOCKS_PER_SM // segments)

    def __call__(self, stream: Any, images: int, conv_out: Any, partials: Any, count: int, stride: int) -> None:
        self._conv(stream, images, conv_out, count, self._nonfinite)
        grid = (_grid(math.ceil(count / self._images_per_block), self._blocks), self.segments)
        args = (conv_out, self._weights, partials, np.int32(count), np.int32(stride))
        self._dense.prepared_async_call(grid, (self._threads, 1, 1), stream, *args, shared_size=self._shared)


def shared_tiles(
    setup: DeviceSetup, threads: int = TREE_THREADS, bands: int = CONV_BANDS_PER_BLOCK, conv: Build = KERNEL_BUILD,
    dense: Build = TREE_BUILD,
) -> Launcher:
    """Rung 4 (and rung 5 at other block sizes): conv2d_relu, then dense_tree's shared-memory tree."""
    return ConvThenDense(setup, conv, bands, dense, "dense_tree", threads, TREE_SEGMENTS, shared=threads * OUT_LAYER_SIZE * 8)


class TwoKernels:
    """Rung 12: conv_tiled (rung 9's bit-exact conv alone, tiles of images streamed by cp.async) writing the activations,
    then dense_coarsened (rung 7's) reading them, a pass of the chunk at a time: a pass fills the device's conv blocks
    with tiles once (`pass_images` sets another size, for the sweep), so the activations buffer holds a pass, not a
    chunk."""

    needs_conv_out, checks_finite, segments = True, False, COARSE_SEGMENTS

    def __init__(self, setup: DeviceSetup, pass_images: int | None = None, build: Build = TWO_KERNELS_BUILD) -> None:
        tile, shared = build.sizes["FT_TILE_IMAGES"], fused_tiled_shared_bytes(build.sizes)
        self._conv = setup.function(build, "conv_tiled", "PPi", shared)
        self._dense = setup.function(build, "dense_coarsened", "PPPii")
        self._tile, self._conv_threads, self._shared, self._weights = tile, tile * CONV_OUT_DIM, shared, setup.weights
        self._conv_blocks = setup.sm_count * setup.blocks_per_sm(tile * CONV_OUT_DIM, shared)
        self._dense_blocks = max(1, setup.sm_count * BLOCKS_PER_SM // COARSE_SEGMENTS)
        self.pass_images = pass_images or self._conv_blocks * tile

    def __call__(self, stream: Any, images: int, conv_out: Any, partials: Any, count: int, stride: int) -> None:
        for first in range(0, count, self.pass_images):
            n = min(self.pass_images, count - first)
            conv_grid = (_grid(math.ceil(n / self._tile), self._conv_blocks), 1)
            self._conv.prepared_async_call(
                conv_grid, (self._conv_threads, 1, 1), stream, images + first * IMAGE_BYTES, conv_out, np.int32(n), shared_size=self._shared
            )
            rows = int(partials) + first * OUT_LAYER_SIZE * 8  # this pass's images' rows of every segment
            dense_grid = (_grid(math.ceil(n / COARSE_IMAGES), self._dense_blocks), COARSE_SEGMENTS)
            args = (conv_out, self._weights, rows, np.int32(n), np.int32(stride))
            self._dense.prepared_async_call(dense_grid, (COARSE_THREADS, 1, 1), stream, *args)


def block_sweep(setup: DeviceSetup, bands: int = BLOCK_SWEEP_BEST[0], threads: int = BLOCK_SWEEP_BEST[1]) -> Launcher:
    """Rung 5: rung 4's kernels at (bands, threads), both from the source built for that conv size."""
    build = sweep_build(bands)
    return shared_tiles(setup, threads, bands, build, build)


class WarpShuffle:
    """Rung 6, the default: the design card's conv2d_relu + flattened_to_dense, at the sizes of a LaunchConfig."""

    needs_conv_out = checks_finite = True
    pass_images = None

    def __init__(
        self, setup: DeviceSetup, segments: int, dense_threads: int, conv_blocks: int | None = None, dense_blocks: int | None = None
    ) -> None:
        module = setup.module(KERNEL_BUILD)
        self._conv = Conv2dRelu(module, setup.sm_count, conv_blocks)
        self.segments = segments
        self._dense = FlattenedToDense(module, setup.sm_count, segments, dense_threads, dense_blocks)
        self._weights, self._nonfinite = setup.weights, setup.nonfinite

    def __call__(self, stream: Any, images: int, conv_out: Any, partials: Any, count: int, stride: int) -> None:
        self._conv(stream, images, conv_out, count, self._nonfinite)
        self._dense(stream, conv_out, self._weights, partials, count, stride)


class OneKernel:
    """Rungs 8, 9 and 11: one fused kernel (images, weights, partials, count) on a persistent grid that fills
    the device, each block `images_per_block` images at a time; segments = 1."""

    segments, needs_conv_out, checks_finite = 1, False, False
    pass_images = None

    def __init__(self, setup: DeviceSetup, build: Build, name: str, threads: int, shared: int, images_per_block: int) -> None:
        self._function = setup.function(build, name, "PPPi", shared)
        self._weights, self._threads, self._shared, self._images_per_block = setup.weights, threads, shared, images_per_block
        self._blocks = setup.sm_count * setup.blocks_per_sm(threads, shared)

    def __call__(self, stream: Any, images: int, conv_out: Any, partials: Any, count: int, stride: int) -> None:
        grid = (_grid(math.ceil(count / self._images_per_block), self._blocks), 1)
        self._function.prepared_async_call(
            grid, (self._threads, 1, 1), stream, images, self._weights, partials, np.int32(count), shared_size=self._shared
        )


def fused(setup: DeviceSetup) -> Launcher:
    """Rung 8: a block per image, the image and its activations in shared memory."""
    shared = 8 * (INPUT_DIM * INPUT_DIM + OUT_NEURON_DIM + FUSED_THREADS // 32 * OUT_LAYER_SIZE)
    return OneKernel(setup, FUSED_BUILD, "fused", FUSED_THREADS, shared, 1)


def fused_tiled(setup: DeviceSetup, build: Build = FUSED_TILED_BUILD) -> Launcher:
    """Rung 9 (and rung 11, `build` its FMA conv): tiles of images, their bands and the weights streamed through shared memory."""
    tile = build.sizes["FT_TILE_IMAGES"]
    return OneKernel(setup, build, "fused_tiled", tile * CONV_OUT_DIM, fused_tiled_shared_bytes(build.sizes), tile)


class Im2colMma:
    """Rung 10: conv_mma (a warp per 8 patches), then dense_mma (a block per MMA_IMAGES images), on the FP64 tensor cores."""

    segments, needs_conv_out, checks_finite = 1, True, False
    pass_images = None

    def __init__(self, setup: DeviceSetup) -> None:
        self._conv = setup.function(MMA_BUILD, "conv_mma", "PPi")
        self._dense = setup.function(MMA_BUILD, "dense_mma", "PPPi")
        self._weights, self._blocks = setup.weights, setup.sm_count * BLOCKS_PER_SM

    def __call__(self, stream: Any, images: int, conv_out: Any, partials: Any, count: int, stride: int) -> None:
        block, n = (MMA_THREADS, 1, 1), np.int32(count)
        conv_blocks = _grid(math.ceil(count * MAP_SIZE / 8 / (MMA_THREADS // 32)), self._blocks)  # a warp per 8 patches
        self._conv.prepared_async_call((conv_blocks, 1), block, stream, images, conv_out, n)
        dense_blocks = _grid(math.ceil(count / MMA_IMAGES), self._blocks)
        self._dense.prepared_async_call((dense_blocks, 1), block, stream, conv_out, self._weights, partials, n)
