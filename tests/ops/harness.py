"""Run one OpInfo sample through one rung of kiln's backend ladder and classify the result.

For a sample `op(input, *args, **kwargs)` the harness builds a torch-level FX graph by
hand (no Dynamo: thousands of samples must stay cheap): one placeholder per distinct
tensor found anywhere in the sample (lists and dicts included), every other value baked
in as a constant, one `call_function` node calling `op.op`, and an output tuple of the
result's tensor leaves (what Dynamo hands a backend). The graph is compiled with
`compile_graph(gm, example_inputs)` under `kiln.config.patch(strict=True)`, run, and
compared with eager `op.op` by `kiln.testing.compare`, with a float64 run of the op as
the reference. Inputs are compared too, so an op that mutates its input is checked.

Every sample ends in exactly one `Outcome`; nothing here raises for a kiln failure.
"""
from __future__ import annotations

import contextlib
import importlib
import operator
import re
import signal
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

import torch
import torch.utils._pytree as pytree

import tests.ops  # noqa: F401  (switches the Triton interpreter on before triton loads)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DIRECTIONS = ("forward", "backward")  # backward: gradients through AOTAutograd's joint graph (_run_backward)
GRAD_DTYPES = ("float32",)  # the dtypes the backward direction sweeps
BACKENDS = ("kiln", "aot_eager", "eager")
SEED = 1234


class Outcome:
    """What happened to one sample. Each sample gets exactly one."""

    PASS = "pass"
    MISMATCH = "mismatch"                # kiln ran and gave a wrong answer
    COMPILE_ERROR = "compile error"      # compile_graph raised
    RUNTIME_ERROR = "runtime error"      # the compiled callable raised
    TIMEOUT = "timeout"                  # the sample ran past its time limit
    CRASH = "crash"                      # the worker process died (segfault, abort, OOM)
    HARNESS_ERROR = "harness error"      # the harness (or kiln.testing.compare) broke: a test bug
    EAGER_ERROR = "eager error"          # eager itself raises: nothing to compare, skipped
    NO_TENSOR_OUTPUT = "no tensor output"  # the op returns only Python values: not a graph
    DATA_DEPENDENT = "data-dependent"    # tracing needs tensor values (nonzero, masked_select) and
                                         # Dynamo graph-breaks there, so kiln never gets this graph
    NO_GRADIENT = "no gradient"          # backward: no input requires grad, or no output depends on one

    FAILURES = (MISMATCH, COMPILE_ERROR, RUNTIME_ERROR, TIMEOUT, CRASH, HARNESS_ERROR)
    SKIPS = (EAGER_ERROR, NO_TENSOR_OUTPUT, DATA_DEPENDENT, NO_GRADIENT)


# Exceptions of fake-tensor tracing that mean "needs a tensor's value" (matched by name:
# the classes live in torch's private modules and move between releases).
_DATA_DEPENDENT_ERRORS = ("DataDependentOutputException", "DynamicOutputShapeException",
                          "GuardOnDataDependentSymNode", "PendingUnbackedSymbolNotFound")


# Ops whose values cannot be compared with eager's, only their shapes and dtypes:
# they draw random numbers (kiln's generator is not torch's) or return uninitialized
# memory. OpInfo's own flags (has_nondeterministic_output, ...) are added to these, and
# any single sample whose eager result changes with the seed (see _random_in_eager).
SHAPE_ONLY_OPS = {
    "bernoulli": "random", "cauchy": "random", "exponential": "random", "geometric": "random",
    "log_normal": "random", "multinomial": "random", "normal": "random", "uniform": "random",
    "rand_like": "random", "randint": "random", "randint_like": "random", "randn": "random",
    "randn_like": "random", "nn.functional.dropout": "random", "nn.functional.dropout2d": "random",
    "nn.functional.dropout3d": "random", "nn.functional.alpha_dropout": "random",
    "nn.functional.feature_alpha_dropout": "random", "nn.functional.rrelu": "random",
    "nn.functional.fractional_max_pool2d": "random", "nn.functional.fractional_max_pool3d": "random",
    "svd_lowrank": "random", "pca_lowrank": "random",
    "empty": "uninitialized", "empty_like": "uninitialized", "empty_strided": "uninitialized",
    "empty_permuted": "uninitialized", "new_empty": "uninitialized",
    "new_empty_strided": "uninitialized", "resize_": "uninitialized", "resize_as_": "uninitialized",
}


