"""Python constructs real models execute, each traced by kiln's frontend and checked against eager Python.

One group per construct (issue 13, item 2): raising and catching exceptions (and the
`try`/`with` machinery around them), `yield from`, `match`, objects with a custom
`__new__` or a metaclass, Python's attribute rules on objects made in the trace
(properties with setters, `__getattribute__`, `__setattr__`, `__getattr__`), NamedTuples,
`functools.lru_cache`d helpers, `copy.deepcopy` / `copy.copy`, OrderedDict, user iterator
classes, generator context managers, dicts keyed by classes; and what stays unsupported,
with its message (Python's `random`).

Every function is compiled with fullgraph=True (a construct kiln cannot capture raises),
its result compared with eager's, and the number of graphs checked where it has tensors.
"""
from __future__ import annotations

import abc
import collections
import contextlib
import copy
import dataclasses
import functools
import random
import struct
import textwrap
import threading
import typing

import pytest
import torch

from kiln.backend import graph_compiler
from kiln.frontend import FullgraphError, compile_function


def _compiled(fn):
    graphs = []
    eager_rung = graph_compiler("eager")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return eager_rung(gm, example_inputs)

    return compile_function(fn, backend, fullgraph=True), graphs


def _equal(got, want) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and torch.equal(got, want), (got, want)
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), (got, want)
        for a, b in zip(got, want):
            _equal(a, b)
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want), (got, want)
        for key in want:
            _equal(got[key], want[key])
    else:
        assert got == want, (got, want)


def check(fn, *args, graphs: int | None = 1):
    """fn compiled as one frame (and `graphs` graphs) gives eager's result; returns the dispatcher."""
    compiled, made = _compiled(fn)
    _equal(compiled(*args), fn(*args))
    if graphs is not None:
        assert len(made) == graphs
    return compiled


X = torch.arange(4.0)


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


# --------------------------------------------------------------------------- generators

class _Layers(typing.Sequence):
    """Iterated by Sequence.__iter__: `yield self[i]` inside `try/except IndexError` until __getitem__ raises."""

    def __init__(self, count):
        self.count = count

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        if index >= self.count:
            raise IndexError(index)
        return index * 10


def _zip_leaves_a_generator_suspended_in_try(x):
    return x + sum(a + b for a, b in zip([1, 2], _Layers(5))), list(_Layers(3))


def test_a_generator_suspended_in_a_try_that_cannot_catch_generator_exit_may_be_dropped():
    check(_zip_leaves_a_generator_suspended_in_try, X)


def _with_cleanup(log):
    try:
        yield 1
        yield 2
    finally:
        log.append("closed")  # runs when the suspended generator is dropped


def _abandons_generator_with_finally(x):
    return x + next(_with_cleanup([]))


def test_a_generator_suspended_in_try_finally_is_still_refused():
    compiled, _ = _compiled(_abandons_generator_with_finally)
    with pytest.raises(FullgraphError, match="left suspended inside a try/with"):
        compiled(X)


def _inner():
    received = yield 1
    yield received * 2
    return "done"


def _delegating(log):
    result = yield from _inner()
    log.append(result)
    yield from [7, 8]


def _yield_from(x):
    log = []
    generator = _delegating(log)
    first = next(generator)
    second = generator.send(5)
    rest = list(generator)
    return x * (first + second), rest, log


def test_yield_from_delegates_values_sends_and_return_value():
    check(_yield_from, X)


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


# --------------------------------------------------------------------------- creating objects

class _Registered:
    """A custom __new__ that sets state before __init__ runs."""

    def __new__(cls, value):
        instance = super().__new__(cls)
        instance.made_by_new = True
        return instance

    def __init__(self, value):
        self.value = value


class _Other:
    pass


class _NotMe:
    def __new__(cls, value):
        return _Other()  # not an instance of cls: __init__ does not run

    def __init__(self, value):
        raise AssertionError("not called")


class _Meta(type):
    def __call__(cls, *args, **kwargs):
        instance = super().__call__(*args, **kwargs)
        instance.made_by_meta = True
        return instance


class _WithMeta(metaclass=_Meta):
    def __init__(self, value):
        self.value = value


def _create_objects(x):
    registered, meta = _Registered(3), _WithMeta(4)
    other = _NotMe(1)
    return x * registered.value + meta.value, registered.made_by_new, meta.made_by_meta, type(other) is _Other


def test_custom_new_and_metaclass_call():
    check(_create_objects, X)


def _return_made_by_new(x):
    return _Registered(x.shape[0])


