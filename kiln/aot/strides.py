"""Eager's strides where the ATen graph's fake-tensor (meta) layouts differ from eager's.

kiln allocates buffers, and gives graph outputs their strides, from the ATen graph's
fake-tensor metas. Where those disagree with eager's layout the compiled graph returns
strides eager never would, and the wrong meta spreads to every op downstream (a pointwise
op follows its input's layout). `restride_to_eager(gm)` replaces such metas with eager's
layout and re-derives the metas downstream of them (three rules, below). Two layouts must be
right in the trace itself instead, since the program's own `.contiguous()` or
`.reshape()` copies or aliases by them, and restriding after the trace is too late:

- `aten.index.Tensor` (`index_layout`, used by kiln/aot/decompositions.py `index`): eager's
  kernel (CPU and CUDA) is a TensorIterator over the source restrided to the output's shape
  (stride 0 in the indexed dims) and the index tensors broadcast and reshaped to it, so its
  result follows the index tensors' layout as well as the source's; the meta kernel ignores
  the index tensors' strides (a transposed index gives a row-major result where eager's is
  column-major).
- In-place writes whose functional form relayouts the written tensor (`keep_written_layouts`,
  on the torch-level graph before tracing).

The rules of `restride_to_eager`, each in one function:

- `aten.logical_and/or/xor` (`_tensor_iterator_op_strides`): eager's kernels are
  TensorIterators over both operands; the meta kernels (torch's refs) order the dims by
  the first operand alone, even where it is broadcast (a 0-dim or 1-D first operand gives
  a row-major result beside a transposed second one). Every other pointwise op whose operands
  broadcast takes the same rule (`_broadcasting_pointwise`).
- In-place writes (`_in_place_strides`): eager's `x.op_(...)` keeps x's layout, but
  functionalization replaces it with `op(x, ...)`, laid out by op's own rule
  (masked_fill_ becomes a `where` that follows the mask's layout), and every later read
  of x, or of a view of it, reads that. The torch-level graph knows which nodes write in
  place: `tag_torch_graph` stamps each of its nodes with its name (in meta["custom"],
  which AOTAutograd copies onto every ATen node traced from it) and returns which node each
  one writes; the ATen result of a write then takes the layout of the value it replaces.
- Composite ops (`_composite_strides`): layer_norm, softmax, batch_norm and the like are decomposed
  into reductions and pointwise ops, which follow their input's layout, and any `.contiguous()`
  in the decomposition was decided on the input's meta at trace time. Eager's kernel lays its
  result out by a rule of its own (`COMPOSITE_LAYOUTS`): the last ATen node traced from the
  op takes that rule's layout, applied to the input's layout after the rules above (an index
  result made column-major by `index_layout`, then layer_norm's, came out column-major where
  eager's is contiguous: fuzz seed 3012 #965).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kiln import _torch

aten = _torch.aten

SOURCE_KEY = "kiln_source"  # meta["custom"][SOURCE_KEY]: the torch-level node an ATen node was traced from

# Python's augmented assignments on tensors write their left operand.
_AUGMENTED_ASSIGNMENTS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                          operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor,
                          operator.ilshift, operator.irshift, operator.imatmul}

_TENSOR_ITERATOR_OPS = {aten.logical_and.default, aten.logical_or.default, aten.logical_xor.default}


# How eager's kernel lays out a composite op's result: "contiguous" always (layer_norm and softmax
# call input.contiguous() or allocate contiguous), "suggested" densely in the input's suggested
# memory format (channels_last stays channels_last, anything else is contiguous); and on which
# devices. Measured on CPU eager with transposed, permuted, stepped and channels_last inputs. On
# CUDA the rule holds for softmax (one structured meta for both devices), layer_norm (a contiguous
# copy of the input) and rms_norm (kiln's own decomposition of _fused_rms_norm follows it); the
# others, not measured on CUDA, keep their decomposition's layout there.
_EVERYWHERE, _CPU = ("cpu", "cuda"), ("cpu",)
COMPOSITE_LAYOUTS = {
    F.layer_norm: ("contiguous", _EVERYWHERE), torch.layer_norm: ("contiguous", _EVERYWHERE),
    F.softmax: ("contiguous", _EVERYWHERE), torch.softmax: ("contiguous", _EVERYWHERE),
    "softmax": ("contiguous", _EVERYWHERE),
    F.log_softmax: ("contiguous", _EVERYWHERE), torch.log_softmax: ("contiguous", _EVERYWHERE),
    "log_softmax": ("contiguous", _EVERYWHERE),
    F.rms_norm: ("suggested", _EVERYWHERE),
    F.batch_norm: ("suggested", _CPU), torch.batch_norm: ("suggested", _CPU),
    F.group_norm: ("suggested", _CPU), torch.group_norm: ("suggested", _CPU),
    torch.roll: ("suggested", _CPU), "roll": ("suggested", _CPU),  # with dims; flattened: contiguous
}
_ROLLS = (torch.roll, "roll")


@dataclass(frozen=True)
class TorchGraphFacts:
    """What the torch-level graph says for `restride_to_eager`: in-place writes and composite ops."""

    writes: dict  # name of a node that writes a tensor in place -> name of the node it writes
    inputs: tuple  # the names of the graph's placeholders, in order
    composites: dict = field(default_factory=dict)  # node name -> (its COMPOSITE_LAYOUTS rule, its input's name)
    first_inputs: dict = field(default_factory=dict)  # node name -> the name of its first node operand


def tag_torch_graph(gm: torch.fx.GraphModule) -> TorchGraphFacts:
    """Stamp every node of the torch-level graph `gm` with its name (meta["custom"][SOURCE_KEY]),
    say which nodes write which in place, and which are composite ops with a layout rule."""
    writes, composites, first_inputs = {}, {}, {}
    for node in gm.graph.nodes:
        node.meta["custom"] = {**(node.meta.get("custom") or {}), SOURCE_KEY: node.name}
        if node.all_input_nodes:
            first_inputs[node.name] = node.all_input_nodes[0].name
        written = _written_operand(node)
        if isinstance(written, torch.fx.Node):
            writes[node.name] = written.name
        rule = _composite_rule(node)
        if rule is not None:
            composites[node.name] = (rule, node.args[0].name)
    inputs = tuple(node.name for node in gm.graph.nodes if node.op == "placeholder")
    return TorchGraphFacts(writes, inputs, composites, first_inputs)


def _composite_rule(node: torch.fx.Node) -> tuple | None:
    if node.op not in ("call_function", "call_method") or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    if node.op == "call_method" and not isinstance(node.target, str):
        return None
    try:
        rule = COMPOSITE_LAYOUTS.get(node.target)
    except TypeError:  # an unhashable target
        return None
    if rule is not None and node.target in _ROLLS and len(node.args) < 3 and node.kwargs.get("dims") is None:
        rule = ("contiguous", rule[1])  # roll without dims rolls the flattened tensor
    return rule


def _written_operand(node: torch.fx.Node):
    """The operand `node` writes in place (keeping its layout), or None: `x.add_(y)`, `torch.relu_(x)`,
    `x += y`, `x[i] = y`, `F.relu(x, inplace=True)`, `torch.add(x, y, out=z)`. In-place view ops
    (`x.t_()`, `x.unsqueeze_(0)`) change the layout: they are not writes here."""
    if node.op not in ("call_method", "call_function"):
        return None
    if isinstance(node.kwargs.get("out"), torch.fx.Node):
        return node.kwargs["out"]
    if not node.args:
        return None
    target = node.target
    if node.kwargs.get("inplace") is True or target in _AUGMENTED_ASSIGNMENTS or target is operator.setitem:
        return node.args[0]
    schema = getattr(target, "_schema", None)
    if schema is not None:  # an ATen overload
        arguments = schema.arguments
        writes_self = bool(arguments) and arguments[0].alias_info is not None and arguments[0].alias_info.is_write
        return node.args[0] if writes_self and torch.Tag.inplace_view not in target.tags else None
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if not isinstance(name, str) or not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(aten, name, None)
    if packet is None or any(torch.Tag.inplace_view in getattr(packet, overload).tags for overload in packet.overloads()):
        return None
    return node.args[0]


def keep_written_layouts(gm: torch.fx.GraphModule) -> int:
    """Rewrite the torch-level graph's in-place writes whose functional form may lay the value out
    differently from the written tensor: `x.op_(...)` becomes `scratch = x.clone();
    scratch.op_(...); x.copy_(scratch)`. Returns how many it rewrote.

    Functionalization replaces `x.op_(...)` with `op(x, ...)`, laid out by op's own rule
    (masked_fill, scatter, tril, a decomposition that reads another operand first), where eager's
    x keeps its layout. Every later read of x in the trace then has the wrong layout, and a
    `.contiguous()` or `.reshape()` of it decided on that layout aliased where eager copies, so a
    later in-place write showed through (wrong values; torch.compile's too). Restriding after
    the trace is too late for those. `copy` keeps its destination's layout, so after the rewrite
    x's value is laid out as eager's at every step; kiln's scheduler fuses the clone, the op and
    the copy into one kernel. Writes whose layout cannot change are left alone: all operands
    contiguous, or a pointwise op whose tensor operands all share x's shape and strides (or are
    0-dim). Needs the frontend's example values (meta["example_value"]); without them, no rewrite.
    """
    rewritten = 0
    for node in list(gm.graph.nodes):
        written = _written_operand(node)
        if not isinstance(written, torch.fx.Node) or not node.args or node.args[0] is not written:
            continue  # out= and setitem's writes keep the layout already; copy_ is the rewrite itself
        if node.target is operator.setitem or node.target == "copy_" or not _write_may_relayout(node, written):
            continue
        with gm.graph.inserting_before(node):
            scratch = gm.graph.call_method("clone", (written,))
        node.args = (scratch, *node.args[1:])
        with gm.graph.inserting_after(node):
            back = gm.graph.call_method("copy_", (written, scratch))
        node.replace_all_uses_with(back)
        for new in (scratch, back):
            new.meta.update({key: value for key, value in node.meta.items() if key != "example_value"})
            new.meta["example_value"] = written.meta["example_value"]
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def expand_writes_as_views(gm: torch.fx.GraphModule) -> int:
    """Rewrite `v = x.expand(sizes)` whose result is written in place (`v.add_(1)`) and that broadcasts
    nothing (it only puts size-1 dims in front: a write to an expand that broadcasts raises in eager)
    as `x.unsqueeze(0)...`, the same view. Returns how many it rewrote.

    Functionalization writes through an expand view as base + sum_to(written - base): inf - inf makes the
    whole result NaN where the written value is infinite, and in float16 (x^2 + 2) - x^2 is not 2, where
    eager just wrote the view (fuzz seed 4051 #2919; torch.compile's aot_eager gives NaN too). An unsqueeze's
    inverse is a view, so the write stays a plain write. Needs meta["example_value"]."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if not (node.op == "call_method" and node.target == "expand" or node.target is torch.Tensor.expand):
            continue
        if not any(_written_operand(user) is node for user in node.users):
            continue
        source, result = node.args[0], node.meta.get("example_value")
        value = source.meta.get("example_value") if isinstance(source, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or not isinstance(result, torch.Tensor):
            continue
        added = result.dim() - value.dim()
        if added < 0 or tuple(result.shape[added:]) != tuple(value.shape) or any(
                size != 1 for size in result.shape[:added]):
            continue  # it broadcasts: the write raises in eager
        with gm.graph.inserting_before(node):
            if added == 0:  # expand to its own shape: the tensor itself, as a view
                view = gm.graph.call_method("view_as", (source, source))
            else:
                view = source
                for _ in range(added):
                    view = gm.graph.call_method("unsqueeze", (view, 0))
                    view.meta.update({key: meta for key, meta in node.meta.items() if key != "example_value"})
        view.meta.update(node.meta)  # the last one is the expand's value
        node.replace_all_uses_with(view)
        gm.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def _write_may_relayout(node: torch.fx.Node, written: torch.fx.Node) -> bool:
    """Whether the functional form of in-place write `node` of `written` may not keep its layout."""
    value = written.meta.get("example_value")
    if not isinstance(value, torch.Tensor):
        return False
    operands, flat = [], []
    torch.fx.node.map_arg((node.args[1:], node.kwargs), flat.append)
    for arg in flat:
        example = arg.meta.get("example_value")
        if isinstance(example, torch.Tensor):
            operands.append(example)
        elif example is None:
            return False  # an operand the frontend did not describe: leave the write as it is
    values = [*value.shape, *value.stride()]
    for operand in operands:
        values += [*operand.shape, *operand.stride()]
    if not all(isinstance(item, int) for item in values):
        return False  # symbolic sizes: the meta's layouts stand (as for every rule here)
    if value.is_contiguous() and all(operand.is_contiguous() for operand in operands):
        return False
    same_layout = all(operand.dim() == 0 or (operand.shape == value.shape and operand.stride() == value.stride())
                      for operand in operands)
    return not (same_layout and _is_pointwise_write(node))


_AUGMENTED_OPS = {operator.iadd: "add", operator.isub: "sub", operator.imul: "mul", operator.itruediv: "div",
                  operator.ifloordiv: "floor_divide", operator.imod: "remainder", operator.ipow: "pow",
                  operator.iand: "bitwise_and", operator.ior: "bitwise_or", operator.ixor: "bitwise_xor",
                  operator.ilshift: "bitwise_left_shift", operator.irshift: "bitwise_right_shift"}


def _is_pointwise_write(node: torch.fx.Node) -> bool:
    """Whether in-place write `node` is a pointwise ATen op's (`x.mul_(y)`, `x += y`, `F.relu(x, inplace=True)`)."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return torch.Tag.pointwise in target.tags and target.overloadpacket is not aten.masked_fill_
    name = _AUGMENTED_OPS.get(target) if not isinstance(target, str) else None
    if name is None:
        name = target if isinstance(target, str) else getattr(target, "__name__", "")
        name = name[:-1] if isinstance(name, str) and name.endswith("_") else name
    packet = getattr(aten, name, None) if isinstance(name, str) and name else None
    if packet is None or packet is aten.masked_fill:  # no TensorIterator: a contiguous clone, filled
        return False
    return any(torch.Tag.pointwise in getattr(packet, overload).tags for overload in packet.overloads())


def restride_to_eager(gm: torch.fx.GraphModule, facts: TorchGraphFacts | None = None) -> bool:
    """Give the nodes of the ATen graph `gm` that the rules above cover eager's output strides and
    re-derive the fake metas of the nodes downstream; returns whether any meta changed. Shapes
    never change. `facts` (`tag_torch_graph` of the torch-level graph) names the in-place
    writes and composite ops; pass it for a forward or inference graph only (a backward's nodes
    are traced from the forward's torch-level nodes too, but none of those ops is the backward's)."""
    fake_mode = _torch.fake_mode_of([node.meta.get("val") for node in gm.graph.nodes if node.op == "placeholder"])
    if fake_mode is None:
        return False
    sources = _SourceValues(gm, facts) if facts is not None else None
    replaced_values = _replaced_values(sources) if sources is not None else {}
    composites = _composite_results(sources) if sources is not None else {}
    replaced: set = set()
    with fake_mode:
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            meta = node.meta.get("val")
            strides = _eager_strides(node, meta, replaced_values, composites) if isinstance(meta, torch.Tensor) else None
            if strides is not None:
                if tuple(strides) != tuple(meta.stride()):
                    node.meta["val"] = torch.empty_strided(meta.shape, strides, dtype=meta.dtype, device=meta.device)
                    replaced.add(node)
            elif any(isinstance(arg, torch.fx.Node) and arg in replaced for arg in node.all_input_nodes):
                try:
                    node.meta["val"] = meta_from_operands(node)  # the op's meta kernel on the new layout
                except Exception:  # noqa: BLE001 (a data-dependent op): its meta stands, shapes are unchanged
                    continue
                replaced.add(node)
    return bool(replaced)


def meta_from_operands(node: torch.fx.Node):
    """`node`'s op run (under the graph's fake mode) on its operands' current metas: its result's meta."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda arg: arg.meta["val"])
    return node.target(*args, **kwargs)


def _eager_strides(node, meta: torch.Tensor, replaced_values: dict, composites: dict) -> list[int] | None:
    """Eager's strides for `node`'s result where a rule covers it, else None (its meta's stand)."""
    if node in replaced_values:
        return _in_place_strides(meta, replaced_values[node].meta.get("val"))
    if node in composites:
        return _composite_strides(meta, *composites[node])
    if node.target in _TENSOR_ITERATOR_OPS or _broadcasting_pointwise(node):
        return _tensor_iterator_op_strides(node, meta)
    return None


def _broadcasting_pointwise(node) -> bool:
    """A pointwise ATen op (eager: a TensorIterator) over tensor operands of different shapes.

    With one shape, TensorIterator's fast path and torch's meta kernels agree. Broadcast, the meta
    kernels (torch's refs) take the row-major fast path whenever every operand is contiguous,
    which size-1 dims make easy, while TensorIterator orders the dims by the operands' strides,
    size-1 dims included: `torch.where(c, x, y)` with c of shape (2, 1) and y of shape (1, 1, 1, 2)
    and strides (1, 2, 2, 1) is (1, 4, 1, 2) in eager and (4, 4, 2, 1) by its meta (fuzz seed 3012
    #5711). masked_fill is no TensorIterator: it fills a contiguous clone of the expanded input.
    """
    if torch.Tag.pointwise not in getattr(node.target, "tags", ()) or node.target in _NOT_TENSOR_ITERATORS:
        return False
    shapes = [tuple(arg.meta["val"].shape) for arg in node.args
              if isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("val"), torch.Tensor)]
    if not all(isinstance(size, int) for shape in shapes for size in shape):
        return False  # symbolic sizes: the meta's strides stand (as for every rule here)
    return len(set(shapes)) > 1


