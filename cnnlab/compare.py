"""The lab's comparison of two output files: same shape, every pair of values close.

"Close" is math.isclose: |a - b| <= max(rel_tol * max(|a|, |b|), abs_tol), with the lab's
defaults rel_tol = 1e-9 and abs_tol = 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from cnnlab.files.formats import read_outputs

DEFAULT_REL_TOL = 1e-9
DEFAULT_ABS_TOL = 0.0


def lab_close(a: np.ndarray, b: np.ndarray, rel_tol: float = DEFAULT_REL_TOL, abs_tol: float = DEFAULT_ABS_TOL) -> np.ndarray:
    """Value by value, whether a and b are close by the lab's rule (a NaN never is)."""
    return (a == b) | (np.abs(a - b) <= np.maximum(rel_tol * np.maximum(np.abs(a), np.abs(b)), abs_tol))


def rule_verdict(got: np.ndarray, want: np.ndarray) -> str:
    """`within rule` where every value passes the lab's comparison, else how many do not."""
    close = lab_close(got, want)
    return "within rule" if close.all() else f"{int((~close).sum())} of {close.size} values outside the rule"


@dataclass(frozen=True)
class Comparison:
    """What compare found: `problem` is None when the files match."""

    lines: int
    values: int
    differing: int
    problem: str | None
    max_abs_diff: float
    max_rel_diff: float

    @property
    def matches(self) -> bool:
        return self.problem is None


def compare_files(
    path_a: str | os.PathLike,
    path_b: str | os.PathLike,
    rel_tol: float = DEFAULT_REL_TOL,
    abs_tol: float = DEFAULT_ABS_TOL,
) -> Comparison:
    """Compare two output files value by value under the math.isclose rule."""
    rows_a, rows_b = read_outputs(path_a), read_outputs(path_b)
    if len(rows_a) != len(rows_b):
        problem = f"{path_a} has {len(rows_a)} lines, {path_b} has {len(rows_b)}"
        return Comparison(min(len(rows_a), len(rows_b)), 0, 0, problem, 0.0, 0.0)
    for line, (row_a, row_b) in enumerate(zip(rows_a, rows_b), start=1):
        if len(row_a) != len(row_b):
            problem = f"line {line}: {path_a} has {len(row_a)} values, {path_b} has {len(row_b)}"
            return Comparison(len(rows_a), 0, 0, problem, 0.0, 0.0)
    a = np.array([value for row in rows_a for value in row])
    b = np.array([value for row in rows_b for value in row])
    # Line and position of every flat index, so the first discrepancy can be named.
    line_of = np.repeat(np.arange(1, len(rows_a) + 1), [len(row) for row in rows_a])
    line_starts = np.concatenate([[0], np.cumsum([len(row) for row in rows_a])])
    diff = np.abs(a - b)
    larger = np.maximum(np.abs(a), np.abs(b))
    close = lab_close(a, b, rel_tol, abs_tol)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0.0, 0.0, diff / larger)
    max_abs = float(diff.max(initial=0.0))
    max_rel = float(rel.max(initial=0.0))
    bad = np.flatnonzero(~close)
    discrepancy = None
    if bad.size:
        first = int(bad[0])
        line = int(line_of[first])
        position = first - int(line_starts[line - 1]) + 1
        discrepancy = (
            f"line {line} value {position}: {float(a[first])!r} vs {float(b[first])!r}; "
            f"{bad.size} of {a.size} values differ (largest difference {max_abs:.3g} absolute, "
            f"{max_rel:.3g} relative)"
        )
    return Comparison(len(rows_a), int(a.size), int(bad.size), discrepancy, max_abs, max_rel)
