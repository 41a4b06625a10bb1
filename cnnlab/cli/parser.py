"""The command line's parser: every command, its arguments and their help, in argparse."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

from cnnlab import __version__
from cnnlab.cli import commands
from cnnlab.errors import UsageError
from cnnlab.network import MAX_THREADS

if TYPE_CHECKING:
    from _typeshed import SupportsWrite


class _Formatter(argparse.HelpFormatter):
    """argparse's, at the width shutil.get_terminal_size would give, found without importing shutil: argparse makes a
    formatter for every argument added, and shutil's import (with its compression modules) is ~2 ms of each start-up."""

    def __init__(self, prog: str, **options: Any) -> None:
        options.setdefault("width", terminal_columns() - 2)
        super().__init__(prog, **options)


def terminal_columns() -> int:
    """$COLUMNS where set, else standard output's terminal's width, else 80: shutil.get_terminal_size's columns."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0 and sys.__stdout__ is not None:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Parser(argparse.ArgumentParser):
    """argparse, but bad usage is one line on stderr and exit status 2."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("formatter_class", _Formatter)
        super().__init__(**options)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        """--help's text, with standard output's faults reported (argparse's own printer drops them)."""
        if message:
            if file is None or file is sys.stdout:
                commands.say(message.rstrip("\n"))
            else:  # a stream a caller named
                super()._print_message(message, file)


class _CommandParser(_Parser):
    """A command's parser: its options may stand anywhere among its files (`cnnlab cpu CNN --threads 2 IN OUT`), as
    argparse's intermixed parsing reads them; the command line's parser hands a command its arguments through here."""

    _intermixed = False  # within parse_known_intermixed_args, which (before Python 3.12.8 and 3.13.1) calls this again

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._intermixed:
            return super().parse_known_args(args, namespace)
        self._intermixed = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixed = False


