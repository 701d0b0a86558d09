"""The runner's float rounding rules (tests/fuzz/runner.py): what is `sensitive`, and what stays `wrong`.

Each rule gets the fuzz program it was made for (seed 3001, minimized), with kiln's
value stood in for by a value computed the way kiln computes it, so no kiln compile is
needed; and a deliberately wrong value beside it that must stay `wrong`.
"""
from __future__ import annotations

import pytest
import torch

from kiln.testing import compare, to_float64
from tests.fuzz.program import InputSpec, Program, Statement
from tests.fuzz.runner import Outcome, ProgramTrace, _float_rounding_reason, compare_outputs


def make_program(inputs, statements, outputs) -> Program:
    return Program(seed=0, index=0, inputs=tuple(inputs),
                   statements=tuple(Statement(target, expr) for target, expr in statements), outputs=tuple(outputs))


def eager_and_reference(program):
    make_inputs, function = program.load()
    return list(function(*make_inputs())), list(function(*to_float64(make_inputs())))


def classify(program, actual):
    expected, reference = eager_and_reference(program)
    return compare_outputs(actual, expected, reference, program)


# Seed 3001 #381: a sum of normalized O(1) terms that cancels to ~1e-8 (the rounding-noise rule).
CANCELLING = make_program([InputSpec("x0", (9,), "float32", seed=2)],
                          [("v0", "F.layer_norm(x0, (9,))"), ("v1", "torch.sum(v0.unsqueeze(1), dim=0)")], ["v1"])


def test_cancelling_sum_is_sensitive_within_its_rounding_noise():
    expected, reference = eager_and_reference(CANCELLING)
    kiln_like = (reference[0] + 2.4e-7).float()  # kiln's error on this program: 2.4e-7, eager's 6e-8
    assert not compare(kiln_like, expected[0], reference[0])  # the magnitude-relative floor is ~0 here
    outcome, message = classify(CANCELLING, [kiln_like])
    assert outcome == Outcome.SENSITIVE and "rounding noise" in message, message
    # The floor scales with the rounding of the terms (~1e-7), not without bound: an error of 1e-5 is wrong.
    assert classify(CANCELLING, [(reference[0] + 1e-5).float()])[0] == Outcome.WRONG


def test_large_values_normalized_away_do_not_loosen_the_floor():
    """exp of 3-sigma values reaches ~1e4; divided by their sum the output is O(0.1), and so is its noise."""
    program = make_program([InputSpec("x0", (3, 8), "float32", scale=3.0, seed=5)],
                           [("v0", "torch.exp(x0)"), ("v1", "v0 / v0.sum(-1, keepdim=True)")], ["v1"])
    expected, reference = eager_and_reference(program)
    noise = ProgramTrace.trace(program).rounding_noise(0)
    assert float(noise.max()) < 1e-6 < float(reference[0].abs().max()) * 1e-3
    assert classify(program, [expected[0] * (1 + 1e-3)])[0] == Outcome.WRONG


def test_off_by_a_row_result_of_a_normalized_chain_is_wrong():
    program = make_program([InputSpec("x0", (4, 9), "float32", seed=2)],
                           [("v0", "F.layer_norm(x0, (9,))"), ("v1", "v0[:, :4].sum(-1)")], ["v1"])
    expected, _ = eager_and_reference(program)
    assert classify(program, [expected[0].roll(1, 0)])[0] == Outcome.WRONG


# Seed 3001 #815 (NaN/inf on edges): eager's float32 erf rounds to exactly -1.0, so pow(x, -1.0) is
# finite there; kiln's erf (and float64's) is just above -1.0, and pow is NaN.
ERF_POW = make_program([InputSpec("x0", (1, 7, 4, 2), "float32", scale=3.0, seed=1360291828)],
                       [("v0", "torch.erf(x0)"), ("v1", "torch.pow(x0, v0)")], ["v1"])


