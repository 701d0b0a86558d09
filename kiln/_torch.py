"""The one place kiln touches private torch APIs.

torch changes its private modules between releases; every such import lives here so
that supporting a new release means editing one file. kiln supports torch 2.11 and 2.13.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch._decomp import get_decompositions  # noqa: F401
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func  # noqa: F401
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: F401
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing as untraced  # noqa: F401
from torch.fx.experimental.symbolic_shapes import ShapeEnv  # noqa: F401

aten = torch.ops.aten


def core_aten_decompositions() -> dict:
    """torch's core-ATen decomposition table without its CompositeImplicitAutograd entries. torch's public
    `core_aten_decompositions()` (for torch.export) adds every CIA op of every loaded namespace, which costs
    0.07 s on this project's CPU (torch 2.13) and 0.4 s of a cold first call under cProfile on the GPU host
    (torch 2.11), in each new process; a trace never reaches those entries, since the dispatcher decomposes a
    CIA op through the same kernel before any mode sees it (tests/aot/test_decomposition_table.py: the models'
    ATen graphs are equal with either table)."""
    try:
        from torch._decomp import _core_aten_decompositions_post_autograd as post_autograd
    except ImportError:
        from torch._decomp import core_aten_decompositions as public

        return dict(public())
    return dict(post_autograd())


def register_dynamo_backend(name: str, fn) -> None:
    """Make `torch.compile(backend=name)` find `fn`; idempotent, whatever was imported first.

    torch registers a backend declared as a `torch_dynamo_backends` entry point itself, the first
    time a compile asks for it: it loads the entry point (importing kiln, which calls this) and then
    registers what it loaded, asserting the name is not registered yet. So a name torch has
    discovered as an entry point is left to torch; any other name is registered here, once.
    """
    from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

    if name in _COMPILER_FNS or _BACKENDS.get(name) is not None:
        return
    register_backend(compiler_fn=fn, name=name)


def compiled_module_base() -> type:
    """torch.compile's module wrapper class (TorchDynamo's OptimizedModule), which kiln's subclasses: tools
    that unwrap a compiled module by `isinstance` (Accelerate's `unwrap_model`, Transformers, Lightning)
    then unwrap kiln's too. nn.Module where this torch has no such class."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:
        return torch.nn.Module
    return OptimizedModule


def dynamo_reset() -> None:
    torch._dynamo.reset()


def has_unbacked_symbols(value) -> bool:
    """Whether a SymInt depends on a tensor's data (an unbacked symbol, `u0`), not only on sizes."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return bool(free_unbacked_symbols(value))


def sym_expr(value):
    """The sympy expression of an int or SymInt (a plain int stays an Integer), spelled with kiln's
    index functions (kiln/ir/indexing.py) where the ShapeEnv wrote torch's own (`s0 // 2`, min, max)."""
    import sympy

    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        return expr if expr.is_Symbol or expr.is_Integer else _kiln_index_functions(expr)
    return sympy.Integer(int(value))


# How kiln's index expressions spell torch's integer sympy functions (torch/utils/_sympy/functions.py), by
# name: kiln/ir/indexing.py fills it with its FloorDiv and Mod and sympy's Min, Max and Pow.
INDEX_FUNCTION_REWRITES: dict = {}


def _kiln_index_functions(expr):
    """`expr` with torch's integer sympy functions replaced as INDEX_FUNCTION_REWRITES says."""
    import torch.utils._sympy.functions as torch_functions

    for name, rewrite in INDEX_FUNCTION_REWRITES.items():
        function = getattr(torch_functions, name, None)
        if function is not None and expr.has(function):
            expr = expr.replace(lambda node, function=function: type(node) is function,
                                lambda node, rewrite=rewrite: rewrite(*node.args))
    return expr


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


def tensor_metadata_checker(tensors: list, names: list[str], sizes: list | None = None,
                            strides: list | None = None):
    """One C++ check of many tensors' static metadata (TorchDynamo's TensorGuards), or None.

    `checker.check(*values)` is True when every value is a tensor of exactly the same
    Python type, dispatch keys, dtype, device, sizes, strides and requires_grad as the
    example at its position; `checker.check_verbose(*values, tensor_check_names=names)`
    says which differs. `sizes` and `strides` (one list per tensor, default: the example's)
    may hold None for a symbolic size or stride, which is not compared (the shape guards
    check it). None where this torch lacks it or it does not accept the examples
    (kiln's frontend then checks each tensor in Python).
    """
    try:
        from torch._C._dynamo.guards import TensorGuards

        checker = TensorGuards(*tensors,
                               dynamic_dims_sizes=sizes or [list(tensor.shape) for tensor in tensors],
                               dynamic_dims_strides=strides or [list(tensor.stride()) for tensor in tensors],
                               tensor_check_names=list(names))
        if checker.check(*tensors) is not True:
            return None
        return checker
    except Exception:
        return None


# torch's error for a failed CUDA call (a RuntimeError subclass since torch 2.8); no class matches where it is absent
ACCELERATOR_ERRORS = tuple(getattr(torch, name) for name in ("AcceleratorError",) if hasattr(torch, name))


def autocast_state() -> tuple:
    """((device, enabled, dtype) for the CPU and CUDA autocast): what a trace under autocast depends on."""
    return tuple((device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                 for device in ("cpu", "cuda"))


def current_cuda_stream(index: int | None) -> int:
    """The handle of the current CUDA stream on device `index` (None: the current device), as an int
    (torch's C binding, which Triton's launcher reads too: no Stream object is built)."""
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device() if index is None else index)


def cuda_stream_functions() -> tuple | None:
    """(current device index, raw current stream of a device index): torch's C bindings, which a
    kernel launch calls without torch.cuda.current_device()'s Python frames (its lazy-init check;
    a launcher only runs after CUDA is initialized). None where torch is built without CUDA."""
    device = getattr(torch._C, "_cuda_getDevice", None)
    stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return (device, stream) if device is not None and stream is not None else None


def autocast_region_functions() -> tuple:
    """(enter, exit): the functions an FX graph calls to enter and leave a `torch.autocast` block
    (what Dynamo and kiln's frontend record for one)."""
    from torch.amp import autocast_mode

    return autocast_mode._enter_autocast, autocast_mode._exit_autocast


def any_autocast_enabled() -> bool:
    """Whether autocast is on for any device kind (AOTAutograd's wrapper then turns it off around a graph)."""
    return torch._C._is_any_autocast_enabled()


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


def partition_function(name: str):
    """AOTAutograd's partitioner `name`: which forward values the backward reads from memory.
    "default" saves every forward value the backward needs; "min_cut" (what Inductor uses) saves
    fewer, by bytes, and recomputes cheap pointwise work in the backward instead."""
    from torch._functorch import partitioners

    if name == "default":
        return partitioners.default_partition
    if name == "min_cut":
        return functools.partial(partitioners.min_cut_rematerialization_partition, compiler="inductor")
    raise ValueError(f"kiln.config.partitioner: unknown partitioner {name!r}; choose 'default' or 'min_cut'")


def storage_alias(tensor: torch.Tensor) -> torch.UntypedStorage:
    """A new storage object over `tensor`'s memory, which it does not own (a CUDA graph's output buffer):
    tensors made on it share no StorageImpl with `tensor`, so they can be invalidated on their own."""
    storage = tensor.untyped_storage()
    return torch._C._construct_storage_from_data_pointer(storage.data_ptr(), tensor.device, storage.nbytes())


def tensor_on(storage: torch.UntypedStorage, like: torch.Tensor) -> torch.Tensor:
    """A tensor on `storage` with `like`'s dtype, sizes, strides and storage offset."""
    return torch.empty(0, dtype=like.dtype, device=like.device).set_(storage, like.storage_offset(), like.size(),
                                                                     like.stride())


def storage_weak_ref(storage: torch.UntypedStorage):
    """A weak reference to `storage` (`.expired()`, `.cdata`: the StorageImpl, as `_cdata` of its tensors')."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(storage)


def storage_invalidator():
    """`invalidate(storage_cdata, message)`, after which reading the storage's data through any tensor raises
    RuntimeError(message) (their sizes still read): how CUDA graphs mark a result a later replay overwrote,
    as torch's cudagraph trees do. None where this torch build lacks it (the CPU-only builds)."""
    return getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)


