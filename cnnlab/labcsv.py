"""The lab's CSV formats: the CNN file, the input file (read in batches) and the output file.

Every problem with a file is raised as an InputFileError naming the file and line.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, BinaryIO

import numpy as np

from cnnlab.errors import InputFileError
from cnnlab.filesafety import AtomicOutput, open_for_reading
from cnnlab.network import (
    CONV_LAYER_SIZE,
    FILTER_DIM,
    INPUT_DIM,
    OUT_LAYER_SIZE,
    OUT_NEURON_DIM,
    Cnn,
    OutputBatch,
)

# The longest line a valid file holds is 4000 values of at most ~25 characters; anything far
# longer is refused before it is read whole into memory.
MAX_LINE_BYTES = 1 << 20

NumberedLine = tuple[int, bytes]

# Images parsed in one numpy call: the text and its split fields take ~50x the memory of the values,
# so a block this size (~40 MB of temporaries) keeps memory bounded whatever the batch size.
PARSE_IMAGES = 16

_NOT_TEXT = re.compile(rb"[^\t\x20-\x7e]")  # anything but printable ASCII and tabs

class LineSource:
    """The non-blank lines of a text file, numbered from 1, with line ends (LF or CRLF) removed.

    The file is read in large blocks, split into lines and sifted of blank ones at C speed, which
    makes walking the lines a small part of the cost of parsing them.
    """

    BLOCK_BYTES = 1 << 22
    _LONG = f"line longer than {MAX_LINE_BYTES} bytes"

    def __init__(self, path: str | os.PathLike, file: BinaryIO) -> None:
        self.path = path
        self._file = file
        self.line_number = 0  # the last line taken; at the end of the file, its last line
        self._lines: list[bytes] = []  # non-blank lines read from the file, not yet taken
        self._numbers: list[int] = []  # their line numbers
        self._next = 0  # index of the next line to take
        self._lines_read = 0  # lines split off so far, blank ones included
        self._tail = b""  # the start of a line whose end has not been read yet

    def _fill(self) -> bool:
        """Read the next block's complete lines; False at the end of the file."""
        data = self._file.read(self.BLOCK_BYTES)
        if not data and not self._tail:
            return False
        text, self._tail = self._tail + data, b""
        lines = text.split(b"\n")
        if data:  # the last piece may be the start of a line that the next block ends
            self._tail = lines.pop()
            if len(self._tail) > MAX_LINE_BYTES:  # refused before more of it is read into memory
                raise InputFileError(self.path, self._LONG, self._lines_read + len(lines) + 1)
        if max(map(len, lines), default=0) > MAX_LINE_BYTES:
            first_long = next(index for index, line in enumerate(lines) if len(line) > MAX_LINE_BYTES)
            raise InputFileError(self.path, self._LONG, self._lines_read + first_long + 1)
        numbers = [number for number, line in enumerate(lines, self._lines_read + 1) if line.strip()]
        self._lines_read += len(lines)
        lines = [line for line in lines if line.strip()]
        if b"\r" in text:
            lines = [line.rstrip(b"\r") for line in lines]
        self._lines = self._lines[self._next :] + lines
        self._numbers = self._numbers[self._next :] + numbers
        self._next = 0
        return True

    def next_line(self) -> NumberedLine | None:
        """The next non-blank line, or None at the end of the file."""
        lines = self.take(1)
        return lines[0] if lines else None

    def take(self, count: int) -> list[NumberedLine]:
        """The next `count` non-blank lines; fewer only where the file ends first."""
        while len(self._lines) - self._next < count and self._fill():
            pass
        end = min(self._next + count, len(self._lines))
        taken = list(zip(self._numbers[self._next : end], self._lines[self._next : end]))
        self._next = end
        self.line_number = taken[-1][0] if len(taken) == count and taken else self._lines_read
        return taken


def parse_rows(path: str | os.PathLike, lines: list[NumberedLine], width: int, out: np.ndarray) -> None:
    """Parse `lines`, each of `width` comma-separated finite numbers, into the flat array `out`.

    Every value is the double that Python's float() gives for its text (correctly rounded), but
    underscores, which the lab's Rust reader refused, are refused too. Polars' CSV reader converts
    the block (exactly: it rounds correctly, as float() does); only when it finds anything amiss
    are the lines walked one by one, to name the first bad line and value.
    """
    block = b"\n".join(line for _, line in lines)
    if _parse_block(block, len(lines), width, out.reshape(len(lines), width)):
        return
    check_lines(path, lines, width)
    # No line is bad, so Polars refused a spelling that float() accepts: convert value by value.
    out[:] = [float(field) for _, line in lines for field in line.split(b",")]


