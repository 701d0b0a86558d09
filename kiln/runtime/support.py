"""Helpers the generated wrappers import (kept tiny: they run on every call)."""
from __future__ import annotations

import torch

from kiln import _torch
from kiln.runtime.host_memory import empty_strided_huge  # noqa: F401 (generated wrappers import it)

empty_strided = torch.empty_strided
_EMPTY_ON_CURRENT_CUDA = _torch.empty_strided_on_current_device("cuda")


def cuda_allocator(index: int):
    """What a wrapper calls, as `alloc(size, stride, dtype)`, for this call's buffers on cuda:<index>:
    torch's C++ allocator for the current device when that is the buffers' device (the usual case;
    checked once per call, not once per buffer), else torch.empty_strided naming the device."""
    if _EMPTY_ON_CURRENT_CUDA is not None and torch.cuda.current_device() == index:
        return _EMPTY_ON_CURRENT_CUDA
    device = torch.device("cuda", index)
    return lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype, device=device)


# Externs called through torch's own Python bindings rather than the OpOverload (runtime/loader.py
# python_binding): the same ATen kernel, without OpOverload.__call__'s Python frame and its
# schema-driven argument conversion; a transformer's training step calls a product 170 times. Each
# binding takes the overload's arguments as the wrapper passes them: tensors positionally, beta and
# alpha by keyword, out= for an .out overload.
PYTHON_BINDINGS = {
    _torch.aten.mm.default: torch.mm, _torch.aten.mm.out: torch.mm,
    _torch.aten.bmm.default: torch.bmm, _torch.aten.bmm.out: torch.bmm,
    _torch.aten.addmm.default: torch.addmm, _torch.aten.addmm.out: torch.addmm,
    _torch.aten.baddbmm.default: torch.baddbmm, _torch.aten.baddbmm.out: torch.baddbmm,
}


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


class KilnIndexError(IndexError):
    """A compiled graph's out-of-range gather index. `eager_reruns` says whether running the frame again
    eagerly (the frontend does, for a graph that raised, so that the side effects before the failing op
    happen: kiln/frontend/errors.py GraphRaised) gives the program's own error: on the CPU, eager's
    IndexError. Not on CUDA: there eager's out-of-range gather is a device-side assert that ends the
    process's CUDA context, and a deferred report is an earlier call's, which this call's eager run
    would not raise at all."""

    def __init__(self, message: str, eager_reruns: bool = True):
        super().__init__(message)
        self.eager_reruns = eager_reruns


def raise_index_error(where: str, eager_reruns: bool = True) -> None:
    """What a kernel's failed `check_index` (an out-of-range gather index) becomes on the host."""
    raise KilnIndexError(f"kiln: {where}: an index is out of range for the dim it indexes (gather, index_select "
                         f"and embedding take [0, size), advanced indexing [-size, size))", eager_reruns)


class IndexStatus:
    """A compiled graph's out-of-range-gather flag on one device, and how the host learns of it.

    The graph's Triton kernels store 1 into `flag` (one int32, codegen/triton.py's check_index)
    when a lane's index is out of range; `after_call` runs once the graph's kernels are enqueued
    (the wrapper's last line, or the CUDA-graph runner after a replay) and raises IndexError,
    leaving the flag reset so the graph stays usable.

    - CPU (Triton's interpreter): the flag is read at once; the call that gathered raises.
    - CUDA, `config.gpu_index_checks == "deferred"` (the default): reading the flag at once is a
      host sync every call, which stops the host from running ahead of the GPU (and makes a
      CUDA-graph replay wait for the graph). Instead each call enqueues a copy of the flag into
      pinned host memory, and the next call reads that copy, waiting for nothing: an
      out-of-range index raises at a later call of the same graph (as eager's device-side
      assert surfaces at a later sync), naming this graph. `check_now()` waits and raises.
    - CUDA, "sync": read at once, as on the CPU (one host sync per call).
    """

    def __init__(self, flag: torch.Tensor, kernels: str):
        from kiln.config import config

        self.flag = flag
        self.kernels = kernels
        self.deferred = flag.is_cuda and config.gpu_index_checks == "deferred"
        self._seen = torch.zeros(1, dtype=torch.int32, pin_memory=True) if self.deferred else None
        self._seen_value = self._seen.numpy() if self.deferred else None  # reads the pinned int with no torch call

    def __reduce__(self):  # the whole-graph cache keeps the flag; the host copy is made anew on load
        return IndexStatus, (self.flag, self.kernels)

    def after_call(self) -> None:
        if self.flag.is_cuda and torch.cuda.is_current_stream_capturing():
            return  # recording a CUDA graph: the runner calls this after each replay instead
        if not self.deferred:
            if self.flag.item():
                self.flag.zero_()
                raise_index_error(self.kernels, eager_reruns=not self.flag.is_cuda)
            return
        if self._seen_value[0]:  # an earlier call's copy has landed and shows the flag
            self._raise_after_sync("an earlier call of this graph")
        self._seen.copy_(self.flag, non_blocking=True)

    def check_now(self) -> None:
        """Wait for the calls in flight and raise if any flagged an index."""
        if self.deferred:
            torch.cuda.synchronize(self.flag.device)
            if self._seen_value[0] or self.flag.item():
                self._raise_after_sync("a call of this graph")
        elif self.flag.item():
            self.flag.zero_()
            raise_index_error(self.kernels, eager_reruns=not self.flag.is_cuda)

    def _raise_after_sync(self, which: str) -> None:
        # The error path may wait: every call in flight finishes, then the flag and its copy are
        # reset together, so copies still queued cannot report this error twice.
        torch.cuda.synchronize(self.flag.device)
        self.flag.zero_()
        torch.cuda.synchronize(self.flag.device)
        self._seen_value[0] = 0
        raise KilnIndexError(f"kiln: {self.kernels}: {which} read an index out of range for the dim it indexes "
                         f"(gather, index_select and embedding take [0, size), advanced indexing [-size, size)); "
                         f"the results of that call and of the calls since are not valid. On CUDA the check "
                         f"reports at the graph's next call, without a host sync; KILN_GPU_INDEX_CHECKS=sync "
                         f"raises in the call itself", eager_reruns=False)


def flatten_result(value) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in flatten_result(item)]
    return [value]
