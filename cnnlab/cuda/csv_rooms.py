"""A regular CSV file's text copied straight into device memory and parsed where it lies: how cuda mode reads a CSV file.

The reader (files/csv_on_device.py) cuts the file into ranges that end just after a row. The copier (file_copier.py)
fills a text room with a range, as it fills a .npy file's image rooms: no host buffer holds the text, and the host never
counts its lines. csv.cu's kernels parse the room on a stream of their own, counting its rows themselves, into an image
room, after the rows of an image the range before left unfinished (the carry, copied from that image room's end); the
lanes then compute the image room's whole images where they lie (a DeviceBatch). Two text rooms, so that one fills
while the other parses, and two image rooms, so that one is parsed into while the other's images are computed (a range
that ends before its unfinished image does is parsed into the same image room as the next).

Napkin math: a range is up to TEXT_ROOM_BYTES of text (480 MiB with 12 copier threads: whole rounds of their tasks),
~2,700 images of random values (~190 KB each), 10.9 ms at the copier's 46 GB/s. The kernels parse ~220 GB/s of text on
one stream (217 GB/s in a trace on the H100 machine), 2.3 ms a range, while the copier fills the next. The rooms are
sized for the shortest rows (MIN_ROW_BYTES): an image room holds TEXT_ROOM_BYTES / 200 rows of 800 bytes, 4x the text,
and the parser's scratch 408 bytes a row, 2x.
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

from cnnlab.constants import IMAGE_BYTES, INPUT_DIM
from cnnlab.cuda.csv_parser import STATUS_DTYPE, BlockResult, CsvParser, field_values, host_spans, read_status, scratch_bytes
from cnnlab.cuda.driver import device_errors
from cnnlab.cuda.file_copier import Copying, FileCopier, Room
from cnnlab.errors import InputFileError
from cnnlab.files.lines import Span
from cnnlab.files.rows import Layout, RowPlace, parse_rows
from cnnlab.network import NO_TRACE, Tracer

if TYPE_CHECKING:
    from cnnlab.cuda.driver import Driver
    from cnnlab.cuda.memory import Allocator

TEXT_ROOM_BYTES = 512 << 20  # a fill's text at most (module docstring: the time a room takes)
MIN_TEXT_ROOM_BYTES = 4 << 20  # never fewer: a room must hold a line of MAX_LINE_BYTES (1 MiB) and its neighbours
MIN_ROW_BYTES = 2 * INPUT_DIM  # the shortest row: 100 one-character values, 99 commas and a line end
ROW_BYTES = INPUT_DIM * 8


def room_bytes(text_bytes: int) -> int:
    """Device memory CsvRooms take for text rooms of `text_bytes`: two of text, two of images, the parser's scratch."""
    rows = max_rows(text_bytes)
    return 2 * text_bytes + 2 * (rows + INPUT_DIM) * ROW_BYTES + scratch_bytes(text_bytes, rows)


def max_rows(text_bytes: int) -> int:
    """The most rows a text room can hold (the last line of a file may lack its line end: one byte fewer)."""
    return text_bytes // MIN_ROW_BYTES + 1


