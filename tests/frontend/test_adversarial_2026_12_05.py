"""Adversarial programs (2026-12-05): guards, side effects and generators, against eager.

Each program runs eagerly and compiled on equal copies of its state, call after call, while the inputs or the
state change between calls; the results and the state left behind (in-place writes, tensor layouts,
containers, objects) must be eager's. The programs that were once wrong say what was wrong; the rest are a
regression corpus for the same angles.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect

import pytest
import torch

import kiln


def _plain(value):
    """A comparable form of a result or of a state: tensors with their layout and values."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.stride(), value.detach().tolist())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_plain(item) for item in value])
    if isinstance(value, dict):
        return ("dict", [(key, _plain(item)) for key, item in value.items()])
    if isinstance(value, set):
        return ("set", sorted(value))
    if dataclasses.is_dataclass(value):
        return (type(value).__name__, _plain(dataclasses.asdict(value)))
    if callable(value):  # a state's getter (of a closure's cell) is read; its setters are not state
        return _plain(value()) if not inspect.signature(value).parameters else "setter"
    if hasattr(value, "__dict__") and not isinstance(value, enum.Enum):
        return (type(value).__name__, _plain(vars(value)))
    return value


def _outcome(fn, args):
    try:
        return ("returned", _plain(fn(*args)))
    except Exception as error:  # the program's own exception must be eager's too
        return ("raised", type(error).__name__, str(error))


def _check_calls(make, calls):
    """make() -> (fn, state); each call(state) -> the arguments, after changing the state as it likes."""
    eager_fn, eager_state = make()
    compiled_fn, compiled_state = make()
    compiled = kiln.compile(compiled_fn)
    for number, call in enumerate(calls):
        expected = _outcome(eager_fn, call(eager_state))
        actual = _outcome(compiled, call(compiled_state))
        assert actual == expected, f"call {number}"
        assert _plain(compiled_state) == _plain(eager_state), f"state after call {number}"


# -- in-place view ops on an input whose sizes became symbolic ----------------------------------------------
# Once wrong: the backend's AOTAutograd trace took the input's fake as the trace left it (already restrided by
# `t_()`), so the op's replay onto the real input did nothing, and the guards compared its sizes in the wrong
# order (a later call of another shape ran the wrong graph).

def _inplace_view_then_sum(x):
    x[0] += 1
    x[1:].mul_(2)
    x.t_()
    return x.sum()


INPLACE_VIEW_PROGRAMS = {
    "t_": _inplace_view_then_sum,
    "unsqueeze_": lambda x: (x.unsqueeze_(0), x.sum())[1],
    "unsqueeze_then_squeeze_": lambda x: (x.unsqueeze_(1), x.squeeze_(), x * 2)[2],
    "transpose_": lambda x: (x.transpose_(0, 1), x[0] * 1)[1],
    "swapdims_": lambda x: (x.swapdims_(0, 1), x.contiguous() + 1)[1],
    "as_strided_": lambda x: (x.as_strided_((2,), (1,)), x + 1)[1],
    "t_then_add_returns_input": lambda x: (x.t_(), x.add_(1), x)[2],
    "t_then_view_output": lambda x: (x.t_(), x[1:])[1],
}


def _check_on_changing_shapes(program):
    """`program(x)` called with a new x of another shape (one transposed) each call: sizes turn symbolic."""
    shapes = [lambda: torch.arange(6.).reshape(3, 2), lambda: torch.arange(12.).reshape(4, 3),
              lambda: torch.arange(10.).reshape(2, 5).t(), lambda: torch.arange(20.).reshape(5, 4)]

    def fresh(make):
        def call(state):
            state["x"] = make()  # in the state, so that the layout each call leaves it in is compared
            return (state["x"],)
        return call

    _check_calls(lambda: (program, {}), [fresh(make) for make in shapes])


@pytest.mark.parametrize("name", list(INPLACE_VIEW_PROGRAMS))
def test_inplace_view_ops_on_symbolic_inputs(name):
    _check_on_changing_shapes(INPLACE_VIEW_PROGRAMS[name])


def test_inplace_view_op_state_carried_between_calls():
    # the input is left transposed by each call and passed again: its layout flips every call
    _check_calls(lambda: (_inplace_view_then_sum, {"x": torch.ones(3, 2)}), [lambda state: (state["x"],)] * 4)


