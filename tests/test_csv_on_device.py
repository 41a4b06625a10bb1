"""A regular CSV file's text read straight into a backend's device memory and parsed there (files/csv_on_device.py):
the ranges it is cut into, the rows an image carries from one range to the next, the tally against N, and the error the
host's reader gives where anything is amiss. In CI the device buffers are host memory and the host's parser stands in for
csv.cu's kernels; on a GPU, cuda mode on the same files against cpu mode.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, assert_within_rule, cnnlab, cpu_outputs, random_cnn, write_files

from cnnlab.backend import Batch, DeviceBatch, TextBatching
from cnnlab.constants import INPUT_DIM
from cnnlab.cpu.backend import CpuBackend
from cnnlab.errors import InputFileError
from cnnlab.files.csv_on_device import last_row_end
from cnnlab.files.labcsv import format_rows
from cnnlab.files.lines import MAX_LINE_BYTES, Span
from cnnlab.files.rows import Layout, RowPlace, parse_rows
from cnnlab.generate import random_values
from cnnlab.network import Cnn, ImageBatch, OutputBatch
from cnnlab.run import run_network


class HostImageBuffer:
    """An image buffer's place taken by host memory."""

    def __init__(self, rows: int) -> None:
        self.values = np.full(rows * INPUT_DIM, np.pi)

    def host_copy(self, count: int) -> np.ndarray:
        return self.values[: count * INPUT_DIM * INPUT_DIM].reshape(count, INPUT_DIM, INPUT_DIM).copy()


