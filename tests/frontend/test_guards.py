"""Guards that must see a change made between two calls: mutable containers changed in place
(compared with a snapshot, never with themselves), storage aliasing of tensor inputs when the
graph mutates one, and a function's replaced code, defaults and bindings."""
from __future__ import annotations

import types

import torch

import kiln
from kiln.backend import graph_compiler
from kiln.frontend import compile_function


def _compiled(fn, backend="aot_eager"):
    return compile_function(fn, graph_compiler(backend))


def _check(compiled, fn, make_args, entries):
    """`compiled` and `fn` agree on fresh arguments, and `compiled` has `entries` compiled entries."""
    with kiln.config.patch(strict=True):
        result = compiled(*make_args())
    torch.testing.assert_close(result, fn(*make_args()))
    assert len(compiled.entries) == entries
    assert all(entry.eager_reason is None and entry.graph_module is not None for entry in compiled.entries)


def _ones():
    return (torch.ones(3),)


# -- mutable containers: compared with a snapshot of what the trace read ----------------------------

FLAGS = {"scale"}
NESTED = [{"scale"}, 2]


def reads_global_set(x):
    return x * (2.0 if "scale" in FLAGS else 3.0) + (1.0 if "shift" in FLAGS else 0.0)


def reads_nested_set(x):
    return x * (2.0 if "scale" in NESTED[0] else 3.0)


def test_global_set_changed_in_place_recompiles():
    compiled = _compiled(reads_global_set)
    _check(compiled, reads_global_set, _ones, 1)
    FLAGS.add("shift")
    try:
        _check(compiled, reads_global_set, _ones, 2)
        FLAGS.discard("scale")
        _check(compiled, reads_global_set, _ones, 3)
    finally:
        FLAGS.clear()
        FLAGS.add("scale")
    _check(compiled, reads_global_set, _ones, 3)  # back to the first entry


def test_set_inside_a_list_changed_in_place_recompiles():
    compiled = _compiled(reads_nested_set)
    _check(compiled, reads_nested_set, _ones, 1)
    NESTED[0].discard("scale")
    try:
        _check(compiled, reads_nested_set, _ones, 2)
    finally:
        NESTED[0].add("scale")


def test_set_in_closure_cell_and_attribute_changed_in_place_recompiles():
    names = {"a"}

    class Config:
        pass

    config = Config()
    config.names = {"b"}

    def reads(x):
        return x * (2.0 if "a" in names else 3.0) + (1.0 if "b" in config.names else 0.0)

    compiled = _compiled(reads)
    _check(compiled, reads, _ones, 1)
    names.discard("a")
    _check(compiled, reads, _ones, 2)
    config.names.discard("b")
    _check(compiled, reads, _ones, 3)


# -- storage aliasing of tensor inputs ---------------------------------------------------------------

def mutates_first_reads_second(a, b):
    a.mul_(2)
    return b + 1


def _aliasing_cases():
    def distinct():
        return torch.ones(3), torch.ones(3)

    def view_of_first():
        base = torch.ones(3, 3)
        return base, base[0]

    def same_tensor():
        x = torch.ones(3)
        return x, x

    def overlapping_slices():
        buffer = torch.arange(4.0)
        return buffer[:3], buffer[1:]

    return distinct, view_of_first, same_tensor, overlapping_slices


def _check_mutation(compiled, make_args, entries):
    args, expected_args = make_args(), make_args()
    with kiln.config.patch(strict=True):
        result = compiled(*args)
    expected = mutates_first_reads_second(*expected_args)
    torch.testing.assert_close(result, expected)
    for arg, expected_arg in zip(args, expected_args):
        torch.testing.assert_close(arg, expected_arg)
    assert len(compiled.entries) == entries and all(entry.eager_reason is None for entry in compiled.entries)


