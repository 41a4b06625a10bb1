"""The CSV reader's exactness, the .npy formats, `cnnlab convert`, and the reader thread of a run."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import assert_one_line_error, cnnlab, input_lines, random_cnn, read_all_images, write_files

from cnnlab.cpu.backend import CpuBackend
from cnnlab.errors import InputFileError
from cnnlab.files import csv_reader as csv_files
from cnnlab.files import mapped_text, npy, rows
from cnnlab.files.convert import convert
from cnnlab.files.formats import open_images, read_outputs
from cnnlab.files.text import HostMemory, window_size
from cnnlab.generate import random_values
from cnnlab.network import ImageBatch, OutputBatch
from cnnlab.run import run_network


def awkward_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Doubles of every magnitude, subnormals and the extremes included."""
    values = rng.uniform(-1, 1, shape) * 10.0 ** rng.integers(-330, 308, shape)
    flat = values.reshape(-1)
    flat[:6] = [5e-324, -2.2250738585072009e-308, 1.7976931348623157e308, -0.0, 0.1, 1 / 3]
    return values


def spellings(value: float, rng: np.random.Generator) -> str:
    """One of several texts of `value` that float() reads back exactly."""
    signed = repr(value) if repr(value).startswith("-") else f"+{value!r}"
    return str(rng.choice([repr(value), f"{value:.17g}", f"{value:.25e}", f"{value:.17E}", signed]))


def test_csv_values_are_the_doubles_float_gives(tmp_path: Path, rng: np.random.Generator) -> None:
    # 17 significant digits, exponents of every size, subnormals, '+' signs, spaces: float() of the text.
    texts = [[[spellings(v, rng) for v in row] for row in image] for image in awkward_values(rng, (3, 100, 100)).tolist()]
    texts[1][7][3] = " 4.9406564584124654e-324 "
    texts[2][0][0] = "0.1000000000000000055511151231257827021181583404541015625"
    path = tmp_path / "in.csv"
    path.write_text("3\n" + "".join("\n".join(",".join(row) for row in image) + "\n\n" for image in texts))
    want = np.array([[[float(text) for text in row] for row in image] for image in texts])
    got = read_all_images(path, batch=2)
    assert (got.view(np.int64) == want.view(np.int64)).all()


