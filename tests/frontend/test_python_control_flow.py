"""Python's control flow constructs in a traced frame, each checked against eager Python: raising
and catching exceptions (custom exception classes, `raise ... from`, bare `raise`, `finally`, `with`
blocks left by an exception, the errors Python raises for missing keys, attributes and indices, a
StopIteration leaving a generator (PEP 479), and the text of a caught exception), `assert` on a
tensor, and the `match` statement; and what stays refused, with its message (an exception leaving
the compiled function under fullgraph=True, the text of an OSError). Helpers:
tests/frontend/python_features_support.py.
"""
from __future__ import annotations

import dataclasses
import textwrap

import pytest
import torch

from kiln.backend import graph_compiler
from kiln.frontend import FullgraphError, compile_function
from tests.frontend.python_features_support import X, _compiled, _equal, check


# --------------------------------------------------------------------------- exceptions

def _raise_and_catch(x):
    try:
        raise ValueError("no")
    except ValueError as error:
        x = x + len(error.args[0])
    return x


def _raises(kind):
    raise kind("from the callee")


def _catch_from_callee(x):
    try:
        _raises(KeyError)
    except (TypeError, KeyError) as error:
        return x * 2, error.args
    return x


def _missing_key_attribute_index(x):
    counts = []
    try:
        {}["k"]
    except KeyError as error:
        counts.append(error.args)
    try:
        x.no_such_attribute
    except AttributeError:
        counts.append("attribute")
    try:
        [1, 2][5]
    except IndexError as error:
        counts.append(error.args)
    try:
        int("seven")
    except ValueError as error:
        counts.append(error.args)
    try:
        next(iter([]))
    except StopIteration:
        counts.append("stop")
    return x + len(counts), counts


def _reraise_and_chain(x):
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            try:
                raise
            except KeyError as again:
                same = again is inner
            raise ValueError("outer") from inner
    except ValueError as outer:
        return x + 1, same, outer.__cause__.args, outer.__context__ is outer.__cause__


def _finally_on_the_way_out(x, log):
    try:
        try:
            log.append("body")
            raise RuntimeError("stop")
        finally:
            log.append("finally")
    except RuntimeError:
        log.append("caught")
    return x * len(log)


class _Recorder:
    def __init__(self, swallow):
        self.swallow = swallow
        self.seen = None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        self.seen = kind
        return self.swallow


def _with_block_exits_by_exception(x):
    swallowing, passing = _Recorder(True), _Recorder(False)
    with swallowing:
        raise ValueError("swallowed")
    try:
        with passing:
            raise KeyError("passed on")
    except KeyError:
        pass
    return x + 1, swallowing.seen, passing.seen


class _ShapeError(Exception):
    def __init__(self, shape, note):
        super().__init__(f"bad shape {shape}")
        self.shape = shape
        self.note = note


def _custom_exception(x):
    try:
        raise _ShapeError(tuple(x.shape), "four")
    except _ShapeError as error:
        return x + error.shape[0], error.note, error.args


def _side_effects_before_raise_stay(x, log):
    try:
        log.append(1)
        raise LookupError("after the append")
    except LookupError:
        log.append(2)
    return x + 1


def _grad_mode_restored(x):
    try:
        with torch.no_grad():
            raise ValueError("inside no_grad")
    except ValueError:
        pass
    return x * 2, torch.is_grad_enabled()


def _loop_with_continue(x):
    total = 0
    for key in ("a", "b", "c"):
        try:
            total += {"a": 1, "c": 3}[key]
        except KeyError:
            continue
    return x * total


def test_raise_and_catch_in_one_frame():
    check(_raise_and_catch, X)


def test_an_exception_from_a_callee_is_caught_by_the_caller():
    check(_catch_from_callee, X)


def test_errors_python_raises_for_missing_keys_attributes_indices_values_and_stop():
    check(_missing_key_attribute_index, X)


def test_bare_reraise_and_raise_from_chain_the_exceptions():
    check(_reraise_and_chain, X)


def test_finally_runs_when_an_exception_passes():
    log, want = [], []
    compiled, _ = _compiled(_finally_on_the_way_out)
    _equal(compiled(X, log), _finally_on_the_way_out(X, want))
    assert log == want == ["body", "finally", "caught"]


def test_with_block_left_by_an_exception_calls_exit_which_may_swallow_it():
    check(_with_block_exits_by_exception, X)


def test_user_exception_class_with_its_own_init():
    check(_custom_exception, X)


def test_side_effects_made_before_a_raise_are_kept():
    log, want = [], []
    compiled, _ = _compiled(_side_effects_before_raise_stay)
    _equal(compiled(X, log), _side_effects_before_raise_stay(X, want))
    assert log == want == [1, 2]


def test_grad_mode_is_restored_when_an_exception_leaves_no_grad():
    check(_grad_mode_restored, X)


def test_try_except_continue_in_a_loop():
    check(_loop_with_continue, X)


def _uncaught(x):
    if x.shape[0] == 4:
        raise ValueError("four elements")
    return x


