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
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass
from typing import BinaryIO, NamedTuple, Protocol

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
# Where a window's bytes read ahead start: room before them for the bytes the last span left, carried there.
AHEAD_GAP = 1 << 21
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


def cut_rows(data: np.ndarray, start: int, rows: int, every: int) -> list[Cut]:
    """Walk up to `rows` non-blank lines from `start` on this thread, cut into pieces of `every` rows (the
    last may hold fewer, where the rows or the data run out); each piece as scan_rows would give it."""
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


class Lines(NamedTuple):
    """What the lines of the bytes [start, end) of a window say (native.summarize): enough to count the
    non-blank lines of text read in parts on several threads, and to find where row k ends, without
    walking the lines again. Two adjacent ranges combine (`then`), as kernel/csv.cu's Seg does."""

    start: int
    end: int
    newlines: int
    head_ink: bool  # a byte that is not blank before the first '\n' (anywhere, if none)
    tail_ink: bool  # one after the last '\n'
    inner: int  # non-blank lines wholly inside (between two of the range's '\n's)
    first: int  # offset of the first '\n', -1 if none
    last: int  # offset of the last '\n', -1 if none
    longest: int  # the longest line wholly inside, its '\n' not counted

    def then(self, after: Lines) -> Lines:
        """The summary of this range followed by `after`, the range that starts where it ends."""
        if not self.newlines:  # this range's bytes belong to after's first line
            return after._replace(start=self.start, head_ink=self.head_ink or after.head_ink)
        if not after.newlines:  # after's bytes belong to this range's last line
            return self._replace(end=after.end, tail_ink=self.tail_ink or after.head_ink)
        joined = self.tail_ink or after.head_ink  # the line across the two ranges
        return Lines(
            self.start, after.end, self.newlines + after.newlines, self.head_ink, after.tail_ink,
            self.inner + after.inner + joined, self.first, after.last, max(self.longest, after.longest, after.first - self.last - 1),
        )  # fmt: skip

    @property
    def rows(self) -> int:
        """Non-blank '\n'-ended lines, where the range starts at a line start."""
        return self.head_ink + self.inner if self.newlines else 0

    @property
    def open_start(self) -> int:
        """Where the line still open at the range's end starts (where the range starts at a line start)."""
        return self.last + 1 if self.newlines else self.start

    @property
    def longest_line(self) -> int:
        """The longest line, the unended one at the end included, where the range starts at a line start."""
        return max(self.longest, self.first - self.start if self.newlines else 0, self.end - self.open_start)


def summarize(data: np.ndarray, start: int, end: int) -> Lines:
    """The Lines of data[start:end]."""
    if native is not None:
        return Lines(start, end, *native.summarize(data, start, end))
    return _summarize_python(data, start, end)


def _summarize_python(data: np.ndarray, start: int, end: int) -> Lines:
    view = data[start:end].tobytes()
    ends = [index for index, byte in enumerate(view) if byte == 10]
    if not ends:
        return Lines(start, end, 0, bool(view.strip()), False, 0, -1, -1, 0)
    inner = sum(bool(view[a + 1 : b].strip()) for a, b in zip(ends, ends[1:]))
    longest = max((b - a - 1 for a, b in zip(ends, ends[1:])), default=0)
    head, tail = bool(view[: ends[0]].strip()), bool(view[ends[-1] + 1 :].strip())
    return Lines(start, end, len(ends), head, tail, inner, start + ends[0], start + ends[-1], longest)


# Cuts walked on the pool where there are more than this many: a walk takes ~50 us, a task's hand-off ~20 us.
POOLED_WALKS = 8


