"""The lab's input file read in batches: its count line, then its images a step at a time, the text read ahead on
threads while the last step's is parsed, every matrix's rows checked where the lab's layout puts them.

Every problem with the file is raised as an InputFileError naming the file, the line and the image.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from cnnlab.constants import INPUT_DIM, MIN_ROW_BYTES
from cnnlab.errors import InputFileError
from cnnlab.extensions import note_missing
from cnnlab.files.csv_batch import CsvBatch, announced, file_ends
from cnnlab.files.inputs import open_for_reading
from cnnlab.files.lines import MAX_LINE_BYTES, Span, SpanAhead, native, scan_rows
from cnnlab.files.mapped_text import MappedTextSource, text_source
from cnnlab.files.rows import Layout, RowPlace, check_text, cut_row, parse_rows, shorten
from cnnlab.files.text import READ_BYTES, TextMemory, TextSource
from cnnlab.network import default_threads, unsized_capacity
from cnnlab.tracing import NO_TRACE, Tracer

# Images per parse task in Python (no native parser): a block of ~3 MB of text, large enough to amortise a task.
PARSE_IMAGES = 16
# Images per thread in a step of the host's parse, which runs ~1 MB runs on native threads: a step's own work (its
# cut, its summaries combined, its call) and the idle tail of its last runs are a few percent of a step this long,
# and its three text windows (~6 MB a thread) stay small enough to fault in and unmap quickly. On the 16-core H100
# host, 30,000 CSV images, four runs of each in turns: 32 a step 1.13-1.21 s wall and 402 MB peak, 64 1.14-1.25 s
# and 765 MB, 128 1.91-2.51 s and 1.49 GB.
STEP_IMAGES = 32
# Where the host parses, the threads that read ahead meanwhile: a thread reads ~8x the bytes a thread parses.
READ_AHEAD_SHARE = 4
# The parts of text a walk's threads claim (native.parse_walk): a part, counted and then parsed, stays in a core's L2.
WALK_PART_BYTES = 1 << 20
# The most bytes a line of an image takes as cnnlab writes it: 100 values in repr's longest form (24 characters) and
# their commas. Windows are reserved for no more per line (text padded longer grows them as it is read).
REPR_ROW_BYTES = INPUT_DIM * 25
# The fewest bytes an image's text can take: 100 lines of 100 one-character values, 99 commas and a newline.
MIN_IMAGE_BYTES = INPUT_DIM * MIN_ROW_BYTES


class CsvImageReader:
    """The lab's input file, read a batch of images at a time so that memory stays bounded.

    The first line holds N; then come N matrices of 100 lines of 100 values, with a blank line
    before every matrix after the first or none at all (rows.Layout: a file is one or the other, as
    its first two images say). Each step's lines are taken in one span, cut into blocks of
    PARSE_IMAGES images, and the blocks parsed `threads` at once (the native parser releases the GIL).
    """

    values_finite = True  # the parsers refuse a NaN, an infinity or a value that overflows

    def __init__(
        self, path: str | os.PathLike, threads: int | None = None, memory: TextMemory | None = None, trace: Tracer = NO_TRACE
    ) -> None:
        from concurrent.futures import ThreadPoolExecutor  # here: with logging, ~4 ms of a start-up that reads no CSV

        self.path = path
        self._trace = trace
        self.threads = threads = threads or default_threads()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="cnnlab-parse")
        self._taken: SpanAhead | None = None  # the next read_into()'s span, taken while this one's parses
        self._parsers = native.Pool(threads) if native is not None else None  # native threads: a piece hands off in microseconds
        self._file = open_for_reading(path)
        try:
            self.stop = threading.Event()  # set when the run stops: a read waiting on a pipe gives up
            # Parsed here, the text is read ahead on a quarter of the threads, the parse taking every core meanwhile.
            ahead = threads if memory is not None else max(1, threads // READ_AHEAD_SHARE)
            self._source: TextSource | MappedTextSource  # parsed here, the text is mapped where it can be
            if memory is None and native is not None:
                self._source = text_source(path, self._file, self._pool, threads, self.stop, ahead, trace)
            else:
                self._source = TextSource(path, self._file, memory, self._pool, threads, self.stop, ahead, trace)
            with self._source.whole():
                self.count = self._read_count()
            status = os.fstat(self._file.fileno())
            self.size = status.st_size  # the file's bytes when opened
            # The first guess, no more than a row of repr's longest values: a file mostly past its N images (a line of
            # gigabytes, say) says little of them, and reading by its bytes per image would take them all at once.
            self._source.row_bytes = min(status.st_size / (self.count * INPUT_DIM), REPR_ROW_BYTES)
            self.regular = regular = stat.S_ISREG(status.st_mode)
            self.capacity = min(self.count, status.st_size // MIN_IMAGE_BYTES + 1) if regular else unsized_capacity(self.count)
        except BaseException:
            self.close()
            raise
        if native is None:  # parsed in Python: the note says why, and what to install
            note_missing("cnnlab.files._lab_csv")
        self.images_read = 0
        self._images_taken = 0  # the images whose spans were taken (ahead of those read, where a span is taken ahead)
        self._separated: bool | None = None  # whether blank lines stand between the images: known once image 2 is taken
        self.step = (STEP_IMAGES if native is not None else PARSE_IMAGES) * threads  # images per read_into() call
        self._walks = self._parsers is not None and isinstance(self._source, MappedTextSource)  # the parse finds its lines
        self.read_elsewhere = False  # the images were read by a backend's device (csv_on_device.py), which checked the end

    def _read_count(self) -> int:
        first = self._source.take(1)
        if not first.rows:
            raise InputFileError(self.path, "empty file: the first line must hold the number of matrices")
        [(number, line)] = first.lines()
        check_text(self.path, number, line)
        text = line.decode("ascii").strip()
        digits = _count_digits(text).lstrip("0")
        which = "the first line" if number == 1 else "the first line that is not blank"
        if not digits.isdigit():
            message = f"{which} must hold the number of matrices, a positive integer, not {shorten(text)!r}"
            raise InputFileError(self.path, message, number)
        if len(digits) > 18:  # past any file's images, and int() stays quick
            raise InputFileError(self.path, f"{which} announces {shorten(text)} images: more than any file holds", number)
        return int(digits)

    @property
    def layout(self) -> Layout:
        """Where the file's blank lines may stand (before image 2 is taken, no row it governs has been parsed)."""
        return Layout(INPUT_DIM, "image", separated=bool(self._separated))

    def read_into(self, out: np.ndarray, next_images: int = 0) -> int:
        """Fill the leading images of `out` (shape (n, 100, 100)) with the next images; return how many.

        A mapped file's steps after the first are walked (_walk): no span is taken. Elsewhere, given `next_images`, the
        images the next call will ask for, their span is taken on a thread of its own while these parse: taking a span
        (the hand-over of what was read ahead, and its cut) is a tenth of the reader's time, which every parsing core
        but one would otherwise wait through."""
        wanted = max(0, min(len(out), self.count - self.images_read))
        with self._source.whole():  # a mapped file cut short meanwhile: that error, whatever the take or parse found
            if not self._walk(wanted, out.reshape(-1)):
                with self._trace.span("take", images=wanted):
                    span = self._take(wanted)
                then = max(0, min(next_images, self.count - self.images_read - wanted))
                if then and span.rows == wanted * INPUT_DIM and not self._walks:
                    self._taken = SpanAhead(self._take_now, then, self._trace)
                with self._truncation(span, wanted), self._trace.span("parse", images=wanted, bytes=span.end - span.start):
                    self._parse(span, out.reshape(-1))
        self.images_read += wanted
        return wanted

    def _walk(self, images: int, out: np.ndarray) -> bool:
        """Where the host parses a mapped file, parse the next `images` images with no take first: the parse's threads
        find the lines as they go (native.parse_walk), each reading its part of the text while it is in its cache, where
        a take reads it ahead on threads of its own to count its lines (its critical path on 16 cores, a quarter of the
        loop on one). From image 2's step on (the layout known); False where the walk declines (a bad line, the file's
        end): the span is then taken and parsed as before, which names what it found."""
        if not (self._walks and self._separated is not None and images):
            return False
        assert native is not None and isinstance(self._source, MappedTextSource)
        rows, first_row, separated = images * INPUT_DIM, self._images_taken * INPUT_DIM, self._separated
        part_times: list[bytes | None] = []  # the walk's, for the trace

        def parse(data: np.ndarray, start: int) -> tuple[int, int]:
            end, lines, times = native.parse_walk(self._parsers, data, start, rows, INPUT_DIM, out, first_row, INPUT_DIM, separated,
                                                  MAX_LINE_BYTES, WALK_PART_BYTES, self._trace.enabled)  # fmt: skip
            part_times.append(times)
            return end, lines

        with self._trace.span("walk", images=images):  # a walk declined is followed by the take's spans
            span = self._source.take_walked(rows, parse)
        if span is None:
            return False
        if part_times[0]:
            times = np.frombuffer(part_times[0], np.int64).reshape(-1, 5)
            self._trace.pieces("parse piece", times[:, :4], times[:, 4], "cnnlab-parse-native-{worker}")
        self._images_taken += images
        return True

    def _take(self, images: int) -> Span:
        """The span of the next `images` images: the one taken ahead for them, else taken now."""
        if self._taken is None:
            return self._take_now(images)
        taken, self._taken = self._taken, None
        span = taken.result()  # its error (a line too long, say) here: after every span before it was parsed
        if taken.images != images:
            raise ValueError(f"read_into: asked for {images} images where the call before said {taken.images} would follow")
        return span

    def _take_now(self, images: int, every: int | None = None) -> Span:
        """The span of the next `images` images (cut in pieces of `every` rows), and, where it holds image 2's first row,
        whether a blank line stands before that row: the file's layout."""
        if every is None and native is None:
            every = PARSE_IMAGES * INPUT_DIM
        span = self._source.take(images * INPUT_DIM, every)
        first, self._images_taken = self._images_taken, self._images_taken + images
        if self._separated is None and first * INPUT_DIM + span.rows > INPUT_DIM:
            after_image_1 = scan_rows(span.data, span.start, INPUT_DIM)[0] if first == 0 else span.start
            self._separated = bool(blank_before_row(span.data, after_image_1))
        return span

    def _place(self, span: Span, rows_before: int = 0) -> RowPlace:
        """Where the rows of a piece of `span` that follows `rows_before` of its rows stand in the file."""
        return RowPlace(self.layout, self.images_read * INPUT_DIM + rows_before, span.start)

    def _parse(self, span: Span, out: np.ndarray) -> None:
        """The span's lines into `out`: natively, the runs the read found (a piece of the file each, ~1 MB) claimed by
        the reader's threads as they go, else pieces of PARSE_IMAGES images a task; the first piece that holds a bad
        line (in file order) named by that line."""
        if native is not None and self._parsers is not None:
            runs = span.runs or _runs(span.pieces(PARSE_IMAGES * INPUT_DIM))
            place = self._place(span)
            times = np.empty((len(runs), 4), np.int64) if self._trace.enabled else None  # each piece's thread and times
            pieces = np.array(runs, np.int64)  # (start, end, rows before) a piece
            bad = native.parse_pieces(self._parsers, span.data, pieces, INPUT_DIM, out[: span.rows * INPUT_DIM],
                                      place.bound, place.first_row, INPUT_DIM, place.layout.separated, times)  # fmt: skip
            if times is not None:
                self._trace.pieces("parse piece", times, pieces[:, 1] - pieces[:, 0], "cnnlab-parse-native-{worker}")
            if bad >= 0:  # from the first piece it declined, in order, as parse_rows names a bad line
                line = span.line_before + int(np.count_nonzero(span.data[span.start : runs[bad][0]] == ord("\n")))
                for (start, end, before), after in zip(runs[bad:], [*(run[2] for run in runs[bad + 1 :]), span.rows]):
                    run = Span(span.data, start, end, after - before, line)
                    parse_rows(self.path, run, INPUT_DIM, out[before * INPUT_DIM : after * INPUT_DIM], self._place(span, before))
                    line += int(np.count_nonzero(span.data[start:end] == ord("\n")))
            return
        parsing, first = [], 0
        try:
            for piece in span.pieces(PARSE_IMAGES * INPUT_DIM):
                rows = out[first * INPUT_DIM : (first + piece.rows) * INPUT_DIM]
                parsing.append(self._pool.submit(parse_rows, self.path, piece, INPUT_DIM, rows, self._place(span, first)))
                first += piece.rows
        finally:
            for future in parsing:  # never return while a thread still writes into `out`
                future.exception()
        for future in parsing:  # the first bad piece's error, in file order
            future.result()

    def reserve_text(self, images: int) -> None:
        """Make the windows hold the text of `images` images (from the file's bytes per image) before read_text
        reads batches that size: page-locked windows are made before the run, as its image buffers are."""
        assert self._taken is None and isinstance(self._source, TextSource), "reserve_text() after read_into() that takes ahead"
        self._source.reserve(self._text_bytes(images))

    def text_memory(self, images: int) -> int:
        """The memory the text windows take for steps of `images` images."""
        return self._source.window_bytes(self._text_bytes(images))

    def _text_bytes(self, images: int) -> int:
        """The text of `images` images, from the file's bytes per row (a guess before the first span), with slack."""
        return int(1.1 * self._source.row_bytes * INPUT_DIM * min(images, self.count)) + READ_BYTES // 32

    def read_text(self, images: int, chunk: int) -> CsvBatch | None:
        """The text of the next `images` images (fewer at the end), unparsed, cut into chunks of
        `chunk` images; None when all were read."""
        assert self._taken is None, "read_text() after read_into() that takes ahead"
        wanted = max(0, min(images, self.count - self.images_read))
        if not wanted:
            return None
        with self._trace.span("take", images=wanted):
            span = self._take_now(wanted, chunk * INPUT_DIM)
        if span.rows < wanted * INPUT_DIM:
            with self._truncation(span, wanted):  # a bad line before the end comes first
                parse_rows(self.path, span, INPUT_DIM, np.empty(span.rows * INPUT_DIM), self._place(span))
        batch = CsvBatch(self.path, span, wanted, self.images_read, self.layout, self.count, self._cut_line())
        self.images_read += wanted
        return batch

    @contextmanager
    def _truncation(self, span: Span, wanted: int) -> Iterator[None]:
        """Around the parse of the span taken for `wanted` images: where the file ends inside it (a bad last line that
        has no line end is one cut short), the error says so."""
        rows = self.images_read * INPUT_DIM + span.rows
        try:
            yield
        except InputFileError as error:
            if error.line is None or error.line != self._cut_line():
                raise
            raise file_ends(self.path, self.count, rows, error.line, cut_short=True) from None
        if span.rows < wanted * INPUT_DIM:
            raise file_ends(self.path, self.count, rows, self._source.lines_taken)

    def _cut_line(self) -> int | None:
        """The number of the file's last line, once read, where it has no line end and could be a row cut short."""
        unended = self._source.unended
        return unended[0] if unended is not None and cut_row(unended[1], INPUT_DIM) else None

    def fileno(self) -> int:
        return self._file.fileno()

    def finish(self) -> None:
        """After all N images: an error where a line that follows them holds anything, as rows out of place or a
        count too small would leave there."""
        assert self._taken is None, "finish() before the images taken ahead were read"
        if self.read_elsewhere:
            return
        with self._source.whole():
            rows = self._source.take(1).rows
        if rows:
            message = f"data after {announced(self.count)} (a count too small, or rows out of place?)"
            raise InputFileError(self.path, message, self._source.lines_taken)

    def close(self) -> None:
        if self._taken is not None:  # before the pool and the windows go: a take ahead uses them
            self.stop.set()  # and if it waits on a pipe, it gives up
            self._taken.wait()
        self._pool.shutdown()
        if self._parsers is not None:
            self._parsers.close()
        if hasattr(self, "_source"):
            self._source.close()
        self._file.close()

    def __enter__(self) -> CsvImageReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def blank_before_row(data: np.ndarray, at: int) -> bool | None:
    """Whether blank lines stand between `at` and the next row (lines walked to it: blank ones first), which, after image
    1, is the file's layout; None where no whole row follows."""
    _, rows, lines = scan_rows(data, at, 1)
    return lines > 1 if rows else None


