"""`kiln.compile(DDP(model))`: DDP's forward runs as it is, the model inside is compiled.

One process (world size 1, gloo over an in-memory store): what is checked is that the
wrapper compiles the model, gives eager DDP's outputs and gradients, and leaves the module
as it found it. Several processes need several GPUs or hosts, which CI does not have.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

import kiln
from kiln.debug.explain import ExplainReport, _recording

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")


@pytest.fixture
def process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def test_ddp_model_is_compiled_and_matches_eager_ddp(process_group):
    eager_model = _model()
    compiled_model = copy.deepcopy(eager_model)
    eager = torch.nn.parallel.DistributedDataParallel(eager_model)
    ddp = torch.nn.parallel.DistributedDataParallel(compiled_model)
    compiled = kiln.compile(ddp, backend="aot_eager")
    report = ExplainReport()
    for step in range(2):
        x = torch.randn(5, 8)
        expected = eager(x)
        expected.square().sum().backward()
        with _recording(report):
            actual = compiled(x)
        actual.square().sum().backward()
        torch.testing.assert_close(actual, expected)
        for mine, theirs in zip(compiled_model.parameters(), eager_model.parameters()):
            torch.testing.assert_close(mine.grad, theirs.grad)
    assert report.frames and not report.eager_frames and not report.breaks
    assert all(entry.graph_module is not None for entry in compiled._compiled_call.entries)
    assert "forward" not in compiled_model.__dict__  # the module is left as it was
    # torch.compile's key layout (`_orig_mod.` first), which torch.distributed.checkpoint relies on
    assert compiled.state_dict().keys() == torch.compile(ddp, backend="eager").state_dict().keys()
