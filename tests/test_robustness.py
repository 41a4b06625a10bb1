"""Nothing lost, nothing half-written: paths, interruptions, device faults and random corruption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import BAD_INPUTS, SUBPROCESS_ENV, assert_one_line_error, cnnlab, input_lines, random_cnn, read_all_images, write_files
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cnnlab.cli import commands
from cnnlab.cli import main as cli
from cnnlab.constants import IMAGE_BYTES
from cnnlab.cpu.backend import CpuBackend
from cnnlab.errors import DeviceError
from cnnlab.files.csv_reader import STEP_IMAGES
from cnnlab.files.formats import open_outputs, read_outputs
from cnnlab.files.labcsv import read_cnn, write_input_file
from cnnlab.generate import random_values, write_cnn_file
from cnnlab.network import ImageBatch, OutputBatch

FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)
NO_FILES_LEFT = "no output and no temporary file may be left behind"


@pytest.mark.parametrize("which", ["input", "cnn", "input under another name"])
def test_output_that_is_an_input_is_refused_before_anything_is_written(tmp_path: Path, rng: np.random.Generator, which: str) -> None:
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 2, 100, 100))
    before = {path: path.read_bytes() for path in (cnn_path, input_path)}
    output = {"input": input_path, "cnn": cnn_path, "input under another name": tmp_path / "link.csv"}[which]
    if which == "input under another name":
        os.link(input_path, output)
    result = cnnlab("cpu", cnn_path, input_path, output)
    assert "refusing to write over it" in assert_one_line_error(result)
    assert {path: path.read_bytes() for path in before} == before
    expected = ["cnn.csv", "in.csv", *(["link.csv"] if output.name == "link.csv" else [])]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(expected)


@pytest.mark.parametrize("where", ["under a file", "a directory"])
def test_unwritable_output_is_a_one_line_error(tmp_path: Path, rng: np.random.Generator, where: str) -> None:
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 2, 100, 100))
    output = {"under a file": input_path / "out.csv", "a directory": tmp_path}[where]
    assert str(output) in assert_one_line_error(cnnlab("cpu", cnn_path, input_path, output))


class FailingBackend(CpuBackend):
    """A backend whose device fails on the second batch, as a failed launch or a lost GPU would."""

    name = "cuda"
    calls = 0

    def compute(self, batch: ImageBatch, check_finite: bool = False) -> OutputBatch:
        FailingBackend.calls += 1
        if FailingBackend.calls == 2:
            raise DeviceError("CUDA error while computing: cuEventSynchronize failed: an illegal memory access was encountered")
        return super().compute(batch, check_finite)


def test_device_failure_mid_run_is_one_line_and_leaves_no_output(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 5, 100, 100))
    (tmp_path / "out.csv").write_text("old\n")
    monkeypatch.setattr(commands, "make_backend", lambda mode, cnn, batch, *options: FailingBackend(cnn, batch))
    assert cli.main(["cuda", str(cnn_path), str(input_path), str(tmp_path / "out.csv"), "--batch", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "cnnlab: CUDA error while computing: cuEventSynchronize failed: an illegal memory access was encountered\n"
    assert captured.out == "" and (tmp_path / "out.csv").read_text() == "old\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cnn.csv", "in.csv", "out.csv"], NO_FILES_LEFT


@pytest.mark.parametrize("signum, status, message", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_interrupting_a_real_run_leaves_nothing_behind(
    tmp_path: Path, rng: np.random.Generator, signum: int, status: int, message: str
) -> None:
    # The input comes through a FIFO that holds back all but the first images: the run is under way,
    # waiting for more, however fast this machine parses, when the signal comes.
    cnn_path, small = write_files(tmp_path, random_cnn(rng), random_values(rng, 1, 100, 100))
    image = small.read_text().split("\n", 1)[1]
    fifo = tmp_path / "big.csv"
    os.mkfifo(fifo)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "out.csv").write_text("old\n")
    command = [sys.executable, "-m", "cnnlab", "cpu", str(cnn_path), str(fifo), str(out_dir / "out.csv"), "--batch", "1"]
    process = subprocess.Popen(command, env=SUBPROCESS_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(fifo, "w") as writer:
        writer.write("1000\n" + image * 3)
        writer.flush()
        deadline = time.monotonic() + 60
        while len(list(out_dir.iterdir())) < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # until the temporary output exists: the run is under way
        time.sleep(0.2)
        assert process.poll() is None, "the run ended before it could be interrupted"
        process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == status, stderr
    assert stderr == f"cnnlab: {message}\n" and stdout == ""
    assert [path.name for path in out_dir.iterdir()] == ["out.csv"], NO_FILES_LEFT
    assert (out_dir / "out.csv").read_text() == "old\n"


# Property tests: what the writers write, the readers read back to the identical arrays.

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(images=arrays(np.float64, st.tuples(st.integers(1, 3), st.just(100), st.just(100)), elements=FINITE))
def test_input_files_round_trip(tmp_path: Path, images: np.ndarray) -> None:
    write_input_file(tmp_path / "in.csv", len(images), images)
    assert (read_all_images(tmp_path / "in.csv", batch=2).view(np.int64) == images.view(np.int64)).all()


@SETTINGS
@given(
    filters=arrays(np.float64, (10, 5, 5), elements=FINITE),
    weights=arrays(np.float64, (10, 4000), elements=st.floats(-1e300, 1e300, allow_subnormal=True)),
)
def test_cnn_files_round_trip(tmp_path: Path, filters: np.ndarray, weights: np.ndarray) -> None:
    write_cnn_file(tmp_path / "cnn.csv", filters, weights)
    cnn = read_cnn(tmp_path / "cnn.csv")
    assert (cnn.filters.view(np.int64) == filters.view(np.int64)).all()
    assert (cnn.weights.view(np.int64) == weights.view(np.int64)).all()


@SETTINGS
@given(values=arrays(np.float64, st.tuples(st.integers(1, 20), st.just(10)), elements=FINITE), name=st.sampled_from(["o.csv", "o.npy"]))
def test_output_files_round_trip(tmp_path: Path, values: np.ndarray, name: str) -> None:
    with open_outputs(tmp_path / name, len(values)) as out:
        out.write(OutputBatch(values))
    assert np.array(read_outputs(tmp_path / name)).view(np.int64).tolist() == values.view(np.int64).tolist()


def _peak_rss_kb(*args: str | os.PathLike, status: int = 0) -> int:
    """Peak resident memory of a `cnnlab` run in a fresh process: its VmHWM, which (unlike ru_maxrss,
    which keeps the parent's figure across fork and exec) counts only what the run itself touched."""
    script = (
        "import re, sys\nfrom cnnlab.cli import main as cli\nstatus = cli.main(sys.argv[1:])\n"
        "print(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read())[1])\nsys.exit(status)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)], env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == status, result.stderr
    return int(result.stdout.split()[-1])


def test_a_line_too_long_is_refused_before_it_is_read_whole(tmp_path: Path, rng: np.random.Generator) -> None:
    """A line of 256 MB after the count (of many images: no guide to how much to read) is refused having read little more
    than the line cap, as from a pipe: not the whole line first."""
    cnn_path, _ = write_files(tmp_path, random_cnn(rng), random_values(rng, 1, 100, 100))
    with open(tmp_path / "long.csv", "wb") as file:
        file.write(b"100000\n" + b"1" * (256 << 20) + b"\n")
    peak = _peak_rss_kb("cpu", cnn_path, tmp_path / "long.csv", tmp_path / "out.csv", status=2)
    assert peak < 128 << 10, f"peak RSS {peak} KB"


BATCH = 256
THREADS = 2


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak memory from Linux's /proc")
@pytest.mark.parametrize("kind, small, large", [("csv", 1000, 5000), ("npy", 1500, 6000)])
def test_peak_memory_does_not_grow_with_the_number_of_images(
    tmp_path: Path, rng: np.random.Generator, kind: str, small: int, large: int
) -> None:
    """Memory is a few batches, not N: four or five times the images, under 10% more peak memory.

    Past the first thousand images, that is: the allocators' pools grow for a while before they
    level off. A mapped file adds pages more or less as the threads' timing falls: a .npy file one
    batch (two batches' at most are resident; the rest are unmapped behind the run), a CSV file one
    step of text (a step two takes old is unmapped on a pool thread, which on a busy machine may not
    have run yet when the next step's pages come in). Two parse threads, so that a step is the same
    size on every machine. This is the cpu mode; the GPU check (tools/gpu-check.sh memory) compares
    2,000 and 20,000 images in both modes.
    """
    cnn_path, one = write_files(tmp_path, random_cnn(rng), random_values(rng, 1, 100, 100))
    peaks = []
    for count in (small, large):
        path = tmp_path / f"in{count}.{kind}"
        if kind == "csv":  # the same image over and over: quick to write, as slow to parse as any
            path.write_text(f"{count}\n" + one.read_text().split("\n", 1)[1] * count)
        else:
            images = np.lib.format.open_memmap(path, "w+", np.float64, (count, 100, 100))
            for start in range(0, count, 500):
                images[start : start + 500] = random_values(rng, min(500, count - start), 100, 100)
            images.flush()
            del images
        text_bytes = path.stat().st_size
        peaks.append(_peak_rss_kb("cpu", cnn_path, path, tmp_path / "out.npy", "--batch", str(BATCH), "--threads", str(THREADS)))
        path.unlink()
    step_text = STEP_IMAGES * THREADS * text_bytes // large  # the last file's bytes an image
    timing = (BATCH * IMAGE_BYTES if kind == "npy" else step_text) // 1024
    assert peaks[1] < 1.10 * peaks[0] + timing, f"peak RSS {peaks[0]} KB for {small} images, {peaks[1]} KB for {large}"


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_every_malformed_input_is_one_line_status_2_and_no_output(
    tmp_path: Path, rng: np.random.Generator, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """The whole corpus of malformed inputs, through the command line (in-process, for speed)."""
    spoil, line, message = BAD_INPUTS[case]
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 2, 100, 100))
    input_path.write_text("\n".join(spoil(input_lines(random_values(rng, 2, 100, 100)))))
    output = tmp_path / "out" / "out.csv"
    output.parent.mkdir()
    output.write_text("previous results\n")
    assert cli.main(["cpu", str(cnn_path), str(input_path), str(output)]) == 2
    captured = capsys.readouterr()
    where = f"{input_path}:{line}: " if line else f"{input_path}: "
    assert captured.err.startswith(f"cnnlab: {where}") and message in captured.err and captured.err.count("\n") == 1
    assert captured.out == "" and output.read_text() == "previous results\n"
    assert [path.name for path in output.parent.iterdir()] == ["out.csv"], NO_FILES_LEFT
