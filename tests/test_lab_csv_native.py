"""cnnlab.files._lab_csv (native/lab_csv_module.cpp, kernel/lab_csv.h) against Python: every value bit for
bit what float() gives, every spelling float() refuses refused (and '_', inf, nan, overflow too),
and the line layout (blank lines, CRLF, field counts, text bytes) as the Python line checker reads it.
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from decimal import Context, Decimal
from fractions import Fraction

import numpy as np
import pytest
from helpers import SUBPROCESS_ENV
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    from cnnlab.files import _lab_csv as native
except ImportError:  # built by `pip install -e .` or `python setup.py build_ext --inplace`, where a C++17 compiler is
    native = None

pytestmark = pytest.mark.skipif(
    native is None,
    reason="cnnlab.files._lab_csv is not built (it needs a C++17 compiler: `pip install -e .` or `python setup.py build_ext --inplace`)",
)


@pytest.fixture(autouse=True, params=native.CPU_ISAS if native is not None else ("none",))
def parser_isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test here on each row parser this CPU runs (the AVX-512, AVX2 and scalar ones on x86-64), as
    CNNLAB_CPU_ISA chooses them: each must give float()'s values and refuse the same lines."""
    if native is None:
        yield request.param
        return
    before = native.parser_isa()
    native.use_isa(request.param)
    try:
        yield request.param
    finally:
        native.use_isa(before)


OK, HOST, BAD = 0, 1, 2
BLANK = b" \t\r\x0b\x0c"  # bytes.strip()'s whitespace, less '\n'


def reference(text: str | bytes) -> float | None:
    """The lab's rule in Python: float() of the stripped field, refused if '_' or not finite."""
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    text = text.strip(" \t")
    if "_" in text or not text or any(not (c == "\t" or " " <= c <= "~") for c in text):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).view(np.uint64)


# Bytes after the range a test parses: a vector row parser loads 32 bytes past a field's first digit, as it does inside a
# file; one that read past a field's end would meet digits, a sign, a point and an 'e' here.
AFTER_RANGE = b"7.5,-0.1e+9\n" * 8


def parse_column(texts: list[str], width: int = 100) -> np.ndarray:
    """The texts as rows of `width` fields (the last row padded with '0') through parse_rows (the row parser in use)."""
    padded = texts + ["0"] * (-len(texts) % width)
    text = "".join(",".join(padded[i : i + width]) + "\n" for i in range(0, len(padded), width)).encode()
    out = np.full(len(padded), np.nan)
    assert native.parse_rows(text + AFTER_RANGE, 0, len(text), width, out) == -1
    return out[: len(texts)]


def row_value(text: str | bytes) -> float | None:
    """The text as a one-field row through parse_rows (the row parser in use): its value, or None where it is refused
    (or blank, which a row parser skips as a blank line)."""
    data = text.encode("latin-1") if isinstance(text, str) else text
    if not data.strip(BLANK) or b"\n" in data or b"\r" in data:
        return None
    out = np.full(1, np.nan)
    return None if native.parse_rows(data + b"\n" + AFTER_RANGE, 0, len(data) + 1, 1, out) == 0 else float(out[0])


def assert_row_agrees(text: str | bytes, expected: float | None) -> None:
    """The row parser in use gives float()'s value for the text, or refuses it where float() does."""
    got = row_value(text)
    if expected is None:
        assert got is None, f"{text!r} accepted by the row parser as {got!r}"
    else:
        assert got is not None and bits([got]) == bits([expected]), f"{text!r}: row parser {got!r} != float() {expected!r}"


def assert_exact(texts: list[str], got: np.ndarray) -> None:
    expected = [float(t) for t in texts]
    wrong = np.flatnonzero(bits(expected) != bits(got))
    details = [f"{texts[i]!r}: {got[i]!r} != float() {expected[i]!r}" for i in wrong[:5]]
    assert not len(wrong), f"{len(wrong)} of {len(texts)} values differ from float(): " + "; ".join(details)


