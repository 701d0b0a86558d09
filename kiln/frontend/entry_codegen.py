"""The entry function's Python: `EntryCodegen` turns the trace's trackers into expressions for it.

`OutputGraph.finish` (output.py) makes one per trace and writes the entry function with it; the
replayed side effects (`SideEffects.codegen`, side_effects.py) and a graph break's last lines
(resume.py) are written through it too:
- a tensor becomes an output of the compiled graph (`__outs[i]`);
- a constant becomes a literal, or a name bound in the entry's namespace (`__kN`);
- a tracker with a source is read from that source, into a local before the first replayed side
  effect (`finalize`), so every read sees the world as it was at the call;
- a new mutable object the trace made (a list, dict, set, object, generator, closure cell) is
  built once into a local (`__nN`), however many places hold it;
- a number the trace computed from symbolic inputs is recomputed from the same inputs.
"""
from __future__ import annotations

import math
import operator
import types
from typing import Any

import torch
import torch.fx

from kiln.frontend.errors import Unsupported
from kiln.frontend.guards import SourceRenderer
from kiln.frontend.sources import LocalSource, NamedSource, ScalarTensorSource, Source
from kiln.frontend.variables.base import Variable
from kiln.frontend.variables.sets import SetVariable
from kiln.frontend.variables.containers import DictVariable, ListVariable
from kiln.frontend.variables.functions import CellVariable
from kiln.frontend.variables.objects import ModelOutputVariable, NewObjectVariable
from kiln.frontend.variables.tensor import SymNumberVariable, TensorVariable


