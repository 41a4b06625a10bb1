"""cnnlab on Dask: a Dask array of images through the network a block at a time on each worker's one backend, and a
folder of lab input files through a cluster, one task a file (Dask is imported only here, and only when called)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cnnlab.arrays import gpu_index, image_count
from cnnlab.backend import Backend
from cnnlab.constants import INPUT_DIM, OUT_LAYER_SIZE
from cnnlab.errors import ArrayError, UsageError
from cnnlab.files.labcsv import read_cnn
from cnnlab.files.safety import refuse_same_files
from cnnlab.network import Cnn, ImageBatch, first_nonfinite, nonfinite_error
from cnnlab.owner import on_device
from cnnlab.run import make_backend, run_network

if TYPE_CHECKING:
    import dask.array
    from distributed import Client


def forward_blocks(images: dask.array.Array, cnn: Cnn, device: str = "cpu") -> dask.array.Array:
    """The network's outputs for a Dask array of images, as a Dask array: (N, 100, 100) in, (N, 10) float64 out, chunked
    along N as the images are; one (100, 100) image gives (10,).

    Each block is one forward on the backend its worker process keeps for this CNN and device (made by the first block,
    closed when the process ends), and the CNN is one key of the graph, so it travels once to each worker, not once a
    block. Chunks that split the 100x100 axes are rechunked to whole images first (N's chunks stay as they are: they are
    the blocks, and a GPU wants thousands of images a block). Any real dtype is converted to float64 a block at a time,
    as cnnlab.forward converts numpy arrays. Nothing is computed here: a wrong shape or dtype raises ArrayError at once,
    a NaN or an infinity when the block holding it is computed.
    """
    import dask
    from dask.base import tokenize

    if not isinstance(cnn, Cnn):
        raise UsageError(f"cnn must be a cnnlab.Cnn (load_cnn(path), or Cnn(filters, weights)), not {type(cnn).__name__}")
    gpu = gpu_index(device)
    if image_count(images.shape)[1]:
        return forward_blocks(images[None], cnn, device)[0]
    if images.dtype.kind not in "fiu":
        raise ArrayError(f"images must hold real numbers (any float or integer dtype, converted to float64), not {images.dtype}")
    if any(math.isnan(size) for size in images.chunks[0]):
        raise ArrayError("images have chunks of unknown size along N: images.compute_chunk_sizes() first")
    if images.chunks[1:] != ((INPUT_DIM,), (INPUT_DIM,)):
        images = images.rechunk({1: INPUT_DIM, 2: INPUT_DIM})
    token = tokenize(cnn)
    name = f"cnnlab-forward-{tokenize(images, token, gpu)}"
    starts = tuple(np.cumsum((0, *images.chunks[0])).tolist())  # each block's first image, for errors that name one
    # An image a row, a view of each block: map_blocks then drops no axis, where a dropped axis would be concatenated
    # (a copy of every block, which took 4 times the forward's own time on the CPU).
    rows = images.reshape(images.shape[0], INPUT_DIM * INPUT_DIM)
    return rows.map_blocks(
        _forward_block,
        dask.delayed(cnn, name=f"cnnlab-cnn-{token}"),  # a key of its own, which every block's task names
        token,
        gpu,
        starts,
        dtype=np.float64,
        chunks=(images.chunks[0], (OUT_LAYER_SIZE,)),
        meta=np.empty((0, OUT_LAYER_SIZE)),  # declared, so that map_blocks never calls _forward_block to find it
        name=name,
    )


def _forward_block(
    rows: np.ndarray, cnn: Cnn, token: str, gpu: int | None, starts: tuple[int, ...], block_id: tuple[int, ...]
) -> np.ndarray:
    """One block's outputs, on this process's backend for the CNN and device (GPU `gpu`, or the CPU for None); a NaN or
    an infinity is named by its index in the whole array, as cnnlab.forward names it."""
    if not len(rows):
        return np.empty((0, OUT_LAYER_SIZE))
    images = rows.reshape(len(rows), INPUT_DIM, INPUT_DIM)
    try:
        return _on_backend(cnn, token, gpu, partial(_outputs, images)).result()
    except ArrayError:
        index = first_nonfinite(images)
        if index is None:
            raise
        raise nonfinite_error("images", f"{images[index]} at index {(starts[block_id[0]] + index[0], *index[1:])}") from None


def _outputs(images: np.ndarray, backend: Any) -> np.ndarray:
    """The outputs of host images on a backend: the GPU's forward converts them as it copies them; the CPU's compute
    takes C-ordered float64."""
    if backend.name == "cpu":
        return backend.compute(ImageBatch(np.ascontiguousarray(images, dtype=np.float64)), check_finite=True).values
    return backend.forward(images)


def _worker_backend(cnn: Cnn, gpu: int | None) -> Backend:
    """The command line's backend for the CPU (gpu None) or GPU `gpu`, on the host threads that suit a Dask worker."""
    if gpu is None:
        return make_backend("cpu", cnn, None)
    # Every core the worker may run on copies its blocks into page-locked memory: Dask's OMP_NUM_THREADS=1 keeps a
    # worker's compute libraries from taking every core each, and a GPU's worker computes nothing on the host.
    return make_backend("cuda", cnn, None, threads=len(os.sched_getaffinity(0)), gpus=[gpu])