def test_nan_positions_that_agree_with_float64_are_sensitive():
    expected, reference = eager_and_reference(ERF_POW)
    kiln_like = reference[0].float()  # NaN exactly where float64 has NaN
    assert int(kiln_like.isnan().sum()) > int(expected[0].isnan().sum())  # the program still shows the edge
    outcome, message = classify(ERF_POW, [kiln_like])
    assert outcome == Outcome.SENSITIVE, message  # the exact math's rule takes it first (its widened run has these NaNs)
    # The edge rule on its own, as for an output the widened run cannot judge:
    reason = _float_rounding_reason(kiln_like, expected[0], reference[0], lambda: ProgramTrace.trace(ERF_POW), 0)
    assert "kiln agrees with float64" in reason, reason


def test_nan_where_float64_has_none_is_wrong():
    expected, reference = eager_and_reference(ERF_POW)
    finite = torch.nonzero(torch.isfinite(reference[0]).flatten())[0].item()
    extra_nan = reference[0].float().flatten()
    extra_nan[finite] = float("nan")
    assert classify(ERF_POW, [extra_nan.view_as(expected[0])])[0] == Outcome.WRONG
    # NaN on the edge is excused, a wrong finite value beside it is not.
    off = reference[0].float().flatten()
    off[finite] *= 1.01
    assert classify(ERF_POW, [off.view_as(expected[0])])[0] == Outcome.WRONG


# Seed 3001 #1551: an rms norm in float16, cast back to float32. Eager rounds every float16
# op; kiln computes in float32 and rounds once. The rounding-noise rule covers it too: the
# float16 values are perturbed by float16 units.
def rms_norm_program(cast: str) -> Program:
    return make_program([InputSpec("x0", (1, 7), "float32", seed=0)],
                        [("v0", "x0" + cast), ("v1", "v0 * torch.rsqrt(v0.pow(2).mean(-1, keepdim=True) + 1e-6)"),
                         ("v2", "v1.to(torch.float32)")], ["v2"])


def test_float32_output_computed_through_float16_is_sensitive_within_float16_noise():
    program = rms_norm_program(".half()")
    expected, reference = eager_and_reference(program)
    x = program.load()[0]()[0].half().float()
    kiln_like = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).half().float()
    assert not compare(kiln_like, expected[0], reference[0])
    outcome, message = classify(program, [kiln_like])
    assert outcome == Outcome.SENSITIVE and "rounding noise" in message and "through float16" in message, message
    assert classify(program, [expected[0] * 1.05])[0] == Outcome.WRONG  # 50 float16 ulps is not rounding


def test_float16_side_term_loosens_the_floor_only_as_far_as_it_reaches_the_output():
    program = make_program([InputSpec("x0", (16,), "float32", seed=4)],
                           [("v0", "x0.half()"), ("v1", "x0 * 2 + v0.float() * 1e-3")], ["v1"])
    expected, _ = eager_and_reference(program)
    assert ProgramTrace.trace(program).lowest_precision(0) == torch.float16
    assert classify(program, [expected[0] * (1 + 1e-3)])[0] == Outcome.WRONG  # float16's tolerance would pass it


def test_relative_error_of_1e3_in_a_float32_chain_is_wrong():
    program = rms_norm_program("")
    expected, _ = eager_and_reference(program)
    assert classify(program, [expected[0] * (1 + 1e-3)])[0] == Outcome.WRONG


def test_lowest_precision_follows_in_place_writes_and_stops_at_bools():
    program = make_program(
        [InputSpec("x0", (3, 4), "float32", seed=1), InputSpec("x1", (3, 4), "float32", seed=2)],
        [("v0", "x0.half()"), ("v1", "x1.clone()"), ("v2", "v1[0]"), ("v3", "v2.add_(v0[0])"),
         ("v4", "v1 * 2"),                                   # reads v1 after the write through its view v2
         ("v5", "v0 > 0"), ("v6", "torch.where(v5, x1, x1 * 2)"),  # v0 reaches v6 only through a bool
         ("v7", "x1 + 1")],
        ["v4", "v6", "v7"])
    trace = ProgramTrace.trace(program)
    assert [trace.lowest_precision(position) for position in range(3)] == [torch.float16, torch.float32, torch.float32]


