"""`cnnlab bench` on any machine: the cpu row runs, the table and JSON hold sane, consistent numbers, the plot draws them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import SUBPROCESS_ENV, assert_one_line_error, cnnlab, install_hint, random_cnn

from cnnlab.bench import startup
from cnnlab.bench.gpu import npy_file_rate, npy_in_page_cache
from cnnlab.bench.gpus import at_once
from cnnlab.bench.peers import run_peers
from cnnlab.bench.report import API_IMAGES, BenchOptions, BenchReport, Figure, format_table, ratios
from cnnlab.bench.startup import driver_starts
from cnnlab.constants import IMAGE_BYTES, OUT_LAYER_SIZE
from cnnlab.cpu.backend import CPU_ISAS, ISA_VARIABLE, CpuBackend, Forward
from cnnlab.cuda.gpus import VISIBLE, machine_count
from cnnlab.errors import DeviceError


def test_bench_cpu_rows_against_the_memory_bound_and_the_peers(tmp_path: Path) -> None:
    """The forward, the plain loop and numpy on the same images and threads, each a share of reading the images once;
    the peers' outputs checked against the forward's (PyTorch's too where it is installed)."""
    result = cnnlab("bench", "--rows", "cpu", "--cpu-images", "32", "--repeats", "2", "--threads", "2", "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["options"]["cpu_images"] == 32 and report["options"]["threads"] == 2 and report["numpy"]
    bound, forward, plain, numpy, *torch = report["figures"]
    assert bound["key"] == "memory" and bound["name"].startswith("bound: memory")
    assert forward["name"].startswith("cpu: forward (") and ", 2 threads, " in forward["name"]
    assert plain["name"].startswith("peer: plain C++ loop") and numpy["name"].startswith("peer: numpy forward")
    assert plain["check"] == numpy["check"] == "bit-exact"
    chosen = os.environ.get(ISA_VARIABLE) or CPU_ISAS[0]  # the widest kernels, unless the suite runs under CNNLAB_CPU_ISA
    assert forward["name"].endswith(f", {chosen})") and plain["name"].endswith(f", {chosen})")
    assert all(figure["name"].startswith("peer: torch") and figure["check"] == "within rule" for figure in torch)
    for figure in (forward, plain, numpy, *torch):
        assert figure["bound"] == "memory" and figure["images_per_second"] > 0
        assert figure["of_bound"] == pytest.approx(figure["images_per_second"] / bound["images_per_second"])
    line = next(line for line in result.stdout.splitlines() if line.startswith("cpu: forward"))
    # the images/s, then its ratio ("x% of memory"), x lab and GPU MiB
    assert float(line.split()[-6].replace(",", "")) == pytest.approx(forward["images_per_second"], rel=1e-6, abs=1)
    multiple = forward["images_per_second"] / plain["images_per_second"]
    assert f"cpu: the forward is {multiple:.1f}x plain C++ loop" in result.stdout
    for figure in (forward, plain):  # timed in turns, each with its repeats' range
        assert figure["repeat_range"][0] <= figure["images_per_second"] <= figure["repeat_range"][1]
    assert "cpu: the forward against the plain loop, turn by turn: " in result.stdout
    assert torch or "note: peer torch not run: not installed" in result.stdout


@pytest.mark.skipif(Forward is None, reason="cnnlab.cpu._forward is not built (it needs a C++17 compiler)")
def test_bench_cpu_rows_name_the_kernels_each_ran(tmp_path: Path) -> None:
    """CNNLAB_CPU_ISA=x86-64: the forward's x86-64 kernels against the plain loop on the same instruction set."""
    result = cnnlab("bench", "--rows", "cpu", "--cpu-images", "8", "--repeats", "1", "--threads", "1", "--json", tmp_path / "b.json",
                    env={ISA_VARIABLE: "x86-64"})
    assert result.returncode == 0, result.stderr
    _, forward, plain, *_ = json.loads((tmp_path / "b.json").read_text())["figures"]
    assert forward["name"].endswith(", x86-64)") and plain["name"].endswith(", x86-64)") and plain["check"] == "bit-exact"


def test_bench_reader_rows_are_measured_against_from_chars_and_loadtxt(tmp_path: Path) -> None:
    result = cnnlab("bench", "--rows", "reader", "--reader-images", "3", "--repeats", "1", "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    figures = json.loads((tmp_path / "b.json").read_text())["figures"]
    try:
        import polars  # noqa: F401  (the peer row runs where Polars is installed)

        peers = ["loadtxt"]
    except ImportError:
        peers = []
    assert [figure["bound"] for figure in figures] == [None, "loadtxt", "loadtxt", "from_chars-1", "from_chars", *peers]
    keyed = {figure["key"]: figure for figure in figures if figure["key"]}
    assert list(keyed) == ["loadtxt", "from_chars-1", "from_chars"]
    for figure in figures[1:]:
        assert figure["of_bound"] == pytest.approx(figure["bytes_per_second"] / keyed[figure["bound"]]["bytes_per_second"])
    assert "numpy.loadtxt" in result.stdout and "std::from_chars" in result.stdout and "MB/s" in result.stdout


def test_ratios_come_from_the_figures() -> None:
    report = BenchReport(
        BenchOptions(),
        figures=[
            Figure("lab", "lab", 10.0),
            Figure("pinned", "pinned", 80.0, bound="h2d"),
            Figure("bounds", "bounds", 100.0, key="h2d"),
            Figure("npy", "a run", 70.0, bound="h2d", device_bytes=3 << 19),
            Figure("resident", "resident", 500.0, bound="d2d"),
            Figure("bounds", "bounds", 2000.0, key="d2d"),
        ],
        notes=["torch rows not run: no torch"],
    )
    rows = {row["row"] + str(row["key"]): row for row in ratios(report)}
    assert rows["pinnedNone"]["of_bound"] == 0.8 and rows["pinnedNone"]["of_lab"] == 8.0
    assert rows["residentNone"]["of_bound"] == 0.25 and rows["boundsh2d"]["of_bound"] is None
    table = format_table(report)
    assert "80.0% of h2d" in table and "25.0% of d2d" in table and "note: torch rows not run" in table
    assert next(line for line in table.splitlines() if line.startswith("a run")).endswith(" 1.5")  # its GPU MiB
    assert next(line for line in table.splitlines() if line.startswith("pinned")).endswith(" -")  # not a run


def test_the_table_says_what_each_ratio_is_relative_to() -> None:
    """Readers are multiples of numpy.loadtxt, a peer, not a share of a hardware bound."""
    report = BenchReport(
        BenchOptions(),
        figures=[Figure("reader", "loadtxt", 100.0, key="loadtxt"), Figure("reader", "cnnlab", 1030.0, "loadtxt")],
    )
    table = format_table(report)
    assert "10.3x loadtxt" in table and "%" not in table.splitlines()[2]
    assert "relative to: a share of the bound the row names" in table


def _report_with_every_kind_of_row() -> BenchReport:
    report = BenchReport(
        BenchOptions(),
        figures=[
            Figure("cpu", "cpu", 3000.0),
            Figure("reader", "loadtxt", 600.0, key="loadtxt"),
            Figure("reader", "reader", 2000.0, "loadtxt"),
            Figure("lab", "lab", 9000.0),
            Figure("pinned", "pinned", 6e5, "h2d"),
            Figure("bounds", "bound h2d", 7e5, key="h2d"),
        ],
        device="a GPU",
    )
    report.sweep.pinned = [(1, 5000.0), (16, 6e4), (4096, 5.5e5)]
    return report


@pytest.mark.parametrize("gpu_ran", [False, True])
def test_the_plot_draws_each_row_against_its_bound(gpu_ran: bool) -> None:
    from cnnlab.bench.report import draw_plot

    report = _report_with_every_kind_of_row()
    if not gpu_ran:
        report.figures = report.figures[:3]
        report.sweep.pinned = []
    figure = draw_plot(report)
    bars, *sweep = figure.axes
    widths = [patch.get_width() for patch in bars.patches]
    assert widths == [f.images_per_second for f in report.figures]
    assert bars.get_xscale() == "log"
    [markers] = bars.collections  # one marker at each bounded row's bound
    assert sorted(x for x, _ in markers.get_offsets()) == sorted(600.0 if f.bound == "loadtxt" else 7e5 for f in report.figures if f.bound)
    assert len(sweep) == gpu_ran
    if gpu_ran:
        assert [tuple(xy) for xy in sweep[0].lines[0].get_xydata()] == report.sweep.pinned


@pytest.mark.gpu_if_present
@pytest.mark.parametrize("rows", ["cpu,reader", "kernels", "pinned"])
def test_bench_plot_on_any_machine_writes_a_drawing(tmp_path: Path, rows: str) -> None:
    # Without a GPU, the GPU rows leave only notes: the drawing then says that no rows ran, and why.
    import matplotlib.image

    sizes = ["--cpu-images", "8", "--reader-images", "2", "--repeats", "1", "--images", "256", "--lab-images", "4"]
    result = cnnlab("bench", "--rows", rows, *sizes, "--plot", tmp_path / "bench.png")
    assert result.returncode == 0, result.stderr
    assert "matplotlib" not in result.stderr
    pixels = matplotlib.image.imread(tmp_path / "bench.png")
    assert pixels.shape[0] > 200 and pixels.shape[1] > 600
    assert (pixels[..., :3] < 0.5).mean() > 0.003  # bars or words, not a blank page


@pytest.mark.gpu_if_present
def test_bench_rows_of_a_npy_file_and_of_every_gpu_copying_at_once(tmp_path: Path) -> None:
    """The npy row (a .npy file in the page cache, as the command line runs it) against the host-to-device bound of the
    same run, and the gpus rows (1..N GPUs copying at once); without a GPU, a note saying why they did not run."""
    sizes = ["--images", "2048", "--repeats", "2"]
    result = cnnlab("bench", "--rows", "npy,bounds,gpus", *sizes, "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    figures = json.loads((tmp_path / "b.json").read_text())["figures"]
    rows = {(row["row"], row["key"]): row for row in figures if not row["name"].startswith("peer:")}
    if not rows:
        assert "rows not run" in result.stdout
        return
    npy, bound = rows[("npy", None)], rows[("bounds", "h2d")]
    assert 0.05 < npy["of_bound"] < 1.2
    two_buffers = 2 * 2048 * IMAGE_BYTES  # the run's two image buffers, of the file's 2,048 images each
    assert two_buffers <= npy["device_bytes"] <= 1.5 * two_buffers and f"{npy['device_bytes'] / (1 << 20):,.1f}" in result.stdout
    # KvikIO's read of the same file into device memory, where it installs; else a note saying why not.
    kvikio = [row for row in figures if row["name"].startswith("peer: kvikio")]
    if kvikio:
        assert kvikio[0]["check"] == "the file's bytes" and 0.05 < kvikio[0]["of_bound"] < 1.2
    else:
        assert "peer kvikio not run" in result.stdout
    gpus = [row for (name, _), row in rows.items() if name == "gpus"]
    visible = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU ")
    assert [row["key"] for row in gpus] == [f"h2d-{count}" for count in range(1, visible + 1)]
    assert all(row["images_per_second"] > 0 for row in gpus) and bound["images_per_second"] > 0


@pytest.mark.gpu_if_present
def test_the_gpus_rows_alone_name_the_device(tmp_path: Path) -> None:
    """`--rows gpus` alone (the driver only, no context of cnnlab's) names the GPU its rows are of, as nvidia-smi does."""
    result = cnnlab("bench", "--rows", "gpus", "--repeats", "1", "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    if not report["figures"]:
        assert "gpus rows not run" in result.stdout
        return
    names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout
    assert report["device"] == names.splitlines()[0].strip()


def test_the_npy_row_times_a_run_over_the_file_on_a_backend_of_its_own(rng: np.random.Generator) -> None:
    """With the CPU backend standing in for the GPU: one warm-up and `repeats` runs, each made and closed with its
    backend, the rate being images over the runs' loop seconds."""
    made: list[CpuBackend] = []

    def backend() -> CpuBackend:
        made.append(CpuBackend(random_cnn(rng), threads=1))
        return made[-1]

    images = rng.standard_normal((64, 100, 100))
    with npy_in_page_cache(images) as path:
        assert (np.load(path) == images).all()
        rate, (slowest, fastest), device_bytes = npy_file_rate(backend, path, len(images), repeats=3)
    assert not path.exists()
    assert len(made) == 1 and 0 < slowest <= rate <= fastest < 1e9 and device_bytes == 0  # the CPU holds no device memory


def test_the_kvikio_peer_is_a_note_saying_why_where_it_does_not_install(tmp_path: Path, rng: np.random.Generator) -> None:
    """Where KvikIO (or CuPy) does not import, the npy row's peer is a note naming what is missing, not a failed bench."""
    if importlib.util.find_spec("kvikio") is not None:
        pytest.skip("KvikIO is installed here: the GPU test checks its row")
    with npy_in_page_cache(rng.standard_normal((4, 100, 100))) as path:
        figures, notes = run_peers(("kvikio",), "npy", "h2d", 4, 1, None, file=str(path), flops_per_image=None)
    assert figures == [] and len(notes) == 1 and notes[0].startswith("peer kvikio not run: not installed (No module named")


class StandInGpu:
    """A GPU for at_once: `current()` fails where asked, as a driver call would."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails

    def current(self) -> None:
        if self.fails:
            raise DeviceError("cuCtxSetCurrent failed: CUDA error 201")


@pytest.mark.parametrize("failing", [None, 0, 2])
def test_gpus_copying_at_once_start_together_and_a_failure_is_raised(failing: int | None) -> None:
    gpus = [StandInGpu(index == failing) for index in range(3)]
    if failing is not None:
        with pytest.raises(DeviceError, match="cuCtxSetCurrent"):  # the GPU's own error, not the others' broken start
            at_once(gpus, lambda index, gpu: [float(index)])  # type: ignore[arg-type]
        return
    wall, results = at_once(gpus, lambda index, gpu: [float(index)])  # type: ignore[arg-type]
    assert results == [[0.0], [1.0], [2.0]] and 0 <= wall < 5


def test_bench_plot_without_matplotlib_is_one_line_saying_how_to_install_it(tmp_path: Path) -> None:
    script = "import sys; sys.modules['matplotlib'] = None; from cnnlab.cli.main import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", script, "bench", "--rows", "cpu", "--plot", str(tmp_path / "bench.png")]
    result = subprocess.run(command, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=300)
    message = assert_one_line_error(result)
    assert f"--plot needs matplotlib: {install_hint('plot')}" in message
    assert result.stdout == "" and not (tmp_path / "bench.png").exists()


def test_bench_refuses_unknown_rows() -> None:
    assert "unknown bench rows gpu" in assert_one_line_error(cnnlab("bench", "--rows", "cpu,gpu"))


# A stand-in for the driver's start: each process is shown one number (CUDA_VISIBLE_DEVICES) and prints the start and the
# end that number gives, as the real script prints its own, after writing its pid to STAND_IN_PIDS + the number; a
# number from 10 fails at once, as a GPU that is not there does, and 99 hangs.
STAND_IN_START = """
import os, sys, time
shown = int(os.environ["CUDA_VISIBLE_DEVICES"])
open(os.environ["STAND_IN_PIDS"] + str(shown), "w").write(str(os.getpid()))
time.sleep(1000 if shown == 99 else 0.2)
assert shown < 10
print(100 + shown * 0.25, 101 + shown * int(sys.argv[1]))
"""


def gone(pid_file: Path) -> bool:
    """Whether the process whose pid the file holds has ended and been waited for."""
    try:
        os.kill(int(pid_file.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


def test_driver_starts_spans_the_first_start_to_the_last_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Processes started at once: from the earliest start to the latest end (hand-computed); None where one of them
    fails, every other one still waited for; one that hangs is killed at the timeout."""
    monkeypatch.setenv("STAND_IN_PIDS", str(tmp_path / "pid-"))
    assert driver_starts(["0"], script=STAND_IN_START) == pytest.approx(1.0)
    assert driver_starts(["2", "1", "3"], 2, script=STAND_IN_START) == pytest.approx(107 - 100.25)
    assert driver_starts(["12", "1"], script=STAND_IN_START) is None
    assert gone(tmp_path / "pid-12") and gone(tmp_path / "pid-1")
    monkeypatch.setattr(startup, "DRIVER_START_TIMEOUT", 1)
    assert driver_starts(["99"], script=STAND_IN_START) is None
    hung = tmp_path / "pid-99"  # on a stalled host the timeout may kill it before it has written its pid
    assert not hung.exists() or not hung.read_text() or gone(hung)


@pytest.mark.gpu_if_present
def test_bench_startup_rows_time_whole_processes_beside_the_floor(tmp_path: Path) -> None:
    """cnnlab cpu on the default data, whole processes, beside the interpreter alone; with a GPU, the floor (the driver's
    start alone, inside a bare process that is timed exec to exit too) and cuda mode above it; without one, a note saying
    why the floor is missing."""
    result = cnnlab("bench", "--rows", "startup", "--repeats", "2", "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    names = [row["name"] for row in report["startup"]]
    cpu = next(row for row in report["startup"] if row["name"].startswith("cnnlab cpu"))
    interpreter = next(row for row in report["startup"] if row["name"].startswith("the interpreter alone"))
    assert 0 < cpu["repeat_range"][0] <= cpu["seconds"] <= cpu["repeat_range"][1] < 30
    assert 0 < interpreter["repeat_range"][0] <= interpreter["seconds"] <= interpreter["repeat_range"][1] < cpu["seconds"]
    if names[0].startswith("floor"):
        floor, bare_process = report["startup"][:2]
        cuda = next(row for row in report["startup"] if row["name"].startswith("cnnlab cuda"))
        assert 0 < floor["seconds"] < bare_process["seconds"] and floor["seconds"] < cuda["seconds"]
        assert f"+{cuda['seconds'] - floor['seconds']:.3f} s" in result.stdout
        several = [row for row in report["startup"] if row["name"].startswith("driver's start:")]
        gpus = machine_count() or 0
        if gpus > 1 and VISIBLE not in os.environ:  # each count of GPUs from 2, both ways
            assert [row["name"].split(":")[1].split()[0] for row in several] == [str(n) for n in range(2, gpus + 1) for _ in "ab"]
            assert all(0 < row["repeat_range"][0] <= row["seconds"] <= row["repeat_range"][1] < 30 for row in several)
        else:
            assert not several
    else:
        assert names == [interpreter["name"], cpu["name"]] and "start-up floor not measured" in result.stdout


@pytest.mark.gpu_if_present
def test_the_api_rows_put_the_one_liner_and_the_cpu_beside_the_kept_context(tmp_path: Path) -> None:
    """`--rows api`: at each size, forward(device="cuda") after its first call and the CPU's forward as multiples of a
    CudaContext made beforehand, the one-liner's outputs checked against the CPU's; without a GPU, a note saying why."""
    result = cnnlab("bench", "--rows", "api", "--repeats", "2", "--json", tmp_path / "b.json")
    assert result.returncode == 0, result.stderr
    figures = json.loads((tmp_path / "b.json").read_text())["figures"]
    if not figures:
        assert "api rows not run" in result.stdout
        return
    assert [row["bound"] for row in figures] == [bound for count in API_IMAGES for bound in (None, f"context-{count}", f"context-{count}")]
    one_liners = [row for row in figures if "device='cuda'" in row["name"]]
    # About one correct GPU value in two million nearly cancels and fails the rule (docs/exactness.md): one such value a
    # row is let pass (a run of these 111,000 values has one in ~18 runs); two in the 100,000 of a row, in ~800.
    for row, count in zip(one_liners, API_IMAGES):
        assert row["check"] in ("within rule", f"1 of {count * OUT_LAYER_SIZE} values outside the rule"), row["check"]
    assert all(row["of_bound"] > 0 for row in figures if row["bound"]) and "x context-1000" in result.stdout
