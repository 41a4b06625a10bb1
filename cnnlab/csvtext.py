"""The lab's CSV text as byte spans of whole lines: the reading the CPU parser and the GPU one share.

A file is read in large blocks into a window of bytes (page-locked for the GPU); `take(rows)` walks
the next `rows` non-blank lines at C speed and hands back their span of the window, with the number
of the line before it, so that any error can still name its line. The walking and the parsing are
the native module cnnlab._lab_csv (C++, kernel/lab_csv.h's rules, the GIL released); where it was
not built, their pure-Python twins below follow the same rules, slowly.
"""

from __future__ import annotations

import os
import select
import stat
import sys
import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import BinaryIO, Protocol

import numpy as np

from cnnlab.errors import InputFileError
from cnnlab.filesafety import reading

try:
    import cnnlab._lab_csv as native
except ImportError:  # no C++ compiler at install time: the twins below, and a note saying why it is slow
    native = None

# The longest line a valid file holds is 4000 values of at most ~25 characters; anything far
# longer is refused before it is read whole into memory.
MAX_LINE_BYTES = 1 << 20
READ_BYTES = 1 << 23  # bytes per read() call: large enough to amortise it, small enough to stop quickly
NumberedLine = tuple[int, bytes]


@dataclass(frozen=True)
class Span:
    """Whole lines of a window: data[start:end] holds `rows` non-blank lines, after line `line_before`.

    `cuts` (when the span was taken with `every`): the span's pieces of `every` rows, already found.
    """

    data: np.ndarray  # the window (uint8); valid until the take() after next
    start: int
    end: int
    rows: int
    line_before: int
    cuts: tuple[Span, ...] = ()

    def lines(self) -> list[NumberedLine]:
        """The span's non-blank lines with their numbers and without their line ends (slow: for messages)."""
        raw = self.data[self.start : self.end].tobytes().split(b"\n")[:-1]
        return [(number, line.rstrip(b"\r")) for number, line in enumerate(raw, self.line_before + 1) if line.strip()]

    def pieces(self, rows: int) -> list[Span]:
        """The span cut into spans of `rows` non-blank lines (the last may hold fewer)."""
        if self.cuts and self.cuts[0].rows == min(rows, self.rows):  # cut by `rows` already (every piece but the last holds `every`)
            return list(self.cuts)
        return _spans(self.data, self.start, self.line_before, cut_rows(self.data[: self.end], self.start, self.rows, rows))


class LineTooLong(ValueError):
    """A line longer than MAX_LINE_BYTES; `index` counts the lines walked before it."""

    def __init__(self, index: int) -> None:
        super().__init__(f"line longer than {MAX_LINE_BYTES} bytes")
        self.index = index


def scan_rows(data: np.ndarray, start: int, rows: int) -> tuple[int, int, int]:
    """From `start`, walk up to `rows` non-blank '\\n'-ended lines: (end offset, rows found, lines walked)."""
    if native is not None:
        result = native.scan_rows(data, start, rows, MAX_LINE_BYTES)
        if result[0] < 0:
            raise LineTooLong(result[2])
        return result
    return _scan_rows_python(data, start, rows)


def _scan_rows_python(data: np.ndarray, start: int, rows: int) -> tuple[int, int, int]:
    view = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    position, found, lines = start, 0, 0
    while found < rows:
        newline = view.find(b"\n", position)
        if newline < 0:
            if len(view) - position > MAX_LINE_BYTES:
                raise LineTooLong(lines)
            break
        if newline - position > MAX_LINE_BYTES:
            raise LineTooLong(lines)
        found += bool(view[position:newline].strip())
        position, lines = newline + 1, lines + 1
    return position, found, lines


Cut = tuple[int, int, int]  # a piece's (end offset, rows, lines walked), as scan_rows gives them


