"""The optimization ladder: the network's kernels from the lab's scheme to the hardware's limit, one named
rung per technique, each runnable end to end (`cnnlab cuda --kernel NAME`), validated and measured
(`cnnlab bench --rows kernels`).

Each rung is a kernel source in kernel/ladder/ (rung 6 is kernel/kernel.cu, the default design)
that opens with what it changes from the rung below, how its threads map to the data and its
napkin math; cnnlab/cuda/launchers.py has its sizes, its builds and one small launcher. Every
launcher has the same interface: it writes partials[segments][stride][10] that the host adds up
(or sum_segments on the device, for the API's out=), exactly as the default design does, so
CudaContext runs any rung through the same chunk streams (`LaunchConfig.kernel`). Here: the rungs, what each
teaches, how exact it is, its traffic model, and the launch configuration that names one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cnnlab.constants import CONV_BANDS_PER_BLOCK, DENSE_MAX_THREADS, IMAGE_BYTES, OUT_LAYER_SIZE, OUT_NEURON_DIM
from cnnlab.cuda.builds import (
    COARSE_BUILD,
    COARSE_IMAGES,
    COARSE_THREADS,
    CONSTANT_BUILD,
    FUSED_BUILD,
    FUSED_TILED_BUILD,
    FUSED_TILED_FMA_BUILD,
    GLOBAL_BUILD,
    KERNEL_BUILD,
    LAB_BUILD,
    LAB_SEGMENTS,
    MMA_BUILD,
    TREE_BUILD,
    TWO_KERNELS_BUILD,
)
from cnnlab.cuda.device_setup import DeviceSetup
from cnnlab.cuda.launchers import (
    COARSE_SEGMENTS,
    TREE_SEGMENTS,
    BatchedGlobal,
    ConvThenDense,
    Im2colMma,
    Lab,
    Launcher,
    TwoKernels,
    WarpShuffle,
    block_sweep,
    fused,
    fused_tiled,
    shared_tiles,
)
from cnnlab.errors import DeviceError

# The default: the fastest rung of the design card's shape (a conv kernel, then a dense kernel, the partial sums added on
# the host): rung 12 (BENCHMARKS.md). kernel/kernel.cu's conv2d_relu and flattened_to_dense, the card's own, are rung 6.
DEFAULT_KERNEL = "two_kernels"

# Device memory each design must move per image: the image read, the activations written and read
# back where conv and dense are two kernels, the partials written (the weights stay in L2).
ROUND_TRIP_BYTES = 2 * OUT_NEURON_DIM * 8


def _traffic(segments: int, round_trip: bool = True) -> int:
    return IMAGE_BYTES + (ROUND_TRIP_BYTES if round_trip else 0) + segments * OUT_LAYER_SIZE * 8



# Exactness classes, checked by tests/test_ladder.py.
BIT_EXACT = "bit-exact"  # every output the CPU's, bit for bit
CONV_EXACT = "conv bit-exact"  # the ReLU outputs the CPU's; the dense sums in another order, within the lab's rule
WITHIN_RULE = "within the rule"  # neither layer in the CPU's order; outputs within the lab's rule


@dataclass(frozen=True)
class Rung:
    """One rung: its name for --kernel, where its code is, what it teaches, how exact it is, its traffic model, its launcher."""

    number: int
    name: str
    source: str  # under kernel/
    teaches: str
    exactness: str
    device_bytes: int  # device memory moved per image by its design
    make: Callable[[DeviceSetup, LaunchConfig], Launcher]
    min_capability: tuple[int, int] = (7, 5)
    max_bench_images: int | None = None  # the bench's image count, where the rung is too slow for the default

    @property
    def conv_exact(self) -> bool:
        return self.exactness in (BIT_EXACT, CONV_EXACT)


RUNGS = (
    Rung(1, "lab", LAB_BUILD.source, "the lab's scheme: one image per launch, a shared-memory tree, host sum", CONV_EXACT,
         _traffic(LAB_SEGMENTS), lambda setup, config: Lab(setup), max_bench_images=2000),
    Rung(2, "batched_global", GLOBAL_BUILD.source, "a batch per launch, a thread per output, all from global memory", BIT_EXACT,
         _traffic(1), lambda setup, config: BatchedGlobal(setup, constant_filters=False), max_bench_images=16384),
    Rung(3, "constant_filters", CONSTANT_BUILD.source, "the filters in constant memory", BIT_EXACT,
         _traffic(1), lambda setup, config: BatchedGlobal(setup, constant_filters=True), max_bench_images=16384),
    Rung(4, "shared_tiles", TREE_BUILD.source, "coalesced shared-memory tiles (conv), a reduction tree (dense)", CONV_EXACT,
         _traffic(TREE_SEGMENTS), lambda setup, config: shared_tiles(setup)),
    Rung(5, "block_sweep", "ladder/05_block_sweep.cu", "rung 4 at the block sizes a sweep finds fastest", CONV_EXACT,
         _traffic(TREE_SEGMENTS), lambda setup, config: block_sweep(setup)),
    Rung(6, "warp_shuffle", KERNEL_BUILD.source, "warp shuffles for the reduction, 16-byte loads (the card's own kernels)", CONV_EXACT,
         _traffic(4), lambda setup, config: WarpShuffle(
             setup, config.segments, config.dense_threads, config.conv_blocks, config.dense_blocks)),
    Rung(7, "coarsened", COARSE_BUILD.source, "thread coarsening: each weight load serves 4 images", CONV_EXACT,
         _traffic(COARSE_SEGMENTS), lambda setup, config: ConvThenDense(
             setup, KERNEL_BUILD, CONV_BANDS_PER_BLOCK, COARSE_BUILD, "dense_coarsened", COARSE_THREADS, COARSE_SEGMENTS,
             images_per_block=COARSE_IMAGES)),
    Rung(8, "fused", FUSED_BUILD.source, "conv and dense fused, the activations in shared memory", CONV_EXACT,
         _traffic(1, round_trip=False), lambda setup, config: fused(setup)),
    Rung(9, "fused_tiled", FUSED_TILED_BUILD.source, "fused and tiled over images, weights and images streamed by cp.async",
         CONV_EXACT, _traffic(1, round_trip=False), lambda setup, config: fused_tiled(setup)),
    Rung(10, "im2col_mma", MMA_BUILD.source, "im2col + GEMM on the FP64 tensor cores (mma.sync m8n8k4)", WITHIN_RULE,
         _traffic(1), lambda setup, config: Im2colMma(setup), min_capability=(8, 0)),
    Rung(11, "fused_tiled_fma", FUSED_TILED_FMA_BUILD.source, "rung 9 with FMAs in the conv: the price of bit-exactness",
         WITHIN_RULE, _traffic(1, round_trip=False), lambda setup, config: fused_tiled(setup, FUSED_TILED_FMA_BUILD)),
    Rung(12, "two_kernels", TWO_KERNELS_BUILD.source, "the card's two kernels at their best: rung 9's conv alone, rung 7's dense",
         CONV_EXACT, _traffic(COARSE_SEGMENTS), lambda setup, config: TwoKernels(setup)),
)
BY_NAME = {rung.name: rung for rung in RUNGS}


@dataclass(frozen=True)
class LaunchConfig:
    """How the work is dealt out: the rung of the ladder that runs, chunk streams, images per chunk, and for
    the default rung its segments and thread-block counts."""

    kernel: str = DEFAULT_KERNEL
    streams: int = 3
    chunk_images: int | None = None  # None: the batch dealt evenly over the streams, so one batch already overlaps
    segments: int = 4  # partial sums per output: flattened_to_dense's gridDim.y
    dense_threads: int = 256
    conv_blocks: int | None = None  # None: sized to the device
    dense_blocks: int | None = None
    stream_bytes_cap: int | None = None  # the most device memory the chunk streams may take; None: a share of what is free

    def __post_init__(self) -> None:
        if self.kernel not in BY_NAME:
            raise ValueError(f"unknown kernel {self.kernel!r}; choose from {', '.join(BY_NAME)}")
        if self.streams < 1 or (self.chunk_images is not None and self.chunk_images < 1):
            raise ValueError(f"invalid launch configuration {self}")
        if not 1 <= self.segments <= OUT_NEURON_DIM // 2:
            raise ValueError(f"segments must be between 1 and {OUT_NEURON_DIM // 2}, not {self.segments}")
        if self.dense_threads % 32 or not 32 <= self.dense_threads <= DENSE_MAX_THREADS:
            raise ValueError(f"dense_threads must be a multiple of 32 up to {DENSE_MAX_THREADS}")


def launcher(name: str, setup: DeviceSetup, config: LaunchConfig) -> Launcher:
    """The launcher of rung `name`, or a one-line DeviceError where this GPU cannot run it."""
    rung = BY_NAME[name]
    if setup.capability < rung.min_capability:
        need = ".".join(map(str, rung.min_capability))
        raise DeviceError(f"kernel {name} needs compute capability {need} or newer; this GPU has {'.'.join(map(str, setup.capability))}")
    return rung.make(setup, config)
