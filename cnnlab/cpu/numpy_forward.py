"""The network in vectorised numpy, bit for bit what the lab's cpu.rs computes: the readable reference of the
native forward (cnnlab.cpu._forward), and the CPU backend's forward where no compiler built that.

cpu.rs sums each dot product left to right. numpy's sum over a leading (non-contiguous) axis
adds whole rows in order, which is that same left fold for every output at once; a sum over the
contiguous axis, or a matrix product, would round differently. So both layers first lay their
terms out with the summed index leading, then sum over axis 0.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cnnlab.constants import CONV_LAYER_SIZE, CONV_OUT_DIM, FILTER_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM
from cnnlab.network import first_nonfinite

# Images per numpy pass: small enough that the (25, n, 10, 400) product array stays in cache.
PASS_IMAGES = 8


class Scratch:
    """The work arrays of one pass over n images, made once and reused, so that a pass allocates
    nothing (a thread per core allocating and freeing megabytes would grow the allocator's pools)."""

    def __init__(self, n: int) -> None:
        taps = FILTER_DIM * FILTER_DIM
        self.taps = np.empty((taps, n, 1, CONV_OUT_DIM * CONV_OUT_DIM))
        self.products = np.empty((taps, n, CONV_LAYER_SIZE, CONV_OUT_DIM * CONV_OUT_DIM))
        self.conv = np.empty((n, CONV_LAYER_SIZE, CONV_OUT_DIM * CONV_OUT_DIM))
        self.negative = np.empty(self.conv.shape, dtype=bool)
        self.terms = np.empty((OUT_NEURON_DIM, n, OUT_LAYER_SIZE))


def forward(
    images: np.ndarray, filters_by_tap: np.ndarray, weights_by_input: np.ndarray, out: np.ndarray, scratch: Scratch | None = None
) -> None:
    """Outputs `out` (n, 10) for images (n, 100, 100); filters (25, 1, 10, 1), weights (4000, 1, 10)."""
    n = images.shape[0]
    scratch = scratch or Scratch(n)
    # taps[i*5+j, b, 0, r*20+c] = images[b, 5r+i, 5c+j]: the 25 terms of each convolution, tap-major.
    np.copyto(
        scratch.taps.reshape(FILTER_DIM, FILTER_DIM, n, CONV_OUT_DIM, CONV_OUT_DIM),
        images.reshape(n, CONV_OUT_DIM, FILTER_DIM, CONV_OUT_DIM, FILTER_DIM).transpose(2, 4, 0, 1, 3),
    )
    np.multiply(scratch.taps, filters_by_tap, out=scratch.products)
    # initial=-0.0: cpu.rs's sums start there (so 25 products of -0.0 sum to -0.0); numpy 2's otherwise start at +0.0.
    conv = np.sum(scratch.products, axis=0, out=scratch.conv, initial=-0.0)  # (n, 10, 400)
    np.less(conv, 0.0, out=scratch.negative)
    np.copyto(conv, 0.0, where=scratch.negative)  # ReLU, leaving -0.0 as cpu.rs does
    flattened = conv.reshape(n, OUT_NEURON_DIM).T[:, :, None]  # (4000, n, 1), input-major
    np.sum(np.multiply(flattened, weights_by_input, out=scratch.terms), axis=0, out=out, initial=-0.0)


class NumpyForward:
    """forward() over passes of a batch, spread over a thread per core (numpy frees the GIL): the same calls as the
    native forward's (cnnlab.cpu._forward.Forward), for the CPU backend where no compiler built that."""

    isa = "numpy"

    def __init__(self, filters: np.ndarray, weights: np.ndarray, threads: int) -> None:
        self._filters_by_tap = np.ascontiguousarray(filters.reshape(CONV_LAYER_SIZE, FILTER_DIM * FILTER_DIM).T)[:, None, :, None]
        self._weights_by_input = np.ascontiguousarray(weights.T)[:, None, :]
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="cnnlab-cpu")
        self._scratch = threading.local()  # each thread's Scratch for each pass size it has met

    def compute(self, images: np.ndarray, out: np.ndarray, check: bool) -> int:
        """The outputs of `images` into `out`; -1, or where `check` is set the index of the first image that holds a
        NaN or an infinity (checked a pass at a time, on the pass's thread: two reductions, a fraction of the pass)."""

        def forward_pass(start: int) -> int:
            part = images[start : start + PASS_IMAGES]
            if check and (bad := first_nonfinite(part)) is not None:
                return start + bad[0]
            by_size = self._scratch.__dict__.setdefault("by_size", {})
            scratch = by_size.get(len(part))
            if scratch is None:
                scratch = by_size[len(part)] = Scratch(len(part))
            # Values near 1e308 overflow to inf (and inf - inf to nan) as they do on the GPU; the run reports the
            # first image whose outputs are not finite, in one line, rather than numpy warning here.
            with np.errstate(over="ignore", invalid="ignore"):  # per thread: this is the pool's thread
                forward(part, self._filters_by_tap, self._weights_by_input, out[start : start + PASS_IMAGES], scratch)
            return -1

        bad = [index for index in self._pool.map(forward_pass, range(0, len(images), PASS_IMAGES)) if index >= 0]
        return min(bad, default=-1)

    def close(self) -> None:
        self._pool.shutdown()
