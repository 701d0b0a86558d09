"""Eager's strides for ATen ops whose fake-tensor (meta) kernel lays its result out differently.

kiln allocates buffers, and gives graph outputs their strides, from the ATen graph's
fake-tensor metas. Where torch's meta kernel disagrees with the real kernel's layout the
compiled graph returns strides eager never would, and the wrong meta spreads to every op
downstream (a pointwise op follows its input's layout). `restride_to_eager(gm)` replaces
such metas with the real kernel's layout and re-derives the metas downstream of them.

One op so far: `aten.index.Tensor`. Eager's kernel (CPU and CUDA) is a TensorIterator
over the source restrided to the output's shape (stride 0 in the indexed dims) and the
index tensors broadcast to it, so its result follows the index tensors' layout as well as
the source's; the meta kernel ignores the index tensors' strides (a transposed index gives
a row-major result where eager's is column-major).
"""
from __future__ import annotations

import torch

from kiln import _torch

aten = _torch.aten


def restride_to_eager(gm: torch.fx.GraphModule) -> bool:
    """Give every `aten.index.Tensor` node eager's output strides and re-derive the fake metas
    of the nodes downstream; returns whether any meta changed. Shapes never change."""
    fake_mode = _torch.fake_mode_of([node.meta.get("val") for node in gm.graph.nodes if node.op == "placeholder"])
    if fake_mode is None:
        return False
    replaced: set = set()
    with fake_mode:
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            meta = node.meta.get("val")
            if node.target is aten.index.Tensor and isinstance(meta, torch.Tensor):
                strides = _index_strides(node, meta)
                if strides is not None and tuple(strides) != tuple(meta.stride()):
                    node.meta["val"] = torch.empty_strided(meta.shape, strides, dtype=meta.dtype, device=meta.device)
                    replaced.add(node)
            elif any(isinstance(arg, torch.fx.Node) and arg in replaced for arg in node.all_input_nodes):
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda arg: arg.meta["val"])
                try:
                    node.meta["val"] = node.target(*args, **kwargs)  # the op's meta kernel on the new layout
                except Exception:  # noqa: BLE001 (a data-dependent op): its meta stands, shapes are unchanged
                    continue
                replaced.add(node)
    return bool(replaced)


def _index_strides(node, meta: torch.Tensor) -> list[int] | None:
    """The strides of eager's `aten.index.Tensor` result, or None where kiln does not model
    them (boolean masks, symbolic sizes or strides, indices separated by a full slice)."""
    source, indices = node.args[0].meta.get("val"), node.args[1]
    index_metas = [index.meta.get("val") if isinstance(index, torch.fx.Node) else None for index in indices]
    present = [position for position, index in enumerate(index_metas) if index is not None]
    if not isinstance(source, torch.Tensor) or not present:
        return None
    if any(index.dtype in (torch.bool, torch.uint8) for index in index_metas if index is not None):
        return None  # masks become nonzero() positions: a data-dependent shape
    if present != list(range(present[0], present[-1] + 1)):
        return None  # indexed dims move to the front first (eager's transposeToFront)
    values = [*source.shape, *source.stride(), *meta.shape]
    for index in index_metas:
        if index is not None:
            values += [*index.shape, *index.stride()]
    if not all(isinstance(value, int) for value in values):
        return None
    before, after = present[0], source.dim() - present[-1] - 1
    replacement = list(meta.shape[before:meta.dim() - after])
    # The TensorIterator's inputs, as element strides over the output's shape.
    operands = [list(source.stride()[:before]) + [0] * len(replacement) + list(source.stride()[source.dim() - after:])]
    for index in index_metas:
        if index is not None:
            leading = len(replacement) - index.dim()
            index_strides = [0] * leading + [0 if extent == 1 else stride
                                             for extent, stride in zip(index.shape, index.stride())]
            operands.append([0] * before + index_strides + [0] * after)
    return _tensor_iterator_strides(list(meta.shape), operands)


def _tensor_iterator_strides(shape: list[int], operands: list[list[int]]) -> list[int]:
    """The strides TensorIterator allocates its output with: dims ordered innermost-first by
    the first input whose strides tell them apart (ties: the smaller dim inner), then dense."""
    ndim = len(shape)

    def should_swap(dim0: int, dim1: int) -> int:
        for strides in operands:
            stride0, stride1 = strides[dim0], strides[dim1]
            if stride0 == 0 or stride1 == 0:
                continue  # broadcast in one of the dims: the next input decides
            if stride0 != stride1:
                return 1 if stride0 > stride1 else -1
            if shape[dim0] > shape[dim1]:
                return 1
        return 0

    perm = list(range(ndim - 1, -1, -1))  # perm[0] is the innermost dim
    for start in range(1, ndim):
        dim1 = start
        for dim0 in range(start - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    strides, step = [0] * ndim, 1
    for dim in perm:
        strides[dim] = step
        step *= shape[dim]
    return strides
