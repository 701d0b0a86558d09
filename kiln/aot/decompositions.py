"""kiln's decomposition table: core ATen's, plus composite ops kiln fuses better as
primitives, minus the ops kiln lowers directly (their rule is better than the decomposition)."""
from __future__ import annotations

import functools
import threading

import torch

from kiln import _torch
from kiln.aot.strides import dense_strides, index_layout
from kiln.ir.ops import ROWS
from kiln.philox import dropout_as_eager

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

# Lowered directly by kiln/lowering, or decomposed wrongly for training: keep them whole (with the
# ATen ops the op table's rows name, kiln/ir/ops.py: each is one LoopIR op).
# (_scaled_dot_product_flash_attention_for_cpu's decomposition gave wrong gradients for
# BERT and Llama training on CPU, bisected by the model tests. eye's decomposition
# compares two aranges in the smallest unsigned dtype that holds n, uint16 past 255,
# which neither kiln's kernels nor eager's CPU arange support.)
KEEP = [
    aten._scaled_dot_product_flash_attention_for_cpu, aten.eye,
    aten.gelu, aten.silu, aten.var_mean, aten.var, aten.std,
    aten.clamp, aten.where, aten.hardtanh, aten.mean,
    aten.embedding,  # its decomposition (aten.index) accepts negative indices, which eager's embedding rejects
    # Their decompositions write through aten.index_put, which takes an index in [-size, size) where eager's
    # index_add and index_copy raise for a negative one: kiln returned a result where eager raised. index_put
    # is an extern anyway, so ATen's own op (which checks, and writes as eager does) costs nothing more.
    aten.index_add, aten.index_copy,
    # its decompositions fill through scalar_tensor, which does not check that the number fits a float16 or
    # bfloat16 tensor, or convert a 0-d tensor's number unchecked, where eager's masked_fill raises (kiln's rule
    # checks: lowering/pointwise.py)
    aten.masked_fill.Scalar, aten.masked_fill.Tensor,
]


def fused_rms_norm(input, normalized_shape, weight=None, eps=None):
    """`aten._fused_rms_norm` (what F.rms_norm calls on CUDA) as eager computes it there.

    torch's decomposition is the CPU formula, x * rsqrt(mean(x^2) + eps), where an inf in a row
    gives NaN at the inf alone (inf * 0) and 0 elsewhere. Eager's CUDA kernel accumulates the
    row with Welford's update, so an inf or NaN anywhere in a row makes the whole row NaN
    (measured on the H200, torch 2.11; a row whose squares overflow to inf is 0, as on the CPU).
    On CUDA the sum of squares therefore adds x * 0: 0 for a finite x (x*x + 0 is exact), NaN for
    inf or NaN, so the row's rstd is NaN exactly where eager's is.
    """
    return rms_norm_as_eager(input, normalized_shape, weight, eps, nonfinite_rows=input.device.type == "cuda")


def rms_norm_as_eager(input, normalized_shape, weight, eps, *, nonfinite_rows: bool):
    """RMSNorm's result and rstd; nonfinite_rows: a row with an inf or NaN is NaN (eager's CUDA kernel)."""
    dims = list(range(input.dim() - len(normalized_shape), input.dim()))
    dtype = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    x = input.to(dtype)
    if eps is None:
        eps = torch.finfo(torch.float32 if dtype == torch.float32 else torch.float64).eps
    squares = x * x
    if nonfinite_rows:
        squares = squares + x * 0
    rstd = torch.rsqrt(aten.add.Scalar(squares.mean(dim=dims, keepdim=True), eps))
    result = x * rstd
    if weight is not None:
        result = result * weight
    if _torch.suggest_memory_format(input) not in (torch.channels_last, torch.channels_last_3d):
        result, rstd = result.contiguous(), rstd.contiguous()
    return result.type_as(input), rstd


@functools.lru_cache(maxsize=None)
def _torchs_decomposition(op):
    return _torch.get_decompositions([op])[op]


_EAGER_SOFTMAX_VECTOR = 16  # fp16/bf16 elements per vector of eager's CPU kernels (AVX2; 32 with AVX512)


