"""The one place kiln touches Triton internals.

Generated kernels call libdevice (`triton.language.extra.cuda.libdevice`) for math
that `tl` lacks (tanh, pow, erfinv, ...). Triton's interpreter, which runs kernels on
CPU tensors (how CI tests the GPU code path), has no extern functions; here we give
it one: each libdevice symbol is computed with numpy (or torch on numpy arrays), in
the argument's precision. Kernels are loaded as `InterpretedFunction`s for CPU
tensors and `triton.jit` functions for CUDA tensors, from the same source.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import triton
from triton.language.extra.cuda import libdevice
from triton.runtime import interpreter as _interpreter


def _vectorized(fn):
    vector = np.vectorize(fn)
    return lambda x: vector(x).astype(x.dtype)


def _torch_unary(name):
    return lambda x: getattr(torch, name)(torch.from_numpy(np.ascontiguousarray(x))).numpy()


_NUMPY_LIBDEVICE = {
    "tanh": np.tanh, "pow": np.power, "atan2": np.arctan2, "expm1": np.expm1, "log1p": np.log1p,
    "erf": _vectorized(math.erf), "erfc": _vectorized(math.erfc), "lgamma": _vectorized(math.lgamma),
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "tan": np.tan, "log10": np.log10,
    "log": np.log, "exp": np.exp, "log2": np.log2, "exp2": np.exp2, "nearbyint": np.rint, "rint": np.rint,
    "trunc": np.trunc, "signbit": np.signbit, "isnan": np.isnan, "isinf": np.isinf, "fmod": np.fmod,
    "hypot": np.hypot, "copysign": np.copysign, "nextafter": np.nextafter, "erfinv": _torch_unary("erfinv"),
    "fmax": np.fmax, "fmin": np.fmin, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "floor": np.floor, "ceil": np.ceil, "sin": np.sin, "cos": np.cos, "fabs": np.abs, "abs": np.abs,
    "cbrt": np.cbrt, "isfinited": np.isfinite, "finitef": np.isfinite,
}


def _numpy_function(symbol: str):
    name = symbol.removeprefix("__nv_")
    if name in _NUMPY_LIBDEVICE:
        return _NUMPY_LIBDEVICE[name]
    if name.endswith("f") and name[:-1] in _NUMPY_LIBDEVICE:
        return _NUMPY_LIBDEVICE[name[:-1]]
    raise NotImplementedError(f"kiln: libdevice {symbol} has no interpreter implementation")


def _create_extern_elementwise(self, lib_name, lib_path, symbol, arg_list, ret_type, is_pure):
    function = _numpy_function(symbol)
    with np.errstate(all="ignore"):
        result = function(*[argument.data for argument in arg_list])
    result = np.asarray(result).astype(_interpreter._get_np_dtype(ret_type))
    return _interpreter.TensorHandle(result, ret_type.scalar if hasattr(ret_type, "scalar") else ret_type)


_interpreter.InterpreterBuilder.create_extern_elementwise = _create_extern_elementwise
_patch_lang_without_libdevice = _interpreter._patch_lang


def _patch_lang_with_libdevice(fn):
    """The interpreter patches `tl` for each kernel run; patch libdevice alongside it."""
    scope = _patch_lang_without_libdevice(fn)
    _interpreter._patch_builtin(libdevice, _interpreter.interpreter_builder, scope)
    # numpy 2 refuses int() of a 1-element 1-d array, which is how scalars reach range().
    scope.set_attr(_interpreter.tl.tensor, "__index__", lambda self: int(self.handle.data.item()))
    return scope


_interpreter._patch_lang = _patch_lang_with_libdevice


def jit_for_device(function, device_type: str):
    """A Triton kernel object for `function`: compiled for CUDA, interpreted for CPU."""
    if device_type == "cpu":
        return _interpreter.InterpretedFunction(function)
    return triton.jit(function)


def is_interpreted(kernel) -> bool:
    return isinstance(kernel, _interpreter.InterpretedFunction)
