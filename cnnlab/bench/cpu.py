"""`cnnlab bench`'s cpu rows: the CPU backend's forward against reading its images once (the memory bound) and
against its peers, all on the same threads and the same images in one run.

The forward runs the kernels CNNLAB_CPU_ISA names (the widest this CPU runs where unset), and the plain loop the
same, as its users would compile it (-march=native) on a machine whose widest that is; each row names its set.
The peers: the plain loop (cpu.rs's loops as written, 8 images a vector, in cnnlab.cpu._forward), the numpy
forward (the reference), and PyTorch on the CPU (float64, eager, im2col + GEMMs and compiled, in a subprocess
of its own). Each peer's outputs are checked against the backend's: the plain loop and numpy bit for bit,
PyTorch under the lab's rule.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cnnlab.bench.peers import run_peers
from cnnlab.bench.report import BenchOptions, Figure, Traffic, alternated_seconds, median_rate, rate_and_range
from cnnlab.constants import FLOPS_PER_IMAGE, IMAGE_BYTES, INPUT_DIM, OUT_LAYER_SIZE
from cnnlab.cpu.backend import CpuBackend, Forward, kernel_isa
from cnnlab.cpu.numpy_forward import NumpyForward
from cnnlab.generate import random_values
from cnnlab.network import Cnn, ImageBatch

MEMORY_BOUND = "memory"  # the key of the cpu rows' bound: every image read once, on the same threads


def _bit_exact(got: np.ndarray, want: np.ndarray) -> str:
    return "bit-exact" if np.array_equal(got.view(np.uint64), want.view(np.uint64)) else "NOT bit-exact"


def bench_cpu(cnn: Cnn, options: BenchOptions, rng: np.random.Generator, seed: int | None) -> tuple[list[Figure], list[str]]:
    """The cpu rows and the notes on them: how the forward compares with each peer, or why a peer did not run."""
    images = random_values(rng, options.cpu_images, INPUT_DIM, INPUT_DIM)
    count, repeats, threads = len(images), options.repeats, options.threads
    model: Traffic = {"bytes_per_image": IMAGE_BYTES, "flops_per_image": FLOPS_PER_IMAGE}
    figures, notes = [], []
    out = np.empty((count, OUT_LAYER_SIZE))
    with CpuBackend(cnn, threads=threads) as backend:
        threads = backend.threads
        want = backend.compute(ImageBatch(images)).values
        runs: list[Callable[[], object]] = [lambda: backend.compute(ImageBatch(images))]
        native = Forward(cnn.filters, cnn.weights, threads, kernel_isa()) if Forward is not None else None
        try:
            if native is not None:
                read = median_rate(count, lambda: native.read(images), repeats)
                figures.append(Figure("cpu", f"bound: memory, every image read once ({threads} threads)", read, key=MEMORY_BOUND,
                                      bytes_per_image=IMAGE_BYTES))
                runs.append(lambda: native.compute_plain(images, out))
            # In turns, so that a slower spell of the machine slows both alike and their ratio holds turn by turn.
            forward_seconds, *plain_seconds = alternated_seconds(runs, repeats)
        finally:
            if native is not None:
                native.close()
    rate, repeat_range = rate_and_range(count, forward_seconds)
    figures.append(Figure("cpu", f"cpu: forward ({backend.device})", rate, MEMORY_BOUND, repeat_range=repeat_range, **model))
    if native is not None:
        rate, repeat_range = rate_and_range(count, plain_seconds[0])
        figures.append(Figure("cpu", f"peer: plain C++ loop, 8 images a vector ({threads} threads, {native.isa})", rate,
                              MEMORY_BOUND, repeat_range=repeat_range, check=_bit_exact(out, want), **model))
        turns = sorted(plain / forward for forward, plain in zip(forward_seconds, plain_seconds[0]))
        notes.append(f"cpu: the forward against the plain loop, turn by turn: {turns[0]:.1f}x..{turns[-1]:.1f}x")
    numpy = NumpyForward(cnn.filters, cnn.weights, threads)
    try:
        some = images[: max(1, count // 8)]  # ~20x slower: an eighth of the images
        rate = median_rate(len(some), lambda: numpy.compute(some, out[: len(some)], False), repeats)
        figures.append(Figure("cpu", f"peer: numpy forward, the reference ({threads} threads)", rate, MEMORY_BOUND,
                              check=_bit_exact(out[: len(some)], want[: len(some)]), **model))
    finally:
        numpy.close()
    peers, peer_notes = run_peers(("torch",), "cpu", MEMORY_BOUND, count, repeats, seed, "cpu", threads, IMAGE_BYTES)
    figures += peers
    notes += peer_notes
    forward = next(figure for figure in figures if figure.name.startswith("cpu: forward"))
    multiples = [f"{forward.images_per_second / figure.images_per_second:.1f}x {figure.name[6:].split(' (')[0]}"
                 for figure in figures if figure.name.startswith("peer: ")]
    if multiples:
        notes.append(f"cpu: the forward is {', '.join(multiples)} (the same images and threads)")
    return figures, notes
