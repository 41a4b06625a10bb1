"""What `cnnlab bench` measures, as types: a Figure per row with its traffic model, the options, the
report; and how a report is shown: the table, the JSON, the plot. The measurements are rows.py's,
gpu.py's and text.py's (the rows that read CSV text).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

import numpy as np

from cnnlab.errors import UsageError
from cnnlab.files.safety import AtomicOutput
from cnnlab.resources import install_command

ROWS = ("cpu", "reader", "csv", "startup", "lab", "pinned", "npy", "resident", "bounds", "api", "gpus", "kernels", "peers")
GPU_ROWS = ("lab", "pinned", "npy", "resident", "bounds")  # one CudaContext's (the gpus rows need the driver alone)
API_IMAGES = (100, 1000, 10000)  # the api rows' sizes: a notebook's call, small to large
# Keys of figures that others are multiples of: a peer's speed, or the API's kept context, not a hardware bound.
REFERENCES = ("loadtxt", "from_chars-1", "from_chars", *(f"context-{count}" for count in API_IMAGES))
LADDER_ROWS = ("kernels", "peers")  # shown in the ladder's own table
D2D_BOUND = "d2d"  # the key of the one device-to-device bound: the resident row, the ladder's rungs and their peers are shares of it


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
    repeat_range: tuple[float, float] | None = None  # images/s of the slowest and the fastest repeat
    check: str | None = None  # how the outputs compared with the CPU backend's, where they were checked
    device_bytes: int | None = None  # a whole run's: the most device memory its buffers held (its CUDA context's own aside)

    @property
    def bytes_per_second(self) -> float | None:
        return None if self.bytes_per_image is None else self.images_per_second * self.bytes_per_image

    @property
    def flops_per_second(self) -> float | None:
        return None if self.flops_per_image is None else self.images_per_second * self.flops_per_image


class Traffic(TypedDict, total=False):
    """The traffic model that several figures share, passed to each Figure as its fields of the same names."""

    bytes_per_image: float
    flops_per_image: float


@dataclass(frozen=True)
class Startup:
    """A start-up row: seconds from a process's exec to its exit (median of the repeats, and their range), or the
    floor that cuda mode's cannot go under, the driver's start alone (the rows' gaps are measured from it)."""

    name: str
    seconds: float
    repeat_range: tuple[float, float]


@dataclass
class BenchOptions:
    images: int = 65536
    cpu_images: int = 16384
    lab_images: int = 2000
    reader_images: int = 5500  # ~1.03 GB of text: the reader rows' file spans far more than the caches
    csv_images: int = 2000
    repeats: int = 5
    rows: tuple[str, ...] = ROWS
    sweep: tuple[int, ...] = ()  # batch sizes for the plot
    chunk_images: int | None = None  # the CUDA context's chunk and stream count; None: LaunchConfig's
    streams: int | None = None
    check_images: int = 256  # images whose outputs each rung of the ladder is checked on against the CPU
    threads: int | None = None  # host threads of the cpu and reader rows; None: every core this process may run on


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
    startup: list[Startup] = field(default_factory=list)
    sweep: Sweep = field(default_factory=Sweep)
    notes: list[str] = field(default_factory=list)
    device: str | None = None
    fp64_peak: float | None = None  # FLOP/s of the device's FP64 units (not its tensor cores), where known
    machine: str = field(default_factory=platform.machine)
    python: str = field(default_factory=platform.python_version)
    numpy: str = np.__version__


def alternated_seconds(runs: list[Callable[[], object]], repeats: int, settle: float = 0.0) -> list[list[float]]:
    """The seconds of each run's `repeats` calls, the runs taking turns after one more call each that warms the caches and
    is not counted: a slower spell of the machine then slows each run alike, and their ratios, turn by turn, hold.
    `settle`: seconds waited, untimed, before each call, so that what a call leaves running (a GPU's teardown) is done."""
    seconds: list[list[float]] = [[] for _ in runs]
    for turn in range(repeats + 1):
        for run, times in zip(runs, seconds):
            time.sleep(settle)
            start = time.perf_counter()
            run()
            if turn:
                times.append(time.perf_counter() - start)
    return seconds


def repeat_seconds(run: Callable[[], object], repeats: int) -> list[float]:
    """The seconds of each of `repeats` calls of `run`, after one more that warms the caches and is not counted."""
    return alternated_seconds([run], repeats)[0]


def median_rate(images: int, run: Callable[[], object], repeats: int) -> float:
    """Images per second of `run` (which handles `images` images), median of `repeats` after one warm-up."""
    return images / statistics.median(repeat_seconds(run, repeats))


def rate_and_range(images: int, seconds: list[float]) -> tuple[float, tuple[float, float]]:
    """Images per second over the repeats' `seconds`: the median, and the slowest and the fastest repeat's."""
    return images / statistics.median(seconds), (images / max(seconds), images / min(seconds))


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


def relative_text(row: dict[str, Any]) -> str:
    """What a row's ratio is, and to what: a share of the hardware bound it names, or a multiple of a reference."""
    if row["of_bound"] is None:
        return "-"
    if row["bound"] in REFERENCES:
        return f"{row['of_bound']:.1f}x {row['bound']}"
    return f"{row['of_bound']:.1%} of {row['bound']}"


def format_table(report: BenchReport) -> str:
    """Every figure but the ladder's, then the ladder's table where there is one, then the notes."""
    lines = [f"{'figure':<66} {'MB/s':>10} {'images/s':>14} {'relative to':>17} {'x lab':>8} {'GPU MiB':>8}"]
    rows = ratios(report)
    for row in rows:
        if row["row"] in LADDER_ROWS:
            continue
        of_lab = f"{row['of_lab']:.1f}" if row["of_lab"] is not None else "-"
        rate = f"{row['bytes_per_second'] / 1e6:,.0f}" if row["bytes_per_second"] else "-"
        memory = f"{row['device_bytes'] / (1 << 20):,.1f}" if row["device_bytes"] is not None else "-"
        lines.append(
            f"{row['name'][:66]:<66} {rate:>10} {row['images_per_second']:>14,.0f} {relative_text(row):>17} {of_lab:>8} {memory:>8}"
        )
    if any(figure.bound for figure in report.figures):
        lines.append(
            "relative to: a share of the bound the row names (memory: reading the images once; h2d, d2d: the copy bounds; "
            "read, h2d-text: the CSV bounds), or a multiple of a reference (loadtxt: numpy.loadtxt on the same file's first "
            "images; from_chars-1, from_chars: std::from_chars on the same text, one thread and the run's; context-N: "
            "CudaContext.forward on N images, the context made beforehand); GPU MiB: a whole run's peak device memory, its "
            "buffers' (the CUDA context's own, ~530 MiB on an H200, aside)"
        )
    if report.startup:
        floor = report.startup[0].seconds if report.startup[0].name.startswith("floor") else None
        lines += ["", f"{'start-up':<66} {'seconds':>10} {'(fastest..slowest)':>20} {'over the floor':>15}"]
        for startup in report.startup:
            over = "-" if floor is None or startup.name.startswith(("floor", "the interpreter")) else f"{startup.seconds - floor:+.3f} s"
            shown = f"({startup.repeat_range[0]:.3f}..{startup.repeat_range[1]:.3f})"
            lines.append(f"{startup.name[:66]:<66} {startup.seconds:>10.3f} {shown:>20} {over:>15}")
    if any(row["row"] in LADDER_ROWS for row in rows):
        lines += ["", format_ladder(report)]
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines)