class HostDoubleBuffer:
    """A double buffer of host memory, filled by os.preadv and parsed by the host's parser, as a GPU's are by its copier and
    csv.cu: it counts each range's rows itself, and says None for a range with a bad row."""

    def __init__(self, text_bytes: int, cut: Path | None = None, rows: int | None = None) -> None:
        self.text_bytes, self._cut, self.freed = text_bytes, cut, False
        self.rows = text_bytes // 200 + 1 if rows is None else rows
        self._texts = [np.zeros(text_bytes, np.uint8) for _ in range(2)]
        self._images = [HostImageBuffer(self.rows + INPUT_DIM) for _ in range(2)]
        self._got: list[int] = []  # each fill's count, until filled() takes it
        self._handed = self._parses = self._sides = self.restarts = 0
        self._carry_rows = np.empty(0)
        self.ranges: list[int] = []  # each fill's bytes

    @property
    def fills(self) -> int:
        return len(self.ranges)

    def start_fill(self, fd: int, offset: int, nbytes: int, stop: threading.Event) -> None:
        self.ranges.append(nbytes)
        if self._cut is not None and self.fills == 3:  # another program cuts the file short under the run
            os.truncate(self._cut, offset + nbytes // 2)
        self._got.append(os.preadv(fd, [self._texts[self._sides % 2][:nbytes].data], offset))
        self._sides += 1

    def filled(self) -> int:
        return self._got.pop(0)

    def restart(self) -> None:
        self.restarts += 1
        self._got.clear()
        self._sides = self._parses

    def parse(self, nbytes: int, file_row: int, carry: int, separated: bool) -> None:
        self._parsing = (self._texts[self._parses % 2][:nbytes], file_row, Layout(INPUT_DIM, "image", separated=separated))
        self._parses += 1

    def parsed(self, carry: int, path: str | os.PathLike[str]) -> tuple[int, HostImageBuffer | None] | None:
        text, file_row, layout = self._parsing
        text = np.frombuffer(text.tobytes().removesuffix(b"\n") + b"\n", np.uint8)  # the file's last line may have no end
        lines = text.tobytes().split(b"\n")
        rows = sum(1 for line in lines if line.strip())
        if rows > self.rows:  # as csv.cu counts the rows past what a parse takes, and keeps nothing
            return rows, None
        if max(map(len, lines)) > MAX_LINE_BYTES:  # as csv.cu refuses a line the host would
            return None
        buffer = self._images[self._handed % 2]
        buffer.values[: carry * INPUT_DIM] = self._carry_rows[: carry * INPUT_DIM]
        try:
            parse_rows(path, Span(text, 0, len(text), rows, 0), INPUT_DIM, buffer.values[carry * INPUT_DIM : (carry + rows) * INPUT_DIM],
                       RowPlace(layout, file_row, 0))  # fmt: skip
        except InputFileError:
            return None
        whole = (carry + rows) // INPUT_DIM
        self._carry_rows = buffer.values[whole * INPUT_DIM * INPUT_DIM : (carry + rows) * INPUT_DIM].copy()
        self._handed += whole > 0
        return rows, buffer

    def free(self) -> None:
        self.freed = True


class StandIn(CpuBackend):
    """A backend that parses CSV on its "device": a double buffer of host memory, whose images compute() takes."""

    csv_text = TextBatching(16, 16)

    def __init__(self, cnn: Cnn, text_bytes: int, cut: Path | None = None, rows: int | None = None) -> None:
        super().__init__(cnn, batch_size=16, threads=1)
        self._text_bytes, self._cut, self._parse_rows = text_bytes, cut, rows
        self.buffers: list[HostDoubleBuffer] = []

    def csv_double_buffer(self, file_bytes: int, images: int) -> HostDoubleBuffer:  # type: ignore[override]
        self.buffers.append(HostDoubleBuffer(self._text_bytes, self._cut, self._parse_rows))
        return self.buffers[-1]

    def compute(self, batch: Batch, check_finite: bool = False) -> OutputBatch:
        assert isinstance(batch, DeviceBatch) and isinstance(batch.buffer, HostImageBuffer)
        return super().compute(ImageBatch(batch.buffer.host_copy(len(batch))), check_finite)


def text_of(images: np.ndarray, separated: bool = True, line_end: str = "\n", last_line_end: bool = True) -> str:
    text = f"{len(images)}\n" + ("\n" if separated else "").join(format_rows(image) for image in images)
    text = text.replace("\n", line_end)
    return text if last_line_end else text.rstrip("\r\n")


def run_both(
    tmp_path: Path, cnn: Cnn, text: str, text_bytes: int, rows: int | None = None
) -> tuple[bytes | str, bytes | str, HostDoubleBuffer]:
    """The outputs (or the error) of cpu mode and of the stand-in (a parse taking `rows` rows) on the same input file."""
    (tmp_path / "in.csv").write_text(text)
    results: list[bytes | str] = []
    with StandIn(cnn, text_bytes, rows=rows) as device:
        for backend in (CpuBackend(cnn, threads=1), device):
            out = tmp_path / f"out-{len(results)}.csv"
            try:
                run_network(backend, tmp_path / "in.csv", out)
                results.append(out.read_bytes())
            except InputFileError as error:
                results.append(str(error))
                assert not out.exists()
    return results[0], results[1], device.buffers[0]


@pytest.mark.parametrize("text_bytes", [4096, 50_000, 300_000, 10 << 20])
@pytest.mark.parametrize("separated, line_end, last_line_end", [(True, "\n", True), (False, "\r\n", False), (True, "\r\n", True)])
def test_ranges_of_any_size_give_the_cpu_s_outputs(
    tmp_path: Path, rng: np.random.Generator, text_bytes: int, separated: bool, line_end: str, last_line_end: bool
) -> None:
    """Ranges of a few rows (4 KB), of part of an image (50 KB: several ranges pass no whole image on), of about one,
    and of the whole file: the images carried across ranges whole, in order, the same bytes as cpu mode's."""
    cnn, images = random_cnn(rng), random_values(rng, 7, INPUT_DIM, INPUT_DIM)
    want, got, buffers = run_both(tmp_path, cnn, text_of(images, separated, line_end, last_line_end), text_bytes)
    assert isinstance(want, bytes) and got == want
    assert buffers.freed and buffers.fills >= min(7, (7 * 190_000) // text_bytes)


def test_a_range_of_more_rows_than_a_parse_takes_is_read_again_in_smaller_ones(tmp_path: Path, rng: np.random.Generator) -> None:
    """Image buffers sized for the file's mean row: where the last images' rows are far shorter ("3.0", 400 bytes a row,
    after rows of random values of ~1,900), a range of 60 KB holds ~150 rows where a parse takes 100, and it and the
    rest of the file are read again in ranges of 7/8 of 100 such rows, whose outputs are cpu mode's, the same bytes."""
    cnn = random_cnn(rng)
    digits = rng.integers(0, 10, (6, INPUT_DIM, INPUT_DIM)).astype(float)
    images = np.concatenate([random_values(rng, 4, INPUT_DIM, INPUT_DIM), digits])
    want, got, buffers = run_both(tmp_path, cnn, text_of(images), 60_000, rows=100)
    assert isinstance(want, bytes) and got == want
    assert buffers.restarts == 1 and max(buffers.ranges[-3:]) <= 35_000 < 58_000 <= min(buffers.ranges[:3])


def test_rows_shorter_than_a_good_row_past_what_a_parse_takes_are_the_host_s_error(tmp_path: Path, rng: np.random.Generator) -> None:
    """Ranges too short to hold more good rows than a parse takes that still hold more: the rows are shorter than any
    good row, and the error is cpu mode's, naming the first bad line."""
    cnn, images = random_cnn(rng), random_values(rng, 3, INPUT_DIM, INPUT_DIM)
    rows = text_of(images).split("\n")
    rows[120:121] = ["1,2"] * 2000
    want, got, buffers = run_both(tmp_path, cnn, "\n".join(rows), 60_000, rows=20)
    assert isinstance(want, str) and got == want and "in.csv:121" in want
    assert buffers.restarts >= 1


@pytest.mark.parametrize("blank_lines, into_blanks", [(3000, None), (60_000, 100_000)])
def test_blank_lines_at_a_range_s_end_go_with_the_next_row(
    tmp_path: Path, rng: np.random.Generator, blank_lines: int, into_blanks: int | None
) -> None:
    """Runs of blank lines between the images of a separated file, longer than a range (4 KB), or a range that ends
    100 KB into 120 KB of them (past the first tail looked at for its last row): each image's first row still has its
    blank line before it, so the layout's rule holds across the cuts."""
    cnn, images = random_cnn(rng), random_values(rng, 4, INPUT_DIM, INPUT_DIM)
    head = f"4\n\n\n{format_rows(images[0])}\n{format_rows(images[1])}"
    text = head + " \n" * blank_lines + "\n".join(map(format_rows, images[2:]))
    want, got, _ = run_both(tmp_path, cnn, text, 4096 if into_blanks is None else len(head) - len("4\n") + into_blanks)
    assert isinstance(want, bytes) and got == want


@pytest.mark.parametrize(
    "damage",
    ["a bad value", "a short row", "N too large", "N too small", "a blank line inside an image", "the last row cut short"],
)
def test_anything_amiss_is_the_error_cpu_mode_gives(tmp_path: Path, rng: np.random.Generator, damage: str) -> None:
    cnn, images = random_cnn(rng), random_values(rng, 5, INPUT_DIM, INPUT_DIM)
    text = text_of(images)
    rows = text.split("\n")
    if damage == "a bad value":
        rows[350] = rows[350].replace(",", ",x", 1)
    elif damage == "a short row":
        rows[420] = rows[420].rsplit(",", 1)[0]
    elif damage == "N too large":
        rows[0] = "6"
    elif damage == "N too small":
        rows[0] = "4"
    elif damage == "a blank line inside an image":
        rows.insert(250, "")
    else:
        rows = rows[:-2] + [rows[-2][: len(rows[-2]) // 2]]
    want, got, _ = run_both(tmp_path, cnn, "\n".join(rows), 60_000)
    assert isinstance(want, str) and got == want


@pytest.mark.parametrize("text_bytes", [60_000, 10 << 20])
@pytest.mark.parametrize("where", ["a blank line between images", "a row's trailing blanks"])
def test_a_line_longer_than_the_host_takes_is_its_error(tmp_path: Path, rng: np.random.Generator, text_bytes: int, where: str) -> None:
    """A line of more than MAX_LINE_BYTES, blank or not: in a range (the device refuses it) or longer than one (the cut
    finds no line end): cpu mode's error, which names the line."""
    cnn, images = random_cnn(rng), random_values(rng, 3, INPUT_DIM, INPUT_DIM)
    rows = text_of(images).split("\n")
    if where == "a blank line between images":
        rows[202] = " " * (2 * MAX_LINE_BYTES)  # between images 2 and 3: past the head read for the layout
    else:
        rows[250] += " " * (2 * MAX_LINE_BYTES)
    want, got, _ = run_both(tmp_path, cnn, "\n".join(rows), text_bytes)
    assert isinstance(want, str) and "longer than" in want and got == want


def test_a_file_cut_short_under_a_run_is_the_error_of_the_file_as_it_is(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn, images = random_cnn(rng), random_values(rng, 6, INPUT_DIM, INPUT_DIM)
    path = tmp_path / "in.csv"
    path.write_text(text_of(images))
    cut_at = r"file ends inside image [23] of the 6 the first line announces"
    with StandIn(cnn, 200_000, cut=path) as device, pytest.raises(InputFileError, match=cut_at):
        run_network(device, path, tmp_path / "out.csv")
    assert not (tmp_path / "out.csv").exists() and device.buffers[0].freed


@pytest.mark.parametrize(
    "text, end",
    [
        (b"1,2\n3,4\n", 8),
        (b"1,2\n3,4", 4),  # the last line is cut by the range's end
        (b"1,2\n \t\n\n", 4),  # blank lines after the row go with the next range
        (b"1,2\n\n3,", 4),
        (b"\n\n \n", None),
        (b"1,2", None),
        (b"", None),
    ],
)
def test_the_last_row_s_end(text: bytes, end: int | None) -> None:
    assert last_row_end(text) == end


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [None, "3", "40"])
def test_cuda_mode_on_csv_gives_cpu_mode_s_outputs(tmp_path: Path, rng: np.random.Generator, batch: str | None) -> None:
    """The real command line: the text copied to the device in ranges (the smallest, 4 MiB, with --batch 3: images carried
    across them), parsed there; the outputs pass the lab's comparison with cpu mode's, and a bad value deep in the file
    is cpu mode's one-line error, with nothing written."""
    cnn, images = random_cnn(rng), random_values(rng, 61, INPUT_DIM, INPUT_DIM)
    cnn_path, input_path = write_files(tmp_path, cnn, images)
    options = ["--batch", batch] if batch else []
    result = cnnlab("cuda", cnn_path, input_path, tmp_path / "out.csv", *options)
    assert result.returncode == 0, result.stderr
    got = np.array([[float(value) for value in line.split(",")] for line in (tmp_path / "out.csv").read_text().splitlines()])
    assert_within_rule(got, cpu_outputs(cnn, images), cnn, images)
    lines = input_path.read_text().split("\n")
    lines[5500] = lines[5500].replace(",", ",1e999,", 1)
    input_path.write_text("\n".join(lines))
    want = assert_one_line_error(cnnlab("cpu", cnn_path, input_path, tmp_path / "cpu.csv"))
    assert assert_one_line_error(cnnlab("cuda", cnn_path, input_path, tmp_path / "bad.csv", *options)) == want
    assert not (tmp_path / "bad.csv").exists()
    lines[5500] = lines[5500].replace(",1e999,", ",", 1)
    lines[101 * 40] = " " * (2 * MAX_LINE_BYTES)  # a blank line before image 41 that the host refuses as too long
    input_path.write_text("\n".join(lines))
    want = assert_one_line_error(cnnlab("cpu", cnn_path, input_path, tmp_path / "cpu.csv"))
    assert "longer than" in want
    assert assert_one_line_error(cnnlab("cuda", cnn_path, input_path, tmp_path / "bad.csv", *options)) == want


@pytest.mark.parametrize(
    "file_bytes, images, batch, want",
    [
        (2 * 10**9, 10_000, None, 256 << 20),  # the default: TEXT_BUFFER_BYTES
        (2 * 10**9, 10_000, 1, 4 << 20),  # a batch of one image: never less than a line of MAX_LINE_BYTES and more needs
        (2 * 10**9, 10_000, 100, int(100 * 200_000 * 1.05)),  # a batch's text, with a twentieth to spare
        (750_638, 4, None, 750_654),  # the default data: the whole file and no more
        (750_638, 4, 1, 750_654),
    ],
)
def test_a_text_buffer_holds_a_batch_s_text_a_long_line_and_never_more_than_the_file(
    file_bytes: int, images: int, batch: int | None, want: int
) -> None:
    from cnnlab.cuda.csv_double_buffer import wanted_text_bytes

    assert wanted_text_bytes(file_bytes, images, batch) == want


def test_a_parse_takes_the_rows_of_the_file_s_mean_row_with_a_quarter_to_spare() -> None:
    """Image buffers for the file's rows (~1,900 bytes of random values), not for rows of 200 bytes; never fewer rows
    than a range of the shortest rows holding a line of MAX_LINE_BYTES has, nor more than the text can hold."""
    from cnnlab.cuda.csv_double_buffer import MIN_PARSE_ROWS, max_rows, rows_per_parse

    assert rows_per_parse(256 << 20, 1900) == math.ceil((256 << 20) * 1.25 / 1900)
    assert rows_per_parse(256 << 20, 1900) < max_rows(256 << 20) // 7
    assert rows_per_parse(4 << 20, 1900) == MIN_PARSE_ROWS and (MIN_PARSE_ROWS - 1) * 200 > MAX_LINE_BYTES + 1
    assert rows_per_parse(750_654, 1877) == max_rows(750_654)
