"""kiln/aot/attention.py: SDPA calls (config.dense_attention_inputs: all by default) get inputs whose last dimension has
stride 1; constant causal masks become is_causal=True (config.causal_attention_masks)."""
import pytest
import torch
import torch.nn.functional as F

import kiln

from kiln.aot.attention import causal_masks, make_attention_fusable
from kiln.config import config


def _attention(q, k, v, padding):
    mask = padding[:, None, None, :].expand(q.shape[0], 1, q.shape[2], k.shape[2]).transpose(-1, -2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class _RecordExamples(torch.fx.Interpreter):
    """Runs the graph, leaving each node's value in meta["example_value"], as kiln's frontend does."""

    def run_node(self, node):
        value = super().run_node(node)
        node.meta["example_value"] = value
        return value


def _traced(requires_grad: bool):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 8, 4, requires_grad=requires_grad) for _ in range(3))
    padding = torch.rand(2, 8) > 0.3
    padding[:, 0] = True
    gm = torch.fx.symbolic_trace(_attention)
    _RecordExamples(gm).run(q, k, v, padding)
    return gm, (q, k, v, padding)


def test_training_call_gets_a_dense_mask_and_the_same_values():
    gm, inputs = _traced(requires_grad=True)
    mask = next(n for n in gm.graph.nodes if n.target == "transpose").meta["example_value"]
    assert mask.stride(-1) != 1
    expected = gm(*inputs)
    assert make_attention_fusable(gm, devices=frozenset({"cpu"})) == 1
    sdpa = next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
    dense = sdpa.kwargs["attn_mask"]
    assert dense.target == "contiguous" and dense.meta["example_value"].stride(-1) == 1
    torch.testing.assert_close(gm(*inputs), expected, rtol=0, atol=0)


def test_inference_calls_are_left_alone_under_training_and_other_devices_always():
    gm, _ = _traced(requires_grad=False)
    assert make_attention_fusable(gm, devices=frozenset({"cpu"}), calls="training") == 0
    gm, _ = _traced(requires_grad=True)
    assert make_attention_fusable(gm) == 0  # CPU tensors; the default rewrites CUDA calls only


def test_inference_calls_too_by_default():
    gm, inputs = _traced(requires_grad=False)
    expected = gm(*inputs)
    assert make_attention_fusable(gm, devices=frozenset({"cpu"})) == 1  # config.dense_attention_inputs='all'
    torch.testing.assert_close(gm(*inputs), expected, rtol=0, atol=0)
    gm, _ = _traced(requires_grad=True)
    assert make_attention_fusable(gm, devices=frozenset({"cpu"}), calls="off") == 0


def _masked(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _built_mask(kind: str, queries: int, keys: int, batch: int):
    """Masks built inside the graph from no input, as Hugging Face's sdpa_mask builds them."""
    rows, columns = ((torch.arange(queries), torch.arange(keys))
                     if kind in ("causal", "float", "lowest", "offset", "upper", "shifted", "shifted_early") else (0, 0))
    if kind == "causal":  # transformers 5.17 under a compiler
        return (columns[None, None, None, :] <= rows[None, None, :, None]).expand(batch, -1, queries, keys)
    if kind == "float":
        keep = columns[None, :] <= rows[:, None]
        return torch.zeros(queries, keys).masked_fill(~keep, float("-inf"))
    if kind == "lowest":
        keep = columns[None, :] <= rows[:, None]
        return torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    if kind == "offset":  # a decode step: lower-right aligned, not torch's is_causal
        return columns[None, :] <= rows[:, None] + (keys - queries)
    if kind == "upper":  # the transposed pattern
        return (rows[None, None, :, None] <= columns[None, None, None, :]).expand(batch, -1, queries, keys)
    if kind == "shifted":  # one more key per row than is_causal keeps
        return (columns[None, None, None, :] <= rows[None, None, :, None] + 1).expand(batch, -1, queries, keys)
    if kind == "shifted_early":  # the same, shifted before indexing (where transformers adds its offset, 0)
        return (columns[None, None, None, :] <= (rows + 1)[None, None, :, None]).expand(batch, -1, queries, keys)
    if kind == "ones":
        return torch.ones(batch, 1, queries, keys, dtype=torch.bool)
    if kind == "random":
        return torch.rand(queries, keys) < 2.0  # all True, but drawn: never folded
    if kind == "coin":
        return torch.rand(1, 1) < 0.5  # True from seed 0, False from seed 1: a constant only to one evaluation
    if kind == "written":
        mask = torch.ones(queries, keys, dtype=torch.bool).tril()
        mask[0, keys - 1] = True  # an in-place write after the causal pattern
        return mask
    raise ValueError(kind)


def _trace_with_shapes(kind: str, queries: int = 8, keys: int = 8, dynamic: bool = False):
    """kiln's frontend captures the graph (constants become calls in it, example values in its metas)."""
    torch.manual_seed(0)
    q = torch.randn(2, 3, queries, 4)
    k, v = torch.randn(2, 3, keys, 4), torch.randn(2, 3, keys, 4)
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    kiln.compile(lambda q, k, v: _masked(q, k, v, _built_mask(kind, q.shape[2], k.shape[2], q.shape[0])),
                 backend=keep, fullgraph=True, dynamic=dynamic)(q, k, v)
    (gm,) = graphs
    return gm, [item for item in (q, k, v)]


def _sdpa_node(gm):
    return next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)


