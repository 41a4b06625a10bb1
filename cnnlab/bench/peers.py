"""The network written in the frameworks cnnlab's users know, float64 on the GPU, as `cnnlab bench`'s
peers, each configured as its users would configure it:

- PyTorch eager, `conv2d` with stride 5, ReLU, a matrix product;
- PyTorch, im2col + two GEMMs: the patches are a reshape (stride = filter size), so the conv is a
  (images x 400, 25) x (25, 10) product and the dense layer (images, 4000) x (4000, 10), with the
  weights' rows permuted once so the conv's output needs no transpose;
- that same function under `torch.compile(mode="max-autotune-no-cudagraphs")` ("compiled");
- JAX `jit`, with x64 enabled, the conv as an einsum over the reshaped images.

Run as `python -m cnnlab.bench.peers FRAMEWORK --images N --repeats R [--seed S]`: one JSON object a line on
stdout, a `PeerResult`. `cnnlab bench` runs each framework in a subprocess of its own, so that
neither JAX's nor PyTorch's allocator and compiler share a process with PyCUDA or each other, and a
framework that is missing or fails is a skipped row with its reason, not a failed bench.

Every peer is timed on images resident on the device (a warm-up first, so compiling is not timed),
median of the repeats, and its outputs are checked against the CPU backend under the lab's rule.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from cnnlab.compare import rule_verdict
from cnnlab.cpu.backend import CpuBackend
from cnnlab.generate import random_values
from cnnlab.network import CONV_LAYER_SIZE, CONV_OUT_DIM, FILTER_DIM, INPUT_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM, Cnn, ImageBatch

FRAMEWORKS = ("torch", "jax")
CHECK_IMAGES = 256  # images whose outputs are compared with the CPU's


@dataclass(frozen=True)
class PeerResult:
    """One peer: its images/s (median) and the spread of its repeats, its check; or why it did not run."""

    name: str
    images_per_second: float | None = None
    slowest: float | None = None
    fastest: float | None = None
    check: str | None = None
    skipped: str | None = None


def _result(name: str, rates: list[float], outputs: np.ndarray, want: np.ndarray) -> PeerResult:
    return PeerResult(name, statistics.median(rates), min(rates), max(rates), rule_verdict(outputs[: len(want)], want))


def torch_peers(images: np.ndarray, cnn: Cnn, want: np.ndarray, repeats: int) -> list[PeerResult]:
    import torch

    if not torch.cuda.is_available():
        return [PeerResult("pytorch", skipped="torch sees no CUDA device")]
    device = torch.device("cuda")
    x = torch.from_numpy(images).to(device)
    filters = torch.from_numpy(cnn.filters).to(device)
    weights = torch.from_numpy(cnn.weights).to(device)
    # im2col: patch (r, c) of image n is row n * 400 + r * 20 + c of (images x 400, 25); its 10 conv outputs
    # come out filter-minor, so the weights are permuted once from [n][f][p] to [(p, f)][n].
    filter_matrix = filters.reshape(CONV_LAYER_SIZE, FILTER_DIM * FILTER_DIM).T.contiguous()
    patch_weights = weights.reshape(OUT_LAYER_SIZE, CONV_LAYER_SIZE, -1).transpose(1, 2).reshape(OUT_LAYER_SIZE, -1).T.contiguous()

    def eager(x: torch.Tensor) -> torch.Tensor:
        conv = torch.nn.functional.conv2d(x[:, None], filters[:, None], stride=FILTER_DIM)
        return torch.relu(conv).flatten(1) @ weights.T

    def gemms(x: torch.Tensor) -> torch.Tensor:
        patches = x.reshape(-1, CONV_OUT_DIM, FILTER_DIM, CONV_OUT_DIM, FILTER_DIM).permute(0, 1, 3, 2, 4)
        conv = torch.relu(patches.reshape(-1, FILTER_DIM * FILTER_DIM) @ filter_matrix)
        return conv.reshape(-1, OUT_NEURON_DIM) @ patch_weights

    version = torch.__version__.split("+")[0]
    peers: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
        (f"torch {version} eager conv2d", eager),
        (f"torch {version} im2col + 2 GEMMs", gemms),
        (f"torch {version} compiled im2col + 2 GEMMs", torch.compile(gemms, mode="max-autotune-no-cudagraphs")),
    ]
    results = []
    with torch.no_grad():
        for name, forward in peers:
            try:
                for _ in range(2):  # the first call compiles where there is anything to compile
                    outputs = forward(x)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                rates = []
                for _ in range(repeats):
                    start.record()
                    outputs = forward(x)
                    end.record()
                    end.synchronize()
                    rates.append(len(images) / (start.elapsed_time(end) / 1e3))
                results.append(_result(name, rates, outputs.cpu().numpy(), want))
            except Exception as error:  # a peer that fails is reported, not fatal to the others
                results.append(PeerResult(name, skipped=f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"))
    return results


def jax_peers(images: np.ndarray, cnn: Cnn, want: np.ndarray, repeats: int) -> list[PeerResult]:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # take memory as needed, not 75% of it at start
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    if jax.default_backend() != "gpu":
        return [PeerResult("jax", skipped=f"jax runs on {jax.default_backend()}, not a GPU")]

    @jax.jit
    def forward(x: jax.Array, filters: jax.Array, weights: jax.Array) -> jax.Array:
        patches = x.reshape(-1, CONV_OUT_DIM, FILTER_DIM, CONV_OUT_DIM, FILTER_DIM)
        conv = jax.nn.relu(jnp.einsum("nricj,fij->nfrc", patches, filters))
        return conv.reshape(-1, OUT_NEURON_DIM) @ weights.T

    x, filters, weights = (jax.device_put(array) for array in (images, cnn.filters, cnn.weights))
    outputs = forward(x, filters, weights).block_until_ready()  # compiles
    rates = []
    for _ in range(repeats):  # JAX has no events: the host clock around a synchronised call
        start = time.perf_counter()
        outputs = forward(x, filters, weights).block_until_ready()
        rates.append(len(images) / (time.perf_counter() - start))
    return [_result(f"jax {jax.__version__} jit (x64)", rates, np.asarray(outputs), want)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cnnlab.bench.peers", description="Time the network in one framework (JSON lines out).")
    parser.add_argument("framework", choices=FRAMEWORKS)
    parser.add_argument("--images", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    cnn = Cnn(random_values(rng, CONV_LAYER_SIZE, FILTER_DIM, FILTER_DIM), random_values(rng, OUT_LAYER_SIZE, OUT_NEURON_DIM))
    images = random_values(rng, args.images, INPUT_DIM, INPUT_DIM)
    with CpuBackend(cnn) as cpu:
        want = cpu.compute(ImageBatch(images[:CHECK_IMAGES])).values
    try:
        results = (torch_peers if args.framework == "torch" else jax_peers)(images, cnn, want, args.repeats)
    except ImportError as error:
        results = [PeerResult(args.framework, skipped=f"not installed ({error})")]
    for result in results:
        print(json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
