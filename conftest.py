"""The docstrings' examples (pytest --doctest-modules) read the checkout's data/, as a user in the checkout would.

In an unpacked sdist (PKG-INFO beside this file) with cnnlab installed from it, the tests are of that install: the tree's
cnnlab/ holds no compiled modules. This folder then leaves Python's path (pytest puts it first, for this file), the tests
run in a folder of their own (`python -m cnnlab` puts its working folder first on the path), and the docstrings'
examples, which pytest would import from the tree, are left to a checkout's run.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent


def _tests_the_installed_package() -> bool:
    """Whether this is an unpacked sdist and a cnnlab other than its tree's is installed: if so, this folder leaves the path."""
    if not (ROOT / "PKG-INFO").is_file():
        return False
    path = sys.path[:]
    sys.path[:] = [entry for entry in path if Path(entry or os.curdir).resolve() != ROOT]
    spec = importlib.util.find_spec("cnnlab")
    if spec is None or spec.origin is None or Path(spec.origin).resolve().is_relative_to(ROOT):
        sys.path[:] = path
        return False
    return True


INSTALLED = _tests_the_installed_package()


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """The tree's cnnlab/ (the docstrings' examples) is not collected where the tests are of the install."""
    return True if INSTALLED and collection_path.is_relative_to(ROOT / "cnnlab") else None


@pytest.fixture(autouse=True, scope="session")
def _away_from_the_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Where the tests are of the install, a working folder without cnnlab/ in it, for the subprocesses they start."""
    if not INSTALLED:
        yield
        return
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(before)


@pytest.fixture(autouse=True)
def _examples_run_in_the_checkout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if isinstance(request.node, pytest.DoctestItem):
        monkeypatch.chdir(ROOT)
