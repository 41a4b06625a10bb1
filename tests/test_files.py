"""The lab's file formats: round trips, what the lab accepted, and every malformed file refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import BAD_INPUTS, SUBPROCESS_ENV, assert_quoted, cnnlab, input_lines, random_cnn, read_all_images, write_files

from cnnlab.errors import InputFileError
from cnnlab.files import mapped_text
from cnnlab.files.csv_reader import CsvImageReader
from cnnlab.files.formats import open_outputs, read_outputs
from cnnlab.files.labcsv import read_cnn
from cnnlab.files.safety import AtomicOutput
from cnnlab.generate import generate, random_values
from cnnlab.network import OutputBatch


def test_cnn_and_input_round_trip_exactly(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 7, 100, 100)
    cnn_path, input_path = write_files(tmp_path, cnn, images)
    back = read_cnn(cnn_path)
    assert (back.filters == cnn.filters).all() and (back.weights == cnn.weights).all()
    assert (read_all_images(input_path) == images).all()


@pytest.mark.parametrize("name", ["out.csv", "out.npy"])
def test_outputs_round_trip_exactly(tmp_path: Path, rng: np.random.Generator, name: str) -> None:
    # Values of every magnitude, including subnormals and 17-digit ones, come back as the same doubles.
    values = rng.standard_normal((5, 10)) * 10.0 ** rng.integers(-320, 300, (5, 10))
    path = tmp_path / name
    with open_outputs(path, 5) as out:
        out.write(OutputBatch(values[:2]))
        out.write(OutputBatch(values[2:]))
    assert read_outputs(path) == values.tolist()


def _lab_generator_text(images: np.ndarray) -> str:
    """The input file as the lab's generate.py writes it: str() of each value, a blank line per matrix."""
    text = f"{len(images)}\n"
    for image in images.tolist():
        for row in image:
            text += ",".join(str(value) for value in row) + "\n"
        text += "\n"
    return text


def test_generator_writes_the_labs_layout(tmp_path: Path) -> None:
    cnn_path, input_path = generate(tmp_path, 3, seed=7)
    images = read_all_images(input_path)
    assert input_path.read_text() == _lab_generator_text(images)
    cnn = read_cnn(cnn_path)
    rows = [",".join(map(str, row)) + "\n" for row in cnn.filters.reshape(10, 25).tolist()]
    rows.append("\n")
    rows += [",".join(map(str, row)) + "\n" for row in cnn.weights.tolist()]
    assert cnn_path.read_text() == "".join(rows)
    assert np.abs(images).max() <= 10.0 and images.min() < -9.0 and images.max() > 9.0
    again = generate(tmp_path / "again", 3, seed=7)[1].read_bytes()
    other = generate(tmp_path / "other", 3, seed=8)[1].read_bytes()
    assert again == input_path.read_bytes() and other != again


def test_accepts_what_the_labs_reader_accepted(tmp_path: Path, rng: np.random.Generator) -> None:
    """CRLF line ends, scientific notation, a leading '+', no blank lines between matrices."""
    images = random_values(rng, 2, 100, 100)
    images[0, 0, :4] = [1e-300, 4.9e-324, 12345678901234567.0, 0.1]
    lines = ["2"]
    for image in images.tolist():
        for row in image:
            lines.append(",".join(f"+{v!r}" if i % 3 == 0 and v > 0 else f"{v:.17e}" for i, v in enumerate(row)))
    path = tmp_path / "in.csv"
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    assert (read_all_images(path) == images).all()


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_malformed_input_is_refused_with_file_and_line(tmp_path: Path, rng: np.random.Generator, case: str) -> None:
    spoil, line, message = BAD_INPUTS[case]
    path = tmp_path / "in.csv"
    path.write_text("\n".join(spoil(input_lines(random_values(rng, 2, 100, 100)))))
    with pytest.raises(InputFileError) as caught:
        read_all_images(path, batch=2)
    assert caught.value.line == line
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"{path}:{line}: " if line else f"{path}: ")


