"""Tensors: an FX node for the graph plus a fake tensor for metadata.

Every tensor operation the trace meets becomes one node (`call_function` for torch
functions and Python operators, `call_method` for Tensor methods); the fake tensor
from running the same operation under the FakeTensorMode gives the result's shape,
dtype, device and strides without computing anything. Metadata reads (`x.shape`,
`x.dtype`, `x.dim()`) are constants, valid because input metadata is guarded.
Anything that needs a tensor's *values* in Python (`bool(x)`, `x.item()`,
`x.tolist()`) is data-dependent and unsupported.
"""
from __future__ import annotations

import operator

import torch

from kiln.frontend.errors import AttributeFailure, Unsupported
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

    def length(self, tx) -> int:
        if self.fake.dim() == 0:
            raise Unsupported("len() of a 0-d tensor")
        return int(self.fake.shape[0])

    def unpack(self, tx) -> list[Variable]:
        return [self.getitem(tx, ConstantVariable(index)) for index in range(self.length(tx))]

    def getattr(self, tx, name: str) -> Variable:
        if name in ("shape",):
            return ConstantVariable(self.fake.shape)
        if name in _METADATA_ATTRIBUTES:
            return ConstantVariable(getattr(self.fake, name))
        if name in ("T", "mT", "H", "mH", "real", "imag", "data"):
            if name == "data":
                return tx.output.call_tensor_op(tx, "call_method", "detach", [self], {})
            return tx.output.call_tensor_op(tx, "call_function", getattr, [self, ConstantVariable(name)], {})
        if name == "grad":
            raise Unsupported("reading .grad of a tensor inside a compiled function")
        if name == "__class__":
            return tx.wrap_sourceless(self.real_type)
        if callable(getattr(torch.Tensor, name, None)):
            return TensorMethodVariable(self, name)
        if not hasattr(torch.Tensor, name):
            raise AttributeFailure(f"'Tensor' object has no attribute {name!r}")
        raise Unsupported(f"tensor attribute {name!r}")

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
        if name in _DATA_DEPENDENT:
            raise Unsupported(f"Tensor.{name}() needs the tensor's data in Python (data-dependent)")
        if name in _METADATA_METHODS and not (name == "type" and (args or kwargs)):
            values = [arg.as_constant() for arg in args]
            keywords = {key: arg.as_constant() for key, arg in kwargs.items()}
            return ConstantVariable(getattr(self.tensor.fake, name)(*values, **keywords))
        return tx.output.call_tensor_op(tx, "call_method", name, [self.tensor, *args], kwargs)


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
