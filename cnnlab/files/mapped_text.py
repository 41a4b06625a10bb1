"""A regular file's CSV text taken straight from a read-only mapping of it, where the host parses (cpu mode): no copy
of the text out of the page cache into windows (text.py's TextSource), a copy as slow as the parse (docs/cpu.md).

A take summarizes the mapped bytes it needs (native.summarize_parts, 1 MB parts on its own threads, the pages faulted
in there) and cuts its span from the summaries as TextSource does, the span's data the whole mapping, its offsets the
file's; a walked take (take_walked) leaves finding the span's end to the parse that walks it (the reader's steps after
the first). The parser never loads past the buffer it is given (lab_csv_simd.h: a field within 32 bytes of its end takes
the scalar path), so the file's last bytes need no padding. Where a take needs the file's end (its rows run out in the
mapping: a last line with no line end wants its '\\n'), the rest of the file is read from there into windows by a
TextSource, as before. Pages of spans two takes old are unmapped again on a pool thread (the page cache keeps them),
so that the process's resident memory stays a few spans however large the file. A page lost to another program's
truncation reads as zeros (native/mapped_guard.cpp, as for .npy files); `whole()` turns that, or any error it caused,
into the error that says the file was cut short.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from cnnlab.errors import InputFileError
from cnnlab.files import lines
from cnnlab.files.lines import MAX_LINE_BYTES, Lines, LineTooLong, Span, cut_rows, cut_summarized, prefixes_of, runs_of, spans_of
from cnnlab.files.text import AHEAD_GAP, LINE_CHECK_BYTES, READ_BYTES, TextSource, window_size
from cnnlab.tracing import Tracer

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future

    from cnnlab.files import _mapped_guard

MappedFile: type[_mapped_guard.MappedFile] | None
try:
    from cnnlab.files._mapped_guard import MappedFile
except ImportError:  # no C++ compiler at install time: the text is read into windows
    MappedFile = None


def text_source(
    path: str | os.PathLike, file: BinaryIO, pool: Executor, threads: int, stop: threading.Event, ahead_threads: int, trace: Tracer
) -> TextSource | MappedTextSource:
    """The file's text for the host's parse: mapped where it is a regular file the system maps (and the native code
    was built), else read into windows."""
    status = os.fstat(file.fileno())
    if MappedFile is not None and lines.native is not None and stat.S_ISREG(status.st_mode) and status.st_size > 0:
        try:
            mapped = MappedFile(file.fileno(), status.st_size)
        except OSError:  # ENODEV, ENOMEM: read as before
            pass
        else:
            return MappedTextSource(path, file, mapped, pool, threads, stop, ahead_threads, trace)
    return TextSource(path, file, None, pool, threads, stop, ahead_threads, trace)


class MappedTextSource:
    """TextSource's take() over a mapped file (what CsvImageReader uses of it), its spans' data the mapping."""

    def __init__(
        self, path: str | os.PathLike, file: BinaryIO, mapped: Any, pool: Executor, threads: int, stop: threading.Event,
        ahead_threads: int, trace: Tracer,
    ) -> None:  # fmt: skip
        self.path, self._file, self._mapped = path, file, mapped
        self._data = np.frombuffer(mapped, np.uint8)
        self._size = len(self._data)
        self._pool, self._threads, self._stop, self._ahead_threads, self._trace = pool, threads, stop, ahead_threads, trace
        self._start = self._summarized = 0  # the bytes not yet taken start at `start`; [start, summarized) are summarized
        self._parts = [lines.summarize(self._data, 0, 0)]
        self._total = self._parts[0]
        self._dropped = self._last_start = 0  # pages before `dropped` are unmapped; the last span began at `last_start`
        self._dropping: Future[None] | None = None  # the last drop, on a pool thread
        self._rest: TextSource | None = None  # the file's end, read into windows once a take needs it
        self.row_bytes = 0.0  # as TextSource's
        self._lines_taken = 0

    @property
    def lines_taken(self) -> int:
        return self._rest.lines_taken if self._rest is not None else self._lines_taken

    @property
    def unended(self) -> tuple[int, bytes] | None:
        return self._rest.unended if self._rest is not None else None

    def window_bytes(self, nbytes: int) -> int:
        """The windows the file's end may be read into (TextSource's three, read ahead)."""
        return self._rest.window_bytes(nbytes) if self._rest is not None else 3 * window_size(nbytes + AHEAD_GAP)

    def take(self, rows: int, every: int | None = None) -> Span:
        """TextSource.take: the next `rows` non-blank lines as a span of the mapping (the rest's window where the
        file's end is in it)."""
        if self._rest is not None:
            return self._rest.take(rows, every)
        with_runs, every = not every, every or max(rows, 1)
        while self._total.rows < rows and self._summarized < self._size and self._total.longest_line <= MAX_LINE_BYTES:
            wanted = (rows - self._total.rows) * self.row_bytes
            self._summarize_more(int(1.005 * wanted) + READ_BYTES // 32 if wanted else READ_BYTES // 8)
        too_long = self._total.longest_line > MAX_LINE_BYTES
        if self._total.rows < rows and not too_long:  # the file's end: read from the span's start into windows
            self._rest = self._rest_source()
            return self._rest.take(rows, None if with_runs else every)
        prefixes = None
        try:
            if too_long:  # walked on one thread, which stops at such a line if it must take it
                cuts = cut_rows(self._data[: self._summarized], self._start, rows, every)
            else:
                prefixes = prefixes_of(self._start, self._parts)
                cuts = cut_summarized(self._data, prefixes, rows, every, self._pool)
        except LineTooLong as error:
            raise InputFileError(self.path, str(error), self._lines_taken + error.index + 1) from None
        pieces = spans_of(self._data, self._start, self._lines_taken, cuts)  # all rows found: no blank lines left to merge
        runs = runs_of(prefixes, pieces[-1].end) if with_runs and prefixes is not None else ()
        span = Span(self._data, self._start, pieces[-1].end, rows, self._lines_taken, tuple(pieces), runs)
        self._advance(span, sum(cut[2] for cut in cuts))
        return span

    def take_walked(self, rows: int, walk: Callable[[np.ndarray, int], tuple[int, int]]) -> Span | None:
        """The next `rows` non-blank lines as take() gives them (no pieces), their end found by `walk(data, start)` ->
        (end, lines walked): the parse's own walk, where take() would read the text once more, ahead, to summarize it
        first. None where the walk declines (end -1) or the file's end is in windows: take() goes on from here."""
        if self._rest is not None:
            return None
        end, walked = walk(self._data, self._start)
        if end < 0:
            return None
        span = Span(self._data, self._start, end, rows, self._lines_taken)
        self._advance(span, walked)
        return span

    def _advance(self, span: Span, walked: int) -> None:
        """After the take of `span`, `walked` lines: the next take starts at its end, and spans two takes old (parsed)
        are unmapped."""
        if span.rows > 1:
            self.row_bytes = (span.end - span.start) / span.rows
        self._start, self._lines_taken = span.end, self._lines_taken + walked
        self._summarized = max(self._summarized, span.end)  # a walk may pass the summaries
        self._keep_from(span.end)
        self._drop(self._dropped, self._last_start)
        self._dropped, self._last_start = self._last_start, span.start

    def _drop(self, start: int, end: int) -> None:
        """Unmap [start, end) on a pool thread: unmapping a step's pages interrupts every core that runs one of the
        process's threads (a TLB shootdown): on the take's thread it held up the take that the parse threads wait for. One
        at a time (the last one's error is raised here); the task holds the mapping, so it is never unmapped under a drop."""
        if self._dropping is not None:
            self._dropping.result()
        self._dropping = self._pool.submit(self._mapped.drop, start, end - start)

    def _summarize_more(self, wanted: int) -> None:
        """Summarize the next `wanted` bytes (LINE_CHECK_BYTES at most: the caller looks at the lines before it goes on)."""
        assert lines.native is not None
        start = self._summarized
        end = min(self._size, start + max(1, min(wanted, LINE_CHECK_BYTES)))
        with self._trace.span("read", bytes=end - start, offset=start, mapped=True):
            _, parts = lines.native.summarize_parts(self._data, start, end, self._ahead_threads)
        self._summarized = end
        for part in parts:
            self._parts.append(Lines(*part))
            self._total = self._total.then(self._parts[-1])

    def _keep_from(self, start: int) -> None:
        """The summaries of [start, summarized) alone: the part `start` falls in summarized again from there."""
        kept: list[Lines] = [lines.summarize(self._data, start, part.end) for part in self._parts if part.start < start < part.end]
        kept += [part for part in self._parts if part.start >= start and part.end > part.start]
        self._parts = kept or [lines.summarize(self._data, start, start)]
        self._total = self._parts[0]
        for part in self._parts[1:]:
            self._total = self._total.then(part)

    def _rest_source(self) -> TextSource:
        """A TextSource that reads the file on from the bytes not yet taken."""
        rest = TextSource(self.path, self._file, None, self._pool, self._threads, self._stop, self._ahead_threads, self._trace, self._start)
        rest.row_bytes, rest.lines_taken = self.row_bytes, self._lines_taken
        return rest

    @contextmanager
    def whole(self) -> Iterator[None]:
        """Around a take and its parse: where a page of the mapping was lost, or the file is shorter than mapped (its
        last page reads zeros past the new end without a fault), what they gave is wrong, and so is any error they
        raised: the run is refused as cut short."""
        try:
            yield
        except Exception:
            self._check_whole()
            raise
        self._check_whole()

    def _check_whole(self) -> None:
        if self._mapped.faulted or os.fstat(self._file.fileno()).st_size < self._size:
            raise InputFileError(self.path, "file was cut short while it was read (another program truncated it)")

    def close(self) -> None:
        if self._dropping is not None:  # an error of the last drop left pages mapped: memory, not the outputs; not raised
            self._dropping.exception()
        if self._rest is not None:
            self._rest.close()
