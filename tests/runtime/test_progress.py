"""kiln/runtime/progress.py: a long compile reports how many kernels are done; a short one says nothing."""
from __future__ import annotations

import logging

import kiln
from kiln.runtime.progress import Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_long_compile_reports_progress_and_a_short_one_does_not(caplog):
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger="kiln"):
        short = Progress(3, "building the C++ kernels of a graph", clock=clock)
        for _ in range(3):
            clock.now += 1.0
            short.step()
        assert not caplog.records  # 3 s in all: under progress_after_s (5 s)
        long = Progress(10, "compiling the CUDA kernels of graph_0", clock=clock)
        for _ in range(10):
            clock.now += 2.0  # the 3rd step is 6 s in; then every 5 s at most; and the last
            long.step()
    messages = [record.getMessage() for record in caplog.records]
    assert messages == ["kiln: compiling the CUDA kernels of graph_0: 3 of 10 done (6 s)",
                        "kiln: compiling the CUDA kernels of graph_0: 6 of 10 done (12 s)",
                        "kiln: compiling the CUDA kernels of graph_0: 9 of 10 done (18 s)",
                        "kiln: compiling the CUDA kernels of graph_0: 10 of 10 done (20 s)"]


def test_progress_can_be_turned_off(caplog):
    clock = Clock()
    with kiln.config.patch(progress_after_s=-1), caplog.at_level(logging.WARNING, logger="kiln"):
        progress = Progress(2, "x", clock=clock)
        clock.now += 60
        progress.step()
        progress.step()
    assert not caplog.records
