"""Reading the lab's CSV text: what the CPU parser and the GPU one share.

A file is read in large blocks into windows of bytes that take turns (page-locked for the GPU);
`take(rows)` hands back the next `rows` non-blank lines as a span of a window (lines.py), with the
number of the line before it, so that any error can still name its line.
"""

from __future__ import annotations

import os
import select
import stat
import threading
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, BinaryIO, Protocol

import numpy as np

from cnnlab.errors import InputFileError
from cnnlab.files.inputs import reading
from cnnlab.files.lines import (
    MAX_LINE_BYTES,
    Cut,
    Lines,
    LineTooLong,
    Span,
    cut_rows,
    cut_summarized,
    native,
    prefixes_of,
    runs_of,
    spans_of,
    summarize,
)
from cnnlab.network import own_pages
from cnnlab.tracing import NO_TRACE, Tracer

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future

READ_BYTES = 1 << 23  # bytes per read() call: large enough to amortise it, small enough to stop quickly
# The most bytes a take reads before it looks at its lines again: a line past MAX_LINE_BYTES is refused having taken at
# most this much more memory, however many rows the take asked for.
LINE_CHECK_BYTES = 4 * READ_BYTES
# Where a window's bytes read ahead start: space before them for the bytes the last span left, carried there.
AHEAD_GAP = 1 << 21


class TextMemory(Protocol):
    """Where a TextSource keeps its windows: page-locked memory from the GPU backend, so that spans copy straight to the device."""

    def allocate_text(self, nbytes: int) -> np.ndarray: ...

    def free_text(self, window: np.ndarray) -> None: ...


