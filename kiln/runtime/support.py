"""Helpers the generated wrappers import (kept tiny: they run on every call)."""
from __future__ import annotations

import torch

from kiln import _torch
from kiln.runtime.host_memory import empty_strided_huge  # noqa: F401 (generated wrappers import it)

empty_strided = torch.empty_strided


def cdiv(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def restride(tensor: torch.Tensor, size, stride, dtype=None) -> torch.Tensor:
    """A copy of `tensor` laid out with `stride` and of `dtype` (an extern returned another layout
    or dtype than its meta). A result of another shape is refused: copying it in would broadcast
    it (a 0-dim result became the (1,) its meta said) and every later value would be wrong."""
    if tensor.shape != tuple(size):
        raise RuntimeError(f"kiln: an extern returned shape {tuple(tensor.shape)} where its meta (torch's shape "
                           f"rule for the op) says {tuple(size)}")
    result = torch.empty_strided(size, stride, dtype=dtype or tensor.dtype, device=tensor.device)
    result.copy_(tensor)
    return result


def _view_at(tensor: torch.Tensor, size, stride, offset: int) -> torch.Tensor:
    """A view of `tensor` at `offset` elements from its own start (as_strided counts from the storage's)."""
    return tensor.as_strided(size, stride, tensor.storage_offset() + offset)


view_at = _torch.reinterpret_tensor() or _view_at  # the same view, built in C++ where torch has it


def raise_index_error(where: str) -> None:
    """What a kernel's failed `check_index` (an out-of-range gather index) becomes on the host."""
    raise IndexError(f"kiln: {where}: an index is out of range for the dim it indexes (gather, index_select "
                     f"and embedding take [0, size), advanced indexing [-size, size))")


def check_index_status(status: torch.Tensor, kernels: str) -> None:
    """Raise IndexError when a Triton kernel of this graph flagged an out-of-range index in
    `status` (one int32, set by check_index); reset it first, so the graph stays usable.

    On CUDA this reads one int from the device: a host sync, once per call of a graph that
    gathers. Not while a CUDA graph records (a sync would break the capture): the runner checks
    after each replay instead (runtime/cudagraphs.py).
    """
    if status.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    if status.item():
        status.zero_()
        raise_index_error(kernels)


def flatten_result(value) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in flatten_result(item)]
    return [value]
