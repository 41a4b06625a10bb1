"""What `cnnlab bench` measures, as types: a Figure per row with its traffic model, the options, the
report; and how a report is shown: the table, the JSON, the plot. The measurements are bench.py's
(the network's rows) and benchtext.py's (the rows that read CSV text).
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from cnnlab.filesafety import AtomicOutput

ROWS = ("cpu", "reader", "csv", "lab", "pinned", "resident", "bounds", "kernels", "peers")
GPU_ROWS = ("lab", "pinned", "resident", "bounds")
LADDER_ROWS = ("kernels", "peers")  # shown in the ladder's own table


@dataclass(frozen=True)
class Figure:
    """One row of the table, with its traffic model: the bytes and FLOPs one image costs on that path."""

    row: str
    name: str
    images_per_second: float
    bound: str | None = None  # the key of the figure that bounds this one
    key: str | None = None  # for the figures others are measured against: "h2d", "d2d", "loadtxt"
    bytes_per_image: float | None = None  # bytes moved per image through what bounds the path
    flops_per_image: float | None = None
    spread: tuple[float, float] | None = None  # images/s of the slowest and the fastest repeat
    check: str | None = None  # how the outputs compared with the CPU backend's, where they were checked

    @property
    def bytes_per_second(self) -> float | None:
        return None if self.bytes_per_image is None else self.images_per_second * self.bytes_per_image

    @property
    def flops_per_second(self) -> float | None:
        return None if self.flops_per_image is None else self.images_per_second * self.flops_per_image


@dataclass
class BenchOptions:
    images: int = 65536
    cpu_images: int = 2048
    lab_images: int = 2000
    reader_images: int = 500
    csv_images: int = 2000
    repeats: int = 5
    rows: tuple[str, ...] = ROWS
    sweep: tuple[int, ...] = ()  # batch sizes for the plot
    chunk_images: int | None = None  # the CUDA context's chunk and stream count; None: LaunchConfig's
    streams: int | None = None
    check_images: int = 256  # images whose outputs each rung of the ladder is checked on against the CPU


@dataclass
class Sweep:
    """images/s against images per compute() call, for the plot: (images, images/s) pairs."""

    pinned: list[tuple[int, float]] = field(default_factory=list)
    resident: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class BenchReport:
    """Everything one `cnnlab bench` measured, where, and why any rows did not run."""

    options: BenchOptions
    figures: list[Figure] = field(default_factory=list)
    sweep: Sweep = field(default_factory=Sweep)
    notes: list[str] = field(default_factory=list)
    device: str | None = None
    fp64_peak: float | None = None  # FLOP/s of the device's FP64 units (not its tensor cores), where known
    machine: str = field(default_factory=platform.machine)
    python: str = field(default_factory=platform.python_version)
    numpy: str = np.__version__


def median_rate(images: int, run: Callable[[], object], repeats: int) -> float:
    """Images per second of `run` (which handles `images` images), median of `repeats` after one warm-up."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return images / statistics.median(times)


def ratios(report: BenchReport) -> list[dict[str, Any]]:
    """Each figure as a dict, with its throughput and its ratios to its bound and to the lab scheme."""
    keyed = {figure.key: figure for figure in report.figures if figure.key}
    lab = next((figure.images_per_second for figure in report.figures if figure.row == "lab"), None)
    rows = []
    for figure in report.figures:
        bound = keyed.get(figure.bound) if figure.bound else None
        rows.append(
            {
                **asdict(figure),
                "bytes_per_second": figure.bytes_per_second,
                "flops_per_second": figure.flops_per_second,
                "of_bound": figure.images_per_second / bound.images_per_second if bound else None,
                "of_lab": figure.images_per_second / lab if lab else None,
                "of_fp64": figure.flops_per_second / report.fp64_peak if report.fp64_peak and figure.flops_per_second else None,
            }
        )
    return rows