class HostMemory:
    """Windows in ordinary memory, on pages of their own (own_pages)."""

    def allocate_text(self, nbytes: int) -> np.ndarray:
        return own_pages(nbytes, "a window of CSV text")

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
        ahead_threads: int | None = None,
        trace: Tracer = NO_TRACE,
        offset: int = 0,
    ) -> None:
        self.path = path
        self._trace = trace  # a span per read of the file
        self._file = file
        self._stop = stop  # set by whoever reads ahead of us when it stops: a wait on a pipe then ends
        self._memory = memory or HostMemory()
        self._pool, self._threads = pool, threads
        # The threads that read ahead, while the next span is parsed: all of them where nothing else needs the cores (the
        # GPU parses), fewer where the host parses on every core (a thread reads ~8x the bytes a thread parses).
        self._ahead_threads = ahead_threads or threads
        self._offset = offset if pool is not None and stat.S_ISREG(os.fstat(file.fileno()).st_mode) else None  # None: read()
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
        self.unended: tuple[int, bytes] | None = None  # the file's last line (number, bytes), once read, where it had no line end

    def window_bytes(self, nbytes: int) -> int:
        """The memory the windows take for spans of `nbytes` (and what is read ahead), as reserve() makes them."""
        return len(self._windows) * window_size(nbytes + AHEAD_GAP)

    def reserve(self, nbytes: int) -> None:
        """Make every window hold spans of `nbytes` (and what is read ahead), so that none grows on the way."""
        for index in range(len(self._windows)):
            self._grow(index, nbytes + AHEAD_GAP)

    def _grow(self, index: int, nbytes: int) -> None:
        """Window `index` at least `nbytes` long, the bytes read into the current one kept at their offsets."""
        window = self._windows[index]
        if len(window) >= nbytes:
            return
        grown = self._memory.allocate_text(window_size(nbytes))
        if index == self._current:
            grown[: self._filled] = window[: self._filled]
        self._windows[index] = grown
        self._memory.free_text(window)

    def take(self, rows: int, every: int | None = None) -> Span:
        """The next `rows` non-blank lines (fewer only where the file ends) as a span of one window, with its pieces of
        `every` rows already cut; without `every`, in one piece, with the runs the host's parse claims."""
        self._turn()
        with_runs, every = not every, every or max(rows, 1)
        # Read what the rows still wanted should take: rows vary little in length (random values' text: a
        # few percent), and their sum over many rows far less. A line too long ends the reading: cut_rows names it.
        while self._total.rows < rows and not self._at_end and self._total.longest_line <= MAX_LINE_BYTES:
            self._read_more(int(1.005 * (rows - self._total.rows) * self.row_bytes) + READ_BYTES // 32 if self.row_bytes else None)
        if self._total.longest_line <= MAX_LINE_BYTES:  # else this take is refused: nothing more is read for the next
            self._read_ahead(rows)
        window = self._windows[self._current]
        prefixes = None
        try:
            if self._total.longest_line > MAX_LINE_BYTES:  # walked on one thread, which stops at such a line if it must take it
                cuts = cut_rows(window[: self._filled], self._start, rows, every)
            else:
                prefixes = prefixes_of(self._start, self._parts)
                cuts = cut_summarized(window, prefixes, rows, every, self._pool)
        except LineTooLong as error:
            raise InputFileError(self.path, str(error), self.lines_taken + error.index + 1) from None
        merged: list[Cut] = []  # blank lines at the file's end belong to the last piece
        for end, found_rows, lines in cuts:
            if merged and not found_rows:
                merged[-1] = (end, merged[-1][1], merged[-1][2] + lines)
            else:
                merged.append((end, found_rows, lines))
        pieces = spans_of(window, self._start, self.lines_taken, merged)
        taken = sum(piece.rows for piece in pieces)
        runs = runs_of(prefixes, pieces[-1].end) if with_runs and prefixes is not None else ()
        span = Span(window, self._start, pieces[-1].end, taken, self.lines_taken, tuple(pieces), runs)
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
            assert self._offset is not None  # a read ahead is of a regular file
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
        assert self._pool is not None and self._offset is not None
        following = (self._current + 1) % len(self._windows)
        # Less what this take should leave over, which is carried: a read ahead of whole takes would pile it up.
        left = max(0, int(self._filled - self._start - rows * self.row_bytes))
        wanted = int(1.002 * rows * self.row_bytes) + READ_BYTES // 64 - left
        if wanted <= 0:
            return
        self._grow(following, max(len(self._windows[self._current]), AHEAD_GAP + wanted + 1))
        window = self._windows[following]
        self._ahead = self._pool.submit(self._read_summarized, window, AHEAD_GAP, wanted, self._offset, self._ahead_threads)

    def _read_more(self, wanted: int | None) -> None:
        """Read the next `wanted` bytes after those not yet taken (LINE_CHECK_BYTES at most: the caller looks at the lines
        before it reads on), growing the window to hold them all (if None: as much as the window holds, or a block); one
        byte of space is kept for a last line's '\\n'."""
        window = self._windows[self._current]
        space = len(window) - 1 - self._filled
        if wanted is None or space >= READ_BYTES:  # what the window holds: it grows only when nearly full
            wanted = max(min(wanted or space, space), READ_BYTES // 8)
        if space < wanted:  # by half at least, so that a window grows a few times, not at every take
            self._grow(self._current, max(self._filled + wanted + 1, len(window) * 3 // 2))
        window = self._windows[self._current]
        count, parts = self._read_into(window, min(wanted, LINE_CHECK_BYTES))
        self._filled += count
        if not count:
            self._at_end = True
            if self._filled > self._start and window[self._filled - 1] != ord("\n"):
                window[self._filled] = ord("\n")  # the last line, ended like the others
                self._filled += 1
                last = window[self._start : self._filled - 1].tobytes().rsplit(b"\n", 1)[-1]
                self.unended = (self.lines_taken + int(np.count_nonzero(window[self._start : self._filled] == ord("\n"))), last)
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
                count = os.readv(fd, [window.data[at : at + wanted]])
                return count, [summarize(window, at, at + count)] if count else []
            count, parts = self._read_summarized(window, at, wanted, self._offset)
        self._offset += count
        return count, parts

    def _read_summarized(
        self, window: np.ndarray, at: int, wanted: int, offset: int, threads: int | None = None
    ) -> tuple[int, list[Lines]]:
        """window[at:at + wanted] from the regular file at `offset`, a read per thread at once (`threads` of them; default
        the source's), each thread summarizing its part as it lands (natively; else read on the pool, then summarized)."""
        fd, threads = self._file.fileno(), threads or self._threads
        if native is not None:
            with self._trace.span("read", bytes=wanted, offset=offset):
                count, parts = native.read_summarized(fd, window, at, wanted, offset, threads)
            return count, [Lines(*part) for part in parts]
        assert self._pool is not None
        with self._trace.span("read", bytes=wanted, offset=offset):
            count = read_at(fd, window.data[at : at + wanted], offset, self._pool, threads)
        return count, [summarize(window, at, at + count)] if count else []

    def whole(self) -> AbstractContextManager[None]:
        """Around a take and its parse: nothing to check of bytes read (mapped_text.py's checks a mapping's)."""
        return nullcontext()

    def close(self) -> None:
        """Give the windows back (page-locked memory is scarce), once a read ahead into one has ended."""
        if self._ahead is not None:
            self._ahead.exception()  # waits for it: its error, if any, no longer matters
        for window in self._windows:
            self._memory.free_text(window)
        self._windows = []


def window_size(nbytes: int) -> int:
    """`nbytes` rounded up to one of 8 sizes a doubling (8 MB, 9 MB, ..., 15 MB, 16 MB, 18 MB, ...). Takes of as
    many rows ask a few bytes more or less each time, and a window grows to the one before it: sizes asked as they come
    would make a window anew at nearly every take, each costing the faults of its pages and unmapping the old one's."""
    step = 1 << max(0, nbytes.bit_length() - 4)
    return -(-nbytes // step) * step


class ReadStopped(Exception):
    """A read that waited on a pipe was given up: the run is stopping (a signal), and nothing will use its bytes."""


def wait_readable(fd: int, stop: threading.Event | None) -> None:
    """Wait until `fd` (a pipe, a FIFO, a terminal) has bytes or its end, checking `stop` ten times a second, so
    that a run told to stop while its input stalls stops now, not when the writer next writes."""
    while stop is not None and not select.select([fd], [], [], 0.1)[0]:
        if stop.is_set():
            raise ReadStopped


def read_at(fd: int, target: memoryview, offset: int, pool: Executor, threads: int) -> int:
    """Fill `target` from the file's bytes at `offset` with `threads` reads at once; the bytes read (fewer at the file's end)."""
    share = max(READ_BYTES // 4, -(-len(target) // threads))
    parts = [(at, target[at : at + share]) for at in range(0, len(target), share)]
    counts = list(pool.map(lambda part: os.preadv(fd, [part[1]], offset + part[0]), parts))
    total = 0
    for (_, part), count in zip(parts, counts):
        total += count
        if count < len(part):  # the file ends here (bytes a later part found are read again next time)
            break
    return total