def test_rounding_noise_is_about_one_unit_per_rounding():
    program = make_program([InputSpec("x0", (64,), "float32", seed=3)], [("v0", "x0 * 3.0"), ("v1", "v0 + 1.0")],
                           ["v1"])
    noise = ProgramTrace.trace(program).rounding_noise(0)
    v0 = program.load()[0]()[0].double() * 3.0
    # per value (the input x0, whose unit reaches v0 times 3, then v0 and v1): a perturbation of up
    # to one unit, then rounding to float32 (half a unit more)
    bound = 1.5 * torch.finfo(torch.float32).eps * (2 * v0.abs() + (v0 + 1.0).abs())
    assert bool((noise <= bound * (1 + 1e-9)).all()) and float((noise / bound).max()) > 0.5


def test_noise_loosens_only_the_elements_it_moves():
    """An element on a discontinuity (noise 1) excuses its own difference, not a wrong neighbour's."""
    from tests.fuzz.runner import _within_rounding_noise

    reference = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    eager, noise, kept = reference.float(), torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64), torch.ones(3, dtype=torch.bool)
    flipped = torch.tensor([2.0, 2.0, 3.0])
    assert _within_rounding_noise(flipped, eager, reference, noise, kept)
    assert not _within_rounding_noise(torch.tensor([2.0, 2.01, 3.0]), eager, reference, noise, kept)


# Seed 202 #1149 (minimized, on the Triton backend): kiln's log_softmax is 1 ulp off eager's at one
# element; rms_norm over a dim of 1 is then -0.99999994 instead of -1.0, and `== x1` flips there.
EQUALITY_EDGE = make_program([InputSpec("x0", (1, 6, 1, 1), "float32", seed=1191409936),
                              InputSpec("x1", (4,), "int64", values="randint", low=-3, high=4, seed=966712827)],
                             [("v2", "F.log_softmax(x0, dim=1)"), ("v18", "F.rms_norm(v2, (1,))"),
                              ("v20", "v18 == x1")], ["v20"])


def test_a_bool_flipped_by_one_ulp_upstream_is_sensitive_and_a_far_one_wrong():
    expected, reference = eager_and_reference(EQUALITY_EDGE)
    noise = ProgramTrace.trace(EQUALITY_EDGE).rounding_noise(0)
    edge, far = (noise > 0), (noise == 0)
    assert edge.any() and far.any()
    on_edge = expected[0].clone()
    on_edge[tuple(edge.nonzero()[0].tolist())] ^= True
    outcome, message = classify(EQUALITY_EDGE, [on_edge])
    assert outcome == Outcome.SENSITIVE and "flips" in message, message
    off_edge = expected[0].clone()
    off_edge[tuple(far.nonzero()[0].tolist())] ^= True
    assert classify(EQUALITY_EDGE, [off_edge])[0] == Outcome.WRONG


# Seed 202 #1149 again: rms_norm over one element is 1 - 6e-9 in float64 and 1.0 or 0.99999994 in
# float32 as its input's last bit goes. Only a draw within half a unit of 1.0 crosses the edge; the
# fixed trials (u = 0, +-0.5) find it whatever the random ones draw.
ONE_ELEMENT_EDGE = make_program([InputSpec("x0", (64, 1), "float32", seed=1149, scale=3.0)],
                                [("v0", "F.rms_norm(x0, (1,))"), ("v1", "v0 == 1")], ["v1"])


