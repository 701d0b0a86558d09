"""Indexing lowerings (kiln/lowering/indexing.py) against eager, on both CPU backends.

Every gather (aten.index, index_select, gather, embedding) follows eager's rules, decided once in
lowering (`_gathered_position`) and rendered by each backend from one LoopIR op (`check_index`):
advanced indexing wraps negative indices, the others do not, and any index outside its range
raises IndexError (eager raises IndexError or RuntimeError) instead of reading other memory.
`test_generated_gathers` checks the cross product of computed sources (pad, cat, stack, flip,
permute, slice with a step, expand, reshape), gather kinds and index kinds (positive, negative,
computed, wrapped), in range and out of it.
"""
from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F

import kiln
import kiln.testing
from kiln.aot import aot_compile
from kiln.backend import compile_aten_graph

GATHER_OPS = ("aten.index.Tensor", "aten.index_select.default", "aten.gather.default", "aten.embedding.default")


@pytest.fixture(autouse=True, params=["cpp", "triton"])
def cpu_backend(request):
    """Every test here runs on both CPU backends: C++ and the Triton interpreter."""
    with kiln.config.patch(cpu_backend=request.param):
        yield request.param


def _compile(fn, *inputs, kernels: bool = True):
    """`fn` compiled by kiln (strict: no eager fallback); asserts every gather was lowered (and, with
    `kernels`, that the graph runs kernels: an empty result runs none)."""
    graphs = []

    def record(aten_gm, aten_inputs):
        graphs.append(compile_aten_graph(aten_gm, aten_inputs))
        return graphs[-1]

    with kiln.config.patch(strict=True):
        compiled = aot_compile(torch.fx.symbolic_trace(fn), list(inputs), record)
    assert graphs and all(graph.kernel_count >= 1 or not kernels for graph in graphs)
    for graph in graphs:
        loopir = graph.scheduled.graph
        assert not set(GATHER_OPS) & set(loopir.extern_ops), loopir.extern_ops  # lowered, not ATen calls
    return compiled


def _check(fn, *inputs, kernels: bool = True):
    compiled = _compile(fn, *inputs, kernels=kernels)
    with kiln.config.patch(strict=True):
        result = compiled(*inputs)
    verdict = kiln.testing.compare(result, fn(*inputs), fn(*kiln.testing.to_float64(inputs)))
    assert verdict, verdict.message
    return compiled


def test_gather_with_an_empty_index_of_higher_rank():
    # torch skips the rank check for an empty index; the load's index had 2 dims for a 1-d input
    _check(lambda x, index: (torch.gather(x, 0, index),), torch.randn(5), torch.zeros(2, 0, dtype=torch.int64),
           kernels=False)


def test_gather_negative_dim():
    _check(lambda x, index: (torch.gather(x, -1, index),), torch.randn(3, 5), torch.randint(0, 5, (3, 4)))


# ---- a computed tensor indexed at computed positions (one body inlined into another) ----------------

ROWS = torch.arange(1., 13.).view(3, 4)
POSITIONS = torch.tensor([0, 1, 2, 3])


@pytest.mark.parametrize("fn", [
    lambda x, i: (F.pad(x, (0, 0, 2, 1))[i + 1],),
    lambda x, i: (torch.index_select(F.pad(x, (1, 1)), 1, i + 1),),
    lambda x, i: (torch.cat([x, 2 * x], 0)[i + 1],),
    lambda x, i: (torch.index_select(torch.cat([x, 2 * x], 1), 1, i * 2 - 1 + 2),),
    lambda x, i: (torch.stack([x, 2 * x], 0).reshape(6, 4)[i + 1],),
    lambda x, i: (torch.cat([x, 2 * x], 0)[i - 5],),
], ids=["pad-index", "pad-index_select", "cat-index", "cat-index_select", "stack-index", "cat-negative"])
def test_a_padded_or_concatenated_tensor_at_computed_indices(fn):
    # Inlining the pad (or cat) into the gather renumbers its values; the pad's range test read the
    # "index < 0" flag of the negative wrap instead of the wrapped index (C++: all-zero rows; Triton:
    # a row read from outside the tensor), or a stale number made the C++ check raise on valid indices.
    _check(fn, ROWS, POSITIONS)