def _on_backend(cnn: Cnn, token: str, gpu: int | None, job: Callable[[Backend], Any]) -> Future:
    """Run `job` on this process's backend for GPU `gpu` (None: the CPU), the one the Python API's forward() uses too
    (owner.on_device), with the CNN whose Dask token is `token` loaded where it holds another."""
    return on_device(gpu, partial(_worker_backend, cnn, gpu), cnn, token, job)


def run_files(
    client: Client | None,
    cnn_path: str | os.PathLike,
    input_paths: Iterable[str | os.PathLike],
    output_dir: str | os.PathLike,
    device: str = "cpu",
) -> list[Path]:
    """Run each lab input file (CSV, or .npy by its extension) through the network on a Dask cluster, one task a file,
    each writing output_dir/STEM.csv as `cnnlab cpu` or `cnnlab cuda` writes its output (whole or not at all); return
    those paths, in the inputs' order.

    `client`: a distributed.Client, or None for Dask's default scheduler (the last Client made, else threads in this
    process). The CNN file is read here, once, and the CNN sent once to each worker; the input files are read and the
    outputs written by the workers, at the same absolute paths (a relative one is taken from this process's working
    directory), so on many hosts they must lie on a file system all of them share. Each worker runs its files on the
    backend it keeps for this CNN and device, as forward_blocks does.
    """
    import dask
    from dask.base import tokenize

    gpu = gpu_index(device)
    inputs = [Path(path) for path in input_paths]
    outputs = [Path(output_dir) / f"{path.stem}.csv" for path in inputs]
    if len(set(outputs)) < len(outputs):
        raise UsageError("two input files share a name (less its extension): their outputs would be one file")
    refuse_same_files(outputs, [("CNN file", cnn_path), *(("input file", path) for path in inputs)])
    cnn = read_cnn(cnn_path)
    token = tokenize(cnn)
    cnn_once = dask.delayed(cnn, name=f"cnnlab-cnn-{token}")
    tasks = [  # absolute paths: a worker's working directory is its own
        dask.delayed(_run_file, pure=False)(cnn_once, token, gpu, path.absolute(), output.absolute())
        for path, output in zip(inputs, outputs)
    ]
    dask.compute(*tasks, scheduler=client)
    return outputs


def _run_file(cnn: Cnn, token: str, gpu: int | None, input_path: Path, output_path: Path) -> None:
    """One input file's run, as the command line's, on this process's backend."""
    _on_backend(cnn, token, gpu, lambda backend: run_network(backend, input_path, output_path)).result()
