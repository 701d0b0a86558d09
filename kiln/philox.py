"""Philox dropout: the generator, the two ops kiln's graphs call, and dropout as eager computes it.

`philox(seed, offset)` is Philox4x32-10's first 32-bit word (Salmon, Moraes, Dror and Shaw, SC'11; curand's and
Triton's `tl.randint`'s generator) in torch's int64 arithmetic: the reference for kiln/ir/ops.py's `philox` row,
which the kernels compute. `kiln::philox_dropout(x, seed, p)` and `kiln::philox_keep(seed, size, p)` are the ops
kiln/aot/random.py puts in a graph in place of `native_dropout` and of a saved mask (their torch code here runs
where a graph runs without kiln's kernels; kiln/lowering/random.py lowers them). An element at row-major position i
is kept where `philox(seed, i) >= round(p * 2**32)`. `dropout_as_eager` is eager's arithmetic for x * mask * 1/(1-p),
forward (F.dropout) and backward (native_dropout_backward, kiln/aot/decompositions.py). `eager_dropout` is F.dropout
drawing these masks, `eager_rand` and `eager_rand_like` torch.rand and torch.rand_like drawing kiln's values
(kiln.testing.philox_draws).
"""
from __future__ import annotations

import torch

from kiln import _torch

_WORD = 0xFFFFFFFF
SEED_HIGH = 2 ** 62  # seeds are drawn from [0, SEED_HIGH)


def dropout_as_eager(x, mask, scale, *, scale_in_dtype: bool):
    """x * mask * scale, with the scale in x's dtype (eager's CPU dropout) or in float32 for fp16/bf16, rounded once
    (eager's CUDA kernel); laid out in x's memory format, as torch's is."""
    if scale_in_dtype:
        result = x * (mask.to(x.dtype) * scale)
    else:
        dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        result = (x.to(dtype) * mask.to(dtype) * scale).to(x.dtype)
    return result.clone(memory_format=_torch.suggest_memory_format(x))


def philox(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Philox4x32-10's first word (int64, in [0, 2**32)) for key = seed's two 32-bit halves and counter =
    (offset's halves, 0, 0), in torch's int64 arithmetic (products wrap mod 2**64): the reference the
    kernels' `philox` op is tested against, and the eager implementation of the ops below."""
    seed, offset = torch.broadcast_tensors(seed.to(torch.int64), offset.to(torch.int64))
    k0, k1 = seed & _WORD, (seed >> 32) & _WORD
    c0, c1 = offset & _WORD, (offset >> 32) & _WORD
    c2 = c3 = torch.zeros_like(c0)
    for _ in range(10):
        p0, p1 = c0 * 0xD2511F53, c2 * 0xCD9E8D57
        c0, c1, c2, c3 = ((p1 >> 32) & _WORD) ^ c1 ^ k0, p1 & _WORD, ((p0 >> 32) & _WORD) ^ c3 ^ k1, p0 & _WORD
        k0, k1 = (k0 + 0x9E3779B9) & _WORD, (k1 + 0xBB67AE85) & _WORD
    return c0


def keep_threshold(p: float) -> int:
    """An element is kept where its 32-bit word is at least this: with probability 1 - p within 2**-33."""
    return round(p * 2 ** 32)


def dropout_scale(p: float) -> float:
    return 1.0 / (1.0 - p)


def _keep(seed: torch.Tensor, size, p: float) -> torch.Tensor:
    offsets = torch.arange(int(torch.Size(size).numel()), device=seed.device, dtype=torch.int64).view(size)
    return philox(seed, offsets) >= keep_threshold(p)


@torch.library.custom_op("kiln::philox_keep", mutates_args=())
def philox_keep(seed: torch.Tensor, size: list[int], p: float) -> torch.Tensor:
    """The keep mask (bool, contiguous, `size`) of the dropout whose seed is `seed` (int64, 0-d)."""
    return _keep(seed, size, p)


@philox_keep.register_fake
def _(seed, size, p):
    return seed.new_empty(size, dtype=torch.bool)


@torch.library.custom_op("kiln::philox_dropout", mutates_args=())
def philox_dropout(x: torch.Tensor, seed: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`native_dropout(x, p, train=True)` with the mask `philox_keep(seed, x.shape, p)`: (result, mask)."""
    keep = _keep(seed, x.shape, p)
    return dropout_as_eager(x, keep, dropout_scale(p), scale_in_dtype=x.device.type == "cpu"), keep


@philox_dropout.register_fake
def _(x, seed, p):
    return torch.empty_like(x, memory_format=_torch.suggest_memory_format(x)), x.new_empty(x.shape, dtype=torch.bool)


def eager_dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """F.dropout as kiln's kernels compute it, in torch ops (differentiable): the seed drawn from torch's
    generator as the compiled graph draws it, so an eager run made with it draws kiln's masks
    (kiln.testing.philox_draws)."""
    if not training or not 0 < p < 1 or not x.dtype.is_floating_point or x.numel() == 0:
        return _F_DROPOUT(x, p, training, inplace)
    seed = torch.randint(0, SEED_HIGH, (), dtype=torch.int64, device=x.device)
    result = dropout_as_eager(x, _keep(seed, x.shape, p), dropout_scale(p), scale_in_dtype=x.device.type == "cpu")
    return x.copy_(result) if inplace else result


UNIFORM_BITS = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}  # each format's significand


def uniform(seed: torch.Tensor, size, dtype: torch.dtype) -> torch.Tensor:
    """What kiln's kernels draw for rand: the top 8, 11 or 24 bits of each element's word times 2**-bits (uniform on
    [0, 1) and exact in the dtype)."""
    bits = UNIFORM_BITS[dtype]
    offsets = torch.arange(int(torch.Size(size).numel()), device=seed.device, dtype=torch.int64).view(size)
    return ((philox(seed, offsets) >> (32 - bits)).to(torch.float32) * 2.0 ** -bits).to(dtype)


def eager_rand(*size, dtype=None, device=None, generator=None, **kwargs) -> torch.Tensor:
    """torch.rand drawing what kiln's kernels draw (kiln.testing.philox_draws)."""
    size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)) else size
    dtype = dtype or torch.get_default_dtype()
    if generator is not None or dtype not in UNIFORM_BITS:
        return _RAND(*size, dtype=dtype, device=device, generator=generator, **kwargs)
    seed = torch.randint(0, SEED_HIGH, (), dtype=torch.int64, device=device)
    return uniform(seed, size, dtype).requires_grad_(kwargs.get("requires_grad", False))


def eager_rand_like(x: torch.Tensor, dtype=None, **kwargs) -> torch.Tensor:
    """torch.rand_like drawing what kiln's kernels draw (kiln.testing.philox_draws)."""
    dtype = dtype or x.dtype
    if dtype not in UNIFORM_BITS or kwargs.get("device") not in (None, x.device):
        return _RAND_LIKE(x, dtype=dtype, **kwargs)
    seed = torch.randint(0, SEED_HIGH, (), dtype=torch.int64, device=x.device)
    return uniform(seed, x.shape, dtype)


_F_DROPOUT, _RAND, _RAND_LIKE = torch.nn.functional.dropout, torch.rand, torch.rand_like
