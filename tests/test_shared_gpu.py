"""cuda mode on a GPU that others use: another process holds all of its memory but a little (gpu_memory_holder.py), and
a run sizes its buffers to what is free and completes, with nothing on stderr; where even the context cannot be made,
one line names the GPU's free memory. An allocation that fails inside a run is one line, and leaves no output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import helpers
import numpy as np
import pytest
from helpers import assert_one_line_error, assert_within_rule, cnnlab, cpu_outputs, random_cnn, write_files

from cnnlab.files.formats import read_outputs
from cnnlab.generate import random_values

pytestmark = pytest.mark.gpu


class GpuMemoryHolder:
    """Another process holding all of GPU 0's memory but `free_mb` MB while the `with` block runs."""

    def __init__(self, free_mb: int) -> None:
        self._free_mb = free_mb

    def __enter__(self) -> int:
        self._process = subprocess.Popen(
            [sys.executable, str(helpers.ROOT / "tests" / "gpu_memory_holder.py"), str(self._free_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=helpers.SUBPROCESS_ENV,
        )
        assert self._process.stdout is not None
        return int(self._process.stdout.readline())

    def __exit__(self, *exc_info: object) -> None:
        self._process.communicate(timeout=60)


@pytest.mark.parametrize("extension", ["csv", "npy"])
@pytest.mark.parametrize("free_mb", [1000, 700])
def test_a_run_with_little_gpu_memory_free_completes_in_silence(
    tmp_path: Path, rng: np.random.Generator, free_mb: int, extension: str
) -> None:
    """1,000 and 700 MB free (the context takes ~530 MiB of it on an H200): 600 images, the lab's comparison against the
    CPU, stderr empty: no warning from PyCUDA or the driver."""
    cnn, images = random_cnn(rng), random_values(rng, 600, 100, 100)
    cnn_path, input_path = write_files(tmp_path, cnn, images)
    if extension == "npy":
        np.save(tmp_path / "in.npy", images)
        input_path = tmp_path / "in.npy"
    with GpuMemoryHolder(free_mb) as left:
        result = cnnlab("cuda", cnn_path, input_path, tmp_path / f"out.{extension}")
    assert (result.returncode, result.stderr) == (0, ""), (left, result.stderr)
    assert_within_rule(np.array(read_outputs(tmp_path / f"out.{extension}")), cpu_outputs(cnn, images), cnn, images)


def test_the_default_data_takes_device_memory_in_proportion(tmp_path: Path) -> None:
    """The lab's four images: the run's buffers hold at most 64 MiB of device memory at once (--timing-json's figure,
    its driver context's own aside), and the outputs are the lab's."""
    result = cnnlab("cuda", helpers.ROOT / "data" / "cnn.csv", helpers.ROOT / "data" / "in.csv", tmp_path / "out.csv",
                    "--timing-json", tmp_path / "t.json")  # fmt: skip
    assert (result.returncode, result.stderr) == (0, "")
    assert 0 < json.loads((tmp_path / "t.json").read_text())["device_memory_bytes"] <= 64 << 20
    expected = np.array(read_outputs(helpers.ROOT / "data" / "out.csv"))
    assert np.allclose(np.array(read_outputs(tmp_path / "out.csv")), expected, rtol=1e-9, atol=0)


def test_a_gpu_without_memory_for_a_context_is_one_line_naming_its_free_memory(tmp_path: Path, rng: np.random.Generator) -> None:
    """300 MB free: the driver cannot make a context there. One line, naming the GPU's free memory and what a run needs
    besides its context; status 2; no output."""
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 20, 100, 100))
    with GpuMemoryHolder(300):
        result = cnnlab("cuda", cnn_path, input_path, tmp_path / "out.csv")
    message = assert_one_line_error(result)
    assert "cannot start CUDA on GPU 0 (" in message and " MB of its " in message and " free; a run needs " in message, message
    assert not (tmp_path / "out.csv").exists()


FAILING_ALLOCATION = """\
import sys
from cnnlab.cli import main as cli
from cnnlab.cuda import memory
device, calls = memory.Allocator.device, []
def failing(self, nbytes):
    calls.append(nbytes)
    if len(calls) == int(sys.argv[1]):
        raise self._driver.MemoryError("cuMemAlloc failed: out of memory")
    return device(self, nbytes)
memory.Allocator.device = failing
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("extension", ["csv", "npy"])
@pytest.mark.parametrize("failing", [1, 3, 5, 6, 8])
def test_an_allocation_that_fails_inside_a_run_is_one_line_and_leaves_no_output(
    tmp_path: Path, rng: np.random.Generator, failing: int, extension: str
) -> None:
    """The driver refuses the run's first, third, ... device allocation (the weights, the chunk streams' partials, the
    image or text buffers, an activations buffer made as the first batch runs): one line of stderr, status 2, the old
    output file as it was. Allocations past the run's last leave it to complete in silence."""
    cnn, images = random_cnn(rng), random_values(rng, 40, 100, 100)
    cnn_path, input_path = write_files(tmp_path, cnn, images)
    if extension == "npy":
        np.save(tmp_path / "in.npy", images)
        input_path = tmp_path / "in.npy"
    output = tmp_path / f"out.{extension}"
    output.write_text("old\n")
    result = subprocess.run(
        [sys.executable, "-c", FAILING_ALLOCATION, str(failing), "cuda", str(cnn_path), str(input_path), str(output)],
        capture_output=True, text=True, env=helpers.SUBPROCESS_ENV, timeout=120,
    )
    if result.returncode == 0:
        assert failing > 1 and result.stderr == ""  # the first allocation (the weights') is always the run's
        assert_within_rule(np.array(read_outputs(output)), cpu_outputs(cnn, images), cnn, images)
    else:
        assert "out of memory" in assert_one_line_error(result)
        assert output.read_text() == "old\n"