def cut_rows(data: np.ndarray, start: int, rows: int, every: int, pool: Executor | None = None, threads: int = 1) -> list[Cut]:
    """Walk up to `rows` non-blank lines from `start`, cut into pieces of `every` rows (the last may
    hold fewer, where the rows or the data run out); each piece as scan_rows would give it.

    With a pool, the bytes are walked on `threads` threads at once, in two passes: each thread counts
    the rows of its share (cut at line starts), then each cut is found from the start of the share
    it falls in. The pieces are exactly one thread's.
    """
    shares = _shares(data, start, threads) if pool is not None and native is not None and rows and threads >= SHARED_CUT_THREADS else []
    if len(shares) < 2:
        return _cut_one_thread(data, start, rows, every)
    try:
        counts = list(pool.map(lambda share: scan_rows(data[: share[1]], share[0], rows), shares))
    except LineTooLong:  # walked again on one thread, which numbers the line from `start`
        return _cut_one_thread(data, start, rows, every)
    rows_before = np.cumsum([0] + [found for _, found, _ in counts])  # rows before each share, and in all
    lines_before = np.cumsum([0] + [lines for _, _, lines in counts])
    available = int(rows_before[-1])

    def locate(target: int) -> tuple[int, int, int]:
        """(offset, rows, lines) from `start` to the end of row `target` (1-based)."""
        share = int(np.searchsorted(rows_before, target)) - 1  # rows_before[share] < target <= rows_before[share + 1]
        share_start, share_end = shares[share]
        offset, _, lines = scan_rows(data[:share_end], share_start, target - int(rows_before[share]))
        return offset, target, int(lines_before[share]) + lines

    targets = [target for target in (*range(every, rows, every), rows) if target <= available]
    marks = list(pool.map(locate, targets))
    if available < rows:  # the rows ran out: the last piece ends where the walk stopped, blank lines included
        marks.append((counts[-1][0], available, int(lines_before[-1])))
    pieces, previous = [], (start, 0, 0)
    for mark in marks:
        pieces.append((mark[0], mark[1] - previous[1], mark[2] - previous[2]))
        previous = mark
    return pieces


def _cut_one_thread(data: np.ndarray, start: int, rows: int, every: int) -> list[Cut]:
    pieces, position, left, walked = [], start, rows, 0
    while True:
        try:
            end, found, lines = scan_rows(data, position, min(every, left))
        except LineTooLong as error:  # numbered from `start`, as the caller counts
            raise LineTooLong(walked + error.index) from None
        walked += lines
        pieces.append((end, found, lines))
        position, left = end, left - found
        if not left or found < min(every, left + found):
            return pieces


# Bytes a thread walks at least, where cutting is shared out: smaller shares cost more than they save.
SHARE_BYTES = 1 << 22
# One thread walks lines at ~10-30 GB/s (memchr): shared out, the two passes and the hand-offs pay only on many cores.
SHARED_CUT_THREADS = 4