class CsvRooms:
    """A CUDA context's text and image rooms for one run's CSV file, and the parser that turns one into the other: a
    backend.TextRooms. Made and freed on the context's thread; the run's reader thread fills and parses them."""

    def __init__(
        self, driver: Driver, memory: Allocator, copier: FileCopier, module: Any, text_bytes: int,
        current: Callable[[], AbstractContextManager[None]], release: Callable[[CsvRooms], None], trace: Tracer = NO_TRACE,
    ) -> None:
        """`current` makes the context current on the reader's thread; `release` gives the rooms' memory back (the
        context's, which knows whether it still can); `trace` gets a span of each parse on the rooms' stream."""
        self._driver, self._memory, self._copier, self._release = driver, memory, copier, release
        self._current, self._trace = current, trace
        self.text_bytes = text_bytes
        rows = max_rows(text_bytes)
        no_timing = driver.event_flags.DISABLE_TIMING
        self._filled = [driver.Event(no_timing) for _ in range(2)]  # the text room's copies are on the device
        self._parsed = [driver.Event(no_timing) for _ in range(2)]  # its parse has read it: it may be filled again
        for event in self._parsed:
            event.record()
        self._stream = driver.Stream()
        self._status_ready = driver.Event(no_timing)
        self.allocations: list[Any] = []
        try:
            self._texts = [self._device(text_bytes) for _ in range(2)]
            self.images = [Room(self._device((rows + INPUT_DIM) * ROW_BYTES), rows // INPUT_DIM + 1, driver) for _ in range(2)]
            self._status = self._device(STATUS_DTYPE.itemsize)
            self._parser = CsvParser(module, self._device(scratch_bytes(text_bytes, rows)), text_bytes, rows)
            self._host_status = memory.host(1, STATUS_DTYPE)
        except BaseException:  # what was made goes back: the run may go on without rooms
            for allocation in self.allocations:
                memory.free(allocation)
            raise
        self._fills = self._parses = 0
        self._filling: deque[Copying] = deque()  # the fills started and not yet waited for, oldest first
        self._handed = 0  # image rooms handed over with whole images: the next parse's is the other one
        self._parsing: tuple[int, int, Layout] = (0, 0, Layout(INPUT_DIM, "image"))  # the last parse's bytes, row, layout
        self._carry_at = 0  # where the last parse's unfinished image's rows start in its image room (device address)

    def _device(self, nbytes: int) -> Any:
        self.allocations.append(self._memory.device(nbytes))
        return self.allocations[-1]

    def start_fill(self, fd: int, offset: int, nbytes: int, stop: threading.Event) -> None:
        """Start copying `nbytes` of the file `fd` from `offset` into the next text room, once its last text has been
        parsed (at most two fills under way: the copier's threads go from one to the next); filled() waits for it."""
        side = self._fills % 2
        self._fills += 1
        with self._current(), device_errors("cannot copy the file's text to the device"):
            self._parsed[side].synchronize()  # the room's last text has been parsed
        self._filling.append(self._copier.start(fd, offset, nbytes, int(self._texts[side]), self._filled[side], stop))

    def filled(self) -> int:
        """Wait for the oldest fill not yet waited for: the bytes copied, fewer where the file ends first (the copier's
        count: where `stop` is set it says nothing)."""
        return self._filling.popleft().wait()

    def parse(self, nbytes: int, file_row: int, carry: int, separated: bool) -> None:
        """Queue the parse of the oldest filled text room's first `nbytes` into the next image room, after `carry` rows
        copied from the end of the last image room parsed (an image it left unfinished); its first row is the file's
        row `file_row`, and `separated` its layout's. parsed() waits for it."""
        side = self._parses % 2
        self._parses += 1
        layout = Layout(INPUT_DIM, "image", separated=separated)
        self._parsing = (nbytes, file_row, layout)
        stream, images = self._stream, self.images[self._handed % 2]
        with self._current(), device_errors("cannot parse the file's text on the device"):
            stream.wait_for_event(self._filled[side])
            if carry and self._carry_at != int(images.allocation):  # else the rows are where they go: no whole image before
                self._driver.memcpy_dtod_async(images.allocation, self._carry_at, carry * ROW_BYTES, stream)
            with self._trace.span("parse text", stream, bytes=nbytes):
                self._parser.parse(stream, self._texts[side], nbytes, images.allocation, carry, None, self._status, layout, file_row)
            self._parsed[side].record(stream)
            self._parser.fetch_status(stream, self._host_status, self._status)
            self._status_ready.record(stream)

    def parsed(self, carry: int, path: str | os.PathLike[str]) -> tuple[int, Room] | None:
        """Wait for the last parse: the rows it found, and its image room, which holds them after the `carry` rows
        (ready once the values the device left to the host are written in); None where it found a bad row or the file
        `path`'s text is not what the device read. The rows after the room's whole images are the next parse's carry."""
        with self._current():
            with device_errors("cannot parse the file's text on the device"):
                self._status_ready.synchronize()
                self._trace.settle(self._stream)
            result = read_status(self._host_status)
            if result.bad_row is not None:
                return None
            values = rows = None
            if result.whole_block_on_host:
                if (rows := self._host_parse(path, result.lines)) is None:
                    return None
            else:
                values = field_values(self._field_text(result))
            images = self.images[self._handed % 2]
            with device_errors("cannot write the host's values to the device"):
                if rows is not None:  # from pageable memory: a copy that returns once it is done
                    self._stream.synchronize()
                    self._driver.memcpy_htod(int(images.allocation) + carry * ROW_BYTES, rows)
                elif values is not None and len(values):
                    self._parser.patch(self._stream, images.allocation, carry, self._status, values)
                images.ready.record(self._stream)
            whole = (carry + result.lines) // INPUT_DIM
            self._carry_at = int(images.allocation) + whole * IMAGE_BYTES
            self._handed += whole > 0  # the room's images go to a batch: the next parse takes the other room
            return result.lines, images

    def _field_text(self, result: BlockResult) -> list[bytes]:
        """The text of each field the last parse left to the host, copied back from its text room."""
        text = int(self._texts[(self._parses - 1) % 2])
        fields = []
        with device_errors("cannot copy text back from the device"):
            for offset, length in host_spans(result):
                field = np.empty(length, np.uint8)
                self._driver.memcpy_dtoh(field, text + offset)
                fields.append(field.tobytes())
        return fields

    def _host_parse(self, path: str | os.PathLike, rows: int) -> np.ndarray | None:
        """The last parse's rows parsed on the host, from its text copied back: where more of its values than the status
        lists need the host's float(); None where the host finds a bad row (the text changed on the way)."""
        nbytes, file_row, layout = self._parsing
        text = np.full(nbytes + 1, ord("\n"), np.uint8)  # a line end after the file's last line, where it has none
        with device_errors("cannot copy text back from the device"):
            self._driver.memcpy_dtoh(text[:nbytes], self._texts[(self._parses - 1) % 2])
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
        """Wait for everything queued on the rooms (before their memory goes), a fill still under way stopped first
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
        """Give the memory back (on the context's thread, once synchronize() has returned)."""
        for allocation in self.allocations:
            self._memory.free(allocation)
        self._memory.free(self._host_status)
        self.allocations = []
        for room in self.images:
            room.ready = None
        self._filled = self._parsed = []
        self._status_ready = self._stream = None


def text_room_bytes(free_bytes: int, share: float, wanted: int, round_bytes: int) -> int:
    """The text room's bytes: `wanted`, fewer where the rooms would take more than `share` of `free_bytes`, never fewer
    than MIN_TEXT_ROOM_BYTES; whole rounds of the copier's tasks (`round_bytes`: a task for each of its threads) where
    it holds one, so that its threads end a fill together (512 MiB is 10.7 rounds of 12 threads: a third of them idle
    through a fill's last task)."""
    text = min(wanted, TEXT_ROOM_BYTES)
    while text > MIN_TEXT_ROOM_BYTES and room_bytes(text) > free_bytes * share:
        text //= 2
    if text >= round_bytes:
        text -= text % round_bytes
    return max(MIN_TEXT_ROOM_BYTES, math.ceil(text / 16) * 16)
