"""One launcher per kernel of kernel/kernel.cu, and the launch sizes it picks.

The sizes the kernels are built with are cnnlab/constants.py's (nvcc gets them as -D flags), and
tests/test_build.py reads the launch bounds back out of the PTX. Each launcher is what llm.c's
launchers are: the grid from the sizes, the launch, and the check (PyCUDA raises the driver's
launch error at once; the caller turns it into a DeviceError).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cnnlab.constants import CONV_BANDS_PER_BLOCK, CONV_OUT_DIM, INPUT_DIM, OUT_LAYER_SIZE

CONV_THREADS = CONV_BANDS_PER_BLOCK * CONV_OUT_DIM  # conv2d_relu's thread-block size: a thread per output column
BLOCKS_PER_SM = 8  # grid-stride kernels: enough resident thread blocks to hide memory latency


class Conv2dRelu:
    """conv2d_relu(images, conv_out, count, nonfinite): convolution and ReLU, a thread per output column of a
    band; sets the int at `nonfinite` to 1 where an image holds a NaN or an infinity.

    `bands`: the CONV_BANDS_PER_BLOCK the module was built with (the ladder's block sweep builds others)."""

    def __init__(self, module: Any, sm_count: int, blocks: int | None = None, bands: int = CONV_BANDS_PER_BLOCK) -> None:
        self._function = module.get_function("conv2d_relu")
        self._function.prepare("PPiP")
        self._max_blocks = blocks or sm_count * BLOCKS_PER_SM
        self._bands = bands

    def __call__(self, stream: Any, images: Any, conv_out: Any, count: int, nonfinite: Any) -> None:
        grid = (min(math.ceil(count * CONV_OUT_DIM / self._bands), self._max_blocks), 1)
        self._function.prepared_async_call(
            grid, (self._bands * CONV_OUT_DIM, 1, 1), stream, images, conv_out, np.int32(count), nonfinite
        )


class FlattenedToDense:
    """flattened_to_dense(conv_out, weights, partials, count, stride): a partial dot product per segment."""

    def __init__(self, module: Any, sm_count: int, segments: int, threads: int, blocks: int | None = None) -> None:
        self._function = module.get_function("flattened_to_dense")
        self._function.prepare("PPPii")
        self._segments, self._threads = segments, threads
        self._max_blocks = blocks or max(1, sm_count * BLOCKS_PER_SM // segments)

    def __call__(self, stream: Any, conv_out: Any, weights: Any, partials: Any, count: int, stride: int) -> None:
        grid = (min(count, self._max_blocks), self._segments)
        self._function.prepared_async_call(
            grid, (self._threads, 1, 1), stream, conv_out, weights, partials, np.int32(count), np.int32(stride)
        )


class SumSegments:
    """sum_segments(partials, outputs, count, stride, segments): each output the in-order sum of its
    segments' partials, written to device memory (a caller's array): the host's numpy sum, bit for bit."""

    THREADS = 256

    def __init__(self, module: Any, sm_count: int, segments: int) -> None:
        self._function = module.get_function("sum_segments")
        self._function.prepare("PPiii")
        self._segments = segments
        self._max_blocks = sm_count * BLOCKS_PER_SM

    def __call__(self, stream: Any, partials: Any, outputs: int, count: int, stride: int) -> None:
        grid = (min(math.ceil(count * OUT_LAYER_SIZE / self.THREADS), self._max_blocks), 1)
        self._function.prepared_async_call(
            grid, (self.THREADS, 1, 1), stream, partials, outputs, np.int32(count), np.int32(stride), np.int32(self._segments)
        )


class FindNonFinite:
    """find_nonfinite(values, count, nonfinite): conv2d_relu's finite check alone, for the rungs that make none."""

    THREADS = 256

    def __init__(self, module: Any, sm_count: int) -> None:
        self._function = module.get_function("find_nonfinite")
        self._function.prepare("PqP")
        self._max_blocks = sm_count * BLOCKS_PER_SM

    def __call__(self, stream: Any, images: Any, count: int, nonfinite: Any) -> None:
        values = count * INPUT_DIM * INPUT_DIM
        grid = (min(math.ceil(values / 2 / self.THREADS), self._max_blocks), 1)
        self._function.prepared_async_call(grid, (self.THREADS, 1, 1), stream, images, np.int64(values), nonfinite)
