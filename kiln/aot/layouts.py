"""Channels-last convolutions: an inference graph's 2-D convolutions take NHWC operands.

cuDNN's fastest convolution kernels (tensor cores in fp16/bf16) read and write NHWC. Given NCHW
operands they transpose them in and out around each convolution, or pick slower kernels; eager
PyTorch runs a model in the layout its input comes in (NCHW, almost always). Inductor lays out a
convolutional graph channels-last; `choose_conv_layouts` does the same on kiln's ATen graph,
after its metas have eager's strides (kiln/aot/strides.py) and before lowering, which allocates every
buffer by its meta:

- Each 2-D convolution's input and weight become channels-last. Where the operand is made by a
  copy read by that convolution only (autocast's cast of the weight or of the model's input), the
  copy itself writes channels-last; anything else (a graph input, a value others read too) gets a
  channels-last copy of its own, made once.
- Every node downstream is given its new meta: eager's TensorIterator layout for a broadcasting
  pointwise op (batch norm's affine, a residual add), the op's meta kernel otherwise (the next
  convolution, pooling, views). So a chain of conv, batch norm, ReLU, pooling and residual adds
  stays channels-last, with no copy between.
- The graph's outputs keep the layouts they had: a changed one is copied back (contiguous).

Nothing changes (the graph keeps its traced layouts) where a downstream op's meaning depends on
its input's strides (`as_strided`, whose strides were read from the traced layout), where a meta
kernel refuses the new layout (a `view` the traced layout allowed), where a changed output was not
contiguous, or where sizes are symbolic. Training graphs are left as traced: their forward's saved
values would cross into the backward graph, compiled apart on the traced metas.

`config.conv_layout`: "auto" (the default: channels-last on CUDA), "keep", "channels_last" (every
device: how the CPU tests exercise it). It was "keep" until pointwise kernels walked their rows in
their output's memory order (kiln/schedule/loop_order.py): before that, on the H200 at 4626a8a with
"auto", ResNet-50 took 15.42 ms per call against eager's 7.33 in the same run, since a kernel over
NHWC buffers had its lanes C elements apart.
"""
from __future__ import annotations

import logging

import torch

from kiln import _torch
from kiln.config import config
from kiln.aot.strides import _broadcasting_pointwise, _tensor_iterator_op_strides, meta_from_operands

aten = _torch.aten
log = logging.getLogger("kiln")

CONVOLUTION = aten.convolution.default
# ops whose result depends on their input's strides, read from the traced layout
_STRIDE_DEPENDENT = {aten.as_strided.default, aten.as_strided_scatter.default, aten._reshape_alias.default}
_COPIES = {aten._to_copy.default, aten.clone.default}


class _KeepLayouts(Exception):
    """The graph keeps its traced layouts, for the reason given."""


def choose_conv_layouts(gm: torch.fx.GraphModule, *, inference: bool) -> bool:
    """Lay `gm`'s 2-D convolutions out channels-last, in place; whether the graph changed."""
    if not inference or config.conv_layout == "keep":
        return False
    convolutions = [node for node in gm.graph.nodes if _is_2d_convolution(node)]
    if not convolutions:
        return False
    if config.conv_layout == "auto" and any(node.meta["val"].device.type != "cuda" for node in convolutions):
        return False
    fake_mode = _torch.fake_mode_of([node.meta.get("val") for node in gm.graph.nodes if node.op == "placeholder"])
    if fake_mode is None or not all(_static(node) for node in convolutions):
        return False
    saved = {node: (node.meta.get("val"), node.args, node.kwargs) for node in gm.graph.nodes}
    try:
        with fake_mode:
            copies = _relayout(gm, saved)
    except _KeepLayouts as reason:
        _restore(gm, saved)
        log.debug("kiln: convolutions keep their traced layout: %s", reason)
        return False
    gm.graph.lint()
    gm.recompile()
    log.debug("kiln: %d convolutions run channels-last (%d layout copies)", len(convolutions), copies)
    return True


