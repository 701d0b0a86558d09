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
    or dtype than its meta)."""
    result = torch.empty_strided(size, stride, dtype=dtype or tensor.dtype, device=tensor.device)
    result.copy_(tensor)
    return result


def _view_at(tensor: torch.Tensor, size, stride, offset: int) -> torch.Tensor:
    """A view of `tensor` at `offset` elements from its own start (as_strided counts from the storage's)."""
    return tensor.as_strided(size, stride, tensor.storage_offset() + offset)


view_at = _torch.reinterpret_tensor() or _view_at  # the same view, built in C++ where torch has it


def flatten_result(value) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in flatten_result(item)]
    return [value]