def test_mutated_input_aliasing_changed_recompiles():
    """Traced unaliased then called aliased, and the reverse: each new sharing recompiles."""
    for backend in ("aot_eager", "kiln"):
        cases = _aliasing_cases()
        for first in cases:
            compiled = _compiled(mutates_first_reads_second, backend)
            _check_mutation(compiled, first, 1)
            for index, later in enumerate(case for case in cases if case is not first):
                _check_mutation(compiled, later, index + 2)
            _check_mutation(compiled, first, len(cases))  # each sharing keeps its entry


def mutates_two(a, b, c):
    a.add_(1)
    b.mul_(2)
    return a + b + c


def test_two_mutated_inputs_sharing_storage_recompile():
    def distinct():
        return torch.ones(3), torch.ones(3), torch.ones(3)

    def mutated_pair_shared():
        buffer = torch.arange(4.0)
        return buffer[:3], buffer[1:], torch.ones(3)

    def read_input_shares_with_second():
        buffer = torch.arange(4.0)
        return torch.ones(3), buffer[:3], buffer[1:]

    compiled = _compiled(mutates_two)
    for count, make in enumerate((distinct, mutated_pair_shared, read_input_shares_with_second, distinct), 1):
        args, expected_args = make(), make()
        with kiln.config.patch(strict=True):
            torch.testing.assert_close(compiled(*args), mutates_two(*expected_args))
        torch.testing.assert_close(args, expected_args)
        assert len(compiled.entries) == min(count, 3)


def test_storage_check_only_where_an_input_is_mutated():
    def pure(a, b):
        return a * 2 + b

    compiled = _compiled(pure)
    compiled(torch.ones(3), torch.ones(3))
    buffer = torch.arange(4.0)
    torch.testing.assert_close(compiled(buffer[:3], buffer[1:]), pure(buffer[:3], buffer[1:]))
    assert len(compiled.entries) == 1 and "__storage_ids" not in compiled.entries[0].guard_source

    compiled = _compiled(mutates_first_reads_second)
    compiled(torch.ones(3), torch.ones(3))
    assert "__storage_ids" in compiled.entries[0].guard_source


def test_mutated_parameter_aliasing_an_argument_recompiles():
    class Accumulate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(3))

        def forward(self, x):
            self.total.add_(1)
            return x * 2

    module, reference = Accumulate(), Accumulate()
    compiled = _compiled(module)
    with torch.no_grad():
        torch.testing.assert_close(compiled(torch.ones(3)), reference(torch.ones(3)))
        # The argument is a view of the buffer the graph adds to.
        torch.testing.assert_close(compiled(module.total[:]), reference(reference.total[:]))
    torch.testing.assert_close(module.total, reference.total)
    assert len(compiled.entries) == 2
    with torch.no_grad():
        assert "shares storage" in compiled.entries[1].guard(module, module.total[:])


# -- functions: code, defaults and bindings ------------------------------------------------------------

def test_replaced_defaults_of_the_compiled_function_recompile():
    def scaled(x, factor=2.0, *, shift=1.0):
        return x * factor + shift

    compiled = _compiled(scaled)
    _check(compiled, scaled, _ones, 1)
    scaled.__defaults__ = (5.0,)
    _check(compiled, scaled, _ones, 1)  # entries made with the old defaults are dropped
    scaled.__kwdefaults__ = {"shift": -1.0}
    _check(compiled, scaled, _ones, 1)
    scaled.__kwdefaults__["shift"] = 7.0  # changed in place
    _check(compiled, scaled, _ones, 1)


def test_default_added_to_the_compiled_function():
    def scaled(x, factor):
        return x * factor

    compiled = _compiled(scaled)
    torch.testing.assert_close(compiled(torch.ones(3), 2.0), torch.full((3,), 2.0))
    scaled.__defaults__ = (3.0,)
    torch.testing.assert_close(compiled(torch.ones(3)), torch.full((3,), 3.0))


def _plus_one(x):
    return x + 1


def _minus_one(x):
    return x - 1