def test_a_value_within_half_a_unit_of_an_edge_is_on_it_without_random_draws(monkeypatch):
    import tests.fuzz.runner as runner

    monkeypatch.setattr(runner, "NOISE_TRIALS", 0)
    noise = ProgramTrace.trace(ONE_ELEMENT_EDGE).rounding_noise(0)
    x = ONE_ELEMENT_EDGE.load()[0]()[0].double()
    exact = x / torch.sqrt(x * x + torch.finfo(torch.float32).eps)
    near = (1 - exact).abs() < 2 ** -25  # within half a float32 unit below 1.0: eager may give 1.0
    assert near.any() and bool((noise[near] > 0).all())
    assert bool((noise[exact < 0] == 0).all())  # -1, never == 1


def test_values_eager_gives_for_contiguous_inputs_are_sensitive_only_for_strided_inputs():
    """Eager's CPU gelu(+inf) is NaN on its vectorized (contiguous) path and inf on its scalar (strided)
    one (seed 3005 #1171); kiln's NaN is eager's own answer for the same values laid out contiguously."""
    from tests.fuzz.runner import _eager_layout_dependent

    def function(x):
        return (torch.nn.functional.gelu(x),)

    base = torch.tensor([float("inf")] * 48 + [1.0] * 48)
    strided, contiguous = base[::3], base[::3].contiguous()
    expected, contiguous_result = function(strided), function(contiguous)
    if torch.equal(expected[0].isnan(), contiguous_result[0].isnan()):
        pytest.skip("this torch's CPU gelu(+inf) is the same on both paths: nothing to tell apart")
    reference = function(strided.double())
    assert _eager_layout_dependent(function, [strided], list(contiguous_result), list(reference), None, "cpu")
    assert not _eager_layout_dependent(function, [contiguous], list(expected), list(reference), None, "cpu")
    wrong = [contiguous_result[0].clone()]
    wrong[0][-1] = 5.0  # a finite element off: not what eager gives on either layout
    assert not _eager_layout_dependent(function, [strided], wrong, list(reference), None, "cpu")


# Seed 3006 #139: signbit of pow's NaNs, whose sign eager's CPU kernel picks by code path.
NAN_SIGN = make_program([InputSpec("x0", (64,), "float32", seed=5), InputSpec("x1", (64,), "float32", seed=6)],
                        [("v0", "torch.pow(x0, x1)"), ("v1", "torch.signbit(v0)"),
                         ("v2", "torch.logical_or(v1, v1.flip(0))")], ["v2"])


def test_a_bool_decided_by_a_nans_sign_is_sensitive_and_any_other_flip_wrong():
    expected, _ = eager_and_reference(NAN_SIGN)
    make_inputs, _ = NAN_SIGN.load()
    x0, x1 = make_inputs()
    nan = torch.isnan(torch.pow(x0, x1))
    decided_by_nan = nan | nan.flip(0)
    assert decided_by_nan.any() and (~decided_by_nan).any()
    power = torch.pow(x0, x1)
    other_sign = torch.signbit(torch.where(nan, -power, power))  # a pow whose NaNs have the other sign
    flipped_nan_sign = [other_sign | other_sign.flip(0)]
    assert not torch.equal(flipped_nan_sign[0], expected[0])
    outcome, message = classify(NAN_SIGN, flipped_nan_sign)
    assert outcome == Outcome.SENSITIVE and "NaN's sign" in message, message
    off = expected[0].clone()
    off[(~decided_by_nan).nonzero()[0]] ^= True
    assert classify(NAN_SIGN, [off])[0] == Outcome.WRONG


# Seed 3006 #2564 (minimized): the float64 copies cannot run (a float64 input cast to fp16 beside fp16
# weights), so the reference widens every value as it is made.
CAST_BESIDE_WEIGHTS = make_program(
    [InputSpec("x2", (1,), "float16", seed=50303846), InputSpec("x3", (1,), "float16", seed=1600942266),
     InputSpec("x4", (1, 1, 1, 1), "float32", seed=1)],
    [("v5", "x4.half()"), ("v11", "F.layer_norm(v5, (1,))"), ("v15", "F.layer_norm(v5, (1,), x2, x3)")], ["v11"])


