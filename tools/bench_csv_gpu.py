"""Time kernel/csv.cu's kernels in GB/s of text, with CUDA events (needs nvcc, pycuda and a GPU).
Run by tools/gpu-check.sh's `parsers` stage (BENCHMARKS.md section 3: csv.cu's kernels).

    python tools/bench_csv_gpu.py IN_CSV [--block-mb 4 8 16] [--streams 1 3] [--repeats 7] [--json PATH]

IN_CSV is an input file (`python -m cnnlab generate --images 1000` writes ~190 MB). Its first line
(N) is dropped and the rest cut into blocks at line ends, counted on the host and copied to the
device once; then the parse of all blocks is timed, on one stream or dealt over several streams (a
stream and a scratch each). "kernels" queues every launch behind a long memset first, so the
figure is the GPU's time alone; "launched" is what launching from Python as the blocks come gives.
The first pass is checked against float() on a sample of rows. Also printed: each kernel's time for
one block, and the host-to-device copy rate from page-locked memory, the pipeline's real bound.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cnnlab.cuda.csv_parser import STATUS_DTYPE, CsvParser, read_status, scratch_bytes  # noqa: E402

GATE_BYTES = 16 << 30  # a memset of ~6 ms that holds the queue while Python launches behind it
STAGES = ["tile_summaries", "scan_tiles", "index_rows", "split_rows", "parse_fields"]


def cut(data: bytes, approx: int) -> list[tuple[int, int]]:
    """(start, end) of blocks of about `approx` bytes, each ending just after a '\\n'."""
    spans, start = [], 0
    while start < len(data):
        end = data.find(b"\n", start + approx)
        end = len(data) if end < 0 else end + 1
        spans.append((start, end))
        start = end
    return spans


class Blocks:
    """The text cut in blocks, on the device at 16-byte aligned offsets, with images and a status per block."""

    def __init__(self, driver: Any, body: bytes, block_bytes: int) -> None:
        self.driver = driver
        self.spans = cut(body, block_bytes)
        self.rows = [sum(1 for line in body[a:b].split(b"\n") if line.strip()) for a, b in self.spans]
        self.offsets = np.cumsum([0] + [-(-(b - a) // 16) * 16 for a, b in self.spans]).tolist()
        self.first_rows = np.cumsum([0, *self.rows[:-1]]).tolist()
        self.host = driver.pagelocked_empty(self.offsets[-1], np.uint8)
        for (a, b), offset in zip(self.spans, self.offsets):
            self.host[offset : offset + b - a] = np.frombuffer(body, np.uint8, b - a, a)
        self.text = driver.mem_alloc(self.offsets[-1])
        self.images = driver.mem_alloc(sum(self.rows) * 800)
        self.statuses = driver.mem_alloc(len(self.spans) * STATUS_DTYPE.itemsize)
        self.host_status = driver.pagelocked_empty(len(self.spans), STATUS_DTYPE)
        self.stream = driver.Stream()
        self.start, self.end = driver.Event(), driver.Event()
        self.max_bytes, self.max_rows = max(b - a for a, b in self.spans), max(self.rows)

    def copy_in(self) -> float:
        """Copy the text in from page-locked memory; the copy's time."""
        self.start.record(self.stream)
        self.driver.memcpy_htod_async(self.text, self.host, self.stream)
        self.end.record(self.stream)
        self.end.synchronize()
        return self.end.time_since(self.start) / 1e3

    def args(self, i: int) -> tuple:
        """parse()'s arguments after the stream, for block i."""
        (a, b), status = self.spans[i], int(self.statuses) + i * STATUS_DTYPE.itemsize
        return int(self.text) + self.offsets[i], b - a, self.images, self.first_rows[i], self.rows[i], status

    def parse_all(self, parsers: list[Any], streams: list[Any], done: list[Any], gate: Any | None) -> float:
        """Every block, dealt over the streams; the time from the first launch to the last kernel's end."""
        if gate is not None:
            self.driver.memset_d32_async(gate, 0, GATE_BYTES // 4, self.stream)
        self.start.record(self.stream)
        for lane_stream in streams:
            lane_stream.wait_for_event(self.start)
        for i in range(len(self.spans)):
            parsers[i % len(parsers)].parse(streams[i % len(parsers)], *self.args(i))
        for event, lane_stream in zip(done, streams):
            event.record(lane_stream)
            self.stream.wait_for_event(event)
        self.end.record(self.stream)
        self.end.synchronize()
        return self.end.time_since(self.start) / 1e3

    def check(self, body: bytes) -> int:
        """Every block good and a sample of rows float() bit for bit (or listed HOST); the HOST fields' count."""
        self.driver.memcpy_dtoh(self.host_status, self.statuses)
        results = [read_status(self.host_status[i : i + 1]) for i in range(len(self.spans))]
        assert all(r.bad_row is None and r.lines == n for r, n in zip(results, self.rows)), "a block was refused"
        values = np.empty((sum(self.rows), 100))
        self.driver.memcpy_dtoh(values, self.images)
        lines = [line for line in body.split(b"\n") if line.strip()]
        listed = {(self.first_rows[i] + int(f["row"]), int(f["field"])) for i, r in enumerate(results) for f in r.host_fields}
        for row in np.random.default_rng().choice(len(lines), min(2000, len(lines)), replace=False).tolist():
            want = np.array([float(v) for v in lines[row].rstrip(b"\r").split(b",")])
            same = values[row].view(np.uint64) == want.view(np.uint64)
            assert all(same[f] or (row, f) in listed for f in range(100)), f"row {row} differs from float()"
        return len(listed)

    def stages(self, parser: Any, gate: Any) -> list[float]:
        """Each kernel's time in microseconds for one block (queued behind the gate), the median over the blocks."""
        marks = [self.driver.Event() for _ in range(len(STAGES) - 1)]
        times = []
        for i in range(len(self.spans)):
            self.driver.memset_d32_async(gate, 0, GATE_BYTES // 64, self.stream)
            self.start.record(self.stream)
            parser.parse(self.stream, *self.args(i), marks=marks)
            self.end.record(self.stream)
            self.end.synchronize()
            points = [self.start, *marks, self.end]
            times.append([points[k + 1].time_since(points[k]) * 1e3 for k in range(len(STAGES))])
        return np.median(np.array(times), axis=0).tolist()

    def free(self) -> None:
        for allocation in (self.text, self.images, self.statuses):
            allocation.free()
        self.host.base.free()
        self.host_status.base.free()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("--block-mb", type=float, nargs="+", default=[4, 8, 16])
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json")
    args = parser.parse_args()

    import pycuda.driver as driver

    driver.init()
    device = driver.Device(0)
    context = device.retain_primary_context()
    context.push()
    report: dict[str, Any] = {"device": device.name(), "input": args.input, "runs": []}
    try:
        major, minor = device.compute_capability()
        with tempfile.TemporaryDirectory() as folder:
            fatbin = Path(folder) / "csv.fatbin"
            command = ["nvcc", "-fatbin", f"-arch=sm_{major}{minor}", "-std=c++17", "-O3", f"-I{ROOT / 'kernel'}", "-o", str(fatbin)]
            subprocess.run([*command, str(ROOT / "kernel" / "csv.cu")], check=True)
            module = driver.module_from_file(str(fatbin))
        raw = Path(args.input).read_bytes()
        body = raw[raw.index(b"\n") + 1 :]
        print(f"{device.name()}: {len(body) / 1e6:.1f} MB of text", flush=True)
        gate = driver.mem_alloc(GATE_BYTES)
        for block_mb in args.block_mb:
            blocks = Blocks(driver, body, int(block_mb * (1 << 20)))
            h2d = blocks.offsets[-1] / min(blocks.copy_in() for _ in range(3)) / 1e9
            for count in args.streams:
                scratch = [driver.mem_alloc(scratch_bytes(blocks.max_bytes, blocks.max_rows)) for _ in range(count)]
                parsers = [CsvParser(module, s, blocks.max_bytes, blocks.max_rows) for s in scratch]
                streams, done = [driver.Stream() for _ in range(count)], [driver.Event() for _ in range(count)]
                blocks.parse_all(parsers, streams, done, None)
                listed = blocks.check(body)
                kernels = statistics.median(blocks.parse_all(parsers, streams, done, gate) for _ in range(args.repeats))
                launched = statistics.median(blocks.parse_all(parsers, streams, done, None) for _ in range(args.repeats))
                run = {
                    "block_mb": block_mb, "blocks": len(blocks.spans), "streams": count, "bytes": len(body), "host_fields": listed,
                    "kernels_s": kernels, "launched_s": launched, "kernels_gb_s": len(body) / kernels / 1e9,
                    "launched_gb_s": len(body) / launched / 1e9, "h2d_gb_s": h2d,
                }
                print(
                    f"block {block_mb:5.1f} MB x {len(blocks.spans):3d}, {count} stream(s): kernels {run['kernels_gb_s']:7.1f} GB/s "
                    f"({kernels * 1e3:.2f} ms), launched {run['launched_gb_s']:7.1f} GB/s; H2D {h2d:.1f} GB/s; "
                    f"{listed} HOST fields; sampled rows exact",
                    flush=True,
                )
                if count == 1:
                    run["stage_us"] = dict(zip(STAGES, blocks.stages(parsers[0], gate)))
                    print("    one block (us): " + ", ".join(f"{n} {t:.1f}" for n, t in run["stage_us"].items()), flush=True)
                report["runs"].append(run)
                for allocation in scratch:
                    allocation.free()
            blocks.free()
        gate.free()
    finally:
        context.pop()
        context.detach()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
