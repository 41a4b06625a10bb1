"""A progress bar on stderr for runs long enough to wait for, only where stderr is a terminal, in the
layout tqdm made familiar:

    cnnlab cpu:  42%|########4           | 4,200/10,000 images [00:01<00:02, 3,456 images/s]

Its own, not tqdm: importing tqdm takes ~40 ms here, a tenth of a short run's start-up, and a new
dependency, for what these few lines do. Off a terminal it does nothing at all; on one, an update is
a clock read unless a redraw is due (at most five a second, and none in the first second).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 20
# The full block, then a block's eighths (the first unused): Unicode where the terminal takes UTF-8, else tqdm's ASCII.
UNICODE_BLOCKS = "█ ▏▎▍▌▋▊▉"
ASCII_BLOCKS = "# 1234567"


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class Progress:
    """`update(done)` as work is done, out of `total` `unit`; `finish()` clears the line it drew."""

    DELAY_SECONDS = 1.0  # stay quiet for runs shorter than this
    INTERVAL_SECONDS = 0.2

    def __init__(self, label: str, total: int, unit: str = "images", stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr
        self._label, self._total, self._unit = label, total, unit
        self._enabled = total > 0 and self._stream is not None and self._stream.isatty()
        encoding = (getattr(self._stream, "encoding", None) or "").lower().replace("-", "")
        self._blocks = UNICODE_BLOCKS if encoding == "utf8" else ASCII_BLOCKS
        self._start = self._last = time.monotonic()
        self._shown = False

    def update(self, done: int) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if now - self._start >= self.DELAY_SECONDS and now - self._last >= self.INTERVAL_SECONDS:
            self._stream.write("\r" + self.line(done, now - self._start))
            self._stream.flush()
            self._last, self._shown = now, True

    def line(self, done: int, elapsed: float) -> str:
        """The bar after `elapsed` seconds with `done` of the total done."""
        fraction = min(done / self._total, 1.0)
        rate = done / elapsed if elapsed > 0 else 0.0
        left = (self._total - done) / rate if rate > 0 else None
        whole, part = divmod(round(fraction * BAR_WIDTH * 8), 8)
        full, partials = self._blocks[0], self._blocks[1:]
        bar = (full * whole + (partials[part] if whole < BAR_WIDTH and part else "")).ljust(BAR_WIDTH)
        return (
            f"{self._label}: {fraction:4.0%}|{bar}| {done:,}/{self._total:,} {self._unit} "
            f"[{_clock(elapsed)}<{_clock(left)}, {rate:,.0f} {self._unit}/s]"
        )

    def finish(self) -> None:
        if self._shown:
            self._stream.write("\r\033[K")
            self._stream.flush()
