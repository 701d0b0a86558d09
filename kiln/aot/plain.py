"""Plain inference graphs: a cold start that traces them once, and a warm start that skips AOTAutograd.

Cold (`trace_to_aten`, `config.plain_trace`): AOTAutograd traces every graph twice, once to collect
metadata (mutated inputs, aliased outputs) and once for the ATen graph, each trace through
functionalization. A plain graph (below) has nothing for the first trace to find, and for the cold trace
the rule against in-place calls is relaxed: a write to a value of the graph's own that no other name sees
(ResNet's ReLU(inplace=True)) needs no functionalization beyond calling the op's out-of-place form. So kiln
traces such a graph once, as AOTAutograd's second trace would, and calls the result as AOTAutograd's
wrapper would (`runtime_wrapper`).

Warm:

The whole-graph cache (kiln/runtime/graph_cache.py) keeps each compiled ATen graph's module, but a new
process still traces the torch-level graph to ATen with AOTAutograd to find that graph's key: most of a
warm first call. For a *plain inference graph* the trace can be skipped: the torch-level graph's key
links to the ATen graph's entry, and the module it holds is called as AOTAutograd's runtime wrapper
would call it.

A graph is plain when AOTAutograd's wrapper around its compiled ATen graph does nothing but call it:
- it needs no autograd (grad mode off, or no input requires grad): AOTAutograd compiles it as inference;
- no node may write or restride anything in place (an input mutation is copied back by the wrapper),
  no input shares storage with another (AOTAutograd dedupes them, or makes a synthetic base), and
  no output shares storage with an input or another output (the wrapper regenerates aliases);
- it holds no parameters, buffers or submodules (AOTAutograd would lift them as inputs), every call
  target is an ATen op, a function of torch's or of `operator`, or a method name (something its
  qualified name and torch's version identify across processes); grad mode may change inside (Llama's
  rotary embedding is a `torch.no_grad()` function) when the graph leaves it as it found it and does not
  turn it on where an input requires grad; autocast regions are allowed when each one the graph enters it also leaves (Llama's rotary
  embedding turns autocast off around its float32 math): the trace bakes their casts into the ATen
  graph, and the global state after the graph is what it was before;
- its ATen graph, compiled, took exactly the graph's inputs and gave exactly its outputs.
Its key is the whole-graph cache's key of the torch-level graph, with the grad and autocast modes
in force. The call then does what AOTAutograd's inference wrapper does: grad off, autocast off
when it was on at compile time (the trace applied it), outputs as a list.
"""
from __future__ import annotations

import contextlib
import logging
import operator
import types
from typing import Any, Callable

import torch

from kiln import _torch
from kiln.aot.strides import _AUGMENTED_ASSIGNMENTS
from kiln.config import config
from kiln.runtime import graph_cache

log = logging.getLogger("kiln")

_MODE_CHANGES = ("_set_grad_enabled", "set_grad_enabled", "_enter_autocast", "_exit_autocast", "_enter_inference_mode",
                 "_exit_inference_mode", "set_autocast_enabled")
_AUGMENTED = _AUGMENTED_ASSIGNMENTS | {operator.setitem, operator.delitem}
_ENTER_AUTOCAST, _EXIT_AUTOCAST = _torch.autocast_region_functions()
_SET_GRAD_ENABLED = torch._C._set_grad_enabled


def key_of(gm: torch.fx.GraphModule, example_inputs: list, mode: str) -> str | None:
    """The key linking `gm` to its compiled ATen graph, or None when `gm` is not plain (or not cached).
    Why a graph is not plain is logged under KILN_LOGS=perf: its warm start traces it to ATen."""
    reason = not_plain_reason(gm, example_inputs)
    if reason is not None:
        if config.log_enabled("perf"):
            log.warning("kiln: a warm start traces this graph to ATen with AOTAutograd (not a plain inference "
                        "graph: %s)", reason)
        return None
    state = [f"grad {torch.is_grad_enabled()}", f"autocast {_torch.autocast_state()}",
             f"autocast cache {torch.is_autocast_cache_enabled()}", f"outputs {output_count(gm)}"]
    return graph_cache.key_of(gm, example_inputs, mode, level="torch", extra=state)