def import_pyplot(needed_by: str = "--plot") -> Any:
    """matplotlib's pyplot, drawing to files only; a UsageError saying how to install it where it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(f"{needed_by} needs matplotlib: {install_command('plot')}") from None
    return plt


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def format_ladder(report: BenchReport) -> str:
    """The optimization ladder: each rung's images/s (median, and the slowest..fastest repeat), GB/s of
    its own traffic model, its share of the device-to-device bound and of the FP64 peak, its speed-up
    over the rung below and its check; the peers beside it; and the best rung against the best peer."""
    header = f"{'kernel':<46} {'images/s':>12} {'(slowest..fastest)':>23} {'GB/s':>7} {'of D2D':>7} {'of FP64':>8} {'x below':>8}  check"
    lines, below = [header], None
    rows = [row for row in ratios(report) if row["row"] in LADDER_ROWS]
    rungs = [row for row in rows if row["row"] == "kernels" and row["key"] is None]
    for row in rows:
        rate = row["images_per_second"]
        shown = "" if row["repeat_range"] is None else f"({row['repeat_range'][0]:,.0f}..{row['repeat_range'][1]:,.0f})"
        gbs = f"{row['bytes_per_second'] / 1e9:,.0f}" if row["bytes_per_second"] else "-"
        speedup = f"{rate / below:.2f}" if row in rungs and below else "-"
        lines.append(
            f"{row['name'][:46]:<46} {rate:>12,.0f} {shown:>23} {gbs:>7} {_percent(row['of_bound']):>7} "
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
        with AtomicOutput(plot_path, binary=True) as out:
            draw_plot(report).savefig(out, format="png", dpi=120)


def draw_plot(report: BenchReport) -> Any:
    """The figure `bench --plot` saves, a panel for each kind of row that ran: each row's images/s beside its bound or
    reference, on a log scale; where the GPU ran, images/s against the images per compute() call; the ladder."""
    plt = import_pyplot()
    every_row = ratios(report)
    rows = [row for row in every_row if row["row"] not in LADDER_ROWS]
    ladder = [row for row in every_row if row["row"] in LADDER_ROWS and row["key"] is None]
    sweeps = {name: points for name, points in asdict(report.sweep).items() if points}
    drawers = [draw for draw, present in ((_plot_rows, rows), (_plot_sweep, sweeps), (_plot_ladder, ladder)) if present]
    height = 1.2 + 0.35 * max(len(rows), len(ladder), 4)
    figure, axes = plt.subplots(1, max(1, len(drawers)), figsize=(8 + 6 * max(0, len(drawers) - 1), height), squeeze=False)
    for draw, panel in zip(drawers, axes[0]):
        draw(panel, report, every_row)
    if not drawers:  # nothing ran: the figure says why
        axes[0][0].axis("off")
        axes[0][0].text(0, 0.5, "\n".join(["no rows ran", *report.notes])[:2000], fontsize=8, va="center", wrap=True)
    figure.tight_layout()
    return figure


def _plot_rows(bars: Any, report: BenchReport, every_row: list[dict[str, Any]]) -> None:
    """Each row's images/s beside its bound or reference, on a log scale."""
    keyed = {row["key"]: row for row in every_row if row["key"]}
    rows = [row for row in every_row if row["row"] not in LADDER_ROWS]
    positions = range(len(rows))[::-1]  # the table's order, top to bottom
    bars.barh(list(positions), [row["images_per_second"] for row in rows], color="C0")
    bounded = [(position, keyed[row["bound"]]["images_per_second"]) for position, row in zip(positions, rows) if row["bound"] in keyed]
    if bounded:
        bars.scatter(*zip(*[(rate, position) for position, rate in bounded]), marker="|", s=300, color="C3", zorder=3)
    for position, row in zip(positions, rows):
        relative = relative_text(row)
        label = f" {row['images_per_second']:,.0f}" + (f" ({relative})" if relative != "-" else "")
        bars.text(row["images_per_second"], position, label, va="center", fontsize=6)
    rates = [row["images_per_second"] for row in rows] + [rate for _, rate in bounded]
    bars.set_yticks(list(positions), [row["name"][:60] for row in rows], fontsize=7)
    bars.set(
        xscale="log",
        xlim=(min(rates) / 3, max(rates) * 8),
        xlabel="images/s (log scale); red mark: the bound or reference the row is measured against",
        title=report.device or report.machine,
    )