def test_an_exception_leaving_the_compiled_function_is_reported_and_eager_raises_it():
    compiled, _ = _compiled(_uncaught)
    with pytest.raises(FullgraphError, match="ValueError exception raised and not caught"):
        compiled(X)
    lenient = compile_function(_uncaught, graph_compiler("eager"))  # runs the frame eagerly, which raises
    with pytest.raises(ValueError, match="four elements"):
        lenient(X)


def _generator_raising_stop_iteration():
    yield 1
    raise StopIteration  # PEP 479: a RuntimeError for the consumer


def _pep_479(x):
    try:
        list(_generator_raising_stop_iteration())
    except RuntimeError as error:
        return x + 1, error.args
    return x


def test_stop_iteration_leaving_a_generator_is_a_runtime_error():
    check(_pep_479, X)


class _Described(ValueError):
    def __str__(self):
        return f"described: {self.args[0]}"


def _texts_of_caught_exceptions(x):
    texts = []
    for kind, arguments in ((ValueError, ("four rows",)), (KeyError, ("key",)), (RuntimeError, ("a", 1)),
                            (_Described, ("it",)), (IndexError, ())):
        try:
            raise kind(*arguments)
        except Exception as error:
            texts += [str(error), repr(error), f"{error}!", f"{error!r}"]
    return x * len(texts), texts


def test_text_of_a_caught_exception():
    check(_texts_of_caught_exceptions, X)


def _text_of_an_os_error(x):
    try:
        raise OSError(2, "missing")
    except OSError as error:
        return x, str(error)


def _repr_of_an_os_error(x):
    try:
        raise OSError(2, "missing")  # Python makes a FileNotFoundError
    except OSError as error:
        return x, repr(error)


def _os_error_by_errno(x):
    try:
        raise OSError(2, "missing")  # Python makes a FileNotFoundError
    except FileNotFoundError as error:
        return x + 1, type(error), error.args
    except OSError:
        return x - 1, None, None


def test_os_error_is_made_of_the_class_python_picks():
    check(_os_error_by_errno, X)


@pytest.mark.parametrize("fn, reason", [(_text_of_an_os_error, "reads more than its arguments"),
                                        (_repr_of_an_os_error, "does more than keep its arguments")])
def test_text_of_an_exception_read_from_more_than_its_arguments_is_refused(fn, reason):
    compiled, _ = _compiled(fn)
    with pytest.raises(FullgraphError, match=reason):
        compiled(X)


def _unrewritten(source: str):
    """The function `source` defines, compiled as Python does (pytest rewrites a test module's own `assert`s)."""
    source = textwrap.dedent(source)
    namespace = {"torch": torch}
    exec(compile(source, __file__, "exec"), namespace)
    return namespace[source.split("def ", 1)[1].split("(", 1)[0]]


_asserts_on_a_tensor = _unrewritten("""
    def _asserts_on_a_tensor(x):
        a = x.abs() + 1
        assert (a > 0).all(), "positive"
        assert a.sum() > 0
        return a.log()
""")


def test_assert_on_a_tensor_is_a_graph_node():
    compiled = check(_asserts_on_a_tensor, X)
    # the graph's assert fails (RuntimeError, as Dynamo's does), and the frame runs again eagerly for the
    # program's own error and side effects (errors.GraphRaised): AssertionError, as eager raises
    with pytest.raises(AssertionError, match="positive"):
        compiled(torch.full((4,), float("nan")))


_assert_on_a_tensor_caught = _unrewritten("""
    def _assert_on_a_tensor_caught(x):
        try:
            assert (x > 0).all(), "positive"
            return x
        except AssertionError:
            return -x
""")


def test_assert_on_a_tensor_inside_try_is_not_a_graph_node():
    compiled, made = _compiled(_assert_on_a_tensor_caught)
    with pytest.raises(FullgraphError, match="truth value of tensor"):  # its handler must see AssertionError
        compiled(X - 1)
    assert not made
    lenient = compile_function(_assert_on_a_tensor_caught, graph_compiler("eager"))
    assert torch.equal(lenient(X - 1), _assert_on_a_tensor_caught(X - 1))


def _errors_of_constant_operations(x, shape):
    caught = []
    try:
        shape[7]
    except IndexError as error:
        caught.append(error.args)
    try:
        "abc".index("z")
    except ValueError as error:
        caught.append(error.args)
    return x + len(caught), caught


def test_errors_of_operations_on_constants_are_the_programs():
    check(_errors_of_constant_operations, X, (2, 3))


# --------------------------------------------------------------------------- match

@dataclasses.dataclass
class _Point:
    x: int
    y: int


def _match(x, subject):
    match subject:
        case _Point(x=0, y=y):
            return x + y
        case _Point(a, b):
            return x * a + b
        case [1, *rest]:
            return x + len(rest)
        case {"a": 1, **rest}:
            return x - len(rest)
        case int(value) if value > 3:
            return x * value
        case str() | bytes():
            return x - 1
        case (first, second):
            return x + first * second
        case _:
            return x * 0


@pytest.mark.parametrize("subject", [_Point(0, 5), _Point(2, 3), [1, 2, 3], {"a": 1, "b": 2}, 7, 2, "s", (2, 4),
                                     1.5], ids=repr)
def test_match_statement(subject):
    check(_match, X, subject)
