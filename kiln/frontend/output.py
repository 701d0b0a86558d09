"""The result of one trace: the FX graph, its inputs, guards, side effects, and the entry function.

`OutputGraph` owns what a trace produces:
- the torch-level `fx.Graph`, built node by node by `call_tensor_op` (each node's
  result computed on fake tensors for metadata);
- graph inputs: every tensor read from the outside world (arguments, parameters,
  buffers, globals), deduplicated by identity, each with its `Source`;
- the `GuardBuilder`, and `SideEffects` (side_effects.py) to replay after the graph
  runs (attribute stores on outside objects, mutated outside lists and dicts, global
  stores in any module, and calls made for their output: print, warnings.warn, logging);
- `finish()`: compiles the graph with the backend and generates the entry
  function (its expressions written by entry_codegen.py's `EntryCodegen`),
  straight-line Python that extracts the inputs from the frame's
  arguments, calls the compiled graph, reads every outside object the rest needs,
  builds the new objects the trace made, replays side effects, and returns:

      def __entry(self, lst, x):
          __outs = __compiled(self._modules['fc']._parameters['weight'], x)
          __n0 = [__outs[1]]
          lst[:] = [__outs[0], __n0]
          return (__outs[0], lst, __n0)

  Outside objects come back as themselves (a list argument the function returns is the
  same list, mutated in place), and a new object the trace made is built once, however
  many places hold it.
"""
from __future__ import annotations

import contextlib
import operator
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx

from kiln import _torch
from kiln.config import config
from kiln.frontend import ddp, graph_reuse
from kiln.frontend.dynamic import DynamicPolicy
from kiln.frontend.entry_codegen import EntryCodegen
from kiln.frontend.errors import GraphRaised, Unsupported
from kiln.frontend.guards import FrameSignature, GuardBuilder, SourceRenderer, compile_function
from kiln.frontend.side_effects import SideEffects
from kiln.frontend.sources import (AttrSource, ClosureCellSource, ItemSource, NamedSource, ScalarTensorSource, Source,
                                   TensorPropertySource)
