"""The lab's CSV text as lines: spans of whole lines in a window of bytes, the summaries that count a window's lines
as it is read in parts, and the walks that cut a span into pieces of so many rows.

The walking is the native module cnnlab.files._lab_csv (C++, kernel/lab_csv.h's rules, the GIL released);
where it was not built, the pure-Python twins below follow the same rules, slowly.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from cnnlab.tracing import NO_TRACE, Tracer

if TYPE_CHECKING:  # concurrent.futures (with logging) is imported by the readers that make pools: not at every start
    from concurrent.futures import Executor

native: ModuleType | None  # cnnlab.files._lab_csv (typed in _lab_csv.pyi), None where no compiler built it
try:
    from cnnlab.files import _lab_csv as native
except ImportError:  # no C++ compiler at install time: the twins below, and a note saying why it is slow
    native = None
# The row parser's instruction set: the widest this CPU runs (avx512, avx2 or x86-64), unless CNNLAB_CPU_ISA, which
# chooses the forward's kernels, names a narrower one (x86-64: the scalar parser). The variable's checks and errors are
# the forward's (cpu/backend.py).
if native is not None and os.environ.get("CNNLAB_CPU_ISA", "") in native.CPU_ISAS:
    native.use_isa(os.environ["CNNLAB_CPU_ISA"])

# The longest line a valid file holds is 4000 values of at most ~25 characters; anything far
# longer is refused before it is read whole into memory.
MAX_LINE_BYTES = 1 << 20
NumberedLine = tuple[int, bytes]


@dataclass(frozen=True)
class Span:
    """Whole lines of a window: data[start:end] holds `rows` non-blank lines, after line `line_before`.

    `cuts` (when the span was taken with `every`): the span's pieces of `every` rows, already found.
    `runs` (where the span was read in parts): its whole lines cut where each part of the read begins, as
    (start, end, rows before), found from the parts' summaries with no walk: a parse that needs no
    image-aligned pieces (the host's) takes these.
    """

    data: np.ndarray  # the window (uint8); valid until the take() after next
    start: int
    end: int
    rows: int
    line_before: int
    cuts: tuple[Span, ...] = ()
    runs: tuple[tuple[int, int, int], ...] = ()

    def lines(self) -> list[NumberedLine]:
        """The span's non-blank lines with their numbers and without their line ends (slow: for messages)."""
        raw = self.data[self.start : self.end].tobytes().split(b"\n")[:-1]
        return [(number, line.rstrip(b"\r")) for number, line in enumerate(raw, self.line_before + 1) if line.strip()]

    def pieces(self, rows: int) -> list[Span]:
        """The span cut into spans of `rows` non-blank lines (the last may hold fewer)."""
        if self.cuts and self.cuts[0].rows == min(rows, self.rows):  # cut by `rows` already (every piece but the last holds `every`)
            return list(self.cuts)
        return spans_of(self.data, self.start, self.line_before, cut_rows(self.data[: self.end], self.start, self.rows, rows))


class SpanAhead:
    """The span of the next read_into()'s `images` images, taken by `take` on a thread of its own while this call's
    parse: a daemon thread, so that a take waiting on a pipe never holds up the interpreter's exit."""

    def __init__(self, take: Callable[[int], Span], images: int, trace: Tracer = NO_TRACE) -> None:
        self.images = images
        self._trace = trace
        self._span: Span | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._take, args=(take,), name="cnnlab-take", daemon=True)
        self._thread.start()

    def _take(self, take: Callable[[int], Span]) -> None:
        try:
            with self._trace.span("take ahead", images=self.images):
                self._span = take(self.images)
        except BaseException as error:  # raised by result(), on the reader's thread
            self._error = error

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> Span:
        self.wait()
        if self._error is not None:
            raise self._error
        assert self._span is not None
        return self._span


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


def prefixes_of(start: int, parts: list[Lines]) -> list[Lines]:
    """The summaries of the parts before each part of `parts` (which follow each other from `start`, a line start), and
    of them all."""
    prefixes = [running := Lines(start, start, 0, False, False, 0, -1, -1, 0)]
    for part in parts:
        prefixes.append(running := running.then(part))
    return prefixes


def cut_summarized(data: np.ndarray, prefixes: list[Lines], rows: int, every: int, pool: Executor | None) -> list[Cut]:
    """cut_rows over the bytes that the parts of `prefixes` (prefixes_of) cover from their start (read, and '\\n'-ended at
    the file's end), found from their summaries: each cut is walked from the start of the line open where its part
    begins, so over one part's bytes at most (parts are read in pieces of up to 1 MB); with a pool and
    many cuts, the cuts are walked at once."""
    parts = len(prefixes) - 1
    total = prefixes[-1]
    available = total.rows
    targets = [target for target in (*range(every, rows, every), rows) if target <= available]
    walks, part = [], 0
    for target in targets:  # the part holding the end of row `target`, and where its open line starts
        while part + 1 < parts and prefixes[part + 1].rows < target:
            part += 1
        before = prefixes[part]
        walks.append((before.open_start, target - before.rows, before.newlines))

    def walk(plan: tuple[int, int, int]) -> tuple[int, int]:
        end, found, lines = scan_rows(data[: total.end], plan[0], plan[1])
        assert found == plan[1], "the summaries and the walk disagree"
        return end, plan[2] + lines

    walked = list(pool.map(walk, walks)) if pool is not None and len(walks) > POOLED_WALKS else [walk(plan) for plan in walks]
    marks = [(end, target, lines) for (end, lines), target in zip(walked, targets)]
    if available < rows:  # the rows ran out: the last piece ends at the end, blank lines included
        marks.append((total.end, available, total.newlines))
    pieces, previous = [], (total.start, 0, 0)
    for mark in marks:
        pieces.append((mark[0], mark[1] - previous[1], mark[2] - previous[2]))
        previous = mark
    return pieces


def runs_of(prefixes: list[Lines], end: int) -> tuple[tuple[int, int, int], ...]:
    """The whole lines from the parts' start to `end` (a line start) cut where each part's first whole line begins:
    (start, end, rows before) each, from the parts' summaries (prefixes_of) alone."""
    starts = {prefix.open_start: prefix.rows for prefix in prefixes[:-1] if prefix.open_start < end}
    bounds = sorted(starts)
    return tuple((at, following, starts[at]) for at, following in zip(bounds, [*bounds[1:], end]))


def spans_of(data: np.ndarray, start: int, line_before: int, cuts: list[Cut]) -> list[Span]:
    spans = []
    for end, rows, lines in cuts:
        spans.append(Span(data, start, end, rows, line_before))
        start, line_before = end, line_before + lines
    return spans