# Bytes a valid block may hold: printable ASCII, tabs and the line ends that join its lines.
_TEXT_BYTES = bytes([9, 10, *range(0x20, 0x7F)])


@functools.cache
def _schema(width: int) -> dict[str, Any]:
    import polars

    return {str(column): polars.Float64 for column in range(width)}


def _parse_block(block: bytes, rows: int, width: int, grid: np.ndarray) -> bool:
    """Fill `grid` (rows, width) from the block with Polars; False if anything in it is not plainly valid."""
    import polars  # here, not at the top: commands that parse no CSV skip its ~0.2 s import

    if block.translate(None, _TEXT_BYTES) or b"_" in block:
        return False
    try:
        frame = polars.read_csv(block, has_header=False, schema=_schema(width), quote_char=None)
    except polars.exceptions.PolarsError:
        return False
    if frame.shape != (rows, width) or frame.null_count().sum_horizontal().item():
        return False
    grid[:] = frame.to_numpy()
    return bool(np.isfinite(grid).all())


def check_lines(path: str | os.PathLike, lines: list[NumberedLine], width: int) -> None:
    """Raise the InputFileError that describes the first bad line among `lines`, if one is bad."""
    for number, line in lines:
        _check_line(path, number, line, width)


def _check_text(path: str | os.PathLike, number: int, line: bytes) -> None:
    if binary := _NOT_TEXT.search(line):
        column = binary.start()
        raise InputFileError(
            path, f"not a text file of numbers (byte 0x{line[column]:02x} at column {column + 1})", number
        )


def _check_line(path: str | os.PathLike, number: int, line: bytes, width: int) -> None:
    _check_text(path, number, line)
    fields = line.split(b",")
    if len(fields) != width:
        raise InputFileError(path, f"expected {width} comma-separated values, found {len(fields)}", number)
    for position, field in enumerate(fields, start=1):
        text = field.decode("ascii").strip()
        if not text:
            raise InputFileError(path, f"value {position} is missing", number)
        try:
            if "_" in text:
                raise ValueError(text)
            value = float(text)
        except ValueError:
            raise InputFileError(path, f"value {position} {_shorten(text)!r} is not a number", number) from None
        if not np.isfinite(value):
            raise InputFileError(path, f"value {position} {_shorten(text)!r} is not a finite number", number)