from kiln.frontend.variables.base import NONE, ConstantVariable, Variable
from kiln.frontend.variables.containers import DictVariable, ListVariable, SliceVariable, TupleVariable
from kiln.frontend.variables.objects import UserObjectVariable
from kiln.frontend.variables.tensor import SymNumberVariable, TensorVariable


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

    def __init__(self, graph_compiler: Callable, dynamic: DynamicPolicy | None = None):
        self.graph_compiler = graph_compiler
        self.graph = torch.fx.Graph()
        # Symbolic shapes need a ShapeEnv: every trace of a code object but its first has one (static
        # inputs get static fakes in it), so a size that changed can be made symbolic (dynamic.py).
        self.dynamic = dynamic if dynamic is not None else DynamicPolicy(mode=False)
        self.fake_mode = _torch.symbolic_fake_mode() if self.dynamic.start_trace() else _torch.FakeTensorMode()
        self.guards = GuardBuilder()
        self.guards.global_state()
        # graph inputs in placeholder order: tensors, the symbols their symbolic sizes bind, int and float arguments
        self.inputs: list[tuple[Source, Any, Variable]] = []
        self.symbol_nodes: dict[Any, torch.fx.Node] = {}  # sympy Symbol -> the node that binds it
        self.symbolic_inputs = 0
        self.tensors_by_id: dict[int, TensorVariable] = {}
        self.input_layouts: list[tuple[torch.Tensor, tuple]] = []  # each tensor input's fake and its entry layout
        self.wrapped: dict[int, Variable] = {}
        self._keep_alive: list[Any] = []
        self.side_effects = SideEffects()
        self.outside_cells: dict[int, Any] = {}  # id of a real closure cell -> its one tracker in this trace
        self.guard_namespace: dict[str, Any] = {}
        self._names: set[str] = set()
        self._initial_grad = torch.is_grad_enabled()
        # inference mode as the trace models it (the real mode is never switched while tracing): the tensors the
        # graph makes inside a region are the program's inference tensors (node.meta["kiln_inference"])
        self.inference_mode = torch.is_inference_mode_enabled()
        self.inference_switched = False  # the trace entered or left a region: the entry handles the graph's outputs
        self.open_inference: list = []  # torch_special.InferenceModeExit of the regions the trace entered, still open
        self._autocast_exits: list[Callable] = []
        self.compute_nodes = 0
        self.generators: list[Variable] = []  # every generator the trace made (interpreter_variables.GeneratorVariable)
        self.cached_calls: dict[tuple, Variable] = {}  # lru_cache results by (wrapper, arguments): one object each
        self.break_point = None  # set for the retrace that stops at a graph break (kiln/frontend/resume.py)
        self.caller_handles_exception = False  # the compiled function's caller runs an `except` clause (dispatcher)

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
        fake = self._fake_input(value, source)
        self.guards.tensor(source, value, fake)
        if _torch.is_symbolic(tuple(fake.shape) + tuple(fake.stride()) + (fake.storage_offset(),)):
            self._bind_symbols(source, fake)
        node = self._placeholder(source.readable_name(), fake)
        self.input_layouts.append((fake, _layout_of(fake)))
        node.meta["kiln_inference"] = value.is_inference()
        self.guards.tensor_storage(source, value, fake, self.graph)
        variable = TensorVariable(node, fake, source, type(value))
        self.inputs.append((source, value, variable))
        self.tensors_by_id[id(value)] = variable
        self._keep_alive.append(value)
        return variable

    def outside_tensor(self, variable: Variable) -> torch.Tensor | None:
        """The real tensor an outside tensor's variable stands for (None for a value the trace computed)."""
        for _, value, known in self.inputs:
            if known is variable and isinstance(value, torch.Tensor):
                return value
        return None

    def tensor_by_id(self, identity: int) -> torch.Tensor:
        """The outside tensor whose `id` is `identity` (a graph input: kept alive while the trace runs)."""
        for _, value, _ in self.inputs:
            if id(value) == identity and isinstance(value, torch.Tensor):
                return value
        raise KeyError(identity)

    def _placeholder(self, name: str, example: Any) -> torch.fx.Node:
        """A new graph input, after the others (all placeholders come before the first compute node)."""
        first_compute = next((node for node in self.graph.nodes if node.op != "placeholder"), None)
        if first_compute is None:
            node = self.graph.placeholder(self._unique(name))
        else:
            with self.graph.inserting_before(first_compute):
                node = self.graph.placeholder(self._unique(name))
        node.meta["example_value"] = example
        return node

    # -- symbolic shapes and scalars (kiln/frontend/dynamic.py) -----------------------------------------

    def _fake_input(self, value: torch.Tensor, source: Source) -> torch.Tensor:
        """The fake of a tensor input: symbolic in the dims the dynamic policy picks, else static."""
        dims = self.dynamic.tensor_dims(source, value)
        if dims and self.fake_mode.shape_env is not None:
            name = self._symbolic_name()
            try:
                fake = _torch.symbolic_fake_tensor(self.fake_mode, value, name, dims)
            except Exception:  # a layout torch cannot fake symbolically: this input stays static
                fake = None
            if fake is not None:
                self.guards.symbolic_input(source, name, fake)
                return fake
        return self.fake_mode.from_tensor(value, static_shapes=True)

    def _symbolic_name(self) -> str:
        self.symbolic_inputs += 1
        return f"kiln_input{self.symbolic_inputs}"

    def _bind_symbols(self, source: Source, fake: torch.Tensor) -> None:
        """A graph input for each symbol a tensor input introduces (its size, stride or offset), before it,
        as Dynamo gives a backend: `s0: SymInt` placeholders, passed `x.size(1)` at run time."""
        for kind, dim, value in _torch.symbolic_properties(fake):
            symbol = _torch.bare_symbol(value)
            if symbol in self.symbol_nodes:
                continue
            node = self._placeholder(str(symbol), value)
            self.symbol_nodes[symbol] = node
            self.inputs.append((TensorPropertySource(source, kind, dim), value, SymNumberVariable(node, value)))

    def scalar_input(self, tx, value: int | float, source: Source) -> Variable | None:
        """An int or float argument as a graph input, when the dynamic policy says it changes between
        calls (None: it stays a constant, guarded by value)."""
        if not self.dynamic.scalar_is_dynamic(source, value) or self.fake_mode.shape_env is None:
            return None
        name = self._symbolic_name()
        self.guards.type_is(source, type(value))
        if type(value) is int:
            self.guards.fits_int64(source)
            symbolic = _torch.symbolic_int(self.fake_mode, value, name)
            node = self._placeholder(source.readable_name(), symbolic)
            self.inputs.append((source, symbolic, SymNumberVariable(node, symbolic, source)))
        else:
            real, fake, symbolic = _torch.symbolic_float(self.fake_mode, value, name)
            tensor_node = self._placeholder(source.readable_name(), fake)
            self.inputs.append((ScalarTensorSource(source), real, TensorVariable(tensor_node, fake)))
            self.guard_namespace.setdefault("__scalar_tensor", _scalar_tensor)
            node = self.symbolic_node("call_method", "item", (tensor_node,), symbolic)
        self.symbol_nodes[_torch.bare_symbol(symbolic)] = node
        self.guards.symbolic_input(source, name, symbolic)
        return SymNumberVariable(node, symbolic, source)

    def symbolic_node(self, kind: str, target: Any, args: tuple, value: Any, kwargs: dict | None = None) -> torch.fx.Node:
        """A graph node that computes a number (not counted as compute; dropped at the end if unused)."""
        node = self.graph.create_node(kind, target, args, kwargs or {})
        node.meta["example_value"] = value
        node.meta["kiln_symbolic"] = True
        return node

    def symbolic_number(self, tx, value: Any, make_node: Callable[[], torch.fx.Node]) -> Variable:
        """The tracker for a number the trace computed: a constant unless symbolic; a SymBool is decided
        now (a guard). A bare symbol's node is the input that binds it."""
        value = _torch.concrete(value)
        if isinstance(value, torch.SymBool):
            return ConstantVariable(bool(value))
        if not isinstance(value, (torch.SymInt, torch.SymFloat)):
            return ConstantVariable(value)
        node = self.symbol_nodes.get(_torch.bare_symbol(value))
        return SymNumberVariable(node if node is not None else make_node(), value)

    def tensor_metadata(self, tx, tensor: TensorVariable, method: str, args: list, value: Any) -> Variable:
        """`tensor.size()`, `.size(d)`, `.stride()`, `.numel()`...: constants, or symbolic numbers."""
        if not _torch.is_symbolic(value):
            return ConstantVariable(value)
        if isinstance(value, tuple):  # torch.Size or a stride tuple: item by item
            items = [self.symbolic_number(tx, item, lambda dim=dim, item=item: self.symbolic_node(
                "call_method", method, (tensor.node, dim), item)) for dim, item in enumerate(value)]
            return TupleVariable(items, tuple_type=type(value))
        return self.symbolic_number(tx, value, lambda: self.symbolic_node(
            "call_method", method, (tensor.node, *args), value))

    def outside_cell(self, cell, source: ClosureCellSource, pin: Callable | None = None):
        """The tracker of a real closure cell: one per cell in a trace, however many functions it is read
        through (a compiled closure and a helper it inlines share their enclosing function's cells), so a
        `nonlocal` store through one is what a load through another sees. A second function's view of it is
        guarded to stay the same cell object."""
        from kiln.frontend.variables.functions import CellVariable

        known = self.outside_cells.get(id(cell))
        if known is None:
            known = self.outside_cells[id(cell)] = CellVariable(real_cell=cell, source=source, pin=pin)
        elif known.source != source:
            self.guards.add(_cell_object(known.source), "{} is not {key}", "no longer the closure cell of "
                            + source.parent.expr(), key=_cell_object(source))
        return known

    def call_tensor_op(self, tx, kind: str, target: Any, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        """Run `target` on fake tensors; a tensor (or None, i.e. in-place) result becomes a graph node."""
        data_at = 1 if kind == "call_method" and target == "new_tensor" else 0 if target in _TENSOR_FROM_DATA else None
        if data_at is not None and len(args) > data_at:
            # torch.tensor(n) of a symbolic int specializes it anyway, and torch makes the constant of the SymInt
            # in 32 bits (torch.tensor(2**40) gave tensor(0)): the data is taken as the numbers it is now
            args = [*args[:data_at], _specialized(args[data_at]), *args[data_at + 1:]]
        node_args, fake_args = _convert_all(args)
        node_kwargs, fake_kwargs = _convert_all(kwargs)
        if target in _AS_STRIDED and fake_args and isinstance(fake_args[0], torch.Tensor) and \
                self._shares_an_input_storage(fake_args[0]):
            # its storage_offset counts from the storage's start, which the graph does not see (one graph serves
            # `base[1:]` and `base[3:]`, and functionalization makes a written input a new buffer): ATen runs it
            raise Unsupported(f"{getattr(target, '__name__', target)}() of a graph input's storage (its storage "
                              "offset counts from where the input's storage starts)")
        if self.inference_switched and not self.inference_mode:
            _check_inference_tensor_use(kind, target, node_args, node_kwargs, fake_args, fake_kwargs)
        _check_requires_grad_change(kind, target, fake_args, fake_kwargs)
        leaves = {id(item) for item in _flatten((fake_args, list(fake_kwargs.values())))  # leaves requiring grad
                  if isinstance(item, torch.Tensor) and item.requires_grad}  # before the op (`w.mul_(2)` keeps one)
        operands = [item for item in _flatten((fake_args, list(fake_kwargs.values()))) if isinstance(item, torch.Tensor)]
        versions = [_version_of(item) for item in operands]
        try:
            with _torch.fake_tracing(self.fake_mode):
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
                              f"{str(error).splitlines()[0] if str(error) else ''}",
                              breakable=not _has_marked_view(operands)) from None
        _check_write_overlap(target, [item for item, version in zip(operands, versions)
                                      if version is not None and _version_of(item) != version], operands)
        if isinstance(result, torch.Tensor) and result.requires_grad and result.is_leaf and not result._is_view() \
                and id(result) not in leaves:  # (a view made under no_grad of a parameter is a leaf that requires grad)
            # `torch.ones(4, requires_grad=True)`, `t.detach().requires_grad_()`: a new autograd leaf. A graph's
            # outputs are not leaves of the program's autograd graph (eager's `w.grad`, `autograd.grad(y, w)` need
            # the real one): made in Python, at a graph break, it enters the next graph as an input.
            raise Unsupported(f"{getattr(target, '__name__', target)}() makes a tensor that requires grad (a new "
                              "autograd leaf) inside the compiled function")
        if isinstance(result, (str, bytes)) and (_has_tensor(fake_args) or _has_tensor(list(fake_kwargs.values()))):
            # `"%s" % t` formatted the fake tensor: the text needs the real data
            raise Unsupported(f"{getattr(target, '__name__', target)}() of a tensor makes text from its values "
                              "(data-dependent)")
        if not _has_tensor(result) and result is not None:
            if _torch.is_symbolic(result) and not isinstance(result, (tuple, list)):  # torch.numel(x), torch.sym_max
                return self.symbolic_number(tx, result, lambda: self.symbolic_node(
                    kind, target, tuple(node_args), result, node_kwargs))
            if kind == "call_function" and not args and not kwargs:
                self._guard_global_read(target, result)
            return tx.wrap_sourceless(_torch.specialize(result) if not isinstance(result, (tuple, list))
                                      else type(result)(_torch.specialize(item) for item in result))
        node = self.graph.create_node(kind, target, tuple(node_args), node_kwargs)
        node.meta["example_value"] = result
        self.compute_nodes += 1
        return self._wrap_result(tx, node, result)

    def _guard_changed_objects_stay_apart(self) -> None:
        """An outside container or object the trace changed was another object than each one of its type the trace
        read elsewhere (`f(a, b)` doing `a.append(1); len(b)`): the trace kept them apart, so an entry never serves a
        call passing the same one for both (it gets its own). The same object under two sources at trace time is
        guarded so already (builder.wrap)."""
        changed = [variable for variable in (*self.side_effects.containers, *self.side_effects.objects)
                   if variable.source is not None]
        if not changed:
            return
        read = [(variable, _python_type(variable)) for variable in self.wrapped.values() if variable.source is not None]
        for variable in changed:
            kind = _python_type(variable)
            if kind is None or issubclass(kind, torch.nn.Module):  # (a module is guarded by identity already)
                continue
            for other, other_kind in read:
                if other_kind is kind and other.source != variable.source:
                    self.guards.add(variable.source, "{} is {key}", f"is now the same object as {other.source.expr()}",
                                    other.source)

    def _unread_gathers(self) -> list[torch.fx.Node]:
        """The graph's gathers by tensor indices (`x[i]`, index_select, gather, take, embedding) whose result
        nothing reads."""
        return [node for node in self.graph.nodes
                if node.op in ("call_function", "call_method") and not node.users and node.target in _GATHERS
                and isinstance(node.meta.get("example_value"), torch.Tensor)
                and any(isinstance(index.meta.get("example_value"), torch.Tensor) for index in node.all_input_nodes[1:])]

    def _shares_an_input_storage(self, fake: torch.Tensor) -> bool:
        storage = _torch.storage_ids(fake)[0]
        return any(isinstance(variable, TensorVariable) and isinstance(value, torch.Tensor) and
                   _torch.storage_ids(variable.fake)[0] == storage for _, value, variable in self.inputs)

    def _guard_global_read(self, target: Any, result: Any) -> None:
        """A torch function of no arguments that gives a Python value reads global state (`torch.initial_seed()`,
        `torch.is_anomaly_enabled()`, `torch.get_num_threads()`): the trace takes its value as a constant, so the
        guards call it again and compare."""
        name = getattr(target, "__name__", repr(target))
        if type(result) in (bool, int, float, str):
            self.guards.add(None, f"{self.guards.constant(target)}() != {result!r}", f"{name}() changed from {result!r}")
        elif isinstance(result, (torch.dtype, torch.device)):  # `torch.get_default_device()`
            self.guards.add(None, f"{self.guards.constant(target)}() != {self.guards.constant(result)}",
                            f"{name}() changed from {result}")

    def _wrap_result(self, tx, node: torch.fx.Node, result: Any) -> Variable:
        if result is None:
            return NONE
        if isinstance(result, torch.Tensor):
            # made inside an inference-mode region: an inference tensor, except a view, which is one if its base is
            # (the view's base is then among the op's tensor arguments)
            if result._is_view():
                node.meta["kiln_inference"] = any(_is_inference_node(base) for base in _view_bases(node))
            else:
                node.meta["kiln_inference"] = self.inference_mode
            return TensorVariable(node, result)
        if isinstance(result, (tuple, list)):
            items = []
            for index, item in enumerate(result):
                if isinstance(item, torch.Tensor) or isinstance(item, (tuple, list)):
                    child = self.graph.create_node("call_function", operator.getitem, (node, index))
                    child.meta["example_value"] = item
                    items.append(self._wrap_result(tx, child, item))
                else:
                    items.append(tx.wrap_sourceless(item))
            if isinstance(result, list):
                return ListVariable(items)
            return TupleVariable(items, tuple_type=type(result))
        raise Unsupported(f"graph op returned {type(result).__name__}")

    # -- global state inside the trace ---------------------------------------------------------------

    def set_grad_enabled(self, tx, enabled: bool) -> None:
        """Switch grad mode for the rest of the trace and at the same point in the graph (no node where the
        mode is `enabled` already: the guards fix the mode the graph starts in)."""
        if enabled == torch.is_grad_enabled():
            return
        node = self.graph.create_node("call_function", torch._C._set_grad_enabled, (enabled,))
        node.meta["example_value"] = None
        torch._C._set_grad_enabled(enabled)

    def set_inference_mode(self, tx, enabled: bool, grad_after: bool) -> None:
        """Enter or leave an inference-mode region for the rest of the trace: grad mode as the region sets it
        (`grad_after`), and the mode the tensors made from here on are made in."""
        if enabled != self.inference_mode:
            self.inference_switched = True
            self.guard_inference_mode()
        self.inference_mode = enabled
        if torch.is_grad_enabled() != grad_after:
            self.set_grad_enabled(tx, grad_after)

    def guard_inference_mode(self) -> None:
        """Guard the inference mode the trace began in (the real one: the trace never switches it)."""
        initial = torch.is_inference_mode_enabled()
        self.guards.add(None, f"{self.guards.constant(torch.is_inference_mode_enabled)}() is not {initial}",
                        f"inference mode changed from {initial}")

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

    def restore_global_state(self) -> tuple[bool, bool]:
        """Undo grad/autocast changes left by the trace: (grad mode the trace ended in, autocast left alone)."""
        grad_at_end = torch.is_grad_enabled()
        autocast_clean = not self._autocast_exits
        while self._autocast_exits:
            self._autocast_exits.pop()()
        torch._C._set_grad_enabled(self._initial_grad)
        return grad_at_end, autocast_clean

    # -- finishing -------------------------------------------------------------------------------------

    def finish(self, result: Variable | None, signature: FrameSignature, name: str,
               tail: Callable[["EntryCodegen"], list[str]] | None = None, grad_at_end: bool | None = None,
               stand_in: tuple[types.CodeType, int, dict] | None = None) -> TracedGraph:
        """Compile the graph and build the guard and entry functions.

        The entry returns `result`; after a graph break it ends with `tail`'s lines instead
        (the broken call or branch and the call of a resume function; kiln/frontend/resume.py).
        When the trace ends (or breaks) in another grad mode than it began in
        (`torch.set_grad_enabled(False)` as a call, or a break inside `with torch.no_grad()`),
        the entry switches to it after the graph and the side effects, as eager would be by then.
        A breaking entry is compiled as the stand-in of the frame it broke (`stand_in`: its code,
        line and globals; guards.compile_function).
        """
        if tail is None:
            for generator in self.generators:
                if generator.abandoned_with_cleanup():
                    raise Unsupported(f"{generator.describe()} is left suspended inside a try/with block; Python "
                                      "would run its cleanup (finally/__exit__) when it is dropped")
        codegen = EntryCodegen(self)
        if tail is None:
            ending = [f"return {codegen.value(result)}"]
        else:
            ending = tail(codegen)
            for generator in self.generators:  # one the entry neither builds nor passes on is dropped unrun
                if generator.abandoned_with_cleanup() and not codegen.is_built(generator) and \
                        not codegen.is_passed_on(generator):
                    raise Unsupported(f"{generator.describe()} is left suspended inside a try/with block at a graph "
                                      "break; Python would run its cleanup (finally/__exit__) when it is dropped")
        if grad_at_end is not None and grad_at_end != self._initial_grad:
            ending.insert(0, f"{codegen.constant(torch._C._set_grad_enabled)}({grad_at_end})")
        if tail is not None:  # a break inside inference-mode regions the trace entered: the program is in them now
            ending[0:0] = [f"{codegen.constant(region)}.enter()" for region in self.open_inference]
        side_effect_lines = self.side_effects.codegen(codegen)
        self._guard_changed_objects_stay_apart()
        # a gather nothing reads still raises for an index out of range, as eager does: an output (the entry
        # ignores it) keeps it from being dropped as dead code
        self.graph.output(tuple(codegen.output_nodes) + tuple(self._unread_gathers()))
        self._drop_unused_symbolic_nodes()
        graph_module = None
        compiled = None
        if self.compute_nodes:
            graph_module = torch.fx.GraphModule(torch.nn.Module(), self.graph, class_name=name)
            graph_module.graph.lint()
            compiled = self._compile_graph(graph_module)
        namespace = dict(signature.namespace)
        namespace.update(self.guard_namespace)
        namespace.update(codegen.namespace)
        namespace["__compiled"] = compiled
        body: list[str] = []
        renderer = SourceRenderer([source for source, _, _ in self.inputs] + codegen.sources_used)
        input_texts = [renderer.render(source, body) for source, _, _ in self.inputs]
        if compiled is not None and self.inference_switched:
            # The trace entered or left an inference-mode region: the graph runs outside inference mode, and each
            # tensor it made inside a region becomes an inference tensor, as eager made it (a copy made in the mode).
            made_inside = tuple(index for index, node in enumerate(codegen.output_nodes)
                                if node.op != "placeholder" and node.meta.get("kiln_inference"))
            body.append(f"with {codegen.constant(torch.inference_mode)}(False):")
            body.extend("    " + line for line in _graph_call(input_texts, codegen))
            if made_inside:
                body.append(f"__outs = {codegen.constant(_as_inference_tensors)}(__outs, {made_inside!r})")
        elif compiled is not None:
            body.extend(_graph_call(input_texts, codegen))
        else:
            body.append(f"__outs = ({', '.join(input_texts)}{',' if len(input_texts) == 1 else ''})")
        codegen.renderer, codegen.lines = renderer, body
        # Everything is read from the outside world (into locals) before the first side effect, so a
        # replayed store can never change what a later line reads: sources describe the world as
        # the trace saw it, at the call.
        built = [codegen.finalize(line) for line in codegen.prelude]
        final_lines = [codegen.finalize(line) for line in ending]
        replayed = [codegen.finalize(line) for line in side_effect_lines]
        body.extend(built)
        body.extend(replayed)
        body.extend(final_lines)
        namespace.update(codegen.namespace)  # the constants the lines above named
        entry_source = "\n".join([f"def __entry({signature.text}):"] + ["    " + line for line in body])
        entry = compile_function(entry_source, "__entry", namespace, f"kiln_entry_{name}", stand_in)
        with self._entry_layouts():  # a symbolic input's guards compare its layout on entry
            guard, guard_source = self.guards.build(signature, self.guard_namespace)
        return TracedGraph(guard, guard_source, entry, entry_source, graph_module)


    def _compile_graph(self, graph_module: torch.fx.GraphModule) -> Callable:
        """The backend's callable for the graph. Its example inputs are real tensors, and the SymInts of
        symbolic inputs, passed as Dynamo passes them: inside a TracingContext with the trace's fake mode,
        so the backend's own tracing shares its symbols and adds its guards to its ShapeEnv. Static graphs
        too: AOTAutograd's faking of the inputs (BERT-base's 202 parameters and inputs: 1.65 s of its cold
        first call on an H100 at 0bb45f2, 0.29 s on the CPU machine) then finds the trace's own fakes."""
        example_inputs = [value for _, value, _ in self.inputs]
        caps = _torch.active_ddp_bucket_caps() if config.ddp_split and torch.is_grad_enabled() else None
        if caps is not None and not self.guards.has_symbolic_inputs():  # traced inside DDP's forward
            split = ddp.compile_split(self.graph_compiler, graph_module, example_inputs, caps)
            if split is not None:
                return split
        with _torch.backend_tracing(self.fake_mode), self._entry_layouts():
            if not self.guards.has_symbolic_inputs():
                # the policy is one per cached code object: a recompile of the same frame compiles anew
                return graph_reuse.compile_or_reuse(self.graph_compiler, graph_module, example_inputs,
                                                    owner=self.dynamic)
            return self.graph_compiler(graph_module, example_inputs)

    @contextlib.contextmanager
    def _entry_layouts(self):
        """Tensor inputs' fakes with the layouts they had on entry, while the backend traces and the guards are
        built. AOTAutograd fakes the example inputs through the trace's fake mode, which hands back the trace's
        own fakes, and the guards read a symbolic input's sizes from its fake: one that an in-place view op
        (`x.t_()`, `x.unsqueeze_(0)`) restrided while tracing would be taken for the input's layout, so that
        AOTAutograd's replay of the op onto the real input did nothing and the guards checked the wrong dims."""
        changed = [(fake, entry, _layout_of(fake)) for fake, entry in self.input_layouts
                   if not _same_layout(_layout_of(fake), entry)]
        for fake, entry, _ in changed:
            _set_layout(self.fake_mode, fake, entry)
        try:
            yield
        finally:
            for fake, _, traced in changed:  # the rest of the trace's codegen reads the traced layouts
                _set_layout(self.fake_mode, fake, traced)

    def _drop_unused_symbolic_nodes(self) -> None:
        """Nodes that computed numbers nothing in the graph uses (`b, l, d = x.shape` reads them all)."""
        for node in reversed(list(self.graph.nodes)):
            if node.meta.get("kiln_symbolic") and not node.users:
                self.graph.erase_node(node)


