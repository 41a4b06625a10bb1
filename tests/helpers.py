"""What the tests share: file makers, the command line in a subprocess, the CPU outputs and the lab's rule to check
the GPU's against, the kinds of input the API takes, and the malformed-input corpus.

Test modules import from here, never from each other.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

import cnnlab
from cnnlab.compare import lab_close
from cnnlab.cpu.backend import CpuBackend
from cnnlab.files.csv_reader import CsvImageReader
from cnnlab.files.labcsv import write_input_file
from cnnlab.generate import random_values, write_cnn_file
from cnnlab.network import Cnn, ImageBatch
from cnnlab.resources import is_checkout

ROOT = Path(__file__).resolve().parent.parent
TIMING_LINE = re.compile(r"^\d+ microseconds of actual work done\n$")


@contextmanager
def gpu_lock(tmp_path_factory: Any) -> Iterator[None]:
    """Held while a test (or a fixture that makes a context) uses the GPU: under make test's workers the GPU's users run
    one at a time, as their device memory figures assume (one leaves the GPU 150 MB free). A file lock in the directory
    all of one run's workers share their temporary directories in."""
    with open(tmp_path_factory.getbasetemp().parent / "gpu.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# The environment of every cnnlab subprocess: the cnnlab these tests import first on the import path (this checkout's; in
# an unpacked sdist, the one installed from it: conftest.py).
IMPORTED_FROM = Path(cnnlab.__file__).resolve().parent.parent
SUBPROCESS_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(IMPORTED_FROM), os.environ.get("PYTHONPATH")])))


def install_hint(extra: str) -> str:
    """The command a message gives for the optional dependencies `extra`: into this checkout's environment, editable, or
    (an unpacked sdist's tests) into the environment cnnlab was installed in."""
    if is_checkout():
        return f"{sys.executable} -m pip install -e '{ROOT}[{extra}]'"
    return f"{sys.executable} -m pip install 'cnnlab[{extra}]'"


def why_no_gpu(builds_kernels: bool = False) -> str | None:
    """Why the GPU tests cannot run here (None: they can). `builds_kernels`: the test runs nvcc itself."""
    if builds_kernels and shutil.which("nvcc") is None:
        return "nvcc is not on the PATH: the test builds the kernels itself"
    try:
        import pycuda.driver as driver
    except ImportError as error:
        return f"pycuda cannot be imported ({error}): install the cuda extra on a machine with a CUDA driver"
    try:
        driver.init()
        return None if driver.Device.count() > 0 else "the CUDA driver sees no GPU"
    except driver.Error as error:
        return f"no usable CUDA device: {error}"


def random_cnn(rng: np.random.Generator) -> Cnn:
    return Cnn(random_values(rng, 10, 5, 5), random_values(rng, 10, 4000))


def cpu_outputs(cnn: Cnn, images: np.ndarray) -> np.ndarray:
    with CpuBackend(cnn) as backend:
        return backend.compute(ImageBatch(images)).values


def assert_lab_close(got: np.ndarray, want: np.ndarray) -> None:
    """math.isclose with rel_tol 1e-9, value by value, and never a NaN (an output nobody wrote)."""
    assert got.shape == want.shape
    assert np.isfinite(got).all()
    bad = np.abs(got - want) > 1e-9 * np.maximum(np.abs(got), np.abs(want))
    assert not bad.any(), f"{bad.sum()} values differ, first at {np.argwhere(bad)[0]}: {got[bad][0]!r} vs {want[bad][0]!r}"


# Each kind of host array a numpy user passes to cnnlab.forward: how to make it from fresh float64 images (N, 100, 100).
INPUT_KINDS: dict[str, Callable[[np.ndarray], object]] = {
    "float64": lambda images: images,
    "nested lists": lambda images: images.tolist(),
    "Fortran order": np.asfortranarray,
    "strided view": lambda images: np.repeat(images, 2, axis=2)[:, :, ::2],
    "reversed view": lambda images: images[::-1].copy()[::-1],
    "read-only": lambda images: np.frombuffer(images.tobytes()).reshape(images.shape),
    "float32": lambda images: images.astype(np.float32),
    "float16": lambda images: images.astype(np.float16),
    "int32": lambda images: np.rint(images * 1000).astype(np.int32),
    "uint8": lambda images: (np.abs(images) * 25).astype(np.uint8),
    "big-endian": lambda images: images.astype(">f8"),
}


