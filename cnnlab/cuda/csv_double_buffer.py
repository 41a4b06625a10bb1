"""A regular CSV file's text copied straight into device memory and parsed where it lies: how cuda mode reads a CSV file.

The reader (files/csv_on_device.py) cuts the file into ranges that end just after a row. The file copier
(file_copier.py) copies a range into a text buffer, as it fills a .npy file's image buffers: no host buffer holds the
text, and the host never counts its lines. csv.cu's kernels parse the text buffer on a stream of their own, counting its
rows themselves, into an image buffer, after the rows of an image the range before left unfinished (the carry, copied
from that image buffer's end); the chunk streams then compute the image buffer's whole images where they lie.

Double buffering, two text buffers (T0, T1) and two image buffers (I0, I1), range k in T[k % 2]:

    1. fill T0 with range 0 and T1 with range 1 (the copier's threads take range 1's tasks as range 0's run out);
    2. wait for range k's fill (`filled`); queue its parse into the image buffer not handed out last, after
       `filled[k % 2]` on the parse stream; the parse records `parsed[k % 2]`, then the image buffer's `ready`;
    3. wait for the parse's status (the host's values patched in, or the rows parsed on the host);
    4. start the fill of range k + 2 into T[k % 2], once `parsed[k % 2]` says its text has been read;
    5. hand the image buffer's whole images to compute (its kernels wait for `ready` on the device), and go to 2
       with range k + 1, whose fill ran meanwhile.

An image buffer handed out is parsed into again only after the other has been: by then the run has computed the first
(the reader is one batch ahead of compute at most). Sizes: docs/gpu.md, "Sizes".
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from typing import TYPE_CHECKING, Any

import numpy as np

from cnnlab.constants import IMAGE_BYTES, INPUT_DIM, MIN_ROW_BYTES
from cnnlab.cuda.csv_parser import CsvParse, field_values, host_spans, scratch_bytes
from cnnlab.cuda.driver import device_errors
from cnnlab.cuda.file_copier import Copying, DeviceImageBuffer, FileCopier
from cnnlab.errors import InputFileError
from cnnlab.files.lines import MAX_LINE_BYTES, Span
from cnnlab.files.rows import Layout, RowPlace, parse_rows
from cnnlab.tracing import NO_TRACE, Tracer

if TYPE_CHECKING:
    from cnnlab.cuda.driver import Driver
    from cnnlab.cuda.memory import Allocator

TEXT_BUFFER_BYTES = 256 << 20  # a range's text at most (docs/gpu.md, "Sizes")
MIN_TEXT_BUFFER_BYTES = 4 << 20  # never fewer (but for a smaller file): a text buffer holds a line of MAX_LINE_BYTES and more
ROW_BYTES = IMAGE_BYTES // INPUT_DIM  # a row's values parsed
# The rows a parse takes, over the rows a text buffer of the file's mean row holds: a range of shorter rows than the
# file's mean is read again in smaller ranges (files/csv_on_device.py), so the image buffers are sized for the file's
# rows, a tenth of what rows of MIN_ROW_BYTES would need with random values.
ROW_MARGIN = 1.25
# The fewest rows a parse takes: a range of (MIN_PARSE_ROWS - 1) * MIN_ROW_BYTES bytes holds a line of MAX_LINE_BYTES,
# and no more good rows than a parse takes, whatever they hold.
MIN_PARSE_ROWS = (MAX_LINE_BYTES + 1) // MIN_ROW_BYTES + 3


def rows_per_parse(text_bytes: int, row_bytes: float) -> int:
    """The rows one parse of a text buffer of `text_bytes` takes for a file whose mean row is `row_bytes` long: the rows
    of such a range with ROW_MARGIN to spare, and never more than it can hold."""
    return min(max_rows(text_bytes), max(MIN_PARSE_ROWS, math.ceil(text_bytes / row_bytes * ROW_MARGIN)))


def double_buffer_bytes(text_bytes: int, rows: int) -> int:
    """Device memory a CSV double buffer takes: two text buffers of `text_bytes`, two image buffers of `rows` rows and
    the rows an image left unfinished, the parse's scratch."""
    return 2 * text_bytes + 2 * image_buffer_bytes(rows) + scratch_bytes(text_bytes, rows)


def image_buffer_bytes(rows: int) -> int:
    """An image buffer's bytes for a parse of `rows` rows, with the rows of an image the last parse left unfinished."""
    return (rows + INPUT_DIM) * ROW_BYTES


def max_rows(text_bytes: int) -> int:
    """The most rows a text buffer can hold (the last line of a file may lack its line end: one byte fewer)."""
    return text_bytes // MIN_ROW_BYTES + 1


