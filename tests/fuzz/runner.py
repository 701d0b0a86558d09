"""Run one fuzz program eagerly and through `kiln.compile`, and classify what happened.

The program runs three times on fresh copies of its inputs (built by its own
`make_inputs`, so strides and storage offsets are the same each time): eagerly, through
`kiln.compile` (strict=False: a graph kiln cannot compile runs eagerly, which counts as
correct but is recorded as a fallback with its reason), and eagerly on float64 copies
(the reference). The compiled result must:

- raise exactly when eager raises (an exception only kiln raises is a crash);
- match eager under kiln.testing's rule: shape, dtype, NaN/inf positions, integers and
  bools exactly, floats no farther from the float64 reference than eager's (dtype-aware);
- have eager's strides on every dim of size > 1 (reported as its own outcome, `stride`).

An integer or bool output that differs from eager only where the float64 reference says
the element sits on a rounding edge (kiln agrees with float64, or eager does not) is
`sensitive`, not wrong: eager rounds each float16 op, kiln rounds once.

Every program ends in exactly one outcome; nothing here raises for a kiln failure.
"""
from __future__ import annotations

import logging
import time
import warnings
from dataclasses import asdict, dataclass, field

import torch


class Outcome:
    """What happened to one program."""

    PASS = "pass"            # kiln's answer is eager's (possibly after a fallback: see `fallbacks`)
    WRONG = "wrong"          # a wrong answer (value, shape, dtype), or no error where eager raised
    CRASH = "crash"          # the compiled call raised where eager did not, or the worker died
    TIMEOUT = "timeout"      # past the per-program time limit
    STRIDE = "stride"        # right values, different output strides
    SENSITIVE = "sensitive"  # int/bool elements differ only on float rounding edges (see module doc)
    INVALID = "invalid"      # eager raised: a generator bug (programs are valid by construction)

    FAILURES = (WRONG, CRASH, TIMEOUT)
    ALL = (PASS, WRONG, CRASH, TIMEOUT, STRIDE, SENSITIVE, INVALID)


@dataclass
class ProgramResult:
    """The outcome of one program on one backend."""

    name: str
    seed: int
    index: int
    outcome: str
    message: str = ""
    fallbacks: list = field(default_factory=list)  # one reason per graph or frame that ran eagerly
    graphs: int = 0          # graphs kiln's backend received
    kernels: int = 0
    externs: int = 0
    stride_message: str = ""
    seconds: float = 0.0

    @property
    def compiled(self) -> bool:
        """kiln compiled every graph of the program (no fallback)."""
        return self.graphs > 0 and not self.fallbacks

    def to_json(self) -> dict:
        return asdict(self)