def not_plain_reason(gm: torch.fx.GraphModule, example_inputs: list, *, private_writes: bool = False) -> str | None:
    """Why `gm` is not a plain inference graph (the module docstring's rules), or None when it is.
    `private_writes`: in-place calls are allowed (the cold trace's rule: `trace_to_aten` makes the writes to the
    graph's own fresh values functional, and refuses any other)."""
    if torch.is_grad_enabled() and any(isinstance(value, torch.Tensor) and value.requires_grad
                                       for value in example_inputs):
        return "it needs autograd"
    if not all(isinstance(value, torch.Tensor) for value in example_inputs):
        return "an input is not a tensor"
    if any(True for _ in gm.parameters()) or any(True for _ in gm.buffers()) or any(True for _ in gm.children()):
        return "it holds parameters, buffers or submodules"
    if len(set(_torch.storage_ids(*example_inputs))) != len(example_inputs):
        return "two inputs share storage"
    outputs, inputs = [], []
    open_autocasts: list[torch.fx.Node] = []
    grad_mode = torch.is_grad_enabled()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            inputs.append(node.meta.get("example_value", node.meta.get("val")))
        elif node.op == "output":
            outputs = [item for item in torch.utils._pytree.tree_leaves(node.args[0]) if isinstance(item, torch.fx.Node)]
        elif node.target is _SET_GRAD_ENABLED and len(node.args) == 1 and not node.kwargs \
                and isinstance(node.args[0], bool):
            grad_mode = node.args[0]
            if grad_mode and any(value.requires_grad for value in example_inputs):
                return f"{node.name} turns grad mode on around inputs that require grad"
        elif node.target is _ENTER_AUTOCAST:
            open_autocasts.append(node)
        elif node.target is _EXIT_AUTOCAST:
            if not open_autocasts or node.args != (open_autocasts[-1],):
                return f"{node.name} leaves an autocast region it did not enter last"
            open_autocasts.pop()
        elif node.op in ("call_function", "call_method") and not _plain_call(node, private_writes):
            return f"{node.name} ({node.op} {getattr(node.target, '__name__', node.target)}) may write in place, " \
                   "change a mode, or is not named by a qualified name"
        elif node.op not in ("placeholder", "call_function", "call_method", "output"):
            return f"{node.name} is a {node.op} node"
    if open_autocasts:  # a region left open (a graph break inside it): the graph changes the global state
        return "an autocast region stays open after the graph"
    if grad_mode != torch.is_grad_enabled():
        return "the graph leaves grad mode changed"
    values = [node.meta.get("example_value", node.meta.get("val")) for node in outputs]
    if not all(isinstance(value, torch.Tensor) for value in (*values, *inputs)):
        return "an input or output has no trace-time tensor to tell aliasing by"
    output_storages = _torch.storage_ids(*values)  # the trace's fake values: outputs and inputs alike
    if len(set(output_storages)) != len(values):
        return "two outputs share storage"
    if set(output_storages) & set(_torch.storage_ids(*inputs)):
        return "an output shares storage with an input"
    if _torch.any_autocast_enabled() and not any(enabled for _, enabled, _ in _torch.autocast_state()):
        return "autocast is on for a device kind the wrapper cannot turn off as AOTAutograd does"
    return None


def changes_mode(node: torch.fx.Node) -> bool:
    """Whether a call changes grad or autocast mode (kiln/aot/layouts.py re-runs a graph without such calls
    under its fake mode)."""
    if node.op not in ("call_function", "call_method"):
        return False
    return node.target in (_ENTER_AUTOCAST, _EXIT_AUTOCAST) or getattr(node.target, "__name__", "") in _MODE_CHANGES


def _writes_in_place(node: torch.fx.Node) -> bool:
    """Whether a torch-level call may write a tensor argument in place (its data or its layout: `t_()`)."""
    target = node.target
    if node.kwargs.get("inplace") is True or target in _AUGMENTED:
        return True
    if isinstance(target, torch._ops.OpOverload):
        return bool(_writes(node))
    name = target if isinstance(target, str) else (getattr(target, "__name__", "") or "")
    return (name.endswith("_") and not name.endswith("__")) or name in ("__setitem__", "__delitem__")


def _plain_call(node: torch.fx.Node, writes_allowed: bool = False) -> bool:
    """A call that writes nothing in place, changes no mode, and whose target a name identifies. With
    `writes_allowed`, a call may write its first argument when that is a value the graph computed (an input's
    fake, as the frontend's trace left it, may already show the write: the single trace must not see inputs
    written); `out=` never."""
    target = node.target
    if "out" in node.kwargs:
        return False
    if _writes_in_place(node):
        written = node.args[0] if node.args else None
        if not writes_allowed or not isinstance(written, torch.fx.Node) or written.op == "placeholder":
            return False
    if isinstance(target, (str, torch._ops.OpOverload)):
        return True
    name = getattr(target, "__name__", "") or ""
    if name in _MODE_CHANGES:
        return False
    module = getattr(target, "__module__", None) or ""
    if isinstance(target, (types.BuiltinFunctionType, types.FunctionType)):
        return module in ("_operator", "operator", "torch") or module.startswith("torch.")
    return False


