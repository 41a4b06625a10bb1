"""`python -m cnnlab` and the `cnnlab` command: the command line (cnnlab.cli.main).

Before anything heavy is imported: SIGINT and SIGTERM become one-line exits (cnnlab.interrupts),
OpenBLAS is given no more threads than an address-space limit (ulimit -v) leaves space for (each
reserves ~40 MB when numpy is imported, and OpenBLAS gives up with its own message when it cannot),
and in cuda mode the driver starts while numpy is imported and the CNN read, its teardown left to a helper.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

from cnnlab import interrupts

if TYPE_CHECKING:
    from cnnlab.cuda.teardown import TeardownHelper

# Measured on the 2-core machine: `import numpy` and a matrix product need 136 MB of address space with
# one OpenBLAS thread and 175 MB with two; a run of the default data needs ~170 MB with one.
MINIMUM_ADDRESS_SPACE = 192 << 20
BLAS_THREAD_ADDRESS_SPACE = 48 << 20
M_ARENA_MAX = -8  # glibc's mallopt parameter


def main() -> NoReturn:
    sys.unraisablehook = interrupts.unraisable_hook
    _hold_standard_error()
    teardown: list[TeardownHelper] = []  # cuda mode's helper, made by _start
    try:
        interrupts.install()
        status = _start(teardown)
    except BaseException:
        signal_status = interrupts.exit_status()
        if signal_status is None:
            raise
        status = signal_status
    finally:  # the run is over: a signal from here on ends the process without a word (no traceback)
        for signum in interrupts.SIGNAL_EXITS:
            signal.signal(signum, signal.SIG_IGN)
    # The run is over: its outputs are in place and its reader and writer joined. Leave now, without the interpreter's teardown,
    # which frees nothing the process's end does not (numpy's modules), and with a GPU without the driver's, which the
    # helper takes (cuda/teardown.py). And after a signal, leave with 128 + the signal: where a KeyboardInterrupt passed
    # through Python's C API on its way (numpy's import runs code that way), the interpreter would end the process by
    # raising SIGINT again, whatever status is returned here.
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except OSError:
            pass
    for helper in teardown:
        helper.hand_over()
    os._exit(status)


def _start(teardown: list[TeardownHelper]) -> int:
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY:
        if limit < MINIMUM_ADDRESS_SPACE:
            print(
                f"cnnlab: the address-space limit of {limit >> 20} MB (ulimit -v) is below the "
                f"{MINIMUM_ADDRESS_SPACE >> 20} MB that numpy and its BLAS need to start",
                file=sys.stderr,
            )
            return 2
        threads = 1 + (limit - MINIMUM_ADDRESS_SPACE) // BLAS_THREAD_ADDRESS_SPACE
        os.environ.setdefault("OPENBLAS_NUM_THREADS", str(min(threads, os.cpu_count() or 1)))
        _share_one_malloc_arena()
    # cuda mode: the driver starts while numpy is imported and the CNN read, before cli is even imported, shown only the
    # GPUs the run names; but not under an address-space limit, where its reservations would leave OpenBLAS none (and it
    # would abort). The teardown helper is forked first, while this process has no other thread.
    starting = None
    if sys.argv[1:2] == ["cuda"] and limit == resource.RLIM_INFINITY:
        from cnnlab.cuda.driver import start_driver
        from cnnlab.cuda.teardown import TeardownHelper

        try:
            teardown.append(TeardownHelper())
        except OSError:  # no process or descriptor to spare (a limit): the run's exit tears the driver down itself
            pass
        starting = start_driver(_gpus_named(sys.argv[2:]))
    try:
        with interrupts.deferred():  # numpy and cnnlab imported with signals held (a few tenths of a second at most)
            from cnnlab.cli.main import main as cli_main
        return cli_main(process_ends=True)
    finally:
        if starting is not None:
            starting.join()


def _hold_standard_error() -> None:
    """Started with standard error closed (`2>&-`): hold its descriptor open on /dev/null, as `2>/dev/null` would, so that
    no file opened later takes the number 2 (an output's temporary file would get what C code writes to stderr), and
    messages go nowhere instead of failing the run; the exit status still tells."""
    try:
        os.fstat(2)
    except OSError:
        held = os.open(os.devnull, os.O_WRONLY)
        if held != 2:
            os.dup2(held, 2)
            os.close(held)
        sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)  # noqa: SIM115 (the process's own, never closed)


def _share_one_malloc_arena() -> None:
    """Have every thread allocate from glibc's one main arena: by default each thread that allocates gets an arena of its
    own, 64 MB of address space reserved each, which under an address-space limit leaves a run's buffers no space (a
    200-image CSV file under 300 MB failed on two threads; with one arena it runs under 200 MB). Before any thread starts."""
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, 1)
    except (AttributeError, OSError):  # not glibc: its own allocator's ways
        pass


def _gpus_named(arguments: list[str]) -> list[int] | None:
    """The GPUs cuda mode's arguments name, read ahead of the parser (which names a mistake later), the last of each
    option counting as it does for the parser: --device N, GPU 0 by default, those --devices lists (every GPU for all or
    a mistake: it is named later, and every GPU starts meanwhile)."""
    named: list[int] | None = [0]
    for at, argument in enumerate(arguments):
        name, equals, value = argument.partition("=")
        if name not in ("--device", "--devices"):
            continue
        if not equals:
            value = arguments[at + 1] if at + 1 < len(arguments) else ""
        indices = value.split(",")
        if all(index.isdecimal() for index in indices) and (name == "--devices" or len(indices) == 1):
            named = [int(index) for index in indices]
        else:
            named = None if name == "--devices" else [0]
    return named


if __name__ == "__main__":
    sys.exit(main())
