"""The docstrings' examples (pytest --doctest-modules) read the checkout's data/, as a user in the checkout would."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _examples_run_in_the_checkout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if isinstance(request.node, pytest.DoctestItem):
        monkeypatch.chdir(Path(__file__).resolve().parent)
