"""Fault injection: writes that fail, outputs that are not plain files, hostile .npy headers, signals during
start-up, memory limits and overflow. Each ends in one line and a documented status, never a traceback, a
half-written output, a leftover temporary file or a replaced file-system node."""

from __future__ import annotations

import os
import resource
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    SUBPROCESS_ENV,
    TIMING_LINE,
    assert_one_line_error,
    assert_quoted,
    cnnlab,
    cpu_outputs,
    random_cnn,
    write_files,
)

from cnnlab.cli import main as cli
from cnnlab.cpu.backend import CpuBackend
from cnnlab.errors import InputFileError
from cnnlab.files import npy
from cnnlab.files.csv_reader import CsvImageReader
from cnnlab.files.labcsv import format_rows
from cnnlab.files.mapped_text import MappedTextSource
from cnnlab.files.npy import NpyImageReader
from cnnlab.generate import random_values
from cnnlab.network import Cnn, ImageBatch, OutputBatch
from cnnlab.run import run_network

CLOSED_PIPE_STATUS = 128 + signal.SIGPIPE
# cuda mode reads and checks its files as cpu mode does; on a machine with a GPU the faults that involve the run go through it too.
RUN_MODES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def files_in(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


@pytest.fixture
def run_files(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, Path, bytes]:
    """A CNN file, an input file of 300 fresh images, and the outputs a plain cpu run writes for them."""
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 300, 100, 100))
    result = cnnlab("cpu", cnn_path, input_path, tmp_path / "expected.csv")
    assert result.returncode == 0, result.stderr
    expected = (tmp_path / "expected.csv").read_bytes()
    (tmp_path / "expected.csv").unlink()
    assert expected.count(b"\n") == 300
    return cnn_path, input_path, expected


# Writing fails: a file-size limit (EFBIG) and a full file system (ENOSPC).


def _file_size_limit(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize(
    "command, output",
    [
        (["cpu", "{cnn}", "{input}"], "out.csv"),
        (["cpu", "{cnn}", "{input}"], "out.npy"),
        (["convert", "{input}"], "in.npy"),
        (["generate", "--images", "300", "--out-dir"], "gen"),
    ],
)
def test_a_file_size_limit_is_one_line_and_leaves_nothing_half_written(
    tmp_path: Path, run_files: tuple[Path, Path, bytes], command: list[str], output: str
) -> None:
    cnn_path, input_path, _ = run_files
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / output
    if output != "gen":
        target.write_text("old\n")
    args = [part.format(cnn=cnn_path, input=input_path) for part in command] + [str(target)]
    message = assert_one_line_error(cnnlab(*args, preexec_fn=_file_size_limit(20_000)))
    assert str(out_dir) in message
    if output == "gen":  # refused before anything is written
        assert "in.csv would take about 56.1 MB, past the file-size limit of 20 kB (ulimit -f)" in message
        assert not target.exists(), "generate writes both files or neither"
    else:
        assert "File too large" in message
        assert files_in(out_dir) == [output] and target.read_text() == "old\n"


def test_a_full_file_system_is_one_line_and_keeps_the_old_output(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    # A 64 KB tmpfs in a private mount namespace (the outputs of 300 images take ~60 KB, plus the old file).
    cnn_path, input_path, _ = run_files
    mount = tmp_path / "small"
    mount.mkdir()
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {mount} && printf 'old\\n' > {mount}/out.csv"
        f" && head -c 20000 /dev/urandom > {mount}/filler"
        f" && {sys.executable} -m cnnlab cpu {cnn_path} {input_path} {mount}/out.csv;"
        f" echo status=$? >&2; ls -a {mount} >&2; cat {mount}/out.csv >&2"
    )
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                            env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=120)
    if "mount:" in result.stderr or "unshare:" in result.stderr:
        pytest.skip(f"no private mount namespace here: {result.stderr.strip()}")
    lines = result.stderr.splitlines()
    assert lines[0] == f"cnnlab: {mount}/out.csv: cannot write: No space left on device", result.stderr
    assert "status=2" in lines and sorted(lines[2:6]) == [".", "..", "filler", "out.csv"] and lines[-1] == "old"