class DeviceCsvDoubleBuffer:
    """A CUDA context's text and image buffers for one run's CSV file, and the parse from one into the other: a
    network.CsvDoubleBuffer. Made and freed by the context's calls; the run's reader thread fills and parses them."""

    def __init__(
        self, driver: Driver, memory: Allocator, copier: FileCopier, module: Any, text_bytes: int, rows: int,
        current: Callable[[], AbstractContextManager[None]], release: Callable[[DeviceCsvDoubleBuffer], None], trace: Tracer = NO_TRACE,
    ) -> None:
        """`rows`: the most rows one parse takes (rows_per_parse); `current` makes the context current on the reader's
        thread; `release` gives the buffers' memory back (the context's, which knows whether it still can); `trace` gets
        a span of each parse on the parse stream."""
        self._driver, self._memory, self._copier, self._release = driver, memory, copier, release
        self._current, self._trace = current, trace
        self.text_bytes, self.rows = text_bytes, rows
        self._csv = CsvParse(driver, memory, module, text_bytes, rows, texts=2)
        self.images: list[DeviceImageBuffer] = []
        try:  # where one fails, what was made goes back (the events too): the run may go on without the double buffer
            for _ in range(2):
                allocation = memory.device(image_buffer_bytes(rows))
                self.images.append(DeviceImageBuffer(allocation, rows // INPUT_DIM + 1, driver, copier, current))
            # Streams and events after the memory: where that fails, none is left for the collector to find out of context.
            no_timing = driver.event_flags.DISABLE_TIMING
            self._filled = [driver.Event(no_timing) for _ in range(2)]  # a text buffer's copies are on the device
            self._parsed = [driver.Event(no_timing) for _ in range(2)]  # its parse has read it: it may be filled again
            for event in self._parsed:
                event.record()
            self._stream = driver.Stream()
        except BaseException:
            self.close()
            raise
        self._fills = self._parses = 0
        self._filling: deque[Copying] = deque()  # the fills started and not yet waited for, oldest first
        self._handed = 0  # image buffers handed over with whole images: the next parse's is the other one
        self._parsing: tuple[int, int, Layout] = (0, 0, Layout(INPUT_DIM, "image"))  # the last parse's bytes, row, layout
        self._carry_at = 0  # where the last parse's unfinished image's rows start in its image buffer (device address)

    def start_fill(self, fd: int, offset: int, nbytes: int, stop: threading.Event) -> None:
        """Start copying `nbytes` of the file `fd` from `offset` into the next text buffer, once its last text has been
        parsed (at most two fills under way: the copier's threads go from one to the next); filled() waits for it."""
        side = self._fills % 2
        self._fills += 1
        with self._current(), device_errors("cannot copy the file's text to the device"):
            self._parsed[side].synchronize()  # the buffer's last text has been parsed
        text = int(self._csv.texts[side])
        self._filling.append(self._copier.start(fd, offset, nbytes, text, self._filled[side], stop))

    def filled(self) -> int:
        """Wait for the oldest fill not yet waited for: the bytes copied, fewer where the file ends first (the copier's
        count: where `stop` is set it says nothing)."""
        return self._filling.popleft().wait()

    def restart(self) -> None:
        """Wait for the fills under way, their copies on the device too (a new fill's copies, on other threads' streams,
        must land after them), and drop them: the next fill goes into the text buffer the next parse reads."""
        while self._filling:
            self.filled()
        with self._current(), device_errors("cannot copy the file's text to the device"):
            for event in self._filled:
                event.synchronize()
        self._fills = self._parses

    def parse(self, nbytes: int, file_row: int, carry: int, separated: bool) -> None:
        """Queue the parse of the oldest filled text buffer's first `nbytes` into the next image buffer, after `carry`
        rows copied from the end of the last image buffer parsed (an image it left unfinished); its first row is the
        file's row `file_row`, and `separated` its layout's. parsed() waits for it."""
        side = self._parses % 2
        self._parses += 1
        layout = Layout(INPUT_DIM, "image", separated=separated)
        self._parsing = (nbytes, file_row, layout)
        stream, images = self._stream, self.images[self._handed % 2]
        with self._current(), device_errors("cannot parse the file's text on the device"):
            stream.wait_for_event(self._filled[side])
            if carry and self._carry_at != int(images.allocation):  # else the rows are where they go: no whole image before
                self._driver.memcpy_dtod_async(images.allocation, self._carry_at, carry * ROW_BYTES, stream)
            self._csv.queue(stream, self._csv.texts[side], nbytes, images.allocation, carry, None, layout, file_row, self._trace)
            self._parsed[side].record(stream)

    def parsed(self, carry: int, path: str | os.PathLike[str]) -> tuple[int, DeviceImageBuffer | None] | None:
        """Wait for the last parse: the rows it found, and its image buffer, which holds them after the `carry` rows
        (ready once the values the device left to the host are written in); no buffer where the rows were more than
        `rows` (nothing is kept: read the range again in smaller ones); None where it found a bad row or the file
        `path`'s text is not what the device read. The rows after the buffer's whole images are the next parse's carry."""
        with self._current():
            with device_errors("cannot parse the file's text on the device"):
                result = self._csv.result()
                self._trace.settle(self._stream)
            if result.lines > self.rows:
                return result.lines, None
            if result.bad_row is not None:
                return None
            values = rows = None
            if result.whole_block_on_host:
                if (rows := self._host_parse(path, result.lines)) is None:
                    return None
            else:
                values = field_values(self._field_text(host_spans(result)))
            images = self.images[self._handed % 2]
            with device_errors("cannot write the host's values to the device"):
                if rows is not None:  # from pageable memory: a copy that returns once it is done
                    self._stream.synchronize()
                    self._driver.memcpy_htod(int(images.allocation) + carry * ROW_BYTES, rows)
                elif values is not None and len(values):
                    self._csv.patch(self._stream, images.allocation, carry, values)
                images.ready.record(self._stream)
            whole = (carry + result.lines) // INPUT_DIM
            self._carry_at = int(images.allocation) + whole * IMAGE_BYTES
            self._handed += whole > 0  # the buffer's images go to a batch: the next parse takes the other one
            return result.lines, images

    def _last_text(self) -> int:
        """The device address of the text buffer the last parse read."""
        return int(self._csv.texts[(self._parses - 1) % 2])

    def _field_text(self, spans: list[tuple[int, int]]) -> list[bytes]:
        """The text of each field the last parse left to the host, copied back from its text buffer."""
        fields = []
        with device_errors("cannot copy text back from the device"):
            for offset, length in spans:
                field = np.empty(length, np.uint8)
                self._driver.memcpy_dtoh(field, self._last_text() + offset)
                fields.append(field.tobytes())
        return fields

    def _host_parse(self, path: str | os.PathLike, rows: int) -> np.ndarray | None:
        """The last parse's rows parsed on the host, from its text copied back: where more of its values than the status
        lists need the host's float(); None where the host finds a bad row (the text changed on the way)."""
        nbytes, file_row, layout = self._parsing
        text = np.full(nbytes + 1, ord("\n"), np.uint8)  # a line end after the file's last line, where it has none
        with device_errors("cannot copy text back from the device"):
            self._driver.memcpy_dtoh(text[:nbytes], self._last_text())
        end = nbytes if nbytes and text[nbytes - 1] == ord("\n") else nbytes + 1
        out = np.empty(rows * INPUT_DIM)
        try:
            parse_rows(path, Span(text, 0, end, rows, 0), INPUT_DIM, out, RowPlace(layout, file_row, 0))
        except InputFileError:
            return None
        return out

    def free(self) -> None:
        self._release(self)

    def synchronize(self) -> None:
        """Wait for everything queued on the buffers (before their memory goes), a fill still under way stopped first
        (a run that ends early: its error, if any, is not the run's)."""
        for filling in self._filling:
            filling.stop()
        while self._filling:
            with suppress(Exception):
                self.filled()
        with device_errors("cannot free device memory"):
            self._stream.synchronize()
            for event in self._filled:
                event.synchronize()

    def close(self) -> None:
        """Give the memory back (with the context current, once synchronize() has returned); the events and the stream
        go with their last reference, now, while it is current."""
        self._csv.free()
        for buffer in self.images:
            self._memory.free(buffer.allocation)
            buffer.ready = None
        self._filled = self._parsed = []
        self._stream = None


def wanted_text_bytes(file_bytes: int, images: int, batch: int | None) -> int:
    """A text buffer's bytes for a file of `file_bytes` holding `images`, before the free memory has its say:
    TEXT_BUFFER_BYTES, or the text of `batch` images where a batch was asked for; never more than the whole file, nor
    less than MIN_TEXT_BUFFER_BYTES (a line of MAX_LINE_BYTES and more) where the file is larger."""
    wanted = TEXT_BUFFER_BYTES if batch is None else int(batch * file_bytes / max(1, images) * 1.05)
    return min(max(wanted, MIN_TEXT_BUFFER_BYTES), file_bytes + 16)


def text_buffer_bytes(free_bytes: int, fraction: float, wanted: int, round_bytes: int, row_bytes: float) -> int:
    """A text buffer's bytes for a file whose mean row is `row_bytes` long: `wanted`, fewer where the double buffer would
    take more than `fraction` of `free_bytes`, never fewer than MIN_TEXT_BUFFER_BYTES (or `wanted`, where that is less);
    whole rounds of the copier's tasks (`round_bytes`: a task for each of its threads) where it holds one, so that its
    threads end a fill together."""
    text = min(wanted, TEXT_BUFFER_BYTES)
    while text > MIN_TEXT_BUFFER_BYTES and double_buffer_bytes(text, rows_per_parse(text, row_bytes)) > free_bytes * fraction:
        text //= 2
    if text >= round_bytes:
        text -= text % round_bytes
    return max(min(MIN_TEXT_BUFFER_BYTES, wanted), math.ceil(text / 16) * 16)