def softmax(x, dim, half_to_float):
    """`aten._softmax` as eager computes it: torch's decomposition, except where eager's CPU kernel
    for fp16/bf16 rounds twice. Over a dim that is not the last, that kernel (`_vec_softmax`) takes
    a scalar path for the inner positions a full vector does not cover, which stores exp(x - max) in
    the output's dtype, sums the unrounded exps in float and divides the stored, rounded exp by that
    sum (68 of 325 fp16 elements were 1 ulp off eager's with one rounding; an fmod by the softmax
    made it 0.015: fuzz seed 3007 #1749). kiln repeats it where every position takes that path: an
    inner size (the product of the sizes after `dim`) under one vector. Above that, which positions
    take it depends on how eager splits the work among its threads, and kiln rounds once, as eager's
    vector path does.
    """
    ndim = max(x.dim(), 1)
    inner = 1
    for size in x.shape[dim % ndim + 1:]:
        inner = inner * size
    if (x.device.type != "cpu" or x.dtype not in (torch.float16, torch.bfloat16) or half_to_float
            or dim % ndim == ndim - 1 or not isinstance(inner, int) or inner >= _EAGER_SOFTMAX_VECTOR
            or x.numel() == 0):  # empty: its amax over a 0-size dim cannot be traced (fuzz seed 3012 #4072)
        return _torchs_decomposition(aten._softmax.default)(x, dim, half_to_float)
    computed = x.contiguous().float()
    unnormalized = torch.exp(computed - computed.amax(dim, keepdim=True))
    stored = unnormalized.to(x.dtype).float()
    return (stored / unnormalized.sum(dim, keepdim=True)).to(x.dtype)


_tracing_index = threading.local()  # inside `index`: its own call of aten.index is traced as is


def index(source, indices):
    """`aten.index.Tensor` with eager's layout (`kiln.aot.strides.index_layout`) in the trace itself.

    The meta kernel lays the result out row-major whatever the index tensors' layout. The program
    traced after it decides on that layout: a `.contiguous()` of the result is a no-op, a
    `.reshape()` a view, where eager's column-major result is copied, so an in-place write to the
    result later showed through them (wrong values, and torch.compile's too: fuzz seed 3013 #4066).
    Where the layouts differ the result is permuted to eager's dim order, cloned dense and permuted
    back: a view with eager's strides, whose clone kiln's scheduler fuses with the gather.
    """
    if getattr(_tracing_index, "active", False):
        return NotImplemented  # the proxy mode traces aten.index itself
    _tracing_index.active = True
    try:
        result = aten.index.Tensor(source, indices)
    finally:
        _tracing_index.active = False
    with _torch.untraced():  # index_layout's reshapes of the index metas are no part of the program
        order = index_layout(source, indices, result.shape)
    if order is None or result.numel() == 0 or dense_strides(list(result.shape), order) == list(result.stride()):
        return result
    outermost_first = order[::-1]
    dense = result.permute(outermost_first).clone(memory_format=torch.contiguous_format)
    return dense.permute([outermost_first.index(dim) for dim in range(result.dim())])


def take(source, index):
    """`aten.take`: `source`'s elements in row-major order, gathered at `index` as advanced indexing.

    torch's decomposition writes `source.reshape(-1)[index]`, Python indexing: a 0-d index tensor is
    an integer index there, its value read with `.item()`, so tracing take (and put's backward, which
    takes the gradient) failed on data: a 0-d index gave a compile error. aten.index gathers with an
    index of any shape, 0-d included, and its result has the index's shape, as take's has.
    """
    return aten.index.Tensor(source.reshape(-1), [index])


_MEAN_REDUCTION = 1  # torch.nn._reduction: 0 none, 1 mean, 2 sum


def soft_margin_loss_backward(grad_output, input, target, reduction=_MEAN_REDUCTION):
    """d/dx log1p(exp(-y x)) = -y sigmoid(-y x), as eager's kernel computes it (-y z / (1 + z), z = exp(-y x)).

    torch's decomposition writes y (sigmoid(y x) - 1), which cancels where y x is large: at y x = 15 the
    float32 gradient was 10% off (5.3e-8 from float64's 5.6e-7, eager 1.2e-13; the gradient OpInfo sweep).
    """
    dtype = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    x, y, grad = input.to(dtype), target.to(dtype), grad_output.to(dtype)
    grad_input = -y * grad * torch.sigmoid(-y * x)
    if reduction == _MEAN_REDUCTION:
        grad_input = grad_input / input.numel()
    return grad_input.to(input.dtype)


