"""Graph outputs carry exactly eager's strides (kiln/lowering/context.py `realize_as`).

torch.compile returns eager's strides, and code downstream can depend on them (a
`view`, a stride check, a custom kernel). The battery covers size-1 and 0-size dims,
permuted, expanded and sliced outputs, views of inputs and values computed in kernels,
on the C++ backend and on the Triton one (under the interpreter without a GPU).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
import kiln.testing
from kiln.backend import compile_graph

PROGRAMS = {
    "unsqueeze_input": lambda x: (x[:, None],),
    "unsqueeze_computed": lambda x: ((x + 1)[:, None, :],),
    "keepdim_sum": lambda x: (x.sum(1, keepdim=True),),
    "keepdim_amax_dim0": lambda x: (x.amax(0, keepdim=True),),
    "permuted_input": lambda x: (x.t(),),
    "permuted_computed": lambda x: ((x * 2).t()[None],),
    "pointwise_of_permuted": lambda x: (x.t() + 1,),
    "expanded_input": lambda x: (x[:1].expand(3, 8),),
    "expanded_computed": lambda x: ((x.sum(0) * 2).expand(5, 8),),
    "column_slice": lambda x: (x[:, 2:3],),
    "row_slice_computed": lambda x: ((x - 1)[1:2],),
    "empty_slice": lambda x: (x[:, :0],),
    "empty_computed": lambda x: ((x * 3)[:0].t(),),
    "diagonal": lambda x: (x[:4, :4].diagonal(),),
    "transpose_unsqueeze": lambda x: (x.unsqueeze(0).transpose(0, 2),),
    "reshape_of_permuted": lambda x: (x.t().reshape(2, 16) * 1.5,),
    "several": lambda x: (x.sum(0, keepdim=True), x[None, :, None], torch.exp(x).t()),
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_output_strides_match_eager(name, backend):
    fn = PROGRAMS[name]
    x = torch.randn(4, 8)
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x])
        got = compiled(x)
    assert compiled.extern_count == (1 if name == "diagonal" else 0)  # diagonal: ATen's view op
    _assert_same_strides(name, got, fn(x))


def _assert_same_strides(name, got, want):
    assert kiln.testing.compare(got, want), name
    for position, (out, expected) in enumerate(zip(got, want)):
        assert out.shape == expected.shape
        assert out.stride() == expected.stride(), f"{name} output {position}: {out.stride()} != {expected.stride()}"


def _compile_and_call(fn, inputs, backend):
    """`fn` compiled by kiln's backend (strict: no fallback) on `backend`, and its result on `inputs`."""
    with kiln.config.patch(strict=True, cpu_backend=backend):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), list(inputs))
        return compiled, compiled(*inputs)


@pytest.mark.parametrize("dynamic", [False, True])
def test_output_strides_match_eager_through_the_frontend(dynamic):
    # kiln.compile's own path (bytecode capture, guards), with shape-generic graphs too:
    # the strides are then sympy expressions of the sizes.
    names = ["unsqueeze_computed", "permuted_computed", "row_slice_computed", "expanded_computed", "several"]
    for name in names:
        fn = PROGRAMS[name]
        compiled = kiln.compile(fn, dynamic=dynamic)
        for rows in (4, 6):
            x = torch.randn(rows, 8)
            with kiln.config.patch(strict=True):
                _assert_same_strides(name, compiled(x), fn(x))


