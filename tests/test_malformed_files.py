"""A malformed file never gives outputs: valid lab files, mutated as a hostile user would, through every host parser.

For every mutation (a row, a value or a blank line dropped, duplicated or moved; a byte inserted, replaced or the
file cut anywhere; CRLF mixed in; the count changed), each of cpu mode's native parser (every row parser this CPU
runs), its Python twin and `convert` must give exactly what an independent reader of the lab's layout (lab_layout.py,
float() and the layout's rules) gives, or, where that reader refuses the files, exit with status 2, one line on
stderr, and the output path as it was. The GPU parser's half is in test_csv_gpu.py. Seeded; `--long` runs a longer
profile.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from lab_layout import BASES, base_files, expected, mutate, mutations, starts_with_count

from cnnlab.cli import main as cli
from cnnlab.files import csv_reader, lines, rows, text
from cnnlab.files.npy import DTYPE

PREVIOUS = b"previous outputs\n"
IMAGES = 3
# Seeded (derandomized), and not shrunk: an example takes a second, and a failing one is reported as drawn.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate]
PROFILES = {
    "default": settings(max_examples=12, deadline=None, derandomize=True, phases=PHASES, suppress_health_check=list(HealthCheck)),
    "long": settings(max_examples=400, deadline=None, derandomize=True, phases=PHASES, suppress_health_check=list(HealthCheck)),
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str], note: bool = False) -> tuple[int, str]:
    status = cli.main(argv)
    err = capsys.readouterr().err
    if note:  # the Python twin says once a process why it is slow (cnnlab.extensions.note_missing)
        err = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("cnnlab: note: "))
    return status, err


def _check(status: int, err: str, output: Path, want: np.ndarray | None, got: callable) -> None:
    if want is None:
        assert status == 2 and err.startswith("cnnlab: ") and err.count("\n") == 1, err
        assert output.read_bytes() == PREVIOUS, "a refused run left the output path changed"
    else:
        assert status == 0, err
        assert got(output).view(np.uint64).tolist() == want.view(np.uint64).tolist(), "outputs differ from the reference"


def _read_csv(path: Path) -> np.ndarray:
    return np.array([[float(value) for value in line.split(",")] for line in path.read_text().splitlines()])


def _read_npy(path: Path) -> np.ndarray:
    return np.load(path).astype(DTYPE)


def check_every_host_parser(tmp_path: Path, capsys: pytest.CaptureFixture[str], base: str, edits: list, target: str, step: int,
                            threads: int) -> None:  # fmt: skip
    cnn_data, input_data = base_files(base, IMAGES)
    if target == "cnn":
        cnn_data = mutate(cnn_data, edits)
    else:
        input_data = mutate(input_data, edits)
    want = expected(cnn_data, input_data)
    cnn_path, input_path, output = tmp_path / "cnn.csv", tmp_path / "in.csv", tmp_path / "out.csv"
    cnn_path.write_bytes(cnn_data)
    input_path.write_bytes(input_data)
    run = ["cpu", str(cnn_path), str(input_path), str(output), "--threads", str(threads)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(csv_reader, "STEP_IMAGES", step)  # spans of `step` images a thread: many spans, runs and pieces
        patch.setattr(csv_reader, "PARSE_IMAGES", step)
        for isa in lines.native.CPU_ISAS if lines.native is not None else ("",):  # each row parser this CPU runs
            if isa:
                lines.native.use_isa(isa)
            output.write_bytes(PREVIOUS)
            _check(*_run(run, capsys), output, want.outputs, _read_csv)
        if lines.native is not None:
            lines.native.use_isa(lines.native.CPU_ISAS[0])
        for module in (lines, text, csv_reader, rows):
            patch.setattr(module, "native", None)
        output.write_bytes(PREVIOUS)
        _check(*_run(run, capsys, note=True), output, want.outputs, _read_csv)
    if starts_with_count(input_data):  # else convert reads it as an output file: rows of any one width
        converted = tmp_path / "in.npy"
        converted.write_bytes(PREVIOUS)
        _check(*_run(["convert", str(input_path), str(converted)], capsys), converted, want.images, _read_npy)


def _fuzz(profile: str):  # noqa: ANN202
    return PROFILES[profile](
        given(
            base=st.sampled_from(sorted(BASES)),
            edits=mutations,
            target=st.sampled_from(["input", "input", "input", "cnn"]),
            step=st.sampled_from([1, 2, 32]),
            threads=st.sampled_from([1, 2]),
        )(check_every_host_parser)
    )


test_mutated_files_give_the_reference_or_one_line = _fuzz("default")
test_mutated_files_give_the_reference_or_one_line_long = pytest.mark.long(pytest.mark.slow(_fuzz("long")))


@pytest.mark.parametrize("base", sorted(BASES))
def test_the_unmutated_files_give_the_reference(tmp_path: Path, capsys: pytest.CaptureFixture[str], base: str) -> None:
    """The fuzz test's starting points are valid, and each parser agrees with the reference on them: it can tell."""
    assert expected(*base_files(base, IMAGES)).outputs is not None
    check_every_host_parser(tmp_path, capsys, base, [], "input", 1, 2)