@pytest.mark.parametrize("kind, expected", [("causal", True), ("float", True), ("lowest", True), ("ones", False)])
def test_constant_masks_become_is_causal_or_go(kind, expected):
    gm, inputs = _trace_with_shapes(kind)
    reference = gm(*inputs)
    assert causal_masks(gm) == 1
    sdpa = _sdpa_node(gm)
    assert sdpa.kwargs["attn_mask"] is None and sdpa.kwargs["is_causal"] is expected
    assert [n.op for n in gm.graph.nodes] == ["placeholder"] * 3 + ["call_function", "output"]  # the mask's nodes go
    torch.testing.assert_close(gm(*inputs), reference)


@pytest.mark.parametrize("kind", ["offset", "random", "written"])
def test_other_constant_masks_stay(kind):
    gm, inputs = _trace_with_shapes(kind, queries=4 if kind == "offset" else 8)
    assert causal_masks(gm) == 0
    assert _sdpa_node(gm).kwargs["attn_mask"] is not None


def test_a_mask_from_an_input_stays_and_the_option_turns_folding_off():
    gm, _ = _traced(requires_grad=False)
    assert causal_masks(gm) == 0
    gm, _ = _trace_with_shapes("causal")
    with config.patch(causal_attention_masks=False):
        assert causal_masks(gm) == 0


def test_a_random_mask_the_name_check_misses_differs_between_two_evaluations(monkeypatch):
    import kiln.aot.attention as attention

    monkeypatch.setattr(attention, "_RANDOM_NAMES", ())
    gm, _ = _trace_with_shapes("coin")
    assert causal_masks(gm) == 0


@pytest.mark.parametrize("queries, keys", [(8, 8), (6, 10)])
def test_a_causal_mask_of_symbolic_sizes_is_recognized_by_its_form(queries, keys):
    gm, inputs = _trace_with_shapes("causal", queries, keys, dynamic=True)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sdpa = _sdpa_node(gm)
    assert not isinstance(sdpa.args[0].meta["example_value"].shape[2], int)  # symbolic: nothing to evaluate
    reference = gm(*_with_sizes(gm, inputs))
    assert causal_masks(gm) == 1
    assert sdpa.kwargs["attn_mask"] is None and sdpa.kwargs["is_causal"] is True
    assert [n for n in gm.graph.nodes if n.op == "placeholder"] == placeholders  # the size inputs stay
    assert not any(n.target is torch.arange for n in gm.graph.nodes)
    torch.testing.assert_close(gm(*_with_sizes(gm, inputs)), reference)


@pytest.mark.parametrize("kind", ["upper", "shifted", "shifted_early", "offset"])
def test_other_masks_of_symbolic_sizes_stay(kind):
    gm, _ = _trace_with_shapes(kind, 6, 10, dynamic=True)
    assert causal_masks(gm) == 0
    assert _sdpa_node(gm).kwargs["attn_mask"] is not None


def _with_sizes(gm, tensors):
    """The graph's inputs: its size placeholders (SymInts, in order) take the tensors' concrete sizes."""
    tensors, arguments = list(tensors), []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("example_value")
        if isinstance(value, torch.Tensor):
            arguments.append(tensors.pop(0))
        else:
            arguments.append(int(value.node.hint))
    return arguments
