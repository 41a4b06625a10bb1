"""The network written in the frameworks cnnlab's users know, float64, as `cnnlab bench`'s peers: on the GPU
against the ladder, and PyTorch on the CPU against the cpu row; each configured as its users would configure it:

- PyTorch eager, `conv2d` with stride 5, ReLU, a matrix product;
- PyTorch, im2col + two GEMMs: the patches are a reshape (stride = filter size), so the conv is a
  (images x 400, 25) x (25, 10) product and the dense layer (images, 4000) x (4000, 10), with the
  weights' rows permuted once so the conv's output needs no transpose;
- that same function under `torch.compile(mode="max-autotune-no-cudagraphs")` ("compiled");
- JAX `jit`, with x64 enabled, the conv as an einsum over the reshaped images;
- and for the npy and csv rows, KvikIO's read of the file into device memory (CuPy): what a user reaches for to bring
  a file's bytes to the GPU, on as many threads as the host has cores (KVIKIO_NTHREADS; its 4 MiB tasks and page-locked
  bounce buffers where GPUDirect Storage is absent, its default).

Run as `python -m cnnlab.bench.peers FRAMEWORK [--device cpu] [--threads T] --images N --repeats R [--seed S]` (kvikio:
`--file F` too, the file of the N images it reads):
one JSON object a line on stdout, a `PeerResult`. `cnnlab bench` runs each framework in a subprocess of its
own (run_peers), so that neither JAX's nor PyTorch's allocator, compiler and thread pool share a process
with PyCUDA, cnnlab's threads or each other, and a framework that is missing or fails is a skipped row
with its reason, not a failed bench.

Every network peer is timed on images resident on its device (a warm-up first, so compiling is not timed),
median of the repeats, and its outputs are checked against the CPU backend under the lab's rule; the read, against the
file's bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from cnnlab.bench.report import Figure
from cnnlab.compare import rule_verdict
from cnnlab.constants import CONV_LAYER_SIZE, CONV_OUT_DIM, FILTER_DIM, FLOPS_PER_IMAGE, INPUT_DIM, OUT_LAYER_SIZE, OUT_NEURON_DIM
from cnnlab.cpu.backend import CpuBackend
from cnnlab.generate import random_values
from cnnlab.network import Cnn, ImageBatch, default_threads

FRAMEWORKS = ("torch", "jax")  # the network's peers (KvikIO, "kvikio", is the npy and csv rows': a read, not the network)
CHECK_IMAGES = 256  # images whose outputs are compared with the CPU's
CHECK_BYTES = 1 << 20  # bytes at each end of a file that KvikIO's read is compared with
PEER_SECONDS = 420  # a framework's import, compiles and timing; past that it is reported as not run


@dataclass(frozen=True)
class PeerResult:
    """One peer: its images/s (median) and the range of its repeats, its check; or why it did not run."""

    name: str
    images_per_second: float | None = None
    slowest: float | None = None
    fastest: float | None = None
    check: str | None = None
    skipped: str | None = None


def _result(name: str, rates: list[float], outputs: np.ndarray, want: np.ndarray) -> PeerResult:
    return PeerResult(name, statistics.median(rates), min(rates), max(rates), rule_verdict(outputs[: len(want)], want))


def torch_peers(images: np.ndarray, cnn: Cnn, want: np.ndarray, repeats: int, on: str, threads: int) -> list[PeerResult]:
    """PyTorch's three forms on `on` ("cuda", or "cpu" on `threads` threads)."""
    import torch

    if on == "cuda" and not torch.cuda.is_available():
        return [PeerResult("pytorch", skipped="torch sees no CUDA device")]
    torch.set_num_threads(threads)
    device = torch.device(on)
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

    def seconds(forward: Callable[[torch.Tensor], torch.Tensor]) -> tuple[float, torch.Tensor]:
        """One call's seconds: CUDA events on the GPU, the host's clock on the CPU (where a call returns done)."""
        if on == "cpu":
            start = time.perf_counter()
            outputs = forward(x)
            return time.perf_counter() - start, outputs
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        outputs = forward(x)
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3, outputs

    version = torch.__version__.split("+")[0]
    where = f"{on}, {threads} threads" if on == "cpu" else on
    peers: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
        (f"torch {version} eager conv2d ({where})", eager),
        (f"torch {version} im2col + 2 GEMMs ({where})", gemms),
        (f"torch {version} compiled im2col + 2 GEMMs ({where})", torch.compile(gemms, mode="max-autotune-no-cudagraphs")),
    ]
    results = []
    with torch.no_grad():
        for name, forward in peers:
            try:
                for _ in range(2):  # the first call compiles where there is anything to compile
                    outputs = forward(x)
                rates = []
                for _ in range(repeats):
                    elapsed, outputs = seconds(forward)
                    rates.append(len(images) / elapsed)
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