def _shorten(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def read_cnn(path: str | os.PathLike) -> Cnn:
    """Read a CNN file: 10 lines of 25 filter values, then 10 lines of 4000 output weights."""
    filters = np.empty((CONV_LAYER_SIZE, FILTER_DIM, FILTER_DIM))
    weights = np.empty((OUT_LAYER_SIZE, OUT_NEURON_DIM))
    with open_for_reading(path) as file:
        source = LineSource(path, file)
        for target, rows, what in (
            (filters, CONV_LAYER_SIZE, "convolution filters"),
            (weights, OUT_LAYER_SIZE, "output-layer weights"),
        ):
            lines = source.take(rows)
            if len(lines) < rows:
                check_lines(path, lines, target[0].size)
                raise InputFileError(
                    path, f"file ends after {len(lines)} of the {rows} lines of {what}", source.line_number
                )
            parse_rows(path, lines, target[0].size, target.reshape(-1))
        extra = source.next_line()
        if extra is not None:
            raise InputFileError(path, "unexpected data after the 10 lines of output-layer weights", extra[0])
    return Cnn(filters, weights)


class CsvImageReader:
    """The lab's input file, read a batch of images at a time so that memory stays bounded.

    The first line holds N; then come N matrices of 100 lines of 100 values. Blank lines anywhere
    are ignored, as the lab's reader did. Blocks of PARSE_IMAGES images are parsed on a thread
    each (Polars releases the GIL), `threads` at once.
    """

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        self.path = path
        self._file = open_for_reading(path)
        try:
            self._source = LineSource(path, self._file)
            self.count = self._read_count()
        except BaseException:
            self._file.close()
            raise
        self.images_read = 0
        threads = threads or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="cnnlab-parse")
        self.step = PARSE_IMAGES * threads  # images per read_into() call that keep every thread busy

    def _read_count(self) -> int:
        first = self._source.next_line()
        if first is None:
            raise InputFileError(self.path, "empty file: the first line must hold the number of matrices")
        number, line = first
        _check_text(self.path, number, line)
        text = line.decode("ascii").strip()
        if not text.isdigit() or int(text) < 1:
            raise InputFileError(
                self.path,
                f"the first line must hold the number of matrices, a positive integer, not {_shorten(text)!r}",
                number,
            )
        return int(text)

    def read_into(self, out: np.ndarray) -> int:
        """Fill the leading images of `out` (shape (n, 100, 100)) with the next images; return how many."""
        wanted = max(0, min(len(out), self.count - self.images_read))
        parsing: list[Future[None]] = []  # each block is parsed while the next one's lines are read
        try:
            for first in range(0, wanted, PARSE_IMAGES):
                images = min(PARSE_IMAGES, wanted - first)
                lines = self._source.take(images * INPUT_DIM)
                if len(lines) < images * INPUT_DIM:
                    self._finish(parsing)  # a bad line before the end is the error to report
                    self.images_read += first
                    check_lines(self.path, lines, INPUT_DIM)
                    self._raise_truncated(len(lines))
                block = out[first : first + images].reshape(-1)
                parsing.append(self._pool.submit(parse_rows, self.path, lines, INPUT_DIM, block))
            self._finish(parsing)
        finally:
            wait(parsing)  # never return while a thread still writes into `out`
        self.images_read += wanted
        return wanted

    @staticmethod
    def _finish(parsing: list[Future[None]]) -> None:
        """Wait for every block; raise the error of the first bad one, if any."""
        wait(parsing)
        for future in parsing:
            future.result()

    def _raise_truncated(self, lines_read: int) -> None:
        complete = self.images_read + lines_read // INPUT_DIM
        partial = lines_read % INPUT_DIM
        detail = f"; matrix {complete + 1} has only {partial} of its {INPUT_DIM} lines" if partial else ""
        raise InputFileError(
            self.path,
            f"file ends after {complete} of the {self.count} matrices the first line announces{detail}",
            self._source.line_number,
        )

    def trailing_data_line(self) -> int | None:
        """After all N images: the number of the first non-blank line that follows them, if any."""
        extra = self._source.next_line()
        return None if extra is None else extra[0]

    def close(self) -> None:
        self._pool.shutdown()
        self._file.close()

    def __enter__(self) -> CsvImageReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def format_rows(rows: np.ndarray) -> str:
    """CSV lines of a 2-D array, each value in shortest round-trip form (as repr writes it)."""
    return "".join(",".join(map(repr, row)) + "\n" for row in rows.tolist())


class CsvOutputWriter:
    """The lab's output file: one line of 10 values per image, in shortest round-trip form."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._output = AtomicOutput(path)

    def __enter__(self) -> CsvOutputWriter:
        self._file = self._output.__enter__()
        return self

    def write(self, outputs: OutputBatch) -> None:
        self._file.write(format_rows(outputs.values))

    def __exit__(self, *exc_info: Any) -> None:
        self._output.__exit__(*exc_info)


def write_input_file(path: str | os.PathLike, count: int, images: Iterable[np.ndarray]) -> None:
    """Write an input file of the `count` (100, 100) images that `images` yields."""
    with AtomicOutput(path) as out:
        out.write(f"{count}\n")
        for image in images:
            out.write(format_rows(image))
            out.write("\n")


def read_output_rows(path: str | os.PathLike) -> list[list[float]]:
    """Read an output file as rows of floats, for the comparison (any number of values per line)."""
    rows = []
    with open_for_reading(path) as file:
        source = LineSource(path, file)
        while (numbered := source.next_line()) is not None:
            row = np.empty(numbered[1].count(b",") + 1)
            parse_rows(path, [numbered], row.size, row)
            rows.append(row.tolist())
    return rows


def starts_with_count(path: str | os.PathLike) -> bool:
    """Whether the file's first non-blank line is a lone count, as an input file's first line is."""
    with open_for_reading(path) as file:
        first = LineSource(path, file).next_line()
    return first is not None and first[1].strip().isdigit()
