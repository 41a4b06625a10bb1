"""The lab's files as an independent reference, and the mutations a hostile user would make of them.

The reference reads a CNN file and an input file from their bytes with Python's float() and the lab's layout, written
here from the format's rules alone, sharing no code with cnnlab: a count line, N images of 100 rows of 100 values, and
blank lines either before every image after the first or after none of them; the CNN file's 10 rows of filters and
10 of weights, with blank lines only around them. It answers None where a file is not valid. Its forward is the
lab's sums in the lab's order, on numpy arrays (so fast enough to run on every mutation).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

BLANK = b" \t\r\x0b\x0c"
TEXT = re.compile(rb"[\t\x20-\x7e]*")


def _lines(data: bytes) -> list[bytes]:
    """The file's lines without their line ends (a last line without one counts), trailing '\\r's dropped."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line.rstrip(b"\r") for line in lines]


def _row(line: bytes, width: int) -> list[float] | None:
    if not TEXT.fullmatch(line):
        return None
    fields = [field.strip(b" \t") for field in line.split(b",")]
    if len(fields) != width or any(not field or b"_" in field for field in fields):
        return None
    try:
        values = [float(field) for field in fields]
    except ValueError:
        return None
    return values if all(math.isfinite(value) for value in values) else None


def _rows(lines: list[bytes], width: int) -> tuple[list[list[float]], list[bool]] | None:
    """The non-blank lines as rows of `width` values, with whether a blank line comes before each; None if one is bad."""
    rows, blank_before, blank = [], [], False
    for line in lines:
        if not line.strip(BLANK):
            blank = True
            continue
        row = _row(line, width)
        if row is None:
            return None
        rows.append(row)
        blank_before.append(blank)
        blank = False
    return rows, blank_before


def starts_with_count(data: bytes) -> bool:
    """Whether the file's first non-blank line is a lone whole number: what makes a CSV file an input file to convert."""
    first = next((line for line in _lines(data) if line.strip(BLANK)), b"")
    return first.strip(BLANK).lstrip(b"+").isdigit()


def reference_images(data: bytes) -> np.ndarray | None:
    """The images of an input file, (N, 100, 100), or None where the file is not valid."""
    lines = _lines(data)
    nonblank = [index for index, line in enumerate(lines) if line.strip(BLANK)]
    if not nonblank or not TEXT.fullmatch(lines[nonblank[0]]):
        return None
    count = lines[nonblank[0]].strip(b" \t")
    digits = (count[1:] if count.startswith(b"+") else count).lstrip(b"0")
    if not digits or not digits.isdigit() or len(digits) > 18:
        return None
    images = int(digits)
    after = lines[nonblank[0] + 1 :]
    # Rows past the images' are refused whatever they hold: cut there, and refuse any non-blank line after.
    cut = [index for index, line in enumerate(after) if line.strip(BLANK)]
    if len(cut) != images * 100:
        return None
    parsed = _rows(after, 100)
    if parsed is None:
        return None
    rows, blank_before = parsed
    separated = images > 1 and blank_before[100]
    if any(blank_before[row] != (separated and row % 100 == 0) for row in range(1, len(rows))):
        return None
    return np.array(rows).reshape(images, 100, 100)