def kvikio_read(path: str, images: int, threads: int, repeats: int) -> list[PeerResult]:
    """KvikIO's read of the file at `path` into device memory (a .npy file's images after its header, a CSV file's whole
    text), `threads` threads in its pool: `images` images/s, median of `repeats` after one warm-up; checked: the first
    and last MB on the device are the file's bytes."""
    os.environ["KVIKIO_NTHREADS"] = str(threads)  # read as KvikIO is imported
    import cupy
    import kvikio

    offset = np.load(path, mmap_mode="r").offset if path.endswith(".npy") else 0
    on_disk = np.memmap(path, np.uint8, "r", offset)
    data = cupy.empty(len(on_disk), np.uint8)
    rates = []
    with kvikio.CuFile(path, "r") as file:
        for _ in range(repeats + 1):
            start = time.perf_counter()
            file.pread(data, len(on_disk), offset).get()
            rates.append(images / (time.perf_counter() - start))
    ends = (slice(None, CHECK_BYTES), slice(-CHECK_BYTES, None))
    same = all((cupy.asnumpy(data[end]) == on_disk[end]).all() for end in ends)
    name = f"kvikio {kvikio.__version__}, the file read into device memory ({threads} threads)"
    rates = rates[1:]
    return [PeerResult(name, statistics.median(rates), min(rates), max(rates), "the file's bytes" if same else "NOT the file's bytes")]


def run_peers(
    frameworks: Sequence[str], row: str, bound: str, images: int, repeats: int, seed: int | None, on: str = "cuda",
    threads: int | None = None, bytes_per_image: float | None = None, file: str | None = None,
    flops_per_image: float | None = FLOPS_PER_IMAGE,
) -> tuple[list[Figure], list[str]]:
    """Each framework's peers in a subprocess of its own, on `images` images on `on` (or the .npy `file`, for a read): a
    figure of `row` (a share of `bound`) for each that ran, and a note for each that did not, saying why."""
    figures, notes = [], []
    environment = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    command = ["--images", str(images), "--repeats", str(repeats), "--device", on, "--threads", str(threads or default_threads())]
    command += [] if file is None else ["--file", file]
    for framework in frameworks:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "cnnlab.bench.peers", framework, *command, *([] if seed is None else ["--seed", str(seed)])],
                capture_output=True, text=True, timeout=PEER_SECONDS, env=environment,
            )
        except subprocess.TimeoutExpired:
            notes.append(f"peer {framework} not run: it took more than {PEER_SECONDS} s")
            continue
        results = [PeerResult(**json.loads(line)) for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not results:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            notes.append(f"peer {framework} not run: exit status {done.returncode}: {last[:200]}")
        for result in results:
            if result.skipped is not None or result.images_per_second is None:
                notes.append(f"peer {result.name} not run: {result.skipped}")
            else:
                repeat_range = (result.slowest, result.fastest) if result.slowest and result.fastest else None
                figures.append(Figure(
                    row, f"peer: {result.name}", result.images_per_second, bound, bytes_per_image=bytes_per_image,
                    flops_per_image=flops_per_image, repeat_range=repeat_range, check=result.check,
                ))
    return figures, notes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cnnlab.bench.peers", description="Time the network in one framework (JSON lines out).")
    parser.add_argument("framework", choices=(*FRAMEWORKS, "kvikio"))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the framework runs (jax: cuda only)")
    parser.add_argument("--threads", type=int, default=default_threads(), help="CPU threads, on the CPU")
    parser.add_argument("--images", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--file", help="kvikio: the file it reads (.npy or CSV), of --images images")
    args = parser.parse_args(argv)
    if args.framework == "kvikio" and args.file is None:
        parser.error("kvikio reads a file: give --file F.npy or --file F.csv")
    try:
        if args.framework == "kvikio":
            results = kvikio_read(args.file, args.images, args.threads, args.repeats)
        else:
            results = network_peers(args)
    except ImportError as error:
        results = [PeerResult(args.framework, skipped=f"not installed ({error})")]
    for result in results:
        print(json.dumps(asdict(result)), flush=True)
    return 0


def network_peers(args: argparse.Namespace) -> list[PeerResult]:
    """The framework's forms of the network on fresh images, checked against the CPU backend's outputs."""
    rng = np.random.default_rng(args.seed)
    cnn = Cnn(random_values(rng, CONV_LAYER_SIZE, FILTER_DIM, FILTER_DIM), random_values(rng, OUT_LAYER_SIZE, OUT_NEURON_DIM))
    images = random_values(rng, args.images, INPUT_DIM, INPUT_DIM)
    with CpuBackend(cnn) as cpu:
        want = cpu.compute(ImageBatch(images[:CHECK_IMAGES])).values
    if args.framework == "torch":
        return torch_peers(images, cnn, want, args.repeats, args.device, args.threads)
    return jax_peers(images, cnn, want, args.repeats)


if __name__ == "__main__":
    sys.exit(main())
