"""Products laid out for cuBLAS's aligned kernels (kiln/lowering/matmul.py).

On CUDA, a half-precision product whose N is not a multiple of 8 runs with N padded: the
second operand is written with zero columns added and the output read back at N columns.
The values must not change; these tests run the same lowering on the CPU (with the C++
backend) by letting it pad there too.
"""
from __future__ import annotations

import pytest
import torch

import kiln

from kiln.lowering import matmul
from tests.backend.test_pipeline import assert_matches


@pytest.fixture
def pad_on_cpu(monkeypatch):
    monkeypatch.setattr(matmul, "PAD_DEVICE_TYPES", ("cuda", "cpu"))
    # These tests read the padded layouts in the wrapper's allocations, which CUDA graphs have;
    # on the CPU they would be views of the scratch block (kiln/runtime/scratch.py) instead.
    with kiln.config.patch(cpu_scratch_arena=False):
        yield


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_product_with_odd_columns_is_padded_and_exact(pad_on_cpu, dtype):
    hidden, weight = torch.randn(300, 64, dtype=dtype), torch.randn(1003, 64, dtype=dtype)
    fn = lambda h, w: torch.nn.functional.linear(h, w) * 2  # noqa: E731
    (graph,) = assert_matches(fn, hidden, weight)
    wrapper = graph.module_source.wrapper
    assert "(300, 1008, ), (1008, 1, )" in wrapper  # the product's output has N = 1008 columns
    assert "(1008, 64, ), (64, 1, )" in wrapper  # the padded operand


def test_autocast_weight_cast_and_padding_are_one_kernel(pad_on_cpu):
    hidden, weight = torch.randn(300, 64), torch.randn(1003, 64)

    def fn(h, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.nn.functional.linear(h, w).float()

    (graph,) = assert_matches(fn, hidden, weight)
    assert graph.module_source.wrapper.count("(1008, 64, ), (64, 1, )") == 1


def test_small_or_aligned_products_are_not_padded(pad_on_cpu):
    for rows, columns in ((300, 1024), (16, 1003)):
        hidden, weight = torch.randn(rows, 64, dtype=torch.bfloat16), torch.randn(columns, 64, dtype=torch.bfloat16)
        (graph,) = assert_matches(lambda h, w: torch.nn.functional.linear(h, w), hidden, weight)
        assert "1008" not in graph.module_source.wrapper and "1024, 64" not in graph.module_source.wrapper