def run_program(program, *, backend: str = "cpp", device: str = "cpu", timeout: float | None = 60.0) -> ProgramResult:
    """Run `program` (tests/fuzz/program.py) through kiln on `backend` ('cpp' or 'triton') and classify it."""
    from tests.ops.harness import SampleTimeout, _describe, time_limit

    started = time.perf_counter()
    result = ProgramResult(program.name, program.seed, program.index, Outcome.PASS)
    try:
        with time_limit(timeout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _run(program, result, backend, device)
    except SampleTimeout as error:
        result.outcome, result.message = Outcome.TIMEOUT, str(error)
    except Exception as error:  # a bug of the fuzzer itself must show, not end the run
        result.outcome, result.message = Outcome.CRASH, "fuzzer error: " + _describe(error)
    finally:
        _reset_kiln()
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def _reset_kiln() -> None:
    import kiln

    kiln.reset()
    torch._dynamo.reset()


def _run(program, result: ProgramResult, backend: str, device: str) -> None:
    import kiln
    from kiln.debug.explain import ExplainReport, _recording
    from kiln.testing import to_float64
    from tests.ops.harness import _describe

    make_inputs, function = program.load()
    eager_error = compiled_error = None
    try:
        expected = list(function(*make_inputs(device)))
    except Exception as error:
        eager_error = error

    report = ExplainReport()
    logging.getLogger("kiln").setLevel(logging.WARNING)
    try:
        with kiln.config.patch(cpu_backend=backend, strict=False), _recording(report):
            compiled = kiln.compile(function)
            actual = list(compiled(*make_inputs(device)))
    except Exception as error:
        compiled_error = error
    result.graphs = len(report.graphs)
    result.kernels = sum(graph.kernels or 0 for graph in report.graphs)
    result.externs = sum(graph.externs or 0 for graph in report.graphs)
    result.fallbacks = fallback_reasons(report, compiled if compiled_error is None else None)

    if eager_error is not None:
        result.outcome = Outcome.INVALID
        result.message = "eager raised " + _describe(eager_error)
        if compiled_error is None:
            result.message += "; kiln did not raise"
        return
    if compiled_error is not None:
        result.outcome, result.message = Outcome.CRASH, _describe(compiled_error)
        return
    try:
        reference = list(function(*to_float64(make_inputs(device))))
    except Exception:  # an op without float64 (or mixing a float64 with a float32): no reference
        reference = None
    result.outcome, result.message = compare_outputs(actual, expected, reference)
    if result.outcome == Outcome.PASS:
        result.stride_message = compare_strides(actual, expected)
        if result.stride_message:
            result.outcome = Outcome.STRIDE


def fallback_reasons(report, compiled) -> list[str]:
    """Why parts of the program ran eagerly: failed graphs, and frames kiln's frontend did not capture."""
    reasons = [graph.fallback for graph in report.graphs if graph.fallback is not None]
    dispatcher = getattr(compiled, "_compiled_call", compiled)
    for entry in getattr(dispatcher, "entries", []) or []:
        if entry.eager_reason is not None:
            reasons.append("frame: " + entry.eager_reason)
    reasons += [warning for warning in report.warnings if "runs eagerly" in warning and "AOTAutograd" in warning]
    return [" ".join(reason.split())[:300] for reason in reasons]


def compare_outputs(actual: list, expected: list, reference: list | None) -> tuple[str, str]:
    """(outcome, message) for kiln's outputs against eager's, output by output."""
    from kiln.testing import compare

    if len(actual) != len(expected):
        return Outcome.WRONG, f"{len(actual)} outputs, eager has {len(expected)}"
    if reference is not None and len(reference) != len(expected):
        reference = None
    sensitive = ""
    for position, (got, want) in enumerate(zip(actual, expected)):
        ref = reference[position] if reference is not None else None
        verdict = compare(got, want, ref)
        if verdict.ok:
            continue
        message = verdict.message.removeprefix("output 0: ")  # compare() numbers the leaves of its argument
        if _rounding_edge_only(got, want, ref):
            sensitive = sensitive or f"output {position}: {message} (only where float64 disagrees with eager)"
            continue
        if _subnormal_difference_only(got, want):
            sensitive = sensitive or f"output {position}: {message} (by at most {SUBNORMAL_FLOOR} subnormal ulps)"
            continue
        suffix = "" if reference is not None else " (no float64 reference)"
        return Outcome.WRONG, f"output {position}: {message}{suffix}"
    return (Outcome.SENSITIVE, sensitive) if sensitive else (Outcome.PASS, "")


def _rounding_edge_only(got, want, ref) -> bool:
    """Do int/bool outputs differ only where the float64 run shows a rounding edge?"""
    if not all(isinstance(tensor, torch.Tensor) for tensor in (got, want, ref)):
        return False
    if want.is_floating_point() or got.shape != want.shape or got.dtype != want.dtype or ref.shape != want.shape:
        return False
    got, want, ref = got.cpu(), want.cpu(), ref.cpu().to(want.dtype)
    differs = got != want
    explained = (got == ref) | (want != ref)
    return bool(differs.any()) and bool(explained[differs].all())


SUBNORMAL_FLOOR = 4  # kiln.testing's floor is relative to the magnitude, so it is ~0 for results near 0


def _subnormal_difference_only(got, want) -> bool:
    """Do float outputs differ by no more than a few subnormal spacings (1 ulp of a tiny value)?

    A float16 product or sum that lands in the subnormal range (|x| < 6.1e-05) rounds in
    steps of 6e-08 whatever its magnitude; a reassociated reduction moves it by one step,
    which kiln.testing's magnitude-relative floor reads as a large relative error.
    """
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or not want.is_floating_point():
        return False
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    got64, want64 = got.detach().cpu().double(), want.detach().cpu().double()
    if not torch.equal(torch.isnan(got64), torch.isnan(want64)):
        return False
    finite = torch.isfinite(want64)
    if not torch.equal(got64[~finite].nan_to_num(), want64[~finite].nan_to_num()):
        return False
    finfo = torch.finfo(want.dtype)
    step = finfo.smallest_normal * finfo.eps  # the spacing of subnormals
    return bool(((got64 - want64)[finite].abs() <= SUBNORMAL_FLOOR * step).all())


def compare_strides(actual: list, expected: list) -> str:
    """'' when every output has eager's strides on its dims of size > 1, else what differs."""
    for position, (got, want) in enumerate(zip(actual, expected)):
        if not isinstance(want, torch.Tensor) or want.numel() == 0:
            continue
        significant = [dim for dim, size in enumerate(want.shape) if size > 1]
        if [got.stride(dim) for dim in significant] != [want.stride(dim) for dim in significant]:
            return f"output {position}: strides {tuple(got.stride())} != eager's {tuple(want.stride())} " \
                   f"(shape {tuple(want.shape)})"
    return ""


def trace_values(program, device: str = "cpu") -> dict:
    """{name: (shape, dtype)} of every input and statement, from running the program eagerly line by line.

    Raises what eager raises. The minimizer uses it to find same-typed replacements.
    """
    import torch.nn.functional as F

    make_inputs, _ = program.load()
    namespace = {"torch": torch, "F": F}
    found = {}
    for spec, tensor in zip(program.inputs, make_inputs(device)):
        namespace[spec.name] = tensor
        found[spec.name] = (tuple(tensor.shape), tensor.dtype)
    for statement in program.statements:
        value = eval(statement.expr, namespace)
        namespace[statement.target] = value
        found[statement.target] = (tuple(value.shape), value.dtype)
    return found
