"""nn.Module instances and Python modules.

A `ModuleVariable` reads attributes the way `nn.Module` does: instance `__dict__`
and class attributes first, then `_parameters`, `_buffers` and `_modules`.
Parameters and buffers become graph inputs (their values are not guarded, their
metadata is); submodules are guarded by identity and plain attributes by value,
which is what "module structure" means for a cache entry. Calling a module inlines
its hooks (when it has any) and its `forward`. ModuleList, ModuleDict and
Sequential index, iterate and measure like the containers they are.
"""
from __future__ import annotations

import operator
import types
from typing import Any

import torch

from kiln.frontend.errors import AttributeFailure, Unsupported
from kiln.frontend.sources import AttrSource, ItemSource, NamedSource, TypeSource
from kiln.frontend.variables.base import (MISSING, NONE, ConstantVariable, TrackerMethod, Variable,
                                          is_trusted_module, lookup_class_attribute)
from kiln.frontend.variables.containers import IteratorVariable, ListIteratorLike, TupleVariable, missing_key
from kiln.frontend.variables.objects import (bind_class_attribute, check_instance_dict_in_step, guard_class_lacks,
                                            is_data_descriptor, object_getattr, property_function)

_CONTAINER_TYPES = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict, torch.nn.ParameterList,
                    torch.nn.ParameterDict)
_MODULE_CALLS = {torch.nn.Module.__call__, torch.nn.Module._call_impl,
                 getattr(torch.nn.Module, "_wrapped_call_impl", torch.nn.Module.__call__)}
# nn.Module's iterators over its tree (and the arguments each takes), answered from the module's tables rather
# than traced through its generators
_MEMBER_ITERATORS = {"parameters": ("recurse",), "named_parameters": ("prefix", "recurse", "remove_duplicate"),
                     "buffers": ("recurse",), "named_buffers": ("prefix", "recurse", "remove_duplicate"),
                     "children": (), "named_children": (), "modules": (),
                     "named_modules": ("memo", "prefix", "remove_duplicate")}
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOK_DICTS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_hooks",
                      "_global_backward_pre_hooks")


def is_module_call_function(fn: Any) -> bool:
    """nn.Module's own __call__ machinery, which kiln models instead of inlining."""
    return fn in _MODULE_CALLS


def _same_tensor_object(tx, module: "ModuleVariable", name: str, value: Variable) -> bool:
    """Whether `value` is the tensor object the module's parameter or buffer `name` already is (what an
    augmented assignment to it stores after its in-place op), so storing it changes nothing."""
    fake = getattr(value, "fake", None)
    if not isinstance(fake, torch.Tensor) or not (name in module.value._buffers or name in module.value._parameters):
        return False
    current = module.getattr(tx, name)
    return getattr(current, "fake", None) is fake


