"""kernel/csv.cu against Python's float(), bit for bit (needs nvcc, pycuda and a CUDA GPU).

Each test cuts text into blocks at line ends, as cnnlab's host does, counts their non-blank lines
on the host and parses them on the device with cnnlab.cuda.csv_parser. Every value must end up as float()
of its text: converted on the device, or listed as HOST and patched in from the host, or (when a
block lists too many) converted by the host; every bad line must be reported at its row, the
same row labcsv's line checker names.
"""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ROOT, gpu_lock

from cnnlab.errors import InputFileError
from cnnlab.files.rows import check_line

pytestmark = pytest.mark.gpu(builds_kernels=True)

MAX_BLOCK_BYTES = 1 << 23  # the largest block a test hands over
MAX_ROWS = 1 << 15
POISON = 0x7FF4DEAD  # every 32-bit word of the images before a run: a value no kernel writes
HOST_NAN = 0x7FF8000000000000  # what the device leaves in a HOST field until the patch


# ---------------------------------------------------------------------------------------------
# The host's side, as cnnlab's reader does it


def non_blank_lines(text: bytes) -> list[bytes]:
    """The block's non-blank lines, trailing '\\r's removed (labcsv.LineSource's rules)."""
    return [line.rstrip(b"\r") for line in text.split(b"\n") if line.strip()]


def expected_rows(text: bytes) -> np.ndarray:
    """float() of every value of a valid block, (rows, 100)."""
    return np.array([[float(field) for field in line.split(b",")] for line in non_blank_lines(text)], dtype=np.float64).reshape(-1, 100)


def first_bad_row(text: bytes) -> int | None:
    """The row labcsv's line checker refuses first, or None."""
    for row, line in enumerate(non_blank_lines(text)):
        try:
            check_line("block", row + 1, line, 100)
        except InputFileError:
            return row
    return None


def cut_every(text: bytes, approx_bytes: int) -> list[bytes]:
    """Blocks of about `approx_bytes`, each cut just after a '\\n' (the last one may end without)."""
    blocks, start = [], 0
    while start < len(text):
        end = text.find(b"\n", start + approx_bytes)
        end = len(text) if end < 0 else end + 1
        blocks.append(text[start:end])
        start = end
    return blocks


def cut_at(text: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:])]


@dataclass
class Run:
    blocks: list[bytes]
    rows: list[int]  # the host's count of each block
    results: list[Any]  # csv_parser.BlockResult per block
    before: np.ndarray  # the images after the kernels, before any patch (rows, 100)
    after: np.ndarray  # after the HOST patches, and the host's conversion of blocks it had to take over

    def first_rows(self) -> list[int]:
        return np.cumsum([0, *self.rows[:-1]]).tolist()