_NOT_TENSOR_ITERATORS = {aten.masked_fill.Scalar, aten.masked_fill.Tensor}


# ---------------------------------------------------------------------------- in-place writes
class _SourceValues:
    """The ATen nodes of `gm` by the torch-level node they were traced from (`facts`' names)."""

    def __init__(self, gm: torch.fx.GraphModule, facts: TorchGraphFacts):
        self.facts, self.traced = facts, {}
        for node in gm.graph.nodes:
            source = (node.meta.get("custom") or {}).get(SOURCE_KEY)
            if source is not None and node.op == "call_function" and isinstance(node.meta.get("val"), torch.Tensor):
                self.traced.setdefault(source, []).append(node)
        self.placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
        self.lifted = len(self.placeholders) - len(facts.inputs)  # AOTAutograd puts lifted parameters first

    def value_of(self, name: str):
        """The ATen node holding torch-level node `name`'s value: the last one traced from it (a
        write's own value is the value it writes, so a chain of writes goes back to the first
        value; a node traced to nothing, such as a no-op `.contiguous()`, holds its first
        operand's), or the graph input of a torch-level placeholder; None where there is none."""
        writes, first_inputs = self.facts.writes, self.facts.first_inputs
        for _ in range(len(writes) + len(first_inputs) + 1):
            if name in writes:
                name = writes[name]
            elif name in self.traced:
                return self.traced[name][-1]
            elif name in self.facts.inputs:
                return self.placeholders[self.lifted + self.facts.inputs.index(name)] if self.lifted >= 0 else None
            elif name in first_inputs:
                name = first_inputs[name]  # traced to nothing (a no-op `.contiguous()`): its operand's value
            else:
                return None
        return None

    def result_of(self, name: str, like: torch.Tensor):
        """The last ATen node traced from torch-level node `name` that is no view and has `like`'s
        shape and dtype (after it come only views, and scatters into a written tensor's base)."""
        for node in reversed(self.traced.get(name, [])):
            meta = node.meta["val"]
            if not _is_view(node) and meta.shape == like.shape and meta.dtype == like.dtype:
                return node
        return None