def test_a_gather_through_two_inlined_producers():
    # Both the index (i + 1) and the gathered tensor (a cat of a product) are inlined into the gather.
    _check(lambda x, i: (torch.cat([x, x * 3], 0)[(i * 2) % 6 - 6] + 1,), torch.randn(3, 5), torch.randint(0, 9, (7,)))


# ---- out-of-range indices raise, on every backend -----------------------------------------------------

OUT_OF_RANGE = [
    ("index past the end", lambda x, i: (x[i],), torch.tensor([0, 3])),
    ("index before the start", lambda x, i: (x[i],), torch.tensor([0, -4])),
    ("index_select negative", lambda x, i: (torch.index_select(x, 1, i),), torch.tensor([0, -1])),
    ("gather negative", lambda x, i: (torch.gather(x, 1, i.view(1, 2).expand(3, 2)),), torch.tensor([0, -1])),
    ("embedding negative", lambda x, i: (F.embedding(i.view(1, 2), x),), torch.tensor([0, -1])),
    ("embedding past the end", lambda x, i: (F.embedding(i, x) * 2,), torch.tensor([0, 3])),
    # the expanded dim is read at position 0 whatever the index: no address is out of bounds
    ("index of an expanded dim", lambda x, i: (x[:1].expand(5, 4)[i],), torch.tensor([0, 5])),
    # a position past a reshaped row lands inside the buffer, in the next row
    ("index of a reshaped dim", lambda x, i: ((x * 2).view(2, 6)[:, i],), torch.tensor([0, 6])),
    # the pad's mask would read 0 there
    ("index of a padded tensor", lambda x, i: (F.pad(x, (0, 0, 1, 1))[i],), torch.tensor([0, 5])),
    ("computed index of a cat", lambda x, i: (torch.cat([x, x * 2])[i + 1],), torch.tensor([0, 5])),
    ("a checked index no load reads, then reduced", lambda x, i: (x[:1].expand(5, 4)[i].sum(1),), torch.tensor([5])),
]


@pytest.mark.parametrize("name, fn, index", OUT_OF_RANGE, ids=[case[0] for case in OUT_OF_RANGE])
def test_an_out_of_range_index_raises(name, fn, index):
    x = torch.randn(3, 4)
    with pytest.raises((IndexError, RuntimeError)):
        fn(x, index)  # eager raises too
    compiled = _compile(fn, x, index)
    with pytest.raises(IndexError, match="out of range"):
        compiled(x, index)
    good = index.clamp(0, 2)  # the same graph stays usable, and right, after the error
    verdict = kiln.testing.compare(compiled(x, good), fn(x, good))
    assert verdict, verdict.message


def test_negative_indices_wrap_in_advanced_indexing():
    x = torch.randn(3, 4)
    _check(lambda x, i: (x[i], x[:, i]), x, torch.tensor([-1, -3, 2]))


VIEWED_INDICES = [
    ("transposed", lambda x, i: (x[i.view(2, 3).t()],)),
    ("sliced with a step", lambda x, i: (x[i[::2] - 1],)),
    ("flipped", lambda x, i: (torch.index_select(x, 0, i.flip(0)),)),
    ("expanded", lambda x, i: (torch.gather(x, 1, i[:4].view(1, 4).expand(5, 4) % 4),)),
    ("two broadcast index tensors", lambda x, i: (x[i.view(6, 1) - 2, i[:4] % 4],)),
    ("index tensors apart, a slice between", lambda x, i: (x.view(5, 2, 2)[i, :, i % 2 - 2],)),
    ("int32 and bfloat16", lambda x, i: (F.embedding(i.int().view(3, 2), x.bfloat16()),)),
]


@pytest.mark.parametrize("name, fn", VIEWED_INDICES, ids=[case[0] for case in VIEWED_INDICES])
def test_views_of_the_index_tensor(name, fn):
    _check(fn, torch.randn(5, 4), torch.tensor([0, 4, 2, 3, 1, 2]))


def test_an_out_of_range_index_in_a_reduction_raises():
    fn = lambda w, i: (F.embedding(i, w).pow(2).mean(-1),)  # noqa: E731
    w = torch.randn(10, 64)
    compiled = _check(fn, w, torch.randint(0, 10, (4, 3)))
    with pytest.raises(IndexError, match="out of range"):
        compiled(w, torch.tensor([[1, 2, 3], [4, 10, 5], [0, 0, 0], [1, 1, 1]]))