def assert_within_rule(got: np.ndarray, want: np.ndarray, cnn: Cnn, images: np.ndarray) -> None:
    """Every output within the lab's rule of the CPU's, except where rounding alone can miss it.

    An output summed in another order than cpu.rs's differs from the CPU's by at most the float64
    error bound of the two sums, 2 x gamma(4025) x sum |activation x weight| (4,000 terms, and 25 in
    each activation); where the terms nearly cancel (about one value in two million, docs/exactness.md)
    that can exceed 1e-9 of the result. Such values must still be within the bound; a wrong index or
    a lost term misses it by orders of magnitude. NaN (an output nobody wrote) fails both."""
    assert got.shape == want.shape and np.isfinite(got).all()
    outside = ~lab_close(got, want)
    if outside.any():
        patches = images.reshape(len(images), 20, 5, 20, 5)
        activations = np.maximum(np.einsum("nricj,fij->nfrc", patches, cnn.filters), 0.0).reshape(len(images), -1)
        magnitude = np.abs(activations) @ np.abs(cnn.weights).T
        unit = 2.0**-53
        bound = 2 * (4025 * unit / (1 - 4025 * unit)) * magnitude
        over = outside & (np.abs(got - want) > bound)
        assert not over.any(), f"{over.sum()} values off by more than rounding, first at {np.argwhere(over)[0]}"


def write_files(tmp_path: Path, cnn: Cnn, images: np.ndarray) -> tuple[Path, Path]:
    """Write `cnn` and `images` in the lab's layout; return (cnn file, input file)."""
    cnn_path, input_path = tmp_path / "cnn.csv", tmp_path / "in.csv"
    write_cnn_file(cnn_path, cnn.filters, cnn.weights)
    write_input_file(input_path, len(images), images)
    return cnn_path, input_path