def test_a_program_float64_copies_cannot_run_gets_a_widened_reference():
    from tests.fuzz.runner import float64_reference

    make_inputs, function = CAST_BESIDE_WEIGHTS.load()
    with pytest.raises(RuntimeError):
        function(*to_float64(make_inputs()))
    reference = float64_reference(CAST_BESIDE_WEIGHTS)
    assert reference is not None and reference[0].dtype == torch.float64
    expected = list(function(*make_inputs()))
    exact = [torch.zeros_like(expected[0])]  # layer_norm over one element is 0; eager's CPU fp16 kernel is 1e-7 off
    assert compare_outputs(exact, expected, reference, CAST_BESIDE_WEIGHTS)[0] == Outcome.PASS
    assert compare_outputs([exact[0] + 0.5], expected, reference, CAST_BESIDE_WEIGHTS)[0] == Outcome.WRONG


# Seed 3005 #3042 (minimized): eager's fp16 prod of 128 values overflows and underflows in its float
# partials (0 * inf = NaN) where the exact product, 3.8e-265, is 0 in fp16.
OVERFLOWING_PROD = make_program(
    [InputSpec("x0", (1, 16, 4), "float32", scale=0.1, seed=1112318117),
     InputSpec("x1", (1, 16, 4), "float32", scale=3.0, seed=852960991)],
    [("v0", "torch.cat([x0, x1], dim=2)"), ("v4", "v0.pow(2).to(torch.float16)"),
     ("v6", "v4.expand(2, 16, -1).prod()")], ["v6"])


def test_eagers_nan_where_the_exact_math_is_finite_is_sensitive_only_for_the_exact_value():
    expected, reference = eager_and_reference(OVERFLOWING_PROD)
    if not torch.isnan(expected[0]):
        pytest.skip("this torch's fp16 prod does not overflow here")
    outcome, message = classify(OVERFLOWING_PROD, [torch.zeros_like(expected[0])])
    assert outcome == Outcome.SENSITIVE and "exact math" in message, message
    assert classify(OVERFLOWING_PROD, [torch.ones_like(expected[0])])[0] == Outcome.WRONG


# Seed 3113 #227 (minimized): eager's CPU fp16 layer_norm over one element is 2.3e-5 where the exact math is 0,
# so fmod(x, it) is finite in eager and NaN in the exact math (and in kiln, whose layer_norm gives 0).
FMOD_BY_ROUNDED_ZERO = make_program(
    [InputSpec("x0", (1,), "float32", scale=3.0, seed=414261744)],
    [("v2", "x0.half()"), ("v4", "F.layer_norm(v2, (1,))"), ("v6", "torch.fmod(v2, v4)")], ["v6"])


def test_a_nan_of_the_exact_math_where_eager_rounds_to_finite_is_sensitive_and_only_that():
    expected, _ = eager_and_reference(FMOD_BY_ROUNDED_ZERO)
    if not torch.isfinite(expected[0]).all():
        pytest.skip("this torch's fp16 layer_norm of one element is exactly 0")
    nan = torch.full_like(expected[0], float("nan"))
    outcome, message = classify(FMOD_BY_ROUNDED_ZERO, [nan])
    assert outcome == Outcome.SENSITIVE and "exact math" in message, message
    # An inf where the exact math has a NaN is not the exact math's value: still wrong.
    assert classify(FMOD_BY_ROUNDED_ZERO, [torch.full_like(expected[0], float("inf"))])[0] == Outcome.WRONG


# Seed 3115 #2923 (minimized): the sum of a normalized row is 0 in exact math and +-1e-7 by rounding, so its sqrt is
# NaN or not by the summation order: kiln's and eager's NaNs sit at different rows, and float64's at others again.
SQRT_OF_CANCELLED_SUM = make_program(
    [InputSpec("x0", (13, 3, 6), "float32", scale=3.0, seed=334352977)],
    [("v0", "(x0 - x0.mean(-1, keepdim=True)) / torch.sqrt(x0.var(-1, keepdim=True, correction=0) + 1e-5)"),
     ("v7", "torch.sum(v0, 2)"), ("v14", "torch.sqrt(v7)")], ["v14"])


