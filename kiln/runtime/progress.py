"""Progress of a long compile: how many kernels are done, of how many.

A compile step that runs longer than `config.progress_after_s` seconds shows its progress, so a
user waiting on a large model's first call sees it is working and how far it is; short steps
show nothing. Where it shows depends on who is watching:
- stderr is a terminal: a one-line bar, `kiln: <what> [#####.....] 6/10 12 s`, rewritten in
  place (carriage return) at each step and ended with a newline when the step is done;
- otherwise (a log file, CI, a notebook's captured stream): a line on kiln's logger (a warning,
  which Python shows by default), then again every `progress_every_s` seconds, and once when done.
"""
from __future__ import annotations

import logging
import sys
import threading
import time

from kiln.config import config

log = logging.getLogger("kiln")

BAR_WIDTH = 30


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """Counts finished items of one compile step and shows them once it has run long.
    `stream`: where a bar goes (default: sys.stderr when the step starts), drawn only on a terminal."""

    def __init__(self, total: int, what: str, *, clock=time.monotonic, stream=None):
        self.total, self.what, self.clock = total, what, clock
        self.stream = sys.stderr if stream is None else stream
        self.bar = _is_terminal(self.stream)
        self.done = 0
        self.start = clock()
        self.reported_at: float | None = None
        self._lock = threading.Lock()  # steps come from a pool's threads

    def step(self, count: int = 1) -> None:
        with self._lock:
            self._step(count)

    def _step(self, count: int) -> None:
        self.done += count
        now = self.clock()
        elapsed = now - self.start
        if config.progress_after_s < 0 or elapsed < config.progress_after_s:
            return
        if self.bar:
            self._draw(elapsed)
            return
        if self.reported_at is None or now - self.reported_at >= config.progress_every_s or self.done == self.total:
            self.reported_at = now
            log.warning("kiln: %s: %d of %d done (%.0f s)", self.what, self.done, self.total, elapsed)

    def _draw(self, elapsed: float) -> None:
        filled = BAR_WIDTH * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        end = "\n" if self.done >= self.total else ""
        try:
            self.stream.write(f"\rkiln: {self.what} [{bar}] {self.done}/{self.total} {elapsed:.0f} s{end}")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken terminal: the compile goes on without the bar
            self.bar = False