# The ops whose storage_offset argument is counted from the start of their argument's storage
_AS_STRIDED = frozenset({"as_strided", "as_strided_", "as_strided_scatter", torch.as_strided, torch.as_strided_,
                         torch.as_strided_scatter, torch.Tensor.as_strided, torch.Tensor.as_strided_,
                         torch.Tensor.as_strided_scatter})


# Ops that read at positions a tensor of indices gives (and raise for one out of range)
_GATHERS = frozenset({operator.getitem, "__getitem__", "index_select", "gather", "take", "take_along_dim",
                      torch.index_select, torch.gather, torch.take, torch.take_along_dim, torch.embedding,
                      torch.nn.functional.embedding, torch.Tensor.__getitem__, torch.Tensor.index_select,
                      torch.Tensor.gather, torch.Tensor.take})

# Constructors of a tensor from Python data (numbers, nested lists and tuples of them)
_TENSOR_FROM_DATA = frozenset({torch.tensor, torch.as_tensor, torch.asarray})


def _specialized(variable: Variable) -> Variable:
    """`variable` with each symbolic number in it (in lists and tuples too) replaced by its value now."""
    if isinstance(variable, SymNumberVariable):
        return ConstantVariable(variable.as_constant())
    if isinstance(variable, (TupleVariable, ListVariable)) and \
            any(isinstance(item, (SymNumberVariable, TupleVariable, ListVariable)) for item in variable.items):
        return variable.rebuild([_specialized(item) for item in variable.items])
    return variable