def _minus_one_copy(x):
    return x - 1


def test_replaced_code_of_the_compiled_function_recompiles():
    def body(x):
        return x + 1

    compiled = _compiled(body)
    _check(compiled, body, _ones, 1)
    body.__code__ = _minus_one.__code__
    _check(compiled, body, _ones, 1)
    assert len(compiled.caches) == 2


def helper(x, factor=2.0):
    return x * factor


def calls_helper(x):
    return helper(x) + _minus_one_copy(x)


def test_inlined_function_code_and_defaults_are_guarded():
    compiled = _compiled(calls_helper)
    _check(compiled, calls_helper, _ones, 1)
    original_code = _minus_one_copy.__code__
    _minus_one_copy.__code__ = _plus_one.__code__
    try:
        _check(compiled, calls_helper, _ones, 2)
    finally:
        _minus_one_copy.__code__ = original_code
    helper.__defaults__ = (2.0, 3.0)  # one more default, for no new parameter: still one default used
    try:
        _check(compiled, calls_helper, _ones, 3)
    finally:
        helper.__defaults__ = (2.0,)


class _Scaler:
    def scale(self, x, factor=2.0):
        return x * factor


def test_method_defaults_are_guarded():
    scaler = _Scaler()

    def calls_method(x):
        return scaler.scale(x)

    compiled = _compiled(calls_method)
    _check(compiled, calls_method, _ones, 1)
    _Scaler.scale.__defaults__ = (4.0,)
    try:
        _check(compiled, calls_method, _ones, 2)
    finally:
        _Scaler.scale.__defaults__ = (2.0,)


ACTIVATION = torch.relu


def applies_activation(x):
    return ACTIVATION(x)


def test_global_rebound_to_another_torch_function_recompiles():
    global ACTIVATION
    compiled = _compiled(applies_activation)
    make = lambda: (-torch.ones(3),)  # noqa: E731
    _check(compiled, applies_activation, make, 1)
    ACTIVATION = torch.neg
    try:
        _check(compiled, applies_activation, make, 2)
    finally:
        ACTIVATION = torch.relu


class _WithClassAttributes:
    def __init__(self):
        self._alpha = 2.0

    @property
    def alpha(self):
        return self._alpha

    def scale(self, x):
        return x * 3.0

    @staticmethod
    def shift(x, k=1.0):
        return x + k

    @classmethod
    def offset(cls, x):
        return x - 4.0


def test_rebound_class_attributes_recompile():
    """A method, property, static or class method rebound on the class (the class stays the same object)."""
    instance = _WithClassAttributes()

    def reads(x):
        return instance.offset(instance.shift(instance.scale(x * instance.alpha)))

    compiled = _compiled(reads)
    _check(compiled, reads, _ones, 1)
    originals = dict(vars(_WithClassAttributes))
    replacements = [("alpha", property(lambda self: -self._alpha)), ("scale", lambda self, x: x * 5.0),
                    ("shift", staticmethod(lambda x: x + 6.0)), ("offset", classmethod(lambda cls, x: x - 7.0))]
    try:
        for count, (name, replacement) in enumerate(replacements, start=2):
            setattr(_WithClassAttributes, name, replacement)
            _check(compiled, reads, _ones, count)
    finally:
        for name, _ in replacements:
            setattr(_WithClassAttributes, name, originals[name])
    _check(compiled, reads, _ones, len(replacements) + 1)  # the first entry again, no retrace


def test_static_method_with_a_default_does_not_recompile_every_call():
    """Its default was guarded through `type(obj).shift.__func__`, which raises: every call recompiled."""
    instance = _WithClassAttributes()

    def reads(x):
        return instance.shift(x)

    compiled = _compiled(reads)
    for _ in range(3):
        _check(compiled, reads, _ones, 1)


ZERO = 0.0
NOT_A_NUMBER = float("nan")


def reciprocal_of_zero(x):
    return x * torch.full((3,), ZERO).reciprocal().clamp(-1.0, 1.0)