def _is_2d_convolution(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is not CONVOLUTION:
        return False
    metas = [node.meta.get("val"), *(arg.meta.get("val") for arg in node.args[:2] if isinstance(arg, torch.fx.Node))]
    return len(metas) == 3 and all(isinstance(meta, torch.Tensor) and meta.dim() == 4 for meta in metas)


def _static(node: torch.fx.Node) -> bool:
    metas = [node.meta["val"], node.args[0].meta["val"], node.args[1].meta["val"]]
    return all(isinstance(value, int) for meta in metas for value in (*meta.shape, *meta.stride()))


def _is_channels_last(meta: torch.Tensor) -> bool:
    return meta.is_contiguous(memory_format=torch.channels_last)


def _relayout(gm: torch.fx.GraphModule, traced: dict) -> int:
    """Walk the graph once in order: make convolution operands channels-last, re-derive every meta
    downstream of a change, and copy changed outputs back to their `traced` metas; the number of
    layout copies inserted."""
    graph = gm.graph
    changed: set = set()
    copies: dict = {}  # operand -> its channels-last copy
    for node in list(graph.nodes):
        if node.op == "output":
            _keep_output_layouts(graph, node, changed, traced)
            continue
        if node.op != "call_function":
            continue
        if _is_2d_convolution(node):
            for position in (0, 1):
                operand = node.args[position]
                if not _is_channels_last(operand.meta["val"]):
                    _make_channels_last(graph, node, position, changed, copies)
        if not any(arg in changed for arg in node.all_input_nodes):
            continue
        if node.target in _STRIDE_DEPENDENT:
            raise _KeepLayouts(f"{node.format_node()} reads its input's traced strides")
        before = node.meta.get("val")
        node.meta["val"] = _rederived(node)
        if _strides(node.meta["val"]) != _strides(before):
            changed.add(node)
    return len(copies)


def _make_channels_last(graph: torch.fx.Graph, convolution: torch.fx.Node, position: int, changed: set,
                        copies: dict) -> None:
    operand = convolution.args[position]
    if operand.op == "call_function" and operand.target in _COPIES and len(operand.users) == 1:
        # a copy only this convolution reads (autocast's cast): it writes channels-last itself
        operand.kwargs = {**operand.kwargs, "memory_format": torch.channels_last}
        operand.meta["val"] = _channels_last_like(operand.meta["val"])
        changed.add(operand)
        return
    if operand not in copies:
        with graph.inserting_after(operand):
            copy = graph.call_function(aten.clone.default, (operand,), {"memory_format": torch.channels_last})
        copy.meta = {**operand.meta, "val": _channels_last_like(operand.meta["val"])}
        copies[operand] = copy
    convolution.update_arg(position, copies[operand])
    changed.add(copies[operand])


def _channels_last_like(meta: torch.Tensor) -> torch.Tensor:
    strides = torch.empty(meta.shape, device="meta").contiguous(memory_format=torch.channels_last).stride()
    return torch.empty_strided(meta.shape, strides, dtype=meta.dtype, device=meta.device)


def _rederived(node: torch.fx.Node):
    """`node`'s fake result from its operands' current metas: eager's TensorIterator layout for a
    broadcasting pointwise op, the op's meta kernel otherwise."""
    if _broadcasting_pointwise(node):
        meta = node.meta["val"]
        strides = _tensor_iterator_op_strides(node, meta)
        if strides is not None:
            return torch.empty_strided(meta.shape, strides, dtype=meta.dtype, device=meta.device)
    try:
        result = meta_from_operands(node)
    except Exception as error:  # noqa: BLE001 (a view the new layout does not allow, a data-dependent op)
        raise _KeepLayouts(f"{node.format_node()}: {type(error).__name__}: {error}") from error
    if _shapes(result) != _shapes(node.meta.get("val")):
        raise _KeepLayouts(f"{node.format_node()} changed shape")
    return result


def _keep_output_layouts(graph: torch.fx.Graph, output: torch.fx.Node, changed: set, traced: dict) -> None:
    """Each changed output copied back to its traced layout (contiguous: any other is refused)."""
    replacements = {}
    for value in output.all_input_nodes:
        if value not in changed or value in replacements:
            continue
        meta, was = value.meta["val"], traced[value][0]
        if not isinstance(meta, torch.Tensor) or not isinstance(was, torch.Tensor) or not was.is_contiguous():
            raise _KeepLayouts(f"output {value.name} was traced with a layout other than contiguous")
        with graph.inserting_before(output):
            copy = graph.call_function(aten.clone.default, (value,), {"memory_format": torch.contiguous_format})
        copy.meta = {**value.meta, "val": was}
        replacements[value] = copy
    for value, copy in replacements.items():
        output.replace_input_with(value, copy)


def _strides(meta):
    if isinstance(meta, torch.Tensor):
        return tuple(meta.stride())
    if isinstance(meta, (list, tuple)):
        return tuple(_strides(item) for item in meta)
    return None


def _shapes(meta):
    if isinstance(meta, torch.Tensor):
        return tuple(meta.shape)
    if isinstance(meta, (list, tuple)):
        return tuple(_shapes(item) for item in meta)
    return None


def _restore(gm: torch.fx.GraphModule, saved: dict) -> None:
    """Undo `_relayout`: inserted copies removed, every node's meta and arguments as they were."""
    for node in reversed(list(gm.graph.nodes)):
        if node not in saved:
            continue
        meta, args, kwargs = saved[node]
        node.args, node.kwargs = args, kwargs
        if meta is not None:
            node.meta["val"] = meta
    for node in reversed(list(gm.graph.nodes)):
        if node not in saved:
            gm.graph.erase_node(node)


# ---- training graphs: channels-last before the joint trace ---------------------------------------------

TORCH_CONVOLUTIONS = (torch.conv2d, torch.nn.functional.conv2d)


def channels_last_training_convs(gm: torch.fx.GraphModule) -> bool:
    """Lay a training graph's 2-D convolutions out channels-last in the torch-level graph, before
    AOTAutograd traces forward and backward together (`config.conv_layout_training`); whether it did.

    `choose_conv_layouts` rewrites the ATen graph after the trace, which a training graph cannot take:
    its forward saves values for a backward compiled apart on the traced metas. Here each
    `torch.conv2d`'s input and weight get a `contiguous(memory_format=torch.channels_last)`, so the joint
    trace sees NHWC convolutions, and batch norm, ReLU, pooling and residual adds follow them through
    eager's layout rules, in the forward and in the backward alike. Where a value is NHWC already in the
    trace the call is a no-op. The frontend's example values downstream are re-derived by running the
    graph under its fake mode, so kiln/aot/strides.py's facts hold the new layouts. A changed 4-D output
    is copied back to its traced layout. The graph is left as traced where a call changes a mode (the
    re-derivation runs every call; in-place writes reach only the fake examples), where shapes are
    symbolic, where an output changed and was not contiguous, or where an op fails on the NHWC values (a view
    that only the traced layout allows, `y.view(n, -1)` after a convolution)."""
    from kiln.aot.plain import changes_mode

    if not config.conv_layout_training or config.conv_layout == "keep":
        return False
    convolutions = [node for node in gm.graph.nodes if node.op == "call_function" and node.target in TORCH_CONVOLUTIONS
                    and all(_example_4d(arg) is not None for arg in node.args[:2])]
    if not convolutions:
        return False
    weights = [_example_4d(node.args[1]) for node in convolutions]
    if not torch.is_grad_enabled() or not any(weight.requires_grad for weight in weights):
        return False  # inference (under no_grad parameters still require grad): choose_conv_layouts lays it out
    if config.conv_layout == "auto" and any(weight.device.type != "cuda" for weight in weights):
        return False
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    fake_mode = _torch.fake_mode_of([node.meta.get("example_value") for node in placeholders])
    if fake_mode is None or fake_mode.shape_env is not None:
        return False  # symbolic shapes: left as traced
    if any(changes_mode(node) for node in gm.graph.nodes):
        return False  # re-running it would change grad or autocast state
    output = next(node for node in gm.graph.nodes if node.op == "output")
    traced = {node: node.meta.get("example_value") for node in gm.graph.nodes}
    for node in convolutions:
        for position in (0, 1):
            with gm.graph.inserting_before(node):
                dense = gm.graph.call_method("contiguous", (node.args[position],),
                                             {"memory_format": torch.channels_last})
            node.update_arg(position, dense)
    try:
        _rederive_examples(gm, fake_mode)
    except Exception as error:  # noqa: BLE001 (an op the NHWC values cannot take: the graph is left as traced)
        log.debug("kiln: training convolutions keep their traced layouts: %s: %s", type(error).__name__, error)
        _undo_training_relayout(gm, fake_mode)
        return False
    for item in torch.utils._pytree.tree_leaves(output.args[0]):
        if not isinstance(item, torch.fx.Node):
            continue
        before, after = traced.get(item), item.meta.get("example_value")
        if not isinstance(before, torch.Tensor) or before.stride() == after.stride():
            continue
        if not before.is_contiguous():
            _undo_training_relayout(gm, fake_mode)
            return False
        with gm.graph.inserting_before(output):
            back = gm.graph.call_method("contiguous", (item,))
        back.meta = {**item.meta, "example_value": before}
        output.replace_input_with(item, back)
    gm.graph.lint()
    gm.recompile()
    log.debug("kiln: %d training convolutions take channels-last operands", len(convolutions))
    return True


def _example_4d(operand):
    value = operand.meta.get("example_value") if isinstance(operand, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) and value.dim() == 4 else None


def _rederive_examples(gm: torch.fx.GraphModule, fake_mode) -> None:
    """Every node's example value, computed anew from the placeholders' under `fake_mode`."""

    class _Examples(torch.fx.Interpreter):
        def run_node(self, node):
            if node.op == "placeholder":
                return node.meta["example_value"]
            value = super().run_node(node)
            if node.op != "output":
                node.meta["example_value"] = value
            return value

    placeholders = [node.meta["example_value"] for node in gm.graph.nodes if node.op == "placeholder"]
    with fake_mode:
        _Examples(gm).run(*placeholders)
    # Under autocast the run may have cached its casts of the (fake, leaf) parameters, keyed by tensor.
    # AOTAutograd's trace of the same fakes could then take them as constants, cut off from the
    # parameters. The cache only saves recomputing casts, so empty it. This is a precaution: no test
    # has shown the effect.
    torch.clear_autocast_cache()


def _undo_training_relayout(gm: torch.fx.GraphModule, fake_mode) -> None:
    for node in list(gm.graph.nodes):
        if node.op == "call_method" and node.target == "contiguous" and \
                node.kwargs.get("memory_format") is torch.channels_last and \
                any(user.target in TORCH_CONVOLUTIONS for user in node.users):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    _rederive_examples(gm, fake_mode)
    gm.recompile()
