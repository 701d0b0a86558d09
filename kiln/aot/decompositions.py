"""kiln's decomposition table: core ATen's, plus composite ops kiln fuses better as
primitives, minus the ops kiln lowers directly (their rule is better than the decomposition)."""
from __future__ import annotations

import functools

from kiln import _torch

aten = _torch.aten

# Decomposed into reductions and pointwise math that kiln's scheduler fuses into one kernel.
EXTRA_DECOMPOSITIONS = [
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.native_group_norm,
    aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit,
    aten.addcmul, aten.addcdiv,
    aten._softmax_backward_data, aten._log_softmax_backward_data, aten.native_layer_norm_backward,
    aten.gelu_backward, aten.tanh_backward, aten.sigmoid_backward, aten.threshold_backward,
    aten.silu_backward, aten.embedding_dense_backward,
]

# Lowered directly by kiln/lowering, or decomposed wrongly for training: keep them whole.
# (_scaled_dot_product_flash_attention_for_cpu's decomposition gave wrong gradients for
# BERT and Llama training on CPU, bisected by the model tests. eye's decomposition
# compares two aranges in the smallest unsigned dtype that holds n, uint16 past 255,
# which neither kiln's kernels nor eager's CPU arange support.)
KEEP = [
    aten._scaled_dot_product_flash_attention_for_cpu, aten.eye,
    aten.gelu, aten.silu, aten.sigmoid, aten.tanh, aten.var_mean, aten.var, aten.std,
    aten.clamp, aten.where, aten.hardtanh, aten.mean,
    aten.embedding,  # its decomposition (aten.index) accepts negative indices, which eager's embedding rejects
]


@functools.lru_cache(maxsize=None)
def decomposition_table() -> dict:
    table = dict(_torch.core_aten_decompositions())
    table.update(_torch.get_decompositions(EXTRA_DECOMPOSITIONS))
    for packet in KEEP:
        for overload_name in packet.overloads():
            table.pop(getattr(packet, overload_name), None)
    return table