def test_every_gathered_position_is_checked_in_loopir():
    # The one rule lives in LoopIR: each `ind<k>` a load uses is a check_index value (ir.verify).
    from kiln.ir import IRVerificationError, verify
    from kiln.lowering import lower_graph

    graphs = []

    def record(aten_gm, aten_inputs):
        graphs.append(lower_graph(aten_gm, aten_inputs))
        return aten_gm

    aot_compile(torch.fx.symbolic_trace(lambda x, i: (x[i + 1],)), [torch.randn(4, 3), torch.tensor([0, 2])], record)
    (graph,) = graphs
    node = next(node for node in graph.nodes if any(op.name == "check_index" for op in node.body.ops))
    check = next(k for k, op in enumerate(node.body.ops) if op.name == "check_index")
    node.body.ops[check] = node.body.ops[node.body.ops[check].operands[0]]  # the unchecked position
    with pytest.raises(IRVerificationError, match="no check_index bounds"):
        verify(graph)


# ---- the generated cross product: sources x gathers x index kinds ------------------------------------

SOURCES = {  # x: [6, 8] -> a computed 2-d tensor
    "pad": lambda x: F.pad(x, (1, 2, 2, 1)),
    "cat": lambda x: torch.cat([x, 2 * x], 0),
    "cat_dim1": lambda x: torch.cat([x, x[:, :3] - 1], 1),
    "stack": lambda x: torch.stack([x, -x], 2).reshape(12, 8),
    "flip": lambda x: (x + 1).flip(0, 1),
    "permute": lambda x: (x * 2).permute(1, 0),
    "slice_step": lambda x: (x * 2)[::2, 1::3],
    "expand": lambda x: (x[:1] * 2).expand(5, 8),
    "reshape": lambda x: (x * 2).t().reshape(4, 12),  # a gathered row or column unravelled by div and mod
}

# op: (gather of `source` at `position`, the dim it indexes, the index tensor's shape for a source
# shape, whether negative indices wrap)
GATHERS = {
    "index": (lambda source, position: source[position], 0, lambda shape: (5,), True),
    "index_select": (lambda source, position: torch.index_select(source, 1, position), 1, lambda shape: (5,), False),
    "gather": (lambda source, position: torch.gather(source, 1, position), 1, lambda shape: (shape[0], 3), False),
    "embedding": (lambda source, position: F.embedding(position, source), 0, lambda shape: (2, 3), False),
}