def _replaced_values(sources: _SourceValues) -> dict:
    """{ATen node holding the result of an in-place write: the ATen node of the value it replaces}."""
    replaced_values = {}
    for write, written in sources.facts.writes.items():
        value = sources.value_of(written)
        value_meta = value.meta.get("val") if value is not None else None
        if isinstance(value_meta, torch.Tensor):
            result = sources.result_of(write, value_meta)
            if result is not None:
                replaced_values[result] = value
    return replaced_values


def _composite_results(sources: _SourceValues) -> dict:
    """{ATen node holding a composite op's result: (its COMPOSITE_LAYOUTS rule, the ATen node of its input)}."""
    results = {}
    for name, (rule, input_name) in sources.facts.composites.items():
        traced, value = sources.traced.get(name), sources.value_of(input_name)
        if not traced or value is None or not isinstance(value.meta.get("val"), torch.Tensor):
            continue
        result = sources.result_of(name, traced[-1].meta["val"])
        if result is not None and result.meta["val"].shape == value.meta["val"].shape:
            results[result] = (rule, value)
    return results


def _composite_strides(meta: torch.Tensor, rule: tuple, source) -> list[int] | None:
    """The strides eager's kernel gives a composite op's result, from its input's current meta."""
    values = [*meta.shape, *source.meta["val"].shape, *source.meta["val"].stride()]
    if not all(isinstance(value, int) for value in values):
        return None
    layout, devices = rule
    if meta.device.type not in devices:
        return None
    memory_format = torch.contiguous_format
    if layout == "suggested":
        memory_format = _torch.suggest_memory_format(source.meta["val"])
    return list(torch.empty(meta.shape, device="meta").contiguous(memory_format=memory_format).stride())


