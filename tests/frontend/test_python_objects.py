"""User objects and classes in a traced frame, each checked against eager Python: objects with a
custom `__new__` or a metaclass (an abstract class still refused), Python's attribute rules on
objects (properties with setters and deleters, `__getattribute__`, `__setattr__`, `__getattr__`, a
module's own `__getattr__`, class attributes read through an instance), NamedTuples, dataclasses,
`copy.deepcopy` / `copy.copy` (of a tensor, refused), and an nn.Module's parameter, buffer and module
iterators. Helpers: tests/frontend/python_features_support.py.
"""
from __future__ import annotations

import abc
import copy
import dataclasses
import typing

import pytest
import torch

from kiln.frontend import FullgraphError
from tests.frontend.python_features_support import X, _compiled, _equal, check


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


# --------------------------------------------------------------------------- NamedTuple, dataclass

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


# --------------------------------------------------------------------------- deepcopy, copy

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
