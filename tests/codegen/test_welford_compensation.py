"""config.welford_compensation (kiln/codegen/triton.py): a looped welford's per-lane mean and m2 with Kahan's
compensation (the default) or plain updates, both close to eager's var_mean on a long channels-last row."""
from __future__ import annotations

import pytest
import torch

import kiln
from tests.golden.capture import record_graphs


@pytest.mark.parametrize("compensation", [True, False])
def test_a_looped_welford_with_and_without_compensation_matches_eager(compensation):
    x = (torch.randn(4, 8, 40, 40, generator=torch.Generator().manual_seed(0)) * 3 + 100).to(
        memory_format=torch.channels_last)

    def program(x):
        return torch.var_mean(x, dim=(0, 2, 3), correction=0)

    kiln.reset()
    with record_graphs("triton") as graphs, torch.no_grad(), \
            kiln.config.patch(welford_compensation=compensation, strict=True, graph_cache=False):
        got = kiln.compile(program)(x)
    sources = "\n".join(text for graph in graphs for name, text in graph.files.items() if name.startswith("kernel_"))
    assert "for roffset" in sources and "_delta =" in sources  # a looped welford
    assert ("_cmean = tl.where(" in sources) == compensation  # the compensation's update
    exact = program(x.double())
    for value, want, ref in zip(got, program(x), exact):
        verdict = kiln.testing.compare(value, want, ref)
        assert verdict.ok, verdict.message
