"""cuda mode's start and end: the driver shown only the GPUs a run names, numbered as the user numbers them
(cnnlab/cuda/gpus.py), and the driver's teardown handed to a helper as the run leaves (cnnlab/cuda/teardown.py).

The numbering's rules run everywhere against a stand-in for the driver's count; on a GPU machine, runs in subprocesses
with the user's CUDA_VISIBLE_DEVICES unset and set check that the GPUs and the messages are the machine's.
"""

from __future__ import annotations

import inspect
import os
import queue
import select
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, SUBPROCESS_ENV, assert_one_line_error, cnnlab, in_forked_child, random_cnn, write_files

from cnnlab import run
from cnnlab.cli import main as cli
from cnnlab.cpu.backend import CpuBackend
from cnnlab.cuda import context, gpus
from cnnlab.cuda import driver as cuda_driver
from cnnlab.cuda.context import CudaContext
from cnnlab.errors import DeviceError
from cnnlab.generate import random_values


@pytest.fixture
def numbering(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpus' state and CUDA_VISIBLE_DEVICES as a fresh process has them, restored after the test."""
    monkeypatch.setattr(gpus, "_shown", None)
    monkeypatch.delenv(gpus.VISIBLE, raising=False)


def driver_seeing(count: int, fails: bool = False):  # noqa: ANN201 (a stand-in for driver.visible_count)
    def visible_count() -> int:
        if fails:
            raise DeviceError("cannot start CUDA: cuInit failed: no CUDA-capable device is detected")
        return count

    return visible_count


@pytest.mark.usefixtures("numbering")
def test_the_driver_is_shown_the_named_gpus_and_ordinals_are_their_places(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpus.show_only([3, 1, 3]) == [1, 0, 1]
    assert os.environ[gpus.VISIBLE] == "1,3"
    assert gpus.ordinal(3, driver_seeing(2)) == 1 and gpus.ordinal(1, driver_seeing(2)) == 0
    assert [gpus.number(0), gpus.number(1)] == [1, 3]


@pytest.mark.usefixtures("numbering")
@pytest.mark.parametrize("users", ["", "1", "GPU-abc", "0,1"])
def test_a_users_own_visible_gpus_are_left_as_they_are(monkeypatch: pytest.MonkeyPatch, users: str) -> None:
    monkeypatch.setenv(gpus.VISIBLE, users)
    assert gpus.show_only([1]) == [1]
    assert os.environ[gpus.VISIBLE] == users
    assert gpus.ordinal(1, driver_seeing(2)) == 1 and gpus.number(1) == 1
    with pytest.raises(DeviceError, match=r"^there is no GPU 2: this machine has 2 \(GPUs 0 to 1\)$"):
        gpus.ordinal(2, driver_seeing(2))
    with pytest.raises(DeviceError, match="cuInit failed"):
        gpus.ordinal(0, driver_seeing(0, fails=True))


@pytest.mark.usefixtures("numbering")
@pytest.mark.parametrize(
    ("named", "driver_finds", "fails", "machine", "message"),
    [
        ([4], 0, True, 4, r"there is no GPU 4: this machine has 4 \(GPUs 0 to 3\)"),  # cuInit finds nothing to start
        ([0, 4], 1, False, 4, r"there is no GPU 4: this machine has 4 \(GPUs 0 to 3\)"),  # it stops at GPU 4
        ([1], 0, True, 1, r"there is no GPU 1: this machine has 1 \(GPU 0\)"),
        ([0], 0, True, 0, "cuInit failed"),  # no GPU at all: the driver's own words, as without the restriction
        ([0], 0, True, 2, "cuInit failed"),  # a GPU that is there and did not start: the driver's words
        ([0], 0, True, None, "cuInit failed"),  # no count to name
        ([0], 0, False, 0, "^no CUDA device found$"),  # the driver started and found nothing; nor did NVML
        ([0, 1], 1, False, 2, r"^GPU 1 did not start: the driver found 1 of the GPUs CUDA_VISIBLE_DEVICES=0,1 names$"),
    ],
)  # fmt: skip
def test_a_gpu_the_machine_lacks_is_named_with_the_machines_count(
    monkeypatch: pytest.MonkeyPatch, named: list[int], driver_finds: int, fails: bool, machine: int | None, message: str
) -> None:
    """With the driver shown only the named GPUs, the count in the message is the machine's (NVML's), as it was when
    the driver saw every GPU."""
    monkeypatch.setattr(gpus, "machine_count", lambda: machine)
    gpus.show_only(named)
    with pytest.raises(DeviceError, match=message):
        gpus.ordinal(named[-1], driver_seeing(driver_finds, fails))


@pytest.mark.parametrize(
    ("arguments", "started"),
    [([], [0]), (["--device", "1"], [1]), (["--device=2"], [2]), (["--devices", "0,2"], [0, 2]), (["--devices=3"], [3]),
     (["--devices", "all"], None), (["--devices", "0,x"], None), (["--devices="], None), (["--device", "x"], [0]),
     (["--device", "\u00b2"], [0]), (["--device", "0", "--device", "1"], [1]), (["--devices", "0,1", "--devices", "2"], [2]),
     (["--devices", "all", "--devices", "1,3"], [1, 3])],
)  # fmt: skip
def test_the_driver_starts_the_gpus_the_command_names(arguments: list[str], started: list[int] | None) -> None:
    """Before the parser runs, cuda mode starts only the GPUs its arguments name, the last of an option counting as it
    does for the parser: every GPU only for all (or a mistake, which the parser names next)."""
    from cnnlab.__main__ import _gpus_named

    assert _gpus_named(["cnn.csv", "in.csv", "out.csv", *arguments]) == started


STANDARD_STREAMS_CLOSED = """
import os
os.close(0)
os.close(1)
from cnnlab.cuda.teardown import TeardownHelper
helper = TeardownHelper()
os.write(2, str(helper._channel.fileno()).encode())
helper.hand_over()
os._exit(0)
"""


def test_the_helpers_socket_takes_no_standard_streams_number() -> None:
    """Started with stdin and stdout closed (`<&- >&-`), the socket keeps off 0 and 1: an output to `-` fails to be
    written, as it would without the helper, instead of going into the socket."""
    run = subprocess.run([sys.executable, "-c", STANDARD_STREAMS_CLOSED], env=SUBPROCESS_ENV, capture_output=True, timeout=60)
    assert run.returncode == 0 and int(run.stderr) > 2, run.stderr


HANDS_OVER = """
import os, sys
from cnnlab.cuda.teardown import TeardownHelper
held = int(sys.argv[1])  # the stand-in for a driver file: a pipe's write end, which the test reads
helper = TeardownHelper(files=os.readlink(f"/proc/self/fd/{held}"))
print(helper.pid, flush=True)
sys.stdin.readline()  # the test has stopped the helper
helper.hand_over()
os._exit(3)
"""


def held_pipes(pid: int) -> list[str]:
    """The pipes process `pid` holds open."""
    links = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except FileNotFoundError:
            pass
    return [link for link in links if link.startswith("pipe:")]


def test_the_helper_closes_the_handed_files_after_the_process_is_gone() -> None:
    """While the helper is stopped, the process has exited (its status is its own, its stdout has ended) and the file it
    handed over is still open; once the helper runs, it is closed."""
    read_end, write_end = os.pipe()
    run = subprocess.Popen(
        [sys.executable, "-c", HANDS_OVER, str(write_end)], env=SUBPROCESS_ENV, pass_fds=[write_end], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )
    os.close(write_end)
    try:
        assert run.stdout is not None and run.stdin is not None
        helper = int(run.stdout.readline())
        deadline = time.monotonic() + 30
        while held_pipes(helper):  # until the helper has closed what it inherited (the run's stdout among them)
            assert time.monotonic() < deadline, held_pipes(helper)
            time.sleep(0.001)
        os.kill(helper, signal.SIGSTOP)
        run.stdin.write("go\n")
        run.stdin.flush()
        assert run.stdout.read() == ""  # the process's stdout ended: the helper does not hold it
        assert run.wait(timeout=30) == 3
        assert select.select([read_end], [], [], 0.3)[0] == []  # no end of file: the helper holds the write end
        os.kill(helper, signal.SIGCONT)
        assert select.select([read_end], [], [], 30)[0] == [read_end] and os.read(read_end, 1) == b""
    finally:
        os.close(read_end)
        run.kill()


def test_a_run_that_ends_the_process_leaves_its_backend_open_and_one_that_fails_closes_it(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[bool] = []
    monkeypatch.setattr(CpuBackend, "close", lambda self: closed.append(True))
    monkeypatch.setattr(run, "_LEFT_TO_THE_PROCESS_END", [])  # what a run that ends the process keeps, this test's own
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), random_values(rng, 3, 100, 100))
    assert cli.main(["cpu", str(cnn_path), str(input_path), str(tmp_path / "out.csv")], process_ends=True) == 0
    assert closed == [] and (tmp_path / "out.csv").exists() and len(run._LEFT_TO_THE_PROCESS_END) == 1
    assert cli.main(["cpu", str(cnn_path), str(input_path), str(tmp_path / "out2.csv")]) == 0
    assert closed == [True]
    (tmp_path / "bad.csv").write_text(input_path.read_text().replace("\n", "\nx,", 1))
    assert cli.main(["cpu", str(cnn_path), str(tmp_path / "bad.csv"), str(tmp_path / "out3.csv")], process_ends=True) == 2
    assert closed == [True, True] and not (tmp_path / "out3.csv").exists()


@pytest.mark.parametrize(
    ("kind", "options", "ahead"),
    [
        ("csv", [], True), ("csv", ["--devices", "0,1"], False), ("csv", ["--host-parse"], False),
        ("npy", ["--devices", "0,1"], True), ("npy", ["--device", "1"], True),
    ],
)  # fmt: skip
def test_cuda_mode_makes_the_file_copier_ahead_only_where_the_input_uses_it(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, kind: str, options: list[str], ahead: bool
) -> None:
    """The copier's page-locked staging (up to 96 MiB a GPU) is made ahead, sized to the file, for a .npy file and for a
    CSV file parsed on one GPU; not for text the host parses, nor for a CSV file's text over several GPUs (the host's
    windows)."""
    from cnnlab.cli import commands

    asked: list[int | None] = []

    def make_backend(*args: object, **kwargs: object) -> None:
        asked.append(inspect.signature(run.make_backend).bind(*args, **kwargs).arguments.get("copier_ahead"))
        raise DeviceError("stand-in: no backend")

    monkeypatch.setattr(commands, "make_backend", make_backend)
    images = random_values(rng, 3, 100, 100)
    cnn_path, input_path = write_files(tmp_path, random_cnn(rng), images)
    if kind == "npy":
        input_path = tmp_path / "in.npy"
        np.save(input_path, images)
    assert cli.main(["cuda", str(cnn_path), str(input_path), str(tmp_path / "out.csv"), *options]) == 2
    assert asked == [input_path.stat().st_size if ahead else None]


STARTS_ONLY = """
import sys
from cnnlab.cuda.driver import start_driver
from cnnlab.cuda.context import CudaContext
from cnnlab.cuda import driver as cuda_driver
from cnnlab.network import Cnn
import numpy as np
gpu = int(sys.argv[1])
start_driver([gpu]).join()
import pycuda.driver as driver
rng = np.random.default_rng()
with CudaContext(Cnn(rng.uniform(-1, 1, (10, 5, 5)), rng.uniform(-1, 1, (10, 4000))), device=gpu):
    print(driver.Device.count(), driver.Context.get_device().pci_bus_id())
"""
BUS_IDS = "import pycuda.driver as d; d.init(); print(*[d.Device(i).pci_bus_id() for i in range(d.Device.count())])"


def run_python(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in SUBPROCESS_ENV.items() if key != gpus.VISIBLE}
    return subprocess.run(
        [sys.executable, "-c", script, *args], env={**environment, **env}, capture_output=True, text=True, timeout=300
    )


QUEUES_GIVEN = """
import os
from cnnlab.cuda.driver import start_driver
start_driver([0]).join()
print(os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"))
"""


@pytest.mark.parametrize(("users", "given"), [(None, "2"), ("8", "8"), ("1", "1")])
def test_the_driver_starts_with_two_hardware_queues_a_context_unless_the_user_chose(users: str | None, given: str) -> None:
    """The command line's driver (started or not: none here is fine) makes its contexts with two hardware queues, where
    the user has set no CUDA_DEVICE_MAX_CONNECTIONS of their own; theirs is kept."""
    environment = {key: value for key, value in SUBPROCESS_ENV.items() if key not in (gpus.VISIBLE, "CUDA_DEVICE_MAX_CONNECTIONS")}
    if users is not None:
        environment["CUDA_DEVICE_MAX_CONNECTIONS"] = users
    started = subprocess.run([sys.executable, "-c", QUEUES_GIVEN], env=environment, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stderr
    assert started.stdout.split() == [given]


@pytest.mark.gpu
def test_a_run_starts_only_its_gpu_and_numbers_it_as_the_machine_does() -> None:
    """Started for GPU N, the driver sees one GPU, and it is the one the machine numbers N (the same PCI bus)."""
    machine = run_python(BUS_IDS)
    assert machine.returncode == 0, machine.stderr
    bus_ids = machine.stdout.split()
    for gpu, bus_id in enumerate(bus_ids):
        started = run_python(STARTS_ONLY, str(gpu))
        assert started.returncode == 0, started.stderr
        assert started.stdout.split() == ["1", bus_id]


@pytest.mark.gpu
@pytest.mark.parametrize("restricted", [False, True])
def test_the_gpu_choice_faults_say_what_they_said_with_every_gpu_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restricted: bool
) -> None:
    """The messages name the machine's GPUs whether the run restricts the driver (the user's CUDA_VISIBLE_DEVICES unset)
    or the user lists every GPU; an empty or odd CUDA_VISIBLE_DEVICES is the driver's own one line."""
    count = int(run_python("import pycuda.driver as d; d.init(); print(d.Device.count())").stdout)
    numbered = "GPU 0" if count == 1 else f"GPUs 0 to {count - 1}"
    env = {} if restricted else {gpus.VISIBLE: ",".join(map(str, range(count)))}
    if restricted:
        monkeypatch.delitem(SUBPROCESS_ENV, gpus.VISIBLE, raising=False)  # the run's own restriction, whatever the test's
    message = f"cnnlab: there is no GPU {count}: this machine has {count} ({numbered})\n"
    out, cnn_file, input_file = tmp_path / "out.csv", ROOT / "data/cnn.csv", ROOT / "data/in.csv"
    assert assert_one_line_error(cnnlab("cuda", cnn_file, input_file, out, "--device", str(count), env=env)) == message
    assert assert_one_line_error(cnnlab("cuda", cnn_file, input_file, out, "--devices", f"0,{count}", env=env)) == message
    for odd in ("", "-1", "GPU-no-such-uuid"):
        assert "cannot start CUDA" in assert_one_line_error(cnnlab("cuda", cnn_file, input_file, out, env={gpus.VISIBLE: odd}))
    assert not out.exists()
    assert cnnlab("cuda", cnn_file, input_file, out, "--device", str(count), "--device", "0", env=env).returncode == 0


class StandInContext(CudaContext):
    """A CudaContext as __init__ leaves it, without a GPU: its close() is recorded, and fails where asked."""

    def __init__(self, name: str, closed: list[str], fails: bool = False) -> None:
        self.name, self.closed, self.fails, self._context = name, closed, fails, object()

    def close(self) -> None:
        self.closed.append(self.name)
        self._context = None
        if self.fails:
            raise DeviceError("cannot free device memory: a lost context")


def test_a_dropped_context_is_only_queued_by_its_finalizer_and_closed_by_the_next_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """CudaContext's finalizer, which the collector may run on any thread holding any lock, only queues the context;
    every call (and the process's end) first closes what is queued, on its own thread, one failing close not stopping
    the rest."""
    monkeypatch.setattr(context, "_DROPPED", queue.SimpleQueue())
    closed: list[str] = []
    unmade = object.__new__(CudaContext)  # __init__ failed before the driver: nothing to close
    unmade.__del__()
    for each in (StandInContext("first", closed, fails=True), StandInContext("second", closed)):
        each.__del__()
    assert closed == [] and context._DROPPED.qsize() == 2
    context._close_dropped()
    assert closed == ["first", "second"] and context._DROPPED.empty()


def test_a_forked_child_holds_its_parents_contexts_and_closes_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child forked from a process with contexts open, or dropped and not yet closed, leaves them be: the driver
    refuses a forked child their use and their closing, and its calls and its end close none of them."""
    monkeypatch.setattr(context, "_DROPPED", queue.SimpleQueue())
    monkeypatch.setattr(context, "_OPEN", weakref.WeakSet())
    closed: list[str] = []
    still_open, dropped = StandInContext("open", closed), StandInContext("dropped", closed)
    context._OPEN.add(still_open)
    dropped.__del__()

    def in_the_child() -> bool:
        context._close_dropped()
        context._close_open_contexts()
        return closed == [] and all(any(held is each for held in context._LEFT_TO_THE_PARENT) for each in (still_open, dropped))

    assert in_forked_child(in_the_child)
    still_open._context = dropped._context = None  # nothing for this process's end to close either


FORKED_EXIT = """
import os
import sys

from cnnlab.cuda import context


class StandIn(context.CudaContext):
    def __init__(self) -> None:
        self._context = object()

    def close(self) -> None:
        os.write(1, b"closed\\n")

    def __del__(self) -> None:
        os.write(1, b"finalized\\n")


held = StandIn()
context._OPEN.add(held)
pid = os.fork()
if pid == 0:
    del held  # the child's own reference: only what cnnlab holds of its parent's is left
    sys.exit(0)  # a normal exit: the atexit hooks, then the interpreter's end
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), flush=True)
os._exit(0)  # this process's own end would close and finalize it: not what is tested
"""


def test_a_forked_child_that_exits_normally_frees_nothing_of_its_parents() -> None:
    """A forked child's normal exit (its atexit hooks, then the interpreter's end freeing what its modules held) never
    reaches its parent's contexts: neither closed nor finalized there, with nothing on stderr."""
    result = subprocess.run([sys.executable, "-c", FORKED_EXIT], capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "0\n", "")


def test_a_child_forked_after_the_driver_started_is_told_to_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CudaContext made in a child forked from a process whose CudaContext started the driver is refused in one line
    saying why and what to do, before the driver is asked (it cannot start in such a child); the parent is not refused."""
    monkeypatch.setattr(cuda_driver, "_STARTED_IN", os.getpid())
    cnn = random_cnn(np.random.default_rng())

    def in_the_child() -> bool:
        try:
            CudaContext(cnn)
        except DeviceError as error:
            return str(error) == cuda_driver.FORKED
        return False

    assert in_forked_child(in_the_child)
    try:
        CudaContext(cnn).close()
    except DeviceError as error:  # no GPU or no PyCUDA here: this machine's word, not the fork's
        assert str(error) != cuda_driver.FORKED
