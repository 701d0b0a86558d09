"""Tensors: an FX node for the graph plus a fake tensor for metadata.

Every tensor operation the trace meets becomes one node (`call_function` for torch
functions and Python operators, `call_method` for Tensor methods); the fake tensor
from running the same operation under the FakeTensorMode gives the result's shape,
dtype, device and strides without computing anything. Metadata reads (`x.shape`,
`x.dtype`, `x.dim()`) are constants, valid because input metadata is guarded.
Anything that needs a tensor's *values* in Python (`bool(x)`, `x.item()`,
`x.tolist()`) is data-dependent and unsupported.

With symbolic shapes (kiln/frontend/dynamic.py) a size may be a SymInt: `x.shape`,
`x.size(d)`, `x.numel()` then give `SymNumberVariable`s, whose node computes the number
in the graph; arithmetic on them stays symbolic, and anything that needs the number
itself in Python (a comparison, `range(n)`, a dict key) specializes it: the ShapeEnv
records the fact as a guard (`x.size(1) > 4`, or `== 7`), and the entry is only used
where it holds.
"""
from __future__ import annotations

import operator

import torch

from kiln import _torch
from kiln.frontend.errors import AttributeFailure, Unsupported
from kiln.frontend.sources import AttrSource
from kiln.frontend.variables.base import ConstantVariable, Variable

