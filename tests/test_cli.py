"""The command line end to end, in a subprocess: outputs, the timing line, exit codes, messages."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    ROOT,
    SUBPROCESS_ENV,
    TIMING_LINE,
    assert_one_line_error,
    cnnlab,
    cpu_outputs,
    install_hint,
    random_cnn,
    read_all_images,
    write_files,
)

from cnnlab.cpu.backend import CpuBackend
from cnnlab.extensions import EXTENSIONS, fallback_note, missing_extensions
from cnnlab.files.labcsv import read_output_rows as read_outputs
from cnnlab.generate import random_values
from cnnlab.network import ImageBatch
from cnnlab.resources import resource_dir


def test_cpu_on_default_data(tmp_path: Path) -> None:
    result = cnnlab("cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert TIMING_LINE.match(result.stdout)
    assert result.stderr == ""
    assert (tmp_path / "out" / "out.csv").read_text() == (resource_dir("data") / "out.csv").read_text()


def test_cpu_on_generated_files_matches_backend_and_writes_timing_json(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 5, 100, 100)
    cnn_path, input_path = write_files(tmp_path, cnn, images)
    result = cnnlab("cpu", cnn_path, input_path, tmp_path / "o" / "out.csv", "--batch", "2", "--timing-json", tmp_path / "t.json")
    assert result.returncode == 0, result.stderr
    assert TIMING_LINE.match(result.stdout)
    with CpuBackend(cnn) as backend:
        want = backend.compute(ImageBatch(images)).values.tolist()
    assert read_outputs(tmp_path / "o" / "out.csv") == want
    figures = json.loads((tmp_path / "t.json").read_text())
    assert figures["images"] == 5 and figures["batch_size"] == 2 and figures["mode"] == "cpu"
    assert figures["device_memory_bytes"] == 0
    assert figures["work_microseconds"] == int(result.stdout.split()[0])
    assert figures["images_per_second"] == pytest.approx(5 / figures["work_seconds"])


@pytest.mark.parametrize("at", [1, 2, 3])
def test_options_may_stand_among_the_files(tmp_path: Path, at: int) -> None:
    """`cnnlab cpu data/cnn.csv --threads 2 data/in.csv out.csv`: the options anywhere among the files, the outputs those of
    the run that names them first, and the lab's expected ones by its comparison."""
    data = resource_dir("data")
    files = [data / "cnn.csv", data / "in.csv", tmp_path / "out.csv"]
    result = cnnlab("cpu", *files[:at], "--threads", "2", "--batch", "3", *files[at:])
    assert result.returncode == 0, result.stderr
    assert TIMING_LINE.match(result.stdout) and result.stderr == ""
    assert cnnlab("cpu", "--threads", "2", "--batch", "3", *files[:2], tmp_path / "first.csv").returncode == 0
    assert (tmp_path / "out.csv").read_text() == (tmp_path / "first.csv").read_text()
    assert cnnlab("compare", tmp_path / "out.csv", data / "out.csv").returncode == 0


FIRST_CPU = {min(os.sched_getaffinity(0))}  # one CPU this process may run on (a container's set may leave out CPU 0)


@pytest.mark.parametrize(
    ("options", "environment", "cpus", "threads"),
    [
        ((), {}, None, len(os.sched_getaffinity(0))),  # every core this process may run on
        (("--threads", "3"), {}, None, 3),
        ((), {"OMP_NUM_THREADS": "2"}, None, 2),
        ((), {"OMP_NUM_THREADS": "x"}, None, len(os.sched_getaffinity(0))),  # a knob that says nothing is passed over
        ((), {}, FIRST_CPU, 1),  # taskset -c N: the affinity mask, not the machine's count
        (("--threads", "2"), {"OMP_NUM_THREADS": "5"}, FIRST_CPU, 2),  # the command line first
    ],
)
def test_cpu_runs_on_the_threads_the_command_line_the_environment_or_the_affinity_mask_give(
    tmp_path: Path, rng: np.random.Generator, options: tuple[str, ...], environment: dict[str, str], cpus: set[int] | None,
    threads: int,
) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 11, 100, 100)
    cnn_path, input_path = write_files(tmp_path, cnn, images)
    command = [sys.executable, "-m", "cnnlab", "cpu", str(cnn_path), str(input_path), str(tmp_path / "out.csv")]
    command += ["--timing-json", str(tmp_path / "t.json"), *options]
    env = {key: value for key, value in SUBPROCESS_ENV.items() if key != "OMP_NUM_THREADS"} | environment
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, preexec_fn=pin)
    assert result.returncode == 0, result.stderr
    assert f", {threads} threads, " in json.loads((tmp_path / "t.json").read_text())["device"]
    assert np.array_equal(np.array(read_outputs(tmp_path / "out.csv")), cpu_outputs(cnn, images))