def cut_summarized(data: np.ndarray, start: int, parts: list[Lines], rows: int, every: int, pool: Executor | None) -> list[Cut]:
    """cut_rows over the bytes that `parts` cover from `start` (a line start; read, and '\\n'-ended at the file's
    end), found from their summaries: each cut is walked from the start of the line open where its part
    begins, so over one part's bytes at most (parts are read in pieces of up to 1 MB); with a pool and
    many cuts, the cuts are walked at once."""
    prefixes = [running := Lines(start, start, 0, False, False, 0, -1, -1, 0)]  # of the parts before each part, and of all
    for part in parts:
        prefixes.append(running := running.then(part))
    total = prefixes[-1]
    available = total.rows
    targets = [target for target in (*range(every, rows, every), rows) if target <= available]
    walks, part = [], 0
    for target in targets:  # the part holding the end of row `target`, and where its open line starts
        while part + 1 < len(parts) and prefixes[part + 1].rows < target:
            part += 1
        before = prefixes[part]
        walks.append((before.open_start, target - before.rows, before.newlines))

    def walk(plan: tuple[int, int, int]) -> tuple[int, int]:
        end, found, lines = scan_rows(data[: total.end], plan[0], plan[1])
        assert found == plan[1], "the summaries and the walk disagree"
        return end, plan[2] + lines

    marks = list(pool.map(walk, walks)) if pool is not None and len(walks) > POOLED_WALKS else [walk(plan) for plan in walks]
    marks = [(end, target, lines) for (end, lines), target in zip(marks, targets)]
    if available < rows:  # the rows ran out: the last piece ends at the end, blank lines included
        marks.append((total.end, available, total.newlines))
    pieces, previous = [], (total.start, 0, 0)
    for mark in marks:
        pieces.append((mark[0], mark[1] - previous[1], mark[2] - previous[2]))
        previous = mark
    return pieces


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

    Given a pool, a regular file is read with `threads` reads at once (native.read_summarized, its own
    threads, the GIL released), each summarizing its part as it lands, and a span is cut from those
    summaries. Reads are sized by the rows asked for, from the bytes per row seen so far, so that little
    is read past a span and carried to the next window. Such a file is also read ahead: as take() returns
    a span, the next take's bytes are already being read into a third window (the one two spans back),
    so that cutting and handing on a span overlap reading the next.
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
        ahead = self._offset is not None and native is not None
        # Empty at first: the first read sizes a window (page-locked memory is slow to make; reserve() sizes them all).
        self._windows = [self._memory.allocate_text(0) for _ in range(3 if ahead else 2)]
        self._ahead: Future[tuple[int, list[Lines]]] | None = None  # the read into the next window, AHEAD_GAP on
        self._current = 0
        self._start = self._filled = 0  # the window's bytes not yet taken are [start, filled)
        self._at_end = False
        self._parts: list[Lines]  # [start, filled) summarized, in parts
        self._total: Lines  # and as a whole
        self._summarize_from(self._windows[0], 0, 0)
        # Bytes per non-blank line, as the last span had them or the caller expects: sizes reads and walks (0: unknown).
        self.row_bytes = 0.0
        self.lines_taken = 0  # lines wholly before `start`, blank ones included

    def reserve(self, nbytes: int) -> None:
        """Make every window hold spans of `nbytes` (and what is read ahead), so that none grows on the way."""
        for index in range(len(self._windows)):
            self._grow(index, nbytes + AHEAD_GAP)

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
        # Read what the rows still wanted should take: rows vary little in length (random values' text: a
        # few percent), and their sum over many rows far less. A line too long ends the reading: cut_rows names it.
        while self._total.rows < rows and not self._at_end and self._total.longest_line <= MAX_LINE_BYTES:
            self._read_more(int(1.005 * (rows - self._total.rows) * self.row_bytes) + READ_BYTES // 32 if self.row_bytes else None)
        self._read_ahead(rows)
        window = self._windows[self._current]
        try:
            if self._total.longest_line > MAX_LINE_BYTES:  # walked on one thread, which stops at such a line if it must take it
                cuts = cut_rows(window[: self._filled], self._start, rows, every)
            else:
                cuts = cut_summarized(window, self._start, self._parts, rows, every, self._pool)
        except LineTooLong as error:
            raise InputFileError(self.path, str(error), self.lines_taken + error.index + 1) from None
        merged: list[Cut] = []  # blank lines at the file's end belong to the last piece
        for end, found_rows, lines in cuts:
            if merged and not found_rows:
                merged[-1] = (end, merged[-1][1], merged[-1][2] + lines)
            else:
                merged.append((end, found_rows, lines))
        pieces = _spans(window, self._start, self.lines_taken, merged)
        taken = sum(piece.rows for piece in pieces)
        span = Span(window, self._start, pieces[-1].end, taken, self.lines_taken, tuple(pieces))
        if taken > 1:  # not the input's first line, N: its bytes say nothing of a matrix's
            self.row_bytes = (span.end - span.start) / taken
        self._start, self.lines_taken = span.end, self.lines_taken + sum(cut[2] for cut in merged)
        return span

    def _turn(self) -> None:
        """Carry the bytes not yet taken to the next window (grown to the current one's size: its last span is
        two takes old, so no longer in use), just before what was read ahead into it, if anything was."""
        old, start, filled = self._windows[self._current], self._start, self._filled
        left = filled - start
        following = (self._current + 1) % len(self._windows)
        ahead, self._ahead = self._ahead, None
        read = None  # the bytes read ahead, where they must move
        if ahead is None:
            self._grow(following, len(old))
            count = 0
        else:
            with reading(self.path):
                count, parts = ahead.result()
            self._offset += count
            if left > AHEAD_GAP:  # more left than the gap holds (a last, smaller span): the bytes read ahead move up
                read = self._windows[following][AHEAD_GAP : AHEAD_GAP + count].copy()
                self._grow(following, left + count + 1)
        self._current, window = following, self._windows[following]
        if ahead is None or read is not None:
            window[:left] = old[start:filled]
            if read is not None:
                window[left : left + count] = read
            self._start, self._filled = 0, left + count
            self._summarize_from(window, 0, left + count)
        else:
            window[AHEAD_GAP - left : AHEAD_GAP] = old[start:filled]
            self._start, self._filled = AHEAD_GAP - left, AHEAD_GAP + count
            self._summarize_from(window, self._start, AHEAD_GAP)
            self._add(parts)

    def _read_ahead(self, rows: int) -> None:
        """Start reading what a take of `rows` rows more should need into the next window, AHEAD_GAP bytes in, on
        the pool (the next window's span is two takes old, no longer in use)."""
        if len(self._windows) < 3 or self._at_end or not self.row_bytes:  # three windows: a regular file, with a pool
            return
        assert self._pool is not None
        following = (self._current + 1) % len(self._windows)
        # Less what this take should leave over, which is carried: a read ahead of whole takes would pile it up.
        left = max(0, int(self._filled - self._start - rows * self.row_bytes))
        wanted = int(1.002 * rows * self.row_bytes) + READ_BYTES // 64 - left
        if wanted <= 0:
            return
        self._grow(following, max(len(self._windows[self._current]), AHEAD_GAP + wanted + 1))
        window = self._windows[following]
        self._ahead = self._pool.submit(self._read_summarized, window, AHEAD_GAP, wanted, self._offset)

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
        count, parts = self._read_into(window, wanted)
        self._filled += count
        if not count:
            self._at_end = True
            if self._filled > self._start and window[self._filled - 1] != ord("\n"):
                window[self._filled] = ord("\n")  # the last line, ended like the others
                self._filled += 1
                parts = [summarize(window, self._filled - 1, self._filled)]
        self._add(parts)

    def _summarize_from(self, window: np.ndarray, start: int, end: int) -> None:
        """Start the summaries over, with window[start:end] as their one part and the whole so far."""
        self._parts = [summarize(window, start, end)]
        self._total = self._parts[0]

    def _add(self, parts: list[Lines]) -> None:
        """Append the summaries of bytes just read after the others, and to the whole; small ones (a pipe's reads)
        are merged, so that there are few parts, while a cut still walks at most one part's bytes."""
        for part in parts:
            last = self._parts[-1]
            self._parts[-1:] = [last.then(part)] if last.end - last.start < READ_BYTES // 8 else [last, part]
            self._total = self._total.then(part)

    def _read_into(self, window: np.ndarray, wanted: int) -> tuple[int, list[Lines]]:
        """Read up to `wanted` bytes into the window after those read, summarized: one read(), or, for a regular
        file, a read per thread at once."""
        fd, at = self._file.fileno(), self._filled
        with reading(self.path):
            if self._offset is None or self._pool is None:  # what the file has now (a pipe may hold less than asked)
                wait_readable(fd, self._stop)
                count = os.readv(fd, [memoryview(window)[at : at + wanted]])
                return count, [summarize(window, at, at + count)] if count else []
            count, parts = self._read_summarized(window, at, wanted, self._offset)
        self._offset += count
        return count, parts

    def _read_summarized(self, window: np.ndarray, at: int, wanted: int, offset: int) -> tuple[int, list[Lines]]:
        """window[at:at + wanted] from the regular file at `offset`, a read per thread at once, each thread
        summarizing its part as it lands (natively; else read on the pool, then summarized)."""
        fd = self._file.fileno()
        if native is not None:
            count, parts = native.read_summarized(fd, window, at, wanted, offset, self._threads)
            return count, [Lines(*part) for part in parts]
        assert self._pool is not None
        count = read_at(fd, memoryview(window)[at : at + wanted], offset, self._pool, self._threads)
        return count, [summarize(window, at, at + count)] if count else []

    def close(self) -> None:
        """Give the windows back (page-locked memory is scarce), once a read ahead into one has ended."""
        if self._ahead is not None:
            wait([self._ahead])
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
