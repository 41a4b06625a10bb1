"""`cnnlab bench` on any machine: the cpu row runs, the table and JSON hold sane, consistent numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cnnlab

from cnnlab.benchreport import BenchOptions, BenchReport, Figure, format_table, ratios


def test_bench_cpu_row_table_and_json(tmp_path: Path) -> None:
    result = cnnlab("bench", "--rows", "cpu", "--cpu-images", "32", "--repeats", "2", "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    [figure] = report["figures"]
    assert figure["row"] == "cpu" and figure["images_per_second"] > 0
    assert report["options"]["cpu_images"] == 32 and report["numpy"]
    line = next(line for line in result.stdout.splitlines() if line.startswith("cpu: numpy forward"))
    assert float(line.split()[-3].replace(",", "")) == pytest.approx(figure["images_per_second"], rel=1e-6, abs=1)


def test_bench_reader_rows_are_measured_against_loadtxt(tmp_path: Path) -> None:
    result = cnnlab("bench", "--rows", "reader", "--reader-images", "3", "--repeats", "1", "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    figures = json.loads((tmp_path / "b.json").read_text())["figures"]
    try:
        import polars  # noqa: F401  (the peer row runs where Polars is installed)

        peers = ["loadtxt"]
    except ImportError:
        peers = []
    assert [figure["bound"] for figure in figures] == [None, "loadtxt", "loadtxt", *peers]
    loadtxt = figures[0]["bytes_per_second"]
    for figure in figures[1:]:
        assert figure["of_bound"] == pytest.approx(figure["bytes_per_second"] / loadtxt)
    assert "numpy.loadtxt" in result.stdout and "MB/s" in result.stdout


def test_ratios_come_from_the_figures() -> None:
    report = BenchReport(
        BenchOptions(),
        figures=[
            Figure("lab", "lab", 10.0),
            Figure("pinned", "pinned", 80.0, bound="h2d"),
            Figure("bounds", "bounds", 100.0, key="h2d"),
            Figure("resident", "resident", 500.0, bound="d2d"),
            Figure("bounds", "bounds", 2000.0, key="d2d"),
        ],
        notes=["torch rows not run: no torch"],
    )
    rows = {row["row"] + str(row["key"]): row for row in ratios(report)}
    assert rows["pinnedNone"]["of_bound"] == 0.8 and rows["pinnedNone"]["of_lab"] == 8.0
    assert rows["residentNone"]["of_bound"] == 0.25 and rows["boundsh2d"]["of_bound"] is None
    table = format_table(report)
    assert "80.0%" in table and "25.0%" in table and "note: torch rows not run" in table


def test_bench_refuses_unknown_rows() -> None:
    assert "unknown bench rows gpu" in assert_one_line_error(cnnlab("bench", "--rows", "cpu,gpu"))
