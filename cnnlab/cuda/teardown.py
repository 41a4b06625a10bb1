"""The driver's teardown, taken out of the command line's exit.

When a process that used a GPU ends, the kernel closes its driver files (/dev/nvidia*), and the last close of each
tears down what the driver made for it: on the H100 machine ~0.1 s for a bare context and ~0.3 s with 512 MB of
page-locked and device memory, after every output is already in place. So `python -m cnnlab cuda` forks a helper
before the driver starts, which holds none of the run's files (its standard streams closed: a pipe reading the run
sees its end when the run ends); as the run leaves, it sends the helper its driver files over a socket (SCM_RIGHTS)
and exits, and the helper closes them once the run's process is gone. The last close, and the teardown, are then the
helper's, while whoever started the run already has its exit status. Where the helper cannot take them, the run's own
exit tears down, as any process's does.
"""

from __future__ import annotations

import array
import fcntl
import os
import select
import signal
import socket
import time
from typing import NoReturn

DRIVER_FILES = "/dev/nvidia"  # the driver's device files: nvidiactl, nvidia0..N, nvidia-uvm
FILES_A_MESSAGE = 200  # file descriptors sent in one message: under the kernel's limit (SCM_MAX_FD, 253)
INT_BYTES = array.array("i").itemsize
RUN_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}  # what ends a run (cnnlab.interrupts); the helper ignores them


class TeardownHelper:
    """A helper process, forked at once (before any thread starts), that takes the driver's files from this process as
    it leaves and closes them after it is gone."""

    def __init__(self, files: str = DRIVER_FILES) -> None:
        """`files`: what the files to hand over are opened as (a prefix of their paths in /proc/self/fd). Raises OSError
        where no socket or process can be had (a limit)."""
        self._files = files
        self._channel, theirs = (_above_standard_streams(end) for end in socket.socketpair())
        parent = os.getpid()
        # The run's signals held over the fork, so that none reaches the helper before it ignores them.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, RUN_SIGNALS)
        try:
            self.pid = os.fork()
            if self.pid == 0:
                self._channel.close()
                _close_when_gone(theirs, parent)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        theirs.close()

    def hand_over(self) -> None:
        """Send the helper this process's driver files: the last thing the process does before os._exit."""
        files = array.array("i", _open_files(self._files))
        try:
            for at in range(0, len(files), FILES_A_MESSAGE):
                sent = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, files[at : at + FILES_A_MESSAGE])]
                self._channel.sendmsg([b"\0"], sent, socket.MSG_NOSIGNAL)
        except OSError:  # the helper is gone: the process's exit closes the files itself
            pass


def _above_standard_streams(end: socket.socket) -> socket.socket:
    """The socket on a descriptor above 2: where the run started with standard output closed (`>&-`) the pair would
    take its number, and the outputs would go to the helper instead of failing to be written."""
    if end.fileno() > 2:
        return end
    moved = socket.socket(fileno=fcntl.fcntl(end.fileno(), fcntl.F_DUPFD_CLOEXEC, 3))
    end.close()
    return moved


def _open_files(prefix: str) -> list[int]:
    """This process's file descriptors whose paths start with `prefix`."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith(prefix):
                found.append(int(name))
        except OSError:  # the descriptor listdir itself used, closed by now
            pass
    return found


def _close_when_gone(channel: socket.socket, parent: int) -> NoReturn:
    """The helper: hold nothing of the run's, take the files the run sends until it closes the channel, wait until its
    process is gone, and close them (at the helper's exit)."""
    try:
        for signum in RUN_SIGNALS:  # the run's group gets them: the run answers
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, RUN_SIGNALS)
        kept = channel.fileno()
        os.closerange(0, kept)
        os.closerange(kept + 1, os.sysconf("SC_OPEN_MAX"))
        try:
            gone: int | None = os.pidfd_open(parent)
        except (AttributeError, OSError):  # no pidfd on this kernel: the helper is re-parented once the run is gone
            gone = None
        if os.getppid() != parent:  # the run is gone already (and its number may be another's): nothing will come
            os._exit(0)
        held = array.array("i")
        while True:
            data, ancillary, _, _ = channel.recvmsg(1, socket.CMSG_SPACE(FILES_A_MESSAGE * INT_BYTES))
            for _, _, payload in ancillary:
                held.frombytes(payload[: len(payload) - len(payload) % INT_BYTES])
            if not data:  # the run closed its end: it is leaving
                break
        if held:
            if gone is not None:
                select.select([gone], [], [])
            else:
                while os.getppid() == parent:
                    time.sleep(0.001)
    finally:
        os._exit(0)
