"""cnnlab from Python: the lab's files read into numpy arrays, and the network run on them on the CPU or a
GPU, through the same backends as the command line (cnnlab/cpu/, cnnlab/cuda/).

Every problem is raised as one of cnnlab's exceptions (cnnlab/errors.py): ArrayError (also a
ValueError) for an array that is not what was expected, InputFileError for a file, DeviceError
where the GPU cannot run.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from functools import partial
from operator import methodcaller
from typing import Any

import numpy as np

from cnnlab.arrays import device_array, gpu_index, host_images
from cnnlab.constants import INPUT_DIM, OUT_LAYER_SIZE
from cnnlab.cpu.backend import CpuBackend
from cnnlab.errors import ArrayError, UsageError
from cnnlab.files.formats import open_images
from cnnlab.files.labcsv import read_cnn
from cnnlab.network import Cnn, ImageBatch, require_finite
from cnnlab.owner import on_device
from cnnlab.run_inputs import fill_images


def load_cnn(path: str | os.PathLike[str]) -> Cnn:
    """The CNN file at `path` (the lab's CSV layout). A Cnn is also made from arrays: `Cnn(filters, weights)`.

    >>> cnn = load_cnn("data/cnn.csv")
    >>> cnn.filters.shape, cnn.weights.shape
    ((10, 5, 5), (10, 4000))
    """
    return read_cnn(path)


def load_images(path: str | os.PathLike[str]) -> np.ndarray:
    """Every image of the input file at `path` as one (N, 100, 100) float64 array: the lab's CSV, or `.npy`
    by its extension. For a file larger than memory, load_image_batches.

    >>> load_images("data/in.csv").shape
    (4, 100, 100)
    """
    with open_images(path) as reader:
        images = np.empty((reader.count, INPUT_DIM, INPUT_DIM))
        fill_images(reader, images, threading.Event())
        reader.finish()
    return images


def load_image_batches(path: str | os.PathLike[str], batch: int = 1024) -> Iterator[np.ndarray]:
    """The images of the input file at `path`, `batch` at a time (fewer in the last): a new (n, 100, 100)
    float64 array each, so that a file of any size is read in bounded memory.

    >>> [len(images) for images in load_image_batches("data/in.csv", batch=3)]
    [3, 1]
    """
    if batch < 1:
        raise UsageError(f"batch must be a positive number of images, not {batch}")
    with open_images(path) as reader:
        while left := reader.count - reader.images_read:
            images = np.empty((min(batch, left), INPUT_DIM, INPUT_DIM))
            fill_images(reader, images, threading.Event())
            yield images
        reader.finish()


def forward(images: Any, cnn: Cnn, device: Any = "cpu", out: Any = None) -> Any:
    """The network's outputs for `images`: a (N, 10) float64 numpy array, or (10,) for one image.

    `images` is one (100, 100) image or a batch (N, 100, 100) of anything numpy reads: a list, a view,
    Fortran order; float32 and every other float or integer dtype are converted once to float64 (so
    float32 inputs give the outputs of their float64 values). `device="cpu"` runs the CPU backend, bit for
    bit the lab's cpu.rs; `device="cuda"` (GPU 0) or `"cuda:N"` (GPU N) runs the CUDA kernels, within the lab's
    comparison rule of it.
    On the GPU, `images` may also be a device array (CuPy, a PyTorch CUDA tensor, Numba: anything with
    `__cuda_array_interface__`), C-ordered float64, read where it lies, and `out` a float64 device
    array of the result's shape that receives the outputs on the device (then returned). A wrong
    shape or dtype, or a NaN or an infinity in the images, raises ArrayError.
    A Dask array of images gives a Dask array of outputs, each block through the network on its worker
    (cnnlab.dask_forward; docs/dask.md).

    The GPU's context, kernels and buffers are made at the first call with device="cuda" and kept for the process,
    one context a GPU, as PyTorch and CuPy keep theirs (the CNN is copied to the device at each call, so it is never
    stale); release_backends() frees them, as the process's end does. Calls from several threads are served one at a
    time, in order, on the context's own thread.

    >>> import numpy as np
    >>> rng = np.random.default_rng(459)
    >>> cnn = Cnn(rng.uniform(-10, 10, (10, 5, 5)), rng.uniform(-10, 10, (10, 4000)))
    >>> outputs = forward(rng.uniform(-10, 10, (3, 100, 100)).astype(np.float32), cnn)
    >>> outputs.shape, outputs.dtype
    ((3, 10), dtype('float64'))
    >>> forward(rng.uniform(-10, 10, (100, 100)), cnn).shape
    (10,)
    """
    if not isinstance(cnn, Cnn):
        raise UsageError(f"cnn must be a cnnlab.Cnn (load_cnn(path), or Cnn(filters, weights)), not {type(cnn).__name__}")
    if type(images).__module__.startswith("dask."):
        if out is not None:
            raise ArrayError("out takes a device array; a Dask array's outputs are a Dask array, computed where its blocks are")
        from cnnlab.dask_forward import forward_blocks

        return forward_blocks(images, cnn, device)
    gpu = gpu_index(device)
    if gpu is not None:
        from cnnlab.cuda.context import CudaContext

        job = methodcaller("forward", images, out)
        return on_device(gpu, partial(CudaContext, cnn, device=gpu), cnn, None, job).result()
    if out is not None:
        raise ArrayError("out takes a device array, with device='cuda'; on the CPU, forward returns a new numpy array")
    if device_array(images) is not None:
        raise ArrayError("images lie in device memory: forward(..., device='cuda') reads them there; device='cpu' takes host arrays")
    batch, single = host_images(images)
    if not len(batch):
        return np.empty((0, OUT_LAYER_SIZE))
    batch = np.ascontiguousarray(batch, dtype=np.float64)
    require_finite("images", batch)
    with CpuBackend(cnn) as backend:
        values = backend.compute(ImageBatch(batch)).values
    return values[0] if single else values