def test_generate_then_cpu_then_compare(tmp_path: Path) -> None:
    assert cnnlab("generate", "--images", "3", "--seed", "1", "--out-dir", tmp_path).returncode == 0
    out_a, out_b = tmp_path / "a.csv", tmp_path / "b.csv"
    for out in (out_a, out_b):
        assert cnnlab("cpu", tmp_path / "cnn.csv", tmp_path / "in.csv", out).returncode == 0
    result = cnnlab("compare", out_a, out_b)
    assert result.returncode == 0 and result.stdout.startswith("Comparison finished: 3 lines, 30 values")


def test_compare_names_the_first_discrepancy_and_counts(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("1.0,2.0,3.0\n4.0,5.0,6.0\n")
    b.write_text("1.0,2.0,3.0\n4.0,5.00001,6.1\n")
    result = cnnlab("compare", a, b)
    stderr = assert_one_line_error(result, status=1)
    assert "line 2 value 2: 5.0 vs 5.00001" in stderr and "2 of 6 values differ" in stderr
    assert cnnlab("compare", a, b, "--rel-tol", "0.05").returncode == 0
    assert cnnlab("compare", a, b, "--abs-tol", "0.2").returncode == 0
    b.write_text("1.0,2.0,3.0\n")
    assert "has 2 lines" in assert_one_line_error(cnnlab("compare", a, b), status=1)
    b.write_text("1.0,2.0,3.0\n4.0,5.0\n")
    assert "line 2: " in assert_one_line_error(cnnlab("compare", a, b), status=1)
    b.write_text("1.0,2.0,x\n4.0,5.0,6.0\n")
    assert f"{b}:1: value 3 'x' is not a number" in assert_one_line_error(cnnlab("compare", a, b))


def test_compare_rule_is_math_isclose_at_the_edge(tmp_path: Path) -> None:
    """Relative 1e-9 of the larger magnitude: just inside passes, just outside fails."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("1000.0\n")
    b.write_text(f"{1000.0 + 0.99e-6!r}\n")
    assert cnnlab("compare", a, b).returncode == 0
    b.write_text(f"{1000.0 + 1.01e-6!r}\n")
    assert cnnlab("compare", a, b).returncode == 1


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "required"),
        (["gpu"], "invalid choice"),
        (["cpu", "only-one-file"], "CNN_FILE INPUT_FILE OUTPUT_FILE"),
        (["cpu", "--batch", "0"], "positive integer"),
        (["compare", "a"], "required"),
        (["compare", "a", "b", "--rel-tol", "-1"], "non-negative"),
        (["generate", "--images", "x"], "positive integer"),
    ],
)
def test_bad_usage_is_one_line_and_status_2(args: list[str], message: str) -> None:
    assert message in assert_one_line_error(cnnlab(*args))


@pytest.mark.parametrize("command", [[], ["cpu"], ["cuda"], ["generate"], ["convert"], ["compare"], ["bench"]])
def test_help_everywhere(command: list[str]) -> None:
    result = cnnlab(*command, "--help")
    assert result.returncode == 0 and "usage: cnnlab" in result.stdout


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda text: "", "empty file"),
        (lambda text: "3" + text[1:], "after 2 of the 3 images"),
        (lambda text: "1" + text[1:], "data after the 1 image the first"),
        (lambda text: text.replace(",", ",,", 1), "expected 100 comma-separated values, found 101"),
        (lambda text: re.sub(r"\n[^,\n]+", "\nnan", text, count=1), "value 1 'nan' is not a finite number"),
        (lambda text: "\x00\xff" + text, "not a text file"),
    ],
)
def test_bad_input_leaves_existing_output_untouched(tmp_path: Path, rng: np.random.Generator, spoil, message: str) -> None:
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 2, 100, 100))
    input_path.write_text(spoil(input_path.read_text()))
    output = tmp_path / "out" / "out.csv"
    output.parent.mkdir()
    output.write_text("previous results\n")
    result = cnnlab("cpu", cnn_path, input_path, output)
    assert message in assert_one_line_error(result)
    assert str(input_path) in result.stderr
    assert result.stdout == ""
    assert output.read_text() == "previous results\n"
    assert sorted(p.name for p in output.parent.iterdir()) == ["out.csv"]


def test_failed_run_creates_no_output(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 1, 100, 100))
    result = cnnlab("cpu", cnn_path, tmp_path / "missing.csv", tmp_path / "out.csv")
    assert "missing.csv: no such file" in assert_one_line_error(result)
    assert not (tmp_path / "out.csv").exists()
    bad_cnn = tmp_path / "bad_cnn.csv"
    bad_cnn.write_text("1,2,3\n")
    result = cnnlab("cpu", bad_cnn, input_path, tmp_path / "out.csv")
    assert "bad_cnn.csv:1: expected 25" in assert_one_line_error(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad_cnn.csv", "cnn.csv", "in.csv"]


def test_data_after_the_announced_images_is_an_error(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 3, 100, 100))
    input_path.write_text("2" + input_path.read_text()[1:])
    result = cnnlab("cpu", cnn_path, input_path, tmp_path / "out.csv")
    message = f"{input_path}:204: data after the 2 images the first line announces (a count too small, or rows out of place?)"
    assert assert_one_line_error(result) == f"cnnlab: {message}\n"
    assert not (tmp_path / "out.csv").exists()


def test_cuda_without_pycuda_is_a_one_line_error(tmp_path: Path) -> None:
    try:
        import pycuda  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("pycuda is installed here: tests/test_cuda.py covers the cuda mode")
    result = cnnlab("cuda", cwd=tmp_path)
    # In a checkout, the command that installs the extra into this checkout's environment (helpers.install_hint).
    hint = install_hint("cuda")
    assert f"the GPU path needs pycuda: {hint} (builds PyCUDA from source" in assert_one_line_error(result)
    assert not (tmp_path / "out").exists()


NO_COMPILER = list(EXTENSIONS)  # what an install without a C++ compiler lacks


@pytest.mark.parametrize("missing", [["cnnlab.files._lab_csv"], ["cnnlab.cpu._forward"], NO_COMPILER])
def test_without_native_modules_the_same_outputs_and_one_note(tmp_path: Path, rng: np.random.Generator, missing: list[str]) -> None:
    """Where no C++ compiler built the CSV parser, the forward or any extension: the same bytes out, from their Python
    and numpy twins, and one line (not one for each) saying what is missing, what to install and what it costs."""
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 3, 100, 100))
    assert cnnlab("cpu", cnn_path, input_path, tmp_path / "native.csv").returncode == 0
    script = f"import sys; sys.modules.update(dict.fromkeys({missing!r})); from cnnlab.cli.main import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", script, "cpu", str(cnn_path), str(input_path), str(tmp_path / "python.csv")]
    result = subprocess.run(command, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr == fallback_note(missing) + "\n"
    assert (tmp_path / "python.csv").read_bytes() == (tmp_path / "native.csv").read_bytes()


def test_the_note_without_a_compiler_names_what_is_missing_and_is_the_one_the_docs_quote() -> None:
    assert fallback_note(["cnnlab.cpu._forward"]).startswith(
        "cnnlab: note: the native CPU forward is not built: install a C++17 compiler (g++ >= 11) and reinstall cnnlab; "
    )
    assert fallback_note(["cnnlab.cpu._forward"]).endswith(" give the same results, slower (the forward ~20x)")
    note = fallback_note(reversed(NO_COMPILER))
    assert note.startswith("cnnlab: note: the native CSV parser, CPU forward and .npy mapping guard are not built: ")
    assert f"\n    {note}\n" in (ROOT / "docs" / "cpu.md").read_text(), "docs/cpu.md quotes another note"


def test_the_install_says_what_it_did_not_build() -> None:
    """`python -m cnnlab.extensions`, the Makefile's install step after pip: the note where an extension is missing,
    nothing where every one is built."""
    script = "import runpy, sys; sys.modules.update(dict.fromkeys(sys.argv[1:])); runpy.run_module('cnnlab.extensions', None, '__main__')"
    for missing in (["cnnlab.files._mapped_guard"], NO_COMPILER, []):
        missing = missing or missing_extensions()  # nothing held back: what this install lacks, if anything
        result = subprocess.run([sys.executable, "-c", script, *missing], env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=60)
        assert (result.returncode, result.stdout, result.stderr) == (0, "", fallback_note(missing) + "\n" if missing else "")


@pytest.mark.slow
def test_setup_without_a_compiler_succeeds_saying_so_once(tmp_path: Path) -> None:
    """setup.py's build with a compiler that fails: every extension left out, and the same one line, once."""
    env = dict(SUBPROCESS_ENV, CC="false", CXX="false")
    command = [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines().count(fallback_note(NO_COMPILER)) == 1 and "cnnlab:" not in result.stderr.replace(
        fallback_note(NO_COMPILER), ""), result.stderr
    assert not list(tmp_path.rglob("*.so"))


def test_version() -> None:
    import cnnlab as package

    result = cnnlab("--version")
    assert result.returncode == 0 and result.stdout == f"cnnlab {package.__version__}\n" and result.stderr == ""


def _in_a_terminal(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the command line with stderr on a pseudo-terminal, the bar's delay and interval at zero; (result, what the terminal got)."""
    import os
    import pty

    script = (
        "import sys; from cnnlab.progress import Progress; Progress.DELAY_SECONDS = Progress.INTERVAL_SECONDS = 0; "
        "from cnnlab.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    controller, terminal = pty.openpty()
    try:
        command = [sys.executable, "-c", script, *args]
        process = subprocess.Popen(command, cwd=cwd, env=SUBPROCESS_ENV, stdout=subprocess.PIPE, stderr=terminal, text=True)
        os.close(terminal)
        seen = b""
        while True:
            try:
                data = os.read(controller, 65536)
            except OSError:  # EIO: every end of the terminal is closed
                break
            if not data:
                break
            seen += data
        stdout = process.communicate(timeout=300)[0]
    finally:
        os.close(controller)
    return subprocess.CompletedProcess(args, process.returncode, stdout, ""), seen.decode()


BAR = re.compile(r"\r(cnnlab \w+): +(\d+)%\|[^|]{20}\| ([\d,]+)/([\d,]+) (\w+) \[\d\d:\d\d<(\d\d:\d\d|\?), [\d,]+ \w+/s\]")


def test_progress_bar_in_a_terminal(tmp_path: Path, rng: np.random.Generator) -> None:
    """Count, percentage, rate and time left on a terminal's stderr, cleared at the end; the timing line alone on stdout."""
    result, seen = _in_a_terminal(["generate", "--images", "130", "--out-dir", str(tmp_path)], tmp_path)
    assert result.returncode == 0
    bars = BAR.findall(seen)
    assert [bar[0] for bar in bars] == ["cnnlab generate"] * 3 and [bar[2] for bar in bars] == ["0", "64", "128"]
    assert bars[1][1] == "49" and bars[1][3:5] == ("130", "images")
    files = [str(tmp_path / name) for name in ("cnn.csv", "in.csv", "out.csv")]
    result, seen = _in_a_terminal(["cpu", *files, "--batch", "50"], tmp_path)
    assert result.returncode == 0 and TIMING_LINE.match(result.stdout)
    bars = BAR.findall(seen)
    assert [bar[:3] for bar in bars] == [("cnnlab cpu", "38", "50"), ("cnnlab cpu", "77", "100"), ("cnnlab cpu", "100", "130")]
    assert seen.endswith("\r\x1b[K")  # the bar is cleared, as the run's last output
    result, seen = _in_a_terminal(["convert", str(tmp_path / "in.csv"), str(tmp_path / "in.npy")], tmp_path)
    assert result.returncode == 0 and BAR.findall(seen)[-1][:3] == ("cnnlab convert", "100", "130")
    assert (np.load(tmp_path / "in.npy") == read_all_images(tmp_path / "in.csv")).all()


def test_convert_says_a_cnn_file_is_one(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn_path, _ = write_files(tmp_path, random_cnn(rng), random_values(rng, 1, 100, 100))
    message = assert_one_line_error(cnnlab("convert", cnn_path, tmp_path / "cnn.npy"))
    assert f"{cnn_path}: this is a CNN file (10 lines of 25 filter values, then 10 of 4000 weights)" in message
    assert "convert converts input files (N images) and output files (rows of values)" in message
    assert not (tmp_path / "cnn.npy").exists()


def test_a_mapped_run_imports_no_thread_pool_nor_shutil(tmp_path: Path, rng: np.random.Generator) -> None:
    """cpu mode on a mapped .npy file makes no thread pool, and argparse's terminal width needs no shutil: cnnlab imports
    neither concurrent.futures (with logging) nor shutil (with its compression modules), ~7 ms of a 2-core start (what
    the interpreter and numpy import before it, which differs between machines, is left out)."""
    from cnnlab.files import npy

    if npy.MappedFile is None:
        pytest.skip("the native mapping guard (cnnlab.files._mapped_guard) is not built: .npy files are read on a pool")
    cnn_path, _ = write_files(tmp_path, random_cnn(rng), random_values(rng, 3, 100, 100))
    np.save(tmp_path / "in.npy", random_values(rng, 3, 100, 100))
    script = (
        "import sys, numpy; before = set(sys.modules); from cnnlab.cli.main import main; code = main(sys.argv[1:]); "
        "print(*sorted({'concurrent.futures', 'logging', 'shutil'} & set(sys.modules) - before), file=sys.stderr); sys.exit(code)"
    )
    command = [sys.executable, "-c", script, "cpu", str(cnn_path), str(tmp_path / "in.npy"), str(tmp_path / "out.csv")]
    result = subprocess.run(command, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stderr == "\n", result.stderr


@pytest.mark.parametrize("columns", [50, 120])
def test_help_wraps_at_the_terminal_width(columns: int) -> None:
    command = [sys.executable, "-m", "cnnlab", "cpu", "--help"]
    result = subprocess.run(command, env={**SUBPROCESS_ENV, "COLUMNS": str(columns)}, capture_output=True, text=True, timeout=300)
    widest = max(map(len, result.stdout.splitlines()))
    assert result.returncode == 0 and columns - 12 <= widest <= columns, result.stdout


def test_a_file_name_that_is_not_text_is_shown_as_it_can_be_typed(tmp_path: Path, rng: np.random.Generator) -> None:
    """A name's bytes that are not UTF-8, or a newline in it, are shown in the shell's $'...' quoting, as typed back."""
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 1, 100, 100))
    missing = os.fsdecode(bytes(tmp_path) + b"/\xff\xfe.csv")
    message = assert_one_line_error(cnnlab("cpu", cnn_path, missing, tmp_path / "out.csv"))
    assert message == f"cnnlab: $'{tmp_path}/\\xff\\xfe.csv': no such file\n"
    folder = tmp_path / "a\nb"
    folder.write_text("")
    message = assert_one_line_error(cnnlab("cpu", cnn_path, input_path, folder / "out.csv"))
    assert message.startswith(f"cnnlab: $'{tmp_path}/a\\nb/out.csv': cannot write here: ")


def test_generate_refuses_what_the_disk_cannot_hold_before_writing(tmp_path: Path) -> None:
    result = cnnlab("generate", "--images", "1000000000000000", "--out-dir", tmp_path / "gen")
    message = assert_one_line_error(result)
    assert re.fullmatch(r"cnnlab: .*gen: the files would take about 187,000 PB, and its file system has .* free\n", message)
    limited = cnnlab("generate", "--images", "10", "--out-dir", tmp_path / "gen",  # a few MB free is enough to reach the limit
                     preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY)))  # fmt: skip
    assert "in.csv would take about 1.87 MB, past the file-size limit of 1.05 MB (ulimit -f)" in assert_one_line_error(limited)
    assert not (tmp_path / "gen").exists()