# The layout's faults docs/files.md quotes: each spoils the lines of a file of 3 images with blank lines between them
# (input_lines: the count, then each image's 100 rows and a blank line), and the line its error names.
LAYOUT_FAULTS = {
    "image 1 a row short": (lambda lines: lines[:5] + lines[6:], 101),
    "no blank line before image 3": (lambda lines: lines[:202] + lines[203:], 203),
    "a blank line before image 3 of a file without": (lambda lines: [line for line in lines[:202] if line] + lines[202:], 202),
    "a count too small": (lambda lines: ["2", *lines[1:]], 204),
    "a file that ends early": (lambda lines: ["2", *lines[1:150]], 150),
    "a last row cut short": (lambda lines: ["2", *lines[1:150], lines[150][:40]], 151),
}


@pytest.mark.parametrize("case", list(LAYOUT_FAULTS))
def test_the_layout_faults_are_refused_as_the_docs_quote_them(tmp_path: Path, rng: np.random.Generator, case: str) -> None:
    spoil, line = LAYOUT_FAULTS[case]
    path = tmp_path / "in.csv"
    path.write_text("\n".join(spoil(input_lines(random_values(rng, 3, 100, 100)))))
    with pytest.raises(InputFileError) as caught:
        read_all_images(path, batch=2)
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert_quoted("files.md", caught.value.message)


@pytest.mark.parametrize(
    "content, line, message",
    [
        (b"1\n\x00\x01\x02\xff\xfe binary", 2, "not a text file of numbers (byte 0x00"),
        ("1\n" + ",".join(["1.5"] * 99 + ["caf\u00e9"]) + "\n", 2, "byte 0xc3 at column"),
    ],
)
def test_binary_and_non_utf8_files_are_refused(tmp_path: Path, content: str | bytes, line: int, message: str) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    with pytest.raises(InputFileError, match=re.escape(message)) as caught:
        read_all_images(path)
    assert caught.value.line == line


def test_missing_file_and_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="no such file"):
        CsvImageReader(tmp_path / "absent.csv")
    with pytest.raises(InputFileError, match="is a directory"):
        read_cnn(tmp_path)


@pytest.mark.parametrize(
    "spoil, line, message",
    [
        (lambda rows: rows[:5], 5, "file ends after 5 of the 10 lines of convolution filters"),
        (lambda rows: rows[:10] + rows[11:15], 14, "file ends after 4 of the 10 lines of output-layer weights"),
        (lambda rows: rows[:2] + [rows[2].rsplit(",", 1)[0]] + rows[3:], 3, "expected 25 comma-separated values, found 24"),
        (lambda rows: rows[:12] + [rows[12].rsplit(",", 1)[0]] + rows[13:], 13, "expected 4000"),
        (lambda rows: rows + ["1,2"], 22, "unexpected data after"),
    ],
)
def test_malformed_cnn_file_is_refused(tmp_path: Path, rng: np.random.Generator, spoil, line: int, message: str) -> None:
    cnn_path, _ = write_files(tmp_path, random_cnn(rng), random_values(rng, 1, 100, 100))
    rows = cnn_path.read_text().split("\n")[:21]  # 10 filter rows, the blank line, 10 weight rows
    cnn_path.write_text("\n".join(spoil(rows)) + "\n")
    with pytest.raises(InputFileError, match=message) as caught:
        read_cnn(cnn_path)
    assert caught.value.line == line


def test_atomic_output_leaves_old_file_untouched_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    path.write_text("old\n")
    with pytest.raises(RuntimeError):
        with AtomicOutput(path) as out:
            out.write("new\n")
            raise RuntimeError("fail mid-run")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]
    with AtomicOutput(tmp_path / "sub" / "dir" / "new.csv") as out:
        out.write("x\n")
    assert (tmp_path / "sub" / "dir" / "new.csv").read_text() == "x\n"


def test_a_line_too_long_is_named_past_the_first_pieces(tmp_path: Path) -> None:
    """The reader cuts a step into pieces of 16 images: a long line in a later piece keeps its own number."""
    row = "1," * 99 + "1\n"
    path = tmp_path / "in.csv"
    path.write_text("20\n" + row * 1699 + "9" * (2 << 20) + "\n" + row * 301)
    with CsvImageReader(path, 1) as reader, pytest.raises(InputFileError, match=r"in.csv:1701: line longer than"):
        reader.read_into(np.empty((20, 100, 100)))


