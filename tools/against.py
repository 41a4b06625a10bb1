"""One cnnlab run against the same run of another checkout (an earlier commit, say), in turns: the outputs compared byte
for byte, and the wall, start-up and loop seconds of each side with their ratios, pair by pair. The `against` stage of
tools/gpu-check.sh runs it on the GPU machine; it runs on any machine with both checkouts built.

    python tools/against.py --before DIR [--pairs 5] [--label NAME] MODE CNN_FILE INPUT_FILE

Each pair runs this checkout (A) and DIR's (B) as whole processes, `python3 -m cnnlab MODE CNN_FILE INPUT_FILE OUT
--timing-json`, each with its own tree first on PYTHONPATH; an uncounted pair first warms the page cache and the
bytecode. Where NVML is at hand (nvidia-ml-py), the GPU's memory in use is sampled every 10 ms during each run, and the
peak above what was in use before it is printed. Exits 1 where the outputs differ.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from paired_wall import median_and_range


@dataclass(frozen=True)
class Run:
    """One run's figures: the whole process's wall, its start-up and loop seconds (--timing-json), its GPU memory."""

    wall: float
    startup: float
    loop: float
    gpu_bytes: int | None


@contextmanager
def gpu_memory_peak() -> Iterator[list[int]]:
    """The peak of the GPU's memory in use above its level at the start, sampled every 10 ms (one element: set at the
    end); empty where NVML is not at hand."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        yield []
        return
    start, peak, done = pynvml.nvmlDeviceGetMemoryInfo(handle).used, [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], pynvml.nvmlDeviceGetMemoryInfo(handle).used - start)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    result: list[int] = []
    try:
        yield result
    finally:
        done.set()
        thread.join()
        result.append(peak[0])


def run(tree: Path, argv: list[str], out: Path) -> Run:
    """cnnlab from `tree` on `argv` + [out], timed as a whole process."""
    timing = out.with_suffix(".json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("SITE", "")])])}
    with gpu_memory_peak() as peak:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "cnnlab", *argv, str(out), "--timing-json", str(timing)], cwd=tree, env=env,
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        wall = time.perf_counter() - start
    figures = json.loads(timing.read_text())
    return Run(wall, figures["startup_seconds"] or 0.0, figures["loop_seconds"], peak[0] if peak else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, type=Path, help="the other checkout (B), built")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--label", default="")
    parser.add_argument("mode")
    parser.add_argument("cnn_file")
    parser.add_argument("input_file")
    args = parser.parse_args()
    here, before = Path(__file__).resolve().parents[1], args.before.resolve()
    argv = [args.mode, os.path.abspath(args.cnn_file), os.path.abspath(args.input_file)]
    suffix = Path(args.input_file).suffix if Path(args.input_file).suffix == ".npy" else ".csv"
    with tempfile.TemporaryDirectory() as folder:
        outs = [Path(folder, f"a{suffix}"), Path(folder, f"b{suffix}")]
        runs: list[list[Run]] = [[], []]
        for pair in range(args.pairs + 1):
            for side, tree in enumerate((here, before)):
                figures = run(tree, argv, outs[side])
                if pair:  # the first pair warms the caches: not counted
                    runs[side].append(figures)
        same = filecmp.cmp(*outs, shallow=False)
    label = args.label or f"{args.mode} {Path(args.input_file).name}"
    print(f"== {label}: A this checkout, B {before}; {args.pairs} pairs in turns; outputs {'identical' if same else 'DIFFER'}")
    for name in ("wall", "startup", "loop"):
        a, b = ([getattr(each, name) for each in side] for side in runs)
        print(f"  {name:<8} A {median_and_range(a)}  B {median_and_range(b)}  A/B {median_and_range([x / y for x, y in zip(a, b)])}")
    for side, runs_of in zip("AB", runs):
        peaks = [each.gpu_bytes for each in runs_of if each.gpu_bytes is not None]
        if peaks:
            print(f"  GPU memory {side}: peak {max(peaks) / 2**20:,.0f} MiB above the level before the run")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