# -- inputs sharing a mutated storage --------------------------------------------------------------------------
# Once wrong: y = x[1:4] after a graph traced with y = x[0:3] (same sizes, strides and storage) ran that graph,
# which read y at offset 0; the storage guard did not compare offsets.

def test_view_input_of_a_mutated_input_at_another_offset():
    def program(x, y):
        x.mul_(2)
        return y + 1

    def views(start):
        return lambda state: (state["a"], state["a"][start:start + 3] if start is not None else state["a"].clone()[:3])

    _check_calls(lambda: (program, {"a": torch.arange(6.)}), [views(None), views(0), views(1), views(2), views(0)])


def test_same_tensor_passed_twice_then_apart():
    def program(x, y):
        x.add_(1)
        return y * 2

    calls = [lambda s: (s["a"], s["b"]), lambda s: (s["a"], s["a"]), lambda s: (s["a"], s["b"]), lambda s: (s["b"], s["b"])]
    _check_calls(lambda: (program, {"a": torch.arange(4.), "b": torch.arange(4.)}), calls)


# -- a corpus that passed: guards ------------------------------------------------------------------------------

SCALES = {"scale": 2.0}


def test_global_dict_value_changes():
    def program(x):
        return x * SCALES["scale"]

    def with_scale(value):
        def call(state):
            SCALES["scale"] = value
            return (state["x"],)
        return call

    try:
        _check_calls(lambda: (program, {"x": torch.ones(3)}), [with_scale(2.0), with_scale(3.0), with_scale(2.0)])
    finally:
        SCALES["scale"] = 2.0


def test_closure_cell_rebound():
    def make():
        scale = 1.0

        def program(x):
            return x * scale

        def rebind(value):
            nonlocal scale
            scale = value
        return program, {"rebind": rebind}

    def with_scale(value):
        return lambda state: (state["rebind"](value), torch.ones(2))[1:]
    _check_calls(make, [with_scale(1.0), with_scale(2.0), with_scale(5.0)])


def test_nonlocal_counter_and_mutable_default():
    def make():
        count = 0

        def program(x, log=[]):  # noqa: B006 (the default is the state under test)
            nonlocal count
            count += 1
            log.append(count)
            return x * count + len(log)
        return program, {"count": lambda: count}

    _check_calls(make, [lambda state: (torch.ones(2),)] * 3)


class _Scaled:
    k = 2


def test_class_and_instance_attributes():
    def make():
        obj = _Scaled()
        return (lambda x: x * obj.k), {"obj": obj}

    def with_k(value, on_class):
        def call(state):
            setattr(_Scaled if on_class else state["obj"], "k", value)
            return (torch.ones(2),)
        return call

    try:
        _check_calls(make, [with_k(2, True), with_k(3, True), with_k(4, False), with_k(5, True)])
    finally:
        _Scaled.k = 2


class _Mode(enum.Enum):
    A = 1
    B = 2


@dataclasses.dataclass
class _Config:
    mode: _Mode
    alpha: float


def test_enum_and_dataclass_fields():
    def program(x, cfg):
        return x * cfg.alpha if cfg.mode is _Mode.A else x - cfg.alpha

    def with_fields(mode, alpha):
        def call(state):
            state["cfg"].mode, state["cfg"].alpha = mode, alpha
            return (torch.ones(2), state["cfg"])
        return call

    _check_calls(lambda: (program, {"cfg": _Config(_Mode.A, 1.0)}),
                 [with_fields(_Mode.A, 1.0), with_fields(_Mode.B, 1.0), with_fields(_Mode.A, 3.0)])


def test_dict_keys_added_removed_reordered():
    def program(x, table):
        out = x
        for key in table:
            out = out * 2 + table[key]
        return out, list(table)

    def with_table(table):
        def call(state):
            state["table"].clear()
            state["table"].update(table)
            return (torch.ones(2), state["table"])
        return call

    _check_calls(lambda: (program, {"table": {"a": 1}}),
                 [with_table({"a": 1}), with_table({"a": 1, "b": 2}), with_table({"b": 2, "a": 1}), with_table({})])


