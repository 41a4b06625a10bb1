"""The lab's input CSV parsed on the GPU (kernel/csv.cu): a block of text to rows of doubles, exactly.

The host cuts the file into blocks at line ends (after the first line, N), counts each block's non-blank
lines on the CPU where it reads them (a pipe's text) or leaves the count to the device (a regular file's
ranges, copied straight to the device: csv_double_buffer.py), and calls `CsvParser.parse`, which
launches csv.cu's kernels on the caller's stream: every value becomes the double float() gives for
its text, written as row `first_row + r` of `images` (rows of 100 doubles, the layout conv2d_relu
reads). The block's `CsvStatus` comes back with `fetch_status` and reads as a `BlockResult`:

- `bad_row` (block-relative) not None: the block has a bad line (wrong field count, a byte that is
  not text, a value float() refuses or that is not finite) or the host's and the device's line
  counts differ: re-check the block with labcsv's line checker for the message;
- `whole_block_on_host`: more values than the status lists need the host's float(): convert the
  block on the host;
- otherwise `host_fields` lists the few values (row, field, offset, length) the device could not
  prove; `host_values` converts them with float() and `patch` writes them in (they are NaN until then).

`CsvParse` holds the buffers one parse needs and runs the status flow that follows it, for both of its callers (a
chunk stream's text, chunk_streams.py; a file's ranges, csv_double_buffer.py).

Scratch: one device buffer per parse of `scratch_bytes(max_block_bytes, max_rows)` bytes (12 bytes per
8 KB of text; per row 8 bytes of span and 400 of field ends; 2 KB of patch values), a status of
STATUS_DTYPE.itemsize bytes per block in flight, and nothing allocated per call (a 2 KB page-locked
staging buffer for patches is made once).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cnnlab.files.lines import MAX_LINE_BYTES
from cnnlab.files.rows import Layout
from cnnlab.tracing import NO_TRACE, Tracer

if TYPE_CHECKING:
    from cnnlab.cuda.driver import DeviceAllocation, Driver
    from cnnlab.cuda.memory import Allocator

WIDTH = 100  # values per line; csv.cu's CSV_WIDTH
TILE_BYTES = 8192  # csv_tile_summaries and csv_index_rows: bytes per thread block (32 a thread)
TILE_THREADS = 256
SCAN_THREADS = 1024
SPLIT_THREADS = 256  # csv_split_rows: 8 warps, a row each at a time
FIELD_THREADS = 256  # csv_parse_fields: a thread per field
PATCH_THREADS = 256
HOST_SLOTS = 256  # HOST fields listed per block
NO_BAD_ROW = 0x7FFFFFFF
SEG_BYTES, SPAN_BYTES = 12, 8
UNCOUNTED_GRID = 8192  # thread blocks of csv_split_rows and csv_parse_fields where the host has not counted the rows

HOST_FIELD_DTYPE = np.dtype([("row", "<i4"), ("field", "<i4"), ("offset", "<i4"), ("length", "<i4")])
STATUS_DTYPE = np.dtype(
    [("bad_row", "<i4"), ("lines", "<i4"), ("host_count", "<i4"), ("overflow", "<i4"), ("host", HOST_FIELD_DTYPE, (HOST_SLOTS,))]
)


@dataclass(frozen=True)
class BlockResult:
    """What the device found in one block."""

    lines: int  # non-blank lines
    bad_row: int | None  # the smallest bad row, block-relative; None if none
    whole_block_on_host: bool  # more HOST fields than the status lists
    host_fields: np.ndarray  # HOST_FIELD_DTYPE records: values to convert with float() and patch in

    @property
    def ok(self) -> bool:
        """Every row good and every value on the device or in host_fields."""
        return self.bad_row is None and not self.whole_block_on_host


def read_status(status: np.ndarray) -> BlockResult:
    """The BlockResult of a host copy of a CsvStatus (an array of STATUS_DTYPE, one element)."""
    record = status.reshape(-1)[0]
    count = int(record["host_count"])
    bad = int(record["bad_row"])
    return BlockResult(
        lines=int(record["lines"]),
        bad_row=None if bad == NO_BAD_ROW else bad,
        whole_block_on_host=bool(record["overflow"]) or count > HOST_SLOTS,
        host_fields=record["host"][: min(count, HOST_SLOTS)].copy(),
    )


def host_values(text: bytes | memoryview | np.ndarray, result: BlockResult) -> np.ndarray:
    """float() of each listed HOST field of the block `text` (the host's copy of the block)."""
    data = (text.data if isinstance(text, np.ndarray) else memoryview(text)).cast("B")
    return field_values(bytes(data[offset : offset + length]) for offset, length in host_spans(result))


def host_spans(result: BlockResult) -> list[tuple[int, int]]:
    """(offset, length) in the block of each listed HOST field."""
    return list(zip(result.host_fields["offset"].tolist(), result.host_fields["length"].tolist()))


def field_values(fields: Iterable[bytes]) -> np.ndarray:
    """float() of each field's text: the values the device left to the host."""
    return np.array([float(field) for field in fields], dtype=np.float64)


def scratch_bytes(max_block_bytes: int, max_rows: int) -> int:
    """Device scratch one parse needs for blocks of up to `max_block_bytes` bytes and `max_rows` rows."""
    return HOST_SLOTS * 8 + _round16(math.ceil(max_block_bytes / TILE_BYTES) * SEG_BYTES) + max_rows * (SPAN_BYTES + 4 * WIDTH)


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def _grid(blocks: int, counted: bool) -> int:
    """The blocks to launch for a kernel that strides: all of them for a counted block, at most UNCOUNTED_GRID where the
    rows are only a bound (most of a text buffer's bound is never reached: a row of random values is ~10x the shortest)."""
    return blocks if counted else min(blocks, UNCOUNTED_GRID)


def _record(event: Any, stream: Any) -> None:
    if event is not None:
        event.record(stream)


class CsvParser:
    """csv.cu's kernels from `module`, launched over one parse's scratch (device address)."""

    def __init__(self, module: Any, scratch: Any, max_block_bytes: int, max_rows: int) -> None:
        import pycuda.driver as driver

        self._driver = driver
        layout = np.empty(7, np.int32)
        driver.memcpy_dtoh(layout, module.get_global("csv_layout")[0])
        expected = [STATUS_DTYPE.itemsize, HOST_SLOTS, WIDTH, TILE_BYTES, SPAN_BYTES, SEG_BYTES, MAX_LINE_BYTES]
        if layout.tolist() != expected:
            raise ValueError(f"csv.cu's layout {layout.tolist()} is not csv_parser.py's {expected}: rebuild the module")
        self.max_block_bytes, self.max_rows = max_block_bytes, max_rows
        base = int(scratch)
        self._values = base
        self._tiles = base + HOST_SLOTS * 8
        self._spans = self._tiles + _round16(math.ceil(max_block_bytes / TILE_BYTES) * SEG_BYTES)
        self._ends = self._spans + max_rows * SPAN_BYTES
        self._tile_summaries = self._prepare(module, "csv_tile_summaries", "PiP")
        self._scan_tiles = self._prepare(module, "csv_scan_tiles", "PiiP")
        self._index_rows = self._prepare(module, "csv_index_rows", "PiPiPP")
        self._split_rows = self._prepare(module, "csv_split_rows", "PiPiPPqii")
        self._parse_fields = self._prepare(module, "csv_parse_fields", "PPPiiPP")
        self._patch_fields = self._prepare(module, "csv_patch_fields", "PiPPi")
        self._staging = driver.pagelocked_empty(HOST_SLOTS, np.float64)  # patch values on their way in
        self._staging_free = driver.Event(driver.event_flags.DISABLE_TIMING)
        self._staging_free.record()

    @staticmethod
    def _prepare(module: Any, name: str, signature: str) -> Any:
        function = module.get_function(name)
        function.prepare(signature)
        return function

    def parse(
        self, stream: Any, block: Any, nbytes: int, images: Any, first_row: int, rows: int | None, status: Any,
        layout: Layout | None = None, file_row: int = 0, marks: list[Any] | None = None,
    ) -> None:
        """Queue the parse of `nbytes` of text at `block` into rows first_row.. of `images`, status to `status`. Where
        `layout` is given, the rows must stand where its blank-line rule lets them (files/rows.py), the block's first
        row being the file's row `file_row` (counted from its first image's first; a block starts just after a row).
        `rows`: the block's non-blank lines as the host counted them; None where it has not (a range of a file's text):
        the device's count stands then, up to max_rows (more is a bad row), and `images` must hold that many after
        first_row.

        `marks` (timing only): 4 events, recorded between the 5 kernels.
        """
        counted = rows is not None
        rows = self.max_rows if rows is None else rows
        if not 0 <= nbytes <= self.max_block_bytes or not 0 <= rows <= self.max_rows or int(block) % 16:
            raise ValueError(f"block of {nbytes} bytes, {rows} rows at {int(block):#x}: over the scratch's size or not 16-byte aligned")
        marks = list(marks or []) + [None] * 4
        self.tile_summaries(stream, block, nbytes)
        _record(marks[0], stream)
        self.scan_tiles(stream, nbytes, rows if counted else -rows, status)
        _record(marks[1], stream)
        self.index_rows(stream, block, nbytes, rows, status)
        _record(marks[2], stream)
        self.split_rows(stream, block, nbytes, rows, status, layout, file_row, counted)
        _record(marks[3], stream)
        self.parse_fields(stream, block, rows, first_row, images, status, counted)

    # One launcher per kernel: the grid from the sizes, the launch (PyCUDA raises a failed launch at once).

    def tile_summaries(self, stream: Any, block: Any, nbytes: int) -> None:
        if tiles := math.ceil(nbytes / TILE_BYTES):
            self._tile_summaries.prepared_async_call((tiles, 1), (TILE_THREADS, 1, 1), stream, block, np.int32(nbytes), self._tiles)

    def scan_tiles(self, stream: Any, nbytes: int, rows: int, status: Any) -> None:
        """`rows` < 0: not counted by the host, any count up to -rows is good."""
        tiles = math.ceil(nbytes / TILE_BYTES)  # 0 for an empty block, which still gets its status
        self._scan_tiles.prepared_async_call((1, 1), (SCAN_THREADS, 1, 1), stream, self._tiles, np.int32(tiles), np.int32(rows), status)

    def index_rows(self, stream: Any, block: Any, nbytes: int, rows: int, status: Any) -> None:
        if tiles := math.ceil(nbytes / TILE_BYTES):
            self._index_rows.prepared_async_call(
                (tiles, 1), (TILE_THREADS, 1, 1), stream, block, np.int32(nbytes), self._tiles, np.int32(rows), self._spans, status
            )

    def split_rows(
        self, stream: Any, block: Any, nbytes: int, rows: int, status: Any, layout: Layout | None, file_row: int, counted: bool = True
    ) -> None:
        """`counted`: `rows` is the block's count, else only its bound (the kernel strides over the rows there are)."""
        if blocks := _grid(math.ceil(rows / (SPLIT_THREADS // 32)), counted):
            rule = (np.int64(file_row), np.int32(layout.matrix_rows if layout else 0), np.int32(layout is not None and layout.separated))
            self._split_rows.prepared_async_call(
                (blocks, 1), (SPLIT_THREADS, 1, 1), stream, block, np.int32(nbytes), self._spans, np.int32(rows), self._ends, status, *rule
            )

    def parse_fields(self, stream: Any, block: Any, rows: int, first_row: int, images: Any, status: Any, counted: bool = True) -> None:
        if blocks := _grid(math.ceil(rows * WIDTH / FIELD_THREADS), counted):
            sizes = np.int32(rows), np.int32(first_row)
            self._parse_fields.prepared_async_call(
                (blocks, 1), (FIELD_THREADS, 1, 1), stream, block, self._spans, self._ends, *sizes, images, status
            )

    def fetch_status(self, stream: Any, host_status: np.ndarray, status: Any) -> None:
        """Queue the copy of the device status to `host_status` (page-locked, STATUS_DTYPE); read_status() it once synchronized."""
        self._driver.memcpy_dtoh_async(host_status, status, stream)

    def patch(self, stream: Any, images: Any, first_row: int, status: Any, values: np.ndarray) -> None:
        """Queue the writing of `values` (host_values() of this block's result) to their places in `images`."""
        count = len(values)
        if not count:
            return
        self._staging_free.synchronize()  # the last patch's values have left the staging buffer
        self._staging[:count] = values
        self._driver.memcpy_htod_async(self._values, self._staging[:count], stream)
        self._staging_free.record(stream)
        grid = (math.ceil(count / PATCH_THREADS), 1)
        self._patch_fields.prepared_async_call(
            grid, (PATCH_THREADS, 1, 1), stream, images, np.int32(first_row), status, self._values, np.int32(count)
        )


class CsvParse:
    """The device buffers of a GPU CSV parse and the flow of its status: `texts` text buffers of `text_bytes` (one for a
    chunk stream, two for a file's double buffering), the parser's scratch for blocks of up to `rows` rows, the status on
    the device and page-locked on the host, and the event recorded once the status has arrived."""

    def __init__(self, driver: Driver, memory: Allocator, module: Any, text_bytes: int, rows: int, texts: int = 1) -> None:
        self._memory, self.text_bytes = memory, text_bytes
        self._allocations: list[DeviceAllocation | np.ndarray] = []
        try:
            self.texts = [self._device(text_bytes) for _ in range(texts)]
            self._status = self._device(STATUS_DTYPE.itemsize)
            self._parser: Any = CsvParser(module, self._device(scratch_bytes(text_bytes, rows)), text_bytes, rows)
            self._host_status = memory.host(1, STATUS_DTYPE)
            self._allocations.append(self._host_status)
        except BaseException:  # what was made goes back
            self.free()
            raise
        self._status_ready: Any = driver.Event(driver.event_flags.DISABLE_TIMING)

    def _device(self, nbytes: int) -> DeviceAllocation:
        allocation = self._memory.device(nbytes)
        self._allocations.append(allocation)
        return allocation

    def queue(
        self, stream: Any, text: Any, nbytes: int, images: Any, first_row: int, rows: int | None, layout: Layout, file_row: int,
        trace: Tracer = NO_TRACE,
    ) -> None:
        """Queue CsvParser.parse on `stream` (one span of `trace`: events cost), then the status's copy to the host."""
        with trace.span("parse text", stream, bytes=nbytes):
            self._parser.parse(stream, text, nbytes, images, first_row, rows, self._status, layout, file_row)
        self._parser.fetch_status(stream, self._host_status, self._status)
        self._status_ready.record(stream)

    def result(self) -> BlockResult:
        """What the last parse queued found, once its status has arrived."""
        self._status_ready.synchronize()
        return read_status(self._host_status)

    def patch(self, stream: Any, images: Any, first_row: int, values: np.ndarray) -> None:
        """Queue the writing of the host's `values` for the last parse's listed fields into `images`."""
        self._parser.patch(stream, images, first_row, self._status, values)

    def free(self) -> None:
        """Give the memory back; the parser's event and staging buffer go with their last reference, now, on the thread
        where the context is current."""
        for allocation in self._allocations:
            self._memory.free(allocation)
        self._allocations = []
        self._parser = self._status_ready = None
