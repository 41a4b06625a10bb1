"""The package as the Python ecosystem meets it: its metadata, the sdist's files, the build without numpy, and the two
commands the checkout's root answers, `python build.py` (the kernels) and `python -m build` (the standard frontend)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

import pytest
from helpers import ROOT

# The tree's files an sdist must carry (its own PKG-INFO and egg-info aside): what the tests import and read, what the
# build compiles, what the README links to or tells a user to run.
TOP_LEVEL = ("LICENSE", "README.md", "BENCHMARKS.md", "Makefile", "MANIFEST.in", "build.py", "conftest.py", "setup.py", "setup.cfg",
             "pyproject.toml")
FOLDERS = {"tests": "*.py", "docs": "*", "native": "*", "kernel": "**/*.[ch]*", "data": "*.csv", "tools": "*", "cnnlab": "**/*.py*"}


def installed_version() -> str:
    """The installed cnnlab's version; a skip where cnnlab runs from a checkout on PYTHONPATH, with no install's metadata."""
    try:
        return metadata.version("cnnlab")
    except metadata.PackageNotFoundError:
        pytest.skip("cnnlab is not installed here (a checkout on PYTHONPATH): the metadata is an install's")


def test_the_metadata_names_the_license_and_the_python_versions_it_is_tested_on() -> None:
    """The MIT license, as an SPDX expression and as LICENSE in the install; a classifier for each Python version the
    Makefile tests on (PYTHONS), the oldest the one Requires-Python admits first; the README as the long description,
    without the links into the repository that lead nowhere on an index."""
    installed_version()
    meta = metadata.metadata("cnnlab")
    # The body, or (importlib_metadata's backport, which another package may put in importlib.metadata's place) the
    # Description field it moves the body into.
    description = meta.get("Description") or meta.get_payload()  # type: ignore[attr-defined]
    assert "## Commands" in description and "docs/gpu.md" in description and not re.search(r"\]\((?![a-z]+://)", description)
    assert meta["License-Expression"] == "MIT"
    assert any(file.name == "LICENSE" for file in metadata.files("cnnlab") or ())
    named = [classifier.rsplit(" :: ", 1)[1] for classifier in meta.get_all("Classifier") or ()
             if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", classifier)]
    tested = re.search(r"^PYTHONS := (.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert tested is not None and named == tested[1].split()
    assert meta["Requires-Python"] == f">={named[0]}"


def test_the_build_needs_no_numpy() -> None:
    """setup.py and the kernels' build step import nothing that needs numpy: numpy is no build requirement."""
    version = installed_version()
    script = (
        "import runpy, sys; sys.modules['numpy'] = None; from cnnlab.cuda.builds import every_build; print(len(every_build())); "
        "import cnnlab.cuda.buildstep; sys.argv = ['setup.py', '--version']; runpy.run_path('setup.py', run_name='__main__')"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[1] == version


def test_build_py_builds_the_kernels_and_python_m_build_reaches_the_frontend() -> None:
    """In the root, `python build.py` is the kernels' build step, and `python -m build`, which finds build.py first,
    is pypa's build (or, where that is not installed, says so)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    step = subprocess.run([sys.executable, "build.py", "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert step.returncode == 0 and step.stdout.startswith("usage: build.py"), step.stderr
    frontend = subprocess.run([sys.executable, "-m", "build", "--version"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert (frontend.returncode, frontend.stdout[:6]) == (0, "build ") or frontend.stderr.endswith(
        "No module named build: `python -m build` needs the build frontend (pip install build)\n"), frontend.stderr


@pytest.mark.slow
def test_the_sdist_carries_the_tests_what_they_read_the_docs_and_the_license(tmp_path: Path) -> None:
    """setup.py's sdist (without nvcc: the sources alone) holds every file of the tree the tests, the build and the
    README need: MANIFEST.in names them."""
    env = dict(os.environ, PATH=os.path.dirname(sys.executable))
    command = [sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path), "sdist", "--dist-dir", str(tmp_path)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (sdist,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        carried = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = {*TOP_LEVEL, *(str(path.relative_to(ROOT)) for folder, pattern in FOLDERS.items() for path in (ROOT / folder).glob(pattern)
                            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".so", ".ptx", ".fatbin"))}
    assert wanted - carried == set()
