"""What the Python API takes images in and gives outputs in, checked once, with errors that say what was
expected: host arrays (anything numpy reads), device arrays (any object with
`__cuda_array_interface__`: CuPy arrays, PyTorch CUDA tensors, Numba device arrays) and device names.

A host array of any real dtype and layout is taken as it is and converted to float64 where it is
copied anyway (into page-locked memory for the GPU, or once, for the CPU). A device array is read
where it lies, so it must already be what the kernels read: C-ordered float64, 16-byte aligned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cnnlab.constants import INPUT_DIM, OUT_LAYER_SIZE
from cnnlab.errors import ArrayError, UsageError
from cnnlab.network import host_array

FLOAT64 = "<f8"
SHAPES = f"one image ({INPUT_DIM}, {INPUT_DIM}) or a batch (N, {INPUT_DIM}, {INPUT_DIM})"


@dataclass(frozen=True)
class DeviceArray:
    """Where and how an object's `__cuda_array_interface__` (version 2 or 3) says its data lie."""

    address: int
    shape: tuple[int, ...]
    typestr: str
    strides: tuple[int, ...] | None  # None: C-contiguous
    readonly: bool
    stream: int | None  # the stream its producer works on (version 3), to wait for before reading or writing it

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.typestr).itemsize

    @property
    def c_contiguous(self) -> bool:
        if self.strides is None:
            return True
        expected = np.dtype(self.typestr).itemsize
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size > 1 and stride != expected:
                return False
            expected *= size
        return True


def device_array(value: Any) -> DeviceArray | None:
    """The device array `value` is, or None for anything without `__cuda_array_interface__`."""
    interface = getattr(value, "__cuda_array_interface__", None)
    if interface is None:
        return None
    if interface.get("mask") is not None:
        raise ArrayError("masked device arrays are not supported")
    address, readonly = interface["data"]
    strides = interface.get("strides")
    return DeviceArray(
        int(address or 0),
        tuple(int(size) for size in interface["shape"]),
        interface["typestr"],
        None if strides is None else tuple(int(stride) for stride in strides),
        bool(readonly),
        interface.get("stream"),
    )


def image_count(shape: tuple[int, ...]) -> tuple[int, bool]:
    """(images, whether it is one image without a batch axis) for an array of images of `shape`."""
    if shape == (INPUT_DIM, INPUT_DIM):
        return 1, True
    if len(shape) == 3 and shape[1:] == (INPUT_DIM, INPUT_DIM):
        return shape[0], False
    raise ArrayError(f"images must be {SHAPES}, not shape {shape}")


def host_images(value: Any) -> tuple[np.ndarray, bool]:
    """Host images as a (N, 100, 100) array of their own dtype and layout, and whether they were one image."""
    array = host_array("images", value)
    count, single = image_count(array.shape)
    return array.reshape(count, INPUT_DIM, INPUT_DIM), single


def check_device_images(array: DeviceArray) -> tuple[int, bool]:
    """(images, one image?) of device images the kernels can read where they lie; else an ArrayError saying how to make them so."""
    count, single = image_count(array.shape)
    if array.typestr != FLOAT64:
        raise ArrayError(
            f"device images must be float64 ({FLOAT64!r}), not {array.typestr!r}: convert them on the device first "
            "(tensor.double() in PyTorch, array.astype(cupy.float64) in CuPy)"
        )
    if not array.c_contiguous:
        raise ArrayError(
            f"device images must be C-contiguous, not strides {array.strides}: "
            "tensor.contiguous() in PyTorch, cupy.ascontiguousarray(array) in CuPy"
        )
    if count and array.address % 16:
        raise ArrayError(
            f"device images must start on a 16-byte boundary (every allocation does), not at {array.address:#x}: copy the view first"
        )
    return count, single


def check_device_outputs(array: DeviceArray, count: int, single: bool) -> None:
    """An ArrayError unless `array` can take the outputs of `count` images: float64, C-contiguous, writable,
    shaped like the result, (count, 10), or (10,) for one image."""
    shape = (OUT_LAYER_SIZE,) if single else (count, OUT_LAYER_SIZE)
    if array.shape != shape or array.typestr != FLOAT64 or not array.c_contiguous or array.readonly or array.address % 8:
        raise ArrayError(
            f"out must be a writable, C-contiguous float64 device array of shape {shape}, "
            f"not {'a read-only ' if array.readonly else ''}{array.typestr!r} of shape {array.shape}"
            f"{'' if array.c_contiguous else f' with strides {array.strides}'}"
        )


def gpu_index(device: Any) -> int | None:
    """The GPU a device name names, as users write it: "cuda" is GPU 0, "cuda:N" GPU N (a torch.device reads the same),
    "cpu" none; anything else a UsageError.

    >>> gpu_index("cpu"), gpu_index("cuda"), gpu_index("cuda:1")
    (None, 0, 1)
    """
    name = str(device)
    if name == "cpu":
        return None
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        return int(name[5:] or 0)
    raise UsageError(f"device must be 'cpu', 'cuda' or 'cuda:N' (GPU N, counted from 0), not {device!r}")