def test_nan_where_rounding_noise_turns_an_element_nan_is_sensitive_and_a_wrong_value_beside_it_is_not():
    expected, reference = eager_and_reference(SQRT_OF_CANCELLED_SUM)
    make_inputs, _ = SQRT_OF_CANCELLED_SUM.load()
    (x0,) = make_inputs()
    v0 = (x0 - x0.mean(-1, keepdim=True)) / torch.sqrt(x0.var(-1, keepdim=True, correction=0) + 1e-5)
    kiln_like = torch.sqrt(v0.flip(-1).cumsum(-1)[..., -1])  # the same sum, added in another order
    assert not torch.equal(kiln_like.isnan(), expected[0].isnan())  # the program still shows the edge
    outcome, message = classify(SQRT_OF_CANCELLED_SUM, [kiln_like])
    assert outcome == Outcome.SENSITIVE and "turns it NaN/inf" in message, message
    wrong = kiln_like.clone()
    wrong[~kiln_like.isnan() & ~expected[0].isnan()] = 1.0  # finite where both are, but far from 1e-4
    assert classify(SQRT_OF_CANCELLED_SUM, [wrong])[0] == Outcome.WRONG


# Seed 3008 #733 (minimized): a mean of randn * 3 values cancels to -0.0019; its rounding is of the
# terms' size (the inputs' units), not of its own. (Downstream, remainder(x, mean) jumps by the mean
# where x / mean is near an integer: there the verdict depends on whether a noise run crosses the
# same jump, and the full program of #733 is `sensitive` by the trials' draws.)
CANCELLING_MEAN = make_program([InputSpec("x0", (7, 4, 7, 7), "float32", scale=3.0, seed=1918457001)],
                               [("v0", "x0.mean()")], ["v0"])


def test_a_cancelling_mean_of_inputs_carries_the_terms_rounding_and_a_far_value_is_wrong():
    noise = ProgramTrace.trace(CANCELLING_MEAN).rounding_noise(0)
    expected, reference = eager_and_reference(CANCELLING_MEAN)
    assert float(noise) > 10 * torch.finfo(torch.float32).eps * abs(float(reference[0]))  # not 1 ulp of the mean
    kilns_mean = torch.tensor(-0.0018997164443135262)  # the Triton interpreter's (eager's: -0.0018997316947)
    outcome, message = classify(CANCELLING_MEAN, [kilns_mean])
    assert outcome == Outcome.SENSITIVE and "rounding noise" in message, message
    assert classify(CANCELLING_MEAN, [kilns_mean * 1.0001])[0] == Outcome.WRONG  # 1e-4 off: not rounding


# Seed 3009 #7571 (minimized by hand): a permuted input cast to bf16 stays permuted, and eager's CPU gelu
# of it takes its scalar path, where gelu(+inf) is inf; kiln gives the vector path's NaN.
PERMUTED_GELU = make_program([InputSpec("x1", (7, 7, 11), "float32", nonfinite=0.3, layout="transposed",
                                        layout_arg=(0, 2), seed=7571)],
                             [("v3", "x1.permute(0, 2, 1)"), ("v8", "v3.to(torch.bfloat16)"), ("v9", "F.gelu(v8)")],
                             ["v9"])