def _positive_int(text: str, most: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    if most is not None and value > most:
        raise argparse.ArgumentTypeError(f"expected a positive integer of at most {most}, not {text!r}")
    return value


# Threads and streams: counts the native pools and the driver hold in a C int.
_thread_count = partial(_positive_int, most=MAX_THREADS)


def _gpu(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a GPU's index (0, 1, ...), not {text!r}")
    return int(text)


def _gpus(text: str) -> str:
    if text != "all" and not all(part.isdigit() for part in text.split(",")):
        raise argparse.ArgumentTypeError(f"expected all, or GPU indices separated by commas (0,1), not {text!r}")
    return text


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, not {text!r}")
    return value


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, not {text!r}")
    return value


# Each command, what `cnnlab --help` says of it, and what adds its arguments (importing only what they need).
HELP = {
    "cpu": "run the network on the CPU",
    "cuda": "run the network with CUDA kernels on the GPU",
    "generate": "write a random CNN file and input file",
    "convert": "convert an input or output file between CSV and .npy, exactly",
    "compare": "check two output files agree (the lab's compare.py)",
    "bench": "measure every path in images/s against the hardware's bounds",
    "trace-plot": "draw a --trace file's tracks as a Gantt chart, with each resource's busy share",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; given the `command` that runs, only its arguments are added (the others are named,
    for --help and for a mistyped command), so that a run imports nothing another command needs."""
    parser = _Parser(prog="cnnlab", description="The ECE 459 Lab 3 CNN: a batched float64 forward on the CPU or a GPU.")
    parser.add_argument("--version", action="version", version=f"cnnlab {__version__}")
    subcommands = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    builders: dict[str, Callable[[Any], None]] = {
        "cpu": partial(_add_run, mode="cpu"),
        "cuda": partial(_add_run, mode="cuda"),
        "generate": _add_generate,
        "convert": _add_convert,
        "compare": _add_compare,
        "bench": _add_bench,
        "trace-plot": _add_trace_plot,
    }
    for name, add in builders.items():
        if command in (None, name) or command not in builders:
            add(subcommands)
        else:
            subcommands.add_parser(name, help=HELP[name])
    return parser


def _add_run(subcommands: Any, mode: str) -> None:
    """`cnnlab cpu` or `cnnlab cuda`: the lab's modes."""
    where = {"cpu": "native code on the CPU", "cuda": "CUDA kernels on the GPU"}[mode]
    run = subcommands.add_parser(
        mode,
        help=HELP[mode],
        description=f"Run the network with {where}: the lab's `{mode} CNN_FILE INPUT_FILE OUTPUT_FILE`. "
        f"With no files: the default data, written to {commands.DEFAULT_OUTPUTS[mode]}. stdout gets the lab's "
        "line 'N microseconds of actual work done'.",
    )
    run.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="CNN_FILE INPUT_FILE OUTPUT_FILE; '-' as INPUT_FILE reads CSV from standard input, as OUTPUT_FILE writes "
        "the outputs to standard output (the lab's timing line then goes to stderr)",
    )
    run.add_argument("--batch", type=_positive_int, help="images per compute call (default: sized to the backend)")
    run.add_argument(
        "--threads",
        type=_thread_count,
        help="host threads that read and parse the input" + (" and compute" if mode == "cpu" else "")
        + " (default: OMP_NUM_THREADS where set, else every core this process may run on)",
    )
    run.add_argument("--timing-json", metavar="PATH", help="also write the run's figures as JSON")
    run.add_argument(
        "--trace",
        metavar="FILE.json",
        help="also write the run's spans (every thread" + (", stream and kernel" if mode == "cuda" else "")
        + ") in the Chrome trace-event format, for Perfetto or chrome://tracing; a .json.gz name compresses it (docs/trace.md)",
    )
    # Reading ahead overlaps the next batch's reading with this one's compute: the GPU's, or the CPU's forward, now a few
    # percent of reading CSV (measured on 2 and 16 cores); a .npy batch is copied while the last is computed, in cache.
    run.add_argument(
        "--read-ahead",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read the next batch while this one computes (default: on; --no-read-ahead reads only while nothing computes, "
        "so the timed work, the lab's line, has the cores to itself)",
    )
    if mode == "cuda":
        from cnnlab.cuda.ladder import BY_NAME, DEFAULT_KERNEL

        run.add_argument(
            "--trace-chunks",
            action="store_true",
            help="with --trace: each chunk's copies, parse and kernels on its stream and the main thread's waits for it, not a "
            "span of each batch on each stream (costs the loop more: docs/trace.md)",
        )
        run.add_argument(
            "--host-parse",
            action="store_true",
            help="parse CSV input on the host's cores, as cpu mode does, instead of on the GPU (the default)",
        )
        gpus = run.add_mutually_exclusive_group()
        gpus.add_argument("--device", type=_gpu, metavar="N", help="the GPU that computes, counted from 0 as nvidia-smi does (default 0)")
        gpus.add_argument(
            "--devices",
            type=_gpus,
            metavar="all|N,M,...",
            help="spread each batch over several GPUs (every GPU, or those listed), the outputs in input order in one file",
        )
        run.add_argument(
            "--kernel",
            choices=list(BY_NAME),
            metavar="NAME",
            help=f"the rung of the optimization ladder that computes (docs/ladder.md; default {DEFAULT_KERNEL}, the design card's "
            f"conv2d_relu + flattened_to_dense): {', '.join(BY_NAME)}",
        )
    run.set_defaults(
        handler=commands.run, mode=mode, host_parse=False, trace_chunks=False, kernel=None, device=None, devices=None, process_ends=False
    )


def _add_generate(subcommands: Any) -> None:
    """`cnnlab generate`: the lab's generate.py."""
    from cnnlab.generate import DEFAULT_IMAGES

    gen = subcommands.add_parser(
        "generate",
        help="write a random CNN file and input file",
        description="Write cnn.csv and in.csv in the lab's layout, values uniform in [-10, 10].",
    )
    gen.add_argument("--images", type=_positive_int, default=DEFAULT_IMAGES, help=f"images in in.csv (default {DEFAULT_IMAGES})")
    gen.add_argument("--seed", type=_seed, help="random seed, a non-negative integer: the same seed gives the same files")
    gen.add_argument("--out-dir", default="input", help="folder for cnn.csv and in.csv (default input/)")
    gen.set_defaults(handler=commands.generate)


def _add_convert(subcommands: Any) -> None:
    """`cnnlab convert`."""
    conv = subcommands.add_parser(
        "convert",
        help="convert an input or output file between CSV and .npy, exactly",
        description="Convert an input file (N images) or an output file (rows of values) between the lab's CSV "
        "and numpy's .npy format, in either direction; the extension of each path names its format. "
        "Every value comes back as the same double. Every command that takes a file takes either format.",
    )
    conv.add_argument("input", metavar="IN")
    conv.add_argument("output", metavar="OUT")
    conv.set_defaults(handler=commands.convert)


def _add_compare(subcommands: Any) -> None:
    """`cnnlab compare`: the lab's compare.py."""
    from cnnlab.compare import DEFAULT_ABS_TOL, DEFAULT_REL_TOL

    cmp = subcommands.add_parser(
        "compare",
        help="check two output files agree (the lab's compare.py)",
        description="Exit 0 when both files have the same lines and values and every pair is close by "
        "math.isclose; exit 1 naming the first discrepancy and counting the values that differ. "
        "Outputs near zero are sums of large terms that cancel, so their rounding error is large "
        "relative to the value itself: a relative rule can fail there though both are right to "
        "the last bits of the terms; --abs-tol admits such pairs.",
    )
    cmp.add_argument("file_a", metavar="A")
    cmp.add_argument("file_b", metavar="B")
    for option, default, what in (("--rel-tol", DEFAULT_REL_TOL, "relative"), ("--abs-tol", DEFAULT_ABS_TOL, "absolute")):
        cmp.add_argument(option, type=_nonnegative_float, default=default, help=f"{what} tolerance (default {default:g})")
    cmp.set_defaults(handler=commands.compare)


def _add_bench(subcommands: Any) -> None:
    """`cnnlab bench`."""
    from cnnlab.bench.report import BenchOptions

    defaults = BenchOptions()
    bench = subcommands.add_parser(
        "bench",
        help="measure every path in images/s against the hardware's bounds",
        description="Measure each path in images/s (median of --repeats after a warm-up, fresh random data): "
        "cpu (the forward against reading its images once from memory, the plain C++ loop, numpy and PyTorch on the CPU), "
        "the CSV reader in MB/s against numpy.loadtxt, "
        "the lab's one image per launch, batched from page-locked memory, resident on the device, the "
        "host-to-device and device-to-device copy bounds, the optimization ladder (kernels: every rung's kernels "
        "on resident images, with GB/s, share of the device-to-device bound and of the FP64 peak, and its check "
        "against the CPU) and the peers (PyTorch eager, im2col + GEMMs, torch.compile, JAX jit, all float64, "
        "each skipped with its reason where not installed). Without a GPU only the cpu and reader rows run.",
    )
    for option, default, what in (
        ("--images", defaults.images, "images for the GPU rows"),
        ("--cpu-images", defaults.cpu_images, "images for the cpu row"),
        ("--lab-images", defaults.lab_images, "images for the one-per-launch row"),
        ("--reader-images", defaults.reader_images, "images in the CSV file for the reader rows"),
        ("--csv-images", defaults.csv_images, "images in the CSV file for the csv rows (cuda on CSV, whole run)"),
        ("--repeats", defaults.repeats, "timed repeats per figure"),
    ):
        bench.add_argument(option, type=_positive_int, default=default, help=f"{what} (default {default})")
    all_rows = ",".join(defaults.rows)
    bench.add_argument("--rows", default=all_rows, help=f"comma-separated rows to run (default all: {all_rows})")
    bench.add_argument("--seed", type=_seed, help="random seed for the data, a non-negative integer")
    bench.add_argument("--threads", type=_thread_count, help="host threads of the cpu and reader rows (default: every core)")
    bench.add_argument("--chunk-images", type=_positive_int, help="images per chunk on the GPU (default: the backend's)")
    bench.add_argument("--streams", type=_thread_count, help="CUDA streams (default: the backend's)")
    bench.add_argument("--json", metavar="PATH", help="write every number, the device and versions as JSON")
    bench.add_argument(
        "--plot",
        metavar="PNG",
        help="draw each row's images/s against its bound, and with a GPU the batch sweep (needs matplotlib: the plot extra)",
    )
    bench.set_defaults(handler=commands.bench)


def _add_trace_plot(subcommands: Any) -> None:
    """`cnnlab trace-plot`."""
    plot = subcommands.add_parser(
        "trace-plot",
        help=HELP["trace-plot"],
        description="Draw the tracks of a file `cnnlab cpu|cuda --trace` wrote (.json or .json.gz) as a Gantt chart: a row per "
        "thread and stream, spans colored by kind (read, parse, compute, kernel, copies, reduce, write), each resource's busy "
        "share of the loop in the legend, and each row's GB/s where its spans carry bytes; the busy shares are printed too "
        "(docs/trace.md). Needs matplotlib: the plot extra.",
    )
    plot.add_argument("trace", metavar="TRACE")
    plot.add_argument("png", metavar="PNG")
    plot.add_argument("--dpi", type=_positive_int, default=100, help="the picture's dots per inch (default 100)")
    plot.set_defaults(handler=commands.trace_plot)