def test_requires_grad_grad_mode_and_contiguity():
    def program(x):
        y = x * 2 if x.requires_grad else x * 3
        y = y + 1 if torch.is_grad_enabled() else y - 1
        return (y.view(-1) if y.is_contiguous() else y.reshape(-1) * 5).detach()

    def call_with(make, grad=True):
        def call(state):
            torch.set_grad_enabled(grad)
            return (make(),)
        return call

    try:
        _check_calls(lambda: (program, {}), [
            call_with(lambda: torch.ones(2, 3)), call_with(lambda: torch.ones(2, 3, requires_grad=True)),
            call_with(lambda: torch.ones(2, 3), grad=False), call_with(lambda: torch.ones(3, 2).t()),
            call_with(lambda: torch.ones(2, 3))])
    finally:
        torch.set_grad_enabled(True)


def test_tuple_str_and_none_arguments():
    def program(x, sizes, op, flag):
        y = x * sizes[0] + len(sizes)
        if op == "add":
            y = y + 1
        if flag is None:
            y = y * 2
        return y

    _check_calls(lambda: (program, {}), [
        lambda s: (torch.ones(2), (1, 2), "add", None), lambda s: (torch.ones(2), (3,), "add", None),
        lambda s: (torch.ones(2), (3,), "sub", 1), lambda s: (torch.ones(2), (3, 4, 5), "add", None)])


# -- a corpus that passed: side effects ------------------------------------------------------------------------

def test_list_mutations_around_a_graph_break():
    def program(x, log):
        log.append(1)
        y = x + 1
        print("", end="")  # a graph break
        log.append(len(log))
        log.insert(0, "start")
        return y * 2

    _check_calls(lambda: (program, {"log": [], "x": torch.ones(2)}), [lambda s: (s["x"], s["log"])] * 3)


def test_exception_after_mutations():
    def program(x, log, table):
        log.append(1)
        table["k"] = len(log)
        x.add_(1)
        if len(log) > 1:
            raise ValueError("boom")
        return x * 2

    _check_calls(lambda: (program, {"log": [], "d": {}, "x": torch.ones(2)}),
                 [lambda s: (s["x"], s["log"], s["d"])] * 3)


def test_outputs_alias_a_mutated_input():
    def program(x):
        x.add_(1)
        return x, x[0], x.view(2, 2)

    _check_calls(lambda: (program, {"x": torch.zeros(4)}), [lambda s: (s["x"],)] * 2)


def test_data_assignment_and_resize():
    def assign(x, y):
        x.data = y * 2
        return x + 1

    def resize(x):
        x.resize_(2, 2)
        x.fill_(3)
        return x * 2

    _check_calls(lambda: (assign, {"x": torch.ones(3), "y": torch.arange(3.)}), [lambda s: (s["x"], s["y"])] * 2)
    _check_calls(lambda: (resize, {}), [lambda s: (torch.ones(6),), lambda s: (torch.ones(4),),
                                        lambda s: (torch.ones(9),)])


def test_set_mutation():
    def program(x, seen):
        seen.add(len(seen))
        seen.discard(0)
        return x * len(seen)

    _check_calls(lambda: (program, {"seen": {0, 5}}), [lambda s: (torch.ones(2), s["seen"])] * 3)


# -- a corpus that passed: generators --------------------------------------------------------------------------

def test_generator_passed_in_partly_consumed():
    def program(numbers, x):
        first = next(numbers)
        total = x * first
        for value in numbers:
            total = total + value
            if value > 3:
                break
        return total, next(numbers, -1)

    _check_calls(lambda: (program, {}), [lambda s: ((i for i in range(6)), torch.ones(2)),
                                         lambda s: (iter([5, 1, 2, 9, 8]), torch.ones(2)),
                                         lambda s: ((i for i in range(2)), torch.ones(2))])


def test_generator_send_close_and_yield_from():
    def make():
        def accumulate(log):
            try:
                total = 0
                while True:
                    total += yield total
            finally:
                log.append("closed")

        def inner(x):
            yield x + 1
            yield x * 2
            return 7

        def outer(x):
            result = yield from inner(x)
            yield x * result

        def program(x, log):
            running = accumulate(log)
            next(running)
            running.send(2)
            total = running.send(3)
            running.close()
            return [x * total] + list(outer(x))
        return program, {"log": []}

    _check_calls(make, [lambda s: (torch.ones(2), s["log"])] * 2)