def first_error(path: str | os.PathLike, threads: int, stop: threading.Event | None = None) -> InputFileError:
    """The error the host's reader (cpu mode's) finds in the file as it is now: for a run whose device found something
    amiss in the file's text (it names no line), or whose file ended or changed under it. Where `stop` is set (the run
    is ending, a signal say) it reads no further: what it returns then is never shown."""
    try:
        with CsvImageReader(path, threads) as reader:
            out = np.empty((max(1, min(reader.step, reader.capacity)), INPUT_DIM, INPUT_DIM))
            while not (stop is not None and stop.is_set()) and reader.read_into(out):
                pass
            if stop is None or not stop.is_set():
                reader.finish()
    except InputFileError as error:
        return error
    return InputFileError(path, "the file changed while it was read: run again")


def _runs(pieces: list[Span]) -> tuple[tuple[int, int, int], ...]:
    """Pieces as runs for parse_pieces: (start, end, rows before)."""
    befores = np.cumsum([0] + [piece.rows for piece in pieces[:-1]])
    return tuple((piece.start, piece.end, int(before)) for piece, before in zip(pieces, befores))


def starts_with_count(path: str | os.PathLike) -> bool:
    """Whether the file's first non-blank line is a lone count, as an input file's first line is."""
    with open_for_reading(path) as file:
        first = TextSource(path, file).take(1)
    return first.rows == 1 and _count_digits(first.lines()[0][1].decode("ascii", "replace").strip()).isdigit()


def _count_digits(text: str) -> str:
    """The digits of N as the lab's Rust reader (`usize::from_str`) took them: a leading '+' allowed."""
    return text[1:] if text.startswith("+") else text
