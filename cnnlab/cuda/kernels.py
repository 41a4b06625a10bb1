"""The CNN kernels' sizes, defined here once, and one launcher per kernel.

The build step hands every size to nvcc as a -D flag (kernel.cu has no defaults, so the two sides
cannot disagree), and tests/test_build.py reads the launch bounds back out of the PTX. Each
launcher is what llm.c's launchers are: the grid from the sizes, the launch, and the check (PyCUDA
raises the driver's launch error at once; the caller turns it into a DeviceError).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cnnlab.network import CONV_OUT_DIM, INPUT_DIM, OUT_LAYER_SIZE, network_sizes

CONV_BANDS_PER_BLOCK = 8  # output rows (bands of 5 input rows) one conv2d_relu thread block handles at a time
CONV_THREADS = CONV_BANDS_PER_BLOCK * CONV_OUT_DIM  # conv2d_relu's thread-block size: a thread per output column
DENSE_MAX_THREADS = 1024  # flattened_to_dense's largest thread block (its shared memory is sized for it)
BLOCKS_PER_SM = 8  # grid-stride kernels: enough resident thread blocks to hide memory latency


def kernel_sizes() -> dict[str, int]:
    """Every size kernel.cu uses, by the name nvcc gets it as."""
    return {
        **network_sizes(),
        "CONV_BANDS_PER_BLOCK": CONV_BANDS_PER_BLOCK,
        "DENSE_MAX_THREADS": DENSE_MAX_THREADS,
    }


def nvcc_defines(sizes: dict[str, int] | None = None) -> list[str]:
    """kernel_sizes() as nvcc -D flags, with `sizes` added or put in their place (the ladder's builds)."""
    return [f"-D{name}={value}" for name, value in {**kernel_sizes(), **(sizes or {})}.items()]


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
