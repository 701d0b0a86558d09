"""kiln/aot/attention.py: SDPA calls (config.dense_attention_inputs: all by default) get inputs whose last dimension has stride 1."""
import torch
import torch.nn.functional as F

from kiln.aot.attention import make_attention_fusable


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