def test_a_full_standard_output_is_one_line_and_keeps_nothing(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    """The lab's line, or --timing-json, that cannot be written fails the run before anything is renamed into place: the
    output file and the JSON file are as they were."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    cnn_path, input_path, _ = run_files
    output, timing = tmp_path / "out" / "out.csv", tmp_path / "out" / "timing.json"
    output.parent.mkdir()
    output.write_text("previous\n")
    with open("/dev/full", "w") as full:
        for args in (["cpu", cnn_path, input_path, output, "--timing-json", timing], ["cpu", cnn_path, input_path, "-"]):
            message = assert_one_line_error(cnnlab(*args, stdout=full))
            assert message == "cnnlab: <stdout>: cannot write: No space left on device\n"
    message = assert_one_line_error(cnnlab("cpu", cnn_path, input_path, output, "--timing-json", "/dev/full"))
    assert message == "cnnlab: /dev/full: cannot write: No space left on device\n"
    assert output.read_text() == "previous\n" and sorted(output.parent.iterdir()) == [output]


def test_a_signal_after_the_last_write_leaves_every_path_as_it_was(
    tmp_path: Path, run_files: tuple[Path, Path, bytes], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every output is written before any is renamed: a signal that arrives between the lab's line and the renames (here:
    as the line is printed) leaves the output and --timing-json files as they were, and no temporary file."""
    from cnnlab import interrupts
    from cnnlab.cli import commands

    cnn_path, input_path, _ = run_files
    output, timing = tmp_path / "out" / "out.csv", tmp_path / "out" / "timing.json"
    output.parent.mkdir()
    output.write_text("previous\n")

    def interrupted(text: str, to_stderr: bool = False) -> None:
        interrupts._raise_for(signal.SIGTERM, None)

    monkeypatch.setattr(commands, "say", interrupted)
    monkeypatch.setattr(interrupts, "_received", [])
    assert cli.main(["cpu", str(cnn_path), str(input_path), str(output), "--timing-json", str(timing)]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "cnnlab: terminated\n"
    assert output.read_text() == "previous\n" and sorted(output.parent.iterdir()) == [output]


def test_a_pipe_closed_early_ends_the_run_quietly(run_files: tuple[Path, Path, bytes]) -> None:
    cnn_path, input_path, _ = run_files
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before the first output: every write fails with EPIPE
    with os.fdopen(writer, "w") as closed:
        result = cnnlab("cpu", cnn_path, input_path, "-", stdout=closed)
    assert (result.returncode, result.stderr) == (CLOSED_PIPE_STATUS, "")


# Outputs that are not plain files, and standard streams.


def test_a_symbolic_link_is_written_through_and_stays_a_link(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    cnn_path, input_path, expected = run_files
    (tmp_path / "target.csv").write_text("old\n")
    (tmp_path / "link.csv").symlink_to("target.csv")
    (tmp_path / "dangling.csv").symlink_to("made/new.csv")
    for link in ("link.csv", "dangling.csv"):
        result = cnnlab("cpu", cnn_path, input_path, tmp_path / link)
        assert result.returncode == 0, result.stderr
        assert (tmp_path / link).is_symlink() and (tmp_path / link).read_bytes() == expected
    assert (tmp_path / "target.csv").read_bytes() == expected and (tmp_path / "made" / "new.csv").is_file()
    assert files_in(tmp_path) == ["cnn.csv", "dangling.csv", "in.csv", "link.csv", "made", "target.csv"]


def test_a_fifo_output_is_written_to_and_stays_a_fifo(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    cnn_path, input_path, expected = run_files
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = cnnlab("cpu", cnn_path, input_path, fifo)
    reader.join(timeout=60)
    assert result.returncode == 0, result.stderr
    assert received == [expected] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_device_output_is_written_to_and_never_replaced(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    # A null device of our own, made in tmp_path: the machine's /dev is never touched.
    cnn_path, input_path, _ = run_files
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as error:
        pytest.skip(f"cannot make a device node here: {error}")
    result = cnnlab("cpu", cnn_path, input_path, null)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISCHR(null.stat().st_mode) and null.stat().st_rdev == os.makedev(1, 3)
    assert files_in(tmp_path) == ["cnn.csv", "in.csv", "null"]


def test_dash_reads_standard_input_and_writes_standard_output(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    cnn_path, input_path, expected = run_files
    with open(input_path) as stdin:
        result = cnnlab("cpu", cnn_path, "-", "-", stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert result.stdout.encode() == expected and TIMING_LINE.match(result.stderr)
    with open(input_path) as stdin:
        assert "convert reads its input twice" in assert_one_line_error(cnnlab("convert", "-", tmp_path / "x.npy", stdin=stdin))


def test_names_up_to_the_file_systems_limit_work_and_longer_is_one_line(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    cnn_path, input_path, expected = run_files
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    longest = "é" * ((limit - 4) // 2) + ".csv"  # two bytes a character in UTF-8: the temporary name must fit too
    assert len(os.fsencode(longest)) <= limit
    result = cnnlab("cpu", cnn_path, input_path, tmp_path / longest)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / longest).read_bytes() == expected
    too_long = "a" * (limit + 1)
    assert "File name too long" in assert_one_line_error(cnnlab("cpu", cnn_path, input_path, tmp_path / too_long))
    assert files_in(tmp_path) == sorted(["cnn.csv", "in.csv", longest])


@pytest.mark.parametrize("json_is", ["the output, not yet written", "the input", "under a file"])
def test_timing_json_is_checked_before_the_run(tmp_path: Path, run_files: tuple[Path, Path, bytes], json_is: str) -> None:
    cnn_path, input_path, _ = run_files
    output = tmp_path / "new" / "out.csv"
    json_path = {"the output, not yet written": output, "the input": input_path, "under a file": input_path / "t.json"}[json_is]
    message = assert_one_line_error(cnnlab("cpu", cnn_path, input_path, output, "--timing-json", json_path))
    assert str(json_path) in message
    assert files_in(tmp_path) == ["cnn.csv", "in.csv"], "nothing is created when the run cannot finish"


# Hostile .npy files, in every command that reads them.


def _npy(header: str, data: bytes = b"", version: int = 1) -> bytes:
    text = header.encode("latin1")
    body = text + b" " * (63 - (12 + len(text)) % 64) + b"\n"
    length = struct.pack("<H", len(body)) if version == 1 else struct.pack("<I", len(body))
    return b"\x93NUMPY" + bytes([version, 0]) + length + body + data


def _shape(shape: str, descr: str = "<f8") -> str:
    return f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"


HOSTILE_NPY = {
    "byte count past 64 bits": (_npy(_shape("(18446744073709551616, 100, 100)")), "bytes its header announces"),
    "header syntax error": (_npy(_shape("(2, 100, 100")), "header cannot be parsed"),
    "header over 10,000 bytes": (_npy(_shape("(2, 100, 100)") + " " * 20_000, version=2), "over the 10,000 bytes"),
    "negative size": (_npy(_shape("(-2, 100, 100)")), "negative size"),
    "zero images": (_npy(_shape("(0, 100, 100)")), "shape (0, 100, 100)"),
    "pickled objects": (_npy(_shape("(2, 100, 100)", "|O"), b"\x80\x04N."), "needs float64"),
    "code in the header": (_npy("__import__('os').system('false')"), "header cannot be parsed"),
    "truncated data": (_npy(_shape("(2, 100, 100)"), b"\x01" * 1000), "file ends after"),
    "data after the images": (_npy(_shape("(1, 100, 100)"), b"\x01" * 80_008), "bytes its header announces (80134 bytes)"),
    "truncated magic": (b"\x93NUM", "not a .npy file"),
    "a shape of booleans": (_npy(_shape("(True, 100, 100)")), "not one of whole numbers"),
}


@pytest.mark.parametrize("case", HOSTILE_NPY)
@pytest.mark.parametrize("command", [*RUN_MODES, "convert", "compare"])
def test_hostile_npy_headers_are_one_line(tmp_path: Path, rng: np.random.Generator, case: str, command: str) -> None:
    cnn_path, _ = write_files(tmp_path, random_cnn(rng), random_values(rng, 1, 100, 100))
    content, expected = HOSTILE_NPY[case]
    hostile = tmp_path / "hostile.npy"
    hostile.write_bytes(content)
    args = {"cpu": ["cpu", cnn_path, hostile, tmp_path / "out.csv"], "cuda": ["cuda", cnn_path, hostile, tmp_path / "out.csv"],
            "convert": ["convert", hostile, tmp_path / "out.csv"],
            "compare": ["compare", hostile, hostile]}[command]
    message = assert_one_line_error(cnnlab(*args))
    assert message.startswith(f"cnnlab: {hostile}: ") and expected in message
    assert files_in(tmp_path) == ["cnn.csv", "hostile.npy", "in.csv"]


def test_a_npy_input_through_a_fifo_gives_the_files_outputs(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    cnn_path, input_path, expected = run_files
    assert cnnlab("convert", input_path, tmp_path / "in.npy").returncode == 0
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes((tmp_path / "in.npy").read_bytes()))
    writer.start()
    result = cnnlab("cpu", cnn_path, fifo, tmp_path / "out.csv")
    writer.join(timeout=60)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out.csv").read_bytes() == expected


def test_a_npy_input_through_a_fifo_that_goes_on_after_its_images_is_refused(
    tmp_path: Path, run_files: tuple[Path, Path, bytes]
) -> None:
    """Two .npy files run together into a pipe: the first's images are not the file's."""
    cnn_path, input_path, _ = run_files
    assert cnnlab("convert", input_path, tmp_path / "in.npy").returncode == 0
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    def write_twice() -> None:
        with suppress(BrokenPipeError):  # cnnlab stops reading once it has seen the second file's first byte
            fifo.write_bytes(2 * (tmp_path / "in.npy").read_bytes())

    writer = threading.Thread(target=write_twice)
    writer.start()
    (tmp_path / "out.csv").write_text("old\n")
    message = assert_one_line_error(cnnlab("cpu", cnn_path, fifo, tmp_path / "out.csv"))
    writer.join(timeout=60)
    assert message.startswith(f"cnnlab: {fifo}: data after the ") and (tmp_path / "out.csv").read_text() == "old\n"


def test_a_npy_file_truncated_while_being_read_is_an_error_not_a_crash(tmp_path: Path, rng: np.random.Generator) -> None:
    path = tmp_path / "in.npy"
    images = random_values(rng, 8, 100, 100)
    np.save(path, images)
    with NpyImageReader(path) as reader:
        first = np.empty((4, 100, 100))
        assert reader.read_into(first) == 4 and np.array_equal(first, images[:4])
        os.truncate(path, path.stat().st_size - 100_000)  # another process cuts the file: the read comes up short
        with pytest.raises(InputFileError, match="file ends after 6 of the 8 images"):
            reader.read_into(np.empty((4, 100, 100)))


MAPPED_GUARD = pytest.mark.skipif(npy.MappedFile is None, reason="the native mapping guard (cnnlab.files._mapped_guard) is not built")


# Whole pages lost (reading them faults: SIGBUS, caught), the tail of the last page only (it reads as zeros, no
# fault), or whole pages lost and the file then grown back to its size (the pages read as zeros stay zeros).
@MAPPED_GUARD
@pytest.mark.parametrize("cut, regrown", [(100_000, False), (100, False), (100_000, True)])
def test_a_mapped_npy_file_truncated_while_being_read_is_an_error_not_a_crash(
    tmp_path: Path, rng: np.random.Generator, cut: int, regrown: bool
) -> None:
    path = tmp_path / "in.npy"
    images = random_values(rng, 8, 100, 100)
    np.save(path, images)
    content = path.read_bytes()
    with NpyImageReader(path) as reader:
        assert reader.map()
        first, second = reader.next_view(4), reader.next_view(4)
        assert np.array_equal(first, images[:4]) and np.array_equal(second, images[4:])
        os.truncate(path, len(content) - cut)
        assert second[-1, -1, -1] == 0.0  # read past the new end: zeros where the process would have died
        if regrown:
            with path.open("ab") as file:
                file.write(content[-cut:])
        with pytest.raises(InputFileError, match="cut short while it was read"):
            reader.finish()


class TruncatingBackend(CpuBackend):
    """The CPU backend, whose batch `at` (from 1) finds its input file cut short by `cut` bytes, as another program may
    do: the first, so that the reader's next batch finds the file short; or the last, whose lost pages the forward's
    threads fault on, so that only the end-of-input check stands between them and a kept output."""

    def __init__(self, cnn: Cnn, path: Path, cut: int, at: int) -> None:
        super().__init__(cnn, batch_size=4)
        self._path, self._cut, self._at, self.batches = path, cut, at, 0

    def compute(self, batch: ImageBatch, check_finite: bool = False) -> OutputBatch:
        self.batches += 1
        if self.batches == self._at:
            os.truncate(self._path, self._path.stat().st_size - self._cut)
        return super().compute(batch, check_finite)


@MAPPED_GUARD
@pytest.mark.parametrize("cut", [300_000, 100])
@pytest.mark.parametrize("at", [1, 10])
@pytest.mark.parametrize("read_ahead", [True, False])
def test_a_run_whose_mapped_npy_file_is_truncated_writes_nothing(
    tmp_path: Path, rng: np.random.Generator, cut: int, at: int, read_ahead: bool
) -> None:
    cnn = random_cnn(rng)
    np.save(tmp_path / "in.npy", random_values(rng, 40, 100, 100))  # 10 batches of 4
    with TruncatingBackend(cnn, tmp_path / "in.npy", cut, at) as backend, pytest.raises(InputFileError, match="cut short"):
        run_network(backend, tmp_path / "in.npy", tmp_path / "out.csv", read_ahead)
    assert files_in(tmp_path) == ["in.npy"]


GUARD_SCRIPT = """\
import faulthandler, mmap, os, signal, sys
from cnnlab.files._mapped_guard import MappedFile
path = sys.argv[1]
with open(path, 'wb') as file: file.write(b'x' * 65536)
guarded = MappedFile(os.open(path, os.O_RDONLY), 65536)
{}
"""
# The guard's handler takes only faults in the files it mapped; any other signal goes on as it would have without it.
GUARD_CASES = {
    "a fault outside": (
        "with open(path, 'rb') as file: other = mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ)\n"
        "os.truncate(path, 0)\nprint(memoryview(guarded)[40000], flush=True)\nprint(other[40000])",
        -signal.SIGBUS, "0\n"),
    "SIGBUS sent by kill": ("print(1, flush=True)\nos.kill(os.getpid(), signal.SIGBUS)\nprint(2)", -signal.SIGBUS, "1\n"),
    # faulthandler put in place after the first mapping, over the guard's handler: the next mapping puts it back on top
    "faulthandler enabled later": (
        "faulthandler.enable()\nagain = MappedFile(os.open(path, os.O_RDONLY), 65536)\nos.truncate(path, 0)\n"
        "print(memoryview(guarded)[40000], memoryview(again)[40000])", 0, "0 0\n"),
}


@MAPPED_GUARD
@pytest.mark.parametrize("case", sorted(GUARD_CASES))
def test_the_mapping_guard_takes_its_own_faults_only(tmp_path: Path, case: str) -> None:
    body, status, printed = GUARD_CASES[case]
    command = [sys.executable, "-c", GUARD_SCRIPT.format(body), str(tmp_path / "file")]
    result = subprocess.run(command, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (status, printed), result.stderr


# Signals during start-up, and memory.


@pytest.mark.parametrize("signum, status, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_signal_during_start_up_is_one_line(tmp_path: Path, rng: np.random.Generator, signum: int, status: int, word: str) -> None:
    # The child starts with the signal blocked, so that one sent during the interpreter's own start-up (before
    # cnnlab's first line runs, where Python's handling applies) waits until cnnlab's handlers are in place.
    # From then on, through the imports of numpy and cnnlab to the run itself, it is one line at any moment.
    cnn, images = random_cnn(rng), random_values(rng, 2, 100, 100)
    cnn_path, input_path = write_files(tmp_path, cnn, images)
    command = [sys.executable, "-m", "cnnlab", "cpu", str(cnn_path), str(input_path), str(tmp_path / "out.csv")]
    whole = format_rows(cpu_outputs(cnn, images))
    stopped = 0
    for delay in (0.0, 0.02, 0.05, 0.08, 0.12, 0.16, 0.2, 0.25, 0.3):
        process = subprocess.Popen(command, env=SUBPROCESS_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signum}))
        time.sleep(delay)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
        if process.returncode == 0 and delay > 0:
            (tmp_path / "out.csv").unlink()  # the run finished first: its output stands, and the next try starts clean
            continue
        assert (process.returncode, stderr, stdout) == (status, f"cnnlab: {word}\n", ""), f"after {delay} s"
        if (tmp_path / "out.csv").exists():  # the signal came after the output was in place: it must be whole
            assert (tmp_path / "out.csv").read_text() == whole, f"after {delay} s"
            (tmp_path / "out.csv").unlink()
        assert files_in(tmp_path) == ["cnn.csv", "in.csv"]
        stopped += 1
    assert stopped >= 3


def test_an_interrupted_generate_leaves_both_files_or_neither(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "cnnlab", "generate", "--images", "2000", "--out-dir", str(tmp_path / "gen")]
    process = subprocess.Popen(command, env=SUBPROCESS_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "gen").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert (process.returncode, stderr) == (130, "cnnlab: interrupted\n")
    assert files_in(tmp_path / "gen") == []


def test_a_huge_n_and_batch_size_buffers_by_the_file(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 2, 100, 100))
    text = input_path.read_text().split("\n", 1)[1]
    (tmp_path / "huge.csv").write_text("999999999999999999\n" + text)
    address_space = lambda: resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # noqa: E731
    for source in ("file", "pipe"):
        args = ["cpu", cnn_path, tmp_path / "huge.csv" if source == "file" else "-", tmp_path / "out.csv", "--batch", "1000000000"]
        with open(tmp_path / "huge.csv") as stdin:
            result = cnnlab(*args, stdin=stdin if source == "pipe" else None, preexec_fn=address_space)
        assert "file ends after 2 of the 999999999999999999 images" in assert_one_line_error(result), source


def test_a_modest_file_runs_under_a_modest_limit_in_smaller_steps(tmp_path: Path, rng: np.random.Generator) -> None:
    """Under 300 MB of address space (numpy and the threads' stacks take half), the reader's steps and the batch shrink
    until their buffers fit: the run gives the outputs it gives without a limit."""
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 200, 100, 100))
    assert cnnlab("cpu", cnn_path, input_path, tmp_path / "free.csv", "--threads", "2").returncode == 0
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (300 << 20, 300 << 20))  # noqa: E731
    result = cnnlab("cpu", cnn_path, input_path, tmp_path / "limited.csv", "--threads", "2", preexec_fn=limit)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "limited.csv").read_bytes() == (tmp_path / "free.csv").read_bytes()
    # A count of 10^12 images on a pipe and a batch of 10^9: buffers fit the limit, and the input's end is the error.
    reader, writer = os.pipe()
    os.write(writer, b"1000000000000\n")
    os.close(writer)
    with os.fdopen(reader) as pipe:
        result = cnnlab("cpu", cnn_path, "-", tmp_path / "out.csv", "--batch", "1000000000", stdin=pipe, preexec_fn=limit)
    assert "file ends after 0 of the 1000000000000 images" in assert_one_line_error(result)


def test_memory_the_system_will_not_map_is_named_with_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import mmap

    from cnnlab.errors import ResourceError
    from cnnlab.network import own_pages

    def refused(*args: object) -> None:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refused)
    with pytest.raises(ResourceError, match=r"^out of memory: an image buffer of 1.6 GB cannot be mapped"):
        own_pages(20_000 * 80_000, "an image buffer")


@pytest.mark.parametrize("megabytes", [100, 180, 250, 400, 2000])
@pytest.mark.parametrize("mode", RUN_MODES)
def test_a_low_memory_limit_is_a_result_or_one_line(tmp_path: Path, rng: np.random.Generator, megabytes: int, mode: str) -> None:
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 4, 100, 100))
    limit = megabytes << 20
    result = cnnlab(mode, cnn_path, input_path, tmp_path / "out.csv",
                    preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    if result.returncode == 0:
        assert TIMING_LINE.match(result.stdout) and (tmp_path / "out.csv").read_text().count("\n") == 4
    else:
        assert f"address-space limit of {megabytes} MB (ulimit -v)" in assert_one_line_error(result)


# Values.


@pytest.mark.parametrize("mode", RUN_MODES)
def test_outputs_that_overflow_are_refused_naming_the_image(tmp_path: Path, rng: np.random.Generator, mode: str) -> None:
    images = random_values(rng, 3, 100, 100)
    images[1] *= 1e306  # finite inputs whose products overflow
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), images)
    message = assert_one_line_error(cnnlab(mode, cnn_path, input_path, tmp_path / "out.csv"))
    assert message == f"cnnlab: {input_path}: the outputs of image 2 are not finite: the network overflows float64 on it\n"
    assert files_in(tmp_path) == ["cnn.csv", "in.csv"]