def native_dropout_backward(grad_output, mask, scale):
    """`aten.native_dropout_backward` as eager's dropout computes it on the gradient's device.

    On CUDA, F.dropout runs the fused native_dropout kernel, whose backward (masked_scale) computes
    grad * mask * scale in float32 and rounds once. torch's decomposition scales the mask first, in the
    gradient's dtype: for fp16/bf16, 1/(1-p) was rounded (1.109375 for p = 0.1, 0.16% low) and every
    gradient through dropout was scaled by it, then rounded again: 1.36x eager's error in norm
    (tests/aot/test_low_precision_decompositions.py). On the CPU, F.dropout multiplies by a noise tensor
    of the input's dtype, 1/(1-p) rounded to it, forward and backward, and the graph's native_dropout
    (traced from F.dropout) is an extern whose CPU kernel gives those same forward values: there torch's
    decomposition is eager's backward bit for bit (not the CPU's native_dropout_backward kernel, which
    keeps the scale in float32, for the rare program that calls native_dropout itself).
    """
    return dropout_as_eager(grad_output, mask, scale, scale_in_dtype=grad_output.device.type == "cpu")


def batch_norm_inference(input, weight, bias, running_mean, running_var, momentum, eps):
    """`aten._native_batch_norm_legit_no_training` (eval batch norm): torch's formula, in fewer ops.

    torch's decomposition goes through the training helper: it copies both running statistics
    (`.to(copy=True)`), writes 1 / sqrt(v) as reciprocal then a multiply by 1, and unsqueezes each
    per-channel vector one dim at a time: 20 ATen ops per batch norm (13 here, counted by
    tests/aot/test_decomposition_table.py), traced anew at every first call (53 batch norms in ResNet-50).
    Here the statistics are read as they are, each vector takes one view to (C, 1, ..., 1), and the arithmetic
    is the same: (x - mean) * (1 / sqrt(var + eps)) * w + b, the same values bit for bit (tests/aot/test_decomposition_table.py).
    """
    dtype = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
    channels = [-1] + [1] * (input.dim() - 2)
    mean = running_mean.to(dtype)
    invstd = torch.reciprocal(torch.sqrt(running_var.to(dtype) + eps))
    output = (input - mean.view(channels)) * invstd.view(channels)
    if weight is not None:
        output = output * weight.reshape(channels)
    if bias is not None:
        output = output + bias.reshape(channels)
    if input.device.type == "cpu":  # eager's CPU kernel returns empty statistics, its CUDA kernel these two
        return output.to(input.dtype), input.new_zeros((0,)), input.new_zeros((0,))
    return output.to(input.dtype), mean.clone() if mean is running_mean else mean, invstd


# kiln's own decompositions, replacing core ATen's for these ops.
OWN_DECOMPOSITIONS = {aten._softmax.default: softmax, aten.index.Tensor: index, aten.take.default: take,
                      aten.soft_margin_loss_backward.default: soft_margin_loss_backward,
                      aten.native_dropout_backward.default: native_dropout_backward,
                      aten._native_batch_norm_legit_no_training.default: batch_norm_inference}
if hasattr(aten, "_fused_rms_norm"):
    OWN_DECOMPOSITIONS[aten._fused_rms_norm.default] = fused_rms_norm


def _overloads(op) -> list:
    """An OpOverloadPacket's overloads, or the one OpOverload."""
    if hasattr(op, "overloads"):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


@functools.lru_cache(maxsize=None)
def decomposition_table() -> dict:
    table = dict(_torch.core_aten_decompositions())
    table.update(_torch.get_decompositions(EXTRA_DECOMPOSITIONS))
    for op in KEEP + [op for row in ROWS for op in row.aten]:  # a row's ATen ops are one LoopIR op each
        for overload in _overloads(op):
            table.pop(overload, None)
    table.update(OWN_DECOMPOSITIONS)
    return table