def output_count(gm: torch.fx.GraphModule) -> int:
    (output,) = [node for node in gm.graph.nodes if node.op == "output"]
    return len(torch.utils._pytree.tree_leaves(output.args[0]))


def link(key: str, compiled_graphs: list, gm: torch.fx.GraphModule, example_inputs: list) -> None:
    """After a compile: store `key` -> the ATen graph's entry when AOTAutograd made exactly one inference
    graph that took the inputs and gave the outputs as they were (`compiled_graphs`: what compile_aten_graph
    recorded, (key, inference, input count, output count, ATen node count) per graph)."""
    if len(compiled_graphs) != 1:
        reason = f"AOTAutograd made {len(compiled_graphs)} ATen graphs"
    else:
        aten_key, inference, inputs, outputs, aten_nodes = compiled_graphs[0]
        if aten_key is None:
            reason = "its ATen graph's module is not in the whole-graph cache"
        elif not inference:
            reason = "AOTAutograd compiled it for training"
        elif inputs != len(example_inputs) or outputs != output_count(gm):
            reason = (f"its ATen graph takes {inputs} inputs and gives {outputs} outputs, where the graph takes "
                      f"{len(example_inputs)} and gives {output_count(gm)}")
        else:
            graph_cache.store_link(key, aten_key, {"autocast": _torch.autocast_state(), "aten_nodes": aten_nodes})
            return
    if config.log_enabled("perf"):
        log.warning("kiln: a plain inference graph is not linked to its ATen graph, so a warm start traces it "
                    "with AOTAutograd: %s", reason)


def _autocast_blocks(states: tuple, enabled: bool) -> contextlib.ExitStack:
    """`torch.autocast` blocks for the devices whose autocast was on in `states`: off (`enabled`
    False), or on again with their dtypes."""
    stack = contextlib.ExitStack()
    for device, was_enabled, dtype in states:
        if was_enabled:
            stack.enter_context(torch.autocast(device, dtype=dtype, enabled=enabled))
    return stack


def runtime_wrapper(compiled: Callable, facts: dict) -> Callable:
    """`compiled` (the ATen graph's callable) called as AOTAutograd's inference wrapper calls it: grad off,
    autocast off where it was on at compile time (the ATen graph holds its casts), outputs as a list.
    Without autocast (the usual case) a call enters one block, no_grad."""
    states = facts["autocast"]
    autocast = any(enabled for _, enabled, _ in states)
    boxed = getattr(compiled, "_boxed_call", False)

    def call(*args: Any) -> list:
        with torch.no_grad():
            if autocast:
                with _autocast_blocks(states, enabled=False):
                    outputs = compiled(list(args)) if boxed else compiled(*args)
            else:
                outputs = compiled(list(args)) if boxed else compiled(*args)
        return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]

    call.__wrapped__ = compiled
    return call


def eager_fallback(gm: torch.fx.GraphModule, facts: dict) -> Callable:
    """The torch-level graph run by torch, boxed, under the autocast it was traced with (it is called
    inside `runtime_wrapper`'s autocast-off block, when a kernel fails to compile at its first launch)."""
    states = facts["autocast"]

    def run(args: list) -> list:
        inputs = list(args)
        args.clear()
        with _autocast_blocks(states, enabled=True):
            outputs = gm(*inputs)
        return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]

    run._boxed_call = True
    return run


