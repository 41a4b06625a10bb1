"""The ladder's builds: the sizes each rung's kernels are built with, defined here once and passed to nvcc as -D flags
(each source #errors without them, as kernel.cu does without cnnlab/constants.py's), and every fatbin the build step
makes of them. Without numpy, as the build step is (setup.py, build.py); the launchers (launchers.py) size their
launches from these.
"""

from __future__ import annotations

from cnnlab.constants import FILTER_DIM, INPUT_DIM
from cnnlab.cuda.nvcc import Build

LAB_CONV_BLOCKS, LAB_THREADS, LAB_SEGMENTS = 32, 1024, 4  # rung 1: the report's 32 x 1024 conv launch
SWEEP_BANDS = (2, 4, 8, 12)  # rung 5: conv2d_relu's bands per block (x 20 threads; 12 fills 48 KB of shared memory)
COARSE_IMAGES, COARSE_THREADS = 4, 256  # rung 7 (and rung 12's dense kernel)
# Rung 9: images per tile and shared-memory buffers taking turns. 8 x 2 leaves space for two blocks a
# multiprocessor (108,800 bytes each), whose barriers then fall at different times; on the H100 it beat
# 16 x 2 (one block of 186,112 bytes) and deeper pipelines of one block (tools/ladder_sweep.py; docs/ladder.md, rung 9).
FT_TILE_IMAGES, FT_STAGES = 8, 2
MMA_IMAGES = 32  # rung 10's dense_mma: images per block
BAND_DOUBLES = FILTER_DIM * INPUT_DIM


def conflict_free_stride(tile_images: int) -> int:
    """fused_tiled's image stride in shared memory, in doubles: the first even stride (16-byte
    copies) from a band's 500 at which each half-warp's 16 tap loads land in 16 distinct pairs of
    the 32 four-byte banks (a warp holds 32 / tile_images columns of every image of the tile)."""
    columns = 32 // tile_images
    for stride in range(BAND_DOUBLES, BAND_DOUBLES + 32, 2):
        halves = ([(lane // columns) * stride + lane % columns * FILTER_DIM for lane in range(half, half + 16)] for half in (0, 16))
        if all(len({offset % 16 for offset in offsets}) == 16 for offsets in halves):
            return stride
    return BAND_DOUBLES  # no such stride: two-way conflicts


def fused_tiled_sizes(
    tile_images: int = FT_TILE_IMAGES, stages: int = FT_STAGES, exact_conv: bool = True, conv_only: bool = False
) -> dict[str, int]:
    return {
        "FT_TILE_IMAGES": tile_images,
        "FT_STAGES": stages,
        "FT_IMAGE_STRIDE": conflict_free_stride(tile_images),
        "FT_EXACT_CONV": int(exact_conv),
        "FT_CONV_ONLY": int(conv_only),
    }


KERNEL_BUILD = Build("kernel.cu")
TWO_KERNELS_BUILD = Build(  # rung 12: rung 9's conv alone (conv_tiled) and rung 7's dense kernel in one module
    "ladder/12_two_kernels.cu", {**fused_tiled_sizes(conv_only=True), "COARSE_IMAGES": COARSE_IMAGES, "COARSE_MAX_THREADS": COARSE_THREADS}
)
LAB_BUILD = Build("ladder/01_lab.cu", {"LAB_CONV_BLOCKS": LAB_CONV_BLOCKS, "LAB_THREADS": LAB_THREADS, "LAB_SEGMENTS": LAB_SEGMENTS})
GLOBAL_BUILD = Build("ladder/02_batched_global.cu")
CONSTANT_BUILD = Build("ladder/03_constant_filters.cu")
TREE_BUILD = Build("ladder/04_shared_tiles.cu")
COARSE_BUILD = Build("ladder/07_coarsened.cu", {"COARSE_IMAGES": COARSE_IMAGES, "COARSE_MAX_THREADS": COARSE_THREADS})
FUSED_BUILD = Build("ladder/08_fused.cu")
FUSED_TILED_BUILD = Build("ladder/09_fused_tiled.cu", fused_tiled_sizes())
MMA_BUILD = Build("ladder/10_im2col_mma.cu", {"MMA_IMAGES": MMA_IMAGES})
FUSED_TILED_FMA_BUILD = Build("ladder/11_fused_tiled_fma.cu", fused_tiled_sizes(exact_conv=False))


def sweep_build(bands: int) -> Build:
    """Rung 5's source built with `bands` bands per conv2d_relu block."""
    return Build("ladder/05_block_sweep.cu", {"CONV_BANDS_PER_BLOCK": bands}, f"bands{bands}")


def every_build() -> list[Build]:
    """Every ladder fatbin the build step makes, rung by rung (rung 6 is kernel.cu, built as a kernel source)."""
    return [
        LAB_BUILD, GLOBAL_BUILD, CONSTANT_BUILD, TREE_BUILD, *map(sweep_build, SWEEP_BANDS), COARSE_BUILD, FUSED_BUILD,
        FUSED_TILED_BUILD, MMA_BUILD, FUSED_TILED_FMA_BUILD, TWO_KERNELS_BUILD,
    ]
