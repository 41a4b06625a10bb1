"""Shared fixtures: fresh random data every run (the seed is in pytest's header), and file makers."""

from __future__ import annotations

import os
import secrets
import zlib
from pathlib import Path

import numpy as np
import pytest

from cnnlab.files import write_input_file
from cnnlab.generate import random_values, write_cnn_file
from cnnlab.network import Cnn

SESSION_SEED = int(os.environ.get("CNNLAB_TEST_SEED", secrets.randbits(32)))


def pytest_report_header(config: pytest.Config) -> str:
    return f"cnnlab random seed: {SESSION_SEED} (set CNNLAB_TEST_SEED to repeat)"


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator fresh for each run and distinct for each test."""
    return np.random.default_rng([SESSION_SEED, zlib.crc32(request.node.nodeid.encode())])


def random_cnn(rng: np.random.Generator) -> Cnn:
    return Cnn(random_values(rng, 10, 5, 5), random_values(rng, 10, 4000))


def write_files(tmp_path: Path, cnn: Cnn, images: np.ndarray) -> tuple[Path, Path]:
    """Write `cnn` and `images` in the lab's layout; return (cnn file, input file)."""
    cnn_path, input_path = tmp_path / "cnn.csv", tmp_path / "in.csv"
    write_cnn_file(cnn_path, cnn.filters, cnn.weights)
    write_input_file(input_path, len(images), images)
    return cnn_path, input_path
