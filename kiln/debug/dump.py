"""Per-graph debug dumps: `KILN_DEBUG=1` writes `kiln_debug/<run>/<graph>/`.

Each graph gets a folder with the ATen graph, LoopIR before and after fusion, the memory
plan, every kernel, the wrapper and `timings.txt` (seconds per stage). Stage timings are kept even
without KILN_DEBUG, so the perf log and `explain()` can report them. While the HTML report collects
(KILN_REPORT, kiln/debug/html_report.py), `GraphDump.observer` sees each new dump and makes it keep
every stage's text in `kept`; otherwise nothing is kept.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from typing import Callable

from kiln.config import config

log = logging.getLogger("kiln")
_graph_counter = itertools.count()
_RUN_NAME = time.strftime("run_%Y%m%d_%H%M%S") + f"_{os.getpid()}"


class GraphDump:
    # Called with each new dump and its ATen graph; set by kiln.debug.html_report.enable(), None otherwise.
    observer: Callable | None = None

    def __init__(self, name: str, folder: str | None):
        self.name = name
        self.folder = folder
        self.timings: dict[str, float] = {}
        self.kept: dict[str, str] | None = None  # {filename: text} of every write, when an observer asks

    @classmethod
    def new(cls, gm=None) -> "GraphDump":
        name = f"graph_{next(_graph_counter)}"
        folder = None
        if config.debug:
            folder = os.path.join(config.debug_dir, _RUN_NAME, name)
            os.makedirs(folder, exist_ok=True)
        dump = cls(name, folder)
        if cls.observer is not None:
            cls.observer(dump, gm)
        return dump

    def write(self, filename: str, text: str) -> None:
        if self.kept is not None:
            self.kept[filename] = text
        if self.folder is None:
            return
        with open(os.path.join(self.folder, filename), "w") as handle:
            handle.write(text)

    @contextlib.contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = time.perf_counter() - start

    def finish(self) -> None:
        report = "\n".join(f"{stage:10} {seconds * 1000:9.1f} ms" for stage, seconds in self.timings.items())
        self.write("timings.txt", report + "\n")
        if config.log_enabled("perf"):
            log.warning("kiln: %s compile stages:\n%s", self.name, report)
        if self.folder is not None and config.log_enabled("kernels"):
            log.warning("kiln: %s dumped to %s", self.name, self.folder)
