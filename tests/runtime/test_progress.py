"""kiln/runtime/progress.py: a long compile reports how many kernels are done; a short one says nothing."""
from __future__ import annotations

import io
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
        short = Progress(3, "building the C++ kernels of a graph", clock=clock, stream=io.StringIO())  # no TTY
        for _ in range(3):
            clock.now += 1.0
            short.step()
        assert not caplog.records  # 3 s in all: under progress_after_s (5 s)
        long = Progress(10, "compiling the CUDA kernels of graph_0", clock=clock, stream=io.StringIO())
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
        progress = Progress(2, "x", clock=clock, stream=io.StringIO())
        clock.now += 60
        progress.step()
        progress.step()
    assert not caplog.records


class FakeTerminal:
    """A stderr that says it is a terminal and records what is written to it."""

    def __init__(self, terminal: bool = True):
        self.terminal, self.text = terminal, ""

    def isatty(self) -> bool:
        return self.terminal

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_on_a_terminal_a_long_compile_draws_one_bar_rewritten_in_place(caplog):
    clock, terminal = Clock(), FakeTerminal()
    with caplog.at_level(logging.WARNING, logger="kiln"):
        short = Progress(2, "short", clock=clock, stream=terminal)
        clock.now += 1.0
        short.step()
        short.step()
        assert terminal.text == ""  # under progress_after_s: nothing drawn
        progress = Progress(4, "building the C++ kernels of a graph", clock=clock, stream=terminal)
        for _ in range(4):
            clock.now += 3.0  # the 2nd step is 6 s in
            progress.step()
    assert not caplog.records  # the bar replaces the log lines
    frames = terminal.text.split("\r")
    assert frames == ["", "kiln: building the C++ kernels of a graph [" + "#" * 15 + "." * 15 + "] 2/4 6 s",
                      "kiln: building the C++ kernels of a graph [" + "#" * 22 + "." * 8 + "] 3/4 9 s",
                      "kiln: building the C++ kernels of a graph [" + "#" * 30 + "] 4/4 12 s\n"]
    assert terminal.text.count("\n") == 1  # one line, ended when done


def test_off_a_terminal_the_log_lines_stay_and_nothing_is_drawn(caplog):
    clock, stream = Clock(), FakeTerminal(terminal=False)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        progress = Progress(2, "x", clock=clock, stream=stream)
        clock.now += 10
        progress.step()
        progress.step()
    assert stream.text == ""
    assert [record.getMessage() for record in caplog.records] == ["kiln: x: 1 of 2 done (10 s)",
                                                                  "kiln: x: 2 of 2 done (10 s)"]


def test_the_bar_is_off_when_progress_is(caplog):
    clock, terminal = Clock(), FakeTerminal()
    with kiln.config.patch(progress_after_s=-1):
        progress = Progress(1, "x", clock=clock, stream=terminal)
        clock.now += 60
        progress.step()
    assert terminal.text == ""
