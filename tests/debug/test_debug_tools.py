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
            print("side effect", x * 2)  # inside a try block: no break there, the frame runs eagerly
        finally:
            pass
        return x + 1

    report = kiln.explain(raises, torch.randn(3))
    assert report.graph_count == 0 and "print()" in report.frames[0].eager_reason
    assert any("runs eagerly" in warning for warning in report.warnings)