def cublas_workspace_releaser():
    """`release()`, which frees every cuBLAS workspace torch keeps (one per handle and stream, 32 MiB each on
    an H100; the next product on a stream allocates its own again), or None where this build has none."""
    return getattr(torch._C, "_cuda_clearCublasWorkspaces", None)


def tangent_positions(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """The positions, among a backward graph's inputs, of the tangents (the gradients of the forward's outputs,
    new tensors on every backward). AOTAutograd names their placeholders `tangents_<n>` (its partitioner tells
    them apart by that name, `_is_tangent`)."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    return tuple(position for position, node in enumerate(placeholders) if "tangents" in str(node.target))


def reinterpret_tensor():
    """torch's C++ `_reinterpret_tensor(tensor, size, stride, offset)` (Inductor's wrappers use it):
    a view whose offset counts from the tensor's own storage offset, in about half the time of
    `Tensor.as_strided` from Python. None where this torch lacks it."""
    try:
        from torch._C._dynamo.guards import _reinterpret_tensor
    except ImportError:
        return None
    return _reinterpret_tensor


def empty_strided_on_current_device(device_type: str):
    """torch's C++ `_empty_strided_<cpu|cuda>(size, stride, dtype)` (Inductor's wrappers use them):
    an uninitialized tensor on the current device of that type, in about a third of the time of
    `torch.empty_strided(..., device=..., dtype=...)` from Python (no argument parsing, no device
    lookup). None where this torch lacks it."""
    from torch._C._dynamo import guards

    return getattr(guards, f"_empty_strided_{device_type}", None)


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


def dense_without_overlap(shape, strides) -> bool:
    """ATen's `is_non_overlapping_and_dense` of a layout: it addresses exactly numel consecutive elements (a
    permuted contiguous one)."""
    step = 1
    for extent, stride in sorted((pair for pair in zip(shape, strides) if pair[0] != 1), key=lambda pair: pair[1]):
        if stride != step:
            return False
        step *= extent
    return True


def may_overlap_itself(tensor: torch.Tensor) -> bool:
    """Whether two indices of the strided `tensor` might address one element (an expand, unfold with a step
    below its size, as_strided((2, 2), (1, 1))). False only where provably not: each dim's stride, smallest
    first, passes the farthest offset the dims before it reach."""
    if tensor.numel() == 0:
        return False
    reach = 0
    for stride, size in sorted((stride, size) for size, stride in zip(tensor.shape, tensor.stride()) if size != 1):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def guess_no_tangent_strides_from_overlapping_outputs() -> bool:
    """AOTAutograd traces the backward with each tangent laid out as its forward output and copies the runtime
    tangent into that layout; it skips an output that overlaps itself only where `_debug_has_internal_overlap`
    says so for certain (an expand), not where it gives up (unfold with a step below its size, as_strided with
    interleaved strides). Copied into such a layout, the elements of the gradient that share an address
    overwrite each other: the input's gradient came out wrong (inductor's as well). Wrap its guess so that any
    output that may overlap itself takes the memory-format path (a contiguous tangent), as dynamic shapes do.
    True when wrapped (or the guess is not this torch's)."""
    try:
        from torch._functorch._aot_autograd.schemas import MemoryFormatMeta
        from torch._prims_common import suggest_memory_format
    except ImportError:
        return True
    guess = MemoryFormatMeta.__dict__.get("from_tensor")
    if not isinstance(guess, staticmethod):
        return False
    original = guess.__func__
    if getattr(original, "kiln_overlap_checked", False):
        return True

    def from_tensor(tensor, *args, **kwargs):
        if isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided and \
                not tensor._has_symbolic_sizes_strides and may_overlap_itself(tensor):
            return MemoryFormatMeta(memory_format=suggest_memory_format(tensor))
        return original(tensor, *args, **kwargs)

    from_tensor.kiln_overlap_checked = True
    MemoryFormatMeta.from_tensor = staticmethod(functools.wraps(original)(from_tensor))
    return True


guess_no_tangent_strides_from_overlapping_outputs()


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


# -- symbolic shapes: kiln's frontend makes changing sizes and scalars symbolic (kiln/frontend/dynamic.py) --

def symbolic_fake_mode() -> FakeTensorMode:
    """A FakeTensorMode with a ShapeEnv, set as Dynamo sets its own: fake tensors may have symbolic
    sizes, every fact a trace relies on about them is recorded as a guard, and `.item()` or an op
    whose output shape depends on data still raises (no scalar outputs, no dynamic output shapes)."""
    return FakeTensorMode(shape_env=ShapeEnv(allow_scalar_outputs=False, allow_dynamic_output_shape_ops=False))


def _input_source(name: str):
    """The torch-side source of a symbolic input: the ShapeEnv names its symbols' origins by it."""
    from torch._dynamo.source import LocalSource

    return LocalSource(name)


def symbolic_fake_tensor(mode: FakeTensorMode, tensor: torch.Tensor, name: str, dims) -> FakeTensor:
    """The fake of `tensor` with a symbol for each size in `dims` (equal sizes share one, as Dynamo's
    duck sizing does; 0 and 1 stay static), the other sizes static, strides inferred from the sizes."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    context = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DUCK if dim in dims else DimDynamic.STATIC for dim in range(tensor.dim())])
    return mode.from_tensor(tensor, symbolic_context=context, source=_input_source(name))


def symbolic_int(mode: FakeTensorMode, value: int, name: str) -> torch.SymInt:
    """An int argument as a SymInt with its own symbol (any value, 0 and 1 included), as Dynamo makes one."""
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    return mode.shape_env.create_unspecified_symint_and_symbol(value, _input_source(name), DimDynamic.DYNAMIC)


def is_tensorify_restart(error: BaseException) -> bool:
    """Whether `error` is AOTAutograd asking its caller to trace again with float inputs specialized
    (`TensorifyScalarRestartAnalysis`): torch 2.11's `tensorify_python_scalars` could not turn the
    arithmetic on a SymFloat back into tensor arithmetic. Dynamo catches it and traces again; so do
    kiln's frontend (with its floats static) and `compile_graph` (which lets it through to Dynamo)."""
    restart = getattr(torch._dynamo.exc, "TensorifyScalarRestartAnalysis", None)
    return restart is not None and isinstance(error, restart)


def symbolic_float(mode: FakeTensorMode, value: float, name: str) -> tuple[torch.Tensor, FakeTensor, torch.SymFloat]:
    """A float argument as Dynamo passes one to a backend: a 0-d float64 tensor (real, and its fake)
    whose `item()` is a SymFloat of the shape environment; AOTAutograd's `tensorify_python_scalars`
    pass turns the graph's scalar arithmetic on it back into tensor arithmetic."""
    from torch._dynamo.source import FloatTensorSource

    real = torch.tensor(value, dtype=torch.float64)
    fake = mode.from_tensor(real, source=FloatTensorSource(_input_source(name)))
    with mode:
        item = fake.item()
    return real, fake, item


def is_symbolic(value) -> bool:
    """Whether `value` (a number, or a tuple of them) holds a SymInt/SymFloat/SymBool that is not a constant."""
    if isinstance(value, (tuple, list)):
        return any(is_symbolic(item) for item in value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        from torch.fx.experimental.symbolic_shapes import is_symbolic as symbolic

        return symbolic(value)
    return False


def concrete(value):
    """A SymInt/SymFloat/SymBool whose expression is a number as that Python number; anything else as it is."""
    if isinstance(value, torch.SymInt):
        known = value.node.maybe_as_int()
        return value if known is None else known
    if isinstance(value, torch.SymFloat):
        known = value.node.maybe_as_float()
        return value if known is None else known
    if isinstance(value, torch.SymBool):
        known = value.node.maybe_as_bool()
        return value if known is None else known
    return value


def concrete_or_none(values) -> list:
    """Sizes or strides with every symbolic one as None (what TensorGuards leaves to the shape guards)."""
    result = []
    for value in values:
        value = concrete(value)
        result.append(None if isinstance(value, (torch.SymInt, torch.SymFloat)) else int(value))
    return result


def bare_symbol(value):
    """The sympy Symbol a SymInt/SymFloat stands for when its expression is exactly one symbol, else None."""
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        expr = value.node.expr
        return expr if getattr(expr, "is_Symbol", False) else None
    return None


def symbolic_properties(fake: FakeTensor) -> list[tuple[str, int | None, torch.SymInt]]:
    """("size"/"stride", dim, value) and ("storage_offset", None, value) of a fake whose value is a
    bare symbol: the symbols a graph taking this tensor binds as its own inputs (as Dynamo's do)."""
    found = [("size", dim, size) for dim, size in enumerate(fake.shape)]
    found += [("stride", dim, stride) for dim, stride in enumerate(fake.stride())]
    found.append(("storage_offset", None, fake.storage_offset()))
    return [(kind, dim, value) for kind, dim, value in found if bare_symbol(value) is not None]


def shape_guards(inputs: list, render) -> list[str]:
    """The ShapeEnv's guards on these inputs as Python conditions (`produce_guards`): for each symbol
    bound by several inputs (duck sizing) their equality, every relation the trace (and the backend's
    compile) relied on, and each symbol's range (`2 <= x.size(1)`: 0 and 1 were specialized).

    `inputs` are (fake tensor, SymInt or SymFloat, name) pairs; the conditions read the inputs through
    `render(name, kind, dim)`, kind one of None (the input itself), "size", "stride", "storage_offset".
    Sizes that became constants are left to the tensor check (TensorGuards), as in Dynamo."""
    from torch._dynamo.source import LocalSource, TensorProperty, TensorPropertySource

    kinds = {TensorProperty.SIZE: "size", TensorProperty.STRIDE: "stride",
             TensorProperty.STORAGE_OFFSET: "storage_offset"}

    def source_ref(source) -> str:
        if isinstance(source, TensorPropertySource):
            return render(source.base.local_name, kinds[source.prop], source.idx)
        if isinstance(source, LocalSource):
            return render(source.local_name, None, None)
        raise NotImplementedError(f"a shape guard reads {type(source).__name__}")

    values = [value for value, _ in inputs]
    sources = [_input_source(name) for _, name in inputs]
    first = values[0]
    shape_env = first.fake_mode.shape_env if isinstance(first, FakeTensor) else first.node.shape_env
    return list(shape_env.produce_guards(values, sources, source_ref=source_ref))


def shape_guard_namespace() -> dict:
    """The functions the conditions of `shape_guards` may call (sympy's printer spells a few by name)."""
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    return dict(SYMPY_INTERP)


def specialize(value):
    """The Python number a SymInt/SymFloat/SymBool has in this trace, recording in its ShapeEnv the
    guard that it keeps that value (so the entry is only used where it does)."""
    if isinstance(value, torch.SymBool):
        return bool(value)
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    return value


def fake_tracing(mode: FakeTensorMode):
    """The context in which the frontend runs a torch op on fake tensors: `mode`, and with symbolic
    sizes also the Python dispatcher, as Dynamo runs one. (torch 2.11's C++ matmul calls numel() on its
    inputs, which a tensor with symbolic sizes refuses; the Python dispatcher's decomposition does not.)"""
    if mode.shape_env is None:
        return mode
    from torch._dispatch.python import enable_python_dispatcher

    stack = contextlib.ExitStack()
    stack.enter_context(mode)
    stack.enter_context(enable_python_dispatcher())
    return stack


def backend_tracing(mode: FakeTensorMode):
    """The context in which a graph with symbolic inputs goes to its backend, as Dynamo calls one: a
    TracingContext holding the trace's fake mode, so that AOTAutograd fakes the example inputs with the
    trace's own fakes (and symbols) and records every guard it needs in the same ShapeEnv."""
    from torch._guards import TracingContext, tracing

    return tracing(TracingContext(mode))


def active_ddp_bucket_caps() -> tuple[int, int] | None:
    """(first bucket's byte cap, other buckets' byte cap) of the DistributedDataParallel whose forward is
    running (DDP sets `_active_ddp_module` around its call of the wrapped module), or None outside one."""
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel._get_active_ddp_module()
    cap = getattr(ddp, "bucket_bytes_cap", None)
    if not isinstance(cap, int) or cap <= 0:
        return None
    config = getattr(ddp, "_bucket_config", None)  # torch 2.13; 2.11 keeps the first cap as a module default
    first = getattr(config, "first_bucket_bytes_cap", None)
    if not isinstance(first, int):
        first = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES if getattr(ddp, "bucket_bytes_cap_default", False) \
            else cap
    return min(first, cap), cap


def count_aot_autograd_call() -> None:
    """Tell TorchDynamo that a graph went through AOTAutograd, as torch's own AOT backends do.

    Dynamo's DDPOptimizer (torch.compile of a DDP model, split at its buckets) asks AOTAutograd for a
    compiled piece whose first call returns fake outputs (`fakify_first_call`), makes that first call
    itself while compiling, and knows AOTAutograd ran by this counter only: left unchanged, the user's
    first step got the leftover fake outputs (`Please convert all Tensors to FakeTensors first`)."""
    from torch._dynamo.utils import counters

    counters["aot_autograd"]["total"] += 1


def plain_trace_inputs(example_inputs: list):
    """(fake mode, fake inputs) for tracing an inference graph to ATen without AOTAutograd (kiln/aot/plain.py
    `trace_to_aten`), as AOTAutograd would fake them: the fake mode of the frontend's TracingContext (or of the
    inputs); each input faked with the symbolic context Dynamo recorded for it, or its memoized fake (kiln's
    frontend); with no fake mode, a new one with static shapes. None where
    AOTAutograd's own conversion is needed: an input the mode never faked while its shapes may be symbolic
    (AOTAutograd gives it the TracingContext's symbolic context), or Dynamo's DDPOptimizer, whose first call of a
    compiled piece takes fake tensors (`fakify_first_call`)."""
    from torch._guards import TracingContext, detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    context = TracingContext.try_get()
    if context is not None and getattr(context, "fakify_first_call", False):
        return None
    mode = detect_fake_mode(example_inputs)
    if mode is None:
        mode = FakeTensorMode()
    fakes = []
    for value in example_inputs:
        if isinstance(value, FakeTensor):
            if value.fake_mode is not mode:
                return None
            fakes.append(value)
            continue
        if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
            return None  # a tensor subclass: AOTAutograd flattens it
        if context is not None and value in context.tensor_to_context:  # Dynamo's input: its symbols, as AOTAutograd
            symbolic = context.tensor_to_context[value]                    # fakes it
            fakes.append(mode.from_tensor(value, symbolic_context=symbolic, source=symbolic.tensor_source,
                                          trace=False))
            continue
        memo = mode.fake_tensor_converter._get_memo(value)  # kiln's frontend faked it while tracing
        if memo is None:
            if mode.shape_env is not None:
                return None
            memo = mode.from_tensor(value, static_shapes=True)
        fakes.append(memo)
    return mode, fakes


def make_fx_aten(function, fake_mode, fake_inputs: list, decompositions: dict):
    """`function` traced to an ATen FX graph on `fake_inputs` under `fake_mode`, with `decompositions`, as
    AOTAutograd's own trace runs (the Python dispatcher on, each node's meta kept for the ATen nodes traced
    from it), without functionalization.

    The graph module is torch's lazy kind, as Dynamo's and Inductor's are: its Python code is generated when
    first called or printed, not at each `recompile()`. kiln reads the ATen graph's nodes, never its code; the
    code serves only the eager fallback. A GPT-2's trace and the recompile after its dead-code pass generated
    ~1,000-line forwards twice, ~0.05 s of a cold first call on the CPU machine (2026-12-06)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx import traceback as fx_traceback
    from torch.fx._lazy_graph_module import _use_lazy_graph_module
    from torch.fx.experimental.proxy_tensor import make_fx

    with fake_mode, enable_python_dispatcher(), fx_traceback.preserve_node_meta(), _use_lazy_graph_module(True):
        return make_fx(function, decomposition_table=decompositions, record_module_stack=True)(*fake_inputs)


def run_graph_for_trace(gm: torch.fx.GraphModule, args: list, fake_mode):
    """Run the torch-level graph `gm` on `args` inside a trace, as AOTAutograd's functional call does: each
    node's meta current while it runs (so the ATen nodes traced from it carry it), unbacked symbols
    propagated, under a new epoch of `fake_mode`."""
    from torch.fx import traceback as fx_traceback
    from torch.fx.experimental.symbolic_shapes import PropagateUnbackedSymInts

    with fx_traceback.preserve_node_meta():
        fake_mode.epoch += 1
        return PropagateUnbackedSymInts(gm).run(*args)