def random_doubles(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite doubles from random bit patterns (every exponent equally likely), the lab's uniform
    [-10, 10] values, subnormals, and small integers."""
    raw = rng.integers(0, 1 << 64, size=n, dtype=np.uint64, endpoint=False).view(np.float64)
    raw = raw[np.isfinite(raw)]
    k = n // 8
    subnormal = (rng.integers(0, 1 << 52, size=k, dtype=np.uint64) | (rng.integers(0, 2, size=k, dtype=np.uint64) << 63)).view(
        np.float64
    )
    return np.concatenate([raw, rng.uniform(-10, 10, k), subnormal, rng.integers(-(10**6), 10**6, k).astype(np.float64)])


def pad(rng: np.random.Generator, texts: list[str]) -> list[str]:
    spaces = ["", " ", "\t", "  ", " \t", "\t "]
    left, right = rng.integers(0, len(spaces), (2, len(texts)))
    return [spaces[a] + t + spaces[b] for t, a, b in zip(texts, left, right)]


# ---------------------------------------------------------------------------------------------
# Values


@pytest.mark.slow
def test_a_million_random_doubles_in_repr_are_exact(rng: np.random.Generator) -> None:
    values = random_doubles(rng, 1_000_000)
    texts = list(map(repr, values.tolist()))
    got = parse_column(texts)
    assert np.array_equal(bits(got), bits(values))  # repr round-trips, so float() gives the value itself
    assert_exact(texts, got)


@pytest.mark.parametrize(
    "form",
    ["%.17e", "%.25e", "%.17E", "+repr", "%.40g", "padded repr"],
)
def test_random_doubles_in_other_forms_are_exact(rng: np.random.Generator, form: str) -> None:
    values = random_doubles(rng, 200_000).tolist()
    if form == "+repr":
        texts = [("+" if v >= 0 and math.copysign(1, v) > 0 else "") + repr(v) for v in values]
    elif form == "padded repr":
        texts = pad(rng, list(map(repr, values)))
    else:
        texts = [form % v for v in values]
    assert_exact(texts, parse_column(texts))


EXTREMES = [
    "4.9406564584124654e-324",
    "5e-324",
    "2.4703282292062327e-324",  # just below half the smallest subnormal: 0
    "2.4703282292062328e-324",  # just above: the smallest subnormal
    "2.2250738585072011e-308",
    "2.2250738585072014e-308",
    "2.2250738585072012e-308",
    "2.225073858507201136057409796709131975934819546351645648e-308",
    "1.7976931348623157e308",
    "1.7976931348623158e308",
    "-0.0",
    "-0",
    "+0",
    "0e999",
    "-0e999999999999999999",
    "0e-999999999999999999999",
    "1e-400",
    "-1e-400",
    "1e-99999999999999999999",
    "9007199254740993",  # 2^53 + 1: a tie, to even
    "9007199254740993.0000000000000000000001",
    "9007199254740995",
    "18014398509481986",
    "295147905179352891391",  # 2^68 - 1
    "1e22",
    "1e23",
    "8.98846567431158e307",
    "123456789e-330",
    "0.000000000000000000000000000000000000000000001",
    "1." + "0" * 400,
    "0." + "0" * 400 + "1e401",
    "1" + "0" * 300,
    "0.1",
    "0.3",
    "1.",
    ".5",
    "-.5",
    "1e5",
    "1E+05",
    "+.5e-3",
    "00000000000000000000000000000000000001.5",
    "0000.000000000000000000000000000000000001e38",
    "007",
    "1.e5",
    "  3.25\t",
    "\t-7\t",
]


@pytest.mark.parametrize("text", EXTREMES)
def test_extremes_and_spellings_are_exact(text: str) -> None:
    expected = reference(text)
    kind, value = native.parse_field(text.encode())
    assert expected is not None and kind in (OK, HOST)
    assert bits([value]) == bits([expected]), f"{text!r}: {value!r} != {expected!r}"
    assert_exact([text], parse_column([text], width=1))


def test_overflow_at_the_rounding_boundary_is_refused() -> None:
    # the largest double (2^1024 - 2^971) plus half an ulp, exactly: a tie that rounds (to even) to infinity, as float() does
    boundary = 2**1024 - 2**970
    text = str(boundary)
    assert math.isinf(float(text))
    assert native.parse_field(text.encode()) == (BAD, None)
    below = str(boundary - 1)
    assert native.parse_field(below.encode())[1] == float(below) == 1.7976931348623157e308


def midpoint_texts(rng: np.random.Generator, count: int) -> list[str]:
    """Decimal strings right at and around the halfway points between adjacent doubles."""
    context, wide = Context(prec=1200), Context(prec=60)
    texts = []
    doubles = random_doubles(rng, count)[: count // 2].tolist() + rng.uniform(-10, 10, count // 2).tolist()
    for x in doubles:
        x, after = abs(x), math.nextafter(abs(x), math.inf)
        if math.isinf(after):
            continue
        mid = (Fraction(x) + Fraction(after)) / 2
        exact = context.divide(Decimal(mid.numerator), Decimal(mid.denominator))  # exact: the denominator is a power of 2
        texts.append(format(exact, "e"))
        forty = Context(prec=40).plus(exact)
        unit = Decimal((0, (1,), forty.adjusted() - 39))
        for offset in (-3, -1, 0, 1, 3):
            near = wide.add(forty, wide.multiply(offset, unit))
            for digits in (17, 19, 20, 23, 30, 40, 45):
                texts.append(format(near, f".{digits - 1}e"))
            texts.append(format(near, "f") if -30 < near.adjusted() < 30 else format(near, "E"))
    signs = rng.integers(0, 3, len(texts))
    return [("-", "+", "")[s] + t for t, s in zip(texts, signs)]


def test_halfway_points_are_exact(rng: np.random.Generator) -> None:
    texts = midpoint_texts(rng, 4000)
    assert_exact(texts, parse_column(texts))
    kinds = [native.parse_field(t.encode())[0] for t in texts[:2000]]
    assert kinds.count(HOST) > 0, "the halfway points should need the host sometimes"


def test_halfway_points_in_repr_shape_are_exact(rng: np.random.Generator) -> None:
    """The shape the vector parser reads itself, [-]d.ddd with up to 17 digits after the point, right beside the halfway
    points between adjacent doubles of the lab's range: 17 significant digits rounded down and up from the midpoint."""
    from decimal import ROUND_CEILING, ROUND_FLOOR

    context = Context(prec=1200)
    texts = []
    for x in np.abs(rng.uniform(-10, 10, 3000)).tolist() + np.abs(rng.uniform(-1, 1, 1000)).tolist():
        mid = Fraction(x) + (Fraction(math.nextafter(x, math.inf)) - Fraction(x)) / 2
        exact = context.divide(Decimal(mid.numerator), Decimal(mid.denominator))
        places = 16 if exact >= 1 else 17  # 17 significant digits (or the first after "0.")
        for rounding in (ROUND_FLOOR, ROUND_CEILING):
            texts.append(format(exact.quantize(Decimal(1).scaleb(-places), rounding=rounding), "f"))
    texts = [("-" if sign else "") + t for t, sign in zip(texts, rng.integers(0, 2, len(texts)))]
    assert all(len(t.lstrip("-").split(".")[1]) <= 17 for t in texts)
    assert_exact(texts, parse_column(texts))


@pytest.mark.parametrize("width", [*range(1, 18), 100])
def test_repr_rows_of_every_width_are_exact(rng: np.random.Generator, width: int) -> None:
    """Rows of repr-shaped fields of every width to 17 (the AVX-512 parser converts eight fields a step, the rest in a
    group of fewer elements): values just below and above powers of two (where rounding carries into the exponent), zeros of
    both signs, the smallest values the shape writes, and 1 to 20 digits after the point (past 17: the scalar path's)."""
    values: list[float] = []
    for power in range(-4, 4):
        below = above = 2.0**power
        for _ in range(12):
            below = math.nextafter(below, 0.0)
            values += [below, above]
            above = math.nextafter(above, math.inf)
    # A quarter of a step below each power of two, to the digits the shape holds: it rounds up to the power itself.
    below_powers = [format(Decimal(2.0**p) - Decimal(2.0**p - math.nextafter(2.0**p, 0.0)) / 4, ".17f")[:19] for p in range(-3, 4)]
    texts = [repr(v) for v in values] + below_powers + ["0.0", "-0.0", "0.00000000000000001", "-9.99999999999999999", "-0.5"]
    texts += [f"{v:.{places}f}" for v in rng.uniform(-10, 10, 60).tolist() for places in (1, 2, 8, 15, 16, 17, 18, 20)]
    texts = [("-" + t if sign and not t.startswith("-") else t) for t, sign in zip(texts, rng.integers(0, 2, len(texts)))]
    texts = [texts[i] for i in rng.permutation(len(texts))]
    assert_exact(texts, parse_column(texts, width))


def row_values(row: str) -> list[float] | None:
    """The row through parse_rows with as many fields as it has (the row parser in use): its values, or None where it is
    refused."""
    width = row.count(",") + 1
    out = np.full(width, np.nan)
    data = row.encode() + b"\n"
    return None if native.parse_rows(data + AFTER_RANGE, 0, len(data), width, out) == 0 else out.tolist()


@pytest.mark.parametrize("length", [63, 64, 65, 128, 192])
@pytest.mark.parametrize("end", [",", "-", ",5", ",-5", ",5.", ",0.0", ",.5", ",-", ",5.5-", ",0.00,"])
def test_rows_that_end_at_a_word_s_end_are_read_as_float_reads_them(length: int, end: str) -> None:
    """Rows of exactly 63 to 192 bytes whose last bytes are a comma, a minus sign, a field without a point or without
    digits after it, or fields of other shapes: the AVX-512 parser checks a row's shape 64 bytes at a time, carrying
    each word's last bit into the next, and its last word's carry out decides such rows."""
    rest = ",".join(["9.25"] * ((length - 12) // 5)) + end
    row = "1." + "1" * (length - len(rest) - 3) + "," + rest  # its first field's digits make up the length
    assert len(row) == length
    fields = row.split(",")
    expected = [reference(field) for field in fields]
    got = row_values(row)
    if any(value is None for value in expected):
        assert got is None, f"{row!r} accepted as {got}"
    else:
        assert got is not None and bits(got).tolist() == bits(expected).tolist(), f"{row!r}: {got} != {expected}"


GUARDED_PARSE = """
import ctypes, mmap, sys
import numpy as np
from cnnlab.files import _lab_csv as native
native.use_isa(sys.argv[1])
page = mmap.PAGESIZE
region = mmap.mmap(-1, 2 * page)
libc = ctypes.CDLL(None, use_errno=True)
address = ctypes.addressof(ctypes.c_char.from_buffer(region))
assert libc.mprotect(ctypes.c_void_p(address + page), ctypes.c_size_t(page), 0) == 0  # PROT_NONE: reading it faults
data = np.frombuffer(region, np.uint8, count=page)  # the buffer ends where the guard page begins
rng = np.random.default_rng(459)
for slack in range(41):
    for width in (1, 3, 8, 9):
        # The last row of short values (1.5, -0.2): a vector parser loads 16 bytes past a field's point.
        rows = [",".join(map(repr, np.round(rng.uniform(-10, 10, width), digits).tolist())) for digits in (15, 2, 1)]
        text = ("\\n".join(rows) + "\\n").encode()
        start, end = page - slack - len(text), page - slack
        region[start:end] = text
        region[end:page] = b"7" * slack
        out = np.full(3 * width, np.nan)
        assert native.parse_rows(data, start, end, width, out) == -1, (slack, width)
        expected = [float(field) for row in rows for field in row.split(",")]
        assert out.tolist() == expected, (slack, width)
print("ok")
"""


def test_rows_at_the_buffer_s_end_read_nothing_past_it(parser_isa: str) -> None:
    """Rows ending 0 to 40 bytes before the end of the buffer, which a page that faults on any read follows (as a mapped
    file's last page may be): the vector parsers load past a field, never past the buffer (in a child process: a fault
    would end it)."""
    command = [sys.executable, "-c", GUARDED_PARSE, parser_isa]
    result = subprocess.run(command, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", (result.returncode, result.stderr[-2000:])


def test_host_fields_take_every_shape() -> None:
    # More than 19 digits at or near a halfway point, in every shape the grammar allows: HOST, then from_chars.
    shapes = [
        "0.1000000000000000055511151231257827021181583404541015625",  # exactly the double 0.1
        "0.10000000000000000555111512312578270211815834045410156250000001",
        "1.00000000000000011102230246251565404236316680908203125",  # 1 + 2^-53: a tie, to even
        "1.00000000000000011102230246251565404236316680908203125e0",
        "100000000000000011102230246251565404236316680908203125.e-53",
        ".100000000000000011102230246251565404236316680908203125E1",
        "-1.00000000000000011102230246251565404236316680908203124",
        "+1.00000000000000011102230246251565404236316680908203126",
        "9007199254740993000000000000001",  # just above 2^53 + 1, a tie: rounds up
        "9007199254740993000000000000000e-15",  # the tie itself: to even
        "0.000000000000000000000000000000000000000000000000000000000000000000001000000000000000055511151231257827",
    ]
    for text in shapes:
        kind, value = native.parse_field(text.encode())
        assert kind in (OK, HOST) and bits([value]) == bits([float(text)]), text
        assert_row_agrees(text, float(text))
    assert native.parse_field(shapes[2].encode())[0] == HOST


# ---------------------------------------------------------------------------------------------
# Refusals

REFUSED = [
    "",
    " ",
    "\t \t",
    ".",
    "+",
    "-",
    "+.",
    "e5",
    ".e5",
    "1e",
    "1e+",
    "1e-",
    "1.5.2",
    "--1",
    "+-1",
    "-+1",
    "0x10",
    "1_0",
    "1_000.5",
    "1.0_1",
    "1e1_0",
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "+Infinity",
    "-Infinity",
    "infinity",
    "1e400",
    "-1e400",
    "1e99999999999999",
    "1e99999999999999999999999999",
    "1.7976931348623159e308",
    "1,5",
    "abc",
    "1 2",
    "1e 5",
    "1 e5",
    "- 1",
    "1e5e5",
    "1d5",
    "1.5f",
    "١",  # an Arabic-Indic digit float() takes in a str, but never a text byte
    "1\x00",
    "1\r",
    "\x0b1",
    "1\x0c",
    "1\n",
    "1\x7f",
    "1\xff",
]


@pytest.mark.parametrize("text", REFUSED)
def test_refused_spellings(text: str) -> None:
    data = text.encode("utf-8") if not text.endswith("\xff") else text.encode("latin-1")
    assert reference(data) is None
    assert native.parse_field(data) == (BAD, None)
    line = b"0.25," + data + b",-0.5\n"
    for padded in (line, line + AFTER_RANGE):  # the row at the buffer's end, and with bytes a vector parser loads after it
        if b"," in data:
            assert native.parse_rows(padded, 0, len(line), 3, np.empty(3)) == 0  # "1,5" is two fields: 4 in all
            assert native.parse_rows(padded, 0, len(line), 4, np.empty(4)) == -1
        else:
            assert native.parse_rows(padded, 0, len(line), 3, np.empty(6)) == 0  # (space for "1\n" as two lines)


def test_random_short_strings_agree_with_float(rng: np.random.Generator) -> None:
    alphabet = np.array(list("0123456789+-.eE _x"))
    texts = ["".join(alphabet[rng.integers(0, len(alphabet), rng.integers(0, 9))]) for _ in range(40_000)]
    texts += ["".join(alphabet[rng.integers(0, 15, rng.integers(1, 30))]) for _ in range(20_000)]  # digits, signs, '.', 'e', 'E'
    accepted = 0
    for text in texts:
        expected = reference(text)
        kind, value = native.parse_field(text.encode())
        assert_row_agrees(text, expected)
        if expected is None:
            assert kind == BAD, f"{text!r} accepted as {value!r}; float() refuses it (or it is not finite, or has '_')"
        else:
            assert kind in (OK, HOST) and bits([value]) == bits([expected]), f"{text!r}: {value!r} != float() {expected!r}"
            accepted += 1
    assert accepted > 4_000


@settings(max_examples=400, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["{!r}", "{:.17e}", "{:.30e}", "{:.20g}", "{:+.3E}", " {!r}\t"]))
def test_hypothesis_floats_in_any_format(value: float, form: str) -> None:
    text = form.format(value)
    kind, got = native.parse_field(text.encode())
    if reference(text) is None:  # rounded up past the largest double by the format
        assert kind == BAD and math.isinf(float(text))
        return
    assert kind in (OK, HOST) and bits([got]) == bits([float(text)])
    assert bits(parse_column([text], width=1)) == bits([float(text)])
    assert_row_agrees(text, float(text))


@settings(max_examples=1500, deadline=None)
@given(st.text(alphabet="0123456789+-.eE _x\t", max_size=14))
def test_hypothesis_strings_agree_with_float(text: str) -> None:
    expected = reference(text)
    kind, value = native.parse_field(text.encode())
    assert_row_agrees(text, expected)
    if expected is None:
        assert kind == BAD
    else:
        assert kind in (OK, HOST) and bits([value]) == bits([expected])


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=10**60),
    st.integers(min_value=-400, max_value=340),
    st.integers(min_value=0, max_value=30),
)
def test_hypothesis_long_decimals(mantissa: int, exponent: int, leading_zeros: int) -> None:
    digits = "0" * leading_zeros + str(mantissa)
    for text in (f"{digits}e{exponent}", f"{digits[:1]}.{digits[1:]}e{exponent}", f".{digits}E{exponent:+d}"):
        expected = reference(text)
        kind, value = native.parse_field(text.encode())
        assert_row_agrees(text, expected)
        if expected is None:
            assert kind == BAD, text
        else:
            assert kind in (OK, HOST) and bits([value]) == bits([expected]), text


# ---------------------------------------------------------------------------------------------
# Lines: parse_rows and scan_rows against a model in Python


def model_rows(data: bytes, width: int) -> tuple[list[float], int]:
    """(values of the good lines before the first bad one, index of the first bad non-blank line or -1)."""
    values, row = [], 0
    for line in data.split(b"\n")[:-1]:
        if not line.strip(BLANK):
            continue
        line = line.rstrip(b"\r")
        fields = line.split(b",")
        parsed = [reference(f) for f in fields]
        if any(not (b == 9 or 32 <= b <= 126) for b in line) or len(fields) != width or None in parsed:
            return values, row
        values += parsed
        row += 1
    return values, -1


def model_scan(data: bytes, start: int, rows: int, max_line: int) -> tuple[int, int, int]:
    position, found, lines = start, 0, 0
    while found < rows:
        newline = data.find(b"\n", position)
        if newline < 0:
            if len(data) - position > max_line:
                return -1, found, lines
            break
        if newline - position > max_line:
            return -1, found, lines
        found += bool(data[position:newline].strip(BLANK))
        position, lines = newline + 1, lines + 1
    return position, found, lines


def test_layout() -> None:
    def run(data: bytes, width: int = 3, out_len: int | None = None) -> tuple[int, np.ndarray]:
        out = np.full(out_len if out_len is not None else 30, -99.0)
        return native.parse_rows(data, 0, len(data), width, out), out

    assert run(b"1,2,3\r\n\r\n \t\r\x0b\x0c\n4,5,6\r\r\n")[0] == -1  # CRLF, blank lines of every blank byte
    result, out = run(b"\n\n1,2,3\n  \t\n4,5, 6 \n")
    assert result == -1 and out[:6].tolist() == [1, 2, 3, 4, 5, 6]
    assert run(b"1,2,3\n1,2\n")[0] == 1  # too few fields
    assert run(b"1,2,3\n\n1,2,3,4\n")[0] == 1  # too many
    assert run(b"1,2,3,\n")[0] == 0  # a trailing comma is an empty fourth field
    assert run(b"1,,3\n")[0] == 0  # a missing value
    assert run(b"1,2,3\n1,2\r,3\n")[0] == 1  # a '\r' inside a line
    assert run(b"1,2,3\r \n")[0] == 0  # '\r' then a space: the '\r' is not at the end
    assert run(b"1,2,3\n\x001,2,3\n")[0] == 1  # a byte that is not text
    assert run(b"1,2,3\n1,2,3\x1a\n")[0] == 1
    assert run(b"1,2,3\n1,2,\xe93\n")[0] == 1
    assert run(b"1,2,3\n1,2,3\x0b\n")[0] == 1  # \v is blank on a blank line, not text inside one
    assert run(b"1\t,\t2\t,\t3\n")[0] == -1  # tabs are text
    result, out = run(b"1,2,3\n4,5,6\nx\n7,8,9\n")
    assert result == 2 and out[:6].tolist() == [1, 2, 3, 4, 5, 6]  # the lines before the bad one are written
    assert run(b"")[0] == -1
    assert run(b" \n\t\n")[0] == -1
    with pytest.raises(ValueError, match="out holds 5 values"):
        run(b"1,2,3\n4,5,6\n", out_len=5)
    with pytest.raises(ValueError, match="out holds 5 values"):
        run(b"x\n4,5,6\n", out_len=5)  # checked before a bad line's index is returned
    assert run(b"x\n4,5,6\n", out_len=6)[0] == 0
    with pytest.raises(ValueError, match="line end"):
        run(b"1,2,3\n4,5,6")
    with pytest.raises(ValueError):
        native.parse_rows(b"1\n", 0, 3, 1, np.empty(1))
    with pytest.raises(ValueError):
        native.parse_rows(b"1\n", 0, 2, 0, np.empty(1))
    with pytest.raises(TypeError):
        native.parse_rows(b"1\n", 0, 2, 1, np.empty(1, np.float32))
    with pytest.raises((BufferError, TypeError, ValueError)):
        native.parse_rows(b"1\n", 0, 2, 1, np.empty(4)[::2])
    readonly = np.empty(1)
    readonly.flags.writeable = False
    with pytest.raises((BufferError, TypeError, ValueError)):
        native.parse_rows(b"1\n", 0, 2, 1, readonly)
    data = bytearray(b"9\n1,2\n3,4\n")  # offsets into a larger buffer, any buffer type
    out = np.empty(4)
    assert native.parse_rows(memoryview(data), 2, len(data), 2, out) == -1 and out.tolist() == [1, 2, 3, 4]
    assert native.parse_rows(np.frombuffer(bytes(data), np.uint8), 6, 10, 2, out[2:]) == -1


def test_scan_rows() -> None:
    data = b"3\n\n1,2\r\n \t\r\n4,5\n6"
    assert native.scan_rows(data, 0, 10, 100) == (16, 3, 5)  # the unterminated "6" is never taken
    assert native.scan_rows(data, 0, 2, 100) == (8, 2, 3)
    assert native.scan_rows(data, 2, 1, 100) == (8, 1, 2)
    assert native.scan_rows(data, 0, 0, 100) == (0, 0, 0)
    assert native.scan_rows(data, len(data), 5, 100) == (len(data), 0, 0)
    assert native.scan_rows(data + b"\n", 0, 10, 100) == (len(data) + 1, 4, 6)
    assert native.scan_rows(data, 0, 10, 3) == (-1, 1, 2)  # "1,2\r" is 4 bytes: line 2 too long, after 1 row
    assert native.scan_rows(b"12\n12345", 0, 5, 4) == (-1, 1, 1)  # a tail already too long
    assert native.scan_rows(b"12\n1234", 0, 5, 4) == (3, 1, 1)
    assert native.scan_rows(b"1234\n", 0, 5, 4) == (5, 1, 1)
    with pytest.raises(ValueError):
        native.scan_rows(data, len(data) + 1, 1, 100)


LINE_CHOICES = [
    b"1,2,3",
    b"-1.5e3, +.5 ,\t7.",
    b"1,2,3\r",
    b"1,2,3\r\r",
    b"0.1,0.2,0.30000000000000004",
    b"",
    b" ",
    b"\t\r",
    b"\r",
    b"\x0b\x0c",
    b"1,2",
    b"1,2,3,4",
    b"1,2,x",
    b"1,2,3\r ",
    b"1,,3",
    b"1_0,2,3",
    b"1,2,inf",
    b"1,2,1e400",
    b"1,\x002,3",
    b"1,2,3\x80",
    b" 1 , 2 , 3 ",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(LINE_CHOICES), max_size=12), st.integers(0, 8), st.integers(0, 12))