def test_an_object_made_by_a_custom_new_is_rebuilt_for_the_caller():
    compiled, _ = _compiled(_return_made_by_new)
    got = compiled(X)
    assert type(got) is _Registered and got.value == 4 and got.made_by_new


class _Abstract(abc.ABC):
    @abc.abstractmethod
    def run(self): ...


def _make_abstract(x):
    return _Abstract(), x


def test_an_abstract_class_still_cannot_be_created():
    compiled, _ = _compiled(_make_abstract)
    with pytest.raises(FullgraphError, match="abstract"):
        compiled(X)


# --------------------------------------------------------------------------- attributes of objects made in the trace

class _Temperature:
    def __init__(self):
        self._celsius = 0.0

    @property
    def celsius(self):
        return self._celsius

    @celsius.setter
    def celsius(self, value):
        self._celsius = float(value)

    @celsius.deleter
    def celsius(self):
        self._celsius = -273.15

    @property
    def kelvin(self):
        return self._celsius + 273.15


def _properties(x):
    reading = _Temperature()
    reading.celsius = 20
    first = reading.celsius
    del reading.celsius
    try:
        reading.kelvin = 1.0
    except AttributeError:
        read_only = True
    return x + first, reading.celsius, read_only


def test_property_setter_deleter_and_read_only_property_on_a_new_object():
    check(_properties, X)


class _Outside:
    def __init__(self):
        self._scale = 1.0

    @property
    def scale(self):
        return self._scale

    @scale.setter
    def scale(self, value):
        self._scale = value * 2


def _set_outside_property(x, holder):
    holder.scale = 3.0
    return x * holder.scale


def test_property_setter_on_an_outside_object_runs_and_is_replayed():
    holder, want_holder = _Outside(), _Outside()
    compiled, _ = _compiled(_set_outside_property)
    _equal(compiled(X, holder), _set_outside_property(X, want_holder))
    assert holder._scale == want_holder._scale == 6.0


class _Mapped:
    """A config-like class: attribute names mapped by __getattribute__ / __setattr__, a __getattr__ fallback."""

    aliases = {"width": "hidden_size"}

    def __init__(self):
        object.__setattr__(self, "hidden_size", 8)

    def __getattribute__(self, name):
        if name != "aliases" and name in object.__getattribute__(self, "aliases"):
            name = object.__getattribute__(self, "aliases")[name]
        return object.__getattribute__(self, name)

    def __setattr__(self, name, value):
        if name in self.aliases:
            name = self.aliases[name]
        object.__setattr__(self, name, value)

    def __getattr__(self, name):
        return f"default {name}"


def _mapped(x):
    config = _Mapped()
    config.width = 16
    return x * config.width, config.hidden_size, config.missing, vars(config) == {"hidden_size": 16}


def test_getattribute_setattr_and_getattr_fallback_on_a_new_object():
    check(_mapped, X)