def test_n_with_a_plus_sign_is_accepted_as_rusts_usize_parser_did(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    cnn_path, input_path, expected = run_files
    plus = tmp_path / "plus.csv"
    plus.write_text("+300\n" + input_path.read_text().split("\n", 1)[1])
    assert cnnlab("cpu", cnn_path, plus, tmp_path / "out.csv").returncode == 0
    assert (tmp_path / "out.csv").read_bytes() == expected
    plus.write_text("++300\n" + input_path.read_text().split("\n", 1)[1])
    assert "positive integer, not '++300'" in assert_one_line_error(cnnlab("cpu", cnn_path, plus, tmp_path / "out.csv"))


def test_counts_past_any_file_are_one_line_each(tmp_path: Path, rng: np.random.Generator) -> None:
    """Thread counts past a C int and counts of images of 19 digits or more are refused in one line, naming what."""
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 2, 100, 100))
    out = tmp_path / "out.csv"
    for threads in ("2147483648", "99999999999999999999"):
        message = assert_one_line_error(cnnlab("cpu", "--threads", threads, cnn_path, input_path, out))
        assert f"--threads: expected a positive integer of at most 65536, not '{threads}'" in message
    message = assert_one_line_error(cnnlab("cpu", cnn_path, input_path, out, env={"OMP_NUM_THREADS": "4294967296"}))
    assert message == "cnnlab: OMP_NUM_THREADS=4294967296: more than the 65536 threads a run may have\n"
    rows = input_path.read_text().split("\n", 1)[1]
    huge = tmp_path / "huge.csv"
    huge.write_text("9999999999999999999\n" + rows)
    message = assert_one_line_error(cnnlab("cpu", cnn_path, huge, out))
    assert message == f"cnnlab: {huge}:1: the first line announces 9999999999999999999 images: more than any file holds\n"
    huge.write_text("\n\n" + rows)  # no count line: the first line that is not blank is a row
    message = assert_one_line_error(cnnlab("cpu", cnn_path, huge, out))
    assert message.startswith(f"cnnlab: {huge}:3: the first line that is not blank must hold the number of matrices")
    (tmp_path / "empty.csv").write_text("")
    message = assert_one_line_error(cnnlab("cpu", tmp_path / "empty.csv", input_path, out))
    assert message == f"cnnlab: {tmp_path / 'empty.csv'}: file ends after 0 of the 10 lines of convolution filters\n"
    assert not out.exists()


