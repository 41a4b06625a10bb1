"""A regular CSV file's text read straight into a backend's device memory and parsed there (cuda mode): its double
buffer's text buffers (network.CsvDoubleBuffer) filled with ranges of the file that end just after a row, so that the
host never holds the text nor counts its lines.

A read hands over the images of one range: it queues that range's parse while the next range fills, waits for what
the parse found, starts the fill of the range after the next into the text buffer just parsed (queued behind the
next's, so that the copier's threads go from one fill to the other), and waits for the next range's fill
(cuda/csv_double_buffer.py numbers the steps). The device counts the
rows; the reader keeps the tally (the file's row each range starts at, the rows of an image a range leaves unfinished,
which the next parse takes first). The device names no line: where it finds anything amiss, or the file ends or
changes under the run, the host's reader reads the file as cpu mode does, and its error is the run's.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from cnnlab.constants import INPUT_DIM, MIN_ROW_BYTES
from cnnlab.errors import InputFileError
from cnnlab.files.csv_reader import CsvImageReader, blank_before_row, first_error
from cnnlab.files.lines import LineTooLong, scan_rows
from cnnlab.network import CsvDoubleBuffer, ImageBuffer
from cnnlab.tracing import NO_TRACE, Tracer

BLANK = b" \t\r\v\f"  # what a blank line holds besides its '\n' (Python's bytes.strip() and csv.cu agree)
# The last range's bytes, about: the run ends once its parse, compute and write are done, after every fill, so it is
# small (docs/gpu.md, "Sizes").
LAST_RANGE_BYTES = 32 << 20
# The bytes looked at for a range's last row end: first a few rows' worth (the reader's thread holds the GIL while it
# looks, which the copier's threads wait for), then a line's longest (MAX_LINE_BYTES), then the whole range.
FIRST_TAIL_BYTES = 1 << 16
TAIL_BYTES = (1 << 20) + 1
# The file's head read for where its images begin and its layout (text_start): the count line within the first
# HEAD_BYTES, image 1's rows and image 2's first within the next 1 MiB, else up to MAX_HEAD_BYTES.
HEAD_BYTES = 1 << 16
MAX_HEAD_BYTES = 64 << 20


@dataclass(frozen=True)
class TextRange:
    """`nbytes` of the file from `offset`, filled into a text buffer."""

    offset: int
    nbytes: int


class CsvRangeReader:
    """The images of a regular CSV file, read and parsed in a backend's device buffers, a range at a time."""

    def __init__(
        self, reader: CsvImageReader, buffers: CsvDoubleBuffer, start: int, separated: bool, trace: Tracer = NO_TRACE
    ) -> None:
        """`start`: the offset of the line after the count; `separated`: the file's layout (read from its head); `trace`
        gets a span of each wait for a fill and for a parse."""
        self._reader, self.buffers, self._separated, self._trace = reader, buffers, separated, trace
        reader.read_elsewhere = True
        self._fd, self._size = reader.fileno(), reader.size
        self._next = start  # the next range's first byte
        self._range_bytes = buffers.text_bytes  # a range's bytes at most: fewer once a range held more rows than a parse takes
        self._filled: TextRange | None = None  # a range filled and not yet parsed
        self._filling: deque[TextRange] = deque()  # ranges whose fills are under way, oldest first
        self._started = False
        self._rows = 0  # rows found so far, counted from the first image's first
        self._carry = 0  # of those, the rows of an image not yet whole

    @property
    def images_a_fill(self) -> int:
        """About how many images a fill takes, from the file's bytes an image."""
        return max(1, min(self._reader.count, round(self.buffers.text_bytes * self._reader.count / self._size)))

    def read(self, stop: threading.Event) -> tuple[ImageBuffer, int] | None:
        """The next whole images: their image buffer and their count; None when the file's N images were all read."""
        if not self._started:
            self._started = True
            self._begin(stop)
        while self._filled is not None and not stop.is_set():
            parsing = self._filled
            self.buffers.parse(parsing.nbytes, self._rows, self._carry, self._separated)  # while the next range fills
            with self._trace.span("wait for parse", bytes=parsing.nbytes):
                found = self.buffers.parsed(self._carry, self._reader.path)
            if found is not None and found[1] is None:  # more rows than a parse takes: read again in smaller ranges
                self._read_again(parsing, found[0], stop)
                continue
            if found is None or self._rows + found[0] > self._reader.count * INPUT_DIM:  # a bad row, or rows past N images
                raise self._error(stop)  # (a fill under way is stopped as the buffers are freed)
            self._start_fill(stop)  # the range after the next, into this range's buffer, queued behind the next's fill
            self._filled = self._fill(stop)
            rows, buffer = found
            images, self._carry = divmod(self._carry + rows, INPUT_DIM)
            self._rows += rows
            if images:
                assert buffer is not None
                return buffer, images
        if not stop.is_set() and self._rows < self._reader.count * INPUT_DIM:
            raise self._error(stop)  # the file ends before its N images
        return None

    def _begin(self, stop: threading.Event) -> None:
        """Fill both text buffers at once (the second's tasks taken as the first's run out), and wait for the first."""
        self._start_fill(stop)
        self._start_fill(stop)
        self._filled = self._fill(stop)

    def _read_again(self, taken: TextRange, rows: int, stop: threading.Event) -> None:
        """`taken` held `rows` rows, more than a parse takes: read it and the rest of the file again, in ranges of the
        bytes that many rows' worth of parse takes, with an eighth to spare. Ranges too short to hold more rows than a
        parse takes, whatever the rows, that still hold more, hold rows shorter than a good row: the host's error."""
        fewest = (self.buffers.rows - 1) * MIN_ROW_BYTES
        if self._range_bytes <= fewest:
            raise self._error(stop)
        self._range_bytes = max(fewest, taken.nbytes * self.buffers.rows // rows * 7 // 8)
        self.buffers.restart()
        self._filling.clear()
        self._next = taken.offset
        self._begin(stop)

    def _start_fill(self, stop: threading.Event) -> None:
        """Cut the next range and start its fill, where the file has one left."""
        if (taken := self._range()) is not None:
            self.buffers.start_fill(self._fd, taken.offset, taken.nbytes, stop)
            self._filling.append(taken)

    def _range(self) -> TextRange | None:
        """The next range: up to a text buffer's size, cut just after a row; None at the file's end."""
        if self._next >= self._size:
            return None
        rest = self._size - self._next
        if rest > self._range_bytes:
            end = self._cut(self._next + self._range_bytes)
        else:  # the file's rest fits a range: a small range of it last, where it is more than two such
            end = self._size if rest <= 2 * LAST_RANGE_BYTES else self._cut(self._size - LAST_RANGE_BYTES)
        taken, self._next = TextRange(self._next, end - self._next), end
        return taken

    def _fill(self, stop: threading.Event) -> TextRange | None:
        """The oldest range whose fill is under way, once filled; None where there is none."""
        if not self._filling:
            return None
        taken = self._filling.popleft()
        with self._trace.span("wait for fill", bytes=taken.nbytes):
            got = self.buffers.filled()
        if got < taken.nbytes and not stop.is_set():
            raise self._error(stop)  # the file was cut short under the run
        return taken

    def _cut(self, end: int) -> int:
        """Where a range that may reach `end` ends: just after its last row's line end, so that blank lines after it go
        with the next range (whose first row then has them before it, as the layout's rule asks); where it holds no
        whole row, at its last line end, so that the next range starts with that blank line."""
        for looked_at in (FIRST_TAIL_BYTES, TAIL_BYTES, end - self._next):  # no row ends in the tail: look further back
            start = max(self._next, end - looked_at)
            tail = os.pread(self._fd, end - start, start)
            if (found := last_row_end(tail)) is not None or start == self._next:
                break
        if found is None:
            found = tail.rfind(b"\n")
        if start + found <= self._next:  # a line longer than a text buffer: longer than any the host takes
            raise self._error()
        return start + found

    def _error(self, stop: threading.Event | None = None) -> InputFileError:
        return first_error(self._reader.path, self._reader.threads, stop)


def last_row_end(text: bytes) -> int | None:
    """The offset just after the last '\n' of `text` that ends a line holding more than blanks; None where none does."""
    stop = len(text)
    while ink := len(text[:stop].rstrip(BLANK + b"\n")):  # just past the last byte of ink before `stop`
        after = text.find(b"\n", ink)
        if after >= 0:
            return after + 1
        stop = text.rfind(b"\n", 0, ink)  # the last line is cut by the text's end: the lines before it
        if stop < 0:
            return None
    return None


def text_start(reader: CsvImageReader) -> tuple[int, bool] | None:
    """Where a regular file's images begin (the offset after the count line) and whether a blank line stands before
    every image after the first (its layout), read from the file's head: for a backend that copies the text straight
    to its device and parses it there. None where the head does not say (not a regular file, a line too long, fewer
    than two images' rows): the file is then read as before, which names what is wrong."""
    fd = reader.fileno()
    if not reader.regular or not reader.size:  # a size of 0 may not be the file's (procfs): read it as before
        return None
    head = os.pread(fd, HEAD_BYTES, 0)
    ink = len(head) - len(head.lstrip())  # bytes.strip()'s blanks are the format's, '\n' with them
    start = head.find(b"\n", ink) + 1
    if ink == len(head) or not start:
        return None
    if reader.count < 2:
        return start, False
    nbytes = HEAD_BYTES << 4
    while True:
        text = np.frombuffer(os.pread(fd, nbytes, start), np.uint8)
        try:
            after_image_1, rows, _ = scan_rows(text, 0, INPUT_DIM)
            if rows == INPUT_DIM and (separated := blank_before_row(text, after_image_1)) is not None:
                return start, separated
        except LineTooLong:
            return None
        if len(text) < nbytes or nbytes >= MAX_HEAD_BYTES:
            return None
        nbytes <<= 2
