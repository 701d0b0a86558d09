"""Identical graphs compiled once: a traced graph equal to one the same backend already compiled reuses its callable.

TorchDynamo keeps one cache per code object, so `forward` of every instance of a module class (and the
resume functions of its breaks) is served by the same compiled graphs, parameters being inputs. kiln's
dispatchers are per function and per module object (their guards hold identities), so N blocks of one
class that break in their `forward` trace N times; this table makes them compile once. A graph is reused
only when nothing it computes can differ: the same backend, the same nodes (code text and the very target
objects), no attributes or submodules of its own, static inputs with the same metadata (type, dtype,
device, layout, sizes, strides, offset, requires_grad, leaf and view state) and the same storage sharing
among them, under the same global state (grad mode, default dtype, autocast, determinism, matmul
precision) and kiln options, traced for another frame (a recompile of one frame compiles anew). Inputs are passed to it by each entry as before, so it reads each
instance's own parameters.

Not reused: graphs with symbolic inputs, and any graph when the backend replays CUDA graphs
(`mode="reduce-overhead"`: a recording holds parameters' addresses and its results live in its own
buffers until its next replay, so two frames sharing one would record again, or fall back, in turn).
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from kiln import _torch
from kiln.backend import CUDA_GRAPH_MODES
from kiln.config import config

MAX_GRAPHS_PER_BACKEND = 512
# graph compiler -> {key: (compiled callable, weak reference to the owner that compiled it)}
_compiled: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()
stats = {"reused": 0}


def _tensor_key(tensor: torch.Tensor) -> tuple:
    return (type(tensor), tensor.dtype, tensor.device, tensor.layout, tuple(tensor.shape), tensor.stride(),
            tensor.storage_offset(), tensor.requires_grad, tensor.is_leaf, tensor._is_view(),
            tensor.is_inference(), tensor.is_conj(), tensor.is_neg())


def _global_state() -> tuple:
    return (torch.is_grad_enabled(), torch.get_default_dtype(), _torch.autocast_state(),
            torch.is_inference_mode_enabled(),
            torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision(),
            tuple(sorted((name, repr(value)) for name, value in config.snapshot().items())))


def _replays_cuda_graphs(graph_compiler: Callable) -> bool:
    keywords = getattr(graph_compiler, "keywords", None) or {}
    return keywords.get("mode") in CUDA_GRAPH_MODES


def key_of(graph_compiler: Callable, graph_module: torch.fx.GraphModule, example_inputs: list) -> tuple | None:
    """What makes two graphs compile to interchangeable callables, or None when this one is not shared."""
    targets = []
    for node in graph_module.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            return None
        if node.op in ("call_function", "call_method"):
            targets.append(node.target)
    if not all(isinstance(value, torch.Tensor) for value in example_inputs):
        return None  # a SymInt: the graph is symbolic
    if _replays_cuda_graphs(graph_compiler):
        return None
    storages = _torch.storage_ids(*example_inputs)
    sharing = tuple(storages.index(storage) for storage in storages)  # the first input sharing each one's storage
    try:
        key = (graph_module.code, tuple(targets), tuple(_tensor_key(value) for value in example_inputs), sharing,
               _global_state())
        hash(key)
    except Exception:  # a target or value that cannot be a key: compiled on its own
        return None
    return key


def compile_or_reuse(graph_compiler: Callable, graph_module: torch.fx.GraphModule, example_inputs: list, *,
                     owner: Any) -> Callable:
    """`graph_compiler(graph_module, example_inputs)`, or the callable it returned for an identical graph of
    another frame. `owner` is the code object's cache the trace belongs to (its DynamicPolicy): a recompile
    of one frame compiles its graph anew (its guards failed for a reason, and another thread's entry gets a
    callable of its own)."""
    key = key_of(graph_compiler, graph_module, example_inputs)
    if key is None:
        return graph_compiler(graph_module, example_inputs)
    try:
        table = _compiled.setdefault(graph_compiler, {})
    except TypeError:  # a backend that cannot be weakly referenced
        return graph_compiler(graph_module, example_inputs)
    found = table.get(key)
    if found is not None and found[1]() is not owner:
        stats["reused"] += 1
        return found[0]
    compiled = graph_compiler(graph_module, example_inputs)
    if len(table) >= MAX_GRAPHS_PER_BACKEND:
        table.pop(next(iter(table)))
    table[key] = (compiled, weakref.ref(owner))
    return compiled