def format_table(report: BenchReport) -> str:
    """Every figure but the ladder's, then the ladder's table where there is one, then the notes."""
    lines = [f"{'figure':<66} {'MB/s':>10} {'images/s':>14} {'of bound':>9} {'x lab':>8}"]
    for row in ratios(report):
        if row["row"] in LADDER_ROWS:
            continue
        of_bound = f"{row['of_bound']:.1%}" if row["of_bound"] is not None else "-"
        of_lab = f"{row['of_lab']:.1f}" if row["of_lab"] is not None else "-"
        rate = f"{row['bytes_per_second'] / 1e6:,.0f}" if row["bytes_per_second"] else "-"
        lines.append(f"{row['name'][:66]:<66} {rate:>10} {row['images_per_second']:>14,.0f} {of_bound:>9} {of_lab:>8}")
    if any(row["row"] in LADDER_ROWS for row in ratios(report)):
        lines += ["", format_ladder(report)]
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def format_ladder(report: BenchReport) -> str:
    """The optimization ladder: each rung's images/s (median, and the slowest..fastest repeat), GB/s of
    its own traffic model, its share of the device-to-device bound and of the FP64 peak, its speed-up
    over the rung below and its check; the peers beside it; and the best rung against the best peer."""
    header = f"{'kernel':<46} {'images/s':>12} {'(slowest..fastest)':>23} {'GB/s':>7} {'of D2D':>7} {'of FP64':>8} {'x below':>8}  check"
    lines, below = [header], None
    rows = [row for row in ratios(report) if row["row"] in LADDER_ROWS or row["key"] == "d2d"]
    rungs = [row for row in rows if row["row"] == "kernels" and row["key"] is None]
    for row in rows:
        rate = row["images_per_second"]
        spread = "" if row["spread"] is None else f"({row['spread'][0]:,.0f}..{row['spread'][1]:,.0f})"
        gbs = f"{row['bytes_per_second'] / 1e9:,.0f}" if row["bytes_per_second"] else "-"
        speedup = f"{rate / below:.2f}" if row in rungs and below else "-"
        lines.append(
            f"{row['name'][:46]:<46} {rate:>12,.0f} {spread:>23} {gbs:>7} {_percent(row['of_bound']):>7} "
            f"{_percent(row['of_fp64']):>8} {speedup:>8}  {row['check'] or ''}"
        )
        below = rate if row in rungs else below
    best = max(rungs, key=lambda row: row["images_per_second"], default=None)
    peer = max((row for row in rows if row["row"] == "peers"), key=lambda row: row["images_per_second"], default=None)
    if best is not None:
        rate = best["images_per_second"]
        summary = f"best rung: {best['name']}, {rate:,.0f} images/s, {_percent(best['of_bound'])} of the D2D bound"
        if peer is not None:
            summary += f", {rate / peer['images_per_second']:.2f}x the best peer ({peer['name']})"
        lines.append(summary)
    return "\n".join(lines)


def write_report(report: BenchReport, json_path: str | None, plot_path: str | None) -> None:
    if json_path:
        with AtomicOutput(json_path) as out:
            json.dump({**asdict(report), "figures": ratios(report)}, out, indent=2)
            out.write("\n")
    if plot_path:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("cnnlab: note: --plot needs matplotlib; no plot drawn", file=sys.stderr)
            return
        rows = ratios(report)
        ladder = [row for row in rows if row["row"] in LADDER_ROWS and row["key"] is None]
        panels = [panel for panel, present in ((_plot_sweep, any(asdict(report.sweep).values())), (_plot_ladder, ladder)) if present]
        figure, axes = plt.subplots(1, len(panels) or 1, figsize=(7 * (len(panels) or 1), 4.5), squeeze=False)
        for draw, panel_axes in zip(panels, axes[0]):
            draw(panel_axes, report, rows)
        figure.tight_layout()
        with AtomicOutput(plot_path, binary=True) as out:
            figure.savefig(out, format="png", dpi=120)


def _plot_sweep(axes: Any, report: BenchReport, rows: list[dict[str, Any]]) -> None:
    """images/s against images per compute() call, with the lab's scheme and the copy bounds as lines."""
    for row, points in asdict(report.sweep).items():
        if points:
            axes.plot(*zip(*points), "o-", label=f"cuda, {row}")
    for color, row in enumerate((row for row in rows if row["row"] in ("lab", "bounds")), start=2):
        axes.axhline(row["images_per_second"], color=f"C{color}", linestyle="--", linewidth=1, label=row["name"][:50])
    axes.set(xscale="log", yscale="log", xlabel="images per compute() call", ylabel="images/s", title=report.device or "")
    axes.legend(fontsize=7)


def _plot_ladder(axes: Any, report: BenchReport, rows: list[dict[str, Any]]) -> None:
    """The ladder as bars of images/s (log scale), the peers beside them, the device-to-device bound and 60% of it as lines."""
    bars = [row for row in rows if row["row"] in LADDER_ROWS and row["key"] is None]
    colors = ["C0" if row["row"] == "kernels" else "C1" for row in bars]
    axes.barh(range(len(bars)), [row["images_per_second"] for row in bars], color=colors)
    axes.set_yticks(range(len(bars)), [row["name"].removeprefix("peer: ")[:48] for row in bars], fontsize=7)
    axes.invert_yaxis()
    for row in rows:
        if row["key"] == "d2d":
            axes.axvline(row["images_per_second"], color="C3", linestyle="--", linewidth=1, label="device-to-device copy bound")
            axes.axvline(0.6 * row["images_per_second"], color="C3", linestyle=":", linewidth=1, label="60% of it")
    title = f"the optimization ladder, {report.device or ''}"
    axes.set(xscale="log", xlabel="images/s, resident (blue: rungs, orange: peers)", title=title)
    axes.legend(fontsize=7, loc="upper right")
