"""Input mutations kept in the ATen graph: `copy_(input, new value)` nodes, batched.

AOTAutograd functionalizes a write into a graph input (a batch norm's running statistics in training, a
buffer updated in place) into a new value, and with `keep_inference_input_mutations` (kiln/aot/__init__.py)
ends the graph with `aten.copy_(input, new value)` per written input, rather than copying each one back in
its own runtime wrapper after the graph ran. Either way each copy is one call: ResNet-50's training forward
wrote 159 running statistics that way, 163 `aten::copy_` a step, each a dispatch and a launch in a step
whose host time (17.95 ms) exceeded its GPU time (16.11 ms; H100, 2026-12-07_profile-train-resnet50-ded8935).

`batch_input_copies` replaces such copies, where they are the graph's last writes of those inputs, with one
`aten._foreach_copy_` per dtype and device: one call, and on CUDA one multi-tensor kernel. Copies that a later
node reads around, that write one input twice, or that cast, broadcast or change a layout stay as they are.

`mutated_inputs` names the inputs a graph writes: CUDA graphs must read them in place, never through a copy of
their own (kiln/runtime/cudagraphs.py), or a replay's write would land in the copy.
"""
from __future__ import annotations

import torch

from kiln import _torch

aten = _torch.aten


def _input_copies(gm: torch.fx.GraphModule) -> list:
    """The `copy_(placeholder, value)` nodes of `gm`, in graph order, whose results nothing reads."""
    return [node for node in gm.graph.nodes
            if node.op == "call_function" and node.target is aten.copy_.default
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder"
            and not node.users and not node.kwargs]


def mutated_inputs(gm: torch.fx.GraphModule) -> tuple:
    """Positions of the placeholders that `gm` writes (a copy_ into them, batched or not)."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    written = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is aten.copy_.default and isinstance(node.args[0], torch.fx.Node):
            written.add(node.args[0])
        elif node.target is aten._foreach_copy_.default:
            written.update(target for target in node.args[0] if isinstance(target, torch.fx.Node))
    return tuple(position for position, node in enumerate(placeholders) if node in written)


def _plain_copy(node: torch.fx.Node) -> tuple | None:
    """(dtype, device) of a copy_ whose source has its destination's dtype, shape and strides, else None."""
    target, source = node.args[0].meta.get("val"), node.args[1]
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(target, torch.Tensor) or not isinstance(value, torch.Tensor):
        return None
    if target.dtype != value.dtype or target.device != value.device or target.shape != value.shape \
            or target.stride() != value.stride():
        return None
    return target.dtype, target.device


def batch_input_copies(gm: torch.fx.GraphModule) -> int:
    """Replace the input copies that end `gm` (nothing after them reads or writes their inputs) with one
    `_foreach_copy_` per (dtype, device) group of at least two; returns how many copies it replaced."""
    copies = _input_copies(gm)
    if len(copies) < 2:
        return 0
    nodes = list(gm.graph.nodes)
    position = {node: index for index, node in enumerate(nodes)}
    output = next(node for node in nodes if node.op == "output")
    targets = [node.args[0] for node in copies]
    groups: dict = {}
    for node in copies:
        key = _plain_copy(node)
        if key is None or targets.count(node.args[0]) > 1:
            continue
        between = nodes[position[node] + 1:position[output]]
        if any(node.args[0] in other.all_input_nodes for other in between if other not in copies):
            continue  # read after the copy: the copy stays where it is
        groups.setdefault(key, []).append(node)
    replaced = 0
    for group in groups.values():
        if len(group) < 2:
            continue
        with gm.graph.inserting_before(output):  # where the copies' last one was, or later: nothing reads them
            batched = gm.graph.call_function(aten._foreach_copy_.default,
                                             ([node.args[0] for node in group], [node.args[1] for node in group]))
        batched.meta["val"] = None
        for node in group:
            gm.graph.erase_node(node)
        replaced += len(group)
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced
