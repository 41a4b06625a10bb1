"""The CUDA backend against the CPU backend, under the lab's comparison rule (needs pycuda and a GPU)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import (
    BAD_INPUTS,
    ROOT,
    TIMING_LINE,
    assert_within_rule,
    cnnlab,
    cpu_outputs,
    input_lines,
    random_cnn,
    read_all_images,
    write_files,
)

from cnnlab.cli import main as cli
from cnnlab.compare import compare_files
from cnnlab.generate import random_values
from cnnlab.network import Cnn, ImageBatch
from cnnlab.resources import resource_dir

pytestmark = pytest.mark.gpu


def context(cnn: Cnn, batch_size: int | None = None, **config: int):
    from cnnlab.cuda.context import CudaContext
    from cnnlab.cuda.ladder import LaunchConfig

    return CudaContext(cnn, batch_size, LaunchConfig(**config))


@pytest.mark.parametrize("count, batch", [(1, 1), (7, 7), (23, 7), (4096, 4096), (5000, 4096)])
def test_batches_match_cpu(rng: np.random.Generator, count: int, batch: int) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, count, 100, 100)
    want = cpu_outputs(cnn, images)
    with context(cnn, batch) as gpu:
        got = np.concatenate([gpu.compute(ImageBatch(images[s : s + batch])).values for s in range(0, count, batch)])
    assert_within_rule(got, want, cnn, images)


@pytest.mark.parametrize(
    "config",
    [
        {"segments": 1},
        {"segments": 3, "dense_threads": 32},
        {"segments": 8, "dense_blocks": 1},
        {"segments": 40, "dense_blocks": 2, "dense_threads": 1024},
        {"segments": 2000, "dense_threads": 64},
        {"conv_blocks": 1, "dense_blocks": 1, "streams": 1},
        {"conv_blocks": 3, "chunk_images": 5, "streams": 2},
        {"chunk_images": 1, "streams": 4},
        {"chunk_images": 1000, "streams": 1, "segments": 7},
    ],
)
def test_launch_configurations_never_change_results(rng: np.random.Generator, config: dict[str, int]) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 333, 100, 100)
    with context(cnn, 333, **config) as gpu:
        assert_within_rule(gpu.compute(ImageBatch(images)).values, cpu_outputs(cnn, images), cnn, images)


def test_every_output_is_rewritten_each_call(rng: np.random.Generator) -> None:
    """A second batch through the same buffers must not keep anything of the first."""
    cnn = random_cnn(rng)
    first, second = random_values(rng, 2, 300, 100, 100)
    with context(cnn, 300, chunk_images=64) as gpu:
        gpu.compute(ImageBatch(first))
        assert_within_rule(gpu.compute(ImageBatch(second[:250])).values, cpu_outputs(cnn, second[:250]), cnn, second[:250])


def test_page_locked_pageable_and_resident_agree_exactly(rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 1000, 100, 100)
    with context(cnn, 1000, chunk_images=300) as gpu:
        pinned = gpu.allocate_images(1000)
        pinned[:] = images
        from_pinned = gpu.compute(ImageBatch(pinned)).values
        from_pageable = gpu.compute(ImageBatch(images)).values
        resident = gpu.compute_resident(gpu.upload(ImageBatch(images))).values
    assert (from_pinned == from_pageable).all() and (resident == from_pinned).all()
    assert_within_rule(from_pinned, cpu_outputs(cnn, images), cnn, images)


@pytest.mark.parametrize(
    "config",
    [{"streams": 2}, {"streams": 3, "chunk_images": 7}, {"streams": 4, "chunk_images": 1}, {"streams": 3, "chunk_images": 64}],
)
def test_chunks_and_streams_never_change_a_bit(rng: np.random.Generator, config: dict[str, int]) -> None:
    """Against the one-stream, one-chunk path: every output the same double."""
    cnn = random_cnn(rng)
    images = random_values(rng, 300, 100, 100)
    with context(cnn, 300, streams=1, chunk_images=300) as gpu:
        want = gpu.compute(ImageBatch(images)).values
    with context(cnn, 300, **config) as gpu:
        got = gpu.compute(ImageBatch(images)).values
    assert (got.view(np.int64) == want.view(np.int64)).all()


def test_too_large_a_chunk_falls_back_to_one_that_fits(rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 50, 100, 100)
    with context(cnn, 50, chunk_images=50_000_000, streams=1) as gpu:  # ~5.6 TB of device buffers
        assert gpu.chunk_images < 50_000_000
        assert_within_rule(gpu.compute(ImageBatch(images)).values, cpu_outputs(cnn, images), cnn, images)


def test_a_stream_refills_its_staging_buffer_only_after_the_copy_out_of_it(rng: np.random.Generator) -> None:
    """Pageable images go through a page-locked staging buffer per chunk stream: each copy out of it is followed by the
    event the next refill waits for. (Once never recorded, for a slice's base is the buffer, not its allocation:
    a chunk stream taking a second chunk in one call could overwrite images still on their way, now and then.)"""
    cnn = random_cnn(rng)
    images = random_values(rng, 64, 100, 100)
    with context(cnn, 64, streams=2, chunk_images=8) as gpu:
        recorded: list[object] = []
        for chunk_stream in gpu._streams.streams:
            event = chunk_stream._staging_free
            chunk_stream._staging_free = SimpleNamespace(
                record=lambda stream, event=event: (recorded.append(stream), event.record(stream)), synchronize=event.synchronize
            )
        got = gpu.compute(ImageBatch(images)).values
    assert len(recorded) == 8
    assert_within_rule(got, cpu_outputs(cnn, images), cnn, images)


def test_a_cap_on_device_bytes_gives_smaller_chunks_and_the_same_results(rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 700, 100, 100)
    with context(cnn, 700, streams=3) as gpu:
        want = gpu.compute(ImageBatch(images)).values
    with context(cnn, 700, streams=3, stream_bytes_cap=3 * 40 * 113_000) as gpu:  # space for 3 chunk streams of 40 images
        assert 20 <= gpu.chunk_images <= 40
        got = gpu.compute(ImageBatch(images)).values
    assert (got == want).all()
    assert_within_rule(got, cpu_outputs(cnn, images), cnn, images)


def test_little_free_device_memory_gives_smaller_chunks_and_correct_results(rng: np.random.Generator) -> None:
    """A ballast allocation leaves ~150 MB free: the default chunk streams (3 of 683 images, ~230 MB) must shrink to fit."""
    import pycuda.driver as driver

    cnn = random_cnn(rng)
    images = random_values(rng, 2000, 100, 100)
    context_ = driver.Device(0).retain_primary_context()
    context_.push()
    try:
        free, _ = driver.mem_get_info()
        ballast = driver.mem_alloc(free - 150 * 2**20)
        try:
            with context(cnn) as gpu:
                assert gpu.chunk_images < 683
                got = gpu.compute(ImageBatch(images)).values
        finally:
            ballast.free()
    finally:
        context_.pop()
    assert_within_rule(got, cpu_outputs(cnn, images), cnn, images)


def test_a_failed_launch_is_one_line_and_leaves_no_output(tmp_path: Path, rng: np.random.Generator) -> None:
    """The real CLI, with a kernel that faults (its images at an address nobody allocated) on the second batch (30 images
    of text are two of the device's smallest text buffers)."""
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 30, 100, 100))
    (tmp_path / "out.csv").write_text("old\n")
    script = (
        "import sys\n"
        "from cnnlab.cli import main as cli\n"
        "from cnnlab.cuda.context import CudaContext, DeviceImages\n"
        "compute = CudaContext.compute\n"
        "calls = []\n"
        "def faulty(self, batch, check_finite=False):\n"
        "    calls.append(1)\n"
        "    return compute(self, batch, check_finite) if len(calls) == 1 else self.compute_resident(DeviceImages(1 << 62, len(batch)))\n"
        "CudaContext.compute = faulty\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    import subprocess
    import sys


    command = [sys.executable, "-c", script, "cuda", cnn_path, input_path, tmp_path / "out.csv", "--batch", "4"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("cnnlab: CUDA error while computing: ") and result.stderr.count("\n") == 1, result.stderr
    assert "illegal" in result.stderr and result.stdout == ""
    assert (tmp_path / "out.csv").read_text() == "old\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cnn.csv", "in.csv", "out.csv"]


@pytest.mark.parametrize("batch", [None, "1", "3"])
def test_cli_cuda_on_default_data_passes_compare(tmp_path: Path, batch: str | None) -> None:
    result = cnnlab("cuda", *(["--batch", batch] if batch else []), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert TIMING_LINE.match(result.stdout) and result.stderr == ""
    comparison = compare_files(resource_dir("data") / "out.csv", tmp_path / "out" / "out_cuda.csv")
    assert comparison.matches, comparison.problem


def test_cli_cuda_on_generated_files(tmp_path: Path, rng: np.random.Generator) -> None:
    cnn = random_cnn(rng)
    images = random_values(rng, 101, 100, 100)
    cnn_path, input_path = write_files(tmp_path, cnn, images)
    for mode in ("cpu", "cuda"):
        result = cnnlab(mode, cnn_path, input_path, tmp_path / f"{mode}.csv", "--batch", "16")
        assert result.returncode == 0, result.stderr
    comparison = compare_files(tmp_path / "cpu.csv", tmp_path / "cuda.csv")
    assert comparison.matches and comparison.values == 1010, comparison.problem


def test_bench_gpu_rows_are_sane(tmp_path: Path) -> None:
    import json

    sizes = ["--images", "4096", "--cpu-images", "64", "--lab-images", "20", "--repeats", "2"]
    rows = ["--rows", "cpu,lab,pinned,resident,bounds"]  # the ladder's rows: tests/test_ladder.py
    result = cnnlab("bench", *sizes, *rows, "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    rows = {figure["row"] for figure in report["figures"]}
    assert {"cpu", "lab", "pinned", "resident", "bounds"} <= rows
    by_key = {figure["key"]: figure for figure in report["figures"] if figure["key"]}
    for figure in report["figures"]:
        assert figure["images_per_second"] > 0
        if figure["bound"]:
            assert figure["of_bound"] == pytest.approx(figure["images_per_second"] / by_key[figure["bound"]]["images_per_second"])
    print(result.stdout)


# CSV parsed on the device: the same images, bit for bit, as the host's parser (float()) reads.


def _near_halfway(value: float, rng: np.random.Generator) -> str:
    """A 25-digit decimal within 1e-24 (relative) of the midpoint between `value` and the next double up."""
    from decimal import Decimal, localcontext

    with localcontext() as exact:
        exact.prec = 60
        midpoint = (Decimal(value) + Decimal(float(np.nextafter(value, np.inf)))) / 2
        nudge = midpoint * Decimal(int(rng.integers(-9, 10))) * Decimal("1e-24")
        exact.prec = 25
        return str(+(midpoint + nudge))


def _spelled(rng: np.random.Generator, images: np.ndarray, crlf: bool) -> str:
    """The lab's input file for `images`, with every spelling float() takes, near-halfway decimals
    the device must hand to the host, a fully near-halfway image (too many for the device's list),
    one to three blank lines (of spaces and tabs, some) between images and, if asked, CRLF line ends."""
    spellings = [lambda v: repr(v), lambda v: f"{v:+.6E}", lambda v: f"  {v!r}\t", lambda v: f"{v:.0f}.", lambda v: _near_halfway(v, rng)]
    lines = [str(len(images))]
    for index, image in enumerate(images):
        for row in image:
            if index == 1:
                fields = [_near_halfway(v, rng) for v in row.tolist()]
            else:
                fields = [spellings[int(k)](v) for k, v in zip(rng.integers(0, len(spellings), len(row)), row.tolist())]
            lines.append(",".join(fields))
        lines += ["", " \t", ""][: int(rng.integers(1, 4))]
    return ("\r\n" if crlf else "\n").join(lines) + "\n"


@pytest.mark.parametrize("crlf", [False, True])
def test_csv_parsed_on_the_device_gives_the_host_parsers_images_bit_for_bit(tmp_path: Path, rng: np.random.Generator, crlf: bool) -> None:
    from cnnlab.cuda.context import CudaContext
    from cnnlab.cuda.ladder import LaunchConfig
    from cnnlab.run import run_network

    cnn = random_cnn(rng)
    images = random_values(rng, 23, 100, 100)
    images[3, 0, :4] = [5e-324, 2.2250738585072011e-308, 1e300, -0.0]  # the largest doubles are test_csv_gpu's: here they overflow
    input_path = tmp_path / "in.csv"
    input_path.write_bytes(_spelled(rng, images, crlf).encode())
    host_images = read_all_images(input_path)
    outputs = {}
    for parse_csv in (True, False):
        with CudaContext(cnn, 7, LaunchConfig(chunk_images=3), parse_csv=parse_csv) as gpu:
            stats = run_network(gpu, input_path, tmp_path / f"{parse_csv}.npy")
        assert stats.images == 23
        outputs[parse_csv] = np.load(tmp_path / f"{parse_csv}.npy")
    with context(cnn, 23) as gpu:
        from_host_images = gpu.compute(ImageBatch(host_images)).values
    assert outputs[True].view(np.uint64).tolist() == outputs[False].view(np.uint64).tolist()
    assert outputs[True].view(np.uint64).tolist() == from_host_images.view(np.uint64).tolist()
    assert_within_rule(outputs[True], cpu_outputs(cnn, host_images), cnn, host_images)


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_every_malformed_input_gets_the_host_parsers_message_from_the_device_parser(
    tmp_path: Path, rng: np.random.Generator, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    spoil = BAD_INPUTS[case][0]
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 2, 100, 100))
    input_path.write_text("\n".join(spoil(input_lines(random_values(rng, 2, 100, 100)))))
    messages = []
    for mode in (["cpu"], ["cuda"], ["cuda", "--host-parse"]):
        assert cli.main([*mode, str(cnn_path), str(input_path), str(tmp_path / "out.csv")]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        messages.append(captured.err)
    assert messages[0] == messages[1] == messages[2]
    assert not (tmp_path / "out.csv").exists()


def test_a_compute_that_fails_midway_returns_with_no_copy_still_running(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compute() that fails with chunks queued (here the hand-over of the first chunk's partials) returns only once
    every chunk stream is idle: no copy still reads the caller's page-locked images when the caller frees them (a
    failure on one GPU of several ends the run, and the first GPU frees the buffers every GPU copies from)."""
    from cnnlab.cuda.chunk_streams import HostOutputs

    def failing(self: HostOutputs, chunk_stream: object, index: int, count: int) -> None:
        raise RuntimeError("the hand-over failed")

    cnn = random_cnn(rng)
    with context(cnn, 2048) as gpu:
        images = gpu.allocate_images(2048)
        images[:] = random_values(rng, 2048, 100, 100)
        monkeypatch.setattr(HostOutputs, "take", failing)
        with pytest.raises(RuntimeError, match="hand-over"):
            gpu.compute(ImageBatch(images))
        streams = gpu._open_streams.streams
        assert len(streams) > 1 and all(each.stream.is_done() for each in streams)
        monkeypatch.undo()
        assert_within_rule(gpu.compute(ImageBatch(images)).values, cpu_outputs(cnn, images), cnn, images)
        gpu.free_images(images)