class EntryCodegen:
    """Turns trackers into Python expressions for the entry function.

    Tensors become graph outputs (`__outs[i]`); constants become literals or bound
    names; anything with a source is re-read from it. Source expressions are emitted
    as placeholders and resolved in `finalize`, once the renderer knows all uses.
    """

    def __init__(self, output: Any):  # output.OutputGraph (which imports this module)
        self.output = output
        self.output_nodes: list[torch.fx.Node] = []
        self._output_index: dict[torch.fx.Node, int] = {}
        self.namespace: dict[str, Any] = {}
        self.sources_used: list[Source] = []
        self.renderer: SourceRenderer | None = None
        self.lines: list[str] | None = None
        self.prelude: list[str] = []  # `__nK = <new object>` lines, in the order they must run
        self._built: dict[int, str] = {}
        # rebuilt by a resume function (resume._texts): id -> (the tracker, kept alive; the calls it goes to)
        self._passed_on: dict[int, tuple[Variable, list]] = {}
        self._read: dict[Source, str] = {}

    def is_built(self, variable: Variable) -> bool:
        """Whether the entry already builds `variable` as a real object (into a local)."""
        return id(variable) in self._built

    def is_passed_on(self, variable: Variable) -> bool:
        """Whether `variable` goes to a resume function as its parts (`pass_on`)."""
        return id(variable) in self._passed_on

    def pass_on(self, variable: Variable, call: object) -> None:
        """`variable` (a generator or lazy iterator) goes to a resume function as its parts, to be rebuilt there
        (`call`: that resume function's call; the two sides of a branch each have one): then it may not also be
        built here, nor passed twice to one call (two objects where the program has one)."""
        if id(variable) in self._built or call in self._passed_on.get(id(variable), (None, ()))[1]:
            raise Unsupported(f"{variable.describe()} is held in more than one place at a graph break")
        self._passed_on.setdefault(id(variable), (variable, []))[1].append(call)

    def value(self, variable: Variable) -> str:
        """An expression for the tracker's value; a new mutable object is built once, into a local."""
        if id(variable) in self._passed_on:
            raise Unsupported(f"{variable.describe()} is held in more than one place at a graph break")
        if isinstance(variable, CellVariable) and variable.real_cell is None:
            return self._new_cell(variable)
        if variable.source is None and _is_new_mutable(variable):
            name = self._built.get(id(variable))
            if name is None:
                text = variable.reconstruct(self)
                name = f"__n{len(self._built)}"
                self._built[id(variable)] = name
                self.prelude.append(f"{name} = {text}")
            return name
        return variable.reconstruct(self)

    def _new_cell(self, cell: CellVariable) -> str:
        """A cell the trace made (a variable of the compiled code that inner functions capture), built once:
        empty first, then filled, so a function in it that closes over it (a recursive inner function) gets it."""
        name = self._built.get(id(cell))
        if name is None:
            name = f"__n{len(self._built)}"
            self._built[id(cell)] = name
            self.prelude.append(f"{name} = {self.constant(types.CellType)}()")
            if cell.contents is not CellVariable.EMPTY:
                contents = self.value(cell.contents)
                self.prelude.append(f"{name}.cell_contents = {contents}")
        return name

    def tensor(self, variable: TensorVariable) -> str:
        node = variable.node
        if node not in self._output_index:
            self._output_index[node] = len(self.output_nodes)
            self.output_nodes.append(node)
        return f"__outs[{self._output_index[node]}]"

    def symbolic_number(self, variable: SymNumberVariable) -> str | None:
        """Python that recomputes a number the trace computed from symbolic inputs (`x.size(1) * 4`,
        `lr * 2.0`): the same operations on the same inputs, so a float is what Python gives. None when
        it reads a size of a tensor the graph computes (the caller specializes it then)."""
        bound = {input_variable.node: source for source, _, input_variable in self.output.inputs}

        def read(node: Any, emit: bool) -> str | None:
            if not isinstance(node, torch.fx.Node):
                return repr(node) if type(node) in (int, float, bool) and node == node and abs(node) != math.inf \
                    else None
            source = bound.get(node)
            if source is not None and node.op == "placeholder":
                if isinstance(source, ScalarTensorSource):
                    return None  # the float's tensor, not the float
                return self.source(source) if emit else ""
            if node.op == "call_method" and node.target == "item" and isinstance(bound.get(node.args[0]),
                                                                               ScalarTensorSource):
                return self.source(bound[node.args[0]].parent) if emit else ""
            if node.op == "call_function" and node.target in _NUMBER_OPERATORS and not node.kwargs:
                parts = [read(arg, emit) for arg in node.args]
                if any(part is None for part in parts):
                    return None
                return f"{self.constant(node.target)}({', '.join(parts)})" if emit else ""
            return None

        if read(variable.node, emit=False) is None:
            return None
        return read(variable.node, emit=True)

    def constant(self, value: Any) -> str:
        # exact types: a subclass's repr (a str or int Enum member's `<Mode.TRAIN: 'train'>`, NumPy's
        # `np.float64(1.5)`) is no expression
        if value is None or type(value) in (bool, int, str, bytes) or \
                (type(value) is float and value == value and value not in (float("inf"), float("-inf"))):
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
        """Replace source placeholders by locals read now (rendered, with shared prefixes hoisted)."""
        parts = text.split("\x00")
        for index in range(1, len(parts), 2):
            parts[index] = self._read_now(self.sources_used[int(parts[index])])
        return "".join(parts)

    def _read_now(self, source: Source) -> str:
        if isinstance(source, (LocalSource, NamedSource)):
            return source.expr()  # a name the entry holds: nothing can rebind it
        name = self._read.get(source)
        if name is None:
            text = self.renderer.render(source, self.lines)
            if text.isidentifier():  # already read into a local (a hoisted shared prefix)
                name = text
            else:
                name = f"__r{len(self._read)}"
                self.lines.append(f"{name} = {text}")
            self._read[source] = name
        return name


def _is_new_mutable(variable: Variable) -> bool:
    """A tracker for a mutable object made during the trace: every place holding it must get one object."""
    return isinstance(variable, (ListVariable, DictVariable, SetVariable, NewObjectVariable, ModelOutputVariable)) or \
        getattr(variable, "built_once", False)  # a generator or lazy iterator (trackers above this module)


_NUMBER_OPERATORS = frozenset({operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
                               operator.truediv, operator.pow, operator.neg, operator.pos})
