"""What --trace costs a run's loop: cnnlab MODE on the same files without and with --trace, in turns (A B A B ...), the
loop's seconds of each from --timing-json, and the ratio with/without taken pair by pair.

    python tools/trace_overhead.py MODE CNN_FILE INPUT_FILE --trace PATH [--runs 3] [-- MORE CNNLAB OPTIONS]

PATH (.json or .json.gz) keeps the last traced run's trace, for `cnnlab trace-plot`. Prints each run's loop seconds, the
median (min..max) of each side and of the ratio: docs/trace.md's overhead figures are this (tools/gpu-check.sh trace).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from paired_wall import spread


def loop_seconds(command: list[str], timing: Path) -> float:
    subprocess.run([*command, "--timing-json", str(timing)], stdout=subprocess.DEVNULL, check=True)
    return float(json.loads(timing.read_text())["loop_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["cpu", "cuda"])
    parser.add_argument("cnn")
    parser.add_argument("input")
    parser.add_argument("--trace", required=True, help="where the last traced run's trace is kept")
    parser.add_argument("--runs", type=int, default=3, help="runs of each, in turns (default 3)")
    parser.add_argument("options", nargs="*", help="more options for cnnlab MODE (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        command = [sys.executable, "-m", "cnnlab", args.mode, args.cnn, args.input, str(Path(work) / "out.csv"), *args.options]
        plain, traced = [], []
        for run in range(args.runs):
            plain.append(loop_seconds(command, Path(work) / "plain.json"))
            traced.append(loop_seconds([*command, "--trace", args.trace], Path(work) / "traced.json"))
            print(f"run {run + 1}: loop {plain[-1]:.3f} s without --trace, {traced[-1]:.3f} s with it", flush=True)
    print(f"without --trace   loop s {spread(plain)}")
    print(f"with --trace      loop s {spread(traced)}")
    print(f"with/without      {spread([b / a for a, b in zip(plain, traced)])}   ({args.runs} pairs, {args.mode})")


if __name__ == "__main__":
    main()