def test_signed_zero_global_recompiles():
    global ZERO
    compiled = _compiled(reciprocal_of_zero)
    _check(compiled, reciprocal_of_zero, _ones, 1)
    ZERO = -0.0
    try:
        _check(compiled, reciprocal_of_zero, _ones, 2)
    finally:
        ZERO = 0.0


def adds_nan(x):
    return x + NOT_A_NUMBER


def test_nan_global_reuses_its_entry():
    compiled = _compiled(adds_nan)
    for _ in range(3):
        result = compiled(torch.ones(3))
    assert torch.isnan(result).all() and len(compiled.entries) == 1


def test_method_shadowed_by_an_instance_attribute_recompiles():
    """`module.forward = patched` (accelerate's hooks do this) and the same on a plain object."""
    module = torch.nn.Linear(3, 3)
    instance = _WithClassAttributes()

    def calls(x):
        return module(instance.scale(x))

    compiled = _compiled(calls)
    _check(compiled, calls, _ones, 1)
    module.forward = lambda x: x * 7.0
    _check(compiled, calls, _ones, 2)
    instance.scale = lambda x: x - 2.0
    _check(compiled, calls, _ones, 3)


def makes_a_tensor(x):
    return x.sum() + torch.ones(3)


def test_default_dtype_changed_recompiles():
    compiled = _compiled(makes_a_tensor)
    x = torch.ones(2)
    compiled(x)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert compiled(x).dtype == makes_a_tensor(x).dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)
    assert len(compiled.entries) == 2


def test_inference_tensor_inputs_get_the_storage_check_only_with_an_inplace_op():
    """Inference tensors have no version counter: an in-place op in the graph decides."""
    def pure(a, b):
        return a * 2 + b

    with torch.inference_mode():
        compiled_pure = _compiled(pure)
        compiled_pure(torch.ones(3), torch.ones(3))
        assert "__storage_ids" not in compiled_pure.entries[0].guard_source
        compiled = _compiled(mutates_first_reads_second)
        _check_mutation(compiled, _aliasing_cases()[0], 1)
        _check_mutation(compiled, _aliasing_cases()[3], 2)


def uses_a_builtin(x):
    return x * abs(-2)


def test_global_shadowing_a_builtin_recompiles():
    compiled = _compiled(uses_a_builtin)
    _check(compiled, uses_a_builtin, _ones, 1)
    globals()["abs"] = lambda value: 10
    try:
        _check(compiled, uses_a_builtin, _ones, 2)
    finally:
        del globals()["abs"]
    _check(compiled, uses_a_builtin, _ones, 2)


# -- functions passed as arguments: guarded by code, globals, closure contents and defaults ---------------

def applies(x, fn):
    return fn(x) + 1


def _scaler(k):
    return lambda t: t * k


def _with_default(t, k=2.0):
    return t * k


def test_a_new_function_object_of_the_same_code_reuses_the_entry():
    compiled = _compiled(applies)
    for _ in range(3):  # a new lambda on every call, as a caller defining it inline makes
        _check(compiled, applies, lambda: (torch.ones(3), lambda t: t * 2), 1)


def test_a_function_argument_with_other_code_closure_globals_or_defaults_recompiles():
    compiled = _compiled(applies)
    _check(compiled, applies, lambda: (torch.ones(3), _scaler(2.0)), 1)
    _check(compiled, applies, lambda: (torch.ones(3), _scaler(2.0)), 1)  # new cells, same contents
    _check(compiled, applies, lambda: (torch.ones(3), _scaler(3.0)), 2)  # the cell's contents
    _check(compiled, applies, lambda: (torch.ones(3), lambda t: t - 5), 3)  # the code
    other_globals = dict(_with_default.__globals__)
    _check(compiled, applies, lambda: (torch.ones(3), _with_default), 4)
    _check(compiled, applies, lambda: (torch.ones(3), types.FunctionType(  # the defaults
        _with_default.__code__, _with_default.__globals__, "f", (5.0,))), 5)
    _check(compiled, applies, lambda: (torch.ones(3), types.FunctionType(  # the globals
        _with_default.__code__, other_globals, "f", (2.0,))), 6)