class Gpu:
    """The module and one parse's buffers; run() parses blocks as the host pipeline would."""

    def __init__(self, driver: Any, module: Any) -> None:
        from cnnlab.cuda.csv_parser import CsvParser, scratch_bytes

        self.driver = driver
        self.scratch = driver.mem_alloc(scratch_bytes(MAX_BLOCK_BYTES, MAX_ROWS))
        self.parser = CsvParser(module, self.scratch, MAX_BLOCK_BYTES, MAX_ROWS)
        self.stream = driver.Stream()

    def run(self, blocks: list[bytes], rows: list[int] | None = None, layout: Any = None) -> Run:
        """The blocks parsed in turn (each the file's next rows); with `layout` (files/rows.Layout), its blank-line rule."""
        from cnnlab.cuda.csv_parser import STATUS_DTYPE, host_values, read_status

        driver = self.driver
        rows = [len(non_blank_lines(block)) for block in blocks] if rows is None else rows
        offsets = np.cumsum([0] + [-(-len(block) // 16) * 16 for block in blocks]).tolist()
        text = np.zeros(max(offsets[-1], 16), np.uint8)
        for block, offset in zip(blocks, offsets):
            text[offset : offset + len(block)] = np.frombuffer(block, np.uint8)
        total_rows = sum(rows)
        device_text = driver.mem_alloc(text.nbytes)
        images = driver.mem_alloc(max(total_rows, 1) * 800)
        statuses = driver.mem_alloc(len(blocks) * STATUS_DTYPE.itemsize)
        host_status = driver.pagelocked_empty(len(blocks), STATUS_DTYPE)
        try:
            driver.memcpy_htod(device_text, text)
            driver.memset_d32(images, POISON, max(total_rows, 1) * 200)
            status_at = [int(statuses) + i * STATUS_DTYPE.itemsize for i in range(len(blocks))]
            first_rows = np.cumsum([0, *rows[:-1]]).tolist()
            for block, offset, count, first, status in zip(blocks, offsets, rows, first_rows, status_at):
                self.parser.parse(self.stream, int(device_text) + offset, len(block), images, first, count, status, layout, first)
            driver.memcpy_dtoh_async(host_status, statuses, self.stream)
            self.stream.synchronize()
            results = [read_status(host_status[i : i + 1]) for i in range(len(blocks))]
            before = np.empty((total_rows, 100))
            if total_rows:
                driver.memcpy_dtoh(before, images)
            for block, result, first, status in zip(blocks, results, first_rows, status_at):
                if result.ok and len(result.host_fields):
                    self.parser.patch(self.stream, images, first, status, host_values(block, result))
            self.stream.synchronize()
            after = np.empty((total_rows, 100))
            if total_rows:
                driver.memcpy_dtoh(after, images)
        finally:
            device_text.free()
            images.free()
            statuses.free()
            host_status.base.free()
        for block, result, first, count in zip(blocks, results, first_rows, rows):
            if result.bad_row is None and result.whole_block_on_host:  # the host converts the block itself
                after[first : first + count] = expected_rows(block)
        return Run(blocks, rows, results, before, after)

    def free(self) -> None:
        self.scratch.free()


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory):
    import pycuda.driver as driver

    device = driver.Device(0)
    major, minor = device.compute_capability()
    fatbin: Path = tmp_path_factory.mktemp("csv_gpu") / "csv.fatbin"
    command = ["nvcc", "-fatbin", f"-arch=sm_{major}{minor}", "-std=c++17", "-O3", f"-I{ROOT / 'kernel'}", "-o", str(fatbin)]
    build = subprocess.run([*command, str(ROOT / "kernel" / "csv.cu")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    context = gpu = None
    try:
        with gpu_lock(tmp_path_factory):  # the context and the parse's memory taken while no other test uses the GPU
            context = device.retain_primary_context()
            context.push()
            gpu = Gpu(driver, driver.module_from_file(str(fatbin)))
        yield gpu
    finally:
        if gpu is not None:
            gpu.free()
        if context is not None:
            context.pop()
            context.detach()


# ---------------------------------------------------------------------------------------------
# Checks


def assert_bit_exact(got: np.ndarray, want: np.ndarray, what: str = "values") -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    differ = np.argwhere(got.view(np.uint64) != want.view(np.uint64))
    if len(differ):
        row, field = differ[0]
        raise AssertionError(
            f"{len(differ)} {what} differ from float(), first at row {row} field {field}: "
            f"got {got[row, field]!r} ({got.view(np.uint64)[row, field]:#018x}), float() gives {want[row, field]!r}"
        )


def host_mask(run: Run) -> np.ndarray:
    """Where the device listed HOST fields (rows of the whole run)."""
    mask = np.zeros(run.before.shape, bool)
    for result, first in zip(run.results, run.first_rows()):
        mask[first + result.host_fields["row"], result.host_fields["field"]] = True
    return mask


def assert_run_exact(run: Run) -> None:
    """Every block good; every value float() of its text, on the device (unless listed) and after the patches."""
    for index, (result, count) in enumerate(zip(run.results, run.rows)):
        assert result.bad_row is None, f"block {index}: row {result.bad_row} reported bad"
        assert result.lines == count
    want = np.concatenate([expected_rows(block) for block in run.blocks]) if run.blocks else np.empty((0, 100))
    assert_bit_exact(run.after, want)
    listed = host_mask(run)
    taken_over = np.zeros(len(want), bool)
    for result, first, count in zip(run.results, run.first_rows(), run.rows):
        taken_over[first : first + count] = result.whole_block_on_host
    device = ~listed & ~taken_over[:, None]
    assert_bit_exact(np.where(device, run.before, 0.0), np.where(device, want, 0.0), "values converted on the device")
    assert (run.before[listed].view(np.uint64) == HOST_NAN).all(), "a HOST field was written before its patch"
    for block, result in zip(run.blocks, run.results):  # each listed field names its own text
        lines = non_blank_lines(block)
        for row, field, offset, length in result.host_fields.tolist():
            assert block[offset : offset + length] == lines[row].split(b",")[field]


# ---------------------------------------------------------------------------------------------
# Data


def random_doubles(rng: np.random.Generator, count: int) -> np.ndarray:
    """Half uniform in [-10, 10] (the generator's values), half random bit patterns: every exponent, subnormals too."""
    bits = rng.integers(0, 2**64, size=count, dtype=np.uint64)
    bits[(bits >> np.uint64(52)) & np.uint64(0x7FF) == 0x7FF] ^= np.uint64(1 << 62)  # no inf or nan
    values = bits.view(np.float64).copy()
    uniform = rng.random(count) < 0.5
    values[uniform] = rng.uniform(-10, 10, uniform.sum())
    return values


def spell(value: float, how: int) -> str:
    text = repr(value)
    if how == 1:
        return f"{value:.17e}"
    if how == 2:
        return text if text.startswith("-") else "+" + text
    if how == 3:
        return " \t" + text + "  "
    if how == 4:
        return f"{value:.16g}"
    if how == 5:
        return text.upper()
    if how == 6:
        return f"{value:.25e}"
    return text


def lines_of(fields: list[str], line_ends: list[str]) -> str:
    return "".join(",".join(fields[i : i + 100]) + end for i, end in zip(range(0, len(fields), 100), line_ends))


def random_line(rng: np.random.Generator) -> list[bytes]:
    return [repr(v).encode() for v in rng.uniform(-10, 10, 100).tolist()]


BLANKS = [b"", b" ", b"\t", b"  \t ", b"\r", b" \r\r", b"\x0b", b"\x0c", b" \t\x0b\x0c\r"]


def text_with_blanks(rng: np.random.Generator, lines: list[bytes], final_newline: bool = True) -> bytes:
    """`lines` with random blank lines between them, LF or CRLF ends, spaces after some."""
    parts = []
    for line in lines:
        for _ in range(int(rng.integers(0, 3)) if rng.random() < 0.4 else 0):
            parts.append(BLANKS[int(rng.integers(len(BLANKS)))] + (b"\r\n" if rng.random() < 0.5 else b"\n"))
        if rng.random() < 0.05:
            parts.append(b"\n" * int(rng.integers(1, 40)))
        parts.append(line + [b"\n", b"\r\n", b"\r\r\n", b" \t\n", b" \r\n"][int(rng.integers(5))])
    text = b"".join(parts)
    return text if final_newline else text.rstrip(b"\n")


def near_halfway(rng: np.random.Generator) -> str:
    """A decimal of 17 to 45 digits within a few units of the 40th (or its last) digit of a point halfway between two doubles."""
    kind = int(rng.integers(3))
    if kind == 0:
        x = abs(float(random_doubles(rng, 1)[0]))
    elif kind == 1:
        x = float(rng.uniform(0, 10))
    else:  # an integer: its halfway point has few digits, sometimes written out exactly
        x = float(int(rng.integers(2**52, 2**53)) * 2 ** int(rng.integers(1, 97)))
    y = float(np.nextafter(x, np.inf))
    if x == 0.0 or not np.isfinite(y):
        return "1.5"
    with localcontext() as context:
        context.prec = 1500
        half = (Decimal(x) + Decimal(y)) / 2
    _, digit_tuple, exponent = half.as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    exponent += len("".join(map(str, digit_tuple))) - len(digits)
    if kind == 2 and len(digits) <= 45 and rng.random() < 0.5:  # exactly halfway
        mantissa, scale = digits, exponent
    else:
        wanted = int(rng.integers(17, 46))
        place = min(wanted, 40)
        head = int((digits + "0" * place)[:place]) + int(rng.integers(-3, 4))
        mantissa = str(head) + "".join(map(str, rng.integers(0, 10, wanted - place).tolist()))
        scale = exponent + len(digits) - place - (wanted - place)
    return f"{mantissa[0]}.{mantissa[1:]}e{scale + len(mantissa) - 1}"


# ---------------------------------------------------------------------------------------------
# Tests


def test_two_million_random_doubles_bit_exact(gpu: Gpu, rng: np.random.Generator) -> None:
    count = 2_048_000
    values = random_doubles(rng, count)
    how = rng.choice(7, size=count, p=[0.45, 0.2, 0.1, 0.1, 0.1, 0.0495, 0.0005])
    fields = [spell(v, h) for v, h in zip(values.tolist(), how.tolist())]
    lines = count // 100
    ends = [("\r\n" if rng.random() < 0.1 else "\n") + ("\n" if i % 100 == 99 else "") for i in range(lines)]
    text = lines_of(fields, ends).encode()
    run = gpu.run(cut_every(text, 4 << 20))
    assert_run_exact(run)
    listed = sum(result.host_fields.size for result in run.results)
    assert not any(result.whole_block_on_host for result in run.results)
    assert listed < count * 0.001, f"{listed} of {count} values needed the host"
    print(f"{count} values in {len(run.blocks)} blocks, {len(text)} bytes: {listed} converted on the host")


EXTREMES = [
    "4.9406564584124654e-324", "2.2250738585072011e-308", "1.7976931348623157e308", "-0.0", "0", "0.0", "-0", "00",
    "5e-324", "-5e-324", "2.4703282292062328e-324", "2.4703282292062327e-324", "1e-400", "-1e-400",
    "2.2250738585072014e-308", "2.2250738585072009e-308", "1.7976931348623158e308", "-1.7976931348623157e308",
    "1.", ".5", "+.5", "-.5e1", "1E5", "1e+5", "1E+0005", "1.e5", "-0.e-0", "+0", "1e-0", "000001.5000",
    "1e0000000000000000000001", "0e99999999999999999", "0.000000000000000000000000000000000000001e39",
    "9007199254740993", "9007199254740992.5", "0.1", "123456789012345678901234567890e-30", "1" * 30,
    " 1.5", "1.5\t", "\t -2.5e-3 \t", "3.14159265358979323846264338327950288419716939937510",
]


def test_extremes_and_every_spelling_float_takes(gpu: Gpu, rng: np.random.Generator) -> None:
    fields = [EXTREMES[i % len(EXTREMES)] for i in range(100 * len(EXTREMES))]
    rng.shuffle(fields)
    text = lines_of(fields, ["\n"] * len(EXTREMES)).encode()
    assert_run_exact(gpu.run([text]))
    assert_run_exact(gpu.run(cut_every(text, 1)))


def test_near_halfway_decimals_go_to_the_host(gpu: Gpu, rng: np.random.Generator) -> None:
    """Fields near the halfway point between two doubles: the device lists them, the host's float() is patched in."""
    blocks, hard_long = [], []
    for _ in range(40):  # 60 lines of 3 hard fields each: 180 listed at most, under the 256 slots
        lines = []
        for _ in range(60):
            line = random_line(rng)
            for position in rng.choice(100, 3, replace=False).tolist():
                line[position] = near_halfway(rng).encode()
                hard_long.append(sum(c.isdigit() for c in line[position].split(b"e")[0].decode()) > 19)
            lines.append(b",".join(line))
        blocks.append(text_with_blanks(rng, lines))
    overflowing = text_with_blanks(rng, [b",".join(near_halfway(rng).encode() for _ in range(100)) for _ in range(10)])
    run = gpu.run([*blocks, overflowing])
    assert_run_exact(run)
    listed = sum(result.host_fields.size for result in run.results[:-1])
    assert listed >= 0.9 * sum(hard_long), f"only {listed} of {sum(hard_long)} near-halfway fields of over 19 digits listed"
    assert not any(result.whole_block_on_host for result in run.results[:-1])
    assert run.results[-1].whole_block_on_host
    print(f"{len(hard_long)} near-halfway fields ({sum(hard_long)} of over 19 digits): {listed} listed for the host")


def test_blank_lines_crlf_and_blocks_cut_anywhere(gpu: Gpu, rng: np.random.Generator) -> None:
    lines = [b",".join(random_line(rng)) for _ in range(30)]
    lines[3] = b",".join([b"0"] * 100)  # a line of 200 bytes: several lines in one 8 KB tile
    lines[4] = b",".join([b" -0 "] * 100)
    for final_newline in (True, False):
        text = (b"\n \t\n" if final_newline else b"") + text_with_blanks(rng, lines, final_newline)
        ends = [i + 1 for i, byte in enumerate(text) if byte == ord("\n")]
        cut_sets = [[], ends, *[rng.choice(ends, int(rng.integers(1, len(ends))), replace=False).tolist() for _ in range(40)]]
        for cuts in cut_sets:
            run = gpu.run(cut_at(text, cuts))
            assert_run_exact(run)
            assert sum(run.rows) == len(lines)


def _with_value_38(word: bytes, fields: list[bytes]) -> list[bytes]:
    return [*fields[:37], word, *fields[38:]]


MALFORMED = {
    "99 values": lambda f: f[:99],
    "101 values": lambda f: [*f, b"1.0"],
    "a trailing comma": lambda f: [*f[:99], f[99] + b","],
    "a leading comma": lambda f: [b"", *f[1:]],
    "an empty value": lambda f: [*f[:50], b"", *f[51:]],
    "a value of spaces": lambda f: [*f[:50], b" \t ", *f[51:]],
    **{
        repr(word): functools.partial(_with_value_38, word)
        for word in [b"nan", b"NaN", b"inf", b"-inf", b"infinity", b"1e400", b"-1e400", b"1.797693134862315808e308",
                     b"1_0", b"1e1_0", b"0x10", b"1.2.3", b"--1", b"1e", b"e5", b".", b"+", b"-", b"1 2", b"1e+",
                     b"1.5\x00", b"\x7f1", b"2\x80", b"\xff", b"1.5\r", b"\r1.5", b"1\x0b", b"\x0c2", b"\x1f"]
    },
    "a '\\r' between values": lambda f: [*f[:10], b"\r" + f[10], *f[11:]],
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_every_malformed_line_reported_at_its_row(gpu: Gpu, rng: np.random.Generator, kind: str) -> None:
    lines = [random_line(rng) for _ in range(12)]
    bad = int(rng.integers(len(lines)))
    lines[bad] = MALFORMED[kind](lines[bad])
    text = text_with_blanks(rng, [b",".join(line) for line in lines])
    assert first_bad_row(text) == bad, "the test's own line is not refused by labcsv at its row"
    result = gpu.run([text]).results[0]
    assert result.bad_row == bad and result.lines == len(lines)


def test_the_smallest_bad_row_wins_and_counts_must_agree(gpu: Gpu, rng: np.random.Generator) -> None:
    lines = [random_line(rng) for _ in range(40)]
    lines[31], lines[7], lines[23] = lines[31][:5], [b"nan"] * 100, [b"\x00"] * 100
    text = text_with_blanks(rng, [b",".join(line) for line in lines])
    assert gpu.run([text]).results[0].bad_row == 7
    good = text_with_blanks(rng, [b",".join(random_line(rng)) for _ in range(9)])
    results = gpu.run([good, good, good], rows=[9, 10, 8]).results
    assert [r.bad_row for r in results] == [None, 9, 8] and [r.lines for r in results] == [9, 9, 9]
    results = gpu.run([b"", b" \n\r\n\n", b"\t"], rows=[0, 0, 0]).results
    assert all(r.ok and r.lines == 0 and not r.host_fields.size for r in results)


def test_random_damage_reported_where_labcsv_reports_it(gpu: Gpu, rng: np.random.Generator) -> None:
    """Bytes inserted, deleted or replaced at random: the device's bad row is always labcsv's."""
    alphabet = list(b",, \t\r\n\x0b_e.-+09n\x00\x80")
    blocks = []
    for _ in range(400):
        text = bytearray(text_with_blanks(rng, [b",".join(random_line(rng)) for _ in range(6)], rng.random() < 0.5))
        for _ in range(int(rng.integers(1, 3))):
            at = int(rng.integers(len(text)))
            operation = int(rng.integers(3))
            if operation == 0:
                text.insert(at, alphabet[int(rng.integers(len(alphabet)))])
            elif operation == 1:
                del text[at]
            else:
                text[at] = alphabet[int(rng.integers(len(alphabet)))]
        blocks.append(bytes(text))
    run = gpu.run(blocks)
    good = []
    for index, (block, result) in enumerate(zip(blocks, run.results)):
        assert result.bad_row == first_bad_row(block), f"block {index}: {block!r}"
        if result.bad_row is None:
            good.append(index)
    first_rows = run.first_rows()
    for index in good:
        rows = slice(first_rows[index], first_rows[index] + run.rows[index])
        if not run.results[index].whole_block_on_host:
            assert_bit_exact(run.after[rows], expected_rows(blocks[index]))


# ---------------------------------------------------------------------------------------------
# The blank-line rule of the lab's images, and whole files mutated as a hostile user would


@pytest.mark.parametrize("separated", [False, True])
def test_blank_lines_out_of_place_are_reported_at_their_row(gpu: Gpu, rng: np.random.Generator, separated: bool) -> None:
    """Blocks of whole matrices (of 4 rows here), each starting just after a row: the first row whose blank lines
    break lab_row_placed is the block's bad row, as the host's rule says, wherever the blank lines are."""
    from cnnlab.files.rows import Layout

    layout = Layout(4, "matrix", separated=separated)
    for _ in range(40):
        blocks, want = [], []
        for index in range(3):
            blanks = [bool(rng.random() < 0.5) if rng.random() < 0.3 else (separated and row % 4 == 0) for row in range(12)]
            blanks[0] = blanks[0] and index > 0  # the file's first row follows the count line
            rows = [b",".join(random_line(rng)) for _ in range(12)]
            blocks.append(b"".join((b" \r\n" if blank else b"") + line + b"\n" for blank, line in zip(blanks, rows)))
            first = index * 12
            wrong = [row for row in range(12) if first + row and blanks[row] != (separated and row % 4 == 0)]
            want.append(wrong[0] if wrong else None)
        run = gpu.run(blocks, layout=layout)
        assert [result.bad_row for result in run.results] == want


@pytest.fixture(scope="module")
def mutated_files_context(tmp_path_factory: pytest.TempPathFactory):
    """cuda mode's backend for the fuzz test's CNN: batches of 2 images, a chunk (and so a block of text) of 1."""
    from lab_layout import base_files, reference_cnn

    from cnnlab.cuda.context import CudaContext
    from cnnlab.cuda.ladder import LaunchConfig
    from cnnlab.network import Cnn

    filters, weights = reference_cnn(base_files("lab", 1)[0])
    with gpu_lock(tmp_path_factory):  # its memory taken while no other test uses the GPU
        backend = CudaContext(Cnn(filters, weights), 2, LaunchConfig(chunk_images=1), parse_csv=True)
    with backend:
        yield backend


def _gpu_fuzz(examples: int):  # noqa: ANN202
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from lab_layout import BASES, mutations

    @settings(max_examples=examples, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.reuse, Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(base=st.sampled_from(sorted(BASES)), edits=mutations)
    def test(mutated_files_context: Any, tmp_path: Path, base: str, edits: list) -> None:
        """The GPU parser's half of test_malformed_files.py: each mutated input file through cuda mode's CSV path gives
        outputs within the lab's rule of the independent reference's, or an InputFileError with the output untouched."""
        from helpers import assert_lab_close
        from lab_layout import base_files, expected, mutate

        from cnnlab.run import run_network

        cnn_data, input_data = base_files(base, 5)
        input_data = mutate(input_data, edits)
        want = expected(cnn_data, input_data).outputs
        (tmp_path / "in.csv").write_bytes(input_data)
        output = tmp_path / "out.npy"
        output.write_bytes(b"previous")
        if want is None:
            with pytest.raises(InputFileError):
                run_network(mutated_files_context, tmp_path / "in.csv", output)
            assert output.read_bytes() == b"previous"
        else:
            run_network(mutated_files_context, tmp_path / "in.csv", output)
            assert_lab_close(np.load(output), want)

    return test


test_mutated_files_through_the_gpu_parser = _gpu_fuzz(30)
test_mutated_files_through_the_gpu_parser_long = pytest.mark.long(pytest.mark.slow(_gpu_fuzz(400)))
