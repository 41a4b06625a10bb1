"""cnnlab.files._lab_csv, compiled from native/lab_csv_module.cpp and the stages it includes (native/lab_csv_*.h, each
function's full contract beside it): the lab's CSV walked and parsed natively (kernel/lab_csv.h's rules), the GIL released."""

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

# What the native code reads and writes through the buffer protocol: numpy declares it on its arrays (for type
# checkers) only from Python 3.12 on, hence the arrays by name.
Bytes = Buffer | npt.NDArray[np.uint8]
Floats = Buffer | npt.NDArray[np.float64]

# summarize's (newlines, head_ink, tail_ink, inner, first, last, longest): what the lines of a range say.
Summary = tuple[int, bool, bool, int, int, int, int]
# read_summarized's parts: a Summary with the part's (start, end) before it.
SummarizedPart = tuple[int, int, int, bool, bool, int, int, int, int]

# The row parsers' instruction sets, as CNNLAB_CPU_ISA names them, widest first: those built, and those this CPU runs.
ISAS: tuple[str, ...]
CPU_ISAS: tuple[str, ...]
FIELD_OK: int
FIELD_HOST: int
FIELD_BAD: int

class Pool:
    """Pool(threads): threads that parse_pieces runs on (the caller's among them)."""

    def __init__(self, threads: int, /) -> None: ...
    def close(self) -> None:
        """Stop the threads."""

def scan_rows(data: Bytes, start: int, rows: int, max_line_bytes: int, /) -> tuple[int, int, int]:
    """Walk '\\n'-ended lines from `start` until `rows` non-blank ones are taken: (end, rows_found, lines_passed); a line
    longer than max_line_bytes gives (-1, rows_found, index of that line counted from start)."""

def summarize(data: Bytes, start: int, end: int, /) -> Summary:
    """What the lines of data[start:end] say, for combining with the summaries of the ranges beside it."""

def read_summarized(fd: int, window: Bytes, at: int, nbytes: int, offset: int, threads: int, /) -> tuple[int, list[SummarizedPart]]:
    """Fill window[at:at + nbytes] from fd at offset with `threads` reads at once, each part summarized: (count, parts)."""

def summarize_parts(data: Bytes, start: int, end: int, threads: int, /) -> tuple[int, list[SummarizedPart]]:
    """data[start:end] summarized in parts of 1 MB on `threads` threads, as read_summarized's parts: (count, parts)."""

def parse_rows(
    data: Bytes, start: int, end: int, width: int, out: Floats, bound: int = ..., first_row: int = ..., matrix_rows: int = ...,
    separated: bool = ..., /,
) -> int:
    """Parse the non-blank lines of data[start:end] as `width` numbers each into the float64 buffer `out`; -1 if all were
    good, else the index among the non-blank lines of the first bad one. Where matrix_rows is given, the rows (the first
    numbered first_row) must stand where the lab's layout lets them: the line before the range is read back to `bound`."""

def parse_walk(
    pool: Pool, data: Bytes, start: int, rows: int, width: int, out: Floats, first_row: int, matrix_rows: int, separated: bool,
    max_line_bytes: int, part_bytes: int, timed: bool, /,
) -> tuple[int, int, bytes | None]:
    """parse_rows of the next `rows` non-blank lines from `start`, their end found by the walk itself on the pool's threads
    (the text cut into parts of part_bytes, each counted, then parsed in its place): (end, lines walked, times); end -1
    where a line is bad or longer than max_line_bytes, or the data ends first. times (where `timed`): int64 bytes of
    (pool worker, thread id, start ns, end ns, bytes) for each part parsed."""

def parse_pieces(
    pool: Pool, data: Bytes, pieces: npt.NDArray[np.int64], width: int, out: Floats, bound: int = ..., first_row: int = ...,
    matrix_rows: int = ..., separated: bool = ..., times: npt.NDArray[np.int64] | None = ..., /,
) -> int:
    """parse_rows for every piece of `pieces` (an int64 array of (start, end, first row) triples), on the pool's threads;
    -1 if all were good, else the first bad piece. `times` (a trace's): an int64 array of a row per piece, filled with
    (pool worker, thread id, start ns, end ns) on CLOCK_MONOTONIC, time.perf_counter_ns's clock."""

def format_rows(values: Floats, /) -> str:
    """A C-contiguous 2-D float64 array as CSV lines, each value as repr() writes it."""

def parse_field(data: Bytes, /) -> tuple[int, float | None]:
    """One field: (0, value) proved by lab_csv.h, (1, value) converted by std::from_chars, (2, None) refused."""

def parser_isa() -> str:
    """The instruction set of the row parser in use: one of CPU_ISAS (at first the widest)."""

def use_isa(name: str, /) -> None:
    """Parse rows with the row parser of `name`, one of CPU_ISAS (for every thread, from the next call on)."""

def from_chars_pieces(pool: Pool, data: Bytes, pieces: npt.NDArray[np.int64], width: int, out: Floats, /) -> int:
    """The bench's peer, not cnnlab's parser: each piece's fields split at ',' and newlines and read by std::from_chars, on the
    pool's threads, into out from its first row * width on; the values written, or -1 where from_chars refused a field."""