def picks_by_identity(x, fn):
    return x * 2 if fn is _with_default else x * 3


def test_a_function_argument_compared_by_identity_is_guarded_by_identity():
    compiled = _compiled(picks_by_identity)
    same_code = types.FunctionType(_with_default.__code__, _with_default.__globals__, "f", (2.0,))
    _check(compiled, picks_by_identity, lambda: (torch.ones(3), _with_default), 1)
    _check(compiled, picks_by_identity, lambda: (torch.ones(3), same_code), 2)


def _inner_maker(k):
    def make_inner():
        def inner(u):
            return u * k

        return inner

    def set_k(value):
        nonlocal k
        k = value

    return make_inner, set_k


def returns_what_fn_makes(x, fn):
    inner = fn()
    return inner(x), inner


def test_a_function_the_entry_rebuilds_with_an_arguments_cells_is_guarded_by_identity():
    compiled = _compiled(returns_what_fn_makes)
    x = torch.ones(3)
    for later in (5.0, 7.0):  # the same code and cell contents, other cells: `inner` must close over the new ones
        make_inner, set_k = _inner_maker(2.0)
        result, inner = compiled(x, make_inner)
        torch.testing.assert_close(result, x * 2.0)
        set_k(later)
        torch.testing.assert_close(inner(x), x * later)


# -- an outside tensor's .grad: another outside value, guarded ---------------------------------------

def sgd_like(weight, lr):
    if weight.grad is None:
        return weight * 0
    return weight - lr * weight.grad


def test_reading_grad_of_an_outside_tensor_is_guarded():
    """`p.grad` of an argument is read as the outside value it is: None (guarded) or a tensor input; a
    gradient that appears, is replaced or changes shape is seen on the next call."""
    compiled = _compiled(sgd_like)
    weight = torch.randn(4, requires_grad=True)
    _check(compiled, sgd_like, lambda: (weight, 0.1), 1)  # no gradient yet
    weight.grad = torch.randn(4)
    _check(compiled, sgd_like, lambda: (weight, 0.1), 2)  # a gradient now: a tensor input
    weight.grad = torch.randn(4)  # another gradient tensor: the same entry reads it
    _check(compiled, sgd_like, lambda: (weight, 0.1), 2)
    weight.grad = None
    _check(compiled, sgd_like, lambda: (weight, 0.1), 2)


def test_reading_grad_of_a_computed_tensor_breaks():
    def program(x):
        y = x * 2
        grad = y.grad
        return y + (0 if grad is None else 1)

    x = torch.randn(3)
    report = kiln.explain(program, x)
    assert report.breaks and "computed" in report.breaks[0].reason
    torch.testing.assert_close(kiln.compile(program)(x), program(x))


# -- `is` between two objects read from sources -----------------------------------------------------


def compares_identity(x, a, b):
    return x + (1.0 if a is b else 0.0)


def test_is_between_distinct_arguments_is_guarded():
    """Traced with two distinct dicts (or lists, or modules' namespaces), then called with one object passed
    twice: the first trace's `a is b` was False, and its entry must not serve the aliased call."""
    for make in (lambda: {1: 2}, lambda: [1], lambda: {"k": torch.ones(1)}):
        compiled = _compiled(compares_identity)
        one = make()
        x = torch.zeros(1)
        torch.testing.assert_close(compiled(x, one, make()), compares_identity(x, one, make()))
        torch.testing.assert_close(compiled(x, one, one), compares_identity(x, one, one))
        torch.testing.assert_close(compiled(x, one, make()), compares_identity(x, one, make()))
        assert len(compiled.entries) == 2