def test_values_the_fast_parser_declines_still_convert_exactly(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The value-by-value path (taken where the fast one declines a block) gives the same doubles."""
    images = awkward_values(rng, (2, 100, 100))
    _, path = write_files(tmp_path, random_cnn(rng), images)
    declining = SimpleNamespace(  # "row 0 of every piece is not plainly valid"
        Pool=lambda threads: SimpleNamespace(close=lambda: None), parse_pieces=lambda *args: 0, parse_rows=lambda *args: 0
    )
    monkeypatch.setattr(csv_files, "native", declining)
    monkeypatch.setattr(rows, "native", declining)
    assert (read_all_images(path, threads=2).view(np.int64) == images.view(np.int64)).all()


@pytest.mark.parametrize("batch", [1, 2, 3, 5])
def test_spans_taken_ahead_give_the_images_read_in_turn(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """Told what the next call asks, a reader of text read into windows (a file not mapped: a pipe's, say; a mapped one
    is walked) takes its span on a thread of its own: the same images as without."""
    images = awkward_values(rng, (7, 100, 100))
    _, path = write_files(tmp_path, random_cnn(rng), images)
    takers: list[str] = []
    monkeypatch.setattr(mapped_text, "MappedFile", None)
    source = csv_files.TextSource
    take = source.take
    monkeypatch.setattr(source, "take", lambda *args: takers.append(threading.current_thread().name) or take(*args))
    for ahead in (True, False):
        assert (read_all_images(path, batch, ahead, threads=2).view(np.int64) == images.view(np.int64)).all()
    calls = -(-7 // batch)
    ahead_takers = takers[: len(takers) - calls - 2]  # without: a take a call, after the count's and before finish's
    assert sum(name.startswith("cnnlab-take") for name in ahead_takers) == calls - 1
    assert not any(name.startswith("cnnlab-take") for name in takers[len(ahead_takers) :])


WALKS = pytest.mark.skipif(
    mapped_text.MappedFile is None or csv_files.native is None, reason="no native parser or no mapped files: nothing walks"
)


@WALKS
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("batch", [1, 2, 3])
@pytest.mark.parametrize("ending", [b"\n\n", b"\n", b""])
def test_a_walk_reads_what_takes_read(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, threads: int, batch: int, ending: bytes
) -> None:
    """Each step of a mapped file after the one that shows the layout is parsed by a walk, with no take first (its parts
    small here: many of them, cut anywhere in a line): the same images as takes give, the file's end with a line end or
    without (where the walk declines the last step, and a take reads it)."""
    images = awkward_values(rng, (7, 100, 100))
    _, path = write_files(tmp_path, random_cnn(rng), images)
    path.write_bytes(path.read_bytes().rstrip(b"\n") + ending)
    monkeypatch.setattr(csv_files, "WALK_PART_BYTES", 5001)
    walks: list[int] = []
    parse_walk = csv_files.native.parse_walk
    monkeypatch.setattr(csv_files.native, "parse_walk", lambda *args: walks.append(parse_walk(*args)[0]) or parse_walk(*args))
    assert (read_all_images(path, batch, threads=threads).view(np.int64) == images.view(np.int64)).all()
    assert len(walks) == -(-7 // batch) - (2 if batch == 1 else 1)  # the steps before image 2's are taken
    assert walks[-1] < 0 if not ending else min(walks) > 0  # a last row with no line end: the walk declines it


@WALKS
@pytest.mark.parametrize(("fault", "after"), [(b"x", 0), (b",5", 0), (b"\n", 0), (b"\n\n", 0), (b"\n" + b"1" * (1 << 20), 1)])
def test_a_walk_names_a_bad_line_as_takes_do(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, fault: bytes, after: int
) -> None:
    """A bad line in a walked step (a bad value, a field too many, a row split in two, with a blank line between, or
    followed by a line too long, which a take refuses first) is named as takes name it."""
    _, path = write_files(tmp_path, random_cnn(rng), random_values(rng, 7, 100, 100))
    lines = path.read_bytes().split(b"\n")
    number = 2 + 5 * 101 + 40  # image 6's row 41: a walked step's
    lines[number - 1] = lines[number - 1][:30] + fault + lines[number - 1][30:]
    path.write_bytes(b"\n".join(lines))
    messages = []
    for walk in (csv_files.CsvImageReader._walk, lambda *args: False):
        monkeypatch.setattr(csv_files.CsvImageReader, "_walk", walk)
        with pytest.raises(InputFileError) as error:
            read_all_images(path, 2, threads=2)
        messages.append(str(error.value))
    assert messages[0] == messages[1] and f"in.csv:{number + after}: " in messages[0]


def test_npy_input_round_trips_through_convert(tmp_path: Path, rng: np.random.Generator) -> None:
    images = awkward_values(rng, (5, 100, 100))
    _, csv_path = write_files(tmp_path, random_cnn(rng), images)
    convert(csv_path, tmp_path / "in.npy")
    assert (np.load(tmp_path / "in.npy").view(np.int64) == images.view(np.int64)).all()
    convert(tmp_path / "in.npy", tmp_path / "back.csv")
    assert (tmp_path / "back.csv").read_bytes() == csv_path.read_bytes()
    with open_images(tmp_path / "in.npy") as reader:
        buffer = np.empty((2, 100, 100))
        parts = [buffer[: reader.read_into(buffer)].copy() for _ in range(4)]
    assert [len(part) for part in parts] == [2, 2, 1, 0]
    assert (np.concatenate(parts) == images).all()


def test_outputs_convert_both_ways(tmp_path: Path, rng: np.random.Generator) -> None:
    values = awkward_values(rng, (7, 10))
    np.save(tmp_path / "out.npy", values)
    result = cnnlab("convert", tmp_path / "out.npy", tmp_path / "out.csv")
    assert result.returncode == 0, result.stderr
    assert read_outputs(tmp_path / "out.csv") == values.tolist()
    assert cnnlab("convert", tmp_path / "out.csv", tmp_path / "again.npy").returncode == 0
    assert (np.load(tmp_path / "again.npy").view(np.int64) == values.view(np.int64)).all()


@pytest.mark.parametrize(
    "array, message",
    [
        (np.zeros((3, 100, 100), np.float32), "float32"),
        (np.zeros((3, 100, 99)), "shape (3, 100, 99)"),
        (np.zeros((0, 100, 100)), "shape (0, 100, 100)"),
        (np.asfortranarray(np.zeros((2, 100, 100))), "Fortran"),
    ],
)
def test_unsuitable_npy_inputs_are_refused(tmp_path: Path, rng: np.random.Generator, array: np.ndarray, message: str) -> None:
    cnn_path, _ = write_files(tmp_path, random_cnn(rng), random_values(rng, 1, 100, 100))
    np.save(tmp_path / "in.npy", array)
    result = cnnlab("cpu", cnn_path, tmp_path / "in.npy", tmp_path / "out.csv")
    assert message in assert_one_line_error(result) and str(tmp_path / "in.npy") in result.stderr
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("content, message", [(b"not numpy at all", "not a .npy file"), (None, "file ends after")])
def test_broken_npy_files_are_refused(tmp_path: Path, rng: np.random.Generator, content: bytes | None, message: str) -> None:
    path = tmp_path / "in.npy"
    np.save(path, random_values(rng, 3, 100, 100))
    path.write_bytes(content if content is not None else path.read_bytes()[:-8])
    with pytest.raises(InputFileError, match=message):
        open_images(path)


def test_npy_in_and_out_give_the_csv_results(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 9, 100, 100)
    cnn_path, csv_path = write_files(tmp_path, cnn, images)
    np.save(tmp_path / "in.npy", images)
    assert cnnlab("cpu", cnn_path, csv_path, tmp_path / "out.csv").returncode == 0
    result = cnnlab("cpu", cnn_path, tmp_path / "in.npy", tmp_path / "out.npy", "--batch", "4")
    assert result.returncode == 0, result.stderr
    assert np.load(tmp_path / "out.npy").tolist() == read_outputs(tmp_path / "out.csv")


class RecordingBackend(CpuBackend):
    """The CPU backend, remembering the first image of each batch it was handed, and whether it was handed the
    batch in place (a mapped file's read-only images) rather than in a buffer of its own."""

    def __init__(self, *args: object, fail_at: int | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.firsts: list[float] = []
        self.in_place: set[bool] = set()
        self._fail_at = fail_at

    def compute(self, batch: ImageBatch, check_finite: bool = False) -> OutputBatch:
        if len(self.firsts) == self._fail_at:
            raise InputFileError("backend", "stopped on purpose")
        self.firsts.append(float(batch.images[0, 0, 0]))
        self.in_place.add(not batch.images.flags.writeable)
        return super().compute(batch, check_finite)


@pytest.mark.parametrize(
    "name, read_ahead, mapped",
    [("in.csv", True, False), ("in.npy", True, True), ("in.npy", True, False), ("in.npy", False, True), ("in.csv", False, False)],
)
def test_pipeline_keeps_input_order(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, name: str, read_ahead: bool, mapped: bool
) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 23, 100, 100)
    _, csv_path = write_files(tmp_path, cnn, images)
    if name == "in.npy":
        np.save(tmp_path / name, images)
        if mapped and npy.MappedFile is None:
            pytest.skip("the native mapping guard (cnnlab.files._mapped_guard) is not built: .npy files are copied")
        if not mapped:  # as where no compiler built the guard: the images are copied into the backend's buffers
            monkeypatch.setattr(npy, "MappedFile", None)
    with RecordingBackend(cnn, batch_size=3) as backend:
        run_network(backend, tmp_path / name, tmp_path / "out.csv", read_ahead)
        want = CpuBackend.compute(backend, ImageBatch(images)).values
    assert backend.firsts == images[::3, 0, 0].tolist() and backend.in_place == {mapped}
    assert read_outputs(tmp_path / "out.csv") == want.tolist()


@pytest.mark.parametrize("fail_at", ["reader", "backend"])
def test_a_failure_stops_the_run_cleanly(tmp_path: Path, rng: np.random.Generator, fail_at: str) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 40, 100, 100)
    _, path = write_files(tmp_path, cnn, images)
    if fail_at == "reader":  # image 31 of 40 is cut short: the reader fails while batches compute
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(lines[: 1 + 30 * 101 + 50]))
    threads_before = set(threading.enumerate())  # another test's thread may end meanwhile: only new ones count
    with RecordingBackend(cnn, batch_size=4, fail_at=None if fail_at == "reader" else 2) as backend:
        with pytest.raises(InputFileError, match="file ends inside image 31 of the 40" if fail_at == "reader" else "on purpose"):
            run_network(backend, path, tmp_path / "out" / "out.csv")
    assert set(threading.enumerate()) <= threads_before
    assert list((tmp_path / "out").iterdir()) == []