def cnnlab(
    *args: str | os.PathLike, cwd: Path | None = None, stdin: Any = None, stdout: Any = subprocess.PIPE, preexec_fn: Any = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m cnnlab ARGS` in a subprocess, stderr (and by default stdout) captured as text; `env`: variables to add."""
    return subprocess.run(
        [sys.executable, "-m", "cnnlab", *map(str, args)],
        cwd=cwd, env={**SUBPROCESS_ENV, **(env or {})}, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, text=True,
        preexec_fn=preexec_fn,
        timeout=300,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], status: int = 2) -> str:
    assert result.returncode == status, result.stderr
    assert result.stderr.startswith("cnnlab: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def assert_quoted(page: str, message: str) -> None:
    """`message` (what follows a one-line error's `cnnlab: FILE[:LINE]: `) is quoted whole in docs/`page`, as a code
    span (wrapped or not) where a capital K or N may stand for any number: a doc and a message cannot drift apart."""
    quotes = re.findall(r"`([^`]+)`", " ".join((ROOT / "docs" / page).read_text().split()))
    patterns = [re.sub(r"\b[KN]\b", r"\\d+", re.escape(quote)) for quote in quotes]
    assert any(re.fullmatch(pattern, message) for pattern in patterns), f"docs/{page} does not quote {message!r}"


def read_all_images(path: Path, batch: int = 3, ahead: bool = True, threads: int | None = None) -> np.ndarray:
    """Every image of a CSV input file, read `batch` at a time (each call saying the next asks as many, where `ahead`)."""
    with CsvImageReader(path, threads) as reader:
        out = np.empty((reader.count, 100, 100))
        buffer = np.empty((batch, 100, 100))
        done = 0
        while count := reader.read_into(buffer, batch if ahead else 0):
            out[done : done + count] = buffer[:count]
            done += count
        assert done == reader.count
        reader.finish()
    return out


def input_lines(images: np.ndarray) -> list[str]:
    lines = [str(len(images))]
    for image in images.tolist():
        lines += [",".join(map(repr, row)) for row in image]
        lines.append("")
    return lines


def _line_of(fields: list[str]) -> str:
    return ",".join(fields)


def _with_line(index: int, make_line):
    """A spoiler that replaces line `index` (0-based) by make_line(the old line)."""
    return lambda lines: lines[:index] + [make_line(lines[index])] + lines[index + 1 :]


# Each case: how to spoil a valid 2-image file (its lines, 0-based), the line the error must name, and
# what it must say. Line 1 holds N; image 1 is on lines 2-101, a blank line 102, image 2 on 103-202.
BAD_INPUTS = {
    "empty file": (lambda lines: [], None, "empty file"),
    "N not a number": (lambda lines: ["two"] + lines[1:], 1, "positive integer"),
    "N zero": (lambda lines: ["0"] + lines[1:], 1, "positive integer"),
    "N negative": (lambda lines: ["-2"] + lines[1:], 1, "positive integer"),
    "N larger than the matrices": (lambda lines: ["3"] + lines[1:], 202, "file ends after 2 of the 3 images the first line announces"),
    "N smaller than the matrices": (lambda lines: ["1"] + lines[1:], 103, "data after the 1 image the first line announces"),
    "truncated last matrix": (lambda lines: lines[:150], 150, "file ends inside image 2 of the 2 the first line announces, after 48 of"),
    "last line cut short": (
        lambda lines: [*lines[:150], lines[150][:40]], 151, "inside image 2 of the 2 the first line announces: its row 49 is cut short"
    ),
    "a row too few, a row too many": (
        lambda lines: lines[:5] + lines[6:103] + lines[5:6] + lines[103:], 101, "a blank line inside image 1, before its row 100"
    ),
    "a row too many, a row too few": (
        lambda lines: lines[:101] + lines[103:104] + lines[101:103] + lines[104:], 103, "a blank line inside image 2, before its row 2"
    ),
    "a blank line inside an image": (lambda lines: lines[:50] + [""] + lines[50:], 51, "a blank line inside image 1, before its row 50"),
    "short line": (_with_line(5, lambda old: old.rsplit(",", 1)[0]), 6, "found 99"),
    "long line": (_with_line(5, lambda old: old + ",1.0"), 6, "found 101"),
    "missing value": (_with_line(7, lambda old: _line_of(["1"] * 50 + [""] + ["2"] * 49)), 8, "value 51 is missing"),
    "not a number": (_with_line(9, lambda old: _line_of(["1"] * 99 + ["abc"])), 10, "value 100 'abc' is not a number"),
    "NaN": (_with_line(9, lambda old: _line_of(["nan"] + ["1"] * 99)), 10, "'nan' is not a finite number"),
    "infinity": (_with_line(9, lambda old: _line_of(["1"] * 9 + ["-inf"] + ["1"] * 90)), 10, "value 10 '-inf' is not a finite"),
    "overflow": (_with_line(9, lambda old: _line_of(["1e400"] + ["1"] * 99)), 10, "not a finite"),
    "underscore": (_with_line(9, lambda old: _line_of(["1_0"] + ["1"] * 99)), 10, "'1_0' is not a number"),
    "very long line": (_with_line(3, lambda old: "1," * 600000), 4, "line longer than"),
    "N of 5,000 digits": (lambda lines: ["9" * 5000] + lines[1:], 1, "images: more than any file holds"),
}


def in_forked_child(check: Callable[[], bool], timeout: int = 60) -> bool:
    """Whether `check()`, run in a child this process forks, returned True within `timeout` seconds: not False, nor
    raised (its traceback goes to stderr), nor hung (the child is aborted: pytest's faulthandler prints its stacks)."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # a fork of a process with threads: what the tests check
        pid = os.fork()
    if pid == 0:
        passed = False
        try:
            passed = check()
        except BaseException:
            os.write(2, traceback.format_exc().encode())  # straight to the descriptor: a stream's lock may be a dead thread's
        finally:
            os.write(write, b"1" if passed else b"0")
            os._exit(0 if passed else 1)
    os.close(write)
    try:
        answered, _, _ = select.select([read], [], [], timeout)
        if not answered:
            os.kill(pid, signal.SIGABRT)
        answer = os.read(read, 1) if answered else b""
    finally:
        os.close(read)
        _, status = os.waitpid(pid, 0)
    return answer == b"1" and os.waitstatus_to_exitcode(status) == 0
