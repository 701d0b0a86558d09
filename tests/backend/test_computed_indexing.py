"""Indexing with tensors the graph computes (argsort, topk, nonzero, arange arithmetic, masks), on both CPU
backends, against eager.

Each program is called on a first shape (a static graph) and then on a second (the recompile makes the
sizes symbolic), so that both the specialized and the symbolic index arithmetic are checked. The corpus
came from adversarial probing (2026-12-05); the programs that were once wrong say what was wrong.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.testing


@pytest.fixture(autouse=True, params=["cpp", "triton"])
def cpu_backend(request):
    """Every test here runs on both CPU backends: C++ and the Triton interpreter."""
    with kiln.config.patch(cpu_backend=request.param):
        yield request.param


def _roll_by_half(x):
    # The shift is a size expression, -(s0 // 2) mod s0 after the recompile: C++ and Triton's `%` truncate,
    # so it once printed as a negative shift and every index fell outside [0, s0) (an IndexError).
    return torch.roll(x * 2, shifts=x.shape[0] // 2, dims=0)


PROGRAMS = {
    "roll_by_half_the_size": _roll_by_half,
    "argsort_rows": lambda x: x[x.argsort(dim=0)] * 2,
    "topk_indices": lambda x: x.flatten()[x.flatten().topk(3).indices] + 1,
    "nonzero_rows": lambda x: x[(x > 0).nonzero()[:, 0]] + 1,
    "negative_arange": lambda x: x[torch.arange(x.shape[0]) - x.shape[0]] * 3,
    "negative_flipped": lambda x: x[-(torch.arange(3) + 1)] + x[(-(torch.arange(3) + 1)).flip(0)],
    "index_select_computed": lambda x: torch.index_select(x, 0, (x[:, 0] * 10).long().abs() % x.shape[0]) + 1,
    "gather_argsort": lambda x: torch.gather(x, 1, x.argsort(1)) * 2,
    "gather_flipped_argsort": lambda x: x.gather(1, x.argsort(1).flip(1)) - x,
    "scatter_argsort": lambda x: torch.zeros_like(x).scatter(1, x.argsort(1), x + 1),
    "scatter_add_duplicates": lambda x: torch.zeros(x.shape[0], 2).scatter_add(1, (x.abs() * 3).long() % 2, x * 2),
    "scatter_reduce_amax": lambda x: torch.zeros(x.shape[0], 2).scatter_reduce(
        1, (x.abs() * 3).long() % 2, x, "amax", include_self=False),
    "index_put_accumulate": lambda x: torch.zeros(3, x.shape[1]).index_put_(
        (torch.arange(x.shape[0]) % 2,), x + 1, accumulate=True),
    "index_copy_argsort": lambda x: torch.zeros_like(x).index_copy(0, x[:, 0].argsort(), x * 2),
    "mask_rows": lambda x: x[x.sum(1) > 0] * 2,
    "masked_fill_cumsum": lambda x: x.masked_fill(x.cumsum(1) < 0, 5.0) + 1,
    "masked_scatter": lambda x: torch.zeros_like(x).masked_scatter(x > 0, x * 3),
    "where_cumsum": lambda x: torch.where(x.cumsum(0) > 0, x, -x) + 1,
    "take_argsort": lambda x: torch.take(x * 2, x.flatten().argsort()[:4]),
    "take_negative": lambda x: torch.take(x + 1, torch.arange(4) - 4),
    "take_along_argmax": lambda x: torch.take_along_dim(x + 1, x.argmax(1, keepdim=True), dim=1),
    "embedding_argmax": lambda x: F.embedding(x.argmax(1) % 5, torch.arange(20.).reshape(5, 4)) + 1,
    "broadcast_two_indices": lambda x: x[torch.arange(x.shape[0])[:, None], x.argsort(1)[:, :2]] * 2,
    "argmax_with_arange": lambda x: (x + 1)[x.argmax(0), torch.arange(x.shape[1])],
    "diagonal_by_arange": lambda x: x[torch.arange(min(x.shape)), torch.arange(min(x.shape))] * 2,
    "zero_dim_computed_index": lambda x: x[x.sum().long().abs() % x.shape[0]] + 1,
    "bool_scalar_mask": lambda x: x[x.sum() > 0] + 1,
    "slice_by_sizes": lambda x: x[x.size(0) // 2:, : x.size(1) - 1] * 2,
    "none_axes": lambda x: (x * 2)[..., None] + x[:, None, :],
    "unfold_computed": lambda x: (x * 2).unfold(1, 2, 1).sum(-1),
    "as_strided_computed": lambda x: (x * 2 + 1).as_strided((2, 2), (1, 2), 1),
    "index_after_transpose": lambda x: (x + 1).t()[x.argmax(1) % x.shape[1]],
    "index_after_expand": lambda x: x[:1].expand(4, -1)[torch.tensor([3, 0, 2])] * 2,
    "repeat_interleave_computed": lambda x: torch.repeat_interleave(x, (x[:, 0] > 0).long() + 1, dim=0) + 1,
    "searchsorted_sorted": lambda x: torch.searchsorted(x.flatten().sort().values, x * 0.5),
    "gather_cumsum_clamped": lambda x: x.gather(0, ((x > 0).long().cumsum(0) - 1).clamp(min=0)),
    "one_hot_argmax": lambda x: F.one_hot(x.argmax(1), 6).float() * 2,
}


def _setitem_argmax(x):
    y = x.clone()
    y[x.argmax(0)] = -1.0
    return y * 2


def _setitem_duplicates(x):
    y = x.clone()
    y[torch.tensor([0, 0, 1])] = torch.arange(3.)[:, None].expand(3, x.shape[1])
    return y


def _add_through_view_index(x):
    y = x.clone()
    y[:, 1:][torch.tensor([0, 2])] += 5
    return y


PROGRAMS.update({"setitem_argmax": _setitem_argmax, "setitem_duplicates": _setitem_duplicates,
                 "add_through_view_index": _add_through_view_index})


PROGRAMS.update({
    "roll_two_dims": lambda x: torch.roll(x + 1, shifts=(-(x.shape[0] // 3), x.shape[1] - 1), dims=(0, 1)),
    "roll_flattened": lambda x: torch.roll(x + 1, shifts=x.shape[1] + 1),
    "circular_pad": lambda x: F.pad(x[None] * 2, (1, 2), mode="circular")[0],
    "reflect_pad": lambda x: F.pad(x[None] * 2, (2, 1), mode="reflect")[0],
    "remainder_of_negative_arange": lambda x: x[torch.remainder(torch.arange(x.shape[0]) - x.shape[0] // 2 - 1,
                                                                 x.shape[0])],
    "floor_divided_negative_arange": lambda x: x[torch.div(torch.arange(x.shape[0]) - 3, 2, rounding_mode="floor")],
    "negative_slice_by_sizes": lambda x: x[-(x.shape[0] // 2):, : -(x.shape[1] // 2) or None] * 2,
    "transposed_permutation": lambda x: x.reshape(-1)[
        torch.arange(x.numel()).reshape(x.shape[1], x.shape[0]).t().reshape(-1)],
    "tril_indices": lambda x: x[tuple(torch.tril_indices(x.shape[0], x.shape[1], -1))],
    "cross_entropy_computed_targets": lambda x: F.cross_entropy(x, x.argmax(1).flip(0) % x.shape[1]),
    "cummax_gather": lambda x: x.gather(1, x.cummax(1).indices) + x.cummax(1).values,
    "int32_index": lambda x: x[x.argsort(0)[:, 0].int()] * 2,
    "index_beyond_int32_then_back": lambda x: x[:, (x.argmax(1) + 2 ** 33) - 2 ** 33],
    "half_gather": lambda x: x.half().gather(1, x.argsort(1)).float(),
    "bfloat16_index_add": lambda x: torch.zeros(3, x.shape[1], dtype=torch.bfloat16).index_add_(
        0, torch.arange(x.shape[0]) % 3, x.bfloat16()),
    "int64_scatter_add": lambda x: torch.zeros(x.shape[0], 3, dtype=torch.int64).scatter_add(
        1, (x.abs() * 5).long() % 3, (x * 10).long()),
    "index_3d_slice_between": lambda x: (x.reshape(x.shape[0], 1, x.shape[1]).expand(-1, 2, -1) * 1)[
        x.argmax(1) % x.shape[0], :, torch.arange(x.shape[0]) % x.shape[1]],
    "ellipsis_then_index": lambda x: (x[None] * 2)[..., x[0].argsort()],
    "embedding_bag_sum": lambda x: F.embedding_bag(x.argsort(1)[:, :2] % 5, torch.arange(20.).reshape(5, 4),
                                                   mode="sum"),
    "index_reduce_prod": lambda x: torch.ones(3, x.shape[1]).index_reduce_(
        0, torch.arange(x.shape[0]) % 3, x, "prod", include_self=False),
})


def _write_through_argmax(x):
    x[x.argmax(0) % x.shape[0]] = x[0].clone()
    return x


INPUT_WRITES = {
    "index_add_": lambda x: (x.index_add_(0, x[:, 0].argsort(), torch.ones_like(x)), x.sum(1))[1],
    "index_put_accumulate": lambda x: x.index_put_((x.argmax(1) % x.shape[0],), torch.ones(x.shape[0], x.shape[1]),
                                                   accumulate=True) * 1,
    "mask_setitem": lambda x: (x.__setitem__(x > 0, 0.5), x + 1)[1],
    "transposed_setitem": lambda x: (x.t().__setitem__(x.argmax(0) % x.shape[1], 7.0), x)[1],
    "scatter_": lambda x: x.scatter_(1, x.argsort(1)[:, :1], -1.0),
    "scatter_add_into_a_view": lambda x: (x[1:].scatter_add_(1, torch.zeros(x.shape[0] - 1, 1, dtype=torch.long),
                                                              x[:-1, :1].clone()), x)[1],
    "masked_fill_a_view": lambda x: (x[:, 1:].masked_fill_(x[:, :-1] > 0, 9.0), x)[1],
    "setitem_from_itself": _write_through_argmax,
    "scatter_into_the_transpose": lambda x: (x.t().scatter_(1, x.argsort(0).t()[:, :1], 5.0), x)[1],
}


@pytest.mark.parametrize("name", list(INPUT_WRITES))
def test_computed_index_writes_into_inputs_match_eager(name):
    program = INPUT_WRITES[name]
    compiled = kiln.compile(program)
    for shape in [(5, 4), (6, 3)]:
        x = torch.randn(*shape)
        eager_input, compiled_input = x.clone(), x.clone()
        expected = program(eager_input)
        actual = compiled(compiled_input)
        verdict = kiln.testing.compare(actual, expected)
        assert verdict, (name, shape, verdict.message)
        assert torch.equal(compiled_input, eager_input), (name, shape)


PROGRAMS.update({
    "mask_then_sliced": lambda x: x[x.sum(1) > -100, 1:] * 2,
    "chained_argsort_indices": lambda x: x[x[:, 0].argsort()][:, x[0].argsort()],
    "int_slice_and_tensor": lambda x: x[1:, x[0].argsort()[:2]] + x[0, 0],
    "permuted_expand_index": lambda x: x.reshape(x.shape[0], x.shape[1], 1).expand(-1, -1, 2).permute(2, 0, 1)[
        :, x.argmax(1) % x.shape[0]] * 1,
    "negative_stride_view_index": lambda x: x.flip(0)[::2][torch.arange(x.flip(0)[::2].shape[0]).flip(0)] * 2,
    "where_broadcast_argmax": lambda x: torch.where(x.argmax(1, keepdim=True) == torch.arange(x.shape[1]), x,
                                                    torch.zeros(())),
    "scatter_reduce_mean": lambda x: torch.zeros(x.shape[0], 2).scatter_reduce(
        1, (x.abs() * 3).long() % 2, x, "mean", include_self=True),
    "index_add_alpha": lambda x: torch.zeros(2, x.shape[1]).index_add(0, torch.arange(x.shape[0]) % 2, x, alpha=-2.5),
    "unfold_then_index": lambda x: x.unfold(0, 2, 1)[x[:-1, 0].argsort()] * 1,
    "negative_pad": lambda x: F.pad(x, (-1, 1, 1, -1)) * 2,
    "pad_by_a_size": lambda x: F.pad(x, (x.shape[0] // 2, 0)) + 1,
    "select_scatter_last": lambda x: torch.select_scatter(x, x[0] * 2, 0, x.shape[0] - 1),
    "slice_scatter_by_size": lambda x: torch.slice_scatter(x, x[:2] * 3, 0, x.shape[0] - 2),
    "expand_then_scatter": lambda x: x[:1].expand(x.shape[0], -1).scatter(1, x.argsort(1), 3.0),
    "narrow_negative_start": lambda x: x.narrow(0, -2, 2) * 3,
    "roll_negative_size_shift": lambda x: torch.roll(x * 2, shifts=-(x.shape[1] // 2 + 1), dims=1),
    "roll_beyond_the_size": lambda x: torch.roll(x * 2, shifts=3 * x.shape[0] + 1, dims=0),
    "triu_negative_size_diagonal": lambda x: torch.triu(x, diagonal=-(x.shape[0] // 2)),
    "diagonal_negative_size_offset": lambda x: torch.diagonal(x, offset=-(x.shape[0] // 3)) * 2,
    "repeat_then_index": lambda x: x.repeat(2, x.shape[0] // 2)[x.argmax(1) % x.shape[0]],
    "nearest_upsample": lambda x: F.interpolate(x[None], scale_factor=2, mode="nearest")[0],
    "max_pool_indices_gather": lambda x: x.flatten()[(F.max_pool1d(x[None], 2, return_indices=True)[1][0]
                                                      + torch.arange(x.shape[0])[:, None] * x.shape[1]).flatten()],
})


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_computed_indices_match_eager(name):
    program = PROGRAMS[name]
    compiled = kiln.compile(program)
    for shape in [(5, 4), (6, 3)]:
        x = torch.randn(*shape)
        expected = program(x.clone())
        actual = compiled(x.clone())
        assert actual.shape == expected.shape and actual.dtype == expected.dtype, (name, shape)
        verdict = kiln.testing.compare(actual, expected)
        assert verdict, (name, shape, verdict.message)


AS_STRIDED_OF_INPUTS = {
    # Once wrong: the kernel counted as_strided's storage_offset from the input's first element, not from its
    # storage's (`base[3:].as_strided(..., 0)` read base[3] on), and one graph served every offset
    "default_offset": lambda x: x.as_strided((2, 2), (1, 2)) * 2,
    "offset_zero": lambda x: x.as_strided((2, 2), (1, 2), 0) * 2,
    "offset_read_from_the_input": lambda x: (x * 1).as_strided((2, 2), (1, 2), 1) + x.as_strided(
        (2,), (2,), x.storage_offset() + 1),
    "of_a_flattened_view": lambda x: x.view(-1).as_strided((2, 2), (1, 2), 1) * 2,
    "offset_of_a_slice": lambda x: x * x[1:].storage_offset(),
}


@pytest.mark.parametrize("name", list(AS_STRIDED_OF_INPUTS))
def test_as_strided_of_inputs_at_storage_offsets(name):
    program = AS_STRIDED_OF_INPUTS[name]
    compiled = kiln.compile(program)
    base = torch.arange(20.)
    for start in [0, 1, 3, 2]:
        assert torch.equal(compiled(base[start:]), program(base[start:])), (name, start)
