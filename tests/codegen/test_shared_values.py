"""A Triton kernel without loops computes each value once for all its nodes (kiln/codegen/triton.py `_define`);
a kernel with a column loop keeps each loop's own values."""
from __future__ import annotations

import torch

from tests.codegen.test_launch_configs import _kernels


def test_a_persistent_softmax_loads_its_row_once():
    """Its max, its sum of exponentials and its output pass are three nodes: the row is read once, the
    exponentials computed once."""
    (source, kernel), = _kernels(lambda x: torch.softmax(x, -1), torch.randn(8, 512))
    assert kernel.persistent and len(kernel.nodes) == 3
    assert source.source.count("tl.load(") == 1, source.source
    assert source.source.count("libdevice.exp(") == 1, source.source


def test_a_layer_norm_after_a_residual_add_adds_once():
    def fn(x, residual, weight, bias):
        return torch.nn.functional.layer_norm(x + residual, (256,), weight, bias)

    (source, _), = _kernels(fn, torch.randn(16, 256), torch.randn(16, 256), torch.randn(256), torch.randn(256))
    assert source.source.count("tl.load(ptr0 ") == 1 and source.source.count("tl.load(ptr1 ") == 1, source.source


def test_a_looped_reduction_reads_its_row_in_each_loop():
    (source, kernel), = _kernels(lambda x: torch.softmax(x, -1), torch.randn(2, 16384))
    assert not kernel.persistent
    assert source.source.count("for roffset in range(") >= 2 and source.source.count("tl.load(") >= 2, source.source