def test_a_span_taken_ahead_keeps_errors_in_file_order(tmp_path: Path) -> None:
    """While image 2 parses, image 3's span is taken ahead and finds a line too long: image 2's bad value is named."""
    row = "1," * 99 + "1\n"
    path = tmp_path / "in.csv"
    path.write_text("3\n" + row * 150 + "1,x" + row[3:] + row * 49 + "9" * (2 << 20) + "\n" + row * 99)
    with CsvImageReader(path, 1) as reader:
        assert reader.read_into(np.empty((1, 100, 100)), 1) == 1
        with pytest.raises(InputFileError, match=r"in.csv:152: value 2 'x' is not a number"):
            reader.read_into(np.empty((1, 100, 100)), 1)
        with pytest.raises(InputFileError, match=r"in.csv:202: line longer than"):  # the next call: the span taken ahead
            reader.read_into(np.empty((1, 100, 100)))


def test_a_call_unlike_the_one_announced_is_refused(tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    _, path = write_files(tmp_path, random_cnn(rng), random_values(rng, 6, 100, 100))
    monkeypatch.setattr(mapped_text, "MappedFile", None)  # text read into windows, taken ahead (a mapped file's is walked)
    with CsvImageReader(path) as reader:
        reader.read_into(np.empty((2, 100, 100)), 2)
        with pytest.raises(ValueError, match="asked for 3 images where the call before said 2"):
            reader.read_into(np.empty((3, 100, 100)))


def _stalled_fifo(tmp_path: Path, text: bytes, stall: float) -> tuple[Path, threading.Thread]:
    """A FIFO whose writer writes `text`, then holds the pipe open for `stall` seconds before closing it."""
    fifo = tmp_path / "stalled.csv"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as writer:
            writer.write(text)
            writer.flush()
            time.sleep(stall)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    return fifo, feeder


def test_a_take_ahead_waiting_on_a_pipe_holds_up_neither_close_nor_exit(tmp_path: Path, rng: np.random.Generator) -> None:
    """The second image's span is taken ahead while the writer stalls: close() returns at once, and an interpreter that
    never closed the reader still exits (the take runs on a daemon thread)."""
    _, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 2, 100, 100))
    one_image = b"".join(input_path.read_bytes().splitlines(keepends=True)[:101])
    fifo, feeder = _stalled_fifo(tmp_path, one_image, 30)
    reader = CsvImageReader(fifo, 1)
    assert reader.read_into(np.empty((1, 100, 100)), 1) == 1
    start = time.monotonic()
    reader.close()
    assert time.monotonic() - start < 5
    os.unlink(fifo)
    fifo, feeder = _stalled_fifo(tmp_path, one_image, 30)
    script = (
        "import sys, numpy as np; from cnnlab.files.csv_reader import CsvImageReader; "
        "reader = CsvImageReader(sys.argv[1], 1); print(reader.read_into(np.empty((1, 100, 100)), 1))"
    )
    result = subprocess.run([sys.executable, "-c", script, str(fifo)], env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=20)
    assert result.returncode == 0 and result.stdout == "1\n", result.stderr


def test_a_pipe_whose_writer_closes_late_ends_the_run_whole(tmp_path: Path, rng: np.random.Generator) -> None:
    """The run's end checks the pipe for data after the N images: it waits for the writer to close it."""
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 3, 100, 100))
    fifo, feeder = _stalled_fifo(tmp_path, input_path.read_bytes(), 0.5)
    assert cnnlab("cpu", cnn_path, fifo, tmp_path / "piped.csv").returncode == 0
    assert cnnlab("cpu", cnn_path, input_path, tmp_path / "filed.csv").returncode == 0
    assert (tmp_path / "piped.csv").read_bytes() == (tmp_path / "filed.csv").read_bytes()


def test_a_pipe_reads_as_the_file_does(tmp_path: Path, rng: np.random.Generator) -> None:
    """Through a FIFO, written a few KB at a time, the reader gives the same images as from the file."""
    _, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 40, 100, 100))
    text = input_path.read_bytes()
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as writer:
            for start in range(0, len(text), 5000):
                writer.write(text[start : start + 5000])

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        assert read_all_images(fifo, batch=7).tobytes() == read_all_images(input_path, batch=7).tobytes()
    finally:
        feeder.join()