# Attributes that are plain metadata: read them off the fake tensor.
_METADATA_ATTRIBUTES = frozenset({
    "dtype", "device", "ndim", "is_cuda", "is_cpu", "is_meta", "requires_grad", "layout", "is_sparse",
    "is_quantized", "is_mkldnn", "is_nested", "is_leaf", "itemsize", "is_mps", "is_xpu",
})
# Methods that only read metadata: their (non-tensor) result is a constant.
_METADATA_METHODS = frozenset({
    "size", "dim", "numel", "nelement", "stride", "element_size", "is_contiguous", "is_floating_point",
    "is_complex", "get_device", "storage_offset", "ndimension", "is_signed", "type",
})
_DATA_DEPENDENT = frozenset({"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                             "data_ptr", "untyped_storage", "backward", "register_hook", "retain_grad"})


class TensorVariable(Variable):
    """A tensor value in the graph being built."""

    def __init__(self, node: torch.fx.Node, fake: torch.Tensor, source=None, real_type: type = torch.Tensor):
        self.node = node
        self.fake = fake
        self.source = source
        self.real_type = real_type

    def describe(self) -> str:
        return f"tensor {self.node.name} {tuple(self.fake.shape)} {self.fake.dtype}"

    def python_type(self) -> type:
        return self.real_type

    def truth(self, tx) -> bool:
        raise Unsupported(f"the truth value of {self.describe()} depends on its data "
                          f"(branch on tensor values); use torch.where or move the branch out")

    def assert_true(self, tx, message: str) -> bool:
        """`assert tensor, message` as a graph node (`torch._assert_async`, as Dynamo records it): the graph
        raises there when the one-element tensor is false, and the trace goes on past the assert. False (the
        caller breaks) for a tensor of other than one element, whose truth Python refuses."""
        if self.fake.numel() != 1:
            return False
        tx.output.call_tensor_op(tx, "call_function", torch._assert_async, [self, ConstantVariable(message)], {})
        return True

    def length(self, tx) -> int:
        if self.fake.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return int(self.fake.shape[0])

    def unpack(self, tx) -> list[Variable]:
        return [self.getitem(tx, ConstantVariable(index)) for index in range(self.length(tx))]

    def getattr(self, tx, name: str) -> Variable:
        if name in ("shape",):
            return tx.output.tensor_metadata(tx, self, "size", [], self.fake.shape)
        if name == "is_leaf" and self.source is not None:
            return _outside_flag(tx, self, name)
        if name in _METADATA_ATTRIBUTES:
            return ConstantVariable(getattr(self.fake, name))
        if name in ("T", "mT", "H", "mH", "real", "imag", "data"):
            if name == "data":
                return tx.output.call_tensor_op(tx, "call_method", "detach", [self], {})
            return tx.output.call_tensor_op(tx, "call_function", getattr, [self, ConstantVariable(name)], {})
        if name == "grad":
            # an outside tensor's gradient is another outside value (guarded: None, or a tensor input); a
            # tensor the trace made has none to read yet (Python's is None, but kiln does not model it)
            value = tx.output.outside_tensor(self) if self.source is not None else None
            if value is None:
                raise Unsupported("reading .grad of a tensor the compiled function computed")
            return tx.wrap(value.grad, AttrSource(self.source, "grad"))
        if name == "__class__":
            return tx.wrap_sourceless(self.real_type)
        if callable(getattr(torch.Tensor, name, None)):
            return TensorMethodVariable(self, name)
        if not hasattr(torch.Tensor, name):
            return self._own_attribute(tx, name)
        raise Unsupported(f"tensor attribute {name!r}")

    def _own_attribute(self, tx, name: str) -> Variable:
        """An attribute set on the tensor object itself (`t.tag = 1`: its `__dict__`), or absent under a guard
        that it stays absent. A tensor the trace computed has none."""
        if self.source is None:
            raise AttributeFailure(f"'Tensor' object has no attribute {name!r}")
        value = tx.output.outside_tensor(self)
        if value is None:
            raise Unsupported(f"attribute {name!r} of {self.describe()}, not a tensor input")
        if name in getattr(value, "__dict__", {}):
            return tx.wrap(value.__dict__[name], AttrSource(self.source, name))
        tx.output.guards.has_attr(self.source, name, False)
        raise AttributeFailure(f"'{type(value).__name__}' object has no attribute {name!r}")

    def call_method(self, tx, name, args, kwargs) -> Variable:
        return TensorMethodVariable(self, name).call(tx, args, kwargs)

    def getitem(self, tx, key: Variable) -> Variable:
        return tx.output.call_tensor_op(tx, "call_function", operator.getitem, [self, key], {})

    def setitem(self, tx, key: Variable, value: Variable) -> None:
        tx.output.call_tensor_op(tx, "call_function", operator.setitem, [self, key, value], {})

    def reconstruct(self, codegen) -> str:
        if self.source is not None:  # an outside tensor comes back as itself, not as a graph output aliasing it
            return codegen.source(self.source)
        return codegen.tensor(self)


class TensorMethodVariable(Variable):
    """`x.view` before it is called."""

    def __init__(self, tensor: TensorVariable, name: str):
        self.tensor = tensor
        self.name = name

    def describe(self) -> str:
        return f"Tensor.{self.name}"

    def python_type(self) -> type:
        return type(torch.Tensor.add.__get__(torch.empty(0)))

    def reconstruct(self, codegen) -> str:
        return f"{codegen.value(self.tensor)}.{self.name}"

    def call(self, tx, args, kwargs) -> Variable:
        name = self.name
        if name == "is_inference" and not args and not kwargs:
            return ConstantVariable(bool(self.tensor.node.meta.get("kiln_inference")))
        if name in _DATA_DEPENDENT:
            raise Unsupported(f"Tensor.{name}() needs the tensor's data in Python (data-dependent)")
        if name in ("_is_view", "is_shared", "is_pinned") and not args and not kwargs and \
                self.tensor.source is not None:
            return _outside_flag(tx, self.tensor, name)
        if name in _METADATA_METHODS and not (name == "type" and (args or kwargs)):
            values = [arg.as_constant() for arg in args]
            keywords = {key: arg.as_constant() for key, arg in kwargs.items()}
            result = getattr(self.tensor.fake, name)(*values, **keywords)
            if name == "storage_offset" and not _torch.is_symbolic(result):
                _guard_storage_offset(tx, self.tensor, result)
            if keywords or not _torch.is_symbolic(result):
                return ConstantVariable(_torch.specialize(result))
            return tx.output.tensor_metadata(tx, self.tensor, name, values, result)
        if name in ("addcdiv_", "addcmul_", "addcdiv", "addcmul") and isinstance(kwargs.get("value"), TensorVariable):
            return _pointwise_with_tensor_value(tx, self.tensor, name, args, kwargs)
        return tx.output.call_tensor_op(tx, "call_method", name, [self.tensor, *args], kwargs)


def _outside_flag(tx, tensor: TensorVariable, name: str) -> Variable:
    """`x.is_leaf`, `x._is_view()`, `x.is_shared()` or `x.is_pinned()` of an input: the input's own, guarded.
    Its fake is made afresh, a leaf, no view, in no shared or pinned memory, whatever the input is (a non-leaf
    that requires grad, `base[1:]`), and the tensor guards compare none of these."""
    value = tx.output.outside_tensor(tensor)
    if value is None:
        return ConstantVariable(getattr(tensor.fake, name) if name == "is_leaf" else getattr(tensor.fake, name)())
    flag = value.is_leaf if name == "is_leaf" else getattr(value, name)()
    read = "{}.is_leaf" if name == "is_leaf" else f"{{}}.{name}()"
    tx.output.guards.add(tensor.source, f"{read} is not {flag}", f"{name} changed from {flag}")
    return ConstantVariable(flag)


def _guard_storage_offset(tx, tensor: TensorVariable, offset: int) -> None:
    """`x.storage_offset()` read as a constant: the tensor guards do not compare offsets (one graph serves
    `base[1:]` and `base[3:]`), so an input's is guarded here; a view the graph made has its base's offset in it."""
    if tensor.source is not None:
        tx.output.guards.add(tensor.source, f"{{}}.storage_offset() != {offset}",
                             f"storage offset changed from {offset}")
    elif tensor.fake._is_view():
        raise Unsupported(f"storage_offset() of a view made in the graph ({tensor.describe()}): it depends on the "
                          "offset of the input it views")


def _pointwise_with_tensor_value(tx, tensor: TensorVariable, name: str, args: list, kwargs: dict) -> Variable:
    """`x.addcdiv_(a, b, value=t)` (or addcmul) with a 0-d tensor `t`: an optimizer's step size while compiling
    (torch.optim's `_get_value` keeps the step a tensor then). The op takes `value` as a Scalar, which would need
    `t.item()`; decomposed instead, as Dynamo does, into `x + t * (a / b)` (`a * b` for addcmul), all in the graph."""
    value = kwargs["value"]
    if len(args) != 2 or len(kwargs) != 1 or value.fake.numel() != 1 or not tensor.fake.is_floating_point():
        raise Unsupported(f"Tensor.{name}() with a tensor `value` other than a one-element scalar on a "
                          f"floating-point tensor ({tensor.describe()}, value {value.describe()})")
    output = tx.output
    combine = torch.div if name.startswith("addcdiv") else torch.mul
    term = output.call_tensor_op(tx, "call_function", combine, list(args), {})
    scaled = output.call_tensor_op(tx, "call_function", torch.mul, [term, value], {})
    if name.endswith("_"):
        return output.call_tensor_op(tx, "call_method", "add_", [tensor, scaled], {})
    return output.call_tensor_op(tx, "call_function", torch.add, [tensor, scaled], {})


class SymNumberVariable(Variable):
    """An int or float the graph computes: a symbolic size (SymInt), an int or float argument made a
    graph input, or arithmetic on them. `node` computes it in the graph; `value` is its SymInt/SymFloat.

    It counts as a constant, known up to a guard: `as_constant()` (what any tracker that needs the
    Python number calls) specializes it, recording that it keeps this value in the ShapeEnv.
    Operators (operations.py) and torch calls (the node goes into the graph) keep it symbolic.
    """

    def __init__(self, node: torch.fx.Node, value, source=None):
        self.node = node
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"symbolic {self.python_type().__name__} {self.value}"

    def python_type(self) -> type:
        return float if isinstance(self.value, torch.SymFloat) else int

    def is_constant(self) -> bool:
        return True

    def as_constant(self):
        return _torch.specialize(self.value)

    def truth(self, tx) -> bool:
        return bool(self.value)

    def getattr(self, tx, name: str) -> Variable:
        return ConstantVariable(self.as_constant()).getattr(tx, name)

    def call_method(self, tx, name, args, kwargs) -> Variable:
        return ConstantVariable(self.as_constant()).call_method(tx, name, args, kwargs)

    def reconstruct(self, codegen) -> str:
        if self.source is not None:  # an int or float argument: itself
            return codegen.source(self.source)
        recomputed = codegen.symbolic_number(self)  # from the inputs, by the entry
        return recomputed if recomputed is not None else codegen.constant(self.as_constant())


_SYMBOLIC_ARITHMETIC = frozenset({operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
                                  operator.truediv, operator.pow, operator.neg, operator.pos})


def symbolic_arithmetic(tx, fn, *operands: Variable) -> Variable | None:
    """`fn(*operands)` kept symbolic, when an operand is a SymNumberVariable and the others are numbers;
    None when it cannot be (the caller specializes). A float made from ints alone (`n / 2`) is
    specialized: the backend takes symbolic floats only as they come from float arguments."""
    if fn not in _SYMBOLIC_ARITHMETIC or not all(is_number(operand) for operand in operands):
        return None
    values = [operand.value for operand in operands]
    try:
        result = _torch.concrete(fn(*values))
    except Exception:
        return None
    if isinstance(result, torch.SymFloat) and not any(isinstance(value, torch.SymFloat) for value in values):
        return None
    if not isinstance(result, (torch.SymInt, torch.SymFloat)):
        return ConstantVariable(result)
    args = tuple(operand.node if isinstance(operand, SymNumberVariable) else operand.value for operand in operands)
    return tx.output.symbolic_number(tx, result, lambda: tx.output.symbolic_node("call_function", fn, args, result))


def symbolic_compare(tx, fn, left: Variable, right: Variable) -> Variable | None:
    """A comparison of numbers, one symbolic, as a Python bool: the ShapeEnv records the relation
    (`x.size(0) > 4`) as a guard of the entry. None when an operand is not a number."""
    if not (is_number(left) and is_number(right)):
        other = right if isinstance(left, SymNumberVariable) else left
        if fn in (operator.eq, operator.ne) and isinstance(other, ConstantVariable) and \
                (other.value is None or isinstance(other.value, (str, bytes, tuple))):
            return ConstantVariable(fn is operator.ne)  # a number never equals these: nothing to guard
        return None
    return ConstantVariable(bool(fn(left.value, right.value)))


def is_number(variable: Variable) -> bool:
    """A Python int, float or bool, or a symbolic one."""
    return isinstance(variable, SymNumberVariable) or (
        isinstance(variable, ConstantVariable) and type(variable.value) in (int, float, bool))


def contains_tensor(variable: Variable) -> bool:
    """Whether a tracker is or holds a tensor (decides graph node vs Python evaluation)."""
    if isinstance(variable, TensorVariable):
        return True
    items = getattr(variable, "items", None)
    if isinstance(items, list):
        return any(contains_tensor(item) for item in items)
    if isinstance(items, dict):
        return any(contains_tensor(item) for item in items.values())
    return False