def _python_type(variable: Variable) -> type | None:
    """Its Python type, None for a tracker that cannot say."""
    try:
        return variable.python_type()
    except Unsupported:
        return None


def _graph_call(input_texts: list[str], codegen) -> list[str]:
    """The entry's lines that call the compiled graph: an error it raises becomes GraphRaised, for the
    dispatcher to run the frame eagerly (errors.GraphRaised says why)."""
    return ["try:",
            f"    __outs = __compiled({', '.join(input_texts)}{',' if len(input_texts) == 1 else ''})",
            "except Exception as __error:",
            f"    raise {codegen.constant(GraphRaised)}() from __error"]


def _layout_of(fake: torch.Tensor) -> tuple:
    """A fake's sizes, strides and storage offset (SymInts themselves, so that a restride reuses them)."""
    return tuple(fake.shape), tuple(fake.stride()), fake.storage_offset()


def _same_layout(first: tuple, second: tuple) -> bool:
    """Whether two `_layout_of` layouts are the same, SymInts compared by their expressions (comparing the
    SymInts themselves would add guards)."""
    def plain(value):
        return value.node.expr if isinstance(value, torch.SymInt) else value
    flat = [[plain(value) for part in layout for value in (part if isinstance(part, tuple) else (part,))]
            for layout in (first, second)]
    return len(first[0]) == len(second[0]) and flat[0] == flat[1]