def _plot_sweep(sweep: Any, report: BenchReport, every_row: list[dict[str, Any]]) -> None:
    """images/s against the images per compute() call, with the lab's scheme and the copy bounds as lines."""
    for name, points in asdict(report.sweep).items():
        if points:
            sweep.plot(*zip(*points), "o-", label=f"cuda, {name}")
    for color, row in enumerate((row for row in every_row if row["row"] in ("lab", "bounds")), start=2):
        sweep.axhline(row["images_per_second"], color=f"C{color}", linestyle="--", linewidth=1, label=row["name"][:50])
    sweep.set(xscale="log", yscale="log", xlabel="images per compute() call", ylabel="images/s", title="batch sweep")
    sweep.legend(fontsize=7, loc="lower right")


def _plot_ladder(axes: Any, report: BenchReport, rows: list[dict[str, Any]]) -> None:
    """The ladder as bars of images/s (log scale), the peers beside them, the device-to-device bound and 60% of it as lines."""
    bars = [row for row in rows if row["row"] in LADDER_ROWS and row["key"] is None]
    colors = ["C0" if row["row"] == "kernels" else "C1" for row in bars]
    axes.barh(range(len(bars)), [row["images_per_second"] for row in bars], color=colors)
    axes.set_yticks(range(len(bars)), [row["name"].removeprefix("peer: ")[:48] for row in bars], fontsize=7)
    axes.invert_yaxis()
    for row in rows:
        if row["key"] == D2D_BOUND:
            axes.axvline(row["images_per_second"], color="C3", linestyle="--", linewidth=1, label="device-to-device copy bound")
            axes.axvline(0.6 * row["images_per_second"], color="C3", linestyle=":", linewidth=1, label="60% of it")
    title = f"the optimization ladder, {report.device or ''}"
    axes.set(xscale="log", xlabel="images/s, resident (blue: rungs, orange: peers)", title=title)
    axes.legend(fontsize=7, loc="upper right")
