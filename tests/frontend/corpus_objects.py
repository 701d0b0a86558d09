"""Corpus, part 2: containers, *args/**kwargs, objects and inheritance, modules, dataclasses,
with-blocks, try/except, builtins.

See corpus_support.py for what `@program` declares and tests/frontend/test_corpus.py
for the checks. Nothing in this file may run during a compiled call.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import sys

import numpy
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.frontend.corpus_support import (fresh_values, program, replace_arg, set_attribute, tensors,
                                           with_values)

this_module = sys.modules[__name__]

# ---------------------------------------------------------------- containers


@program()
def tuple_build_and_unpack(x, y):
    pair = (x, y)
    a, b = pair
    return b, a, pair[0] * 2


@program()
def list_methods(x, y):
    items = [x]
    items.append(y)
    items.extend([x * 2, y * 2])
    items.insert(0, x + y)
    last = items.pop()
    items.reverse()
    return items, last, len(items)


@program()
def dict_methods(x, y):
    table = {"x": x}
    table["y"] = y
    table.update(z=x + y)
    missing = table.get("w", None)
    popped = table.pop("x")
    return table, missing, popped, list(table.keys()), "y" in table


@program()
def dict_iteration(x, y):
    table = dict(a=x, b=y)
    return [value * 2 for value in table.values()], {key: value.sum() for key, value in table.items()}


@program()
def star_unpacking(x, y):
    first, *middle, last = [x, y, x + y, x - y]
    return first, middle, last


@program()
def nested_containers(x, y):
    structure = {"pair": (x, [y, {"deep": x * y}])}
    return structure["pair"][1][1]["deep"], structure


@program()
def list_slicing_and_concat(x, y):
    items = [x, y, x * 2, y * 2]
    return items[1:3] + items[:1], items[::-1][0], (x,) + (y,) * 2


@program()
def namedtuple_return(x, y):
    Pair = _PAIR
    pair = Pair(x, y)
    return Pair(pair.second, pair.first * 2)


_PAIR = collections.namedtuple("Pair", ["first", "second"])


@program(args=lambda: ([torch.randn(3), torch.randn(3)],))
def list_argument(items):
    return items[0] + items[1], len(items)


@program(args=lambda: ({"a": torch.randn(3), "b": torch.randn(3)},),
         guarded=lambda args: (({"a": args[0]["a"], "c": args[0]["b"]},), None))
def dict_argument(inputs):
    return {key: value * 2 for key, value in inputs.items()}


@program(args=lambda: ((torch.randn(2), 3),), guarded=lambda args: (((args[0][0], 4),), None))
def tuple_argument_with_int(pair):
    tensor, count = pair
    return tensor * count


@program()
def list_index_and_count(x, y):
    names = ["a", "b", "a"]
    return x * names.index("b") + names.count("a")


@program()
def slice_objects(x, y):
    window = slice(1, 3)
    return x[window], y[slice(None, None, 2)]


@program()
def mutate_argument_list(x, y):
    out = [x]
    out += [y]
    out[0] = out[0] * 3
    return out


# ---------------------------------------------------------------- *args / **kwargs


def _sum_all(*tensors, scale=1.0):
    total = tensors[0]
    for tensor in tensors[1:]:
        total = total + tensor
    return total * scale


@program()
def star_args_call(x, y):
    parts = (x, y, x)
    return _sum_all(*parts, scale=0.5)


@program()
def double_star_call(x, y):
    options = {"scale": 2.0}
    return _sum_all(x, y, **options)


def _keywords_only(x, *, alpha, beta=1.0, **rest):
    return x * alpha + beta + len(rest)


@program()
def keyword_only_arguments(x, y):
    return _keywords_only(x, alpha=2.0), _keywords_only(y, alpha=1.0, beta=0.0, extra=1)


def _forward_everything(*args, **kwargs):
    return _keywords_only(*args, **kwargs)


@program()
def forwarding_wrapper(x, y):
    return _forward_everything(x, alpha=3.0, gamma=2)


@program(args=lambda: (torch.randn(3), torch.randn(3), torch.randn(3)))
def varargs_program(*tensors):
    return sum(tensors), len(tensors)


@program(args=lambda: (torch.randn(3),), guarded=lambda args: (args + (torch.randn(3),), None))
def varargs_count_is_guarded(*tensors):
    return torch.stack(tensors).sum(0)


@program(args=with_values(2.0), guarded=replace_arg(1, 3.0))
def default_then_override(x, scale=1.0, shift=0.0):
    return x * scale + shift


# ---------------------------------------------------------------- objects, methods, inheritance


class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def apply(self, tensor):
        return tensor * self.factor

    @property
    def double(self):
        return self.factor * 2

    @staticmethod
    def shift(tensor):
        return tensor + 1

    @classmethod
    def unit(cls):
        return cls.__name__


class OffsetScaler(Scaler):
    def __init__(self, factor, offset):
        super().__init__(factor)
        self.offset = offset

    def apply(self, tensor):
        return super().apply(tensor) + self.offset


SCALER = Scaler(3.0)
OFFSET_SCALER = OffsetScaler(2.0, 1.0)


@program(args=lambda: (torch.randn(3), Scaler(2.0)))
def object_argument_method(x, scaler):
    return scaler.apply(x), scaler.double, Scaler.shift(x), scaler.unit()


@program(guarded=set_attribute(SCALER, "factor", 5.0))
def global_object_attribute(x, y):
    return SCALER.apply(x) + SCALER.factor


@program()
def inherited_method_with_super(x, y):
    return OFFSET_SCALER.apply(x)


@program()
def object_created_inside(x, y):
    scaler = OffsetScaler(0.5, 2.0)
    return scaler.apply(x) + scaler.double


class Accumulator:
    def __init__(self):
        self.total = None

    def add(self, tensor):
        self.total = tensor if self.total is None else self.total + tensor
        return self


@program()
def fluent_interface(x, y):
    return Accumulator().add(x).add(y).add(x).total


class Vector:
    def __init__(self, data):
        self.data = data

    def __add__(self, other):
        return Vector(self.data + other.data)

    def __mul__(self, scale):
        return Vector(self.data * scale)

    def __len__(self):
        return self.data.shape[0]


@program()
def operator_overloading(x, y):
    total = (Vector(x) + Vector(y)) * 2
    return total.data, len(total)


@program()
def isinstance_dispatch(x, y):
    out = []
    for value in (x, 2, "s", None, [y]):
        if isinstance(value, torch.Tensor):
            out.append(value * 2)
        elif isinstance(value, (int, float)):
            out.append(value + 1)
        elif isinstance(value, list):
            out.append(value[0])
    return out


@program()
def getattr_hasattr(x, y):
    scale = getattr(SCALER, "factor", 1.0)
    missing = getattr(SCALER, "missing", 0.5)
    return x * scale * missing, hasattr(SCALER, "apply"), hasattr(SCALER, "nothing")


# ---------------------------------------------------------------- modules


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(3, 8)
        self.second = nn.Linear(8, 2)

    def forward(self, x):
        return self.second(F.relu(self.first(x)))


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.randn(3))
        self.weight = nn.Parameter(torch.randn(3))
        self.scale = 2.0

    def forward(self, x):
        return x * self.weight * self.scale + self.offset


class LoopOverList(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x) + index
        return x, len(self.layers), self.layers[-1](x)


class DictOfModules(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(3, 2), "b": nn.Linear(3, 4)})

    def forward(self, x):
        return {name: head(x) for name, head in self.heads.items()}, self.heads["a"](x)


class TrainingBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        if self.training:
            return self.linear(x) * 0.5
        return self.linear(x)


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, x):
        return self.proj(x)


class Derived(Base):
    def forward(self, x):
        return super().forward(x).relu() + self.extra(x)

    def extra(self, x):
        return x.sum(-1, keepdim=True)


class ConvBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(F.relu(self.norm(self.conv(x)))).flatten(1)


def _module_program(module: nn.Module, make_args, eval_mode: bool = True, **changes):
    """Register `module(*args)` as a program; by default a new batch size is the guarded change."""
    module.eval() if eval_mode else module.train()
    changes.setdefault("guarded", lambda args: ((torch.randn(5, *args[0].shape[1:]),), None))

    def run(*args):
        return module(*args)

    run.__name__ = f"module_{type(module).__name__.lower()}"
    program(args=make_args, **changes)(run)
    return module


class SetsPlainAttributes(nn.Module):
    """Stores plain values on itself each call (as transformers' Swin layers do) and reads them back."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        self.mode = "scaled" if x.shape[0] > 2 else "plain"
        self.last_batch = x.shape[0]
        if self.mode == "scaled":
            return self.linear(x) * 2, self.last_batch
        return self.linear(x), self.last_batch


class CallOverride(nn.Module):
    """A layer class that wraps nn.Module.__call__ (as transformers' GradientCheckpointingLayer does)."""

    scale = 1.0

    def __call__(self, *args, **kwargs):
        if self.scale != 1.0:
            args = (args[0] * self.scale, *args[1:])
        return super().__call__(*args, **kwargs)


class CallOverrideLayer(CallOverride):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x, shift=0.0):
        return self.linear(x).relu() + shift


