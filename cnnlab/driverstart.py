"""The CUDA driver started on a thread of its own, while the command line imports numpy and reads the CNN.

cuInit and the primary context cost ~0.35 s on the H100 machine, as much as importing numpy. Called
through ctypes they run with the GIL released, so the two overlap; PyCUDA then finds the driver
started and the primary context made, and CudaContext retains it in a moment. No numpy, no PyCUDA
and no errors here: where there is no driver, cuda mode says so later, in one line. The context
retained here is released by the process's end (CudaContext keeps its own reference).
"""

from __future__ import annotations

import ctypes
import threading


def _start() -> None:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    device, context = ctypes.c_int(), ctypes.c_void_p()
    if cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), 0) == 0:
        cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)


def start_driver() -> threading.Thread:
    """Start the driver in the background; join the thread before the process ends."""
    thread = threading.Thread(target=_start, name="cnnlab-cuda-start", daemon=True)
    thread.start()
    return thread