# kind: (the position computed from the input, the input's range giving positions in [low, high))
INDEX_KINDS = {
    "positive": (lambda i, n, wraps: i, lambda low, high: (max(low, 0), high)),
    "negative": (lambda i, n, wraps: i, lambda low, high: (low, 0) if low < 0 else (low, high)),
    "plus_one": (lambda i, n, wraps: i + 1, lambda low, high: (low - 1, high - 1)),
    "times_two_minus_three": (lambda i, n, wraps: i * 2 - 3, lambda low, high: ((low + 4) // 2, (high + 4) // 2)),
    # any input, wrapped into range: [-n, 0) where negative indices wrap (eager's rule), else [0, n)
    "wrapped": (lambda i, n, wraps: torch.remainder(i, n) - (n if wraps else 0), lambda low, high: (-5 * high, 5 * high)),
}
BAD_POSITIONS = ("past the end", "before -n", "-1")


def _generated_case(source_name: str, gather_name: str):
    """fn(x, *inputs): one output per index kind; sample(generator, bad) its inputs: in range, except
    one element of the input of each kind in `bad`, which gives that kind's bad position there."""
    source_fn = SOURCES[source_name]
    gather_fn, dim, index_shape, wraps = GATHERS[gather_name]
    shape = source_fn(torch.zeros(6, 8)).shape
    n = shape[dim]
    positions = [lambda i, kind=kind: INDEX_KINDS[kind][0](i, n, wraps) for kind in INDEX_KINDS]

    def fn(x, positive, negative, plus_one, times_two_minus_three, wrapped):
        source = source_fn(x)
        inputs = (positive, negative, plus_one, times_two_minus_three, wrapped)
        return tuple(gather_fn(source, position(i)) for position, i in zip(positions, inputs))

    def sample(generator, bad=None):
        inputs = []
        for kind, (position_of, input_range) in INDEX_KINDS.items():
            i = torch.randint(*input_range(-n if wraps else 0, n), index_shape(shape), generator=generator)
            if kind in (bad or {}):
                target = {"past the end": n, "before -n": -n - 1, "-1": -1}[bad[kind]]
                # the input that gives `target` through the kind's arithmetic (for 2i - 3: the nearest
                # odd position farther out of range)
                halved = -(-(target + 3) // 2) if target >= 0 else (target + 3) // 2
                i.view(-1)[0] = {"plus_one": target - 1, "times_two_minus_three": halved}.get(kind, target)
            inputs.append(i)
        return inputs

    return fn, sample


CHECKED_KINDS = [kind for kind in INDEX_KINDS if kind != "wrapped"]  # "wrapped" is always in range
# Out of range: each kind alone (the positions taking turns), then every kind at once at each position.
BAD_INPUTS = [{kind: BAD_POSITIONS[turn % len(BAD_POSITIONS)]} for turn, kind in enumerate(CHECKED_KINDS)] + \
    [{kind: bad for kind in CHECKED_KINDS} for bad in BAD_POSITIONS]


@pytest.mark.parametrize("gather_name", list(GATHERS))
@pytest.mark.parametrize("source_name", list(SOURCES))
def test_generated_gathers(source_name, gather_name):
    fn, sample = _generated_case(source_name, gather_name)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, generator=generator)
    inputs = sample(generator)
    compiled = _compile(fn, x, *inputs)
    verdict = kiln.testing.compare(compiled(x, *inputs), fn(x, *inputs), fn(x.double(), *inputs))
    assert verdict, f"{source_name} x {gather_name}: {verdict.message}"
    raised = 0
    for bad in BAD_INPUTS:  # kiln raises exactly where eager does, and is right where it does not
        bad_inputs = sample(generator, bad)
        try:
            expected = fn(x, *bad_inputs)
        except (IndexError, RuntimeError):
            raised += 1
            with pytest.raises(IndexError, match="out of range"):
                compiled(x, *bad_inputs)
        else:
            verdict = kiln.testing.compare(compiled(x, *bad_inputs), expected)
            assert verdict, f"{source_name} x {gather_name}, out of range {bad}: {verdict.message}"
    assert raised >= 5  # the positions past the end and before -n, alone and at once (and -1 without wrapping)


def test_inlining_keeps_each_gathered_value_named_right():
    # The pad's range test `index_expr ind<k>` kept the number <k> had before the index (i + 1) was
    # inlined ahead of it, naming another value: the verifier now rejects such a body.
    from kiln.ir import verify
    from kiln.ir.nodes import indirect_value
    from kiln.lowering import lower_graph
    from kiln.schedule import schedule_graph

    graphs = []

    def record(aten_gm, aten_inputs):
        graphs.append(lower_graph(aten_gm, aten_inputs))
        return aten_gm

    fn = lambda x, i: (F.pad(x, (0, 0, 2, 1))[i + 1],)  # noqa: E731
    aot_compile(torch.fx.symbolic_trace(fn), [ROWS, POSITIONS], record)
    (graph,) = graphs
    scheduled = schedule_graph(graph)
    verify(scheduled.graph)
    (body,) = [node.body for kernel in scheduled.kernels for node in kernel.nodes
               if any(op.name == "check_index" for op in node.body.ops)]
    named = [indirect_value(symbol) for op in body.ops if op.name == "index_expr"
             for symbol in sympy.sympify(op.attr).free_symbols if indirect_value(symbol) is not None]
    assert named and all(body.ops[value].name == "check_index" for value in named)


def test_symbolic_sizes_bound_the_index():
    # The checked size is a size symbol: the same compiled code raises past each call's own size.
    def fn(w, i):
        return F.embedding(i, w) * 2, w[i - w.shape[0]]

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="kiln", dynamic=True)
    with kiln.config.patch(strict=True):
        for rows in (30, 20, 25):
            w, i = torch.randn(rows, 6), torch.randint(0, rows, (3, 5))
            verdict = kiln.testing.compare(compiled(w, i), fn(w, i), fn(w.double(), i))
            assert verdict, verdict.message
        with pytest.raises(IndexError, match="out of range"):
            compiled(torch.randn(20, 6), torch.tensor([[3, 20]]))
        with pytest.raises(IndexError, match="out of range"):
            compiled(torch.randn(20, 6), torch.tensor([[3, -1]]))