class _Forwarding(torch.nn.Module):
    """A wrapper that forwards unknown attributes to the model it wraps (PEFT's LoraModel, for one), with a
    property over a submodule and a default for names neither has."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    @property
    def weight(self):
        return self.model.weight

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)  # parameters, buffers, submodules
        except AttributeError:
            if name == "model":
                raise
            return getattr(self.model, name, 0.5)

    def forward(self, x):
        return x @ self.weight.T + self.bias + self.missing, self.in_features


def test_a_modules_own_getattr_is_traced_not_a_break():
    torch.manual_seed(0)
    wrapper = _Forwarding(torch.nn.Linear(4, 3))
    compiled = check(wrapper, X)
    wrapper.model.bias = torch.nn.Parameter(torch.ones(3))  # through the submodule's table: a guarded read
    _equal(compiled(X), wrapper(X))
    wrapper.missing = 2.0  # now found on the instance: __getattr__ is no longer asked (the guard fuzzer, seed 36)
    _equal(compiled(X), wrapper(X))
    _Forwarding.in_features = 7  # or on the class
    try:
        _equal(compiled(X), wrapper(X))
    finally:
        del _Forwarding.in_features


class _Fallback:
    def __getattr__(self, name):
        return 1.5


def _reads_through_getattr(x, holder):
    return x * holder.factor


def test_a_read_that_reached_getattr_is_guarded_to_still_reach_it():
    holder = _Fallback()
    compiled = check(_reads_through_getattr, X, holder)
    holder.factor = 4.0
    _equal(compiled(X, holder), X * 4.0)
    del holder.factor
    _Fallback.factor = -2.0
    try:
        _equal(compiled(X, holder), X * -2.0)
    finally:
        del _Fallback.factor


class _Scaled:
    factor = 2


def _reads_class_attribute(x):
    return x * _Scaled().factor


def test_a_class_attribute_read_through_a_new_object_is_guarded():
    compiled = check(_reads_class_attribute, X)
    _Scaled.factor = 5
    try:
        _equal(compiled(X), X * 5)
    finally:
        _Scaled.factor = 2


# --------------------------------------------------------------------------- NamedTuple, dataclass, OrderedDict

class _Pair(typing.NamedTuple):
    left: torch.Tensor
    right: int = 2

    def total(self):
        return self.left * self.right


def _named_tuples(x):
    pair, keyword = _Pair(x, 3), _Pair(left=x)
    replaced = pair._replace(right=5)
    return pair.total() + keyword.right, replaced.right, pair._fields, pair._asdict()["right"], replaced


def test_namedtuple_construction_methods_and_return():
    check(_named_tuples, X, graphs=1)


@dataclasses.dataclass
class _Settings:
    scale: torch.Tensor
    steps: int = 1
    tags: list = dataclasses.field(default_factory=list)


def _dataclass(x):
    settings = _Settings(x)
    settings.tags.append("a")
    return settings.scale * settings.steps, settings


def test_dataclass_made_and_returned():
    compiled, _ = _compiled(_dataclass)
    (got, settings), (want, _) = compiled(X), _dataclass(X)
    assert torch.equal(got, want) and type(settings) is _Settings and settings.tags == ["a"]


def _ordered_dict(x):
    table = collections.OrderedDict(a=1)
    table["b"] = 2
    return x * table["b"], table


def test_ordered_dict():
    check(_ordered_dict, X)


# --------------------------------------------------------------------------- lru_cache, deepcopy

@functools.lru_cache(maxsize=None)
def _head_dim(hidden, heads):
    return hidden // heads


def _uses_cached_helper(x):
    return x * _head_dim(8, 2)


def test_lru_cached_helper_on_constants_is_traced_through():
    check(_uses_cached_helper, X)


_CALLS = []


@functools.lru_cache
def _impure(value):
    _CALLS.append(value)
    return value


def _uses_impure_cached_helper(x):
    return x * _impure(2)


@functools.lru_cache(maxsize=None)
def _squares(count):
    return tuple(i * i for i in range(count))


def _uses_cached_tuple(x):
    first, second = _squares(4), _squares(4)
    return x * sum(first), first is second, second


def test_lru_cached_helper_returning_a_new_tuple_is_one_constant_object():
    compiled = check(_uses_cached_tuple, X)
    _, same, second = compiled(X)
    assert same and second is compiled(X)[2]  # as the cache: one object for the trace and for every call


@functools.lru_cache(maxsize=None)
def _cached_list(count):
    return list(range(count))


def _uses_cached_list(x):
    return x * len(_cached_list(3))


def test_lru_cached_helper_returning_a_new_list_is_refused():
    compiled, _ = _compiled(_uses_cached_list)
    with pytest.raises(FullgraphError, match="a mutable object made by the call"):
        compiled(X)


def test_lru_cached_helper_that_changes_state_is_refused():
    compiled, _ = _compiled(_uses_impure_cached_helper)
    with pytest.raises(FullgraphError, match="changed state"):
        compiled(X)


class _Config:
    def __init__(self):
        self.layers = 2
        self.names = ["a", "b"]
        self.nested = {"k": (1, [2])}


def _deepcopy(x, config):
    copied = copy.deepcopy(config)
    copied.layers = 3
    copied.names.append("c")
    shallow = copy.copy(config)
    shared = {"list": [1]}
    twice = copy.deepcopy([shared, shared])
    return (x * copied.layers, copied.names, config.names, shallow.names is config.names,
            twice[0] is twice[1], copied.nested)


def test_deepcopy_and_copy_of_containers_and_an_outside_object():
    config, want_config = _Config(), _Config()
    compiled, _ = _compiled(_deepcopy)
    _equal(compiled(X, config), _deepcopy(X, want_config))
    assert config.names == ["a", "b"] and config.layers == 2


def _deepcopy_tensor(x):
    return copy.deepcopy([x])


def test_deepcopy_of_a_tensor_is_refused():
    compiled, _ = _compiled(_deepcopy_tensor)
    with pytest.raises(FullgraphError, match="copy.deepcopy of tensor"):
        compiled(X)


# --------------------------------------------------------------------------- iterators, context managers, keys

class _Countdown:
    def __init__(self, start):
        self.current = start

    def __iter__(self):
        return self

    def __next__(self):
        if self.current == 0:
            raise StopIteration
        self.current -= 1
        return self.current


def _user_iterator(x):
    return x + sum(_Countdown(4)), [value for value in _Countdown(2)]


def test_user_iterator_class():
    check(_user_iterator, X)


@contextlib.contextmanager
def _scaled(log, factor):
    log.append("enter")
    yield factor
    log.append("exit")


def _generator_context_manager(x):
    log = []
    with _scaled(log, 3) as factor:
        x = x * factor
    return x, log


def test_contextlib_contextmanager():
    check(_generator_context_manager, X)


@contextlib.contextmanager
def _guarded_section(log):
    try:
        yield
    except KeyError:
        log.append("handled in the generator")  # swallows it: the with block's exception goes no further
    finally:
        log.append("cleanup")


def _context_manager_left_by_exceptions(x):
    log = []
    with _guarded_section(log):
        raise KeyError("swallowed by the generator")
    try:
        with _guarded_section(log):
            raise ValueError("passes through the generator")
    except ValueError as error:
        log.append(error.args[0])
    return x + len(log), log


def test_contextmanager_left_by_an_exception_throws_it_into_the_generator():
    check(_context_manager_left_by_exceptions, X)


def _catcher():
    caught = []
    while True:
        try:
            yield len(caught)
        except ValueError as error:
            caught.append(error.args[0])
            if len(caught) == 2:
                return caught


def _generator_throw(x):
    generator = _catcher()
    next(generator)
    first = generator.throw(ValueError("one"))
    try:
        generator.throw(ValueError("two"))
    except StopIteration as stop:
        result = stop.args
    return x * first, result


def test_generator_throw():
    check(_generator_throw, X)


_BY_TYPE = {int: 2, float: 3}


def _dict_keyed_by_class(x):
    return x * _BY_TYPE.get(type(1.5), 1)


def test_an_outside_dict_keyed_by_classes_is_read_and_guarded():
    compiled = check(_dict_keyed_by_class, X)
    _BY_TYPE[float] = 7
    try:
        _equal(compiled(X), X * 7)
    finally:
        _BY_TYPE[float] = 3


def _functions_are_true(x):
    return x * (2 if _head_dim and _dict_keyed_by_class and len else 1)


def test_functions_are_true():
    check(_functions_are_true, X)


# --------------------------------------------------------------------------- sets changed in place

def _changes_a_set(x, names):
    names.add("gamma")
    names.discard("alpha")
    names.update(["delta", "beta"])
    return x * len(names)


def test_outside_set_changed_in_place():
    compiled, graphs = _compiled(_changes_a_set)
    for _ in range(2):  # fresh sets equal to the first: the second call reuses the entry
        names, want_names = {"alpha", "beta"}, {"alpha", "beta"}
        _equal(compiled(X, names), _changes_a_set(X, want_names))
        assert names == want_names == {"beta", "gamma", "delta"} and list(names) == list(want_names)
    assert len(graphs) == 1


def _set_live_across_a_break(x):
    names = {"alpha", "beta"}
    value = (x * len(names)).sum().item()  # a graph break: `names` is a live local of the resume function
    names.add("gamma")
    names.remove("beta")
    return x * value * len(names), names


def test_set_live_across_a_break_is_changed_by_the_resume_function():
    from kiln.frontend import stats

    eager_frames = stats.eager_frames
    graphs = []
    compiled = compile_function(_set_live_across_a_break, lambda gm, inputs: (graphs.append(gm), gm.forward)[1])
    for _ in range(2):
        _equal(compiled(X), _set_live_across_a_break(X))
    assert len(graphs) == 2 and stats.eager_frames == eager_frames  # one graph each side, no frame eager


# --------------------------------------------------------------------------- Counter

def _counter(x):
    counts = collections.Counter(["a", "b", "a"])
    counts.update("aab")
    counts["z"] += 2
    del counts["absent"]  # Counter ignores a missing key
    summed = counts + collections.Counter(a=1)
    counts |= collections.Counter(b=1, c=4)  # the larger count, not dict's merge
    return (x * counts["a"] + counts["missing"], counts, summed, counts.most_common(2), counts.total(),
            list(counts.elements()), counts == collections.Counter(counts), collections.Counter(q=3) - summed,
            collections.Counter(a=1, b=0) == collections.Counter(a=1), collections.Counter(a=1) == {"a": 1})


def test_counter_counts_as_python_does():
    check(_counter, X)


def _counter_of_tensors(x):
    counts = collections.Counter()
    counts.update({"a": x})
    return counts


def test_counter_of_tensor_counts_is_refused():
    compiled, _ = _compiled(_counter_of_tensors)
    with pytest.raises(FullgraphError, match="counting"):
        compiled(X)


# --------------------------------------------------------------------------- constant folding of builtins

def _folded_builtins(x):
    packed = struct.pack("<fi", 1.5, 7)
    number, = struct.unpack("<i", packed[4:])
    return x * len(packed) + struct.calcsize("<hh") + number + eval("2 + 3 * 4"), eval(" (1, 'a') ")


def test_struct_and_eval_of_literals_are_folded():
    check(_folded_builtins, X)


def _eval_of_a_name(x):
    return x * eval("len([1])")


def test_eval_of_names_or_calls_is_refused():
    compiled, _ = _compiled(_eval_of_a_name)
    with pytest.raises(FullgraphError, match="eval"):
        compiled(X)


def _thread_ident(x):
    return x + (threading.get_ident() == threading.get_ident())


def test_thread_ident_is_a_constant_guarded_per_thread():
    compiled, made = _compiled(_thread_ident)
    _equal(compiled(X), _thread_ident(X))
    assert len(made) == 1
    results = []
    worker = threading.Thread(target=lambda: results.append(compiled(X)))
    worker.start()
    worker.join()
    _equal(results[0], _thread_ident(X))
    assert len(made) == 2  # another thread's identifier failed the guard: a trace of its own
    compiled(X)
    assert len(made) == 2


# --------------------------------------------------------------------------- still unsupported

def _python_random(x):
    return x * random.random()


def test_python_random_is_refused_with_its_reason():
    compiled, _ = _compiled(_python_random)
    with pytest.raises(FullgraphError, match="random number generator"):
        compiled(X)


def _seeded_draws(x):
    generator = random.Random(7)
    draws = [generator.random() for _ in range(3)] + [generator.randint(1, 6), generator.choice("abc")]
    return x * draws[0] + sum(draws[:4]), draws, isinstance(generator, random.Random)


def test_seeded_random_made_in_the_trace_draws_constants():
    compiled = check(_seeded_draws, X)
    _equal(compiled(X), _seeded_draws(X))  # eager makes the same generator, and draws, on every call


def _unseeded_draw(x):
    return x * random.Random().random()


def _escaping_generator(x):
    generator = random.Random(3)
    generator.random()
    return x, generator


@pytest.mark.parametrize("fn, reason", [(_unseeded_draw, "without a constant seed"),
                                        (_escaping_generator, "used after it")])
def test_unseeded_or_escaping_random_generator_is_refused(fn, reason):
    compiled, _ = _compiled(fn)
    with pytest.raises(FullgraphError, match=reason):
        compiled(X)


# --------------------------------------------------------------------------- nn.Module's iterators

class _Tree(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.rest = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.ReLU())
        self.tied = self.first  # one module under two names: visited once
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        dtype = next(self.parameters()).dtype
        total = sum(parameter.sum() for parameter in self.parameters())
        return (self.rest(self.first(x)).to(dtype) + total * next(self.buffers()),
                [name for name, _ in self.named_parameters()], [name for name, _ in self.named_modules()],
                [name for name, _ in self.named_children()], len(list(self.modules())),
                [name for name, _ in self.first.named_parameters(prefix="first", recurse=False)])


def test_parameters_buffers_and_modules_of_a_module_are_read_from_its_tree():
    model = _Tree()
    x = torch.randn(2, 4)
    compiled, graphs = _compiled(model)
    got, want = compiled(x), model(x)
    assert torch.allclose(got[0], want[0]) and got[1:] == want[1:] and len(graphs) == 1
    model.rest.append(torch.nn.Linear(2, 2))  # the tree changed: its keys are guarded
    got, want = compiled(x), model(x)
    assert torch.allclose(got[0], want[0]) and got[1:] == want[1:] and len(graphs) == 2


def _delegate_to_catcher():
    yield from _catcher()


def _throw_into_yield_from(x):
    generator = _delegate_to_catcher()
    next(generator)
    return x * generator.throw(ValueError("for the delegate"))


def test_throw_into_a_generator_suspended_in_yield_from_is_refused():
    compiled, _ = _compiled(_throw_into_yield_from)
    with pytest.raises(FullgraphError, match="suspended in `yield from`"):
        compiled(X)


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


# --------------------------------------------------------------------------- builtin generic aliases

def _cast_to_generic_aliases(xs, table):
    # torch.optim's foreach code: `cast(list[Tensor], device_params_)`
    first = typing.cast(list[torch.Tensor], xs)[0]
    return first + typing.cast(dict[str, int], table)["n"] + typing.cast(tuple[int, ...], (1, 2))[1]


def test_builtin_generic_aliases():
    check(_cast_to_generic_aliases, [X, X + 1], {"n": 2})