def test_hypothesis_lines_match_the_model(lines: list[bytes], rows: int, max_line: int) -> None:
    data = b"".join(line + b"\n" for line in lines)
    expected_values, expected_bad = model_rows(data, 3)
    non_blank = sum(1 for line in lines if line.strip(BLANK))
    out = np.full(3 * non_blank, np.nan)
    result = native.parse_rows(data, 0, len(data), 3, out)
    assert result == expected_bad
    assert bits(out[: len(expected_values)]).tolist() == bits(expected_values).tolist()
    tail = data + b"1,2"  # an unterminated tail
    assert native.scan_rows(tail, 0, rows, max_line) == model_scan(tail, 0, rows, max_line)
    assert native.scan_rows(tail, 0, rows, 1 << 20) == model_scan(tail, 0, rows, 1 << 20)


POOLS = {threads: native.Pool(threads) for threads in (1, 2, 3)} if native is not None else {}


@settings(max_examples=800, deadline=None)
@given(
    before=st.lists(st.sampled_from(LINE_CHOICES), max_size=3),
    lines=st.lists(st.sampled_from(LINE_CHOICES), max_size=14),
    rows=st.integers(0, 9),
    max_line=st.integers(0, 12),
    tail=st.sampled_from([b"", b"1,2", b"1,2,3"]),
    part_bytes=st.integers(1, 40),
    threads=st.integers(1, 3),
)
def test_hypothesis_a_walking_parse_is_a_scan_then_a_parse(
    before: list[bytes], lines: list[bytes], rows: int, max_line: int, tail: bytes, part_bytes: int, threads: int
) -> None:
    """parse_walk from any line start, its text cut into parts of any size on one to three threads, gives what scan_rows
    then parse_rows give where both succeed (the end, the lines walked, the values, nothing written past the rows), and
    declines (-1) wherever either would not: a bad row, a line too long before the last row, the data ending first."""
    start = len(b"".join(line + b"\n" for line in before))
    data = b"".join(line + b"\n" for line in before + lines) + tail
    out = np.full(3 * rows + 3, np.nan)  # three values past the rows: never written
    end, found, walked = model_scan(data, start, rows, max_line)
    values, bad = model_rows(data[start : max(end, start)], 3)
    good = end >= 0 and found == rows and bad == -1
    result = native.parse_walk(POOLS[threads], data, start, rows, 3, out, 0, 0, False, max_line, part_bytes, True)
    assert result[:2] == ((end, walked) if good else (-1, 0))
    assert np.isnan(out[3 * rows :]).all()
    if good:
        assert bits(out[: 3 * rows]).tolist() == bits(values).tolist()
        parts = np.frombuffer(result[2] or b"", np.int64).reshape(-1, 5)
        assert parts[:, 4].sum() == end - start and (parts[:, 3] >= parts[:, 2]).all()  # the parts parsed: every byte once