def _is_view(node) -> bool:
    """Whether an ATen node's result aliases its input (a view op)."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and any(result.alias_info is not None for result in schema.returns)


def _in_place_strides(meta: torch.Tensor, written: torch.Tensor) -> list[int] | None:
    """The strides of a written tensor after the write: its own where they are dense and do not
    overlap, else (a strided slice, say) the dense strides in their order, as empty_like's."""
    values = [*written.shape, *written.stride()]
    if not all(isinstance(value, int) for value in values) or tuple(meta.shape) != tuple(written.shape):
        return None
    return _empty_like_strides(list(written.shape), list(written.stride()))


def _empty_like_strides(shape: list[int], strides: list[int]) -> list[int]:
    """empty_like's (and `.to(dtype)`'s) strides for a tensor of `strides`: its own where they are dense and do
    not overlap, else dense in the order they give (a broadcast dim's place kept)."""
    if _torch.dense_without_overlap(shape, strides):
        return strides
    return _tensor_iterator_strides(shape, [strides])


# ---------------------------------------------------------------------------- TensorIterator ops
def _tensor_iterator_op_strides(node, meta: torch.Tensor) -> list[int] | None:
    """The strides of a pointwise TensorIterator op's result: its tensor operands, broadcast to the
    result's shape, order the dims, each as eager hands it to the iterator: an operand of another dtype
    than the op's common one is first copied by `.to(dtype)` (empty_like's strides: a broadcast bool
    mask becomes dense) where eager does that, which `_cast_operands` says."""
    operands = [arg.meta.get("val") for arg in node.args if isinstance(arg, torch.fx.Node)]
    if not all(isinstance(operand, torch.Tensor) for operand in operands):
        return None
    shape = list(meta.shape)
    values = list(shape)
    for operand in operands:
        values += [*operand.shape, *operand.stride()]
    if not all(isinstance(value, int) for value in values):
        return None
    cast = _cast_operands(node, meta)
    return _tensor_iterator_strides(shape, [
        _broadcast_strides(operand.shape, _empty_like_strides(list(operand.shape), list(operand.stride()))
                           if position in cast else operand.stride(), shape)
        for position, operand in enumerate(operands)])