class StackOfCallOverrides(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([CallOverrideLayer(), CallOverrideLayer()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, shift=0.5)
        return x


_module_program(TwoLayer(), tensors((4, 3)))
_module_program(WithBuffer(), tensors((4, 3)))
_module_program(LoopOverList(), tensors((4, 3)))
_module_program(DictOfModules(), tensors((4, 3)))
_TRAINING = _module_program(TrainingBranch(), tensors((4, 3)))
_module_program(Derived(), tensors((4, 3)))
_module_program(SetsPlainAttributes(), tensors((4, 3)), guarded=lambda args: ((torch.randn(2, 3),), None))
_module_program(StackOfCallOverrides(), tensors((4, 3)),
                guarded=set_attribute(CallOverride, "scale", 2.0))
_module_program(ConvBlock(), tensors((2, 3, 8, 8)))
_module_program(nn.Sequential(nn.Linear(3, 6), nn.GELU(), nn.LayerNorm(6), nn.Dropout(0.1), nn.Linear(6, 1)),
                tensors((4, 3)))
_module_program(nn.Embedding(10, 4), lambda: (torch.randint(0, 10, (2, 5)),),
                guarded=lambda args: ((torch.randint(0, 10, (3, 5)),), None))


@program(guarded=set_attribute(_TRAINING, "training", True))
def module_training_flag(x, y):
    return _TRAINING(x)


_HOOKED = nn.Linear(3, 3)
_HOOKED.register_forward_hook(lambda module, inputs, output: output * 2)
_HOOKED.register_forward_pre_hook(lambda module, inputs: (inputs[0] + 1,))


@program(guarded=lambda args: ((torch.randn(6, 3), args[1]), None))
def module_with_hooks(x, y):
    return _HOOKED(x)


_SHARED = nn.Linear(3, 3)


@program(guarded=lambda args: ((torch.randn(6, 3), args[1]), None))
def module_called_twice(x, y):
    return _SHARED(_SHARED(x)) + _SHARED.weight.sum()


_PARAM_HOLDER = TwoLayer()


@program(guarded=set_attribute(_PARAM_HOLDER, "second", nn.Linear(8, 2)), stable=fresh_values(tensors((4, 3), (4, 3))))
def submodule_replacement_is_guarded(x, y):
    return _PARAM_HOLDER(x)


# ---------------------------------------------------------------- dataclasses


@dataclasses.dataclass
class Config:
    width: int = 3
    scale: float = 2.0
    activation: str = "relu"


@dataclasses.dataclass
class Result:
    value: torch.Tensor
    extra: torch.Tensor
    note: str = "ok"


CONFIG = Config()


@program(guarded=set_attribute(CONFIG, "scale", 4.0))
def dataclass_config_global(x, y):
    out = x * CONFIG.scale
    return out.relu() if CONFIG.activation == "relu" else out


@program(args=lambda: (torch.randn(4, 3), Config(activation="tanh")))
def dataclass_argument(x, config):
    return x[:, : config.width] * config.scale


@program()
def dataclass_created_and_returned(x, y):
    return Result(value=x + y, extra=x * y)


@program()
def dataclass_fields_iteration(x, y):
    config = Config(width=2)
    names = [field.name for field in dataclasses.fields(config)]
    return x[:, : config.width], names


@program()
def dataclass_replace_attribute(x, y):
    result = Result(x, y)
    result.extra = result.extra * 10
    return result


# ---------------------------------------------------------------- with-blocks


@program()
def no_grad_block(x, y):
    with torch.no_grad():
        z = x * 2
    return z + y


@program(args=lambda: (torch.randn(3, requires_grad=True), torch.randn(3)))
def enable_grad_inside_no_grad(x, y):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
    return a, b


@program()
def set_grad_enabled_block(x, y):
    with torch.set_grad_enabled(False):
        z = x + y
    return z * 2


@program()
def autocast_block(x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = x @ y.t()
    return z.float()


@program()
def nullcontext_block(x, y):
    with contextlib.nullcontext():
        return x - y


class Recorder:
    def __init__(self):
        self.depth = 0

    def __enter__(self):
        self.depth += 1
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        return False


@program()
def user_context_manager(x, y):
    with Recorder() as recorder:
        z = x * recorder.depth
    return z + recorder.depth


# ---------------------------------------------------------------- try/except that does not raise


@program()
def try_except_not_raising(x, y):
    try:
        z = x + y
    except RuntimeError:
        z = x
    return z


@program()
def try_finally(x, y):
    try:
        z = x * 2
    finally:
        z = z + 1
    return z


@program()
def try_except_else(x, y):
    try:
        z = x - y
    except (ValueError, KeyError):
        z = x
    else:
        z = z * 3
    return z


@program()
def nested_try(x, y):
    try:
        try:
            z = x.relu()
        finally:
            z = z + 1
    except Exception:
        z = y
    return z


# ---------------------------------------------------------------- builtins and misc


@program()
def min_max_on_python_values(x, y):
    return x * max(1, 2, 3) + min([4, 5]) + max(x.shape, key=lambda size: -size)


@program()
def sum_of_tensors(x, y):
    return sum([x, y, x]), sum((1, 2, 3))


@program()
def string_keys_and_fstrings(x, y):
    out = {}
    for index in range(2):
        out[f"layer_{index}"] = x * index
    return out, "layer_1".startswith("layer"), "-".join(["a", "b"])


@program()
def torch_size_arithmetic(x, y):
    shape = x.shape[:-1] + (2,)
    return torch.zeros(shape) + x[..., :2], torch.Size([2, 2]) == (2, 2)


@program()
def dtype_and_device_logic(x, y):
    dtype = torch.float64 if x.dtype == torch.float16 else x.dtype
    return torch.ones(2, dtype=dtype, device=x.device), x.device.type, torch.finfo(x.dtype).eps


@program()
def int_float_bool_builtins(x, y):
    return x * int(2.7) + float("1.5") + bool([1]), round(2.567, 1), divmod(7, 2)


@program()
def map_filter_zip(x, y):
    doubled = list(map(lambda t: t * 2, [x, y]))
    kept = list(filter(lambda pair: pair[0] > 0, zip([1, 0, 2], [x, y, x])))
    return doubled, [pair[1] for pair in kept]


@program()
def sorted_and_reversed_constants(x, y):
    order = sorted([3, 1, 2], reverse=True)
    return x * order[0], list(reversed(order))


@program()
def isinstance_of_module_and_tensor(x, y):
    return x * isinstance(x, torch.Tensor) + isinstance(_SHARED, nn.Module) + isinstance(y, nn.Parameter)


@program()
def type_checks(x, y):
    return x * (type(3) is int) + (type(x) is torch.Tensor), type(x).__name__


@program()
def callable_and_identity(x, y):
    return x * callable(torch.relu) + (x is x) + (x is not y)


@program()
def returns_constants_and_none(x, y):
    return x + y, None, 3, "text", (1, 2), torch.float32


@program()
def tensor_in_python_list(x, y):
    values = [x, y]
    return values.index(values[0]), values[1] * 2 if y is values[1] else -1


@program()
def update_global_counter(x, y):
    global UNRELATED_COUNTER
    UNRELATED_COUNTER = 1
    return x + UNRELATED_COUNTER


UNRELATED_COUNTER = 0


@program()
def stable_guard_ignores_values(x, y):
    return (x * y).sum(dim=0)


@program(args=lambda: (torch.randn(4, 3, requires_grad=True), torch.randn(4, 3)),
         guarded=lambda args: ((args[0].detach(), args[1]), None))
def requires_grad_is_guarded(x, y):
    return (x * y).sum()


@program(stable=fresh_values(tensors((4, 3), (4, 3))))
def new_shape_same_program(x, y):
    return torch.cat([x, y], 1)


@program(args=with_values(1), guarded=replace_arg(1, 2))
def int_argument_in_shape(x, repeats):
    return x.repeat(repeats, 1)


@program(args=lambda: (torch.randn(4, 3), torch.tensor([0, 1, 2, 0])))
def loss_modules_created_inside(logits, labels):
    smooth = nn.SmoothL1Loss(beta=0.5)
    return nn.CrossEntropyLoss(ignore_index=2)(logits, labels), smooth(logits, logits.flip(0)), smooth.beta


@program(args=with_values(numpy.float32(2.5)), guarded=replace_arg(1, numpy.float32(-1.0)))
def numpy_scalar_argument(x, scale):
    return x * scale + float(scale), torch.full((2,), scale)


@program(guarded=set_attribute(this_module, "CONFIG", Config(scale=9.0)))
def reassigned_global_object(x, y):
    return x * CONFIG.scale
