"""The command line's commands: what `cnnlab cpu|cuda|convert|generate|compare|bench|trace-plot` each do, once parsed.

Each takes the parsed arguments and returns the exit status; a problem is raised as one of cnnlab's
errors, which main.py turns into one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cnnlab import interrupts
from cnnlab.backend import Backend
from cnnlab.errors import STANDARD_STREAM, DeviceError, OutputFileError, UsageError, named, shown
from cnnlab.files.formats import is_npy
from cnnlab.files.labcsv import read_cnn
from cnnlab.files.safety import STDOUT_FILE, AtomicOutput, OutputSet, output_target, refuse_same_file, writing
from cnnlab.resources import resource_dir
from cnnlab.run import RunStats, make_backend, run_network
from cnnlab.tracing import NO_TRACE, Tracer

if TYPE_CHECKING:
    from cnnlab.trace.recorder import Recorder

DEFAULT_OUTPUTS = {"cpu": Path("out/out.csv"), "cuda": Path("out/out_cuda.csv")}


def named_gpus(devices: str | None, device: int | None) -> list[int] | None:
    """The GPUs --devices ("all", or indices separated by commas) or --device names; None for neither (GPU 0)."""
    if devices is None:
        return None if device is None else [device]
    if devices == "all":
        from cnnlab.cuda.driver import import_driver, visible_count

        count = visible_count(import_driver())
        if count == 0:
            raise DeviceError("no CUDA device found")
        return list(range(count))
    return [int(index) for index in devices.split(",")]


def run(args: argparse.Namespace) -> int:
    files = args.files or [
        resource_dir("data") / "cnn.csv",
        resource_dir("data") / "in.csv",
        DEFAULT_OUTPUTS[args.mode],
    ]
    if len(files) != 3:
        raise UsageError(f"{args.mode} takes CNN_FILE INPUT_FILE OUTPUT_FILE, or no files for the default data")
    cnn_path, input_path, output_path = files
    if args.trace_chunks and args.trace is None:
        raise UsageError("--trace-chunks adds to a trace: give --trace FILE too")
    refuse_same_file(output_path, {"input file": input_path, "CNN file": cnn_path})
    output = output_target(output_path)  # a folder that cannot take the output is found before the run, not after it
    # `-` as the output is standard output: the other outputs are checked against the file the shell opened it on.
    written = STDOUT_FILE if os.fspath(output_path) == STANDARD_STREAM else output_path
    others: dict[str, str | os.PathLike[str]] = {"input file": input_path, "CNN file": cnn_path, "output file": written}
    for option, path in (("--timing-json", args.timing_json), ("--trace", args.trace)):
        if path is not None:
            target = output_target(path)
            if output.descriptor is not None and target.descriptor == output.descriptor:
                where = f"the output {shown(output_path)} and {option} {shown(path)}"  # as typed (`-` as <stdout>)
                raise UsageError(f"{where} cannot both be written to descriptor {output.descriptor}")
            refuse_same_file(path, others)
            others[f"{option} file"] = path
    cnn = read_cnn(cnn_path)
    gpus = named_gpus(args.devices, args.device)
    recorder = start_trace(args.trace_chunks) if args.trace is not None else None
    trace: Tracer = recorder or NO_TRACE
    # Every write first (the outputs, --timing-json, --trace, the lab's line), every rename last: a failure or a signal
    # anywhere before leaves each path as it was.
    with OutputSet() as together:
        # A regular file's images or text go straight into device buffers (not text the host parses, nor a CSV file's
        # text with several GPUs, which takes the host's windows: cuda/multi_gpu.py): the file copier is made ahead,
        # sized to the file.
        several = gpus is not None and len(gpus) > 1
        regular = os.path.isfile(input_path) and (is_npy(input_path) or not (args.host_parse or several))
        copier_ahead = os.path.getsize(input_path) if regular else None
        backend = make_backend(args.mode, cnn, args.batch, args.host_parse, args.kernel, args.threads, gpus, trace, copier_ahead)
        with closed_on_failure(backend) if args.process_ends else backend:
            interrupts.raise_if_received()  # the backend's modules were imported just now
            stats = run_network(backend, input_path, output_path, args.read_ahead, together, trace, args.process_ends)
            device = backend.device
        if args.timing_json is not None:
            with AtomicOutput(args.timing_json, together=together) as out:
                write_timing_json(out, args.mode, device, stats)
        if recorder is not None:
            with AtomicOutput(args.trace, binary=True, together=together) as out:
                write_trace(out, args, device, stats, recorder)
        # With the outputs on standard output (`-`, /dev/stdout), the lab's line goes to stderr: the outputs stay a clean file.
        say(f"{stats.work_microseconds} microseconds of actual work done", to_stderr=output.descriptor == 1)
        flush_stdout()
    return 0


@contextmanager
def closed_on_failure(backend: Backend) -> Iterator[Backend]:
    """The backend, closed only where the run fails: after a run that succeeds the process ends at once, and its end
    frees all the backend holds without the work of closing it (with a GPU, the helper takes the driver's teardown)."""
    try:
        yield backend
    except BaseException:
        backend.close()
        raise


def start_trace(chunks: bool) -> Recorder:
    """--trace's recorder (each GPU chunk's spans too, where `chunks`), imported only where a trace is asked for."""
    from cnnlab.trace.recorder import Recorder

    return Recorder(chunks)


def write_trace(out: Any, args: argparse.Namespace, device: str, stats: RunStats, trace: Recorder) -> None:
    """--trace's file: the run's spans, with its figures (--timing-json's) as the trace's otherData; gzip-compressed where
    the name ends in .gz."""
    trace.metadata.update(timing_figures(args.mode, device, stats), kernel=args.kernel, threads=args.threads, argv=sys.argv[1:])
    trace.write(out, compress=os.fspath(args.trace).endswith(".gz"))


def write_timing_json(out: Any, mode: str, device: str, stats: RunStats) -> None:
    """--timing-json's figures of a run, as a JSON object."""
    import json  # here: 2 ms of every other run's start-up

    json.dump(timing_figures(mode, device, stats), out, indent=2)
    out.write("\n")


def timing_figures(mode: str, device: str, stats: RunStats) -> dict[str, Any]:
    """A run's figures, as --timing-json writes them."""
    return {
        "mode": mode,
        "device": device,
        "images": stats.images,
        "batch_size": stats.batch_size,
        "work_seconds": stats.work_seconds,
        "work_microseconds": stats.work_microseconds,
        "images_per_second": stats.images_per_second,
        "loop_seconds": stats.loop_seconds,
        "loop_images_per_second": stats.images / stats.loop_seconds,
        "startup_seconds": stats.startup_seconds,
        "device_memory_bytes": stats.device_bytes,
    }


def convert(args: argparse.Namespace) -> int:
    from cnnlab.files.convert import convert

    if args.input == STANDARD_STREAM:
        raise UsageError("convert reads its input twice (first to see what it holds), so it cannot read standard input (-)")
    refuse_same_file(args.output, {"input file": args.input})
    result = convert(args.input, args.output)
    print(f"cnnlab: wrote {shown(args.output)} ({result.rows} {'images' if result.kind == 'input' else 'lines'})", file=sys.stderr)
    return 0


def generate(args: argparse.Namespace) -> int:
    from cnnlab.generate import generate

    cnn_path, input_path = generate(args.out_dir, args.images, args.seed)
    print(f"cnnlab: wrote {named(cnn_path)} and {named(input_path)} ({args.images} images)", file=sys.stderr)
    return 0


def compare(args: argparse.Namespace) -> int:
    from cnnlab.compare import compare_files

    if args.file_a == args.file_b == STANDARD_STREAM:
        raise UsageError("compare reads each file once: at most one of them can be standard input (-)")
    result = compare_files(args.file_a, args.file_b, args.rel_tol, args.abs_tol)
    if not result.matches:
        print(f"cnnlab: {result.problem}", file=sys.stderr)
        return 1
    say(
        f"Comparison finished: {result.lines} lines, {result.values} values close "
        f"(largest difference {result.max_abs_diff:.3g} absolute, {result.max_rel_diff:.3g} relative)"
    )
    return 0


def bench(args: argparse.Namespace) -> int:
    from cnnlab.bench.report import BenchOptions, format_table, write_report
    from cnnlab.bench.rows import run_bench

    rows = tuple(args.rows.split(","))
    unknown = set(rows) - set(BenchOptions.rows)
    if unknown:
        raise UsageError(f"unknown bench rows {', '.join(sorted(unknown))}; choose from {','.join(BenchOptions.rows)}")
    if args.plot is not None and args.json is not None:
        refuse_same_file(args.plot, {"--json file": args.json})
    if args.plot:
        from cnnlab.bench.report import import_pyplot

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
        threads=args.threads,
    )
    report = run_bench(options, args.seed)
    say(format_table(report))
    write_report(report, args.json, args.plot)
    return 0


def trace_plot(args: argparse.Namespace) -> int:
    import io

    from cnnlab.bench.report import import_pyplot
    from cnnlab.trace.plot import describe, draw, load_trace, summarize

    refuse_same_file(args.png, {"trace file": args.trace})
    output_target(args.png)
    plt = import_pyplot("trace-plot")
    summary = summarize(load_trace(args.trace))
    figure = draw(summary, plt)
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=args.dpi)
    plt.close(figure)
    with AtomicOutput(args.png, binary=True) as out:
        out.write(image.getvalue())
    say(describe(summary))
    return 0


def say(text: str, to_stderr: bool = False) -> None:
    """Print a result line to standard output, or to standard error (the lab's line, where the outputs go to stdout)."""
    stream, name, what = (sys.stderr, "<stderr>", "error") if to_stderr else (sys.stdout, STANDARD_STREAM, "output")
    if stream is None:  # the process was started with it closed (`>&-`)
        raise OutputFileError(f"{shown(name)}: cannot write: standard {what} is closed")
    with writing(name):
        print(text, file=stream)


def flush_stdout() -> None:
    if sys.stdout is not None:
        with writing(STANDARD_STREAM):
            sys.stdout.flush()
