"""The host's half of cuda mode's outputs (cnnlab/cuda/chunk_streams.py HostOutputs), which needs no GPU: each chunk's partial
sums added up on the host in segment order."""

from __future__ import annotations

import warnings

import numpy as np

from cnnlab.cuda.chunk_streams import HostOutputs


class Arrived:
    """A chunk's partials already on the host: its event has nothing to wait for."""

    def synchronize(self) -> None:
        pass


def test_partials_are_added_in_segment_order_and_overflow_as_the_cpu_s_sums_do(rng: np.random.Generator) -> None:
    """Overflowing sums are infinities (inf - inf a NaN), as the CPU's forward gives them, and numpy says nothing:
    a caller of forward() sees no RuntimeWarning from cnnlab's reduction."""
    segments, chunk, count = 4, 3, 5
    partials = rng.uniform(-10, 10, (2, segments, chunk, 10))
    partials[0, :2, 0, 0] = [np.inf, -np.inf]
    partials[0, 2:, 1, 1] = 1.7e308
    outputs = HostOutputs(partials, [Arrived(), Arrived()], count, chunk)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outputs.finish([])
    want = np.zeros((2 * chunk, 10))
    with np.errstate(over="ignore", invalid="ignore"):
        for segment in range(segments):  # the lab's order: segment 0 first, each added in turn
            want += partials[:, segment].reshape(2 * chunk, 10)
    got = outputs.values[:count]
    assert np.isnan(got[0, 0]) and got[1, 1] == np.inf
    mask = np.ones_like(got, bool)
    mask[0, 0] = mask[1, 1] = False
    assert got[mask].view(np.uint64).tolist() == want[:count][mask].view(np.uint64).tolist()