def _set_layout(mode, fake: torch.Tensor, layout: tuple) -> None:
    """Restride a fake in place to a layout `_layout_of` gave."""
    sizes, strides, offset = layout
    with mode:
        fake.as_strided_(sizes, strides, offset)


def _is_inference_node(node: torch.fx.Node) -> bool:
    return bool(node.meta.get("kiln_inference"))


def _view_bases(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The tensor arguments a view node's base is among: its own, or, for one item of an op's several
    outputs (`a.split(2)[0]`), that op's."""
    if node.target is operator.getitem and not isinstance(node.args[0].meta.get("example_value"), torch.Tensor):
        node = node.args[0]
    return [arg for arg in node.all_input_nodes if isinstance(arg.meta.get("example_value"), torch.Tensor)]


def _check_inference_tensor_use(kind: str, target: Any, node_args, node_kwargs, fake_args, fake_kwargs) -> None:
    """Outside inference mode, eager refuses to update an inference tensor in place, or to save one for a
    backward: an op that might do either, on an inference tensor the trace made in a region, runs the frame
    eagerly (where Python raises, or not, as the program does)."""
    nodes = [item for item in _flatten((node_args, node_kwargs)) if isinstance(item, torch.fx.Node)]
    if not any(node.meta.get("kiln_inference") for node in nodes):
        return
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    in_place = (name.endswith("_") and not name.startswith("__")) or target is operator.setitem or "out" in node_kwargs
    records_grad = torch.is_grad_enabled() and any(
        isinstance(item, torch.Tensor) and item.requires_grad for item in _flatten((fake_args, fake_kwargs)))
    if in_place or records_grad:
        raise Unsupported(f"{name}() on an inference tensor outside inference mode "
                          f"({'in place' if in_place else 'with autograd recording'}): eager decides whether that "
                          "raises", breakable=False)


def _flatten(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _flatten(item)]
    return [value]


def _as_inference_tensors(outputs, indices: tuple[int, ...]) -> list:
    """The graph's outputs with those at `indices` copied inside inference mode: inference tensors, as the
    program made them inside its `torch.inference_mode()` region."""
    outputs = list(outputs)
    with torch.inference_mode():
        for index in indices:
            outputs[index] = outputs[index].clone()
    return outputs


def _scalar_tensor(value: float) -> torch.Tensor:
    """A float argument as the graph takes it (a 0-d float64 tensor, as Dynamo passes floats)."""
    return torch.scalar_tensor(value, dtype=torch.float64)


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
    if isinstance(variable, SymNumberVariable):
        return variable.node, variable.value
    if isinstance(variable, ConstantVariable):
        value = _python_scalar(variable.value)
        return value, value
    if isinstance(variable, (TupleVariable, ListVariable)):
        pairs = [_convert(item) for item in variable.items]
        kind = list if isinstance(variable, ListVariable) else tuple
        nodes, fakes = kind(pair[0] for pair in pairs), kind(pair[1] for pair in pairs)
        if variable.python_type() is torch.Size:
            if any(isinstance(node, torch.fx.Node) for node in nodes):  # symbolic sizes: a tuple in the graph
                return tuple(nodes), torch.Size(fakes)
            return torch.Size(nodes), torch.Size(fakes)
        return nodes, fakes
    if isinstance(variable, SliceVariable):
        pairs = [_convert(part) for part in variable.parts]
        return slice(*(pair[0] for pair in pairs)), slice(*(pair[1] for pair in pairs))
    if isinstance(variable, DictVariable):
        pairs = {key: _convert(value) for key, (_, value) in variable.entries.items()}
        return {key: pair[0] for key, pair in pairs.items()}, {key: pair[1] for key, pair in pairs.items()}
    if isinstance(variable, Variable):
        if isinstance(variable, UserObjectVariable):  # guarded by type only: its value must not be baked in
            raise Unsupported(f"passing {variable.describe()} to a torch function (kiln does not guard its value)")
        value = variable.as_constant()
        if isinstance(value, (torch.nn.Module,)):
            raise Unsupported(f"passing {variable.describe()} to a torch function")
        value = _PYTHON_TYPE_DTYPES.get(value, value) if isinstance(value, type) else _python_scalar(value)
        return value, value
    return variable, variable


def _check_requires_grad_change(kind: str, target: Any, fake_args: list, fake_kwargs: dict) -> None:
    """`t.requires_grad_()` that changes the flag is Unsupported (a graph break makes the change in Python): a view
    of an input (`x[0].requires_grad_()`) made a leaf of the program's autograd graph, or an input's own flag, is
    a change of the real tensor that the graph's outputs do not carry (they came back without grad_fn), and eager
    raises for a non-leaf (`y[0].requires_grad_(False)`). The same flag again is nothing."""
    if not ((kind == "call_method" and target == "requires_grad_") or target is torch.Tensor.requires_grad_):
        return
    if not fake_args or not isinstance(fake_args[0], torch.Tensor):
        return
    requested = fake_args[1] if len(fake_args) > 1 else fake_kwargs.get("requires_grad", True)
    if type(requested) is not bool or requested != fake_args[0].requires_grad:
        raise Unsupported(f"Tensor.requires_grad_({requested!r}) on a tensor whose requires_grad is "
                          f"{fake_args[0].requires_grad} (autograd metadata of a real tensor, changed in Python)")


def _version_of(tensor: torch.Tensor) -> int | None:
    try:
        return tensor._version
    except RuntimeError:  # a tensor without a version counter (an inference tensor)
        return None


def _check_write_overlap(target: Any, written: list[torch.Tensor], operands: list[torch.Tensor]) -> None:
    """An op that wrote a tensor whose elements may share memory (`expand`'s view, a stride 0; `unfold` or
    `as_strided` windows that overlap), or one whose memory partly overlaps another operand's
    (`x[:3].add_(x[1:4])`), is Unsupported: eager's ATen raises "unsupported operation: ... refer to a single
    memory location" for most such ops (not all: `fill_`, `masked_fill_`), or writes the shared elements once per
    view element, in order; fake tensors never check, and the graph, functionalized, computed one value instead.
    A graph break runs the op in Python, which raises or writes as eager does."""
    for tensor in written:
        if _symbolic_layout(tensor):
            continue
        if _torch.may_overlap_itself(tensor):
            raise Unsupported(f"{getattr(target, '__name__', target)}() writes a tensor whose elements share memory "
                              "(an expanded or overlapping view: eager raises for most ops, `clone()` it first)")
        for other in operands:
            if other is not tensor and not _symbolic_layout(other) and _partly_overlap(tensor, other):
                raise Unsupported(f"{getattr(target, '__name__', target)}() writes a tensor whose memory partly "
                                  "overlaps another of its operands (eager raises for most ops, `clone()` one first)")


def _has_marked_view(operands: list[torch.Tensor]) -> bool:
    """Whether an operand is a view autograd marked (`split`'s outputs, a view made under no_grad or in inference
    mode), whose in-place writes autograd refuses. An op on one that failed on fake tensors must not be run at a
    graph break: there it would get the graph's output, a tensor without the mark, and succeed where eager
    raises ("Output 0 of Split is a view and is being modified inplace"); the frame runs eagerly instead."""
    default = torch._C._autograd.CreationMeta.DEFAULT
    return any(operand._is_view() and torch._C._autograd._get_creation_meta(operand) != default
               for operand in operands)


def _symbolic_layout(tensor: torch.Tensor) -> bool:
    return _torch.is_symbolic((*tensor.shape, *tensor.stride(), tensor.storage_offset()))


def _partly_overlap(tensor: torch.Tensor, other: torch.Tensor) -> bool:
    """ATen's `get_overlap_status(tensor, other) == Partial`: both dense without overlap and in one storage, their
    memory overlaps but is not the same span with the same strides."""
    if tensor.numel() == 0 or other.numel() == 0 or _torch.storage_ids(tensor)[0] != _torch.storage_ids(other)[0]:
        return False
    if not (_torch.dense_without_overlap(tensor.shape, tensor.stride()) and
            _torch.dense_without_overlap(other.shape, other.stride())):
        return False
    begin, other_begin = tensor.storage_offset() * tensor.element_size(), other.storage_offset() * other.element_size()
    end, other_end = begin + tensor.numel() * tensor.element_size(), other_begin + other.numel() * other.element_size()
    if (begin, end) == (other_begin, other_end):
        return tensor.stride() != other.stride()
    return begin < other_end and other_begin < end


# A Python type torch takes as a dtype (`torch.tensor(0, dtype=int)`, `x.to(float)`), as the dtype torch reads it
# as: the graph's code cannot spell the type (`dtype = <class 'int'>`).
_PYTHON_TYPE_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool, complex: torch.complex128}


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


def _cell_object(source: ClosureCellSource) -> Source:
    """The cell itself (`fn.__closure__[i]`), where `source` is its contents."""
    return ItemSource(AttrSource(source.parent, "__closure__"), source.index)