def test_a_negative_seed_is_a_usage_error(tmp_path: Path) -> None:
    message = assert_one_line_error(cnnlab("generate", "--seed", "-1", "--out-dir", tmp_path / "gen"))
    assert "--seed: expected a non-negative integer, not '-1'" in message and not (tmp_path / "gen").exists()


# What a hostile sweep of the first version found (each was a traceback, a lost file or a wrong status).


def test_dev_stdout_is_written_through_its_descriptor_never_replaced(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    # `cnnlab cpu ... /dev/stdout >> log`: the log keeps what it held and gets the outputs after it; the lab's timing
    # line goes to stderr, as with `-`, so that the outputs stay a clean file.
    cnn_path, input_path, expected = run_files
    log = tmp_path / "log.txt"
    log.write_bytes(b"earlier\n")
    with open(log, "a") as appending:
        result = cnnlab("cpu", cnn_path, input_path, "/dev/stdout", stdout=appending)
    assert result.returncode == 0, result.stderr
    assert log.read_bytes() == b"earlier\n" + expected and TIMING_LINE.match(result.stderr)
    # The same descriptor twice is refused, each named as given (`-` as <stdout>); the first as docs/faults.md quotes it.
    messages = []
    for output, option, other, named in [
        ("/dev/stdout", "--timing-json", "/dev/stdout", "the output /dev/stdout and --timing-json /dev/stdout"),
        ("-", "--timing-json", "/dev/stdout", "the output <stdout> and --timing-json /dev/stdout"),
        ("/dev/fd/1", "--trace", "-", "the output /dev/fd/1 and --trace <stdout>"),
    ]:
        with open(log, "w") as stdout:
            message = assert_one_line_error(cnnlab("cpu", cnn_path, input_path, output, option, other, stdout=stdout))
        assert message == f"cnnlab: {named} cannot both be written to descriptor 1\n" and log.read_bytes() == b""
        messages.append(message.removeprefix("cnnlab: ").rstrip("\n"))
    assert_quoted("faults.md", messages[0])


@pytest.mark.parametrize("name, message", [("", "file name is empty"), ("new.csv/", "names a directory"),
                                           ("missing/..", "is a directory")])
def test_output_names_that_cannot_be_files_are_refused_before_the_run(
    tmp_path: Path, run_files: tuple[Path, Path, bytes], name: str, message: str
) -> None:
    cnn_path, input_path, _ = run_files
    assert message in assert_one_line_error(cnnlab("cpu", cnn_path, input_path, name, cwd=tmp_path))
    assert files_in(tmp_path) == ["cnn.csv", "in.csv"]


def test_a_replaced_output_keeps_its_mode(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    cnn_path, input_path, expected = run_files
    private = tmp_path / "private.csv"
    private.write_text("old\n")
    private.chmod(0o600)
    assert cnnlab("cpu", cnn_path, input_path, private).returncode == 0
    assert private.read_bytes() == expected and stat.S_IMODE(private.stat().st_mode) == 0o600


def test_closed_standard_streams_and_a_full_help_are_one_line(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    cnn_path, input_path, _ = run_files
    closed_stdout = cnnlab("cpu", cnn_path, input_path, tmp_path / "out.csv", stdout=None, preexec_fn=lambda: os.close(1))
    assert "standard output is closed" in assert_one_line_error(closed_stdout)
    closed_stdin = cnnlab("cpu", cnn_path, "-", tmp_path / "out2.csv", preexec_fn=lambda: os.close(0))
    assert assert_one_line_error(closed_stdin) == "cnnlab: <stdin>: Bad file descriptor\n"
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            assert "No space left on device" in assert_one_line_error(cnnlab("--help", stdout=full))


def _stderr_closed() -> None:
    os.close(2)


def _stderr_full() -> None:
    os.dup2(os.open("/dev/full", os.O_WRONLY), 2)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_closed_or_full_standard_error_keeps_the_outputs_and_the_status(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    """Standard error closed (2>&-) is as 2>/dev/null: a valid run writes its outputs and exits 0, and no file opened
    later takes descriptor 2. A refused run exits 2 with the output as it was, whether its line has nowhere to go or
    cannot be written (2>/dev/full); so does a run whose lab's line, with the outputs on standard output, cannot."""
    cnn_path, input_path, expected = run_files
    output = tmp_path / "out.csv"
    closed = cnnlab("cpu", cnn_path, input_path, output, preexec_fn=_stderr_closed)
    assert closed.returncode == 0 and TIMING_LINE.match(closed.stdout) and output.read_bytes() == expected
    cut = tmp_path / "cut.csv"
    cut.write_bytes(input_path.read_bytes()[:5000])
    for stderr in (_stderr_closed, _stderr_full):
        output.write_text("old\n")
        refused = cnnlab("cpu", cnn_path, cut, output, preexec_fn=stderr)
        assert (refused.returncode, refused.stdout, output.read_text()) == (2, "", "old\n")
    to_stdout = cnnlab("cpu", cnn_path, input_path, "-", preexec_fn=_stderr_full)
    assert to_stdout.returncode == 2 and to_stdout.stdout == expected.decode()


def test_standard_output_on_the_input_or_another_output_is_refused(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    """`cnnlab cpu cnn.csv in.csv - >> in.csv` would append the outputs to the file being read, and `... - --timing-json
    t.json > t.json` replace them with the JSON file."""
    cnn_path, input_path, _ = run_files
    before = input_path.read_bytes()
    with open(input_path, "a") as appended:
        message = assert_one_line_error(cnnlab("cpu", cnn_path, input_path, "-", stdout=appended))
    assert "<stdout>: is the input file" in message and input_path.read_bytes() == before
    for option in ("--timing-json", "--trace"):
        other = tmp_path / "other.json"
        with open(other, "w") as stdout:
            message = assert_one_line_error(cnnlab("cpu", cnn_path, input_path, "-", option, other, stdout=stdout))
        assert message == f"cnnlab: {other}: is the output file /dev/stdout; refusing to write over it\n"


def test_a_npy_output_file_through_a_fifo_that_goes_on_is_refused(tmp_path: Path, rng: np.random.Generator) -> None:
    outputs, fifo = tmp_path / "out.npy", tmp_path / "pipe.npy"
    np.save(outputs, rng.uniform(-10, 10, (4, 10)))
    os.mkfifo(fifo)

    def write_twice() -> None:
        with suppress(BrokenPipeError):
            fifo.write_bytes(2 * outputs.read_bytes())

    writer = threading.Thread(target=write_twice)
    writer.start()
    message = assert_one_line_error(cnnlab("compare", fifo, outputs))
    writer.join(timeout=60)
    assert message == f"cnnlab: {fifo}: data after the 320 data bytes its header announces\n"


def test_a_read_error_after_opening_is_one_line(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    cnn_path, _, _ = run_files
    # /proc/self/mem opens, then fails every read at offset 0 with EIO, as a failing disk would.
    for args in (["cpu", cnn_path, "/proc/self/mem", tmp_path / "out.csv"], ["cpu", "/proc/self/mem", cnn_path, tmp_path / "out.csv"]):
        assert assert_one_line_error(cnnlab(*args)) == "cnnlab: /proc/self/mem: cannot read: Input/output error\n"


def test_a_hang_up_is_129_and_nohup_keeps_running(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 2, 100, 100))
    command = [sys.executable, "-m", "cnnlab", "cpu", str(cnn_path), str(input_path), str(tmp_path / "out.csv")]
    for ignored, expected in ((False, (129, "cnnlab: hung up\n")), (True, (0, ""))):
        def start(ignored: bool = ignored) -> None:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
            # Set either way: a suite run under nohup would otherwise hand the first run an ignored SIGHUP too.
            signal.signal(signal.SIGHUP, signal.SIG_IGN if ignored else signal.SIG_DFL)

        process = subprocess.Popen(command, env=SUBPROCESS_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=start)
        process.send_signal(signal.SIGHUP)
        _, stderr = process.communicate(timeout=60)
        assert (process.returncode, stderr) == expected


def test_convert_and_a_run_refuse_values_the_csv_cannot_hold(tmp_path: Path, rng: np.random.Generator) -> None:
    """convert to CSV names the row of an output file, the image of an input file; a run the image: each message as
    docs/faults.md and docs/files.md quote it."""
    rows = random_values(rng, 3, 10)
    rows[1, 4] = np.nan
    np.save(tmp_path / "rows.npy", rows)
    images = random_values(rng, 4, 100, 100)
    images[2, 5, 5] = np.nan
    np.save(tmp_path / "images.npy", images)
    images[2, 5, 5] = np.inf
    np.save(tmp_path / "infinite.npy", images)
    cnn_path, _ = write_files(tmp_path, random_cnn(rng), images[:1])
    for command, message in [
        (("convert", "rows.npy", "rows.csv"), "row 2 holds nan, which CSV cannot hold (finite values only)"),
        (("convert", "images.npy", "images.csv"), "image 3 holds nan, which CSV cannot hold (finite values only)"),
        (("convert", "infinite.npy", "images.csv"), "image 3 holds inf, which CSV cannot hold (finite values only)"),
        (("cpu", cnn_path, "images.npy", "out.csv"), "image 3 holds nan: the network takes finite values only"),
        (("cpu", cnn_path, "infinite.npy", "out.csv"), "image 3 holds inf: the network takes finite values only"),
    ]:
        assert assert_one_line_error(cnnlab(*command, cwd=tmp_path)).endswith(f": {message}\n")
        for page in ("faults.md", "files.md") if "nan" in message else ():  # the pages quote the NaN's
            assert_quoted(page, message)
    assert not any(path.name.endswith(".csv") and path.name not in ("cnn.csv", "in.csv") for path in tmp_path.iterdir())


def test_a_signal_between_two_renames_waits_for_the_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # generate's pair: a SIGTERM that arrives after the first rename (from any thread: OpenBLAS's too) is raised
    # only once both files are in place.
    from cnnlab import interrupts
    from cnnlab.files.safety import AtomicOutput, OutputSet

    previous = {signum: signal.getsignal(signum) for signum in interrupts.SIGNAL_EXITS}
    together = OutputSet()
    first, second = AtomicOutput(tmp_path / "cnn.csv", together=together), AtomicOutput(tmp_path / "in.csv", together=together)
    place = AtomicOutput.place

    def place_then_signal(self: AtomicOutput) -> None:
        place(self)
        if self is first:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(AtomicOutput, "place", place_then_signal)
    try:
        interrupts.install()
        with pytest.raises(interrupts.Terminated):
            with together, first as cnn_out, second as input_out:
                cnn_out.write("new cnn\n")
                input_out.write("new input\n")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        interrupts._received.clear()
    assert (tmp_path / "cnn.csv").read_text() == "new cnn\n" and (tmp_path / "in.csv").read_text() == "new input\n"
    assert files_in(tmp_path) == ["cnn.csv", "in.csv"]


def test_a_signal_as_an_output_s_temporary_file_is_made_removes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM that arrives just as the temporary file is created, before its name is known (as one did on a busy CI
    host): raised once it is, so that the file goes with the run."""
    from cnnlab import interrupts
    from cnnlab.files import safety

    real_open = os.open

    def open_then_signal(path: str, *args: int, **kwargs: int | None) -> int:
        descriptor = real_open(path, *args, **kwargs)
        if str(path).endswith(safety._TEMPORARY_SUFFIX):
            os.kill(os.getpid(), signal.SIGTERM)
        return descriptor

    previous = {signum: signal.getsignal(signum) for signum in interrupts.SIGNAL_EXITS}
    descriptors = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "open", open_then_signal)
    try:
        interrupts.install()
        with pytest.raises(interrupts.Terminated), safety.AtomicOutput(tmp_path / "out.csv"):
            pytest.fail("the block ran")
    finally:
        monkeypatch.undo()  # os.open as it was, before the temporary folder is removed
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        interrupts._received.clear()
    assert files_in(tmp_path) == [] and len(os.listdir("/proc/self/fd")) == descriptors  # its descriptor closed too


def test_an_output_whose_temporary_file_cannot_take_the_target_s_mode_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure between the temporary file's creation and its file object (the target's mode unreadable): the error
    names the output, and neither the file nor its descriptor is left."""
    from cnnlab.errors import OutputFileError
    from cnnlab.files import safety

    def cannot_read_the_mode(descriptor: int, target: str) -> None:
        raise PermissionError(13, "Permission denied", target)

    monkeypatch.setattr(safety, "_take_mode", cannot_read_the_mode)
    descriptors = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OutputFileError, match="cannot write here"), safety.AtomicOutput(tmp_path / "out.csv"):
        pytest.fail("the block ran")
    assert files_in(tmp_path) == [] and len(os.listdir("/proc/self/fd")) == descriptors


def test_a_signal_while_the_reader_starts_stops_it_before_the_caller_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM that arrives as the prefetcher's thread starts (in __enter__, so before the `with` block holds it): the
    thread is stopped and joined before it is raised, so that it never reads into buffers the caller frees next."""
    from cnnlab import interrupts
    from cnnlab.run import Prefetcher

    readers: list[threading.Thread] = []
    start = threading.Thread.start

    def read(slot: object, stop: threading.Event) -> None:
        readers.append(threading.current_thread())
        stop.wait(30)  # as a read of a stalled pipe does, until the run stops it

    def start_then_signal(thread: threading.Thread) -> None:
        start(thread)
        if thread.name == "cnnlab-reader":
            os.kill(os.getpid(), signal.SIGTERM)

    previous = {signum: signal.getsignal(signum) for signum in interrupts.SIGNAL_EXITS}
    monkeypatch.setattr(threading.Thread, "start", start_then_signal)
    try:
        interrupts.install()
        with pytest.raises(interrupts.Terminated), Prefetcher(read, [None]):
            pytest.fail("the block ran")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        interrupts._received.clear()
    assert len(readers) == 1 and not readers[0].is_alive()


def test_a_reader_thread_that_runs_only_after_close_reads_nothing() -> None:
    """Without the command line's handlers (the API in a notebook) a SIGINT inside Thread.start() can leave the thread
    launched but not yet running, which close() cannot join: once it runs, it reads nothing into the caller's slots."""
    from cnnlab.run import Prefetcher

    reads: list[object] = []
    prefetcher = Prefetcher(lambda slot, stop: reads.append(slot), ["slot"])
    prefetcher.close()
    prefetcher._thread.start()  # as the launched thread would run, late
    prefetcher._thread.join(10)
    assert reads == [] and not prefetcher._thread.is_alive()


def test_a_signal_stops_a_run_whose_piped_input_stalls(tmp_path: Path, run_files: tuple[Path, Path, bytes]) -> None:
    # The reader thread waits on a pipe whose writer has gone quiet: SIGTERM ends the run now, not when the writer writes.
    cnn_path, input_path, _ = run_files
    command = [sys.executable, "-m", "cnnlab", "cpu", str(cnn_path), "-", str(tmp_path / "out.csv"), "--batch", "10"]
    process = subprocess.Popen(command, env=SUBPROCESS_ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdin is not None
    process.stdin.write(input_path.read_bytes()[:300_000])  # N and a few images: the run starts, then waits
    process.stdin.flush()
    deadline = time.monotonic() + 60
    while not any(path.name.startswith(".out.csv.") for path in tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    process.send_signal(signal.SIGTERM)
    try:
        status = process.wait(timeout=10)  # the writer is still open (wait, unlike communicate, keeps it so)
    finally:
        process.kill()
        process.stdin.close()
    assert process.stderr is not None
    assert (status, process.stderr.read()) == (143, b"cnnlab: terminated\n")
    assert files_in(tmp_path) == ["cnn.csv", "in.csv"]


@pytest.mark.parametrize("mode", RUN_MODES)
def test_a_npy_infinity_that_the_relu_would_hide_is_still_refused(tmp_path: Path, rng: np.random.Generator, mode: str) -> None:
    # Filters all positive: a -inf makes every conv sum over it -inf, which ReLU turns into 0, so the outputs stay
    # finite; the run must refuse the image all the same (it is checked as it is computed, not by its outputs).
    cnn = random_cnn(rng)
    cnn = type(cnn)(np.abs(cnn.filters), cnn.weights)
    images = random_values(rng, 3, 100, 100)
    images[1, 7, 3] = -np.inf
    cnn_path, _ = write_files(tmp_path, cnn, images[:1])
    np.save(tmp_path / "in.npy", images)
    message = assert_one_line_error(cnnlab(mode, cnn_path, tmp_path / "in.npy", tmp_path / "out.csv"))
    assert message == f"cnnlab: {tmp_path / 'in.npy'}: image 2 holds -inf: the network takes finite values only\n"
    assert not (tmp_path / "out.csv").exists()


# A mapped CSV file (cpu mode's text): whole pages lost (the take or the parse faults on them: SIGBUS, caught), or the
# tail of the last page only (it reads as zeros, no fault).
@MAPPED_GUARD
@pytest.mark.parametrize("cut", [300_000, 100])
def test_a_mapped_csv_file_truncated_while_being_read_is_an_error_not_a_crash(tmp_path: Path, rng: np.random.Generator, cut: int) -> None:
    images = random_values(rng, 12, 100, 100)
    _, path = write_files(tmp_path, random_cnn(rng), images)
    with CsvImageReader(path, threads=1) as reader:
        assert isinstance(reader._source, MappedTextSource)
        out = np.empty((4, 100, 100))
        assert reader.read_into(out, 4) == 4 and np.array_equal(out, images[:4])
        os.truncate(path, path.stat().st_size - cut)
        with pytest.raises(InputFileError, match="cut short while it was read"):
            while reader.read_into(out, 4):
                pass
            reader.finish()