def test_values_eager_gives_with_every_value_contiguous_are_sensitive():
    make_inputs, _ = PERMUTED_GELU.load()
    (x1,) = make_inputs()
    vector_path = [torch.nn.functional.gelu(x1.permute(0, 2, 1).to(torch.bfloat16).contiguous())]
    expected, _ = eager_and_reference(PERMUTED_GELU)
    if torch.equal(expected[0].isnan(), vector_path[0].isnan()):
        pytest.skip("this torch's CPU gelu(+inf) is the same on both paths: nothing to tell apart")
    from tests.fuzz.runner import _eager_layout_dependent

    _, function = PERMUTED_GELU.load()
    reference = list(function(*to_float64(make_inputs())))
    assert "every value made contiguous" in _eager_layout_dependent(function, make_inputs(), vector_path, reference,
                                                                   PERMUTED_GELU, "cpu")
    wrong = [vector_path[0].clone()]
    wrong[0][torch.isfinite(wrong[0])] += 1.0  # finite elements off: eager gives that on no layout
    assert not _eager_layout_dependent(function, make_inputs(), wrong, reference, PERMUTED_GELU, "cpu")


# Seed 3010 #9974 (minimized by hand): rms_norm of constant rows is 0.99999994 in eager, 1.0 one rounding
# up; doubled and truncated, 1 or 2. The float64 reference must use eager's eps (float32's, not float64's).
CONSTANT_ROWS_RMS = make_program([InputSpec("x0", (11, 1), "float32", scale=3.0, seed=1536249583)],
                                 [("v", "x0.expand(11, 7)"), ("v0", "F.rms_norm(v, (7,))"), ("v1", "(v0 + v0).long()")],
                                 ["v1"])


def test_rms_norm_reference_takes_eagers_eps_and_one_rounding_up_is_sensitive():
    from tests.fuzz.runner import float64_reference

    make_inputs, _ = CONSTANT_ROWS_RMS.load()
    (x0,) = make_inputs()
    one = make_program([InputSpec("x", (5, 1), "float32", scale=0.01, seed=9)], [("v", "F.rms_norm(x, (1,))")], ["v"])
    (x,) = one.load()[0]()
    want = x.double() / torch.sqrt(x.double() ** 2 + torch.finfo(torch.float32).eps)
    torch.testing.assert_close(float64_reference(one)[0], want, rtol=1e-12, atol=0)
    rounded_up = torch.nextafter(torch.nn.functional.rms_norm(x0.expand(11, 7), (7,)), torch.tensor(2.0))
    kiln_like = [(rounded_up + rounded_up).long()]
    expected, reference = eager_and_reference(CONSTANT_ROWS_RMS)
    assert not torch.equal(kiln_like[0], expected[0])
    outcome, message = classify(CONSTANT_ROWS_RMS, kiln_like)
    assert outcome == Outcome.SENSITIVE, message
    assert classify(CONSTANT_ROWS_RMS, [expected[0] + 2])[0] == Outcome.WRONG


# Seed 3014 #4385 (minimized): signbit of pow's NaNs, stacked with the input and averaged. The
# means that NaN signs decide differ; the others are 1 ulp off by summation order, which the
# NaN-sign rule must allow (kiln.testing's rule over the elements outside its mask).
NAN_SIGN_MEAN = make_program([InputSpec("x1", (2, 3, 6), "float32", seed=91043656)],
                             [("v0", "torch.pow(x1, -0.25)"), ("v5", "torch.signbit(v0)"),
                              ("v7", "torch.stack([x1, v5], 1)"), ("v9", "torch.cat([v7, v7], dim=2)"),
                              ("v19", "v9.mean(dim=(2, -1))")], ["v19"])


def test_a_mean_decided_by_nan_signs_is_sensitive_with_rounding_elsewhere():
    expected, reference = eager_and_reference(NAN_SIGN_MEAN)
    make_inputs, _ = NAN_SIGN_MEAN.load()
    (x1,) = make_inputs()
    power = torch.pow(x1, -0.25)
    negative_nans = torch.where(torch.isnan(power), -power.abs(), power)  # kiln's: every NaN's sign set
    stacked = torch.stack([x1, torch.signbit(negative_nans)], 1)
    kiln_like = torch.cat([stacked, stacked], dim=2).double().mean(dim=(2, -1)).float()  # another summation order
    decided = torch.signbit(negative_nans) != torch.signbit(power)
    assert decided.any() and not torch.equal(kiln_like, expected[0])
    outcome, message = classify(NAN_SIGN_MEAN, [kiln_like])
    assert outcome == Outcome.SENSITIVE and "NaN's sign" in message, message
    off = kiln_like.clone()
    off[0, 0] += 0.5  # an element no NaN decides, far off
    assert classify(NAN_SIGN_MEAN, [off])[0] == Outcome.WRONG


