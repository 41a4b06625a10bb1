"""Where a run's time goes, from the process's start to its exit: each phase's start and length, on its thread.
Run by tools/gpu-check.sh's `profile` stage (the default data) and `cpujob` stage (the 30,000-image job).

    python tools/profile_startup.py cpu|cuda [CNN_FILE INPUT_FILE OUTPUT_FILE] [cnnlab options]

Runs `python -m cnnlab` in this process as the command line does (the driver's start on a thread before
numpy is imported, and so on), with each phase below wrapped as its module is imported, so that nothing is
imported sooner than the command line imports it. Prints one line a phase: seconds since the process
started (the kernel's start time, as run.py's start-up figure), its length, and its thread; the last line
is the process's end, measured by the parent that ran it (exit included).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# module: the names to time in it ("Class.method" for a method)
PHASES = {
    "cnnlab.cuda.driver": ["_start"],
    "cnnlab.cli.main": ["main"],
    "cnnlab.files.labcsv": ["read_cnn"],
    "cnnlab.files.csv_reader": ["CsvImageReader.__init__", "CsvImageReader.reserve_text", "CsvImageReader.read_text",
                            "CsvImageReader.read_into", "CsvImageReader._parse", "CsvImageReader.finish",
                            "CsvImageReader.close"],
    "cnnlab.files.csv_on_device": ["CsvRangeReader.read", "CsvRangeReader._cut", "text_start"],
    "cnnlab.files.text": ["TextSource.take", "TextSource._turn", "TextSource._read_more", "TextSource._read_ahead",
                          "TextSource._read_summarized", "TextSource.close", "cut_summarized", "prefixes_of", "spans_of", "runs_of"],
    "cnnlab.files.npy": ["NpyImageReader.read_into", "NpyImageReader.map", "NpyImageReader.next_view", "NpyImageReader.finish"],
    "cnnlab.cuda.context": ["CudaContext.__init__", "CudaContext.image_buffer", "CudaContext.csv_double_buffer", "CudaContext.compute",
                            "CudaContext.close"],
    "cnnlab.cuda.csv_double_buffer": ["DeviceCsvDoubleBuffer.__init__", "DeviceCsvDoubleBuffer.start_fill", "DeviceCsvDoubleBuffer.filled",
                                      "DeviceCsvDoubleBuffer.parse", "DeviceCsvDoubleBuffer.parsed", "DeviceCsvDoubleBuffer.free"],
    "cnnlab.cuda.file_copier": ["FileCopier.__init__", "FileCopier._finish", "DeviceImageBuffer.free"],
    "cnnlab.cuda.multi_gpu": ["MultiGpuBackend.__init__", "MultiGpuBackend.image_buffer", "ShardedImageBuffer._fill",
                              "ShardedImageBuffer.free", "MultiGpuBackend.close"],
    "cnnlab.cpu.backend": ["CpuBackend.__init__", "CpuBackend.compute", "CpuBackend.close"],
    "cnnlab.run": ["run_network", "Prefetcher.close"],
    "cnnlab.run_inputs": ["open_input", "ImagesInHostBuffers.read", "NpyToDevice.read", "CsvParsedOnDevice.read"],
    "cnnlab.files.safety": ["AtomicOutput.commit"],
    "numpy": [],
}
EVENTS: list[tuple[str, float, float, str]] = []


def process_age() -> float:
    with open("/proc/self/stat") as stat:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


def timed(name: str, function: Any) -> Any:
    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        start = process_age()
        try:
            return function(*args, **kwargs)
        finally:
            EVENTS.append((name, start, process_age() - start, threading.current_thread().name))

    return run


class Wrapping(importlib.abc.MetaPathFinder):
    """After a module of PHASES is executed, its phases are wrapped; numpy's import is timed as a whole."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in PHASES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            start = process_age()
            execute(module)
            EVENTS.append((f"import {name}", start, process_age() - start, threading.current_thread().name))
            for phase in PHASES[name]:
                owner: Any = module
                *path_, attribute = phase.split(".")
                for part in path_:
                    owner = getattr(owner, part)
                setattr(owner, attribute, timed(phase, getattr(owner, attribute)))

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def main() -> int:
    if os.environ.get("CNNLAB_PROFILED") != "1":  # the parent: run the child, then add the process's end as it saw it
        begin = time.perf_counter()
        child = subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=dict(os.environ, CNNLAB_PROFILED="1"), cwd=os.getcwd())
        print(f"{'process end (exit included)':<34} at {time.perf_counter() - begin:7.3f} s (from the parent's fork)", file=sys.stderr)
        return child.returncode
    sys.path.insert(0, str(ROOT))
    sys.meta_path.insert(0, Wrapping())
    sys.argv = ["cnnlab", *sys.argv[1:]]
    from cnnlab.__main__ import main as cnnlab_main

    leave = os._exit

    def report_then_leave(status: int) -> None:  # the command line leaves through os._exit: the phases first
        calls: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for name, start, length, thread in EVENTS:
            calls.setdefault((name, thread), []).append((start, length))
        for (name, thread), made in sorted(calls.items(), key=lambda item: item[1][0][0]):
            if len(made) > 2:  # a phase of the loop: its calls together
                print(f"{name:<34} at {made[0][0]:7.3f} s  for {sum(length for _, length in made) * 1e3:8.1f} ms  "
                      f"in {len(made)} calls ({thread})", file=sys.stderr)
                continue
            for start, length in made:
                print(f"{name:<34} at {start:7.3f} s  for {length * 1e3:8.1f} ms  ({thread})", file=sys.stderr)
        print(f"{'main leaves':<34} at {process_age():7.3f} s", file=sys.stderr)
        sys.stderr.flush()
        leave(status)

    os._exit = report_then_leave
    return cnnlab_main()


if __name__ == "__main__":
    sys.exit(main())
