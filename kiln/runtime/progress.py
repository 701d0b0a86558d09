"""Progress of a long compile: how many kernels are done, of how many.

A first call that compiles for more than `config.progress_after_s` seconds says so on kiln's
logger (a warning, which Python shows by default), then again every `progress_every_s`
seconds, and once when it is done, so a user waiting on a large model sees it is working and
how far it is. Short compiles print nothing.
"""
from __future__ import annotations

import logging
import threading
import time

from kiln.config import config

log = logging.getLogger("kiln")


class Progress:
    """Counts finished items of one compile step and reports them once it has run long."""

    def __init__(self, total: int, what: str, *, clock=time.monotonic):
        self.total, self.what, self.clock = total, what, clock
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
        if self.reported_at is None or now - self.reported_at >= config.progress_every_s or self.done == self.total:
            self.reported_at = now
            log.warning("kiln: %s: %d of %d done (%.0f s)", self.what, self.done, self.total, elapsed)