# Seed 3016 #2211 (minimized): pow's NaNs, then a reshape of them (a view) and an in-place div_ of
# that. Flipping the NaNs of every statement flipped the same storage three times, so the NaN-sign
# mask missed them; only a statement that makes a new tensor is flipped.
NAN_SIGN_THROUGH_VIEWS = make_program(
    [InputSpec("x1", (6, 13, 3, 13), "float32", scale=1.0, nonfinite=0.0, seed=1776339129)],
    [("v0", "torch.pow(x1, -0.25)"), ("v1", "v0.reshape(6, 13, 3, 1, 13)"), ("v3", "v1.div_(2.0)"),
     ("v9", "torch.round(v1)"), ("v18", "torch.signbit(v9)")], ["v18"])


def test_nan_signs_through_a_view_and_an_in_place_write_are_sensitive():
    expected, _ = eager_and_reference(NAN_SIGN_THROUGH_VIEWS)
    make_inputs, _ = NAN_SIGN_THROUGH_VIEWS.load()
    (x1,) = make_inputs()
    rounded = torch.round(torch.pow(x1, -0.25).reshape(6, 13, 3, 1, 13) / 2.0)
    every_nan_negative = torch.signbit(torch.where(torch.isnan(rounded), -rounded.abs(), rounded))
    assert not torch.equal(every_nan_negative, expected[0])
    outcome, message = classify(NAN_SIGN_THROUGH_VIEWS, [every_nan_negative])
    assert outcome == Outcome.SENSITIVE and "NaN's sign" in message, message
    off = every_nan_negative.clone()
    off[~torch.isnan(rounded)] ^= True  # every non-NaN element flipped: no NaN decides those
    assert classify(NAN_SIGN_THROUGH_VIEWS, [off])[0] == Outcome.WRONG


# Seed 9311 #573 (minimized): eager's CPU layer_norm of two equal bfloat16 values is -9.5e-07, not 0, so all()
# of it is True in eager, False in the exact math, and masked_fill_ rewrites the output in eager only.
DECISION = make_program([InputSpec("x0", (1, 1), "float32", seed=764972017),
                         InputSpec("x1", (2,), "int64", values="randint", low=-3, high=-2, seed=1913983955)],
                        [("v0", "x0[((x1 + 0) % 3)]"), ("v3", "v0.movedim(0, 1)"), ("v5", "v3.bfloat16()"),
                         ("v11", "F.layer_norm(v5, (2,))"), ("v12", "torch.all(v11, dim=(0, 1))"),
                         ("v14", "v5.masked_fill_(v12, 3.0)")], ["v5"])


def test_a_decision_eager_rounds_the_other_way_is_sensitive_where_kiln_is_the_exact_math():
    expected, _ = eager_and_reference(DECISION)
    make_inputs, _ = DECISION.load()
    kiln_like = make_inputs()[0].expand(1, 2).bfloat16()  # the exact math: layer_norm is 0, all() False, no fill
    assert torch.equal(expected[0], torch.full((1, 2), 3.0, dtype=torch.bfloat16))  # eager filled
    outcome, message = classify(DECISION, [kiln_like])
    assert outcome == Outcome.SENSITIVE and "v12" in message, message
    # A value that is neither eager's nor the exact math's stays wrong, decision or not.
    assert classify(DECISION, [kiln_like + 1])[0] == Outcome.WRONG
