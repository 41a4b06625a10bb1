"""The command line: `cnnlab cpu|cuda|generate|compare|bench`, the lab's commands and a few more.

This is the only place where errors become one-line messages and exit statuses: 0 success,
1 outputs that differ (compare), 2 bad usage or a failed run, 130/143/129 interrupted (SIGINT/SIGTERM/SIGHUP),
141 standard output closed early (as a Unix tool killed by SIGPIPE; quietly).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Sequence
from contextlib import suppress

from cnnlab import interrupts
from cnnlab.cli.commands import flush_stdout
from cnnlab.cli.parser import build_parser
from cnnlab.errors import CnnlabError, DeviceLostError, ResourceError, memory_limit_note

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def main(argv: Sequence[str] | None = None, process_ends: bool = False) -> int:
    """Run the command `argv` (default: sys.argv's) and return its exit status. `process_ends`: the process ends as this
    returns (`python -m cnnlab`), so a run that succeeds leaves its backend to the process's end instead of closing it."""
    try:
        interrupts.install()
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser(next((arg for arg in argv if not arg.startswith("-")), None)).parse_args(argv)
        args.process_ends = process_ends
        interrupts.raise_if_received()  # a signal swallowed while the modules were imported still stops the run
        status = args.handler(args)
        flush_stdout()
        return status
    except SystemExit:  # --help: printed, and flushed here, where a fault of standard output is still ours to report
        try:
            flush_stdout()
        except BaseException as error:
            return _ended_by(error)
        raise
    except BaseException as error:
        return _ended_by(error)


def _ended_by(error: BaseException) -> int:
    """The exit status of a run that `error` ended, its one line printed; a bug is raised again, traceback and all."""
    signal_status = interrupts.exit_status()
    if signal_status is not None:
        return signal_status
    if isinstance(error, BrokenPipeError):
        # The reader of standard output (or of a FIFO output) went away: end quietly, as `yes | head -1`'s yes
        # does, and point stdout at /dev/null so that the interpreter's last flush finds nothing to fail on.
        if sys.stdout is not None:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    if isinstance(error, MemoryError):  # numpy's says how much was asked for what shape; the native modules' says nothing
        asked = str(error) or "an allocation failed"
        error = ResourceError(f"out of memory{memory_limit_note()}: {asked}; try a smaller --batch, or a machine with more memory")
    elif isinstance(error, RuntimeError) and str(error) == "can't start new thread":  # threading's words for ENOMEM/EAGAIN
        error = ResourceError(f"cannot start a thread{memory_limit_note()}")
    if not isinstance(error, CnnlabError):
        raise error
    # One line, whatever a path held: a newline or another control character is shown escaped. Where standard error
    # cannot take it (2>/dev/full), the status alone tells.
    with suppress(OSError):
        print("cnnlab: " + _CONTROL.sub(lambda match: repr(match[0])[1:-1], str(error)), file=sys.stderr, flush=True)
    if isinstance(error, DeviceLostError):
        # Leave without running destructors: PyCUDA would print a warning for every object it can
        # no longer free in the lost context, and there is nothing left to clean up (the output's
        # temporary file is already gone).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)
    return 2
