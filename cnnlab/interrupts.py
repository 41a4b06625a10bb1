"""SIGINT, SIGTERM and SIGHUP as exceptions, from the process's first moments to its exit: 130, 143, 129.

This module imports nothing heavy, so that `cnnlab.__main__` can install the handlers before numpy
and the rest of cnnlab are imported (a signal during those imports is then a one-line exit too,
not a traceback). The first signal raises, so that every `with` block on the way out cleans up: the
temporary file of an output is removed, a reader thread joined. Later ones are only counted: the
run is already stopping, and an exception in the middle of its clean-up would cut that short.
Steps that must not be cut apart (renaming a pair of files) run `held()`: a signal that comes
during them is raised when they are done.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised like KeyboardInterrupt so that temporary outputs are removed on the way out."""


# Each signal a run stops for: what its handler raises, and the word the one-line message uses.
SIGNAL_EXITS: dict[int, tuple[type[BaseException], str]] = {
    signal.SIGINT: (KeyboardInterrupt, "interrupted"),
    signal.SIGTERM: (Terminated, "terminated"),
    signal.SIGHUP: (Terminated, "hung up"),  # the terminal closed
}
_received: list[int] = []  # the signals that arrived in this process (a process is one run)
_holding = 0  # how many held() blocks are open: the command line's, on its main thread (elsewhere no handler reads it)


def _raise_for(signum: int, frame: object) -> None:
    first = not _received
    _received.append(signum)
    if first and not _holding:
        raise SIGNAL_EXITS[signum][0]


def install() -> None:
    """Turn the signals into exceptions: SIGINT and SIGTERM even where the parent ignored them, SIGHUP only where
    it did not (nohup's way of saying: keep running); and where the parent started this process with them
    blocked, take them now (one that is pending is raised here, at once)."""
    for signum in SIGNAL_EXITS:
        if signum != signal.SIGHUP or signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, _raise_for)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(SIGNAL_EXITS))


@contextmanager
def held() -> Iterator[None]:
    """A few steps no signal may cut apart: one that arrives inside is raised at the end (if it was the first)."""
    global _holding
    before = len(_received)
    _holding += 1
    try:
        yield
    finally:
        _holding -= 1
    if before == 0 and _received:
        raise SIGNAL_EXITS[_received[0]][0]


@contextmanager
def deferred() -> Iterator[None]:
    """Signals wait while inside (the imports of numpy and cnnlab): raised in the import system's own callbacks, an
    exception can be printed as a traceback by C code that goes on; blocked, the signal is taken as the block ends, and
    raised from there."""
    signal.pthread_sigmask(signal.SIG_BLOCK, set(SIGNAL_EXITS))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(SIGNAL_EXITS))


def raise_if_received() -> None:
    """Raise again a signal's exception that was swallowed: one that landed where Python cannot raise (in a
    callback of the import system, say) is printed as "Exception ignored" and the program goes on."""
    if _received:
        raise SIGNAL_EXITS[_received[0]][0]


def unraisable_hook(unraisable: object) -> None:
    """sys.unraisablehook for the command line: a swallowed signal is silent here (raise_if_received raises it
    again, and the run ends with its one line); anything else is printed as Python prints it."""
    if not isinstance(getattr(unraisable, "exc_value", None), tuple(exception for exception, _ in SIGNAL_EXITS.values())):
        sys.__unraisablehook__(unraisable)  # type: ignore[arg-type]


def stopped() -> bool:
    """Whether a signal stopped this process's run."""
    return bool(_received)


def exit_status() -> int | None:
    """After a run ended in an exception: 128 + the signal that stopped it, its line printed; None if
    no signal arrived. Whatever error a signal's exception turned into on its way out (it can land
    inside the standard library's own clean-up), a run that a signal stopped ends as that signal's exit."""
    if not _received:
        return None
    print(f"cnnlab: {SIGNAL_EXITS[_received[0]][1]}", file=sys.stderr)
    return 128 + _received[0]


def join_through_signals(thread: threading.Thread) -> None:
    """Wait for `thread` to end, even through a second signal, then raise the first signal's exception, if any: until it
    has ended it may use what the caller frees next (page-locked buffers, a GPU's context)."""
    interrupted: BaseException | None = None
    while thread.is_alive():
        try:
            thread.join()
        except BaseException as error:  # KeyboardInterrupt, or SIGTERM's exception
            interrupted = interrupted or error
    if interrupted is not None:
        raise interrupted
