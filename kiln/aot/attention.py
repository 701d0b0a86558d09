"""Attention calls in the torch-level graph, made acceptable to the fused SDPA kernels before tracing.

`F.scaled_dot_product_attention` picks its kernel when AOTAutograd traces it: a fused one (flash,
memory-efficient, cuDNN) when its inputs pass torch's checks, else the math decomposition. The
math path materializes the scores and probabilities (float32 for bf16 inputs on CUDA) and, in
training, saves them and a dropout mask of the scores' shape for the backward: 12 x 126 MB for
BERT-base at 8 x 512, where the fused kernels save their output and log-sum-exp.

Every fused kernel refuses an input whose last dimension has a stride other than 1. Hugging Face
models hand SDPA exactly such a mask under a compiler: eager skips an all-ones padding mask after
reading its values, a trace cannot read them, so it materializes the mask as a broadcast view
(BERT's is bool (8, 1, 512, 512) with strides (0, 512, 1, 0), measured on the H200). Copying such
an input to a contiguous one costs one small kernel (2 MB for BERT's mask) and lets the trace pick
the memory-efficient kernel.

Inference calls too: torch's math path upcasts 16-bit queries, keys and values to float32, so its
two products run in float32 and its scores and probabilities are float32 (BERT-base at 8 x 512:
96 x 512 x 512 of each per layer), where kiln could only fuse the softmax between the products.
`config.dense_attention_inputs` chooses: 'all' (the default), 'training', or 'off'.
"""
from __future__ import annotations

import contextlib

import torch

from kiln.config import config

_SDPA = {torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
_TENSOR_ARGUMENTS = ("query", "key", "value", "attn_mask")


def make_attention_fusable(gm: torch.fx.GraphModule, devices: frozenset = frozenset({"cuda"}),
                           calls: str | None = None) -> int:
    """Give every SDPA call on `devices` that `calls` selects ('training', 'all' or 'off'; by default
    `config.dense_attention_inputs`) inputs whose last dimension has stride 1 (a `.contiguous()` copy
    where it has not). Returns how many inputs it copied. Needs the frontend's example values
    (meta["example_value"]); a call without them is left alone."""
    calls = calls or config.dense_attention_inputs
    if calls == "off":
        return 0
    copied = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        operands = [node.args[position] if position < len(node.args) else node.kwargs.get(name)
                     for position, name in enumerate(_TENSOR_ARGUMENTS)]
        values = [_example(operand) for operand in operands]
        if values[0] is None or values[0].device.type not in devices:
            continue
        if calls == "training" and not any(value is not None and value.requires_grad for value in values[:3]):
            continue  # an inference call
        for position, (name, operand, value) in enumerate(zip(_TENSOR_ARGUMENTS, operands, values)):
            if value is None or value.dim() == 0 or value.stride(-1) == 1 or value.shape[-1] == 1:
                continue
            with gm.graph.inserting_before(node):
                dense = gm.graph.call_method("contiguous", (operand,))
            dense.meta.update({key: item for key, item in operand.meta.items() if key != "example_value"})
            with getattr(value, "fake_mode", None) or contextlib.nullcontext():
                dense.meta["example_value"] = value.contiguous()
            if position < len(node.args):
                node.args = (*node.args[:position], dense, *node.args[position + 1:])
            else:
                node.kwargs = {**node.kwargs, name: dense}
            copied += 1
    if copied:
        gm.recompile()
    return copied


def _example(operand):
    """The frontend's example value of a graph operand, if it is a tensor."""
    if isinstance(operand, torch.fx.Node):
        value = operand.meta.get("example_value")
        return value if isinstance(value, torch.Tensor) else None
    return None