def _shares(data: np.ndarray, start: int, threads: int) -> list[tuple[int, int]]:
    """[start, len(data)) cut into up to `threads` byte ranges, each beginning at a line start."""
    size = len(data) - start
    count = min(threads, size // SHARE_BYTES)
    bounds = [start]
    for index in range(1, count):
        try:  # the end of the line `at` falls in (or of the first non-blank one after it): a line start
            line_start, _, lines = scan_rows(data, start + index * size // count, 1)
        except LineTooLong:
            continue
        if lines and bounds[-1] < line_start < len(data):
            bounds.append(line_start)
    bounds.append(len(data))
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def _spans(data: np.ndarray, start: int, line_before: int, cuts: list[Cut]) -> list[Span]:
    spans = []
    for end, rows, lines in cuts:
        spans.append(Span(data, start, end, rows, line_before))
        start, line_before = end, line_before + lines
    return spans


class TextMemory(Protocol):
    """Where a TextSource keeps its windows: page-locked memory from the GPU backend, so that spans copy straight to the device."""

    def allocate_text(self, nbytes: int) -> np.ndarray: ...

    def free_text(self, window: np.ndarray) -> None: ...


class HostMemory:
    """Windows in ordinary memory."""

    def allocate_text(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)

    def free_text(self, window: np.ndarray) -> None:
        pass


class TextSource:
    """A file's lines taken a span at a time, from windows that take turns, so that the span one
    take() returned stays whole while the next is read (a consumer of the GPU's copies needs that).

    Given a pool, a regular file is read with `threads` reads at once (os.preadv releases the GIL),
    and the lines are walked on as many threads. Reads and walks are sized by the rows asked for,
    from the bytes per row seen so far, so that little is read ahead and carried to the next window.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        file: BinaryIO,
        memory: TextMemory | None = None,
        pool: Executor | None = None,
        threads: int = 1,
        stop: threading.Event | None = None,
    ) -> None:
        self.path = path
        self._file = file
        self._stop = stop  # set by whoever reads ahead of us when it stops: a wait on a pipe then ends
        self._memory = memory or HostMemory()
        self._pool, self._threads = pool, threads
        self._offset = 0 if pool is not None and stat.S_ISREG(os.fstat(file.fileno()).st_mode) else None  # None: read()
        self._windows = [self._memory.allocate_text(READ_BYTES + MAX_LINE_BYTES) for _ in range(2)]
        self._current = 0
        self._start = self._filled = 0  # the window's bytes not yet taken are [start, filled)
        self._at_end = False
        # Bytes per non-blank line, as the last span had them or the caller expects: sizes reads and walks (0: unknown).
        self.row_bytes = 0.0
        self.lines_taken = 0  # lines wholly before `start`, blank ones included

    def reserve(self, nbytes: int) -> None:
        """Make the window the next take() fills hold at least `nbytes`, so that a span that size needs no
        growing on the way; the other window grows to match at its turn, while the first span is in use
        (pinning memory is slow: half of it is then done while the GPU works). The window grown here
        holds the span before last, which is freed if it is replaced: call this before using that span."""
        self._grow(1 - self._current, nbytes)

    def _grow(self, index: int, nbytes: int) -> None:
        """Window `index` at least `nbytes` long, the bytes read into the current one kept at their offsets."""
        window = self._windows[index]
        if len(window) >= nbytes:
            return
        grown = self._memory.allocate_text(nbytes)
        if index == self._current:
            grown[: self._filled] = window[: self._filled]
        self._windows[index] = grown
        self._memory.free_text(window)

    def take(self, rows: int, every: int | None = None) -> Span:
        """The next `rows` non-blank lines (fewer only where the file ends) as a span of one window,
        with its pieces of `every` rows already cut."""
        self._turn()
        every = every or rows
        position, cuts, taken, walked = self._start, [], 0, 0
        while True:
            # Walk what the rows still wanted should take, or all that is read (everything past the first span).
            # Rows vary little in length (random values' text: a few percent), and their sum over many rows far less.
            budget = int(1.005 * (rows - taken) * self.row_bytes) + READ_BYTES // 32 if self.row_bytes else None
            limit = self._filled if budget is None else min(self._filled, position + budget)
            window = self._windows[self._current]
            try:
                found = cut_rows(window[:limit], position, rows - taken, every, self._pool, self._threads)
            except LineTooLong as error:
                raise InputFileError(self.path, str(error), self.lines_taken + walked + error.index + 1) from None
            complete = sum(cut[1] for cut in found) == rows - taken or (self._at_end and limit == self._filled)
            whole = found if complete else found[:-1]  # a piece cut short by the end of the bytes walked is walked again
            cuts += whole
            taken, walked = taken + sum(cut[1] for cut in whole), walked + sum(cut[2] for cut in whole)
            position = cuts[-1][0] if cuts else position
            if complete:
                break
            if limit == self._filled:
                self._read_more(budget)
                # A pipe gives what it holds (~64 KB a read): gather what the rows should take before walking again.
                while self._offset is None and budget and not self._at_end and self._filled - position < budget:
                    self._read_more(budget - (self._filled - position))
            else:
                self.row_bytes *= 2  # the rows were longer than those before: walk further
        merged: list[Cut] = []  # blank lines at the file's end belong to the last piece
        for end, found_rows, lines in cuts:
            if merged and not found_rows:
                merged[-1] = (end, merged[-1][1], merged[-1][2] + lines)
            else:
                merged.append((end, found_rows, lines))
        window = self._windows[self._current]
        pieces = _spans(window, self._start, self.lines_taken, merged or [(self._start, 0, 0)])
        span = Span(window, self._start, pieces[-1].end, taken, self.lines_taken, tuple(pieces))
        if taken > 1:  # not the input's first line, N: its bytes say nothing of a matrix's
            self.row_bytes = (span.end - span.start) / taken
        self._start, self.lines_taken = span.end, self.lines_taken + walked
        return span

    def _turn(self) -> None:
        """Carry the bytes not yet taken to the start of the other window (grown to the current one's size:
        its last span is two takes old, so no longer in use)."""
        old = self._windows[self._current]
        self._grow(1 - self._current, len(old))
        self._current = 1 - self._current
        left = self._filled - self._start
        self._windows[self._current][:left] = old[self._start : self._filled]
        self._start, self._filled = 0, left

    def _read_more(self, wanted: int | None) -> None:
        """Read the next `wanted` bytes after those not yet taken, growing the window to hold them (if None: as
        much as the window holds, or a block); one byte of room is kept for a last line's '\\n'."""
        window = self._windows[self._current]
        room = len(window) - 1 - self._filled
        if wanted is None or room >= READ_BYTES:  # what the window holds: it grows only when nearly full
            wanted = max(min(wanted or room, room), READ_BYTES // 8)
        if room < wanted:  # by half at least, so that a window grows a few times, not at every take
            self._grow(self._current, max(self._filled + wanted + 1, len(window) * 3 // 2))
        window = self._windows[self._current]
        count = self._read_into(memoryview(window)[self._filled : self._filled + wanted])
        self._filled += count
        if not count:
            self._at_end = True
            if self._filled > self._start and window[self._filled - 1] != ord("\n"):
                window[self._filled] = ord("\n")  # the last line, ended like the others
                self._filled += 1

    def _read_into(self, room: memoryview) -> int:
        """Fill as much of `room` as the file holds: one read(), or, for a regular file, a read per thread at once."""
        with reading(self.path):
            if self._offset is None or self._pool is None:  # what the file has now (a pipe may hold less than asked)
                wait_readable(self._file.fileno(), self._stop)
                return os.readv(self._file.fileno(), [room])
            count = read_at(self._file.fileno(), room, self._offset, self._pool, self._threads)
        self._offset += count
        return count

    def close(self) -> None:
        """Give the windows back (page-locked memory is scarce)."""
        for window in self._windows:
            self._memory.free_text(window)
        self._windows = []


class ReadStopped(Exception):
    """A read that waited on a pipe was given up: the run is stopping (a signal), and nothing will use its bytes."""


def wait_readable(fd: int, stop: threading.Event | None) -> None:
    """Wait until `fd` (a pipe, a FIFO, a terminal) has bytes or its end, checking `stop` ten times a second, so
    that a run told to stop while its input stalls stops now, not when the writer next writes."""
    while stop is not None and not select.select([fd], [], [], 0.1)[0]:
        if stop.is_set():
            raise ReadStopped


def read_at(fd: int, room: memoryview, offset: int, pool: Executor, threads: int) -> int:
    """Fill `room` from the file's bytes at `offset` with `threads` reads at once; the bytes read (fewer at the file's end)."""
    share = max(READ_BYTES // 4, -(-len(room) // threads))
    parts = [(at, room[at : at + share]) for at in range(0, len(room), share)]
    counts = list(pool.map(lambda part: os.preadv(fd, [part[1]], offset + part[0]), parts))
    total = 0
    for (_, part), count in zip(parts, counts):
        total += count
        if count < len(part):  # the file ends here (bytes a later part found are read again next time)
            break
    return total


def warn_if_slow() -> None:
    """One line on stderr when CSV files will be parsed in Python, and what to install to avoid it."""
    if native is None:
        print(
            "cnnlab: note: the native CSV parser is not built (it needs a C++17 compiler, g++ >= 11, at install time); "
            "parsing in Python, ~50x slower",
            file=sys.stderr,
        )