@dataclass(frozen=True)
class Case:
    """One OpInfo entry in one dtype and one direction: the unit of the known-failure table."""

    op_name: str
    variant: str
    dtype: str
    direction: str = "forward"

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.op_name, self.variant, self.dtype, self.direction)

    @property
    def full_name(self) -> str:
        return full_name(self.op_name, self.variant)

    def __str__(self) -> str:
        return f"{self.full_name}[{self.dtype},{self.direction}]"


@dataclass
class SampleResult:
    """The outcome of one sample; `kernels`/`externs` are None when kiln reports no counts."""

    index: int
    outcome: str
    message: str = ""
    check: str = "values"  # "values", or "shape" for SHAPE_ONLY_OPS
    kernels: int | None = None
    externs: int | None = None
    seconds: float = 0.0

    @property
    def lowering(self) -> str:
        """How kiln ran a passing sample: kernels, externs, mixed, no compute, or unknown."""
        if self.kernels is None or self.externs is None:
            return "unknown"
        if self.kernels and self.externs:
            return "mixed"
        if self.kernels:
            return "kernels"
        return "externs" if self.externs else "no compute"

    def to_json(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- op database


def full_name(op_name: str, variant: str) -> str:
    return f"{op_name}.{variant}" if variant else op_name


def op_database() -> list:
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def find_opinfos(names: Iterable[str] | None = None) -> list:
    """OpInfos by name: `max` selects every variant, `max.binary` one (None: all of them)."""
    ops = op_database()
    if names is None:
        return list(ops)
    wanted = set(names)
    found = [op for op in ops if op.name in wanted or full_name(op.name, op.variant_test_name) in wanted]
    known = {op.name for op in found} | {full_name(op.name, op.variant_test_name) for op in found}
    missing = sorted(wanted - known)
    if missing:
        raise KeyError(f"no OpInfo named {missing} (names look like 'add' or 'max.binary')")
    return found


def find_opinfo(op_name: str, variant: str):
    for op in op_database():
        if op.name == op_name and op.variant_test_name == variant:
            return op
    raise KeyError(f"no OpInfo {full_name(op_name, variant)!r}")


def cases_for(op, dtypes: Iterable[str], directions: Iterable[str] = ("forward",)) -> list[Case]:
    """The cases of `op` among `dtypes` that the op supports on CPU.

    A backward case needs an op that `supports_autograd` and a dtype of GRAD_DTYPES
    that the op's backward supports on CPU.
    """
    supported = op.supported_dtypes("cpu")
    cases = []
    for dtype in dtypes:
        for direction in directions:
            if direction == "backward":
                if not op.supports_autograd or dtype not in GRAD_DTYPES \
                        or DTYPES[dtype] not in op.supported_backward_dtypes("cpu"):
                    continue
            elif DTYPES[dtype] not in supported:
                continue
            cases.append(Case(op.name, op.variant_test_name, dtype, direction))
    return cases


def shape_only_reason(op) -> str | None:
    """Why `op`'s values cannot be compared (random, uninitialized), or None."""
    reason = SHAPE_ONLY_OPS.get(op.name) or SHAPE_ONLY_OPS.get(full_name(op.name, op.variant_test_name))
    if reason:
        return reason
    if getattr(op, "has_nondeterministic_output", False) or getattr(op, "skip_correctness_check_compile_vs_eager", False):  # flags newer torch has
        return "nondeterministic (OpInfo flag)"
    return None


def generate_samples(op, case: Case, max_samples: int | None = None) -> list[tuple[int, object]]:
    """(index, sample) pairs of `case`, the same ones on every call (seeded).

    With `max_samples`, that many samples spread evenly over OpInfo's list (its first
    samples are often the degenerate ones: 0-d, empty), keeping their original indices.
    """
    torch.manual_seed(SEED)
    samples = list(op.sample_inputs("cpu", DTYPES[case.dtype], requires_grad=case.direction == "backward"))
    if max_samples is None or len(samples) <= max_samples:
        return list(enumerate(samples))
    if max_samples == 1:
        return [(0, samples[0])]
    step = (len(samples) - 1) / (max_samples - 1)
    picked = sorted({round(position * step) for position in range(max_samples)})
    return [(index, samples[index]) for index in picked]


# --------------------------------------------------------------------------- graph building


# Constants FX prints as valid Python; any other constant makes the harness call the op
# through a closure instead (the graph then shows the closure, not the constant).
_PRINTABLE_CONSTANTS = (int, float, bool, complex, str, type(None), slice, type(Ellipsis),
                        torch.dtype, torch.device, torch.memory_format, torch.layout, torch.Size)


@dataclass
class SampleGraph:
    """A sample as a graph: `gm(*tensors)` returns the tensor leaves of `op(sample)`."""

    gm: torch.fx.GraphModule
    tensors: list            # the distinct tensors of the sample, in placeholder order


def build_graph(op, sample, eager_result) -> SampleGraph:
    """The FX graph of `op.op(sample.input, *sample.args, **sample.kwargs)`.

    `eager_result` (from running the op once) tells where the tensors of the result sit,
    so that the output node can return them as a flat tuple.
    """
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    tensors, slot_of_leaf, slot_by_id = [], [], {}
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if id(leaf) not in slot_by_id:  # the same tensor twice is one input, as Dynamo does
                slot_by_id[id(leaf)] = len(tensors)
                tensors.append(leaf)
            slot_of_leaf.append(slot_by_id[id(leaf)])
        else:
            slot_of_leaf.append(None)

    graph = torch.fx.Graph()
    placeholders = [graph.placeholder(f"arg{slot}") for slot in range(len(tensors))]
    constants = [leaf for leaf, slot in zip(leaves, slot_of_leaf) if slot is None]
    if all(isinstance(value, _PRINTABLE_CONSTANTS) for value in constants):
        filled = [leaf if slot is None else placeholders[slot] for leaf, slot in zip(leaves, slot_of_leaf)]
        op_input, args, kwargs = pytree.tree_unflatten(filled, spec)
        result = graph.call_function(_graph_target(op), (op_input, *args), kwargs)
    else:
        def call_with_constants(*values):
            filled = [leaf if slot is None else values[slot] for leaf, slot in zip(leaves, slot_of_leaf)]
            op_input, args, kwargs = pytree.tree_unflatten(filled, spec)
            return op.op(op_input, *args, **kwargs)

        call_with_constants.__name__ = call_with_constants.__qualname__ = _python_name(op.name)
        result = graph.call_function(call_with_constants, tuple(placeholders))
    outputs = []
    for path, leaf in pytree.tree_flatten_with_path(eager_result)[0]:
        if isinstance(leaf, torch.Tensor):
            node = result
            for key in path:
                node = _follow_key(graph, node, key)
            outputs.append(node)
    graph.output(tuple(outputs))
    return SampleGraph(torch.fx.GraphModule(torch.nn.Module(), graph), tensors)


def _graph_target(op) -> Callable:
    """`op.op`, or a named wrapper when FX would print a name that does not lead back to it.

    FX prints a function that comes from torch by its qualified name, so the generated
    code (and kiln's runnable debug dumps) must be able to import it; OpInfo's lambdas
    print as `torch.testing._internal.common_methods_invocations.op`, which does not exist.
    """
    target = op.op
    try:
        from torch.fx.node import _get_qualified_name

        parts = _get_qualified_name(target).split(".")
        value = importlib.import_module(parts[0])
        for part in parts[1:]:
            value = getattr(value, part)
        if value is target:
            return target
    except Exception:
        pass

    def call_op(*args, **kwargs):
        return target(*args, **kwargs)

    call_op.__name__ = call_op.__qualname__ = "opinfo_" + _python_name(op.name)
    return call_op


def _follow_key(graph: torch.fx.Graph, node, key):
    if isinstance(key, pytree.SequenceKey):
        return graph.call_function(operator.getitem, (node, key.idx))
    if isinstance(key, pytree.MappingKey):
        return graph.call_function(operator.getitem, (node, key.key))
    if isinstance(key, pytree.GetAttrKey):
        return graph.call_function(getattr, (node, key.name))
    raise TypeError(f"cannot follow pytree key {key!r} in an FX graph")


def _python_name(name: str) -> str:
    return "".join(char if char.isalnum() else "_" for char in name)


def tensor_leaves(value) -> list:
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def copy_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides and storage offset (kiln may specialize on them)."""
    if tensor.layout != torch.strided:
        return tensor.clone()
    copy = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    copy.set_(tensor.untyped_storage().clone(), tensor.storage_offset(), tensor.size(), tensor.stride())
    return copy


# --------------------------------------------------------------------------- running


class SampleTimeout(BaseException):
    """Raised by `time_limit`; a BaseException so that `except Exception` in kiln lets it through."""


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise SampleTimeout in the main thread after `seconds` (None or 0: no limit).

    This catches hangs in Python code (the Triton interpreter is Python); a hang in C
    code is caught by the sweep's worker pool, which kills the worker.
    """
    if not seconds:
        yield
        return

    def on_alarm(signum, frame):
        raise SampleTimeout(f"ran past {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def graph_compiler(backend: str | Callable) -> Callable:
    """`compile_graph`-shaped callable for one rung of kiln's ladder (a callable passes through)."""
    if callable(backend):
        return backend
    if ":" in backend:  # "package.module:function", e.g. a test's deliberately broken backend
        module_name, attribute = backend.split(":")
        return getattr(importlib.import_module(module_name), attribute)
    import kiln.backend

    return kiln.backend.graph_compiler(backend)


def kernel_stats(compiled) -> dict | None:
    """{'kernels': n, 'externs': m} as kiln reports them on the compiled callable, or None.

    kiln's loaded graph (kiln/runtime/loader.py, CompiledGraph) carries `kernel_count` and
    `extern_count`; AOTAutograd's wrappers copy them onto the callable they return (they
    use functools.wraps), and they are looked for down the `__wrapped__` chain too.
    None when nothing reports counts (aot_eager, eager, a graph kiln ran eagerly).
    """
    for _ in range(8):
        if compiled is None:
            break
        kernels, externs = getattr(compiled, "kernel_count", None), getattr(compiled, "extern_count", None)
        if kernels is not None and externs is not None:
            return {"kernels": int(kernels), "externs": int(externs)}
        compiled = getattr(compiled, "__wrapped__", None)
    return None


def run_sample(op, sample, case: Case, index: int, *, backend: str | Callable = "kiln",
               timeout: float | None = 60.0) -> SampleResult:
    """Compile and run one sample on `backend`, compare with eager, and classify it."""
    if case.direction not in DIRECTIONS:
        raise ValueError(f"direction {case.direction!r}: choose from {DIRECTIONS}")
    run = _run_forward if case.direction == "forward" else _run_backward
    started = time.perf_counter()
    try:
        with time_limit(timeout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = run(op, sample, index, backend)
    except SampleTimeout as timeout_error:
        result = SampleResult(index, Outcome.TIMEOUT, str(timeout_error))
    except Exception as error:  # a bug of this harness (or of kiln.testing) must not end the sweep
        result = SampleResult(index, Outcome.HARNESS_ERROR, _describe(error))
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def _run_forward(op, sample, index: int, backend) -> SampleResult:
    import kiln
    from kiln.testing import compare, to_float64

    shape_only = shape_only_reason(op)
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    distinct = list({id(leaf): leaf for leaf in leaves if isinstance(leaf, torch.Tensor)}.values())

    # Eager first: it decides whether the sample is worth compiling at all.
    eager_inputs = [copy_tensor(tensor) for tensor in distinct]
    try:
        torch.manual_seed(SEED)
        eager_result = _call_on(op, sample, distinct, eager_inputs)
    except Exception as error:
        return SampleResult(index, Outcome.EAGER_ERROR, _describe(error))
    eager_outputs = tensor_leaves(eager_result)
    if not eager_outputs:
        return SampleResult(index, Outcome.NO_TENSOR_OUTPUT, f"returns {type(eager_result).__name__}")
    # A sample may be random where its op is not (dropout_p > 0 in attention): eager
    # under another seed tells.
    shape_only = shape_only or _random_in_eager(op, sample, distinct, eager_outputs)
    check = "shape" if shape_only else "values"

    try:
        sample_graph = build_graph(op, sample, eager_result)
    except Exception as error:
        return SampleResult(index, Outcome.HARNESS_ERROR, "build_graph: " + _describe(error), check)

    compiler = graph_compiler(backend)
    try:
        with kiln.config.patch(strict=True):
            compiled = compiler(sample_graph.gm, [copy_tensor(tensor) for tensor in sample_graph.tensors])
    except Exception as error:
        return SampleResult(index, *_compile_failure(error, sample_graph), check)
    stats = kernel_stats(compiled) or {}

    compiled_inputs = [copy_tensor(tensor) for tensor in sample_graph.tensors]
    try:
        torch.manual_seed(SEED)
        with kiln.config.patch(strict=True):
            actual_outputs = list(compiled(*compiled_inputs))
    except Exception as error:
        return SampleResult(index, Outcome.RUNTIME_ERROR, _describe(error), check, **stats)

    # Compare outputs and inputs (an op may mutate its inputs), in the graph's input order.
    eager_by_id = {id(tensor): copy for tensor, copy in zip(distinct, eager_inputs)}
    eager_inputs_in_graph_order = [eager_by_id[id(tensor)] for tensor in sample_graph.tensors]
    actual = [_plain(tensor) for tensor in actual_outputs + compiled_inputs]
    eager = [_plain(tensor) for tensor in eager_outputs + eager_inputs_in_graph_order]
    if [tensor.layout for tensor in actual_outputs] != [tensor.layout for tensor in eager_outputs]:
        return SampleResult(index, Outcome.MISMATCH, "output layouts differ from eager's", check, **stats)
    if shape_only:
        verdict_ok, message = compare_metadata(actual, eager)
    else:
        reference = _float64_reference(op, sample, sample_graph.tensors, to_float64, len(eager))
        verdict = compare(actual, eager, reference)
        verdict_ok, message = verdict.ok, verdict.message
    outcome = Outcome.PASS if verdict_ok else Outcome.MISMATCH
    return SampleResult(index, outcome, "" if verdict_ok else message, check, **stats)


def _run_backward(op, sample, index: int, backend) -> SampleResult:
    """Gradients of `op` through kiln against eager's, for the sample's inputs that require grad.

    The forward graph is the one `_run_forward` compiles; its inputs require grad, so the backend
    traces AOTAutograd's joint graph and compiles a forward and a backward graph. Every output that
    requires grad gets a fixed random cotangent (never zeros), the same in eager, kiln and the
    float64 reference, and `torch.autograd.grad` gives the gradients compared. The forward outputs
    are compared too. Both compiles and the backward run under strict mode, so a graph kiln could
    not compile raises instead of running eagerly; `kernels`/`externs` add up both graphs.
    """
    import kiln
    from kiln.testing import compare, to_float64

    shape_only = shape_only_reason(op)
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    distinct = list({id(leaf): leaf for leaf in leaves if isinstance(leaf, torch.Tensor)}.values())
    wanted = [position for position, tensor in enumerate(distinct) if tensor.requires_grad]
    if not wanted:
        return SampleResult(index, Outcome.NO_GRADIENT, "no input requires grad")

    eager_inputs = [_leaf_copy(tensor) for tensor in distinct]
    try:
        torch.manual_seed(SEED)
        eager_result = _call_on(op, sample, distinct, eager_inputs)
    except Exception as error:
        return SampleResult(index, Outcome.EAGER_ERROR, _describe(error))
    eager_outputs = tensor_leaves(eager_result)
    if not eager_outputs:
        return SampleResult(index, Outcome.NO_TENSOR_OUTPUT, f"returns {type(eager_result).__name__}")
    differentiable = [position for position, output in enumerate(eager_outputs) if output.requires_grad]
    if not differentiable:
        return SampleResult(index, Outcome.NO_GRADIENT, "no output requires grad")
    cotangents = _cotangents([eager_outputs[position] for position in differentiable])
    try:
        eager_grads = _gradients([eager_outputs[position] for position in differentiable],
                                 [eager_inputs[position] for position in wanted], cotangents)
    except Exception as error:
        return SampleResult(index, Outcome.EAGER_ERROR, "backward: " + _describe(error))
    if not any(grad.numel() for grad in eager_grads):
        return SampleResult(index, Outcome.NO_GRADIENT, "every gradient is empty")
    shape_only = shape_only or _random_in_eager(op, sample, distinct, eager_outputs)
    check = "shape" if shape_only else "values"

    try:
        sample_graph = build_graph(op, sample, eager_result)
    except Exception as error:
        return SampleResult(index, Outcome.HARNESS_ERROR, "build_graph: " + _describe(error), check)
    position_of = {id(tensor): position for position, tensor in enumerate(distinct)}
    graph_positions = [position_of[id(tensor)] for tensor in sample_graph.tensors]

    compiler = graph_compiler(backend)
    compiled_graphs: list = []
    with _recording_aten_compiles(compiled_graphs):
        try:
            with kiln.config.patch(strict=True):
                compiled = compiler(sample_graph.gm, [_leaf_copy(tensor) for tensor in sample_graph.tensors])
        except Exception as error:
            return SampleResult(index, *_compile_failure(error, sample_graph), check)

        compiled_inputs = [_leaf_copy(tensor) for tensor in sample_graph.tensors]
        compiled_by_position = dict(zip(graph_positions, compiled_inputs))
        try:
            torch.manual_seed(SEED)
            with kiln.config.patch(strict=True):
                actual_outputs = list(compiled(*compiled_inputs))
        except Exception as error:
            return SampleResult(index, Outcome.RUNTIME_ERROR, _describe(error), check, **_stats(compiled_graphs))
        if len(actual_outputs) != len(eager_outputs):
            return SampleResult(index, Outcome.MISMATCH, f"{len(actual_outputs)} outputs, eager has "
                                f"{len(eager_outputs)}", check, **_stats(compiled_graphs))
        detached = [position for position in differentiable if not actual_outputs[position].requires_grad]
        if detached:
            return SampleResult(index, Outcome.MISMATCH, f"outputs {detached} do not require grad (eager's do)",
                                check, **_stats(compiled_graphs))
        try:
            with kiln.config.patch(strict=True):
                actual_grads = _gradients([actual_outputs[position] for position in differentiable],
                                          [compiled_by_position[position] for position in wanted], cotangents)
        except Exception as error:
            return SampleResult(index, Outcome.RUNTIME_ERROR, "backward: " + _describe(error), check,
                                **_stats(compiled_graphs))
    stats = _stats(compiled_graphs)

    actual = [_plain(actual_outputs[position].detach()) for position in differentiable] + actual_grads
    eager = [_plain(eager_outputs[position].detach()) for position in differentiable] + eager_grads
    if shape_only:
        verdict_ok, message = compare_metadata(actual, eager)
    else:
        reference = _float64_gradients(op, sample, distinct, wanted, differentiable, cotangents, to_float64,
                                       len(eager))
        verdict = compare(actual, eager, reference)
        verdict_ok, message = verdict.ok, verdict.message
        if not verdict_ok and message.startswith("output "):  # name the part: forward output or gradient
            position = int(message.split()[1].rstrip(":"))
            part = (f"forward output {differentiable[position]}" if position < len(differentiable)
                    else f"gradient of input {wanted[position - len(differentiable)]}")
            message = part + ":" + message.split(":", 1)[1]
    outcome = Outcome.PASS if verdict_ok else Outcome.MISMATCH
    return SampleResult(index, outcome, "" if verdict_ok else message, check, **stats)


def _leaf_copy(tensor: torch.Tensor) -> torch.Tensor:
    """`copy_tensor` as a new autograd leaf that requires grad where `tensor` does."""
    copy = copy_tensor(tensor.detach())
    return copy.requires_grad_(True) if tensor.requires_grad else copy


def _cotangents(outputs: list) -> list:
    """A fixed random cotangent per output (standard normal, seeded: never zeros)."""
    generator = torch.Generator().manual_seed(SEED + 1)
    return [torch.randn(output.shape, dtype=output.dtype, generator=generator) for output in outputs]


def _gradients(outputs: list, inputs: list, cotangents: list) -> list:
    """d(sum of output * cotangent)/d(input) for each input; zeros where an input is unused (eager and
    AOTAutograd differ on None versus materialized zeros, which mean the same)."""
    grads = torch.autograd.grad(outputs, inputs, [cotangent.to(output.dtype) for output, cotangent
                                                  in zip(outputs, cotangents)], allow_unused=True)
    return [_plain(torch.zeros_like(tensor) if grad is None else grad.detach())
            for tensor, grad in zip(inputs, grads)]


def _float64_gradients(op, sample, distinct: list, wanted: list, differentiable: list, cotangents: list,
                       to_float64, expected_leaves: int):
    """Outputs and gradients of the op run in float64 (the comparison's reference), or None."""
    if torch.float64 not in op.supported_backward_dtypes("cpu"):
        return None
    inputs = [to_float64(copy_tensor(tensor.detach())) for tensor in distinct]
    inputs = [value.requires_grad_(True) if distinct[position].requires_grad else value
              for position, value in enumerate(inputs)]
    try:
        torch.manual_seed(SEED)
        outputs = tensor_leaves(_call_on(op, sample, distinct, inputs))
        outputs = [outputs[position] for position in differentiable]
        grads = _gradients(outputs, [inputs[position] for position in wanted],
                           [to_float64(cotangent) for cotangent in cotangents])
    except Exception:
        return None
    reference = [_plain(output.detach()) for output in outputs] + grads
    return reference if len(reference) == expected_leaves else None


@contextlib.contextmanager
def _recording_aten_compiles(compiled_graphs: list):
    """Collect what kiln's backend compiles for each ATen graph (forward and backward) meanwhile."""
    import kiln.backend

    original = kiln.backend.compile_aten_graph

    def recording(*args, **kwargs):
        compiled = original(*args, **kwargs)
        compiled_graphs.append(compiled)
        return compiled

    kiln.backend.compile_aten_graph = recording
    try:
        yield
    finally:
        kiln.backend.compile_aten_graph = original


def _stats(compiled_graphs: list) -> dict:
    """Kernels and externs over every ATen graph kiln compiled ({} when none reports counts)."""
    counts = [kernel_stats(compiled) for compiled in compiled_graphs]
    if not counts or any(count is None for count in counts):
        return {}
    return {"kernels": sum(count["kernels"] for count in counts), "externs": sum(count["externs"] for count in counts)}


def _random_in_eager(op, sample, distinct: list, eager_outputs: list) -> bool:
    """Does eager give other values under another seed? (Then only shapes can be compared.)

    OpInfo wraps some random ops (dropout, attention with dropout_p) in
    `wrapper_set_seed`, which calls `torch.manual_seed(42)` inside the op; that call is
    shifted too, so that such a sample shows up as random.
    """
    inputs = [copy_tensor(tensor) for tensor in distinct]
    real_manual_seed = torch.manual_seed
    try:
        torch.manual_seed = lambda seed: real_manual_seed(int(seed) + 1)
        torch.manual_seed(SEED)
        again = tensor_leaves(_call_on(op, sample, distinct, inputs))
    except Exception:
        return False
    finally:
        torch.manual_seed = real_manual_seed
    return len(again) != len(eager_outputs) or not all(map(_same_values, eager_outputs, again))


def _same_values(first: torch.Tensor, second: torch.Tensor) -> bool:
    first, second = _plain(first), _plain(second)
    if first.shape != second.shape or first.dtype != second.dtype:
        return False
    if first.is_floating_point() or first.is_complex():
        return bool(((first == second) | (first.isnan() & second.isnan())).all())
    return torch.equal(first, second)


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A strided tensor without a lazy conjugate or negative bit, which compare() can read.

    Sparse tensors compare as dense ones (their layouts are checked first).
    """
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    return tensor.resolve_conj().resolve_neg() if tensor.is_complex() else tensor


def _call_on(op, sample, originals: list, replacements: list):
    """Run `op` on `sample` with each tensor of `originals` swapped for its replacement."""
    by_id = {id(tensor): new for tensor, new in zip(originals, replacements)}
    op_input, args, kwargs = pytree.tree_map_only(
        torch.Tensor, lambda tensor: by_id[id(tensor)], (sample.input, sample.args, sample.kwargs))
    return op.op(op_input, *args, **kwargs)


def _float64_reference(op, sample, tensors: list, to_float64, expected_leaves: int):
    """Outputs and inputs of the op run in float64, or None when float64 cannot serve."""
    if torch.float64 not in op.supported_dtypes("cpu"):
        return None
    if not any(tensor.is_floating_point() for tensor in tensors):
        return None
    reference_inputs = [to_float64(copy_tensor(tensor)) for tensor in tensors]
    try:
        torch.manual_seed(SEED)
        reference = [_plain(leaf) for leaf in tensor_leaves(_call_on(op, sample, tensors, reference_inputs))]
        reference += reference_inputs
    except Exception:
        return None
    return reference if len(reference) == expected_leaves else None


def compare_metadata(actual: list, eager: list) -> tuple[bool, str]:
    """Shapes and dtypes only, for ops whose values are random or uninitialized."""
    if len(actual) != len(eager):
        return False, f"{len(actual)} outputs, eager has {len(eager)}"
    for position, (got, want) in enumerate(zip(actual, eager)):
        if not isinstance(got, torch.Tensor):
            return False, f"output {position}: got {type(got).__name__}, eager gave a tensor"
        if got.shape != want.shape or got.dtype != want.dtype:
            return False, (f"output {position}: {tuple(got.shape)} {got.dtype}, "
                           f"eager {tuple(want.shape)} {want.dtype}")
    return True, "ok"


def _compile_failure(error: BaseException, sample_graph: SampleGraph) -> tuple[str, str]:
    """(outcome, message) of a sample whose graph the backend could not compile.

    Tracing that needs a tensor's value is skipped as data-dependent only where Dynamo graph-breaks
    there too, so that no backend ever receives the graph (nonzero, masked_select, cov's
    aten.equal). Dynamo hands some such graphs to the backend whole, with the value as an unbacked
    SymInt (narrow with a tensor start, take, index_put with a bool mask): a backend must compile
    those, and failing to is a compile error.
    """
    if not _is_data_dependent(error):
        return Outcome.COMPILE_ERROR, _describe(error)
    if _dynamo_captures_whole(sample_graph):
        return Outcome.COMPILE_ERROR, ("Dynamo captures this graph whole (torch.compile(fullgraph=True)), "
                                       "a data-dependent value as an unbacked SymInt: " + _describe(error))
    return Outcome.DATA_DEPENDENT, _describe(error)


def _dynamo_captures_whole(sample_graph: SampleGraph) -> bool:
    """Whether torch.compile(fullgraph=True) traces `sample_graph` and hands it to a backend in one piece."""
    torch.compiler.reset()
    inputs = [_leaf_copy(tensor) for tensor in sample_graph.tensors]
    try:
        torch.compile(sample_graph.gm, backend="eager", fullgraph=True)(*inputs)
    except Exception:
        return False
    finally:
        torch.compiler.reset()
    return True


def _is_data_dependent(error: BaseException | None) -> bool:
    while error is not None:
        if type(error).__name__ in _DATA_DEPENDENT_ERRORS:
            return True
        error = error.__cause__
    return False


# Boilerplate torch appends to tracing errors; cut so that reasons stay short and stable.
_MESSAGE_NOISE = (r" Original traceback: None", r" Use tlparse to see full graph\. \(https?://\S+\)",
                  r" \(https?://github\.com/pytorch/tlparse\S*\)")


def _describe(error: BaseException, limit: int = 400) -> str:
    """`Type: message` on one line, the innermost kiln frame appended when there is one."""
    text = " ".join("".join(traceback.format_exception_only(type(error), error)).split())
    for noise in _MESSAGE_NOISE:
        text = re.sub(noise, "", text)
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if "/kiln/" in frame.filename]
    cause = error.__cause__
    while cause is not None:  # KilnCompileError wraps the real failure
        frames += [frame for frame in traceback.extract_tb(cause.__traceback__) if "/kiln/" in frame.filename]
        cause = cause.__cause__
    if frames:
        where = frames[-1]
        text += f" [at {where.filename.rsplit('/kiln/', 1)[-1]}:{where.lineno}]"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_case(case: Case, *, backend: str | Callable = "kiln", max_samples: int | None = None,
             timeout: float | None = 60.0, first_sample: int = 0,
             on_start: Callable[[int], None] | None = None) -> list[SampleResult]:
    """Every sample of `case` from `first_sample` on, in this process."""
    op = find_opinfo(case.op_name, case.variant)
    results = []
    for index, sample in generate_samples(op, case, max_samples):
        if index < first_sample:
            continue
        if on_start is not None:
            on_start(index)
        results.append(run_sample(op, sample, case, index, backend=backend, timeout=timeout))
    return results
