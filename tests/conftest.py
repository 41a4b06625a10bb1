"""Shared fixtures: fresh random data every run (the seed is in pytest's header), and file makers."""

from __future__ import annotations

import os
import secrets
import zlib
from collections.abc import Iterator
from functools import cache

import numpy as np
import pytest
from helpers import gpu_lock, why_no_gpu

SESSION_SEED = int(os.environ.get("CNNLAB_TEST_SEED", secrets.randbits(32)))


def pytest_report_header(config: pytest.Config) -> str:
    return f"cnnlab random seed: {SESSION_SEED} (set CNNLAB_TEST_SEED to repeat)"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", help="also run the tests marked long (the fuzz tests' long profiles: minutes each)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long profiles are asked for, not run by default: `make test` stays minutes, not a quarter of an hour. A test
    marked gpu (`gpu(builds_kernels=True)`: it runs nvcc too) is skipped with the reason where it cannot run."""
    long = config.getoption("--long")
    skip = pytest.mark.skip(reason="a long profile: run with --long (make test PYTEST_ARGS=--long)")
    why_not_here = cache(why_no_gpu)  # asked once a session for each kind: pycuda's import and the driver's start
    for item in items:
        if "long" in item.keywords and not long:
            item.add_marker(skip)
        marks = list(item.iter_markers("gpu"))  # the test's own and its module's: builds_kernels if any says so
        if marks and (reason := why_not_here(any(mark.kwargs.get("builds_kernels", False) for mark in marks))) is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def one_gpu_user_at_a_time(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests marked gpu or gpu_if_present hold the GPU lock (helpers.gpu_lock) while they run, and give back the backends
    the process keeps as they end."""
    if request.node.get_closest_marker("gpu") is None and request.node.get_closest_marker("gpu_if_present") is None:
        yield
        return
    with gpu_lock(tmp_path_factory):
        try:
            yield
        finally:  # a context the process keeps (forward(device="cuda")) goes with the lock: the next test has the GPU
            from cnnlab.owner import release_backends

            release_backends()


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator fresh for each run and distinct for each test."""
    return np.random.default_rng([SESSION_SEED, zlib.crc32(request.node.nodeid.encode())])
