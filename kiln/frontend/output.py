"""The result of one trace: the FX graph, its inputs, guards, side effects, and the entry function.

`OutputGraph` owns what a trace produces:
- the torch-level `fx.Graph`, built node by node by `call_tensor_op` (each node's
  result computed on fake tensors for metadata);
- graph inputs: every tensor read from the outside world (arguments, parameters,
  buffers, globals), deduplicated by identity, each with its `Source`;
- the `GuardBuilder`, and `SideEffects` to replay after the graph runs (attribute
  stores on outside objects, mutated outside lists and dicts, global stores);
- `finish()`: compiles the graph with the backend and generates the entry
  function, straight-line Python that extracts the inputs from the frame's
  arguments, calls the compiled graph, replays side effects, and rebuilds the
  return value:

      def __entry(self, x):
          __outs = __compiled(self._modules['fc']._parameters['weight'], x)
          return (__outs[0], 3)
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from kiln import _torch
from kiln.frontend.errors import Unsupported
from kiln.frontend.guards import FrameSignature, GuardBuilder, SourceRenderer, compile_function
from kiln.frontend.sources import NamedSource, Source
from kiln.frontend.variables.base import NONE, ConstantVariable, Variable
from kiln.frontend.variables.containers import (DictVariable, ListVariable, SliceVariable, TupleVariable)
from kiln.frontend.variables.tensor import TensorVariable


@dataclass
class TracedGraph:
    """What a successful trace hands to the dispatcher."""

    guard: Callable
    guard_source: str
    entry: Callable
    entry_source: str
    graph_module: torch.fx.GraphModule | None


class OutputGraph:
    """Graph, inputs, guards and side effects of one trace."""

    def __init__(self, graph_compiler: Callable):
        self.graph_compiler = graph_compiler
        self.graph = torch.fx.Graph()
        self.fake_mode = _torch.FakeTensorMode()
        self.guards = GuardBuilder()
        self.guards.global_state()
        self.inputs: list[tuple[Source, torch.Tensor, TensorVariable]] = []
        self.tensors_by_id: dict[int, TensorVariable] = {}
        self.wrapped: dict[int, Variable] = {}
        self._keep_alive: list[Any] = []
        self.side_effects = SideEffects()
        self.guard_namespace: dict[str, Any] = {}
        self._names: set[str] = set()
        self._initial_grad = torch.is_grad_enabled()
        self._autocast_exits: list[Callable] = []
        self.compute_nodes = 0

    # -- names for objects the guard and entry functions hold -------------------------------------

    def named_source(self, prefix: str, value: Any) -> NamedSource:
        """A NamedSource for `value`, bound in the guard and entry namespaces."""
        for name, existing in self.guard_namespace.items():
            if existing is value and name.startswith(prefix):
                return NamedSource(name)
        name = f"{prefix}{len(self.guard_namespace)}"
        self.guard_namespace[name] = value
        return NamedSource(name)

    def remember_wrapped(self, value: Any, variable: Variable) -> None:
        self.wrapped[id(value)] = variable
        self._keep_alive.append(value)

    def _unique(self, base: str) -> str:
        name = base[:60] or "v"
        candidate, counter = name, 1
        while candidate in self._names:
            candidate = f"{name}_{counter}"
            counter += 1
        self._names.add(candidate)
        return candidate

    # -- graph inputs and nodes ----------------------------------------------------------------------

    def tensor_input(self, tx, value: torch.Tensor, source: Source) -> TensorVariable:
        """The graph input for an outside tensor (one per tensor object, guarded)."""
        existing = self.tensors_by_id.get(id(value))
        if existing is not None:
            if existing.source != source:
                self.guards.add(source, f"{{}} is not {existing.source.expr()}",
                                f"no longer the same tensor as {existing.source.expr()}")
            return existing
        if type(value) not in (torch.Tensor, torch.nn.Parameter) and not isinstance(value, torch.nn.Buffer):
            raise Unsupported(f"tensor subclass {type(value).__qualname__} at {source}")
        self.guards.tensor(source, value)
        first_compute = next((node for node in self.graph.nodes if node.op != "placeholder"), None)
        if first_compute is None:
            node = self.graph.placeholder(self._unique(source.readable_name()))
        else:
            with self.graph.inserting_before(first_compute):
                node = self.graph.placeholder(self._unique(source.readable_name()))
        fake = self.fake_mode.from_tensor(value, static_shapes=True)
        self.guards.tensor_storage(source, value, fake, self.graph)
        node.meta["example_value"] = fake
        variable = TensorVariable(node, fake, source, type(value))
        self.inputs.append((source, value, variable))
        self.tensors_by_id[id(value)] = variable
        self._keep_alive.append(value)
        return variable

    def call_tensor_op(self, tx, kind: str, target: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        """Run `target` on fake tensors; a tensor (or None, i.e. in-place) result becomes a graph node."""
        node_args, fake_args = _convert_all(args)
        node_kwargs, fake_kwargs = _convert_all(kwargs)
        try:
            with self.fake_mode:
                if kind == "call_method":
                    result = getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                else:
                    result = target(*fake_args, **fake_kwargs)
        except Unsupported:
            raise
        except Exception as error:
            name = getattr(target, "__name__", target)
            kind_text = "data-dependent" if "DataDependent" in type(error).__name__ or \
                "DynamicOutputShape" in type(error).__name__ else "an error"
            raise Unsupported(f"{name}() raised {kind_text} during tracing: {type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else ''}") from None
        if not _has_tensor(result) and result is not None:
            from kiln.frontend.variables.builder import wrap_sourceless

            return wrap_sourceless(tx, result)
        node = self.graph.create_node(kind, target, tuple(node_args), node_kwargs)
        node.meta["example_value"] = result
        self.compute_nodes += 1
        return self._wrap_result(tx, node, result)

    def _wrap_result(self, tx, node: torch.fx.Node, result: Any) -> Variable:
        if result is None:
            return NONE
        if isinstance(result, torch.Tensor):
            return TensorVariable(node, result)
        if isinstance(result, (tuple, list)):
            items = []
            for index, item in enumerate(result):
                if isinstance(item, torch.Tensor) or isinstance(item, (tuple, list)):
                    child = self.graph.create_node("call_function", operator.getitem, (node, index))
                    child.meta["example_value"] = item
                    items.append(self._wrap_result(tx, child, item))
                else:
                    from kiln.frontend.variables.builder import wrap_sourceless

                    items.append(wrap_sourceless(tx, item))
            if isinstance(result, list):
                return ListVariable(items)
            return TupleVariable(items, tuple_type=type(result))
        raise Unsupported(f"graph op returned {type(result).__name__}")

    # -- global state inside the trace ---------------------------------------------------------------

    def set_grad_enabled(self, tx, enabled: bool) -> None:
        """Switch grad mode for the rest of the trace and at the same point in the graph."""
        node = self.graph.create_node("call_function", torch._C._set_grad_enabled, (enabled,))
        node.meta["example_value"] = None
        torch._C._set_grad_enabled(enabled)

    def enter_autocast(self, autocast: torch.autocast) -> torch.fx.Node:
        args = (autocast.device, autocast.fast_dtype, autocast._enabled, autocast._cache_enabled)
        node = self.graph.create_node("call_function", torch.amp.autocast_mode._enter_autocast, args)
        node.meta["example_value"] = None
        autocast.__enter__()
        self._autocast_exits.append(lambda: autocast.__exit__(None, None, None))
        return node

    def exit_autocast(self, autocast: torch.autocast, mode_node: torch.fx.Node) -> None:
        node = self.graph.create_node("call_function", torch.amp.autocast_mode._exit_autocast, (mode_node,))
        node.meta["example_value"] = None
        if self._autocast_exits:
            self._autocast_exits.pop()()

    def restore_global_state(self) -> bool:
        """Undo grad/autocast changes left by the trace; True if the trace left none."""
        clean = torch.is_grad_enabled() == self._initial_grad and not self._autocast_exits
        while self._autocast_exits:
            self._autocast_exits.pop()()
        torch._C._set_grad_enabled(self._initial_grad)
        return clean

    # -- finishing -------------------------------------------------------------------------------------

    def finish(self, result: Variable, signature: FrameSignature, name: str) -> TracedGraph:
        """Compile the graph and build the guard and entry functions."""
        codegen = EntryCodegen(self)
        return_expression = codegen.value(result)
        side_effect_lines = self.side_effects.codegen(codegen)
        self.graph.output(tuple(codegen.output_nodes))
        graph_module = None
        compiled = None
        if self.compute_nodes:
            graph_module = torch.fx.GraphModule(torch.nn.Module(), self.graph, class_name=name)
            graph_module.graph.lint()
            example_inputs = [value for _, value, _ in self.inputs]
            compiled = self.graph_compiler(graph_module, example_inputs)
        namespace = dict(signature.namespace)
        namespace.update(self.guard_namespace)
        namespace.update(codegen.namespace)
        namespace["__compiled"] = compiled
        body: list[str] = []
        renderer = SourceRenderer([source for source, _, _ in self.inputs] + codegen.sources_used)
        input_texts = [renderer.render(source, body) for source, _, _ in self.inputs]
        if compiled is not None:
            body.append(f"__outs = __compiled({', '.join(input_texts)}{',' if len(input_texts) == 1 else ''})")
        else:
            body.append(f"__outs = ({', '.join(input_texts)}{',' if len(input_texts) == 1 else ''})")
        codegen.renderer, codegen.lines = renderer, body
        final_return = codegen.finalize(return_expression)
        body.extend(codegen.finalize(line) for line in side_effect_lines)
        body.append(f"return {final_return}")
        entry_source = "\n".join([f"def __entry({signature.text}):"] + ["    " + line for line in body])
        entry = compile_function(entry_source, "__entry", namespace, f"kiln_entry_{name}")
        guard, guard_source = self.guards.build(signature, self.guard_namespace)
        return TracedGraph(guard, guard_source, entry, entry_source, graph_module)


class EntryCodegen:
    """Turns trackers into Python expressions for the entry function.

    Tensors become graph outputs (`__outs[i]`); constants become literals or bound
    names; anything with a source is re-read from it. Source expressions are emitted
    as placeholders and resolved in `finalize`, once the renderer knows all uses.
    """

    def __init__(self, output: OutputGraph):
        self.output = output
        self.output_nodes: list[torch.fx.Node] = []
        self._output_index: dict[torch.fx.Node, int] = {}
        self.namespace: dict[str, Any] = {}
        self.sources_used: list[Source] = []
        self.renderer: SourceRenderer | None = None
        self.lines: list[str] | None = None

    def value(self, variable: Variable) -> str:
        return variable.reconstruct(self)

    def tensor(self, variable: TensorVariable) -> str:
        node = variable.node
        if node not in self._output_index:
            self._output_index[node] = len(self.output_nodes)
            self.output_nodes.append(node)
        return f"__outs[{self._output_index[node]}]"

    def constant(self, value: Any) -> str:
        if value is None or isinstance(value, (bool, int, str, bytes)) or \
                (isinstance(value, float) and value == value and value not in (float("inf"), float("-inf"))):
            return repr(value)
        if type(value) is tuple and all(type(item) in (int, str, bool, type(None)) for item in value):
            return repr(value)
        name = f"__k{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def source(self, source: Source) -> str:
        self.sources_used.append(source)
        return f"\x00{len(self.sources_used) - 1}\x00"

    def finalize(self, text: str) -> str:
        """Replace source placeholders by rendered (hoisted) expressions."""
        parts = text.split("\x00")
        for index in range(1, len(parts), 2):
            parts[index] = self.renderer.render(self.sources_used[int(parts[index])], self.lines)
        return "".join(parts)


class SideEffects:
    """Mutations of the outside world made by the trace, replayed after the graph runs."""

    def __init__(self) -> None:
        self.objects: list[Variable] = []
        self.containers: list[Variable] = []
        self.globals: dict[tuple[int, str], tuple[Source, Variable]] = {}
        self.context_vars: set = set()

    def mutated_object(self, variable: Variable) -> None:
        if variable not in self.objects:
            self.objects.append(variable)

    def mutated_container(self, variable: Variable) -> None:
        if variable not in self.containers:
            self.containers.append(variable)

    def store_global(self, globals_source: Source, name: str, value: Variable) -> None:
        from kiln.frontend.sources import ItemSource

        self.globals[(id(globals_source), name)] = (ItemSource(globals_source, name), value)

    def codegen(self, codegen: EntryCodegen) -> list[str]:
        from kiln.frontend.variables.objects import DELETED

        lines = []
        for variable in self.context_vars:
            if variable.current:
                raise Unsupported(f"{variable.describe()} set and not reset inside the compiled function")
        for variable in self.objects:
            target = codegen.source(variable.source)
            for name, value in variable.pending.items():
                original = getattr(variable.value, name, _ABSENT)
                if value is DELETED:
                    if original is not _ABSENT:
                        lines.append(f"delattr({target}, {name!r})")
                    continue
                if isinstance(value, ConstantVariable) and original is not _ABSENT and \
                        type(original) is type(value.value) and original == value.value:
                    continue  # restored to what it was: nothing to replay
                lines.append(f"setattr({target}, {name!r}, {codegen.value(value)})")
        for variable in self.containers:
            target = codegen.source(variable.source)
            if isinstance(variable, ListVariable):
                lines.append(f"{target}[:] = {variable.reconstruct(codegen)}")
            elif isinstance(variable, DictVariable):
                lines.append(f"{target}.clear()")
                lines.append(f"{target}.update({variable.reconstruct(codegen)})")
        for source, value in self.globals.values():
            lines.append(f"{codegen.source(source)} = {codegen.value(value)}")
        return lines


_ABSENT = object()


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_has_tensor(item) for item in value)
    return False


def _convert(variable: Any) -> tuple[Any, Any]:
    """A tracker as (graph argument, fake argument)."""
    if isinstance(variable, TensorVariable):
        return variable.node, variable.fake
    if isinstance(variable, ConstantVariable):
        value = _python_scalar(variable.value)
        return value, value
    if isinstance(variable, (TupleVariable, ListVariable)):
        pairs = [_convert(item) for item in variable.items]
        kind = list if isinstance(variable, ListVariable) else tuple
        nodes, fakes = kind(pair[0] for pair in pairs), kind(pair[1] for pair in pairs)
        if variable.python_type() is torch.Size:
            return torch.Size(nodes), torch.Size(fakes)
        return nodes, fakes
    if isinstance(variable, SliceVariable):
        pairs = [_convert(part) for part in variable.parts]
        return slice(*(pair[0] for pair in pairs)), slice(*(pair[1] for pair in pairs))
    if isinstance(variable, DictVariable):
        pairs = {key: _convert(value) for key, (_, value) in variable.entries.items()}
        return {key: pair[0] for key, pair in pairs.items()}, {key: pair[1] for key, pair in pairs.items()}
    if isinstance(variable, Variable):
        from kiln.frontend.variables.objects import UserObjectVariable

        if isinstance(variable, UserObjectVariable):  # guarded by type only: its value must not be baked in
            raise Unsupported(f"passing {variable.describe()} to a torch function (kiln does not guard its value)")
        value = variable.as_constant()
        if isinstance(value, (torch.nn.Module,)):
            raise Unsupported(f"passing {variable.describe()} to a torch function")
        value = _python_scalar(value)
        return value, value
    return variable, variable


def _python_scalar(value: Any) -> Any:
    """A NumPy scalar as the Python number torch treats it as (the graph's code can spell that)."""
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def _convert_all(values):
    if isinstance(values, dict):
        pairs = {key: _convert(value) for key, value in values.items()}
        return {key: pair[0] for key, pair in pairs.items()}, {key: pair[1] for key, pair in pairs.items()}
    pairs = [_convert(value) for value in values]
    return [pair[0] for pair in pairs], [pair[1] for pair in pairs]
