"""Another process on a shared GPU: holds all of GPU 0's memory but `free` MB (its own context included), prints the
free memory it left in bytes, and holds it until its standard input closes, taking whatever other processes give back
meanwhile (every 10 ms), so that no more than that is free while it holds.

    python tests/gpu_memory_holder.py FREE_MB

The driver's own calls through ctypes, so that it needs nothing but the driver.
"""

from __future__ import annotations

import ctypes
import select
import sys

GRAIN = 16 << 20  # the last allocations' size, once the large ones no longer fit


def main() -> None:
    leave = int(float(sys.argv[1]) * 1e6)
    cuda = ctypes.CDLL("libcuda.so.1")
    device, context = ctypes.c_int(), ctypes.c_void_p()
    for call in (cuda.cuInit(0), cuda.cuDeviceGet(ctypes.byref(device), 0),
                 cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), cuda.cuCtxSetCurrent(context)):
        if call:
            sys.exit(f"gpu_memory_holder: the driver failed ({call})")
    print(hold_all_but(cuda, leave), flush=True)
    while not select.select([sys.stdin], [], [], 0.01)[0]:  # until standard input closes (or says anything)
        hold_all_but(cuda, leave)


def hold_all_but(cuda: ctypes.CDLL, leave: int) -> int:
    """Allocate until `leave` bytes are free (within GRAIN); the bytes free then."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    pointer = ctypes.c_uint64()
    size = 1 << 30
    while True:
        cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        want = free.value - leave
        if want < GRAIN:
            return free.value
        size = min(size, want // GRAIN * GRAIN)
        if cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)):
            if size <= GRAIN:
                return free.value
            size = max(GRAIN, size // 2 // GRAIN * GRAIN)  # halved, in whole grains: it reaches GRAIN


if __name__ == "__main__":
    main()
