"""The Triton generator's launch configs: blocks that need no mask, 16-bit pointwise blocks, and the
tuner's candidates for kernels without masks (kiln/codegen/triton.py, kiln/codegen/tuning.py)."""
from __future__ import annotations

import types

import pytest
import torch

import kiln
import kiln.testing
from kiln.codegen.triton import generate_kernel
from kiln.codegen.tuning import candidate_configs
from tests.backend.test_pipeline import compiled_graphs


def _kernels(fn, *args):
    """(KernelSource, Kernel) of each kernel kiln generates for CUDA from `fn`'s graphs, after checking the
    compiled result (run by the Triton interpreter) against eager."""
    with kiln.config.patch(cpu_backend="triton", graph_cache=False):
        result, graphs = compiled_graphs(fn, *args)
    verdict = kiln.testing.compare(result, fn(*args), fn(*kiln.testing.to_float64(args)))
    assert verdict, verdict.message
    return [(generate_kernel(kernel, graph.scheduled.graph, "cuda"), kernel)
            for graph in graphs for kernel in graph.scheduled.kernels]


def test_a_pointwise_kernel_whose_blocks_divide_its_size_has_no_row_mask():
    (full, _), = _kernels(lambda x: torch.sin(x) * 2, torch.randn(4096))
    assert full.full_rows and "xmask = tl.full([XBLOCK], True, tl.int1)" in full.source
    (ragged, _), = _kernels(lambda x: torch.sin(x) * 2, torch.randn(1000))
    assert not ragged.full_rows and "xmask = xindex < xnumel" in ragged.source


def test_a_persistent_row_of_a_power_of_two_has_no_column_mask():
    (full, _), = _kernels(lambda x: torch.softmax(x, -1), torch.randn(8, 256))
    assert full.full_rows and full.full_columns and "rmask = tl.full([1, RBLOCK], True, tl.int1)" in full.source
    (ragged, _), = _kernels(lambda x: torch.softmax(x, -1), torch.randn(7, 100))
    assert not ragged.full_columns and "rmask = rindex < rnumel" in ragged.source


@pytest.mark.parametrize("dtype, xblock", [(torch.bfloat16, 2048), (torch.float16, 2048), (torch.float32, 1024)])
def test_a_pointwise_kernel_takes_32_bytes_of_each_buffer_per_thread(dtype, xblock):
    (source, _), = _kernels(lambda x, b: torch.nn.functional.gelu(x + b),
                            torch.randn(16, 1024).to(dtype), torch.randn(1024).to(dtype))
    assert (source.xblock, source.num_warps) == (xblock, 4)


def test_rows_of_4096_take_4_warps():
    (source, _), = _kernels(lambda x: torch.softmax(x, -1), torch.randn(2, 4096).to(torch.bfloat16))
    assert (source.xblock, source.rblock, source.num_warps) == (1, 4096, 4)


def test_the_tuner_offers_a_kernel_without_masks_only_blocks_that_divide_it():
    (pointwise, kernel), = _kernels(lambda x: torch.sin(x) * 2, torch.randn(3 * 1024))
    blocks = {xblock for xblock, _, _ in candidate_configs(pointwise, kernel)}
    assert 1024 in blocks and 2048 not in blocks and all(3 * 1024 % xblock == 0 for xblock in blocks)
    (rows, kernel), = _kernels(lambda x: torch.softmax(x, -1), torch.randn(12, 256))
    assert (rows.xblock, rows.full_rows) == (4, True)
    configs = candidate_configs(rows, kernel)
    assert {xblock for xblock, _, _ in configs} == {1, 2, 4} and {rblock for _, rblock, _ in configs} == {256}
    # the same kernel with its masks may take any of them
    masked = types.SimpleNamespace(**{**rows.__dict__, "full_rows": False, "full_columns": False})
    assert 8 in {xblock for xblock, _, _ in candidate_configs(masked, kernel)}
