#!/usr/bin/env bash
# The sdist on one Python, as a user meets it: installed with the test extra into a fresh venv outside the checkout,
# cpu mode run on the default data (its outputs data/out.csv's, byte for byte), then the tests in the unpacked sdist,
# which test that install (conftest.py). `make test-pythons` runs it for each Python setup.cfg admits.
#
#     tools/test-sdist.sh VERSION SDIST [PYTEST_ARGS...]     e.g.  tools/test-sdist.sh 3.10 dist/cnnlab-0.1.0.tar.gz -m 'not slow'
#
# VERSION's interpreter is python3.X where that runs, else pyenv's (pyenv prefix 3.X).
set -euo pipefail
version=$1
sdist=$(realpath "$2")
shift 2
python=python$version
"$python" -c '' 2>/dev/null || python="$(pyenv prefix "$version")/bin/python"
work=$(mktemp -d "${TMPDIR:-/tmp}/cnnlab-python$version.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS
echo "test-sdist: Python $version ($python): installing $(basename "$sdist")[test] into a venv in $work"
"$python" -m venv "$work/venv"
if ! "$work/venv/bin/python" -m pip install --disable-pip-version-check "$sdist[test]" >"$work/install.log" 2>&1; then
    tail -n 20 "$work/install.log" >&2
    echo "test-sdist: Python $version: the install failed" >&2
    exit 1
fi
tar -xzf "$sdist" -C "$work"
tree=$(echo "$work"/cnnlab-*/)
mkdir "$work/run"
(cd "$work/run" && "$work/venv/bin/cnnlab" cpu && cmp out/out.csv "$tree/data/out.csv")
cd "$tree"
"$work/venv/bin/python" -m pytest -q -n auto -p no:cacheprovider "$@"
echo "test-sdist: Python $version: installed, cpu mode gave data/out.csv, tests passed ($((SECONDS - start)) s)"