@pytest.mark.parametrize("max_line", [4, 1 << 20, sys.maxsize])
@pytest.mark.parametrize("part_bytes", [1, 4, sys.maxsize])
def test_a_walk_reads_nothing_past_its_buffer_whatever_its_limits(max_line: int, part_bytes: int) -> None:
    """A buffer that ends inside a row, with more text after it in memory: the walk declines, its limits as large as
    they come (a window of max_line + 1 bytes overflowed, and memchr read on past the buffer)."""
    memory = bytearray(b"x\n1,2\n3,4" + b"\n5,6\n" * 1000)
    data = memoryview(memory)[:9]
    for pool in POOLS.values():
        assert native.parse_walk(pool, data, 2, 2, 2, np.zeros(4), 0, 0, False, max_line, part_bytes, False)[0] == -1


# The host reads d.ddd... with 8 to 18 digits after the point without a loop where 26 bytes
# follow the number's start on its line; every other shape takes the general reader. A field
# of that shape, or one digit off it, followed by what may follow a number, then a long field
# so that the fast reader is reached.
SHAPED_AFTER = ["", " ", "\t", "e5", "E-3", "e", ".5", "x", "_1", "0"]


@settings(max_examples=600, deadline=None)
@given(
    st.sampled_from(["", "-", "+", " "]),
    st.integers(0, 9),
    st.sampled_from([".", "", "0."]),
    st.text(alphabet="0123456789", min_size=0, max_size=22),
    st.sampled_from(SHAPED_AFTER),
)
def test_hypothesis_the_fixed_shape_reader_matches_the_model(sign: str, lead: int, point: str, digits: str, after: str) -> None:
    field = f"{sign}{lead}{point}{digits}{after}".encode()
    data = field + b",1.2345678901234567890123456789,3\n"
    expected_values, expected_bad = model_rows(data, 3)
    out = np.full(3, np.nan)
    assert native.parse_rows(data, 0, len(data), 3, out) == expected_bad
    assert bits(out[: len(expected_values)]).tolist() == bits(expected_values).tolist()


