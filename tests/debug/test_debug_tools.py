"""kiln/debug: the bisect tool finds a planted wrong lowering; explain() reports what happened."""
from __future__ import annotations

import torch

import kiln
from kiln import _torch
from kiln.debug.bisect import capture_aten_graphs, first_wrong_node
from kiln.lowering.registry import LOWERINGS


def test_bisect_names_the_first_wrong_node(monkeypatch):
    def program(x):
        y = torch.exp(x) * 2
        return torch.sin(y) + y, y.sum()

    # Plant a bug: sin lowered as cos. Everything before sin is right, sin and what follows is wrong.
    cos_rule = LOWERINGS[_torch.aten.cos.default]
    monkeypatch.setitem(LOWERINGS, _torch.aten.sin.default, cos_rule)
    x = torch.randn(16)
    with capture_aten_graphs() as graphs, kiln.config.patch(strict=True):
        kiln.compile(program)(x)
    result = first_wrong_node(*graphs[0])
    assert result.node is not None and "sin" in result.node, str(result)
    monkeypatch.undo()
    assert first_wrong_node(*graphs[0]).node is None  # with the real rule every node matches


def test_explain_reports_frames_graphs_kernels_and_fallbacks():
    def fused(x, w):
        return torch.relu(x @ w + 1).sum(1)

    report = kiln.explain(fused, torch.randn(4, 8), torch.randn(8, 3))
    assert report.graph_count == 1 and len(report.frames) == 1
    graph = report.graphs[0]
    product = "aten.mm.out" if _torch.onednn_linear() is None else "mkldnn._linear_pointwise.default"
    assert graph.kernels == 1 and graph.externs == 1 and list(graph.extern_ops) == [product]
    assert "lower" in graph.stage_seconds and report.frames[0].eager_reason is None
    assert "1 kernels, 1 externs" in str(report)

    def prints(x):
        print("side effect", x * 2)  # a tensor's value printed: a graph break
        return x + 1

    report = kiln.explain(prints, torch.randn(3))
    assert report.graph_count == 2 and report.break_count == 1 and "print()" in report.breaks[0].reason
    assert not report.eager_frames and "graph break in" in str(report)

    def raises(x):
        try:
            raise KeyError("k")
        except KeyError:
            print("side effect", x * 2)  # inside an except clause: no break there, the frame runs eagerly
        return x + 1

    report = kiln.explain(raises, torch.randn(3))
    assert report.graph_count == 0 and "print()" in report.frames[0].eager_reason
    assert any("runs eagerly" in warning for warning in report.warnings)


def test_explain_leads_with_the_summary_and_ends_with_the_guards():
    def two_graphs(x, w):
        y = torch.relu(x @ w)
        print("side effect", y.sum())  # a graph break: two graphs, two frames with guards
        return y * 2

    report = kiln.explain(two_graphs, torch.randn(4, 8), torch.randn(8, 3))
    text = str(report)
    lines = text.splitlines()
    assert lines[0].startswith("kiln.explain: 2 graph(s), 1 graph break(s), ")
    assert f"{report.kernel_count} kernel(s), 0 graph(s) run eagerly" in lines[0] and report.kernel_count >= 2
    first_guard = next(number for number, line in enumerate(lines) if "guard function" in line)
    assert any("graph break in" in line for line in lines[:first_guard])
    assert sum("ATen nodes ->" in line for line in lines[:first_guard]) == 2
    tail = lines[first_guard:]  # the guard functions, and nothing else, come last
    assert sum(line.endswith("guard function:") for line in tail) == 2
    assert all(line.startswith("  ") or line.endswith("guard function:") for line in tail), tail
