"""Shared fixtures: fresh random data every run (the seed is in pytest's header), and file makers."""

from __future__ import annotations

import os
import secrets
import zlib

import numpy as np
import pytest

SESSION_SEED = int(os.environ.get("CNNLAB_TEST_SEED", secrets.randbits(32)))


def pytest_report_header(config: pytest.Config) -> str:
    return f"cnnlab random seed: {SESSION_SEED} (set CNNLAB_TEST_SEED to repeat)"


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator fresh for each run and distinct for each test."""
    return np.random.default_rng([SESSION_SEED, zlib.crc32(request.node.nodeid.encode())])
