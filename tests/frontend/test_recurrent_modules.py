"""torch.nn.LSTM / GRU / RNN inside a compiled module: kiln breaks the graph around the recurrent call (their fused
kernels take flat weight lists kiln does not trace), so the projection before and the head after are captured and
no frame runs eagerly; results and a few training steps match eager (checked 2026-12-05)."""
from __future__ import annotations

import copy

import pytest
import torch

import kiln
from kiln.debug.explain import explain


class _Tagger(torch.nn.Module):
    def __init__(self, recurrent: type):
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.rnn = recurrent(8, 6, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x):
        hidden = torch.relu(self.embed(x))
        out, _ = self.rnn(hidden)
        return self.head(out[:, -1])


@pytest.mark.parametrize("recurrent", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
def test_recurrent_module_breaks_around_its_call(recurrent):
    torch.manual_seed(0)
    model, x = _Tagger(recurrent), torch.randn(2, 5, 4)
    report = explain(copy.deepcopy(model), x)
    assert report.graph_count == 2 and report.break_count == 1 and not report.eager_frames, str(report)
    assert "recurrent" in report.breaks[0].reason

    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(copy.deepcopy(model), backend="aot_eager")(x), model(x))

    reference, trained = copy.deepcopy(model), copy.deepcopy(model)
    compiled = kiln.compile(trained, backend="aot_eager")
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (reference, trained)]
    for _ in range(2):
        for run, optimizer in zip((reference, compiled), optimizers):
            run(x).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    for want, got in zip(reference.parameters(), trained.parameters()):
        torch.testing.assert_close(got, want)
