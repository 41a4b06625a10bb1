"""The command line: `cnnlab cpu|cuda|generate|compare|bench`, the lab's commands and a few more.

This is the only place where errors become one-line messages and exit statuses: 0 success,
1 outputs that differ (compare), 2 bad usage or a failed run, 130/143/129 interrupted (SIGINT/SIGTERM/SIGHUP),
141 standard output closed early (as a Unix tool killed by SIGPIPE; quietly).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from cnnlab import __version__, interrupts
from cnnlab.errors import (
    STANDARD_STREAM,
    CnnlabError,
    DeviceLostError,
    OutputFileError,
    ResourceError,
    UsageError,
    memory_limit_note,
    shown,
)
from cnnlab.filesafety import AtomicOutput, output_target, refuse_same_file, writing
from cnnlab.formats import trailing_data_note
from cnnlab.labcsv import read_cnn
from cnnlab.ladder import BY_NAME, DEFAULT_KERNEL
from cnnlab.network import Backend, Cnn
from cnnlab.resources import resource_dir
from cnnlab.run import run_network

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
DEFAULT_OUTPUTS = {"cpu": Path("out/out.csv"), "cuda": Path("out/out_cuda.csv")}


class _Parser(argparse.ArgumentParser):
    """argparse, but bad usage is one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")

    def _print_message(self, message: str, file: TextIO | None = None) -> None:
        """--help's text, with standard output's faults reported (argparse's own printer drops them)."""
        if message:
            _say(message.rstrip("\n"), file or sys.stdout)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return value


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


def make_backend(mode: str, cnn: Cnn, batch_size: int | None, host_parse: bool = False, kernel: str | None = None) -> Backend:
    """The backend for `mode`; the CUDA one, running rung `kernel` of the ladder, is imported only when asked for."""
    if mode == "cpu":
        from cnnlab.cpu import CpuBackend

        return CpuBackend(cnn, batch_size)
    from cnnlab.cuda import CudaContext, LaunchConfig

    return CudaContext(cnn, batch_size, LaunchConfig(kernel=kernel or DEFAULT_KERNEL), parse_csv=not host_parse)


def _warn_trailing(input_path: str | os.PathLike, images: int, line: int | None) -> None:
    note = trailing_data_note(input_path, images, line)
    if note is not None:
        print(f"cnnlab: warning: {note}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    files = args.files or [
        resource_dir("data") / "cnn.csv",
        resource_dir("data") / "in.csv",
        DEFAULT_OUTPUTS[args.mode],
    ]
    if len(files) != 3:
        raise UsageError(f"{args.mode} takes CNN_FILE INPUT_FILE OUTPUT_FILE, or no files for the default data")
    cnn_path, input_path, output_path = files
    refuse_same_file(output_path, {"input file": input_path, "CNN file": cnn_path})
    output = output_target(output_path)  # a folder that cannot take the output is found before the run, not after it
    if args.timing_json is not None:
        timing = output_target(args.timing_json)
        if output.descriptor is not None and timing.descriptor == output.descriptor:
            raise UsageError(f"the output and --timing-json cannot both be written to descriptor {output.descriptor} (-)")
        refuse_same_file(args.timing_json, {"input file": input_path, "CNN file": cnn_path, "output file": output_path})
    cnn = read_cnn(cnn_path)
    with make_backend(args.mode, cnn, args.batch, args.host_parse, args.kernel) as backend:
        interrupts.raise_if_received()  # the backend's modules were imported just now
        stats = run_network(backend, input_path, output_path, read_ahead=args.read_ahead)
        device = backend.device
    _warn_trailing(input_path, stats.images, stats.trailing_data_line)
    # With the outputs on standard output (`-`, /dev/stdout), the lab's line goes to stderr: the outputs stay a clean file.
    _say(f"{stats.work_microseconds} microseconds of actual work done", sys.stderr if output.descriptor == 1 else sys.stdout)
    if args.timing_json is not None:
        figures = {
            "mode": args.mode,
            "device": device,
            "images": stats.images,
            "batch_size": stats.batch_size,
            "work_seconds": stats.work_seconds,
            "work_microseconds": stats.work_microseconds,
            "images_per_second": stats.images_per_second,
            "loop_seconds": stats.loop_seconds,
            "loop_images_per_second": stats.images / stats.loop_seconds,
            "startup_seconds": stats.startup_seconds,
        }
        with AtomicOutput(args.timing_json) as out:
            json.dump(figures, out, indent=2)
            out.write("\n")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from cnnlab.convert import convert

    if args.input == STANDARD_STREAM:
        raise UsageError("convert reads its input twice (first to see what it holds), so it cannot read standard input (-)")
    refuse_same_file(args.output, {"input file": args.input})
    result = convert(args.input, args.output)
    _warn_trailing(args.input, result.rows, result.trailing_data_line)
    print(f"cnnlab: wrote {shown(args.output)} ({result.rows} {'images' if result.kind == 'input' else 'lines'})", file=sys.stderr)
    return 0


