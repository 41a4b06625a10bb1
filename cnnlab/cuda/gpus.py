"""Which GPUs the driver sees, and how cnnlab numbers them.

A GPU's number is the one its user sees: nvidia-smi's, counted from 0, or its place in the user's own
CUDA_VISIBLE_DEVICES. cuInit starts every GPU the driver can see, one after another (docs/gpu.md has the seconds), so the
command line shows the driver only the GPUs its run names (`show_only`, before cuInit) where the user has not chosen:
the driver's ordinals are then places in that list, and `ordinal` and `number` translate. The Python API shows the
driver every GPU, as PyTorch and CuPy do, since a long-lived process may ask for any of them later (docs/gpu.md).

Nothing here imports more than os and contextlib (ctypes where NVML is asked): `python -m cnnlab cuda` calls show_only
before numpy is imported.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from cnnlab.errors import DeviceError

VISIBLE = "CUDA_VISIBLE_DEVICES"
_shown: tuple[int, ...] | None = None  # the GPUs show_only left the driver, in its order; None: every GPU it finds


def show_only(gpus: list[int]) -> list[int]:
    """Before cuInit: where the user has not set CUDA_VISIBLE_DEVICES, let the driver see only `gpus` (ascending, each
    once); the driver's ordinals of `gpus`."""
    global _shown
    if VISIBLE not in os.environ:
        _shown = tuple(sorted(set(gpus)))
        os.environ[VISIBLE] = ",".join(map(str, _shown))
    return gpus if _shown is None else [_shown.index(gpu) for gpu in gpus]


def ordinal(gpu: int, driver_count: Callable[[], int]) -> int:
    """The driver's ordinal of GPU `gpu`; where there is no such GPU, a DeviceError naming how many the machine has.
    `driver_count` starts the driver and says how many GPUs it sees (driver.visible_count), or raises its DeviceError."""
    failed: DeviceError | None = None
    try:
        count = driver_count()
    except DeviceError as error:
        if _shown is None:
            raise
        failed, count = error, 0  # cuInit finds no GPU where every number it was shown is past the machine's last
    if _shown is None:
        if count == 0:
            raise DeviceError("no CUDA device found")
        if 0 <= gpu < count:
            return gpu
        raise DeviceError(no_such_gpu(gpu, count))
    found = _shown[:count]  # the driver stops at the first number it has no GPU for
    if gpu in found:
        return found.index(gpu)
    machine = machine_count()
    if machine and gpu >= machine:
        raise DeviceError(no_such_gpu(gpu, machine))
    if failed is not None:  # the driver's own words, as where it was shown every GPU
        raise failed
    if machine == 0:
        raise DeviceError("no CUDA device found")
    raise DeviceError(f"GPU {gpu} did not start: the driver found {count} of the GPUs {VISIBLE}={os.environ[VISIBLE]} names")


def number(ordinal: int) -> int:
    """The GPU number of the driver's ordinal `ordinal`, as the user counts GPUs."""
    return ordinal if _shown is None else _shown[ordinal]


def no_such_gpu(gpu: int, count: int) -> str:
    """The message for a GPU number past the machine's last, naming the numbers there are."""
    numbered = "GPU 0" if count == 1 else f"GPUs 0 to {count - 1}"
    return f"there is no GPU {gpu}: this machine has {count} ({numbered})"


def machine_count() -> int | None:
    """How many GPUs the machine has, whatever the driver was shown: NVML's count (it ignores CUDA_VISIBLE_DEVICES),
    else the driver's folders in /proc; None where neither answers."""
    import ctypes

    with _nvml() as nvml, suppress(AttributeError):  # an NVML too old for the call: the folders answer
        count = ctypes.c_uint()
        if nvml is not None and nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0:
            return count.value
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return None


def nvml_memory(pci_bus_id: str) -> tuple[int, int] | None:
    """(free, total) bytes of the GPU at `pci_bus_id` (the driver's name for its slot) as NVML counts them, which needs no
    context: where the driver cannot make one, this says how much memory the GPU has left. None where NVML does not
    answer."""
    import ctypes

    with _nvml() as nvml:
        handle, memory = ctypes.c_void_p(), (ctypes.c_ulonglong * 3)()  # nvmlMemory_t: total, free, used
        if nvml is None or nvml.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(handle)):
            return None
        return None if nvml.nvmlDeviceGetMemoryInfo(handle, memory) else (memory[1], memory[0])


@contextmanager
def _nvml() -> Iterator[Any]:
    """NVML (the driver's management library, which needs no CUDA context) started for the block; None where it is
    missing or does not start."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        nvml = None
    if nvml is None or nvml.nvmlInit_v2() != 0:
        yield None
        return
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()