class RecordingMemory(HostMemory):
    """Text windows in ordinary memory, each size asked for recorded."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def allocate_text(self, nbytes: int) -> np.ndarray:
        self.sizes.append(nbytes)
        return super().allocate_text(nbytes)


def test_text_windows_are_reserved_by_the_images_not_by_data_past_them(tmp_path: Path, rng: np.random.Generator) -> None:
    """A file of one image and 20 MB of trailing lines: its bytes per image are no guide to the windows a batch needs."""
    _, input_path = write_files(tmp_path, random_cnn(rng), rng.uniform(-10, 10, (1, 100, 100)))
    with open(input_path, "a") as file:
        file.write("1,2\n" * 5_000_000)
    memory = RecordingMemory()
    with csv_files.CsvImageReader(input_path, threads=2, memory=memory) as reader:
        reader.reserve_text(256)
        assert max(memory.sizes) < 4 << 20  # one image's text at most, with the gap and slack; by the file's bytes per image, ~22 MB
        batch = reader.read_text(256, 256)
        assert batch is not None and len(batch) == 1 and batch.span.rows == 100
        with pytest.raises(InputFileError, match=r"in.csv:103: data after the 1 image the first"):
            reader.finish()


def test_equal_steps_stop_making_windows(tmp_path: Path, rng: np.random.Generator) -> None:
    """Steps of as many images ask for windows a few bytes apart: the windows are made a few times, not at every step
    (each made anew costs the faults of its pages and unmapping the old one's)."""
    _, input_path = write_files(tmp_path, random_cnn(rng), rng.uniform(-10, 10, (120, 100, 100)))
    memory = RecordingMemory()
    with csv_files.CsvImageReader(input_path, threads=2, memory=memory) as reader:
        buffer = np.empty((4, 100, 100))
        made = [len(memory.sizes) for _ in range(30) if reader.read_into(buffer)]
    assert len(made) == 30 and made[10] == made[-2], made  # none made after the first ten steps, but at the file's end


@pytest.mark.parametrize("batch", [1, 4, 9])
def test_rows_that_grow_longer_are_read_exactly_while_reading_ahead(tmp_path: Path, rng: np.random.Generator, batch: int) -> None:
    """Short rows, then rows ~5x longer: the reads begun ahead, sized by the short rows, fall short, and the bytes still
    missing are read after them: no byte is read twice or lost."""
    images = np.round(rng.uniform(-10, 10, (60, 100, 100)))  # "3.0": four bytes a value
    images[20:] = rng.uniform(-10, 10, (40, 100, 100))  # repr's 17 digits: ~19 bytes a value
    _, input_path = write_files(tmp_path, random_cnn(rng), images)
    with csv_files.CsvImageReader(input_path, threads=4) as reader:
        out, buffer = [], np.empty((batch, 100, 100))
        while count := reader.read_into(buffer):
            out.append(buffer[:count].copy())
    assert np.array_equal(np.concatenate(out), images)


def test_window_sizes_are_few_and_hold_what_is_asked() -> None:
    sizes = {window_size(nbytes) for nbytes in range(1 << 20, 1 << 21)}
    assert len(sizes) == 9 and max(sizes) == 1 << 21  # 1 MB, then 1 MB + k/8 MB for k = 1..8
    assert all(nbytes <= window_size(nbytes) <= nbytes + nbytes // 8 + 1 for nbytes in [0, 1, 15, 16, 17, 1000, 10**9 + 7])


@pytest.mark.parametrize("ending", ["\n", "\r\n", ""])
def test_a_file_that_ends_on_a_page_boundary_reads_whole(tmp_path: Path, rng: np.random.Generator, ending: str) -> None:
    """A file whose size is a multiple of the page size, its last row ending at the file's end (with a line end or
    without): a mapped file's last page is followed by none, and the row parser must load nothing past it."""
    images = random_values(rng, 3, 100, 100)
    text = "\n".join(input_lines(images)[:-1]).replace("\n", ending or "\n") + ending
    path = tmp_path / "in.csv"
    path.write_text("0" * (-len(text) % 4096) + text, newline="")  # leading zeros in the count line: N as the lab's reader takes it
    assert path.stat().st_size % 4096 == 0
    assert (read_all_images(path, 2).view(np.int64) == images.view(np.int64)).all()