# aten.index's meta kernel ignores the index tensors' layout; eager's TensorIterator follows it
# (and the wrong meta spread downstream): fuzzer seed 101, programs 41, 1146 and 14 more.
INDEX_PROGRAMS = {
    "index_by_transposed_index": (lambda x, i: (x[i],), lambda: (torch.randn(11), torch.randint(0, 11, (7, 5)).t())),
    "pointwise_of_index": (lambda x, i: (torch.cos(x[i] * 2), x[i].amax(0, keepdim=True) / x[i]),
                           lambda: (torch.randn(11), torch.randint(-11, 11, (7, 5)).t())),
    "index_of_permuted_source": (lambda x, i: (x[i],),
                                 lambda: (torch.randn(13, 5, 4).permute(2, 0, 1), torch.randint(0, 4, (3,)))),
    "index_middle_dim": (lambda x, i: (x[:, i] + 1,), lambda: (torch.randn(4, 9, 6), torch.randint(0, 9, (6, 2)).t())),
    "index_then_view": (lambda x, i: (x[i][:, -1], x[i].transpose(0, 1)),
                        lambda: (torch.randn(11), torch.randint(0, 11, (7, 4)).t())),
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", sorted(INDEX_PROGRAMS))
def test_index_output_strides_match_eager(name, backend):
    fn, make_inputs = INDEX_PROGRAMS[name]
    inputs = make_inputs()
    compiled, got = _compile_and_call(fn, inputs, backend)
    assert compiled.extern_count == 0  # kiln's kernels computed every output
    _assert_same_strides(name, got, fn(*inputs))


# Functionalization turns `x.op_(...)` into `op(x, ...)`, laid out by op's rule (masked_fill_ is a
# `where` that follows the mask), where eager's x keeps its layout; logical_and/or/xor's meta kernels
# order dims by the first operand alone; aten.index's size-1 dims follow the indexer's reshape.
# Fuzzer seeds 3001 (#235, #693, #1102), 3002 (#139, #392, #403) and 3004 (#146).
EAGER_LAYOUT_PROGRAMS = {
    "masked_fill_on_transposed_view": (
        lambda x, m: (lambda v: (v.transpose(1, 2).masked_fill_(m, True), torch.isnan(x) < 2))(torch.isnan(x)),
        lambda: (torch.randn(2, 3, 2).permute(1, 2, 0), torch.rand(3, 2, 2) < 0.5)),
    "masked_fill_then_pointwise": (
        lambda x, m: (lambda v: (v, v < 2))(torch.isnan(x).transpose(1, 2).masked_fill_(m, True)),
        lambda: (torch.randn(2, 3, 2).permute(1, 2, 0), torch.rand(3, 2, 2) < 0.5)),
    "masked_fill_of_permuted_value": (
        lambda x, m: (lambda v: (v.masked_fill_(m, 0.5) * 2,))((x + 1).t()),
        lambda: (torch.randn(5, 4), torch.rand(4, 5) < 0.5)),
    "logical_and_broadcast_first": (lambda a, b: (torch.logical_and(a, b), torch.logical_or(a, b).float() + 1),
                                    lambda: (torch.randn(2), torch.randint(-4, 5, (4, 3, 2)).transpose(0, 1))),
    "logical_xor_0dim_first": (lambda a, b: (torch.logical_xor(a.amin(), b),),
                               lambda: (torch.randint(-3, 5, (16,)), torch.randn(8, 8, 11).transpose(0, 2))),
    # Broadcast pointwise ops: TensorIterator orders dims by size-1 dims' strides too, where the meta
    # kernels take the row-major fast path for "contiguous" operands (fuzz seed 3012 #5711, #7436).
    "where_broadcast_size1_dims": (lambda x, y, c: (torch.where(c > 2.0, c, x != y), x * c.t()),
                                   lambda: (torch.randn(1, 1, 2, 1).permute(3, 0, 1, 2), torch.randn(1, 1, 1),
                                            torch.randn(2, 1))),
    # An operand of another dtype is copied dense first (where: its own .to(); CPU TensorIterator: every input off
    # the common dtype), so a broadcast bool mask decides the layout, not the permuted float (fuzz seed 3117 #963).
    "where_of_a_broadcast_mask_cast_dense": (
        lambda x, y: (torch.where((x >= -1.5).expand(7, 2, 7, 4, 1), (x >= -1.5).expand(7, 2, 7, 4, 1), y),),
        lambda: (torch.randn(2, 1, 4, 1), torch.randn(1, 1, 4, 7).permute(1, 3, 2, 0))),
    "add_and_eq_of_a_broadcast_mask_cast_dense": (
        lambda x, y: (torch.add((x >= 0).expand(7, 2, 7, 4, 1), y), (x >= 0).expand(7, 2, 7, 4, 1) == y,
                      x.double().expand(7, 2, 7, 4, 1) + y),
        lambda: (torch.randn(2, 1, 4, 1), torch.randn(1, 1, 4, 7).permute(1, 3, 2, 0))),
    "index_after_size1_dim": (lambda x, i: ((x.t().unsqueeze(0) * 2.0)[:, i % 5],),
                              lambda: (torch.randn(7, 5), torch.randint(0, 5, (7, 16)).t())),
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", sorted(EAGER_LAYOUT_PROGRAMS))
def test_in_place_and_meta_layouts_match_eager(name, backend):
    fn, make_inputs = EAGER_LAYOUT_PROGRAMS[name]
    inputs = make_inputs()
    compiled, got = _compile_and_call(fn, inputs, backend)
    # One ATen call stays an Extern there today (not checked which); strict=True makes any compile failure raise.
    assert compiled.extern_count == (1 if name == "index_after_size1_dim" else 0)
    _assert_same_strides(name, got, fn(*inputs))


# A composite op is decomposed into ops that follow its input's layout, and its decomposition's
# `.contiguous()` was decided on the input's meta at trace time; eager's kernel lays the result
# out by its own rule (kiln/aot/strides.py COMPOSITE_LAYOUTS). Fuzzer seeds 3012 (#965: layer_norm
# of an index result that `_index_strides` made column-major) and 3009 (#6640: roll of a
# channels_last input); batch_norm of a transposed input was column-major.
_TRANSPOSED_INDEX = lambda: (torch.randn(3), torch.randint(0, 3, (7, 7)).t())  # noqa: E731
COMPOSITE_PROGRAMS = {
    "layer_norm_of_index": (lambda x, i: (F.layer_norm(x[(i - 1) % 3 - 3], (7,)),), _TRANSPOSED_INDEX),
    "softmax_of_index": (lambda x, i: (F.softmax(x[i], 0), x[i].log_softmax(-1)), _TRANSPOSED_INDEX),
    "rms_norm_of_index": (lambda x, i: (F.rms_norm(x[i], (7,)),), _TRANSPOSED_INDEX),
    "batch_norm_of_transposed": (lambda x: (F.batch_norm(x, torch.zeros(5), torch.ones(5)),),
                                 lambda: (torch.randn(5, 7).t(),)),
    "batch_norm_channels_last": (lambda x: (F.batch_norm(x, torch.zeros(3), torch.ones(3)) * 2,),
                                 lambda: (torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last),)),
    "roll_channels_last": (lambda x: (torch.roll(x, (1, 1), (0, 3)), x.roll(2), x.roll(1, dims=1)),
                           lambda: (torch.randn(5, 3, 3, 5).contiguous(memory_format=torch.channels_last),)),
    "roll_of_permuted": (lambda x: (torch.roll(x, 1, 0), torch.roll(x, 3)), lambda: (torch.randn(4, 5, 6).permute(2, 0, 1),)),
    # fuzz seed 3012 #8654: the roll's input a no-op `.contiguous()`, which no ATen node is traced from
    "roll_after_no_op_contiguous": (
        lambda x, y: (torch.roll(x.contiguous(memory_format=torch.channels_last), 2, 0) <= y,),
        lambda: (torch.randn(5, 5, 2, 6).contiguous(memory_format=torch.channels_last),
                 torch.randn(5, 5, 2, 1).contiguous(memory_format=torch.channels_last))),
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", sorted(COMPOSITE_PROGRAMS))
def test_composite_op_layouts_match_eager(name, backend):
    fn, make_inputs = COMPOSITE_PROGRAMS[name]
    inputs = make_inputs()
    _, got = _compile_and_call(fn, inputs, backend)
    _assert_same_strides(name, got, fn(*inputs))


# A program's `.contiguous()` or `.reshape()` copies or aliases by its input's layout. Decided in
# the trace on a meta layout that differs from eager's, it aliased where eager copied, and a later
# in-place write showed through the copy: wrong values, from torch.compile too. aten.index's meta
# is row-major whatever the index's layout (fuzz seed 3013 #4066); kiln/aot/decompositions.py
# `index` traces eager's layout.
def _written_after_contiguous(x, i):
    taken = x[i]
    copied = taken.contiguous()
    taken.relu_()
    return copied * 1, taken


def _written_after_reshape(x, i):
    taken = x[i]
    flat = taken.reshape(-1)
    taken.relu_()
    return flat * 1, taken


TRACE_LAYOUT_PROGRAMS = {
    "contiguous_of_index_then_written": _written_after_contiguous,
    "reshape_of_index_then_written": _written_after_reshape,
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", sorted(TRACE_LAYOUT_PROGRAMS))
def test_layout_dependent_copies_decided_on_eagers_layout(name, backend):
    fn = TRACE_LAYOUT_PROGRAMS[name]
    inputs = (torch.randn(6), torch.randint(0, 6, (8, 16)).t())
    compiled, got = _compile_and_call(fn, inputs, backend)
    assert compiled.extern_count == 0
    _assert_same_strides(name, got, fn(*inputs))


# Functionalization's `op(x, ...)` for `x.op_(...)` is laid out by op's rule, where eager's x keeps its
# layout, so the same copy-or-alias decision went wrong after an in-place write to a transposed value
# (torch.compile's aot_eager too). kiln/aot/strides.py `keep_written_layouts` traces such writes as
# `scratch.op_(...)` on a clone, copied back into x. Fuzz seed 3013 #6407 (minimized) is the stride half.
IN_PLACE_WRITES = {
    "masked_fill_": lambda v, y: v.masked_fill_(v > 0, 1.0),
    "scatter_": lambda v, y: v.scatter_(1, torch.zeros(16, 1, dtype=torch.long), y),
    "index_add_": lambda v, y: v.index_add_(0, torch.tensor([0, 2]), y[:2]),
    "tril_": lambda v, y: v.tril_(),
    "copysign_": lambda v, y: v.copysign_(y),
    "div_floor": lambda v, y: v.div_(y, rounding_mode="floor"),
    "addmm_": lambda v, y: v.addmm_(y, torch.ones(4, 4)),
    "masked_fill_then_cast": lambda v, y: v.masked_fill_(v < 0, 0.0).mul_(1),
}


@pytest.mark.parametrize("name", sorted(IN_PLACE_WRITES))
def test_in_place_writes_keep_the_written_layout_in_the_trace(name):
    write = IN_PLACE_WRITES[name]

    def program(x, y):
        value = x * 2
        write(value, y)
        scaled = value * 3
        copied = scaled.contiguous()
        scaled.add_(1)  # eager's copy does not see it
        return copied * 1, scaled, value.half().contiguous()

    x, y = torch.randn(4, 16).t(), torch.randn(16, 4)
    with kiln.config.patch(strict=True):
        got = kiln.compile(program)(x, y)
    _assert_same_strides(name, list(got), list(program(x, y)))


def test_in_place_writes_that_keep_their_layout_are_not_rewritten(monkeypatch):
    import kiln.aot
    counts = []
    original = kiln.aot.keep_written_layouts
    monkeypatch.setattr(kiln.aot, "keep_written_layouts", lambda gm: counts.append(original(gm)) or counts[-1])

    def program(x, y, z):
        value = x * 2
        value.relu_()
        value += y  # same layout
        value.mul_(z.sum())  # a 0-dim operand
        row = z * 1  # contiguous, and so is every operand
        row.masked_fill_(row > 0, 0.0)
        return value, row

    inputs = (torch.randn(4, 16).t(), torch.randn(4, 16).t(), torch.randn(3, 5))
    got = kiln.compile(program)(*inputs)
    _assert_same_strides("kept layouts", list(got), list(program(*inputs)))
    assert counts == [0]


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("sizes", [(1, -1, 4), (1, 1, -1, -1), (-1, 4)], ids=["one", "two", "none"])
def test_a_write_through_an_expand_that_broadcasts_nothing_is_a_plain_write(backend, sizes):
    # fuzz seed 4051 #2919: functionalization writes through an expand as base + sum_to(written - base), so an
    # inf written made the whole result NaN (torch.compile's aot_eager too) and float16's (x^2 + 2) - x^2 was
    # not 2. The expand only adds size-1 dims: kiln traces it as the unsqueeze it is.
    def program(x):
        squared = torch.square(x)
        view = squared.expand(*sizes)
        view.add_(2.0)
        return view.amin(tuple(range(view.dim())), True), squared * 1

    x = torch.tensor([[0.7896, float("-inf"), 3.0625, -5.3359]] * 3, dtype=torch.float16)
    x[1] = torch.randn(4, generator=torch.Generator().manual_seed(0)).half() * 30
    with kiln.config.patch(strict=True, cpu_backend=backend):
        got = kiln.compile(program)(x.clone())
    want = program(x.clone())
    for a, b in zip(got, want):
        assert torch.equal(a, b), (a, b)