def _generate(args: argparse.Namespace) -> int:
    from cnnlab.generate import generate

    cnn_path, input_path = generate(args.out_dir, args.images, args.seed)
    print(f"cnnlab: wrote {cnn_path} and {input_path} ({args.images} images)", file=sys.stderr)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from cnnlab.compare import compare_files

    if args.file_a == args.file_b == STANDARD_STREAM:
        raise UsageError("compare reads each file once: at most one of them can be standard input (-)")
    result = compare_files(args.file_a, args.file_b, args.rel_tol, args.abs_tol)
    if not result.matches:
        print(f"cnnlab: {result.problem}", file=sys.stderr)
        return 1
    _say(
        f"Comparison finished: {result.lines} lines, {result.values} values close "
        f"(largest difference {result.max_abs_diff:.3g} absolute, {result.max_rel_diff:.3g} relative)"
    )
    return 0


def _bench(args: argparse.Namespace) -> int:
    from cnnlab.bench import run_bench
    from cnnlab.benchreport import BenchOptions, format_table, write_report

    rows = tuple(args.rows.split(","))
    unknown = set(rows) - set(BenchOptions.rows)
    if unknown:
        raise UsageError(f"unknown bench rows {', '.join(sorted(unknown))}; choose from {','.join(BenchOptions.rows)}")
    if args.plot is not None and args.json is not None:
        refuse_same_file(args.plot, {"--json file": args.json})
    if args.plot:
        from cnnlab.benchreport import import_pyplot

        import_pyplot()  # before minutes of measuring: without matplotlib, one line saying how to install it
    # The plot's batch-size sweep belongs to the batched rows; the ladder draws its own panel.
    sweep = (1, 16, 256, 4096, args.images) if args.plot and {"pinned", "resident"} & set(rows) else ()
    options = BenchOptions(
        args.images,
        args.cpu_images,
        args.lab_images,
        args.reader_images,
        args.csv_images,
        args.repeats,
        rows,
        sweep,
        args.chunk_images,
        args.streams,
    )
    report = run_bench(options, args.seed)
    _say(format_table(report))
    write_report(report, args.json, args.plot)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from cnnlab.compare import DEFAULT_ABS_TOL, DEFAULT_REL_TOL
    from cnnlab.generate import DEFAULT_IMAGES

    parser = _Parser(prog="cnnlab", description="The ECE 459 Lab 3 CNN: a batched float64 forward on the CPU or a GPU.")
    parser.add_argument("--version", action="version", version=f"cnnlab {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for mode, where in (("cpu", "numpy on the CPU"), ("cuda", "CUDA kernels on the GPU")):
        run = commands.add_parser(
            mode,
            help=f"run the network with {where}",
            description=f"Run the network with {where}: the lab's `{mode} CNN_FILE INPUT_FILE OUTPUT_FILE`. "
            f"With no files: the default data, written to {DEFAULT_OUTPUTS[mode]}. stdout gets the lab's "
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
        run.add_argument("--timing-json", metavar="PATH", help="also write the run's figures as JSON")
        # cpu: parsing and computing both take every core, so reading ahead gains no wall time (measured on 2
        # and 16 cores) and would only inflate the timed work; cuda: reading ahead keeps the GPU fed.
        read_ahead = mode == "cuda"
        run.add_argument(
            "--read-ahead",
            action=argparse.BooleanOptionalAction,
            default=read_ahead,
            help="read the next batch while this one computes (default: "
            + ("on; --no-read-ahead reads only while nothing computes, so the timed work has the cores to itself)" if read_ahead
               else "off, so the timed work has the cores to itself; on the CPU reading ahead gains no wall time)"),
        )
        if mode == "cuda":
            run.add_argument(
                "--host-parse",
                action="store_true",
                help="parse CSV input on the host's cores, as cpu mode does, instead of on the GPU (the default)",
            )
            run.add_argument(
                "--kernel",
                choices=list(BY_NAME),
                metavar="NAME",
                help=f"the rung of the optimization ladder that computes (README; default {DEFAULT_KERNEL}, the design card's "
                f"conv2d_relu + flattened_to_dense): {', '.join(BY_NAME)}",
            )
        run.set_defaults(handler=_run, mode=mode, host_parse=False, kernel=None)

    gen = commands.add_parser(
        "generate",
        help="write a random CNN file and input file",
        description="Write cnn.csv and in.csv in the lab's layout, values uniform in [-10, 10].",
    )
    gen.add_argument("--images", type=_positive_int, default=DEFAULT_IMAGES, help=f"images in in.csv (default {DEFAULT_IMAGES})")
    gen.add_argument("--seed", type=_seed, help="random seed, a non-negative integer: the same seed gives the same files")
    gen.add_argument("--out-dir", default="input", help="folder for cnn.csv and in.csv (default input/)")
    gen.set_defaults(handler=_generate)

    conv = commands.add_parser(
        "convert",
        help="convert an input or output file between CSV and .npy, exactly",
        description="Convert an input file (N images) or an output file (rows of values) between the lab's CSV "
        "and numpy's .npy format, in either direction; the extension of each path names its format. "
        "Every value comes back as the same double. Every command that takes a file takes either format.",
    )
    conv.add_argument("input", metavar="IN")
    conv.add_argument("output", metavar="OUT")
    conv.set_defaults(handler=_convert)

    cmp = commands.add_parser(
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
    cmp.set_defaults(handler=_compare)

    from cnnlab.benchreport import BenchOptions

    defaults = BenchOptions()
    bench = commands.add_parser(
        "bench",
        help="measure every path in images/s against the hardware's bounds",
        description="Measure each path in images/s (median of --repeats after a warm-up, fresh random data): "
        "cpu, the CSV reader in MB/s against numpy.loadtxt, "
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
    bench.add_argument("--chunk-images", type=_positive_int, help="images per chunk on the GPU (default: the backend's)")
    bench.add_argument("--streams", type=_positive_int, help="CUDA streams (default: the backend's)")
    bench.add_argument("--json", metavar="PATH", help="write every number, the device and versions as JSON")
    bench.add_argument(
        "--plot",
        metavar="PNG",
        help="draw each row's images/s against its bound, and with a GPU the batch sweep (needs matplotlib: the plot extra)",
    )
    bench.set_defaults(handler=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        interrupts.install()
        args = build_parser().parse_args(argv)
        interrupts.raise_if_received()  # a signal swallowed while the modules were imported still stops the run
        status = args.handler(args)
        _flush_stdout()
        return status
    except SystemExit:  # --help: printed, and flushed here, where a fault of standard output is still ours to report
        try:
            _flush_stdout()
        except BaseException as error:
            return _ended_by(error)
        raise
    except BaseException as error:
        return _ended_by(error)


def _say(text: str, stream: TextIO | None = None) -> None:
    """Print a result line (to standard output unless told otherwise)."""
    stream = stream or sys.stdout
    if stream is None:  # the process was started with standard output closed (`>&-`)
        raise OutputFileError("<stdout>: cannot write: standard output is closed")
    with writing(STANDARD_STREAM):
        print(text, file=stream)


def _flush_stdout() -> None:
    if sys.stdout is not None:
        with writing(STANDARD_STREAM):
            sys.stdout.flush()


def _ended_by(error: BaseException) -> int:
    """The exit status of a run that `error` ended, its one line printed; a bug is raised again, traceback and all."""
    signal_status = interrupts.exit_status()
    if signal_status is not None:
        return signal_status
    if isinstance(error, BrokenPipeError):
        # The reader of standard output (or of a FIFO output) went away: end quietly, as `yes | head -1`'s yes
        # does, and point stdout at /dev/null so that the interpreter's last flush finds nothing to fail on.
        if sys.stdout is not None:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    if isinstance(error, MemoryError):
        error = ResourceError(f"out of memory{memory_limit_note()}: try a smaller --batch, or a machine with more memory")
    elif isinstance(error, RuntimeError) and str(error) == "can't start new thread":  # threading's words for ENOMEM/EAGAIN
        error = ResourceError(f"cannot start a thread{memory_limit_note()}")
    if not isinstance(error, CnnlabError):
        raise error
    # One line, whatever a path held: a newline or another control character is shown escaped.
    print("cnnlab: " + _CONTROL.sub(lambda match: repr(match[0])[1:-1], str(error)), file=sys.stderr)
    if isinstance(error, DeviceLostError):
        # Leave without running destructors: PyCUDA would print a warning for every object it can
        # no longer free in the lost context, and there is nothing left to clean up (the output's
        # temporary file is already gone).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)
    return 2