class ModuleVariable(Variable):
    """An nn.Module from outside the trace."""

    def __init__(self, module: torch.nn.Module, source=None):
        self.value = module
        self.source = source
        self.pending: dict[str, Variable] = {}  # plain attributes assigned during the trace
        # a module the trace made (objects._construct_torch_module: no parameters, constant arguments): its class
        # and arguments, so the entry can make it again where it leaves the trace (stored at a graph break)
        self.made_as: tuple[type, list[Variable], dict[str, Variable]] | None = None
        self.built_once = False  # made by the entry once, wherever the trace put it (set with made_as)
        # a slice of a container (`self.layers[1:]`, made by the trace): its children, the trackers the container's
        self.sliced_children: list[tuple[str, Variable]] | None = None

    def describe(self) -> str:
        return f"module {type(self.value).__qualname__}"

    def reconstruct(self, codegen) -> str:
        if self.source is not None:
            return codegen.source(self.source)
        if self.made_as is None or self.pending:
            return super().reconstruct(codegen)
        cls, args, kwargs = self.made_as
        arguments = [codegen.value(arg) for arg in args] + [f"{key}={codegen.value(value)}"
                                                            for key, value in kwargs.items()]
        return f"{codegen.constant(cls)}({', '.join(arguments)})"

    def python_type(self) -> type:
        return type(self.value)

    def identity(self) -> Any:
        return self.value

    def as_constant(self) -> Any:
        return self.value

    def truth(self, tx) -> bool:
        if isinstance(self.value, _CONTAINER_TYPES):
            return len(self.value) > 0
        return True

    def _sub(self, table: str, name: str):
        return ItemSource(AttrSource(self.source, table), name) if self.source is not None else None

    def getattr(self, tx, name: str) -> Variable:
        if name in self.pending:
            return self.pending[name]
        if name in _MEMBER_ITERATORS and lookup_class_attribute(type(self.value), name)[0] is \
                getattr(torch.nn.Module, name):
            return TrackerMethod(self, name)  # nn.Module's own: read from the module tree, under guards
        if _falls_back(self.value, name):
            fallback, _ = lookup_class_attribute(type(self.value), "__getattr__")
            if fallback is not _MODULE_GETATTR:  # the class's own __getattr__ (forwarding to a wrapped model, say)
                _guard_falls_back(tx, self.source, type(self.value), name)
                return bind_class_attribute(tx, fallback, "__getattr__", self, type(self.value),
                                            _type_source(self)).call(tx, [ConstantVariable(name)], {})
            return self._table_lookup(tx, name)
        return object_getattr(tx, self, self.value, name)

    def _table_lookup(self, tx, name: str) -> Variable:
        module = self.value
        for table in ("_parameters", "_buffers", "_modules"):
            entries = module.__dict__.get(table)
            if entries is not None and name in entries:
                return tx.wrap(entries[name], self._sub(table, name))
        if self.source is not None:  # absent, and guarded absent: from the instance, its class and its tables
            _guard_falls_back(tx, self.source, type(module), name)
            for table in ("_parameters", "_buffers", "_modules"):
                if table in module.__dict__:
                    tx.output.guards.contains(AttrSource(self.source, table), name, False)
        raise AttributeFailure(f"{type(module).__qualname__} has no attribute {name!r}")

    def has_attribute(self, tx, name: str) -> bool:
        if name in self.pending:
            return True
        try:
            self.getattr(tx, name)
            return True
        except AttributeFailure:
            return False

    def call(self, tx, args, kwargs) -> Variable:
        return call_module(tx, self, args, kwargs)

    def setattr(self, tx, name: str, value: Variable) -> None:
        """`module.name = value` for a plain value (a number, a string, None, a tuple of them...).

        Later reads in the trace see it; the entry function replays it after the graph runs
        (nn.Module.__setattr__ stores a plain value in the instance __dict__). Tensors,
        parameters, submodules and names of the module's tables change its structure and
        are unsupported, and so is a class with its own __setattr__.
        """
        module = self.value
        setter, _ = lookup_class_attribute(type(module), "__setattr__")
        if setter is not torch.nn.Module.__setattr__:
            raise Unsupported(f"setting attribute {name!r} on {self.describe()}, whose class defines __setattr__")
        descriptor, _ = lookup_class_attribute(type(module), name)
        if is_data_descriptor(descriptor) and name not in _module_tables(module) and \
                not issubclass(value.python_type(), (torch.nn.Parameter, torch.nn.Module)):
            # nn.Module.__setattr__ leaves such a value to object.__setattr__: a property's setter runs (inlined),
            # and what it stores is replayed; the name itself is never a plain attribute
            if not isinstance(descriptor, property):
                raise Unsupported(f"setting {name!r} on {self.describe()}: a {type(descriptor).__name__} on its class")
            if descriptor.fset is None:
                raise AttributeFailure(f"property {name!r} of {type(module).__qualname__!r} object has no setter")
            property_function(tx, descriptor, "fset", name, type(module)).call(tx, [self, value], {})
            return
        if _same_tensor_object(tx, self, name, value):
            return  # `self.steps += 1` on a buffer: the in-place op's result is the very tensor the attribute holds
        if not value.is_constant() or isinstance(value.as_constant(), (torch.Tensor, torch.nn.Module)) or \
                name in _module_tables(module) or self.source is None:
            raise Unsupported(f"setting attribute {name!r} on {self.describe()} to {value.describe()} "
                              "inside a compiled function (only plain values are supported)")
        check_instance_dict_in_step(tx, self, self.value, "store")
        self.pending[name] = value
        tx.output.side_effects.mutated_object(self)

    # -- container modules ---------------------------------------------------------------------

    def _children(self, tx) -> list[tuple[str, Variable]]:
        if self.sliced_children is not None:
            return list(self.sliced_children)
        module = self.value
        if not isinstance(module, _CONTAINER_TYPES):
            raise Unsupported(f"iterating over {self.describe()}")
        table = "_parameters" if isinstance(module, (torch.nn.ParameterList, torch.nn.ParameterDict)) else "_modules"
        names = list(module.__dict__[table].keys())
        if self.source is not None:
            tx.output.guards.keys(AttrSource(self.source, table), tuple(names))
        return [(name, tx.wrap(module.__dict__[table][name], self._sub(table, name))) for name in names]

    def live_iterator(self, tx) -> IteratorVariable:
        """`iter(module)`: a container's children (its own `__iter__`'s, `_table_iterated`)."""
        if isinstance(self.value, _CONTAINER_TYPES) and _uses_container_method(self.value, "__iter__"):
            return IteratorVariable(self.unpack(tx), rebuilt_from=self._table_iterated(tx))
        return IteratorVariable(self.unpack(tx))

    def _table_iterated(self, tx) -> tuple[Variable, str] | None:
        """(the table tracker, view kind) whose iterator the container's `__iter__` returns (ModuleList's is
        `iter(self._modules.values())`): a graph break inside the loop passes that real iterator on, so a change of
        the table after it raises as in Python. None for a container the trace made."""
        if self.source is None or isinstance(self.value, (torch.nn.ParameterList, torch.nn.ParameterDict)):
            return None  # (their __iter__ reads no table dict's iterator)
        kind = "dict_keys" if isinstance(self.value, torch.nn.ModuleDict) else "dict_values"
        return tx.wrap(self.value.__dict__["_modules"], AttrSource(self.source, "_modules")), kind

    def unpack(self, tx) -> list[Variable]:
        children = self._children(tx)
        if isinstance(self.value, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            return [ConstantVariable(name) for name, _ in children]
        return [child for _, child in children]

    def length(self, tx) -> int:
        return len(self._children(tx))

    def getitem(self, tx, key: Variable) -> Variable:
        children = self._children(tx)
        index = key.as_constant()
        if isinstance(self.value, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
            for name, child in children:
                if name == index:
                    return child
            raise missing_key(key, self)
        if isinstance(index, slice):
            return self._slice(tx, children, index)
        return children[index][1]

    def _slice(self, tx, children: list[tuple[str, Variable]], index: slice) -> Variable:
        """`self.layers[1:]`: a new container of the same class holding the same children, made for real as eager
        makes it (a Sequential keeps their names, a ModuleList renumbers them): called, it runs them in turn; where
        it leaves the trace the entry makes it again, `container[index]`. A subclass's construction may run its
        own code: unsupported (a graph break slices it in Python)."""
        if type(self.value) not in (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ParameterList):
            raise Unsupported(f"slicing {self.describe()}, a subclass of a torch.nn container (its construction "
                              "may run its own code)")
        sliced = self.value[index]
        table = "_parameters" if isinstance(sliced, torch.nn.ParameterList) else "_modules"
        variable = ModuleVariable(sliced)
        variable.sliced_children = list(zip(sliced.__dict__[table], [child for _, child in children][index]))
        variable.made_as, variable.built_once = (operator.getitem, [self, ConstantVariable(index)], {}), True
        return variable

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if isinstance(self.value, _CONTAINER_TYPES) and _uses_container_method(self.value, name):
            if name == "__len__":
                return ConstantVariable(self.length(tx))
            if name == "__getitem__":
                return self.getitem(tx, args[0])
            if name == "__iter__":
                return self.live_iterator(tx)
            if name in ("keys", "values", "items") and isinstance(self.value, torch.nn.ModuleDict) and \
                    self.source is not None:  # a live view of its `_modules` (after a change at a break, too)
                table = self._table_iterated(tx)[0]
                self._children(tx)  # its keys guarded as the container's are
                return table.call_method(tx, name, [], {})
            if name == "keys":
                return ListIteratorLike([ConstantVariable(key) for key, _ in self._children(tx)], "dict_keys")
            if name == "values":
                return ListIteratorLike([child for _, child in self._children(tx)], "dict_values")
            if name == "items":
                return ListIteratorLike([TupleVariable([ConstantVariable(key), child])
                                         for key, child in self._children(tx)], "dict_items")
        if name in _MEMBER_ITERATORS and lookup_class_attribute(type(self.value), name)[0] is \
                getattr(torch.nn.Module, name):
            return IteratorVariable(self._members(tx, name, args, kwargs))
        return self.getattr(tx, name).call(tx, args, kwargs)

    # -- parameters(), named_modules() and the like ----------------------------------------------

    def _members(self, tx, method: str, args, kwargs) -> list[Variable]:
        """What nn.Module's `method(*args, **kwargs)` yields, in its order, each item with its source.

        The tree is read as nn.Module reads it (`_modules`, `_parameters`, `_buffers`, keys
        guarded at every module visited), so a module added or removed later recompiles;
        duplicates (a tied weight, a shared submodule) are left out as torch leaves them out.
        """
        accepted = _MEMBER_ITERATORS[method]
        if len(args) > len(accepted) or set(kwargs) - set(accepted):
            raise Unsupported(f"{type(self.value).__qualname__}.{method} with these arguments")
        options = {key: value.as_constant() for key, value in dict(zip(accepted, args), **kwargs).items()}
        if options.get("memo") is not None:
            raise Unsupported(f"{type(self.value).__qualname__}.{method}(memo=...)")
        prefix = options.get("prefix", "")
        remove_duplicate = options.get("remove_duplicate", True)
        if method in ("children", "named_children"):
            items, seen = [], set()
            for name, child in self._child_modules(tx, ""):
                if id(child.value) not in seen:
                    seen.add(id(child.value))
                    items.append((name, child))
        elif method in ("modules", "named_modules"):
            items = self._module_tree(tx, prefix, remove_duplicate, set())
        else:
            table = "_parameters" if method.endswith("parameters") else "_buffers"
            modules = self._module_tree(tx, prefix, remove_duplicate, set()) if options.get("recurse", True) \
                else [(prefix, self)]
            items, seen = [], set()
            for module_prefix, module in modules:
                for name, value in module._table(tx, table):
                    real = module.value.__dict__[table][name]
                    if real is None or (remove_duplicate and id(real) in seen):
                        continue
                    seen.add(id(real))
                    items.append((module_prefix + ("." if module_prefix else "") + name, value))
        if method.startswith("named_"):
            return [TupleVariable([ConstantVariable(name), value]) for name, value in items]
        return [value for _, value in items]

    def _table(self, tx, table: str) -> list[tuple[str, Variable]]:
        """The entries of `_parameters` or `_buffers`, keys guarded (a None entry stays NONE)."""
        entries = self.value.__dict__[table]
        if self.source is not None:
            tx.output.guards.keys(AttrSource(self.source, table), tuple(entries))
        return [(name, NONE if entries[name] is None else tx.wrap(entries[name], self._sub(table, name)))
                for name in entries]

    def _child_modules(self, tx, prefix: str) -> list[tuple[str, "ModuleVariable"]]:
        entries = self.value.__dict__["_modules"]
        if self.source is not None:
            tx.output.guards.keys(AttrSource(self.source, "_modules"), tuple(entries))
        children = []
        for name, child in entries.items():
            if child is None:
                continue
            variable = tx.wrap(child, self._sub("_modules", name))
            if not isinstance(variable, ModuleVariable):
                raise Unsupported(f"submodule {name!r} of {self.describe()} is {variable.describe()}")
            children.append((prefix + ("." if prefix else "") + name, variable))
        return children

    def _module_tree(self, tx, prefix: str, remove_duplicate: bool, memo: set) -> list[tuple[str, "ModuleVariable"]]:
        """named_modules(): this module, then each submodule's tree, depth first (each module once)."""
        if id(self.value) in memo:
            return []
        if remove_duplicate:
            memo.add(id(self.value))
        tree = [(prefix, self)]
        for name, child in self._child_modules(tx, prefix):
            tree += child._module_tree(tx, name, remove_duplicate, memo)
        return tree


def _module_tables(module: torch.nn.Module) -> set[str]:
    names = set()
    for table in ("_parameters", "_buffers", "_modules"):
        names.update(module.__dict__.get(table, {}).keys())
    return names


_MODULE_GETATTR = torch.nn.Module.__getattr__


def _guard_falls_back(tx, source, cls: type, name: str) -> None:
    """Guards that a read which reached `__getattr__` still does: the name is not set on the instance (`wrapper.gain =
    -1.0` after a trace that forwarded `gain` to the wrapped model) nor on its class."""
    if source is not None:
        tx.output.guards.contains(AttrSource(source, "__dict__"), name, False)
        guard_class_lacks(tx, TypeSource(source), cls, name)


def _falls_back(module: torch.nn.Module, name: str) -> bool:
    """Whether plain attribute lookup misses `name`, so nn.Module.__getattr__ would look in the tables."""
    return name not in module.__dict__ and lookup_class_attribute(type(module), name)[0] is MISSING


def _uses_container_method(module: torch.nn.Module, name: str) -> bool:
    raw, owner = lookup_class_attribute(type(module), name)
    return owner in _CONTAINER_TYPES


def call_module(tx, module_variable: ModuleVariable, args: list[Variable], kwargs: dict[str, Variable],
                own_call: bool = False) -> Variable:
    """`module(*args, **kwargs)`: hooks (guarded empty, or inlined) around an inlined forward.

    A class that overrides `__call__` has it inlined, unless `own_call`: nn.Module's own
    `__call__` reached directly (`super().__call__(...)` in that override), which runs
    hooks and forward and never looks at `type(module).__call__` again.
    """
    module = module_variable.value
    if isinstance(module, torch.nn.RNNBase):  # as TorchDynamo (allow_rnn=False): a graph break runs it
        raise Unsupported(f"calling {module_variable.describe()}: recurrent modules (RNN, LSTM, GRU) run eagerly "
                          "(their fused kernels take flat weight lists kiln does not trace)")
    call, _ = lookup_class_attribute(type(module), "__call__")
    if not own_call and call is not MISSING and not is_module_call_function(call):
        return bind_class_attribute(tx, call, "__call__", module_variable, type(module),
                                    _type_source(module_variable)).call(tx, args, kwargs)
    with tx.behind_uninterpreted_frames():  # Python runs nn.Module's call machinery between caller and forward
        return _call_hooks_and_forward(tx, module_variable, args, kwargs)


def untraceable_hooks(module: torch.nn.Module) -> str | None:
    """What of the module's own hooks kiln cannot trace, or None: backward hooks, and forward hooks registered
    with kwargs (FSDP2's). Such a module's call machinery runs in Python, with its forward compiled
    (kiln/frontend/wrapped_calls.py ForwardCompiled)."""
    state = module.__dict__
    if state.get("_backward_hooks") or state.get("_backward_pre_hooks"):
        return "backward hooks"
    for table, what in (("_forward_pre_hooks", "forward pre-hooks"), ("_forward_hooks", "forward hooks")):
        hooks, with_kwargs = state.get(table), state.get(table + "_with_kwargs")
        if hooks and with_kwargs and any(hook_id in with_kwargs for hook_id in hooks):
            return what + " with kwargs"
    return None


def _call_hooks_and_forward(tx, module_variable: ModuleVariable, args: list[Variable],
                            kwargs: dict[str, Variable]) -> Variable:
    module = module_variable.value
    guard_global_hooks(tx)
    source = module_variable.source
    untraceable = untraceable_hooks(module)
    if untraceable is not None:  # a break: the call runs nn.Module's machinery in Python, its forward compiled
        raise Unsupported(f"{untraceable} on {module_variable.describe()}")
    hook_tables = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
    if not any(getattr(module, table, None) for table in hook_tables):
        if source is not None:
            tx.output.guards.no_hooks(source, hook_tables)
        return module_variable.getattr(tx, "forward").call(tx, args, kwargs)

    args = list(args)
    pre_hooks = dict(getattr(module, "_forward_pre_hooks", {}))
    if source is not None:
        tx.output.guards.keys(AttrSource(source, "_forward_pre_hooks"), tuple(pre_hooks))
    for hook_id, hook in pre_hooks.items():
        result = tx.wrap(hook, ItemSource(AttrSource(source, "_forward_pre_hooks"), hook_id) if source else None)\
            .call(tx, [module_variable, TupleVariable(args)], {})
        if not (isinstance(result, ConstantVariable) and result.value is None):
            args = result.unpack(tx) if isinstance(result, TupleVariable) else [result]
    output = module_variable.getattr(tx, "forward").call(tx, args, kwargs)
    hooks = dict(getattr(module, "_forward_hooks", {}))
    if source is not None:
        tx.output.guards.keys(AttrSource(source, "_forward_hooks"), tuple(hooks))
    for hook_id, hook in hooks.items():
        result = tx.wrap(hook, ItemSource(AttrSource(source, "_forward_hooks"), hook_id) if source else None)\
            .call(tx, [module_variable, TupleVariable(args), output], {})
        if not (isinstance(result, ConstantVariable) and result.value is None):
            output = result
    return output


def _type_source(variable: Variable):
    return TypeSource(variable.source) if variable.source is not None else None


def guard_global_hooks(tx) -> None:
    """nn.Module's process-wide hook registries must stay empty (checked once per entry)."""
    from torch.nn.modules import module as module_module

    for name in _GLOBAL_HOOK_DICTS:
        registry = getattr(module_module, name, None)
        if registry is None:
            continue
        if registry:
            raise Unsupported(f"global module hooks (torch.nn.modules.module.{name})")
        source_name = f"__hooks_{name.strip('_')}"
        tx.output.guard_namespace[source_name] = registry
        tx.output.guards.empty(NamedSource(source_name))


class PythonModuleVariable(Variable):
    """A Python module (`torch`, `math`, a user module): attribute reads are wrapped and guarded."""

    def __init__(self, module: types.ModuleType, source=None):
        self.value = module
        self.source = source

    def describe(self) -> str:
        return f"module {self.value.__name__}"

    def python_type(self) -> type:
        return types.ModuleType

    def identity(self) -> Any:
        return self.value

    def as_constant(self) -> Any:
        return self.value

    def getattr(self, tx, name: str) -> Variable:
        stored = tx.output.side_effects.stored_global(self.value.__dict__, name)  # a global the trace assigned
        if stored is not None:
            if not isinstance(stored, Variable):
                raise AttributeFailure(f"module {self.value.__name__} attribute {name!r} read after `del`")
            return stored
        try:
            value = getattr(self.value, name)
        except AttributeError:
            if self.source is not None and not _is_trusted_module(self.value):  # until the module gains it
                tx.output.guards.has_attr(self.source, name, False)
            raise AttributeFailure(f"module {self.value.__name__} has no attribute {name!r}") from None
        # a library module's functions, classes and submodules are taken as they are; its flags are settings
        # a program changes between calls (`torch.backends.mkldnn.enabled`, `torch.backends.cudnn.benchmark`)
        guarded = not _is_trusted_module(self.value) or type(value) in (bool, int, float, str)
        source = AttrSource(self.source, name) if self.source is not None else None
        return tx.wrap(value, source if guarded or isinstance(value, types.ModuleType) else None,
                       guard=guarded)

    def setattr(self, tx, name: str, value: Variable) -> None:
        """`module.NAME = value` is a store into that module's globals, replayed after the graph."""
        if _is_trusted_module(self.value):
            raise Unsupported(f"assigning {name!r} on library module {self.value.__name__}")
        namespace = self.value.__dict__
        tx.output.side_effects.store_global(namespace, tx.output.named_source("__globals", namespace), name, value)


def _is_trusted_module(module: types.ModuleType) -> bool:
    """Library modules kiln assumes nobody monkeypatches while compiled code runs (no guards)."""
    return is_trusted_module(module.__name__)
