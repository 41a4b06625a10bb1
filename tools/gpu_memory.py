"""Where a cuda run's GPU memory goes: the context, the modules, and each buffer cnnlab allocates, for one command.

    python tools/gpu_memory.py cuda CNN INPUT OUTPUT [options of cnnlab's run]

Runs the command in this process, with NVML's count of the GPU's used memory read before the driver starts, once the
context is made, once the modules are loaded, and every 2 ms through the run (its peak); and every device allocation
cnnlab's Allocator makes, added up by what made it. Prints one table; the figures are MiB above the GPU's level before
the run (another process's memory is in that level, so run it on a GPU no one else uses).
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

MIB = 1 << 20


class Nvml:
    """NVML's used memory of GPU 0 (NVML counts GPUs as nvidia-smi does)."""

    def __init__(self) -> None:
        self._lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._lib.nvmlInit_v2()
        self._handle = ctypes.c_void_p()
        self._lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self._handle))

    def used(self) -> int:
        memory = (ctypes.c_ulonglong * 3)()  # nvmlMemory_t: total, free, used
        self._lib.nvmlDeviceGetMemoryInfo(self._handle, memory)
        return memory[2]


@dataclass
class Ledger:
    """cnnlab's device allocations: what is out, its peak, and the bytes each maker asked for."""

    out: int = 0
    peak: int = 0
    by_maker: Counter[str] = field(default_factory=Counter)
    sizes: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def allocated(self, address: int, nbytes: int) -> None:
        frames = [frame for frame in traceback.extract_stack()[:-3] if "/cnnlab/" in frame.filename]
        maker = f"{frames[-1].filename.split('/cnnlab/')[-1]}:{frames[-1].name}" if frames else "?"
        with self.lock:
            self.out += nbytes
            self.peak = max(self.peak, self.out)
            self.by_maker[maker] += nbytes
            self.sizes[address] = nbytes

    def freed(self, address: int) -> None:
        with self.lock:
            self.out -= self.sizes.pop(address, 0)


def main() -> None:
    nvml = Nvml()
    level = nvml.used()
    marks: dict[str, int] = {}
    ledger = Ledger()
    peak = [level]
    running = threading.Event()

    def sample() -> None:
        while not running.is_set():
            peak[0] = max(peak[0], nvml.used())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    import cnnlab.cuda.context as context
    import cnnlab.cuda.memory as memory

    device, free = memory.Allocator.device, memory.Allocator.free

    def counted_device(self: memory.Allocator, nbytes: int):  # type: ignore[no-untyped-def]
        allocation = device(self, nbytes)
        ledger.allocated(int(allocation), nbytes)
        return allocation

    def counted_free(self: memory.Allocator, allocation):  # type: ignore[no-untyped-def]
        if not hasattr(allocation, "nbytes"):
            ledger.freed(int(allocation))
        free(self, allocation)

    memory.Allocator.device, memory.Allocator.free = counted_device, counted_free  # type: ignore[method-assign]
    ensure = context.ensure_modules

    def marked_ensure():  # type: ignore[no-untyped-def]
        marks["before the modules"] = nvml.used()
        return ensure()

    context.ensure_modules = marked_ensure
    setup = context.DeviceSetup

    def marked_setup(*args, **kwargs):  # type: ignore[no-untyped-def]
        marks["context made, modules loaded"] = nvml.used()
        return setup(*args, **kwargs)

    context.DeviceSetup = marked_setup  # type: ignore[misc]

    from cnnlab.cli.main import main as cli_main

    sys.argv = ["cnnlab", *sys.argv[1:]]
    start = time.perf_counter()
    status = cli_main()
    wall = time.perf_counter() - start
    running.set()
    sampler.join()
    print(f"cnnlab {' '.join(sys.argv[1:])}: status {status}, {wall:.3f} s")
    for name, used in marks.items():
        print(f"  {name:<40} {(used - level) / MIB:9.1f} MiB")
    print(f"  {'peak through the run (NVML, 2 ms)':<40} {(peak[0] - level) / MIB:9.1f} MiB")
    print(f"  {'cnnlab allocations at their peak':<40} {ledger.peak / MIB:9.1f} MiB")
    for maker, nbytes in ledger.by_maker.most_common():
        print(f"    {maker:<50} {nbytes / MIB:9.1f} MiB made in all")


if __name__ == "__main__":
    main()
