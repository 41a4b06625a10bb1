"""`cnnlab bench`'s start-up rows: whole processes on the default data, from exec to exit, beside the floor that cuda
mode cannot go under: the driver's start (cuInit and the primary context, through ctypes, as a few lines of C would)
timed inside a bare interpreter. That interpreter is timed as a whole process too: its exit, where the kernel closes
the driver's files, tears the context down, which cuda mode leaves to a helper (cnnlab/cuda/teardown.py).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cnnlab.bench.report import BenchOptions, Startup
from cnnlab.cuda.gpus import VISIBLE
from cnnlab.resources import resource_dir

# The driver's start alone, in a bare interpreter (-S: no site, so nothing but ctypes is imported): prints its seconds.
DRIVER_START = """
import ctypes, time
start = time.perf_counter()
cuda = ctypes.CDLL("libcuda.so.1")
device, context = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0
print(time.perf_counter() - start)
"""


SETTLE_SECONDS = 0.5


def _startup(name: str, seconds: list[float]) -> Startup:
    return Startup(name, statistics.median(seconds), (min(seconds), max(seconds)))


def _wall(command: list[str]) -> float:
    """A command's seconds, exec to exit, after a settle: a cuda run's helper tears the driver down just after the run
    ends, and the next run would share the GPU with that."""
    time.sleep(SETTLE_SECONDS)
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def bench_startup(options: BenchOptions) -> tuple[list[Startup], list[str]]:
    """The floor (where a GPU answers), then cnnlab cpu and cuda on the default data, each the median of the repeats
    after a run that warms the page cache and the bytecode; notes on what did not run."""
    rows, notes = [], []
    floor, driver_start = [], []
    # The driver shown only GPU 0, as `cnnlab cuda` shows it (gpus.show_only): cuInit starts every GPU it sees.
    shown = os.environ if VISIBLE in os.environ else {**os.environ, VISIBLE: "0"}
    for _ in range(options.repeats):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-S", "-c", DRIVER_START], capture_output=True, text=True, env=shown)
        floor.append(time.perf_counter() - start)
        if done.returncode != 0:
            notes.append("start-up floor not measured: no CUDA driver or GPU answered")
            break
        driver_start.append(float(done.stdout))
    if len(driver_start) == options.repeats:
        rows.append(_startup("floor: cuInit and the primary context alone (ctypes, in C's time)", driver_start))
        rows.append(_startup("a bare process that starts the driver, exec to exit (its exit tears down)", floor))
    data = resource_dir("data")
    with tempfile.TemporaryDirectory(prefix="cnnlab-bench-") as folder:
        for mode in ("cpu", "cuda") if rows else ("cpu",):
            command = [sys.executable, "-m", "cnnlab", mode, str(data / "cnn.csv"), str(data / "in.csv"), str(Path(folder) / "out.csv")]
            try:
                _wall(command)
                seconds = [_wall(command) for _ in range(options.repeats)]
            except subprocess.CalledProcessError as error:
                notes.append(f"start-up of cnnlab {mode} not measured: {(error.stderr or b'').decode().strip()[:200]}")
                continue
            rows.append(_startup(f"cnnlab {mode}, the default data (4 images), whole process", seconds))
    return rows, notes