def _cast_operands(node, meta: torch.Tensor) -> set[int]:
    """Which tensor operands (positions among them) eager copies to another dtype before its TensorIterator.

    `where(c, x, y)` casts x and y to the result's dtype itself (`.to()`, every device). On CPU, TensorIterator
    casts every input of another dtype than the op's common one (`promote_inputs_to_common_dtype`, CPU only: CUDA
    kernels cast as they load). The copies are dense: `where(mask, mask, y)` of a broadcast bool mask and a float
    y permuted lays its result out as the mask's copy, not as y (fuzz seed 3117 #963)."""
    tensors = [arg.meta.get("val") for arg in node.args if isinstance(arg, torch.fx.Node)]
    if node.target is aten.where.self:
        return {position for position, arg in enumerate(node.args[1:3], start=1)
                if isinstance(arg, torch.fx.Node) and tensors[position].dtype != meta.dtype}
    if meta.device.type != "cpu" or len(node.args) != 2:
        return set()
    common = _common_dtype(node.args[0], node.args[1])
    return {position for position, operand in enumerate(tensors) if common is not None and operand.dtype != common}


def _common_dtype(first, second) -> torch.dtype | None:
    """torch.result_type of a binary op's two operands (graph nodes or Python numbers), or None."""
    try:
        return torch.result_type(*(arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg
                                   for arg in (first, second)))
    except (KeyError, TypeError, RuntimeError):
        return None


