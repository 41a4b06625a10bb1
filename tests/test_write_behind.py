"""The run's writer (cnnlab/run.py WriteBehind): each batch's outputs written in order on a thread of its own where the
output is a regular file, a failure raised on the caller's thread, nothing written once the run has failed."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from cnnlab.network import OutputBatch
from cnnlab.run import WriteBehind


class Recorded:
    """An output that keeps what it is given and the thread that wrote it; batch `fail_at` fails, and a write waits for
    `go` (set) before it ends."""

    def __init__(self, regular: bool, fail_at: int | None = None) -> None:
        self.regular = regular
        self.batches: list[np.ndarray] = []
        self.threads: set[str] = set()
        self.fail_at = fail_at
        self.go = threading.Event()
        self.go.set()
        self.writing = threading.Event()  # set as the first write begins
        self.failed = threading.Event()  # set as batch `fail_at` fails

    def write(self, outputs: OutputBatch) -> None:
        self.writing.set()
        self.go.wait()
        if len(self.batches) == self.fail_at:
            self.failed.set()
            raise OSError(28, "No space left on device")
        self.batches.append(outputs.values.copy())
        self.threads.add(threading.current_thread().name)


def batches(rng: np.random.Generator, count: int) -> list[OutputBatch]:
    return [OutputBatch(rng.uniform(-10, 10, (int(rng.integers(1, 9)), 10))) for _ in range(count)]


@pytest.mark.parametrize("regular, threaded", [(True, True), (False, True), (True, False)], ids=["regular-file", "pipe", "no-read-ahead"])
def test_every_batch_is_written_in_order_on_the_writer_s_thread_where_the_file_is_regular(
    rng: np.random.Generator, regular: bool, threaded: bool
) -> None:
    """A pipe's writes may wait for ever, and a run without read-ahead keeps its timed work alone: both on the caller's
    thread."""
    output, given = Recorded(regular), batches(rng, 20)
    with WriteBehind(output, threaded=threaded) as writer:
        for outputs in given:
            writer.write(outputs)
    assert [batch.tolist() for batch in output.batches] == [outputs.values.tolist() for outputs in given]
    assert output.threads == ({"cnnlab-writer"} if regular and threaded else {threading.current_thread().name})


def test_a_failed_write_is_raised_on_the_caller_s_thread_and_nothing_after_it_is_written(rng: np.random.Generator) -> None:
    output, given = Recorded(True, fail_at=3), batches(rng, 12)
    with pytest.raises(OSError, match="No space left"), WriteBehind(output) as writer:
        for outputs in given:
            writer.write(outputs)
    assert len(output.batches) == 3


def test_a_failed_write_is_raised_by_the_next_write(rng: np.random.Generator) -> None:
    """The run stops at its next batch, not at its end."""
    output, given = Recorded(True, fail_at=0), batches(rng, 2)
    went_on = False
    with pytest.raises(OSError, match="No space left"), WriteBehind(output) as writer:
        writer.write(given[0])
        assert output.failed.wait(10)
        deadline = time.monotonic() + 10  # the writer's thread keeps the error a moment after the write raised it
        while writer._error is None and time.monotonic() < deadline:
            time.sleep(0.001)
        writer.write(given[1])
        went_on = True
    assert not went_on and output.batches == []


def test_leaving_early_waits_for_the_write_in_progress_and_drops_the_rest(rng: np.random.Generator) -> None:
    output, given = Recorded(True), batches(rng, 2)
    output.go.clear()  # the first write waits: the second is queued behind it
    with pytest.raises(KeyboardInterrupt), WriteBehind(output) as writer:
        writer.write(given[0])
        writer.write(given[1])
        assert output.writing.wait(10)
        threading.Timer(0.2, output.go.set).start()
        raise KeyboardInterrupt
    # The block ended after the write in progress (its file is never closed under it), and the queued batch was dropped.
    assert [batch.tolist() for batch in output.batches] == [given[0].values.tolist()]
