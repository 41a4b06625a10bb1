"""A span's lines as rows of numbers: the native parser, the Python twin that names a bad line, and the blank-line rule
of the lab's matrices.

The lab writes a blank line after each matrix (each image of an input file; the filters and the weights of a CNN file).
Where blank lines stand is checked, not assumed (kernel/lab_csv.h's lab_row_placed, which the CUDA parser shares): a
file has blank lines before every matrix after its first, or none after its first row, so that a matrix of 99 or 101
rows puts a blank line, or its absence, out of place, and is refused rather than read as shifted matrices.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from cnnlab.errors import InputFileError
from cnnlab.files.lines import NumberedLine, Span, native

_NOT_TEXT = re.compile(rb"[^\t\x20-\x7e]")  # anything but printable ASCII and tabs
_WALK_BACK_BYTES = 4096  # bytes looked at a time for the line before a span's first


@dataclass(frozen=True)
class Layout:
    """A file's matrices of `matrix_rows` rows, each named `name` in messages (numbered where there are many), and
    whether the file is `separated`: a blank line before every matrix after the first (else none after its first row)."""

    matrix_rows: int
    name: str
    numbered: bool = True
    separated: bool = False

    def matrix(self, row: int) -> str:
        """The matrix that row `row` (counted from 0) belongs to, as a message names it."""
        return f"{self.name} {row // self.matrix_rows + 1}" if self.numbered else f"the {self.name}"


@dataclass(frozen=True)
class RowPlace:
    """Where a span's rows stand among a file's matrices: its first row's number (from the first matrix's first, 0),
    and `bound`, the start of the span it was cut from (the line before is looked at, but no line before `bound`)."""

    layout: Layout
    first_row: int
    bound: int


def parse_rows(path: str | os.PathLike, span: Span, width: int, out: np.ndarray, place: RowPlace | None = None) -> None:
    """Parse the span's lines, each of `width` comma-separated finite numbers, into the flat array `out`; where `place`
    is given, the rows must stand where the layout's blank-line rule lets them.

    Every value is the double that Python's float() gives for its text (correctly rounded), but
    underscores, which the lab's Rust reader refused, are refused too. The native parser converts
    the span; where it finds anything amiss, the lines are walked one by one here, to name the
    first bad line and value.
    """
    if native is not None and native.parse_rows(span.data, span.start, span.end, width, out, *_native_place(span, place)) < 0:
        return
    lines = span.lines()
    check_lines(path, span, width, place, lines)
    # No line is bad (or there is no native parser): convert value by value, as float() does.
    out[:] = [float(field) for _, line in lines for field in line.split(b",")]


def _native_place(span: Span, place: RowPlace | None) -> tuple[int, int, int, bool]:
    """The native parser's (bound, first_row, matrix_rows, separated) for `place` (no rule where None)."""
    if place is None:
        return span.start, 0, 0, False
    return place.bound, place.first_row, place.layout.matrix_rows, place.layout.separated


def check_lines(
    path: str | os.PathLike, span: Span, width: int, place: RowPlace | None = None, lines: list[NumberedLine] | None = None
) -> None:
    """Raise the InputFileError that describes the span's first bad line, if one is bad: a line that is not `width`
    finite numbers, or (where `place` is given) a row that stands where the blank-line rule does not let it: after a
    blank line inside a matrix, or with a blank line before it where the file has none between its matrices, or
    without one where it has. `lines`: span.lines(), where the caller has them."""
    previous = span.line_before
    for index, (number, line) in enumerate(span.lines() if lines is None else lines):
        if place is not None:
            layout, row = place.layout, place.first_row + index
            blank_before = number > previous + 1 or (index == 0 and line_before_is_blank(span.data, place.bound, span.start))
            if row and blank_before != (layout.separated and row % layout.matrix_rows == 0):  # named where it is: the blank line
                raise InputFileError(path, _misplaced(layout, row, blank_before), number - blank_before)
        check_line(path, number, line, width)
        previous = number


def _misplaced(layout: Layout, row: int, blank_before: bool) -> str:
    """What is out of place where row `row` stands (lab_csv.h's lab_row_placed is false for it)."""
    rows, second = layout.matrix_rows, layout.matrix(layout.matrix_rows)
    if row % rows:
        return f"a blank line inside {layout.matrix(row)}, before its row {row % rows + 1} (of {rows})"
    if blank_before:
        return f"a blank line before {layout.matrix(row)}, though there is none before {second}: a row missing or extra above it?"
    return f"no blank line before {layout.matrix(row)}, though there is one before {second}: a row missing or extra above it?"


def line_before_is_blank(data: np.ndarray, bound: int, start: int) -> bool:
    """Whether the line that ends just before `start` (a line start) is blank, looking back no further than `bound`, the
    start of a span: a span starts just after a row (or the count line), so there the line before is not blank."""
    at = start - 1  # the '\n' that ends the line before
    while at > bound:
        text = data[max(bound, at - _WALK_BACK_BYTES) : at].tobytes()
        cut = text.rfind(b"\n")
        if text[cut + 1 :].strip():
            return False
        if cut >= 0:
            return True
        at -= len(text)
    return start > bound


def cut_row(line: bytes, width: int) -> bool:
    """Whether `line` could be a row of `width` values cut short: text, at most `width` fields, each but the last a number."""
    fields = line.rstrip(b"\r").split(b",")
    if _NOT_TEXT.search(line) or len(fields) > width:
        return False
    try:
        return all(np.isfinite(float(field)) and b"_" not in field for field in fields[:-1])
    except ValueError:
        return False


def check_text(path: str | os.PathLike, number: int, line: bytes) -> None:
    """Raise an InputFileError where the line holds a byte that is not text."""
    if binary := _NOT_TEXT.search(line):
        column = binary.start()
        raise InputFileError(
            path, f"not a text file of numbers (byte 0x{line[column]:02x} at column {column + 1})", number
        )


def check_line(path: str | os.PathLike, number: int, line: bytes, width: int) -> None:
    check_text(path, number, line)
    fields = line.split(b",")
    if len(fields) != width:
        raise InputFileError(path, f"expected {width} comma-separated values, found {len(fields)}", number)
    for position, field in enumerate(fields, start=1):
        text = field.decode("ascii").strip()
        if not text:
            raise InputFileError(path, f"value {position} is missing", number)
        try:
            if "_" in text:
                raise ValueError(text)
            value = float(text)
        except ValueError:
            raise InputFileError(path, f"value {position} {shorten(text)!r} is not a number", number) from None
        if not np.isfinite(value):
            raise InputFileError(path, f"value {position} {shorten(text)!r} is not a finite number", number)


def shorten(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