def _broadcast_strides(size, stride, shape: list[int]) -> list[int]:
    """An operand's strides as TensorIterator sees it over `shape`: 0 where it broadcasts."""
    leading = len(shape) - len(size)
    return [0] * leading + [0 if extent == 1 and shape[leading + dim] != 1 else step
                            for dim, (extent, step) in enumerate(zip(size, stride))]


# ---------------------------------------------------------------------------- aten.index
def index_layout(source: torch.Tensor, indices, shape) -> list[int] | None:
    """The dim order of eager's `aten.index.Tensor(source, indices)` result of `shape`, innermost
    first (its strides are dense in that order), or None where kiln does not model it (boolean
    masks, symbolic sizes or strides, indices separated by a full slice). `indices` holds the
    index tensors (or their metas) and None for a full slice."""
    present = [position for position, index in enumerate(indices) if index is not None]
    if not isinstance(source, torch.Tensor) or not present:
        return None
    if not all(isinstance(index, torch.Tensor) for index in indices if index is not None):
        return None
    if any(index.dtype in (torch.bool, torch.uint8) for index in indices if index is not None):
        return None  # masks become nonzero() positions: a data-dependent shape
    if present != list(range(present[0], present[-1] + 1)):
        return None  # indexed dims move to the front first (eager's transposeToFront)
    shape = list(shape)
    values = [*source.shape, *source.stride(), *shape]
    for index in indices:
        if index is not None:
            values += [*index.shape, *index.stride()]
    if not all(isinstance(value, int) for value in values):
        return None
    before, after = present[0], source.dim() - present[-1] - 1
    replacement = shape[before:len(shape) - after]
    # The TensorIterator's inputs, as element strides over the output's shape: the source with
    # stride 0 in the indexed dims, each index expanded to the indices' common shape and reshaped
    # with size-1 dims before and after it (eager's expand_outplace and reshape_indexer; the
    # reshape's strides in those size-1 dims break ties where the output's dim has size 1 too).
    operands = [list(source.stride()[:before]) + [0] * len(replacement) + list(source.stride()[source.dim() - after:])]
    for index in indices:
        if index is not None:
            indexer = index.expand(replacement).reshape([1] * before + replacement + [1] * after)
            operands.append(_broadcast_strides(indexer.shape, indexer.stride(), shape))
    return _tensor_iterator_order(shape, operands)


def _tensor_iterator_strides(shape: list[int], operands: list[list[int]]) -> list[int]:
    """The strides TensorIterator allocates its output with: dense in `_tensor_iterator_order`."""
    return dense_strides(shape, _tensor_iterator_order(shape, operands))


def dense_strides(shape: list[int], order: list[int]) -> list[int]:
    """Dense strides over `shape` with the dims in `order`, innermost first (TensorIterator's
    allocation: a dim after a 0-size one has stride 0)."""
    strides, step = [0] * len(shape), 1
    for dim in order:
        strides[dim] = step
        step *= shape[dim]
    return strides


def _tensor_iterator_order(shape: list[int], operands: list[list[int]]) -> list[int]:
    """TensorIterator's dim order, innermost first: by the first input whose strides tell two
    dims apart (ties: the smaller dim inner)."""
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
    return perm
