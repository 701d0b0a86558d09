"""The one place kiln touches private torch APIs.

torch changes its private modules between releases; every such import lives here so
that supporting a new release means editing one file. kiln supports torch 2.11 and 2.13.
"""
from __future__ import annotations

import torch
from torch._decomp import core_aten_decompositions, get_decompositions  # noqa: F401
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func  # noqa: F401
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: F401
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing as untraced  # noqa: F401
from torch.fx.experimental.symbolic_shapes import ShapeEnv  # noqa: F401

aten = torch.ops.aten


def register_dynamo_backend(name: str, fn) -> None:
    """Make `torch.compile(backend=name)` find `fn` (idempotent)."""
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    if name in _COMPILER_FNS:
        return
    _BACKENDS.pop(name, None)
    register_backend(compiler_fn=fn, name=name)


def dynamo_reset() -> None:
    torch._dynamo.reset()


def sym_expr(value):
    """The sympy expression of an int or SymInt (a plain int stays an Integer)."""
    import sympy

    if isinstance(value, torch.SymInt):
        return value.node.expr
    return sympy.Integer(int(value))


def is_fake(value) -> bool:
    return isinstance(value, FakeTensor)


def real_tensors():
    """A context where new tensors are real even while a compile's fake mode is active (a compiled
    module's own state, such as its index-error flag)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def fake_mode_of(example_inputs):
    """The FakeTensorMode of the example inputs, if they are fake."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode(example_inputs)


def tensor_metadata_checker(tensors: list, names: list[str]):
    """One C++ check of many tensors' static metadata (TorchDynamo's TensorGuards), or None.

    `checker.check(*values)` is True when every value is a tensor of exactly the same
    Python type, dispatch keys, dtype, device, sizes, strides and requires_grad as the
    example at its position; `checker.check_verbose(*values, tensor_check_names=names)`
    says which differs. None where this torch lacks it or it does not accept the examples
    (kiln's frontend then checks each tensor in Python).
    """
    try:
        from torch._C._dynamo.guards import TensorGuards

        checker = TensorGuards(*tensors, dynamic_dims_sizes=[list(tensor.shape) for tensor in tensors],
                               dynamic_dims_strides=[list(tensor.stride()) for tensor in tensors],
                               tensor_check_names=list(names))
        if checker.check(*tensors) is not True:
            return None
        return checker
    except Exception:
        return None


def storage_ids(*tensors) -> list[int]:
    """An identity of each tensor's storage (its StorageImpl's address, `untyped_storage()._cdata`):
    equal exactly when two tensors share one storage, whatever their offsets, views or sizes
    (two empty tensors differ, unlike their data pointers), and cheaper than
    `untyped_storage().data_ptr()` (see benchmarks/results/2026-12-02_docstring-measurements.md).
    kiln's frontend guards check with it that inputs the
    graph mutates share storage as in the trace."""
    return [tensor.untyped_storage()._cdata for tensor in tensors]


def storage_use_count(handle: int) -> int:
    """How many tensors hold the storage whose `untyped_storage()._cdata` is `handle` (CUDA graphs'
    check that no result of the previous replay is still alive)."""
    return torch._C._storage_Use_Count(handle)


def reinterpret_tensor():
    """torch's C++ `_reinterpret_tensor(tensor, size, stride, offset)` (Inductor's wrappers use it):
    a view whose offset counts from the tensor's own storage offset, in about half the time of
    `Tensor.as_strided` from Python. None where this torch lacks it."""
    try:
        from torch._C._dynamo.guards import _reinterpret_tensor
    except ImportError:
        return None
    return _reinterpret_tensor


def onednn_linear():
    """oneDNN's linear, `mkldnn::_linear_pointwise(x, weight[N, K], bias?, "none", [], "")`, a
    private op of torch's CPU build (Inductor calls it for linears it packs under freezing).
    None where this torch has no oneDNN."""
    if not torch.backends.mkldnn.is_available():
        return None
    packet = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    return None if packet is None else packet.default


def onednn_linear_binary():
    """`mkldnn::_linear_pointwise.binary(x, other, weight, bias?, attr)`: the linear, then
    `attr` ("mul", "add", ...) with `other` applied as it stores. None where torch lacks it."""
    if onednn_linear() is None:
        return None
    return getattr(torch.ops.mkldnn._linear_pointwise, "binary", None)


def _vector_norm_keeps_negative_size1_dims() -> bool:
    """Whether this torch's shape rule for `linalg_vector_norm` keeps a reduced dim of size 1 that
    is named by a negative index: vector_norm(x of shape (1,), dim=-1) is (1,) on meta and fake
    tensors, () in eager. torch 2.11's reference (torch/_refs/linalg, which is the op's Meta kernel,
    its FakeTensor rule and its decomposition) drops only the dims it finds in `dim` as given;
    torch 2.13 canonicalizes them first."""
    probe = torch.linalg.vector_norm(torch.empty(1, 1, device="meta"), dim=(-1, 0))
    return probe.shape != ()


def fix_vector_norm_shape_rule() -> bool:
    """Where this torch has that bug, make its `linalg_vector_norm` reference canonicalize `dim`
    before it runs, so graphs traced by kiln's frontend, by Dynamo and by AOTAutograd give eager's
    shapes (before: a 0-dim norm came back from a compiled graph as shape (1,), and every value
    computed from it with it). The reference is one function that the Meta kernel, the Python
    dispatcher's Meta kernel and the decomposition table all hold through `out_wrapper`; its wrapped
    function is swapped in the wrapper's closure, so each of them is fixed. True when fixed (or
    nothing to fix)."""
    if not _vector_norm_keeps_negative_size1_dims():
        return True
    import torch._refs.linalg as linalg_refs
    from torch._prims_common import canonicalize_dims

    wrapper = linalg_refs.vector_norm
    original = getattr(wrapper, "__wrapped__", None)
    cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__ or ()))
    if original is None or "fn" not in cells or cells["fn"].cell_contents is not original:
        return False

    def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
        if dim is not None:  # as a list: the reference reads `dim == []` (not `()`) as "every dim"
            dims = canonicalize_dims(x.ndim, dim)
            dim = [dims] if isinstance(dims, (int, torch.SymInt)) else list(dims)
        return original(x, ord, dim, keepdim, dtype=dtype)

    vector_norm.__wrapped__ = original
    cells["fn"].cell_contents = vector_norm
    return not _vector_norm_keeps_negative_size1_dims()


fix_vector_norm_shape_rule()


def keep_linalg_error_checks() -> None:
    """Mark `aten._linalg_check_errors` effectful (ordered), as torch 2.13 does, where this torch
    does not: it returns nothing, so torch 2.11's functionalization dropped it from the ATen graph
    as dead code and a compiled `torch.linalg.inv` of a singular matrix returned garbage instead of
    raising LinAlgError. Effectful, it is threaded through `with_effects` (kiln/lowering/effects.py)."""
    from torch._higher_order_ops.effects import _EffectType, _get_effect, _register_effectful_op

    if _get_effect("aten::_linalg_check_errors") is None:
        _register_effectful_op("aten::_linalg_check_errors", _EffectType.ORDERED)


keep_linalg_error_checks()


def suggest_memory_format(tensor) -> torch.memory_format:
    """The memory format torch's decompositions lay their results out in (channels_last or contiguous)."""
    from torch._prims_common import suggest_memory_format as suggest

    return suggest(tensor)