def reference_cnn(data: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """The filters (10, 5, 5) and weights (10, 4000) of a CNN file, or None where it is not valid."""
    lines = _lines(data)
    nonblank = [index for index, line in enumerate(lines) if line.strip(BLANK)]
    if len(nonblank) != 20:
        return None
    filters, filter_blanks = _rows(lines[: nonblank[9] + 1], 25) or (None, None)
    weights, weight_blanks = _rows(lines[nonblank[9] + 1 :], 4000) or (None, None)
    if filters is None or weights is None or any(filter_blanks[1:]) or any(weight_blanks[1:]):
        return None
    return np.array(filters).reshape(10, 5, 5), np.array(weights)


def reference_outputs(filters: np.ndarray, weights: np.ndarray, images: np.ndarray) -> np.ndarray:
    """The lab's forward: each conv sum over x, then y, from -0.0; ReLU; each dense sum over the 4000 values in order."""
    count = len(images)
    patches = images.reshape(count, 20, 5, 20, 5)
    conv = np.full((count, 10, 20, 20), -0.0)
    for x in range(5):
        for y in range(5):
            conv = conv + patches[:, None, :, x, :, y] * filters[None, :, x, y, None, None]
    flat = np.where(conv < 0.0, 0.0, conv).reshape(count, 4000)
    outputs = np.full((count, 10), -0.0)
    for k in range(4000):
        outputs = outputs + flat[:, k, None] * weights[None, :, k]
    return outputs


@dataclass(frozen=True)
class Expected:
    """What a run of a pair of files must give: outputs (and the images they come from), or None where it must fail."""

    images: np.ndarray | None
    outputs: np.ndarray | None


def expected(cnn_data: bytes, input_data: bytes) -> Expected:
    images, cnn = reference_images(input_data), reference_cnn(cnn_data)
    if images is None or cnn is None:
        return Expected(images, None)
    outputs = reference_outputs(*cnn, images)
    return Expected(images, outputs if np.isfinite(outputs).all() else None)


# ---------------------------------------------------------------------------------------------
# Files to start from, and their mutations


def lab_text(rows: np.ndarray, separated: bool, crlf: bool, count: int | None = None) -> bytes:
    """Matrices (n, r, c) as the lab writes them (repr, a blank line after each where `separated`), with a count line."""
    end = "\r\n" if crlf else "\n"
    lines = [] if count is None else [str(count)]
    for matrix in rows.tolist():
        lines += [",".join(map(repr, row)) for row in matrix]
        if separated:
            lines.append("")
    return (end.join(lines) + end).encode()


# The files mutated: the lab's own layout, one without blank lines between images, and one with CRLF line ends.
BASES = {"lab": (False, True), "no blank lines": (False, False), "crlf": (True, True)}


def base_files(base: str, images: int) -> tuple[bytes, bytes]:
    """A CNN file and an input file of `images` images, valid, in the layout `base` names (the same values each call)."""
    crlf, separated = BASES[base]
    filters, weights, values = (np.random.default_rng(seed).uniform(-10, 10, shape) for seed, shape in enumerate(
        [(1, 10, 25), (1, 10, 4000), (images, 100, 100)]))  # fmt: skip
    cnn = lab_text(filters, separated=True, crlf=crlf) + lab_text(weights, separated=False, crlf=crlf)
    return cnn, lab_text(values, separated, crlf, count=images)


# A mutation: ("line", kind, i, j, k) edits the lines, ("byte", kind, position, byte) the bytes; positions in [0, 1).
LINE_EDITS = ["drop", "duplicate", "move", "blank", "crlf", "drop value", "duplicate value", "move value", "count"]
BYTE_EDITS = ["truncate", "insert", "replace"]
where = st.floats(0, 1, exclude_max=True)
mutations = st.lists(
    st.one_of(
        st.tuples(st.just("line"), st.sampled_from(LINE_EDITS), where, where, where),
        st.tuples(st.just("byte"), st.sampled_from(BYTE_EDITS), where, st.integers(0, 255)),
    ),
    max_size=3,
)


def mutate(data: bytes, edits: list[tuple]) -> bytes:
    """`data` with each edit applied in turn."""
    for edit in edits:
        data = _edit_lines(data, *edit[1:]) if edit[0] == "line" else _edit_bytes(data, *edit[1:])
    return data


def _edit_lines(data: bytes, kind: str, a: float, b: float, c: float) -> bytes:
    lines = data.split(b"\n")
    i, j = int(a * len(lines)), int(b * len(lines))
    if kind == "drop":
        del lines[i]
    elif kind == "duplicate":
        lines.insert(i, lines[i])
    elif kind == "move":
        lines.insert(j, lines.pop(i))
    elif kind == "blank":
        lines.insert(i, b"")
    elif kind == "crlf":
        lines[i] += b"\r"
    elif kind == "count":
        lines[0] = str(int(lines[0].strip() or b"0") + int(c * 5) - 2).encode() if lines[0].strip().isdigit() else lines[0]
    else:
        fields = lines[i].split(b",")
        k, m = int(c * len(fields)), int(b * len(fields))
        if kind == "drop value":
            del fields[k]
        elif kind == "duplicate value":
            fields.insert(k, fields[k])
        else:
            fields.insert(m, fields.pop(k))
        lines[i] = b",".join(fields)
    return b"\n".join(lines)


def _edit_bytes(data: bytes, kind: str, a: float, byte: int) -> bytes:
    at = int(a * (len(data) + 1))
    if kind == "truncate":
        return data[:at]
    if kind == "insert":
        return data[:at] + bytes([byte]) + data[at:]
    return data[:at] + bytes([byte]) + data[at + 1 :]
