"""`cnnlab bench`'s start-up rows: whole processes on the default data, from exec to exit, beside the interpreter's own
start and the floor that cuda mode cannot go under: the driver's start (cuInit and the primary context, through ctypes,
as a few lines of C would) timed inside a bare interpreter. That interpreter is timed as a whole process too: its exit,
where the kernel closes the driver's files, tears the context down, which cuda mode leaves to a helper
(cnnlab/cuda/teardown.py).

On a machine of several GPUs, what more of them cost to start: the driver shown 2..N GPUs in one process, a context a
thread (as `--devices` starts them), and as many processes started at once, each shown one GPU. Both are timed from the
first driver's start to the last context's, so they read against the floor: the start is the part of `--devices` that
no arrangement of threads or processes can overlap where the driver starts its GPUs one after another.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from cnnlab.bench.report import BenchOptions, Startup
from cnnlab.cuda.driver import few_queues
from cnnlab.cuda.gpus import VISIBLE, machine_count
from cnnlab.resources import resource_dir

# The driver's start alone, in a bare interpreter (-S: no site, so nothing but ctypes and threading is imported): cuInit,
# then the primary contexts of the first argv[1] GPUs it is shown, a thread each. Prints when it began and when the last
# context was ready, on the clock that every process shares (perf_counter is CLOCK_MONOTONIC).
DRIVER_START = """
import ctypes, sys, threading, time
start = time.perf_counter()
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
def retain(ordinal, started):
    device, context = ctypes.c_int(), ctypes.c_void_p()
    started.append(cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
                   and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0)
started = []
threads = [threading.Thread(target=retain, args=(ordinal, started)) for ordinal in range(int(sys.argv[1]))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
assert started.count(True) == len(threads)
print(start, time.perf_counter())
"""


DRIVER_START_TIMEOUT = 60  # seconds: a driver that has not started a GPU by then is stuck, and so is its figure


def driver_starts(shown: list[str], contexts: int = 1, script: str = DRIVER_START) -> float | None:
    """A bare interpreter for each of `shown` started at once, each shown those GPUs (CUDA_VISIBLE_DEVICES) and
    retaining the primary contexts of its first `contexts`: seconds from the first one's start of the driver to the last
    one's contexts ready; None where one fails (no driver, no such GPU) or hangs. Every one is waited for, and any
    still running when this fails (a signal, a timeout) is killed first."""
    processes: list[subprocess.Popen[str]] = []
    try:
        for gpus in shown:
            processes.append(subprocess.Popen(
                [sys.executable, "-S", "-c", script, str(contexts)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, env=few_queues({**os.environ, VISIBLE: gpus}),
            ))  # fmt: skip
        marks = [process.communicate(timeout=DRIVER_START_TIMEOUT)[0].split() for process in processes]
    except subprocess.TimeoutExpired:
        return None
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
    if any(process.returncode != 0 or len(mark) != 2 for process, mark in zip(processes, marks)):
        return None
    return max(float(ready) for _, ready in marks) - min(float(began) for began, _ in marks)


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
    """The floor (where a GPU answers), the interpreter alone, then cnnlab cpu and cuda on the default data, each the
    median of the repeats after a run that warms the page cache and the bytecode; on a machine of several GPUs, what
    2..N of them cost to start; notes on what did not run."""
    rows, notes = [], []
    floor, driver_start = [], []
    # The driver shown only GPU 0, as `cnnlab cuda` shows it (gpus.show_only): cuInit starts every GPU it sees. Each
    # process is given the hardware queues cnnlab cuda gives a context (driver.few_queues), in driver_starts.
    shown = os.environ.get(VISIBLE, "0")
    for _ in range(options.repeats):
        start = time.perf_counter()
        floor_seconds = driver_starts([shown])
        floor.append(time.perf_counter() - start)
        if floor_seconds is None:
            notes.append("start-up floor not measured: no CUDA driver or GPU answered")
            break
        driver_start.append(floor_seconds)
    driver_answered = len(driver_start) == options.repeats
    if driver_answered:
        rows.append(_startup("floor: cuInit and the primary context alone (ctypes, in C's time)", driver_start))
        rows.append(_startup("a bare process that starts the driver, exec to exit (its exit tears down)", floor))
    # The interpreter alone, as every cnnlab process pays it before any code of cnnlab's runs: its site's start-up hooks
    # (.pth files) included, which a machine's packages can make a good part of the start (docs/gpu.md, "Start-up").
    interpreter = [sys.executable, "-c", "pass"]
    _wall(interpreter)
    rows.append(_startup("the interpreter alone (python -c pass, its site's hooks included), whole process",
                         [_wall(interpreter) for _ in range(options.repeats)]))  # fmt: skip
    data = resource_dir("data")
    with tempfile.TemporaryDirectory(prefix="cnnlab-bench-") as folder:
        for mode in ("cpu", "cuda") if driver_answered else ("cpu",):
            command = [sys.executable, "-m", "cnnlab", mode, str(data / "cnn.csv"), str(data / "in.csv"), str(Path(folder) / "out.csv")]
            try:
                _wall(command)
                walls = [_wall(command) for _ in range(options.repeats)]
            except subprocess.CalledProcessError as error:
                notes.append(f"start-up of cnnlab {mode} not measured: {(error.stderr or b'').decode().strip()[:200]}")
                continue
            rows.append(_startup(f"cnnlab {mode}, the default data (4 images), whole process", walls))
    gpus = machine_count() or 0
    if driver_answered and gpus > 1:
        if VISIBLE in os.environ:
            notes.append(f"several GPUs' start not measured: {VISIBLE} is set, and the rows need every GPU")
        else:
            rows += _several_gpus(gpus, options.repeats, notes)
    return rows, notes


def _several_gpus(gpus: int, repeats: int, notes: list[str]) -> list[Startup]:
    """For 2..`gpus` GPUs, the driver's start in one process shown them all and in as many processes at once, in turns
    after a settle, each the median of `repeats`; a start that failed (a GPU taken meanwhile) is left out, with a note."""
    rows = []
    for count in range(2, gpus + 1):
        numbers = [str(gpu) for gpu in range(count)]
        measures = {
            f"driver's start: {count} GPUs in one process, a thread each": partial(driver_starts, [",".join(numbers)], count),
            f"driver's start: {count} processes at once, a GPU each": partial(driver_starts, numbers),
        }
        figures: dict[str, list[float]] = {name: [] for name in measures}
        for _ in range(repeats):
            for name, measure in measures.items():
                time.sleep(SETTLE_SECONDS)
                if (seconds := measure()) is not None:
                    figures[name].append(seconds)
        for name, seconds_each in figures.items():
            if len(seconds_each) < repeats:
                notes.append(f"{name}: {repeats - len(seconds_each)} of {repeats} starts failed and are left out")
            if seconds_each:
                rows.append(_startup(name, seconds_each))
    return rows