def trace_to_aten(gm: torch.fx.GraphModule, example_inputs: list, decompositions: dict):
    """A plain inference graph traced to a functional ATen graph without AOTAutograd: (ATen graph, its fake
    inputs), or None where AOTAutograd must trace it (`_torch.plain_trace_inputs`; a trace that wrote in place).

    For a plain graph AOTAutograd's work reduces to one trace, after a first one that only collects metadata
    (which inputs are mutated, which outputs alias): none are, by the rules above. Its functionalization
    would rewrite in-place writes; those to the graph's own values become out-of-place calls here
    (`functionalize_private_writes`), and any other makes the trace fall back. The trace is AOTAutograd's
    otherwise: the same decompositions and Python dispatcher, under the
    frontend's fake mode, with grad off, under the caller's autocast (whose casts the ATen graph holds), the
    outputs flattened, dead nodes removed. Measured on this project's 2-core CPU machine (bf16 autocast,
    1 x 64 tokens, C++ kernels already built, median of 3 processes): first call BERT-base 2.42 -> 1.99 s,
    GPT-2 2.61 -> 2.03, the Llama-style model 2.15 -> 1.69, an 8-block torchvision-style ResNet (64 channels,
    32 x 32) 0.88 -> 0.71 (2026-12-06)."""
    found = _torch.plain_trace_inputs(example_inputs)
    if found is None:
        return None
    fake_mode, fakes = found

    def run(*args):
        return torch.utils._pytree.tree_leaves(_torch.run_graph_for_trace(gm, list(args), fake_mode))

    with torch.no_grad():
        aten = _torch.make_fx_aten(run, fake_mode, fakes, decompositions)
    refused = functionalize_private_writes(aten.graph)
    if refused is not None:
        if config.log_enabled("perf"):
            log.warning("kiln: a plain graph's ATen trace writes in place (%s): AOTAutograd traces it", refused)
        return None
    aten.graph.eliminate_dead_code()  # as AOTAutograd does: an unused part of a tuple result (getitem) goes
    aten.recompile()
    return aten, fakes


def _writes(node: torch.fx.Node) -> list:
    """The positions of the arguments an ATen call writes in place (its schema's `Tensor(a!)` arguments)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return []
    return [position for position, argument in enumerate(node.target._schema.arguments)
            if argument.alias_info is not None and argument.alias_info.is_write]


def _is_view(node: torch.fx.Node) -> bool:
    """An ATen call whose result aliases an argument (a view: `Tensor(a)` in, `Tensor(a)` out, nothing written;
    and `_unsafe_view`, whose schema does not say that its result shares its argument's memory). An item of a
    call's tuple result is a view when that call is (`split`, `chunk`: a list of views of their argument)."""
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        return _is_view(node.args[0])
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or _writes(node):
        return False
    if node.target.overloadpacket is torch.ops.aten._unsafe_view:
        return True
    return any(result.alias_info is not None for result in node.target._schema.returns)


def _same_dtype_operands(node: torch.fx.Node, base: torch.fx.Node) -> bool:
    """Whether every tensor operand of `node` has `base`'s dtype: an in-place op keeps its target's dtype
    (`out += x` on bf16 `out` and float32 `x` stays bf16), where its out-of-place form would promote."""
    dtype = getattr(base.meta.get("val"), "dtype", None)
    operands = [value for value in torch.utils._pytree.tree_leaves((node.args, node.kwargs))
                if isinstance(value, torch.fx.Node)]
    return dtype is not None and all(getattr(operand.meta.get("val"), "dtype", None) == dtype for operand in operands)


def functionalize_private_writes(graph: torch.fx.Graph) -> str | None:
    """Make the in-place calls of an ATen graph functional where each writes a value of the graph's own that
    nothing else sees: `relu_(x)` becomes `relu(x)` and every later use of `x` reads the new value, as a
    torchvision ResNet's `ReLU(inplace=True)` and `out += identity` need. Such a write is private when its one
    written argument is the call's first, its result is that argument, and the argument is made by a call that
    is not a view and has no view taken of it: no other name sees the memory; and its tensor operands share the
    argument's dtype (the out-of-place form would promote where the write keeps it). Returns None when every write
    became functional; otherwise, the first write that could not (an input's, a view's, an `out=` call's), with
    the graph then not to be used."""
    order = {node: index for index, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        written = _writes(node)
        if not written:
            continue
        name = node.target._schema.name.split("::")[-1]
        base = node.args[0] if node.args else None
        functional = getattr(getattr(torch.ops.aten, name.rstrip("_"), None), node.target._overloadname, None) \
            if name.endswith("_") and not name.endswith("__") else None
        returns = node.target._schema.returns
        if (written != [0] or not isinstance(base, torch.fx.Node) or base.op != "call_function" or _is_view(base)
                or any(_is_view(user) for user in base.users) or functional is None
                or len(returns) != 1 or returns[0].alias_info is None or not returns[0].alias_info.is_write
                or not _same_dtype_operands(node, base)):
            return str(node.target)
        with graph.inserting_before(node):
            replacement = graph.call_function(functional, node.args, node.kwargs)
        replacement.meta = dict(node.meta)
        order[replacement] = order[node]
        for user in list(base.users):
            if user not in (node, replacement) and order[user] > order[node]:
                user.replace_input_with(base, replacement)
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)
    return None