def test_zip_of_generators_stops_at_the_shorter():
    def make():
        def numbers(count, log):
            for i in range(count):
                log.append(i)
                yield i

        def program(x, log):
            out = x
            for a, b in zip(numbers(3, log), numbers(5, log)):
                out = out + a * b
            return out
        return program, {"log": []}

    _check_calls(make, [lambda s: (torch.ones(2), s["log"])] * 2)


# -- an error the compiled graph raises, after side effects ----------------------------------------------------
# Once wrong: the graph's out-of-range gather raised before the entry replayed `log.append(1)` and before
# AOTAutograd wrote `x.add_(1)` back, so the program saw neither; eager makes both, then raises.

def test_graph_error_after_side_effects_leaves_eagers_effects():
    def program(x, log):
        log.append(1)
        x.add_(1)
        y = x[torch.tensor([5])]
        log.append(2)
        return y

    _check_calls(lambda: (program, {"log": [], "x": torch.ones(2)}), [lambda s: (s["x"], s["log"])] * 3)


def _index_report(eager_reruns):
    from kiln.runtime import support
    return support.KilnIndexError("kiln: an earlier call read an index out of range", eager_reruns)


@pytest.mark.parametrize("make_error, eager_reruns", [
    (lambda: _index_report(True), True),
    (lambda: _index_report(False), False),
    (lambda: torch.AcceleratorError("CUDA error: an illegal memory access was encountered"), False),
    (lambda: RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"), False)],
    ids=["cpu-index-report", "cuda-index-report", "torch-cuda-error", "triton-cuda-error"])
def test_a_graph_error_that_eager_would_not_reproduce_is_raised_as_it_is(monkeypatch, make_error, eager_reruns):
    # kiln's CUDA index reports are not rerun eagerly: eager's out-of-range gather on CUDA is a device-side
    # assert that ends the CUDA context, and a deferred report belongs to an earlier call (this call's
    # eager run would raise nothing, and the report would be lost). Nor is a CUDA error: it leaves the
    # context unusable, and the eager run would fail at some unrelated op instead. Stood in for on the CPU:
    # the Triton backend's index flag, raising the error after the kernels.
    from kiln.runtime import support

    error = make_error()

    def after_call(status):
        raise error

    monkeypatch.setattr(support.IndexStatus, "after_call", after_call)

    def program(x, i, log):
        log.append(1)
        return x[i] * 2

    log = []
    compiled = kiln.compile(program)
    with kiln.config.patch(cpu_backend="triton"):
        if eager_reruns:  # the frame runs again eagerly: its side effect happens once, and eager's result
            torch.testing.assert_close(compiled(torch.ones(4), torch.tensor([1]), log), torch.full((1,), 2.0))
        else:
            with pytest.raises(type(error), match=str(error)[:24].replace("[", r"\[")):
                compiled(torch.ones(4), torch.tensor([1]), log)
    assert log == ([1] if eager_reruns else [])  # raised as it is: before the entry replays the effects


def test_graph_error_in_a_resume_function():
    def program(x, log):
        log.append("before")
        print("", end="")  # a graph break: the rest is a resume function with a graph of its own
        x.mul_(3)
        log.append("after")
        return x[torch.tensor([x.shape[0]])]

    _check_calls(lambda: (program, {"log": [], "x": torch.ones(2)}), [lambda s: (s["x"], s["log"])] * 2)


def test_graph_error_in_a_closure_and_a_method():
    class Holder(torch.nn.Module):
        def forward(self, x, log):
            log.append(len(log))
            x.add_(2)
            return x[torch.tensor([3])]

    def make_closure():
        scale = 2.0

        def program(x, log):
            log.append(scale)
            x.mul_(scale)
            return x[torch.tensor([-3])]
        return program, {"log": [], "x": torch.ones(2)}

    _check_calls(make_closure, [lambda s: (s["x"], s["log"])] * 2)
    holder = Holder()
    _check_calls(lambda: (holder, {"log": [], "x": torch.ones(2)}), [lambda s: (s["x"], s["log"])] * 2)


# -- global state the trace reads ----------------------------------------------------------------------------
# Once wrong: the guards checked that autocast was on, not its dtype (a float16 region ran the bfloat16 graph),
# and `torch.are_deterministic_algorithms_enabled()` / `torch.get_float32_matmul_precision()` were constants
# of the trace with no guard.

def test_autocast_dtype_changes():
    def program(x, w):
        return (x @ w) + 1

    compiled = kiln.compile(program)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    for dtype in [None, torch.bfloat16, torch.float16, None, torch.bfloat16]:
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            expected, actual = program(x, w), compiled(x, w)
        assert actual.dtype == expected.dtype, dtype
        # kiln's fp32 CPU product is oneDNN's and eager's MKL's: equal on some CPUs, an ulp apart on AMD EPYC
        assert kiln.testing.compare(actual, expected, program(x.double(), w.double())), dtype


def test_deterministic_and_matmul_precision_flags():
    def program(x):
        y = x * 2 if torch.are_deterministic_algorithms_enabled() else x * 3
        return y + 1 if torch.get_float32_matmul_precision() == "highest" else y - 1

    compiled = kiln.compile(program)
    before = torch.are_deterministic_algorithms_enabled(), torch.get_float32_matmul_precision()
    try:
        for deterministic, precision in [(False, "highest"), (True, "highest"), (True, "high"), (False, "highest")]:
            torch.use_deterministic_algorithms(deterministic)
            torch.set_float32_matmul_precision(precision)
            assert torch.equal(compiled(torch.ones(2)), program(torch.ones(2))), (deterministic, precision)
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.set_float32_matmul_precision(before[1])


def test_library_module_flag_changes():
    # Once wrong: attributes of library modules were read as constants with no guard, flags included
    def program(x):
        return x * 2 if torch.backends.mkldnn.enabled else x * 3

    compiled = kiln.compile(program)
    for enabled in [True, False, True]:  # flags(): setting the attribute raises once a test disabled global flags
        with torch.backends.mkldnn.flags(enabled=enabled):
            assert torch.equal(compiled(torch.ones(2)), program(torch.ones(2))), enabled


def test_torch_functions_reading_global_state():
    # Once wrong: a torch function of no arguments ran once, in the trace, and its value stayed a constant
    def program(x):
        y = x * torch.initial_seed() + torch.get_num_threads()
        return y * 2 if torch.is_anomaly_enabled() else y * 3

    compiled = kiln.compile(program)
    threads, seed = torch.get_num_threads(), torch.initial_seed()
    try:
        for new_seed, new_threads, anomaly in [(1, threads, False), (2, threads, False), (2, 1, False), (2, 1, True)]:
            torch.manual_seed(new_seed)
            torch.set_num_threads(new_threads)
            with torch.autograd.set_detect_anomaly(anomaly):
                assert torch.equal(compiled(torch.ones(2)), program(torch.ones(2))), (new_seed, new_threads, anomaly)
    finally:
        torch.set_num_threads(threads)
        torch.manual_seed(seed)


# -- as_strided of an input's storage --------------------------------------------------------------------------
# Once wrong: after `x.add_(1)` (functionalized: a new buffer) or through an in-place as_strided view, the graph
# counted as_strided's storage_offset from x's first element, not from its storage's start (x = base[3:]).

AS_STRIDED_THROUGH_INPUTS = {
    "after_a_write": lambda x: (x.add_(1), x.as_strided((2, 2), (1, 2), 0) * 2)[1],
    "written_through": lambda x: (x.as_strided((2,), (1,), 0).mul_(10), x.sum())[1],
    "scatter": lambda x: torch.as_strided_scatter(x, torch.ones(2), (2,), (1,), 0),
    "of_a_computed_tensor": lambda x: (x + 1).as_strided((2,), (1,), 1) * 2,
}


@pytest.mark.parametrize("name", list(AS_STRIDED_THROUGH_INPUTS))
def test_as_strided_through_inputs_at_storage_offsets(name):
    program = AS_STRIDED_THROUGH_INPUTS[name]

    def at(start):
        return lambda state: (state["base"][start:],)

    _check_calls(lambda: (program, {"base": torch.arange(20.)}), [at(0), at(1), at(3), at(2)])


# -- a corpus that passed: aliasing of containers and of views -------------------------------------------------

def test_same_container_or_object_passed_twice():
    class Box:
        def __init__(self):
            self.v = 1

    def lists(a, b, x):
        a.append(1)
        b.append(len(a))
        return x * len(b)

    def objects(a, b, x):
        a.v = a.v + 1
        b.v = b.v * 3
        return x * a.v

    _check_calls(lambda: (lists, {"l": [], "m": []}), [
        lambda s: (s["l"], s["m"], torch.ones(2)), lambda s: (s["l"], s["l"], torch.ones(2)),
        lambda s: (s["l"], s["m"], torch.ones(2)), lambda s: (s["m"], s["m"], torch.ones(2))])
    _check_calls(lambda: (objects, {"p": Box(), "q": Box()}), [
        lambda s: (s["p"], s["q"], torch.ones(2)), lambda s: (s["p"], s["p"], torch.ones(2)),
        lambda s: (s["p"], s["q"], torch.ones(2))])


def test_views_of_one_base_written_and_read():
    def write_row(x):
        x.add_(1)
        x.mul_(x.sum())
        return x[0]

    def write_one_read_other(a, b):
        a.mul_(2)
        return b + 0

    _check_calls(lambda: (write_row, {"base": torch.arange(12.).reshape(4, 3)}),
                 [lambda s, k=k: (s["base"][k],) for k in [0, 1, 2, 3, 1]] +
                 [lambda s, k=k: (s["base"][:, k],) for k in [0, 1, 2, 0]])
    _check_calls(lambda: (write_one_read_other, {"base": torch.arange(20.)}),
                 [lambda s, k=k: (s["base"][:5 + k], s["base"][k:k + 5 + k]) for k in [0, 2, 5, 3, 1]])


def test_list_and_dict_of_tensors_change_between_calls():
    def over_list(xs):
        out = 0
        for i, x in enumerate(xs):
            out = out + x * i
        xs[0].add_(1)
        return out

    def change(kind):
        def call(s):
            if kind == "append":
                s["xs"].append(torch.ones(2))
            elif kind == "replace":
                s["xs"][1] = torch.zeros(2)
            elif kind == "alias":
                s["xs"][2] = s["xs"][0]
            elif kind == "pop":
                s["xs"].pop()
            return (s["xs"],)
        return call

    _check_calls(lambda: (over_list, {"xs": [torch.ones(2), torch.ones(2), torch.ones(2)]}),
                 [change(kind) for kind in ["", "append", "replace", "alias", "", "pop", "alias"]])


def test_iterators_passed_in_and_made_inside():
    def rows(x):
        out = []
        for row in x:
            out.append(row * 2)
            if row.shape[0] > 2 and len(out) > 2:
                break
        return out

    def zipped(x, numbers):
        pairs = list(zip(numbers, x))
        return [a * b for a, b in pairs], next(numbers, "end")

    def enumerated(x, it):
        for i, v in enumerate(it):
            if i == 1:
                return x * v, list(it)
        return x, []

    _check_calls(lambda: (rows, {}), [lambda s, n=n: (torch.arange(float(n * 3)).reshape(n, 3),) for n in [2, 3, 4]])
    _check_calls(lambda: (zipped, {}), [lambda s, n=n: (torch.arange(float(n)), (i for i in range(5)))
                                        for n in [2, 3, 6]])
    _check_calls(lambda: (enumerated, {}), [lambda s: (torch.ones(2), iter([1, 2, 3, 4])),
                                            lambda s: (torch.ones(2), iter([5])),
                                            lambda s: (torch.ones(2), map(float, [1, 2, 3]))])


LAYOUT_WRITES_ON_SYMBOLIC_INPUTS = {
    "data_assigned_transposed": lambda x: (setattr(x, "data", x.t() * 2), x + 1)[1],
    "data_assigned_new_shape": lambda x: (setattr(x, "data", x.reshape(-1)[:2] * 2), x + 1)[1],
    "set_": lambda x: (x.set_(x.t().contiguous() * 2), x + 1)[1],
    "resize_": lambda x: (x.resize_(x.shape[0] - 1, x.shape[1]), x.fill_(2), x * 1)[2],
    "unsqueeze_squeeze_transpose_": lambda x: (x.unsqueeze_(0), x.squeeze_(0), x.transpose_(0, 1), x.sum(0))[3],
    "t_then_view_and_reshape": lambda x: (x.t_(), x[0], x.reshape(-1))[1:],
    "t_of_a_view": lambda x: (x[1:].t_(), x * 1)[1],
}


@pytest.mark.parametrize("name", list(LAYOUT_WRITES_ON_SYMBOLIC_INPUTS))
def test_layout_writes_on_symbolic_inputs(name):
    _check_on_changing_shapes(LAYOUT_WRITES_ON_SYMBOLIC_INPUTS[name])


def test_t_and_unsqueeze_on_inputs_that_alias():
    def fresh(make):
        def call(state):
            state["x"] = make()
            state["y"] = state["x"][1:]
            return (state["x"], state["y"])
        return call

    shapes = [lambda: torch.arange(6.).reshape(3, 2), lambda: torch.arange(12.).reshape(4, 3),
              lambda: torch.arange(10.).reshape(2, 5).t()]
    _check_calls(lambda: ((lambda x, y: (x.t_(), y.add_(1), x.sum())[2]), {}), [fresh(make) for make in shapes])
    _check_calls(lambda: ((lambda x, y: (y.unsqueeze_(0), x.add_(1), y.shape)[2]), {}), [fresh(make) for make in shapes])


# -- tensors made from a symbolic int ------------------------------------------------------------------------
# Once wrong: an int argument that changed became symbolic, and torch.tensor(n) / x.new_tensor(n) of it made its
# constant in 32 bits (n = 2**40 gave tensor(0)).

TENSORS_FROM_INTS = {
    "tensor": lambda x, n: torch.tensor(n) + x,
    "tensor_of_a_list": lambda x, n: torch.tensor([n, [n, 2][0]]) * x + torch.as_tensor((n, 1)),
    "new_tensor": lambda x, n: x.new_tensor(n) + x,
    "scalar_tensor": lambda x, n: torch.scalar_tensor(n, dtype=torch.float64) + x,
    "full_like": lambda x, n: torch.full_like(x, n),
}


@pytest.mark.parametrize("name", list(TENSORS_FROM_INTS))
def test_tensors_made_from_a_changing_int(name):
    program = TENSORS_FROM_INTS[name]
    _check_calls(lambda: (program, {}), [lambda s, n=n: (torch.ones(2, dtype=torch.float64), n)
                                         for n in [1, 2, 2 ** 40, 2 ** 40 + 5, 3, -2 ** 50]])


# -- a gather whose result nothing reads ---------------------------------------------------------------------
# Once wrong: dropped as dead code, so an out-of-range index did not raise and the side effects after it ran.

def test_unread_gather_still_raises():
    def program(x, i, log):
        unused = x[torch.tensor([i])]  # noqa: F841 (the op under test)
        also_unused = torch.index_select(x, 0, torch.tensor([i]))  # noqa: F841
        log.append(i)
        return x + 1

    def in_a_loop(x, log, indices):
        for i in indices:
            log.append(i)
            print("", end="")  # a graph break: the rest of the body is a resume function
            x.add_(1)
            unused = x[torch.tensor([i])]  # noqa: F841
            log.append("ok")
        return x

    _check_calls(lambda: (program, {"log": []}), [lambda s, i=i: (torch.zeros(3), i, s["log"]) for i in [0, 5, 1, -1]])
    _check_calls(lambda: (in_a_loop, {"log": [], "x": torch.zeros(3)}),
                 [lambda s: (s["x"], s["log"], [0, 1, 5, 2]), lambda s: (s["x"], s["log"], [2, 0])])


# -- flags of an input its fake does not have ----------------------------------------------------------------
# Once wrong: `x._is_view()` and `x.is_leaf` were read off the input's fake (a fresh leaf, no view) and not
# guarded: `base[:2]` and a non-leaf that requires grad took the other branch.

def test_is_view_and_is_leaf_of_inputs():
    def by_view(x):
        return x * 2 if x._is_view() else x * 3

    def by_leaf(x):
        return x.detach() * 2 if x.is_leaf else x.detach() * 3

    def inputs():
        with_grad = torch.ones(2, requires_grad=True)
        (with_grad * 2).sum().backward()
        return [lambda: torch.ones(2), lambda: torch.ones(4)[:2], lambda: with_grad,
                lambda: torch.ones(2, requires_grad=True) * 1, lambda: torch.ones(2)]

    def by_sharing(x):
        return x * 2 if x.is_shared() else x * 3

    def shared():
        tensor = torch.ones(2)
        return tensor.share_memory_()

    for program in (by_view, by_leaf):
        _check_calls(lambda program=program: (program, {}), [lambda s, make=make: (make(),) for make in inputs()])
    _check_calls(lambda: (by_sharing, {}), [lambda s: (torch.ones(2),), lambda s: (shared(),), lambda s: (torch.ones(2),)])
