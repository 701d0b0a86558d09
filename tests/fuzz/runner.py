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

A difference that rounding explains is `sensitive` (reported separately, never a pass),
by one rule per kind; everything else stays `wrong`:

- an int or bool output differs only where the float64 run says the element sits on a
  rounding edge (kiln agrees with float64, or eager does not): eager rounds each
  float16 op, kiln rounds once;
- a float output differs by at most a few subnormal steps (`_subnormal_difference_only`);
- NaN/inf on edges: NaN/inf positions differ from eager's only where the same edge rule
  holds for each element's class (finite, NaN, +inf, -inf), and the other elements pass
  (as they are, or by the next rule). Eager's float32 erf rounds to exactly -1.0 where
  kiln's and float64's stay above it, so pow(x, erf(x)) is finite only in eager;
- NaN signs: an output differs only at elements that change when every NaN the program
  makes has its sign flipped (`nan_sign_dependent`), and the others pass kiln.testing's rule. IEEE 754 leaves a NaN's sign
  unspecified, and eager's own varies by code path: its CPU pow(-2, 0.5) is +NaN on the
  vectorized path and -NaN on the scalar one (a strided input, a vector's tail), so
  signbit(pow(x, y)) has two eager answers for the same values (seed 3006 #139);
- eager's rounding on the far side of NaN/inf: a float output differs only where eager has a
  NaN or inf, the exact math (every value widened to float64, casts included) is finite, and
  kiln gives it, or where eager is finite, the exact math is NaN or inf, and kiln is too
  (`_nonfinite_only_where_kiln_is_exact`: eager's fp16 prod of 128 values, 0 * inf in its float
  partials, where the exact product is 0 in fp16; fmod by eager's 2.3e-5 fp16 layer_norm
  of one element, exactly 0);
- rounding noise: kiln.testing's max-error rule holds element by element with the
  element's rounding noise added to the floor (times ULP_FLOOR); the noise is how far
  the element moves when the float64 program runs with every value perturbed by one
  unit of its eager dtype (`ProgramTrace.rounding_noise`). It covers
  cancellation (a sum of O(1) terms that cancels to ~1e-8 carries O(1)-sized rounding,
  where kiln.testing's floor, relative to the output, is ~0) and chains through a lower
  precision (a float32 result of float16 ops, where the float64 run takes the same casts
  and so equals eager, moves by float16 units), each only as far as those values reach
  the output: values made small by a normalization carry small noise, however large
  they were before it, and a float16 side term scaled by 1e-3 adds 1e-3 of its noise.
  The message names the lowest float precision among the output's ancestors (traced by
  name, `ProgramTrace`) when it is below the output's.

The float rules trace the program only when an output fails kiln.testing's rule.
tests/fuzz/test_rounding_rules.py holds each rule's program and a wrong value beside it
that must stay `wrong`.

Every program ends in exactly one outcome; nothing here raises for a kiln failure.
"""
from __future__ import annotations

import logging
import re
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
    SENSITIVE = "sensitive"  # the difference is a rounding artifact, by a rule of the module doc
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
    reference = float64_reference(program, device)
    result.outcome, result.message = compare_outputs(actual, expected, reference, program, device)
    if result.outcome == Outcome.WRONG:
        layout_message = _eager_layout_dependent(function, make_inputs(device), actual, reference, program, device)
        if layout_message:
            result.outcome, result.message = Outcome.SENSITIVE, f"{result.message} ({layout_message})"
    if result.outcome == Outcome.PASS:
        result.stride_message = compare_strides(actual, expected)
        if result.stride_message:
            result.outcome = Outcome.STRIDE


def float64_reference(program, device: str = "cpu") -> list | None:
    """The program's outputs computed in float64, or None when it cannot run there.

    The program runs line by line on float64 copies of its inputs, with eager's dtype-dependent
    defaults (`_EagerDefaults`). Where that raises (a float32 made from a bool or int,
    `torch.sin(mask)`, then meets a float64 input in a matmul; an fp16 weight of layer_norm
    beside its input cast to fp16 again), it runs with every float value widened to float64 as
    it is made (`widened_reference`): the same math, with no rounding anywhere, casts included.
    """
    from kiln.testing import to_float64

    dtypes = eager_dtypes(program, device)
    if dtypes is None:  # eager raises: no reference (the caller reports that)
        return None
    make_inputs, _ = program.load()
    try:
        final = {name: value for name, value, _, _ in
                 _run_line_by_line(program, to_float64(make_inputs(device)), eager_dtypes=dtypes)}
        return [final[output] for output in program.outputs]
    except Exception:
        return widened_reference(program, device, dtypes)


def widened_reference(program, device: str = "cpu", dtypes: list | None = None) -> list | None:
    """The outputs with every float value widened to float64 as it is made (no rounding, casts included), or None."""
    from kiln.testing import to_float64

    make_inputs, _ = program.load()
    try:
        final = {name: value for name, value, _, _ in
                 _run_line_by_line(program, to_float64(make_inputs(device)), widen=True,
                                   eager_dtypes=dtypes or eager_dtypes(program, device))}
        return [final[output] for output in program.outputs]
    except Exception:  # an op with no float64 kernel: no reference
        return None


def eager_dtypes(program, device: str = "cpu") -> list | None:
    """Each input's and statement's dtype in an eager line-by-line run (None where not a tensor), or None if eager raises."""
    make_inputs, _ = program.load()
    try:
        return [getattr(value, "dtype", None) for _, value, _, _ in _run_line_by_line(program, make_inputs(device))]
    except Exception:
        return None


class _EagerDefaults:
    """torch.nn.functional for a float64 run of a program, with eager's dtype-dependent defaults.

    `node` is the statement being evaluated; `dtypes[node]` its dtype in the eager run. F.rms_norm
    with eps=None takes torch.finfo(input.dtype).eps, which a float64 copy changes from 1.2e-7 to
    2.2e-16: rms_norm over one element is then -0.9999999999999999 where eager's float32 math gives
    -0.99999994 or -1.0, a different function (seen reading seed 202 #1149; that program's
    verdict does not depend on it).
    """

    def __init__(self, dtypes: list):
        self.dtypes, self.node = dtypes, None

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    def rms_norm(self, input, normalized_shape, weight=None, eps=None):
        dtype = self.dtypes[self.node] if self.node is not None else None
        if eps is None and dtype is not None and dtype.is_floating_point:
            eps = torch.finfo(dtype).eps
        return torch.nn.functional.rms_norm(input, normalized_shape, weight, eps)


def _eager_layout_dependent(function, inputs: list, actual: list, reference, program, device: str) -> str:
    """Why kiln's outputs, wrong against eager's, are eager's own on contiguous copies of the inputs, or ''.

    Eager's CPU kernels take a vectorized path for contiguous data and a scalar one for strided
    data (and for a vector's tail), and a few ops differ between the two at special values:
    gelu(+inf) is NaN vectorized and inf scalar (seed 3005 #1171: a stepped input). kiln picks
    one answer per op; where it is the one eager gives for the same values laid out
    contiguously, the difference is eager's, and `sensitive`: on contiguous copies of the inputs,
    or, for a program without in-place writes, with every value made contiguous as it is made
    (`_eager_on_contiguous_values`: a permuted input cast to bf16 is permuted, and gelu takes the
    scalar path on it: seed 3009 #7571). Otherwise ''.
    """
    tensors = [value for value in inputs if isinstance(value, torch.Tensor)]
    if not all(tensor.is_contiguous() for tensor in tensors):
        try:
            contiguous = [value.contiguous() if isinstance(value, torch.Tensor) else value for value in inputs]
            expected = list(function(*contiguous))
        except Exception:
            expected = None
        if expected is not None and compare_outputs(actual, expected, reference, program, device)[0] in \
                (Outcome.PASS, Outcome.SENSITIVE):
            return "eager gives kiln's values on contiguous copies of the inputs: its result depends on their layout"
    expected = _eager_on_contiguous_values(program, device) if program is not None else None
    if expected is not None and compare_outputs(actual, expected, reference, program, device)[0] in \
            (Outcome.PASS, Outcome.SENSITIVE):
        return "eager gives kiln's values with every value made contiguous: its result depends on their layout"
    return ""


def _eager_on_contiguous_values(program, device: str) -> list | None:
    """The outputs of an eager line-by-line run in which every input and statement value is made
    contiguous before later statements read it (a permuted bf16 cast then gelu: seed 3009 #7571), or
    None for a program that writes in place (a contiguous copy would not see the write) or that fails."""
    make_inputs, _ = program.load()
    try:
        plain = list(_run_line_by_line(program, make_inputs(device)))
        if any(written for _, _, _, written in plain):
            return None
        final = {name: value for name, value, _, _ in
                 _run_line_by_line(program, [value.contiguous() for value in make_inputs(device)], contiguous=True)}
        return [final[output] for output in program.outputs]
    except Exception:
        return None


def fallback_reasons(report, compiled) -> list[str]:
    """Why parts of the program ran eagerly: failed graphs, and frames kiln's frontend did not capture."""
    reasons = [graph.fallback for graph in report.graphs if graph.fallback is not None]
    dispatcher = getattr(compiled, "_compiled_call", compiled)
    for entry in getattr(dispatcher, "entries", []) or []:
        if entry.eager_reason is not None:
            reasons.append("frame: " + entry.eager_reason)
    reasons += [warning for warning in report.warnings if "runs eagerly" in warning and "AOTAutograd" in warning]
    return [" ".join(reason.split())[:300] for reason in reasons]


def compare_outputs(actual: list, expected: list, reference: list | None, program=None,
                    device: str = "cpu") -> tuple[str, str]:
    """(outcome, message) for kiln's outputs against eager's, output by output.

    `program` (what produced them) lets the float rules trace it (`ProgramTrace`, only
    once an output needs them); without it only the int/bool and subnormal rules can
    call a difference `sensitive`.
    """
    from kiln.testing import compare

    if len(actual) != len(expected):
        return Outcome.WRONG, f"{len(actual)} outputs, eager has {len(expected)}"
    if reference is not None and len(reference) != len(expected):
        reference = None
    traced = []

    def trace() -> ProgramTrace | None:
        if not traced:
            traced.append(ProgramTrace.trace(program, device) if program is not None else None)
        return traced[0]

    nan_signs, widened = [], []

    def widened_output(position: int):
        if not widened:
            widened.append(widened_reference(program, device) if program is not None else None)
        outputs = widened[0]
        return outputs[position] if outputs is not None and position < len(outputs) else None

    def nan_sign_mask(position: int):
        if not nan_signs:
            nan_signs.append(nan_sign_dependent(program, device) if program is not None else None)
        masks = nan_signs[0]
        return masks[position] if masks is not None else None

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
        if _noise_flips_only(got, want, trace, position):
            sensitive = sensitive or f"output {position}: {message} (only where rounding each value by one unit flips it)"
            continue
        if _subnormal_difference_only(got, want):
            sensitive = sensitive or f"output {position}: {message} (by at most {SUBNORMAL_FLOOR} subnormal ulps)"
            continue
        if _differs_only_where(got, want, nan_sign_mask(position), ref):
            sensitive = sensitive or f"output {position}: {message} (only where a NaN's sign decides it)"
            continue
        if _nonfinite_only_where_kiln_is_exact(got, want, ref, widened_output(position)):
            sensitive = sensitive or (f"output {position}: {message} (NaN/inf differ from eager's only where "
                                      f"kiln gives the exact math's value and eager does not)")
            continue
        flipped = _exact_where_eager_decides_otherwise(got, widened_output(position), program, device)
        if flipped:
            sensitive = sensitive or (f"output {position}: {message} (eager's rounding turns a decision, {flipped}, "
                                      "the exact math decides kiln's way)")
            continue
        reason = _float_rounding_reason(got, want, ref, trace, position)
        if reason:
            sensitive = sensitive or f"output {position}: {message} ({reason})"
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
    return _differs_only_on_edges(got != want, got == ref, want != ref)


def _noise_flips_only(got, want, trace, position: int) -> bool:
    """Do int/bool outputs differ only at elements the rounding-noise runs flip?

    The float64 run alone decides an edge only where it lands on kiln's side or off
    eager's; a value one ulp from an edge (log_softmax's result 1 ulp off, then rms_norm
    over one element compared == -1: seed 202 #1149) sits on eager's side in float64
    too. The noise runs (`ProgramTrace.rounding_noise`) round every value by up to one
    unit: an element they change is on an edge; one they never change must equal eager's.
    """
    if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)) or want.is_floating_point():
        return False
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    traced = trace()
    noise = traced.rounding_noise(position) if traced is not None else None
    if noise is None or noise.shape != want.shape:
        return False
    differs = got.cpu() != want.cpu()
    return bool(differs.any()) and bool((noise[differs] > 0).all())


def _differs_only_where(got, want, mask, ref=None) -> bool:
    """Does `got` differ from `want` (NaN equal to NaN) only at elements where `mask` is set?

    With the float64 run `ref`, the elements outside the mask of a float output need only pass
    kiln.testing's rule among themselves: a mean over NaN-sign-decided and other elements
    rounds the others differently too (seed 3014 #4385: signbit of pow's NaNs, stacked and
    averaged, differs from eager's exactly where the mask says, and by 1 ulp elsewhere).
    """
    from kiln.testing import compare

    if mask is None or not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)):
        return False
    if got.shape != want.shape or got.dtype != want.dtype or mask.shape != want.shape:
        return False
    got, want, mask = got.detach().cpu(), want.detach().cpu(), mask.cpu()
    differs = _elements_differ(got, want)
    if not differs.any() or not mask.any():
        return False
    if bool(mask[differs].all()):
        return True
    if not isinstance(ref, torch.Tensor) or not want.is_floating_point() or ref.shape != want.shape:
        return False
    kept = ~mask
    return bool(compare(got[kept], want[kept], ref.detach().cpu()[kept]).ok)


def _nonfinite_only_where_kiln_is_exact(got, want, ref, exact) -> bool:
    """Does a float output differ from eager's only in where NaN and inf sit, each such element one where
    kiln agrees with the exact math and eager does not?

    Agreeing means: where eager has a NaN or inf and the exact math is finite, kiln's value is the exact one
    rounded to the output's dtype (within a few ulp); where eager is finite and the exact math is NaN or an
    inf, kiln's is the same NaN or inf. Eager's CPU prod of fp16 values accumulates in float partials that
    overflow to inf and underflow to 0 before they meet (0 * inf = NaN), where the exact product, 3.8e-265,
    is 0 in fp16 (seed 3005 #3042). Eager's CPU fp16 layer_norm over one element is 2.3e-5 where the exact
    math (and kiln) give 0, and fmod(x, that) is finite in eager only (seed 3113 #227). `exact` is
    `widened_reference`'s output: the plain float64 run repeats eager's own fp16 kernels after an explicit
    cast, so it cannot tell. The other elements must pass kiln.testing's rule against the float64 reference.
    """
    from kiln.testing import compare

    tensors = (got, want, exact)
    if not all(isinstance(tensor, torch.Tensor) for tensor in tensors) or not want.is_floating_point():
        return False
    if got.dtype != want.dtype or not (got.shape == want.shape == exact.shape):
        return False
    got, want, exact = (tensor.detach().cpu() for tensor in tensors)
    exact_rounded = exact.to(want.dtype).double()
    differs = _value_class(got) != _value_class(want)
    if not differs.any():
        return False
    overflowed = ~torch.isfinite(want) & torch.isfinite(got) & torch.isfinite(exact_rounded)
    finfo = torch.finfo(want.dtype)
    close = (got.double() - exact_rounded).abs() <= 4 * finfo.eps * exact_rounded.abs() + \
        4 * finfo.smallest_normal * finfo.eps
    rounded_away = torch.isfinite(want) & ~torch.isfinite(exact_rounded) & \
        (_value_class(got) == _value_class(exact_rounded))
    if not ((overflowed & close) | rounded_away)[differs].all():
        return False
    kept = ~differs
    if not kept.any():
        return True
    if isinstance(ref, torch.Tensor) and ref.shape == want.shape:
        return compare(got[kept], want[kept], ref.detach().cpu()[kept]).ok
    return compare(got[kept], want[kept]).ok


def _exact_where_eager_decides_otherwise(got, exact, program, device: str) -> str:
    """The bool or int statements eager's run decides the other way from the exact math, named, when kiln's
    output is the exact math's (the widened run rounded to the output's dtype, by kiln.testing's rule); else ''.

    Eager's CPU layer_norm of two equal bfloat16 values is -9.5e-07, not 0 (it computes x * rstd - mean * rstd
    with rstd ~ 1/sqrt(eps)), so all() of it is True in eager and False in the exact math and in kiln, and a
    masked_fill_ on it rewrites the output in eager only (seed 9311 #573). A kiln value off the exact math
    stays `wrong`, as does one where no decision differs."""
    from kiln.testing import compare

    if program is None or not isinstance(got, torch.Tensor) or not isinstance(exact, torch.Tensor):
        return ""
    if not got.is_floating_point() or got.shape != exact.shape:
        return ""
    exact = exact.detach().cpu()
    if not compare(got.detach().cpu(), exact.to(got.dtype), exact).ok:
        return ""
    return _flipped_decisions(program, device)


def _flipped_decisions(program, device: str) -> str:
    """The statements whose bool or int value eager's run and the widened (exact) run disagree on, or ''."""
    from kiln.testing import to_float64

    make_inputs, _ = program.load()
    try:
        flipped = []
        eager = _run_line_by_line(program, make_inputs(device))
        exact = _run_line_by_line(program, to_float64(make_inputs(device)), widen=True,
                                  eager_dtypes=eager_dtypes(program, device))
        for (name, value, _, _), (_, widened, _, _) in zip(eager, exact):
            if isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex() and \
                    isinstance(widened, torch.Tensor) and widened.shape == value.shape and \
                    not torch.equal(value.cpu(), widened.cpu().to(value.dtype)):
                flipped.append(name)
        return ", ".join(flipped)
    except Exception:  # a run that raises: no decision to compare
        return ""


def _elements_differ(a, b):
    """Elementwise a != b, with NaN equal to NaN of either sign."""
    differs = a != b
    if a.is_floating_point():
        differs &= ~(torch.isnan(a) & torch.isnan(b))
    return differs


def nan_sign_dependent(program, device: str = "cpu") -> list | None:
    """Per output, the elements that change when the NaNs one statement makes have their signs flipped, or None.

    The program runs eagerly line by line: as it is, and once per statement whose result
    holds NaNs, with that statement's NaNs negated in place (so -NaN becomes +NaN and back)
    before later statements read them. An element that differs from the plain run in any of
    those runs is decided by NaN signs alone. One statement at a time: flipping every
    statement's NaNs in one run flipped a propagated NaN back (pow, then round of it: seed
    3016 #2211), or twice through a view of the same storage.
    """
    make_inputs, _ = program.load()
    with_nans: list = []

    def note(node: int, value) -> None:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and bool(torch.isnan(value).any()):
            with_nans.append(node)

    def flip_at(target: int):
        def flip(node: int, value) -> None:
            if node == target:
                try:
                    value.copy_(torch.where(torch.isnan(value), -value, value))
                except RuntimeError:  # an expanded value cannot be written in place
                    pass
        return flip

    def outputs(perturb) -> list:
        final = {name: value for name, value, _, _ in _run_line_by_line(program, make_inputs(device), perturb)}
        return [final[output].detach().cpu() for output in program.outputs]

    try:
        plain = outputs(note)
        masks = [torch.zeros(value.shape, dtype=torch.bool) for value in plain]
        for node in with_nans:
            for position, (value, flipped) in enumerate(zip(plain, outputs(flip_at(node)))):
                if value.shape == flipped.shape and value.dtype == flipped.dtype:
                    masks[position] |= _elements_differ(value, flipped)
    except Exception:
        return None
    return masks


def _differs_only_on_edges(differs, kiln_agrees, eager_disagrees) -> bool:
    """The rounding-edge rule: every element where kiln differs from eager is one where
    kiln agrees with the float64 run, or eager does not (both sit on an edge float64 resolves)."""
    explained = kiln_agrees | eager_disagrees
    return bool(differs.any()) and bool(explained[differs].all())


def _float_rounding_reason(got, want, ref, trace, position: int) -> str:
    """Why float output `position`, failing kiln.testing's rule, is `sensitive` (the module doc's rules), or ''.

    NaN/inf on edges: positions that differ from eager's only on rounding edges (by
    `_differs_only_on_edges`, on each element's class: finite, NaN, +inf, -inf) are set
    aside, and the other elements must pass, as they are or by the next rule.
    Rounding noise: `_within_rounding_noise`, with the noise of what rounding every value
    of the program by one unit of its own dtype does to each element, where kiln.testing's
    floor, relative to the output's magnitude, is ~0 because it cancels. `trace()` gives
    the ProgramTrace, or None.
    """
    from kiln.testing import compare

    if not all(isinstance(tensor, torch.Tensor) for tensor in (got, want, ref)):
        return ""
    if not want.is_floating_point() or got.dtype != want.dtype or not (got.shape == want.shape == ref.shape):
        return ""
    got, want, ref = got.detach().cpu(), want.detach().cpu(), ref.detach().cpu()
    reasons, kept = [], torch.ones(got.shape, dtype=torch.bool)
    got_class, want_class, ref_class = _value_class(got), _value_class(want), _value_class(ref)
    differs = got_class != want_class
    if differs.any():
        explained = (got_class == ref_class) | (want_class != ref_class)
        where = "kiln agrees with float64 or eager does not"
        if not explained[differs].all():
            traced = trace()
            flips = traced.class_flips(position) if traced is not None else None
            if flips is None or flips.shape != got.shape or not (explained | flips)[differs].all():
                return ""
            where += ", or rounding each value by one unit turns it NaN/inf or back"
        kept = ~differs
        reasons.append(f"NaN/inf differ from eager's in {int(differs.sum())} places, each where {where}")
        if compare(got[kept], want[kept], ref[kept]).ok:
            return "; ".join(reasons)
    traced = trace()
    if traced is None:
        return ""
    noise = traced.rounding_noise(position)
    if noise is None or noise.shape != got.shape or not _within_rounding_noise(got, want, ref, noise, kept):
        return ""
    lowest = traced.lowest_precision(position)
    through = f"; it was computed through {str(lowest).removeprefix('torch.')}" \
        if torch.finfo(lowest).eps > torch.finfo(got.dtype).eps else ""
    return "; ".join(reasons + [f"within the floor of its rounding noise (up to {float(noise.max()):.3g}, "
                                f"the most that rounding each value by one unit moved it{through})"])


def _within_rounding_noise(got, want, ref, noise, kept) -> bool:
    """kiln.testing's max-error rule, element by element, with each element's noise added to the floor.

    At every kept element finite in all three: |kiln - ref| <= factor * |eager - ref| +
    ULP_FLOOR * (noise + eps * max |ref|). Per element, so one element on a discontinuity
    (large noise) loosens only itself.
    """
    from kiln.testing import ERROR_FACTOR, ULP_FLOOR

    dtype = got.dtype
    got, want, ref, noise = (tensor[kept].double() for tensor in (got, want, ref, noise))
    finite = torch.isfinite(got) & torch.isfinite(want) & torch.isfinite(ref)
    if not finite.any():
        return False
    got, want, ref, noise = got[finite], want[finite], ref[finite], noise[finite]
    allowed = ERROR_FACTOR.get(dtype, 2.0) * (want - ref).abs() \
        + ULP_FLOOR * (noise + torch.finfo(dtype).eps * float(ref.abs().max()))
    return bool(((got - ref).abs() <= allowed).all())


def _value_class(tensor):
    """0 finite, 1 NaN, 2 +inf, 3 -inf: where NaN and inf sit, as one integer tensor."""
    tensor = tensor.double()
    return (torch.isnan(tensor) * 1 + (tensor == float("inf")) * 2 + (tensor == float("-inf")) * 3)


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
    make_inputs, _ = program.load()
    return {name: (tuple(value.shape), value.dtype)
            for name, value, _, _ in _run_line_by_line(program, make_inputs(device))}


def _run_line_by_line(program, inputs, perturb=None, widen: bool = False, contiguous: bool = False,
                      eager_dtypes: list | None = None):
    """Yield (name, value, names it reads, earlier names it wrote in place) per input and statement.

    perturb(node, value), when given, may change each statement's value in place first
    (node: the value's position, inputs first); the rounding-noise runs use it. widen:
    each statement's float tensor of another dtype is replaced by a float64 copy. contiguous: each
    statement's tensor by a contiguous one. eager_dtypes (`eager_dtypes`): a float64 run's F gives
    eager's dtype-dependent defaults (`_EagerDefaults`).
    """
    import torch.nn.functional as F

    functional = _EagerDefaults(eager_dtypes) if eager_dtypes is not None else F
    namespace = {"torch": torch, "F": functional}
    seen = {}  # name -> a copy of its value when last looked at, to see in-place writes
    for spec, tensor in zip(program.inputs, inputs):
        namespace[spec.name] = tensor
        seen[spec.name] = tensor.detach().clone()
        yield spec.name, tensor, (), ()
    for node, statement in enumerate(program.statements, start=len(program.inputs)):
        if eager_dtypes is not None:
            functional.node = node
        value = eval(statement.expr, namespace)
        if widen and isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64:
            value = value.double()
        if contiguous and isinstance(value, torch.Tensor):
            value = value.contiguous()
        if perturb is not None:
            perturb(node, value)
        namespace[statement.target] = value
        reads = tuple(name for name in dict.fromkeys(_NAME.findall(statement.expr)) if name in seen)
        written = tuple(name for name in seen if not _same_values(namespace[name], seen[name]))
        for name in written:
            seen[name] = namespace[name].detach().clone()
        seen[statement.target] = value.detach().clone()
        yield statement.target, value, reads, written


_NAME = re.compile(r"[A-Za-z_]\w*")


def _same_values(tensor, before) -> bool:
    if tensor.shape != before.shape or tensor.dtype != before.dtype:
        return False
    same = tensor == before
    if tensor.is_floating_point():
        same |= torch.isnan(tensor) & torch.isnan(before)
    return bool(same.all())


NOISE_TRIALS = 4  # random rounding-noise runs, plus the fixed ones of NOISE_UNITS;
# the noise is the largest deviation any of them shows
NOISE_UNITS = (1.0, -1.0, 0.0, 0.5, -0.5)  # every value that many units up: a value near an edge crosses
# it in one of them whatever the random draws (0: rounded to its eager dtype only)


class ProgramTrace:
    """How a program computed its outputs, for the float rules: re-run with noise, and traced by name.

    Built from an eager and a float64 line-by-line run of the program (None from `trace`
    when the float64 run fails). A statement's parents are the values its expression
    names; a value written in place (`v8 = v1.mul_(v2)`, or through a view) counts the
    writing statement among its parents from then on.
    """

    def __init__(self, program, device: str, eager: list, float64: list, widen: bool = False):
        self.program, self.device, self.widen = program, device, widen
        self.dtypes = [value.dtype for _, value, _, _ in eager]
        self.parents, current = [], {}  # node -> parent nodes; name -> the nodes its value now holds
        for node, (name, _, reads, written) in enumerate(eager):
            self.parents.append(set().union(*(current[read] for read in reads)))
            for other in written:
                current[other] = current[other] | {node}
            current[name] = {node}
        self.output_nodes = [current[output] for output in program.outputs]
        final = {name: value for name, value, _, _ in float64}
        self.reference = [final[output].detach().clone() for output in program.outputs]
        self._noise = self._flips = None

    @classmethod
    def trace(cls, program, device: str = "cpu") -> "ProgramTrace | None":
        from kiln.testing import to_float64

        make_inputs, _ = program.load()
        try:
            eager = list(_run_line_by_line(program, make_inputs(device)))
        except Exception:
            return None
        for widen in (False, True):  # as float64_reference
            try:
                float64 = list(_run_line_by_line(program, to_float64(make_inputs(device)), widen=widen,
                                                 eager_dtypes=[value.dtype for _, value, _, _ in eager]))
            except Exception:
                continue
            return cls(program, device, eager, float64, widen)
        return None

    def lowest_precision(self, position: int) -> torch.dtype:
        """The float dtype of least precision among output `position`'s ancestors in the eager run (for messages).

        The walk goes through float values only: rounding reaches an int or bool only
        across an edge, which is `_rounding_edge_only`'s case, not a tolerance's.
        """
        reached, pending = set(), list(self.output_nodes[position])
        while pending:
            node = pending.pop()
            if node in reached or not self.dtypes[node].is_floating_point:
                continue
            reached.add(node)
            pending += self.parents[node]
        return max((self.dtypes[node] for node in reached), key=lambda dtype: torch.finfo(dtype).eps,
                   default=torch.float64)

    def rounding_noise(self, position: int) -> torch.Tensor | None:
        """How far output `position` moves when every value rounds by up to one unit, or None.

        The float64 program runs again NOISE_TRIALS times (and once more for each u of NOISE_UNITS
        everywhere, so a value one rounding below an edge crosses it for sure: rms_norm of a
        constant row is 0.99999994 in eager and 1.0 in kiln, then + itself and .long(): seed 3010
        #9974; and u = 0, +-0.5 for a value within half a unit of one: rms_norm over one element is
        1 - 6e-9 in float64, 1.0 or 0.99999994 in float32 as its input's last bit goes, and `== 1`
        flipped where no random draw had landed within that half unit: seed 202 #1149) with each
        float input and each
        statement's float result multiplied in place by 1 + eps * u (u uniform in [-1, 1], eps
        of the value's eager dtype) and rounded to that dtype, as eager stores it (so a value
        1e-16 from -1.0 in float64 is -1.0 or 1 ulp off in float32, and a comparison with -1
        can flip): a backward-stable op's rounding is such a perturbation of its operands
        (the inputs too: a sum of inputs that cancels, x0.mean() of randn * 3 values that is
        -0.0019, carries rounding of the terms' size, not of its own: seed 3008 #733),
        so the deviation is what rounding can do to the output here, cancellation included,
        and it shrinks wherever a normalization makes large values small again.
        """
        self._measure_once()
        return self._noise[position] if self._noise else None

    def class_flips(self, position: int) -> torch.Tensor | None:
        """Where a rounding-noise run (`rounding_noise`'s) turned output `position`'s element to another class
        (finite, NaN, +inf, -inf) than the float64 run's: an element on a NaN/inf edge (the sqrt of a sum of
        normalized values, 0 in exact math and +-1e-16 by rounding: seed 3115 #2923), or None."""
        self._measure_once()
        return self._flips[position] if self._flips else None

    def _measure_once(self) -> None:
        if self._noise is None:
            self._noise, self._flips = self._measure_noise()

    def _measure_noise(self) -> tuple[list, list]:
        from kiln.testing import to_float64

        make_inputs, _ = self.program.load()
        generator = torch.Generator().manual_seed(0)
        direction = [None]  # None: random units; a number: every value that many units up

        def perturb(node: int, value) -> None:
            if not value.is_floating_point() or not self.dtypes[node].is_floating_point:
                return
            if direction[0] is None:
                unit = torch.rand(value.shape, generator=generator, dtype=torch.float64) * 2 - 1
            else:
                unit = torch.full(value.shape, float(direction[0]), dtype=torch.float64)
            dtype = self.dtypes[node]
            try:
                value.mul_((1 + torch.finfo(dtype).eps * unit).to(value.device, value.dtype))
                value.copy_(value.to(dtype))  # and rounded to it, as eager stores it: -0.99999999 becomes -1.0
            except RuntimeError:  # an expanded value (one element at several places) cannot be written in place
                pass

        noise = [torch.zeros(reference.shape, dtype=torch.float64) for reference in self.reference]
        flips = [torch.zeros(reference.shape, dtype=torch.bool) for reference in self.reference]
        try:
            for direction[0] in [None] * NOISE_TRIALS + list(NOISE_UNITS):
                inputs = to_float64(make_inputs(self.device))
                for node, value in enumerate(inputs):  # a reduction's rounding: its operands perturbed
                    if isinstance(value, torch.Tensor):
                        perturb(node, value)
                final = {name: value for name, value, _, _ in
                         _run_line_by_line(self.program, inputs, perturb, widen=self.widen,
                                           eager_dtypes=self.dtypes)}
                for position, output in enumerate(self.program.outputs):
                    moved = (final[output].detach().cpu().double() - self.reference[position].cpu().double()).abs()
                    # A NaN or inf that noise creates excuses no error in size: count it as no noise (and as a
                    # class flip, which excuses that element's NaN/inf only).
                    noise[position] = torch.maximum(noise[position], moved.nan_to_num(0.0, 0.0, 0.0))
                    flips[position] |= _value_class(final[output].detach().cpu()) != \
                        _value_class(self.reference[position].cpu())
        except Exception:
            return [], []
        return noise, flips