def test_threads_release_the_gil_and_agree(rng: np.random.Generator) -> None:
    values = rng.uniform(-10, 10, (4000, 100))
    text = "".join(",".join(map(repr, row)) + "\n" for row in values.tolist()).encode()
    half = text.index(b"\n", len(text) // 2) + 1
    rows_first = text[:half].count(b"\n")
    out = np.empty(values.size)
    results = {}

    def work(name: str, start: int, end: int, target: np.ndarray) -> None:
        results[name] = native.parse_rows(text, start, end, 100, target)

    threads = [
        threading.Thread(target=work, args=("a", 0, half, out[: rows_first * 100])),
        threading.Thread(target=work, args=("b", half, len(text), out[rows_first * 100 :])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {"a": -1, "b": -1}
    assert np.array_equal(bits(out), bits(values.reshape(-1)))


@pytest.mark.parametrize("threads", [1, 3])
def test_parse_pieces_is_parse_rows_piece_by_piece_on_a_pool(rng: np.random.Generator, threads: int) -> None:
    """Pieces of whole lines (blank ones and CRLF among them) parsed on the pool's threads land at their first rows;
    the first bad piece in file order is the one named, whatever thread reaches it first."""
    values = rng.uniform(-10, 10, (900, 7))
    ends = ["\r\n", "\n", "\n\n", "\n \t\n"]
    lines = [",".join(map(repr, row)) + ends[i % 4] for i, row in enumerate(values.tolist())]
    cuts = sorted(rng.choice(np.arange(1, 900), 40, replace=False))

    def pieces(lines: list[str]) -> tuple[bytes, np.ndarray]:
        starts = [len("".join(lines[:cut]).encode()) for cut in (0, *cuts, len(lines))]
        return "".join(lines).encode(), np.array([(a, b, row) for a, b, row in zip(starts, starts[1:], (0, *cuts))], np.int64)

    text, bounds = pieces(lines)
    pool = native.Pool(threads)
    out = np.full(values.size, np.nan)
    assert native.parse_pieces(pool, text, bounds, 7, out) == -1
    assert np.array_equal(bits(out), bits(values.reshape(-1)))
    broken = list(lines)
    broken[cuts[10]], broken[cuts[30] + 1] = "x,1,2,3,4,5,6\n", "1,2\n"  # the first lines of pieces 11 and 31 are bad
    assert native.parse_pieces(pool, *pieces(broken), 7, np.empty(values.size)) == 11
    with pytest.raises(ValueError, match="does not end at a line end"):
        native.parse_pieces(pool, text, np.array([(0, 5, 0)], np.int64), 7, out)
    with pytest.raises(ValueError, match="more rows than its space"):
        native.parse_pieces(pool, text, bounds[:1], 7, np.empty(7 * (cuts[0] - 1)))
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        native.parse_pieces(pool, text, bounds, 7, out)


# Text read in parts on several threads is cut from the parts' summaries: the same pieces one thread's walk gives.


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([b"1,2", b"", b" \t", b"3,4\r", b"\r", b"x" * 7]), max_size=60),
    st.integers(0, 40),
    st.integers(1, 9),
    st.lists(st.integers(0, 400), max_size=8),
    st.booleans(),
)
def test_cutting_from_summaries_matches_one_thread(lines: list[bytes], rows: int, every: int, splits: list[int], pooled: bool) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from cnnlab.files import lines as csvlines

    data = np.frombuffer(b"".join(line + b"\n" for line in lines), np.uint8)
    expected = csvlines.cut_rows(data, 0, rows, every)
    bounds = sorted({0, len(data), *(split for split in splits if split < len(data))})
    parts = [csvlines.summarize(data, a, b) for a, b in zip(bounds, bounds[1:])]
    for part in parts:  # the native summary is the pure-Python twin's
        assert part == csvlines._summarize_python(data, part.start, part.end)
    whole = parts[0] if parts else csvlines.summarize(data, 0, 0)
    for part in parts[1:]:
        whole = whole.then(part)
    assert whole == csvlines.summarize(data, 0, len(data))  # combining parts is summarizing them at once
    assert whole.rows == sum(1 for line in lines if line.strip(BLANK))
    assert whole.longest_line == max((len(line) for line in lines), default=0)
    prefixes = csvlines.prefixes_of(0, parts)
    with ThreadPoolExecutor(2) as pool:
        assert csvlines.cut_summarized(data, prefixes, rows, every, pool if pooled else None) == expected
    # The runs: whole lines from 0 to the end of the last whole line, cut where each part's first line begins.
    end = int(np.flatnonzero(data == 10)[-1]) + 1 if lines else 0
    runs = csvlines.runs_of(prefixes, end)
    starts = [0, *(int(i) + 1 for i in np.flatnonzero(data == 10))]  # every line start
    assert [run[0] for run in runs] == sorted({max(s for s in starts if s <= b) for b in bounds[:-1]} - {end} if end else set())
    assert all(a < b for a, b, _ in runs) and [b for _, b, _ in runs] == [run[0] for run in runs[1:]] + ([end] if runs else [])
    for start, _, before in runs:
        assert before == sum(1 for line in bytes(data[:start]).split(b"\n")[:-1] if line.strip(BLANK))


def test_a_summary_says_where_lines_end_and_which_hold_ink() -> None:
    from cnnlab.files import lines as csvlines

    data = np.frombuffer(b" a\n\n \t\nbc,d\n  ", np.uint8)
    assert csvlines.summarize(data, 0, len(data)) == csvlines.Lines(0, 14, 4, True, False, 1, 2, 11, 4)
    assert csvlines.summarize(data, 3, 8) == csvlines.Lines(3, 8, 2, False, True, 0, 3, 6, 2)  # "\n \t\nb": a blank line inside
    assert csvlines.summarize(data, 0, 1) == csvlines.Lines(0, 1, 0, False, False, 0, -1, -1, 0)


def test_read_summarized_fills_the_window_and_summarizes_each_part(tmp_path) -> None:
    from cnnlab.files import lines as csvlines

    text = b"".join(b"%d,%d\n" % (index, index * 7) + (b"\n" if index % 5 == 0 else b"") for index in range(400000))
    path = tmp_path / "rows.csv"
    path.write_bytes(text)
    window = np.zeros(len(text) + 100, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        count, parts = native.read_summarized(fd, window, 3, len(text) + 50, 0, 4)  # asks past the end
    finally:
        os.close(fd)
    assert count == len(text) and window[3 : 3 + count].tobytes() == text
    parts = [csvlines.Lines(*part) for part in parts]
    assert len(parts) > 1 and parts[0].start == 3 and parts[-1].end == 3 + count
    assert [a.end for a in parts[:-1]] == [b.start for b in parts[1:]]
    assert parts == [csvlines.summarize(window, part.start, part.end) for part in parts]
    with pytest.raises(OSError):
        native.read_summarized(-1, window, 0, 10, 0, 2)


@pytest.mark.parametrize("gap", [None, 64])
def test_a_file_read_on_several_threads_and_ahead_gives_the_same_spans(tmp_path, rng: np.random.Generator, monkeypatch, gap) -> None:
    """One thread, no pool: read as asked. Four threads: read in parts, summarized, and read ahead into a third
    window; with a gap of 64 bytes before the bytes read ahead, what a take leaves over never fits there."""
    from concurrent.futures import ThreadPoolExecutor

    from cnnlab.files import text as csvtext

    if gap is not None:
        monkeypatch.setattr(csvtext, "AHEAD_GAP", gap)
    values = rng.uniform(-10, 10, (30000, 10))
    text = "".join(",".join(map(repr, row)) + ("\n\n" if index % 7 == 0 else "\r\n") for index, row in enumerate(values.tolist()))
    path = tmp_path / "rows.csv"
    path.write_bytes(text.encode())
    spans = {}
    for threads in (1, 4):
        with open(path, "rb") as file, ThreadPoolExecutor(threads) as pool:
            source = csvtext.TextSource(path, file, pool=pool if threads > 1 else None, threads=threads)
            source.reserve(len(text) // 8)
            taken = []
            for take in itertools.cycle([4567, 1000, 6000]):  # takes of other sizes than the one read ahead for
                span = source.take(take, 1000)
                if not span.rows:
                    break
                pieces = span.pieces(1000)
                assert [piece.rows for piece in pieces[:-1]] == [1000] * (len(pieces) - 1)
                assert pieces[0].start == span.start and pieces[-1].end == span.end
                taken.append([(piece.rows, piece.line_before, piece.data[piece.start : piece.end].tobytes()) for piece in pieces])
            spans[threads] = taken
            assert source.lines_taken == text.count("\n")
            source.close()
    assert spans[1] == spans[4]
    assert b"".join(piece[2] for pieces in spans[4] for piece in pieces) == text.encode()


# Writing: format_rows is repr(), value by value.


def test_format_rows_is_repr_across_every_exponent(rng: np.random.Generator) -> None:
    values = rng.integers(0, 2**64, (50000, 10), dtype=np.uint64).view(np.float64)  # every exponent, subnormals too
    values[0, :8] = [0.0, -0.0, 1e16, 1e15, 1e-4, 1e-5, 5e-324, 1.7976931348623157e308]
    values[1, :3] = [np.inf, -np.inf, np.nan]
    expected = "".join(",".join(map(repr, row)) + "\n" for row in values.tolist())
    assert native.format_rows(values) == expected


@settings(max_examples=500, deadline=None)
@given(st.lists(st.floats(allow_nan=False), min_size=1, max_size=12))
def test_hypothesis_format_rows_is_repr(row: list[float]) -> None:
    assert native.format_rows(np.array([row])) == ",".join(map(repr, row)) + "\n"


# The blank-line rule: where blank lines may stand among matrices, whichever lines a piece starts at.


@settings(max_examples=500, deadline=None)
@given(
    matrix_rows=st.integers(1, 4),
    matrices=st.integers(1, 4),
    separated=st.booleans(),
    blanks=st.lists(st.lists(st.sampled_from([b"", b" ", b"\r", b" \t\r", b"\x0c"]), max_size=2), min_size=17, max_size=17),
    cuts=st.lists(st.integers(0, 60), max_size=6),
    threads=st.integers(1, 3),
)
def test_hypothesis_blank_line_rule_holds_across_any_pieces(
    matrix_rows: int, matrices: int, separated: bool, blanks: list[list[bytes]], cuts: list[int], threads: int
) -> None:
    """Rows with blank lines before some, cut into pieces at any line starts: parse_pieces refuses the first piece that
    holds a row whose blank lines break the rule (lab_row_placed), as the rule read row by row here says, and the
    Python twin names the same row; a piece that starts just after a blank line looks back across its start."""
    from cnnlab.errors import InputFileError
    from cnnlab.files.lines import Span
    from cnnlab.files.rows import Layout, RowPlace, check_lines

    rows = matrix_rows * matrices
    lines, row_of_line = [], []  # each line, and the row it is (None: blank)
    for row in range(rows + 1):
        for blank in blanks[row]:
            lines.append(blank + b"\n")
            row_of_line.append(None)
        if row < rows:
            lines.append(b"%d,%d\n" % (row, -row))
            row_of_line.append(row)
    bad_rows = [row for row in range(1, rows) if bool(blanks[row]) != (separated and row % matrix_rows == 0)]
    starts = sorted({0, *(cut for cut in cuts if cut < len(lines))})
    offsets = np.cumsum([0, *map(len, lines)]).tolist()
    rows_before = [sum(row is not None for row in row_of_line[:start]) for start in starts]
    pieces = np.array([(offsets[a], offsets[b], before) for a, b, before in zip(starts, [*starts[1:], len(lines)], rows_before)])
    data = b"".join(lines)
    out = np.empty(rows * 2)
    bad_piece = native.parse_pieces(native.Pool(threads), data, pieces.astype(np.int64), 2, out, 0, 0, matrix_rows, separated)
    piece_of_row = {row: index for index, before in enumerate(rows_before) for row in range(before, rows)}
    assert bad_piece == (piece_of_row[bad_rows[0]] if bad_rows else -1)
    for a, before in zip(starts, rows_before):  # walking from each start just after a row (a span's) to the end: declined
        if a and row_of_line[a - 1] is None:  # where a row is bad
            continue
        walked = native.parse_walk(native.Pool(threads), data, offsets[a], rows - before, 2, np.empty(rows * 2), before, matrix_rows,
                                   separated, 1 << 20, 5, False)  # fmt: skip
        assert (walked[0] < 0) == any(row >= before for row in bad_rows)
    layout = Layout(matrix_rows, "matrix", separated=separated)
    for index, (a, b, before) in enumerate(zip(starts, [*starts[1:], len(lines)], rows_before)):
        span = Span(np.frombuffer(data, np.uint8), offsets[a], offsets[b], 0, a)
        if bad_rows and index == piece_of_row[bad_rows[0]]:
            with pytest.raises(InputFileError, match=r"blank line"):
                check_lines("f", span, 2, RowPlace(layout, before, 0))
            break
        check_lines("f", span, 2, RowPlace(layout, before, 0))
    if not bad_rows:
        assert out.tolist() == [value for row in range(rows) for value in (row, -row)]
