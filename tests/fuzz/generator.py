"""Random kiln programs, type- and shape-correct by construction, the same for a seed forever.

`generate(seed, index)` builds a `Program` (tests/fuzz/program.py) of 4-25 statements.
Every value the program makes is tracked with its shape, dtype, the storage it lives in
(`base`: an input's name or the statement that allocated it), whether its elements
overlap (an expanded view) and whether its elements are *exact* (computed without
rounding, so that eager and kiln must agree bit for bit: inputs, views, integer math,
max/min/where/pad...). An op is only emitted for operands it is valid for:

- unary math, binary math with broadcasting and Python scalars, comparisons, logical and
  bitwise ops, where, clamp, casts among float32/float16/bfloat16/int32/int64/bool;
- reductions (sum mean amax amin prod argmax var std any all logsumexp) over random dims
  with random keepdim; softmax, log_softmax, layer_norm, rms_norm and their formulas;
- views and layout ops (permute, transpose, reshape, stepped slices, negative select,
  expand, narrow, squeeze/unsqueeze, movedim, flip, roll, contiguous);
- cat, stack, F.pad, matmul, index_select / gather / embedding / x[idx] with COMPUTED
  indices ((i + 1) % n, i * 2 - n, ...: negative and wrapped, always in range);
- in-place ops (add_, mul_, clamp_, masked_fill_, copy_, ...) on intermediates the program
  allocated, never on inputs or overlapping views.

Comparisons, argmax, rounding and float-to-int casts (ops whose result jumps when a
value moves by one rounding) only take exact values or float32 values: on float16 and
bfloat16 values that were computed, kiln's float32 internal math (docs: "fp16/bf16
math done in fp32") legitimately flips them.

Stability: the program for (seed, index) depends only on Python's `random.Random`
seeded with a string, and on this file. Changing what an existing seed produces renames
every regression found so far: add new op families at the END of `_FAMILIES` with
care, and bump `GENERATOR_VERSION` when a change reshuffles old seeds.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from tests.fuzz.program import DTYPE_NAMES, DTYPES, InputSpec, Program, Statement, shape_text

GENERATOR_VERSION = 1

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LOW_PRECISION = (torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int32, torch.int64)
SIZES = (1, 2, 3, 5, 7, 4, 8, 11, 13, 6, 16)
MAX_NUMEL = 16384   # a statement whose result is larger is not emitted (keeps programs fast)
MAX_RANK = 5


@dataclass
class Value:
    """What the generator knows about one value of the program."""

    name: str
    shape: tuple
    dtype: torch.dtype
    base: str               # the input or statement whose storage this value lives in
    overlapping: bool = False  # some elements share memory (expand): no in-place writes
    exact: bool = True      # eager and kiln must compute it bit for bit
    is_input: bool = False

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def is_float(dtype) -> bool:
    return dtype in FLOAT_DTYPES or dtype == torch.float64


def is_int(dtype) -> bool:
    return dtype in INT_DTYPES


def _dummy(operand):
    if isinstance(operand, Value):
        return torch.empty(() if operand.rank == 0 else (1,), dtype=operand.dtype)
    return operand


def promote(first, second) -> torch.dtype:
    """torch's result dtype for a binary op on two operands (Values or Python scalars)."""
    return torch.result_type(_dummy(first), _dummy(second))


def broadcast(*shapes) -> tuple | None:
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None


class _Builder:
    """One program under construction: the random source, the values made so far."""

    def __init__(self, seed: int, index: int):
        self.seed, self.index = seed, index
        self.rng = random.Random(f"kiln-fuzz:v{GENERATOR_VERSION}:{seed}:{index}")
        rng = self.rng
        self.size_pool = rng.sample(SIZES, 4)
        if rng.random() < 0.08:
            self.size_pool.append(0)
        self.nonfinite = rng.random() < 0.15
        self.low_precision = rng.random() < 0.3
        self.inputs: list[InputSpec] = []
        self.statements: list[Statement] = []
        self.values: list[Value] = []

    # ------------------------------------------------------------------ choosing

    def size(self) -> int:
        return self.rng.choice(self.size_pool)

    def shape(self, rank: int | None = None) -> tuple:
        if rank is None:
            rank = self.rng.choices((0, 1, 2, 3, 4), (1, 4, 7, 5, 3))[0]
        return tuple(self.size() for _ in range(rank))

    def dtype(self, kinds: str = "any") -> torch.dtype:
        floats = [torch.float32] * 4 + (list(LOW_PRECISION) if self.low_precision else [])
        if kinds == "float":
            return self.rng.choice(floats)
        return self.rng.choice(floats * 3 + [torch.int64, torch.int64, torch.int32, torch.bool])

    def pick(self, predicate=lambda value: True) -> Value | None:
        """A value satisfying `predicate`, the later values (the program's tail) more likely."""
        candidates = [value for value in self.values if predicate(value)]
        if not candidates:
            return None
        return self.rng.choices(candidates, [1 + position for position in range(len(candidates))])[0]

    def discrete_ok(self, value: Value) -> bool:
        """May `value` feed an op whose result jumps under a rounding change?"""
        return value.exact or value.dtype not in LOW_PRECISION

    def scalar(self, dtype: torch.dtype):
        if is_float(dtype):
            return self.rng.choice((0.5, 2.0, -1.5, 3.0, 0.1, -0.25))
        if dtype == torch.bool:
            return self.rng.choice((1, 2, True))
        return self.rng.choice((1, 2, 3, -2))

    # ------------------------------------------------------------------ making values

    def new_input(self, shape: tuple, dtype: torch.dtype, *, low: int | None = None,
                  high: int | None = None) -> Value:
        """An input of `shape` and `dtype`, in a random layout."""
        rng = self.rng
        name = f"x{len(self.inputs)}"
        rank = len(shape)
        layout, layout_arg = "contiguous", ()
        if rng.random() < 0.45 and rank >= 1:
            options = ["stepped", "offset", "expanded"] + ["transposed"] * (rank >= 2) \
                      + ["permuted"] * (rank >= 3) + ["channels_last"] * (rank == 4)
            layout = rng.choice(options)
            if layout == "transposed":
                layout_arg = tuple(sorted(rng.sample(range(rank), 2)))
            elif layout == "permuted":
                order = list(range(rank))
                while order == sorted(order):
                    rng.shuffle(order)
                layout_arg = tuple(order)
            elif layout == "stepped":
                layout_arg = (rng.randrange(rank), rng.choice((0, 1)), rng.choice((2, 3)))
            elif layout == "expanded":
                leading = rng.choice((0, 0, 1)) if rank >= 2 else 0
                dims = tuple(dim for dim in range(leading, rank) if rng.random() < 0.4)
                layout_arg = (leading, dims)
                if not leading and not dims:
                    layout, layout_arg = "contiguous", ()
            elif layout == "offset":
                layout_arg = (rng.choice((1, 3, 7)),)
        if dtype == torch.bool:
            values, scale, nonfinite = "bool", 1.0, 0.0
        elif is_int(dtype) or low is not None:
            values, scale, nonfinite = "randint", 1.0, 0.0
            if low is None:
                low, high = rng.choice(((-4, 5), (0, 8), (-20, 21)))
        else:
            values = "randn"
            scale = rng.choice((1.0, 1.0, 3.0, 0.1))
            nonfinite = 0.1 if self.nonfinite and rng.random() < 0.5 else 0.0
        spec = InputSpec(name, tuple(shape), DTYPE_NAMES[dtype], values, scale,
                         low if low is not None else 0, high if high is not None else 1,
                         nonfinite, layout, layout_arg, rng.randrange(2 ** 31))
        self.inputs.append(spec)
        value = Value(name, tuple(shape), dtype, base=name, overlapping=layout == "expanded", is_input=True)
        self.values.append(value)
        return value

    def emit(self, expr: str, shape: tuple, dtype: torch.dtype, family: str, *, view_of: Value | None = None,
             overlapping: bool = False, exact: bool = False) -> Value | None:
        """Append `v<k> = expr`; `view_of` makes the result share that value's storage."""
        shape = tuple(shape)
        if math.prod(shape) > MAX_NUMEL or len(shape) > MAX_RANK:
            return None
        name = f"v{len(self.statements)}"
        base = view_of.base if view_of is not None else name
        overlapping = overlapping or (view_of.overlapping if view_of is not None else False)
        self.statements.append(Statement(name, expr, shape, DTYPE_NAMES[dtype], family))
        value = Value(name, shape, dtype, base, overlapping, exact)
        self.values.append(value)
        return value

    def partner(self, value: Value, *, allow_scalar: bool = True, kinds: str = "any"):
        """A second operand that broadcasts with `value`: a scalar, a value or a new input."""
        rng = self.rng
        choice = rng.random()
        if allow_scalar and choice < 0.3:
            return self.scalar(value.dtype)
        if choice < 0.7:
            other = self.pick(lambda other: other is not value and broadcast(other.shape, value.shape) is not None
                              and (kinds != "float" or is_float(other.dtype)))
            if other is not None:
                return other
        shape = list(value.shape)
        shape = [1 if rng.random() < 0.3 else size for size in shape][rng.choice((0, 0, 1)) if shape else 0:]
        dtype = value.dtype if rng.random() < 0.6 else self.dtype(kinds)
        return self.new_input(tuple(shape), dtype)

    def index_expr(self, shape: tuple, size: int, *, negative_ok: bool) -> str | None:
        """Source of an int64 index tensor of `shape`, computed from an input, in range for a dim of `size`.

        The values lie in [0, size) (or [-size, size) when `negative_ok`): the index input
        has a known range [low, high), and each form below is only used when it maps that
        range inside the allowed one; the `% size` forms always do.
        """
        if size <= 0:
            return None
        rng = self.rng
        low = rng.choice((0, 0, -3, -size))
        high = low + rng.randint(1, 2 * size + 2)
        index = self.new_input(shape, torch.int64, low=low, high=high).name
        least = -size if negative_ok else 0
        offset = rng.randint(-3, 3)
        forms = [(f"({index} + {offset}) % {size}", True), (f"({index} * 2 + {offset}) % {size}", True),
                 (f"{index} % {size}", True),
                 (f"({index} + {offset}) % {size} - {size}", negative_ok),
                 (f"{index} + {offset}", low + offset >= least and high - 1 + offset < size),
                 (f"{index} * 2 - {size}", 2 * low - size >= least and 2 * (high - 1) - size < size),
                 (f"{size - 1} - {index}", size - 1 - (high - 1) >= least and size - 1 - low < size),
                 (f"{index}", low >= least and high <= size)]
        valid = [form for form, ok in forms if ok]
        return "(" + rng.choice(valid) + ")"

    # ------------------------------------------------------------------ op families

    def unary(self) -> bool:
        value = self.pick()
        if value is None:
            return False
        rng, name, dtype = self.rng, value.name, value.dtype
        if is_float(dtype):
            rounding = ["torch.sin({})", "torch.cos({})", "torch.tanh({})", "torch.sigmoid({})", "torch.exp({})",
                        "torch.expm1({})", "torch.log({})", "torch.log1p({})", "torch.sqrt({})", "torch.rsqrt({})",
                        "torch.reciprocal({})", "torch.erf({})", "F.gelu({})", "F.silu({})", "torch.square({})",
                        "{}.pow(2)", "F.softplus({})", "torch.atan({})"]
            exact = ["torch.abs({})", "-{}", "torch.relu({})", "torch.nan_to_num({})", "{}.neg()"]
            discrete = ["torch.floor({})", "torch.ceil({})", "torch.round({})", "torch.trunc({})", "torch.sign({})"]
            tests = ["torch.isnan({})", "torch.isinf({})", "torch.isfinite({})", "torch.signbit({})"]
            choices = [(form, dtype, False) for form in rounding] + [(form, dtype, value.exact) for form in exact]
            if self.discrete_ok(value):
                choices += [(form, dtype, True) for form in discrete] + [(form, torch.bool, True) for form in tests]
        elif is_int(dtype):
            choices = [(form, dtype, True) for form in ("torch.abs({})", "-{}", "torch.sign({})", "torch.relu({})",
                                                        "torch.bitwise_not({})", "torch.square({})")]
            choices += [(form, torch.float32, False) for form in ("torch.sin({})", "torch.exp({})", "torch.sqrt({})",
                                                                  "torch.sigmoid({})")]
        else:
            choices = [(form, torch.bool, True) for form in ("torch.logical_not({})", "torch.sign({})", "~{}")]
            choices += [("torch.sin({})", torch.float32, False)]
        form, out_dtype, exact = rng.choice(choices)
        return self.emit(form.format(name), value.shape, out_dtype, "unary", exact=exact) is not None

    def binary(self) -> bool:
        first = self.pick()
        if first is None:
            return False
        second = self.partner(first)
        rng = self.rng
        second_is_value = isinstance(second, Value)
        second_text = second.name if second_is_value else repr(second)
        shapes = [first.shape] + ([second.shape] if second_is_value else [])
        shape = broadcast(*shapes)
        if shape is None:
            return False
        dtypes = [first.dtype] + ([second.dtype] if second_is_value else [])
        any_bool = any(dtype == torch.bool for dtype in dtypes)
        all_floatless = not any(is_float(dtype) for dtype in dtypes) and not isinstance(second, float)
        both_exact = first.exact and (second.exact if second_is_value else True)
        discrete = self.discrete_ok(first) and (self.discrete_ok(second) if second_is_value else True)
        promoted = promote(first, second)
        options = [("{} + {}", promoted, all_floatless and both_exact), ("{} * {}", promoted, all_floatless and both_exact),
                   ("{} / {}", promoted if is_float(promoted) else torch.float32, False)]
        if not any_bool:
            options.append(("{} - {}", promoted, all_floatless and both_exact))
        if second_is_value:
            options += [("torch.maximum({}, {})", promoted, both_exact), ("torch.minimum({}, {})", promoted, both_exact)]
            if is_float(first.dtype) and is_float(second.dtype):
                options.append(("torch.atan2({}, {})", promoted, False))
        if is_float(first.dtype) and (not second_is_value or is_float(second.dtype)):
            options += [("torch.pow({}, {})", promoted, False), ("torch.remainder({}, {})", promoted, False),
                        ("torch.fmod({}, {})", promoted, False)]
        if is_int(first.dtype) and not second_is_value and isinstance(second, int) and second > 0:
            options.append(("{} % {}", promoted, True))
        if all_floatless and not isinstance(second, float):
            bitwise_dtype = promoted
            options += [("{} & {}", bitwise_dtype, both_exact), ("{} | {}", bitwise_dtype, both_exact),
                        ("{} ^ {}", bitwise_dtype, both_exact)]
        if discrete:
            options += [(form, torch.bool, True) for form in
                        ("{} < {}", "{} <= {}", "{} > {}", "{} >= {}", "{} == {}", "{} != {}")]
            if second_is_value:
                options += [(form, torch.bool, True) for form in
                            ("torch.logical_and({}, {})", "torch.logical_or({}, {})", "torch.logical_xor({}, {})")]
        form, dtype, exact = rng.choice(options)
        family = "compare" if dtype == torch.bool and "logical" not in form else "binary"
        return self.emit(form.format(first.name, second_text), shape, dtype, family, exact=exact) is not None

    def where(self) -> bool:
        first = self.pick()
        if first is None:
            return False
        rng = self.rng
        condition = self.pick(lambda value: value.dtype == torch.bool and broadcast(value.shape, first.shape) is not None)
        if condition is not None and rng.random() < 0.6:
            condition_text, condition_shape = condition.name, condition.shape
        elif self.discrete_ok(first) and first.dtype != torch.bool:
            condition_text, condition_shape = f"{first.name} > {self.scalar(first.dtype)!r}", first.shape
        else:
            return False
        second = self.partner(first)
        second_text = second.name if isinstance(second, Value) else repr(second)
        shapes = [first.shape, condition_shape] + ([second.shape] if isinstance(second, Value) else [])
        shape = broadcast(*shapes)
        if shape is None:
            return False
        exact = first.exact and (second.exact if isinstance(second, Value) else True)
        expr = f"torch.where({condition_text}, {first.name}, {second_text})"
        return self.emit(expr, shape, promote(first, second), "where", exact=exact) is not None

    def clamp(self) -> bool:
        value = self.pick(lambda value: value.dtype != torch.bool)
        if value is None:
            return False
        rng = self.rng
        if is_float(value.dtype):
            low, high = sorted(rng.sample((-2.0, -0.5, 0.0, 0.25, 1.0, 2.5), 2))
        else:
            low, high = sorted(rng.sample((-3, -1, 0, 1, 2, 4), 2))
        forms = [f"torch.clamp({value.name}, min={low!r}, max={high!r})", f"{value.name}.clamp(min={low!r})",
                 f"{value.name}.clamp_max({high!r})", f"{value.name}.clamp({low!r}, {high!r})"]
        bound = self.pick(lambda other: other is not value and other.dtype == value.dtype
                          and broadcast(other.shape, value.shape) == value.shape)
        if bound is not None:
            forms.append(f"torch.clamp({value.name}, min={bound.name})")
        exact = value.exact and (bound is None or bound.exact)
        return self.emit(rng.choice(forms), value.shape, value.dtype, "clamp", exact=exact) is not None

    def cast(self) -> bool:
        value = self.pick()
        if value is None:
            return False
        rng = self.rng
        targets = [dtype for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool)
                   if dtype != value.dtype]
        target = rng.choice(targets)
        method = {torch.float32: ".float()", torch.float16: ".half()", torch.bfloat16: ".bfloat16()",
                  torch.int32: ".int()", torch.int64: ".long()", torch.bool: ".bool()"}[target]
        suffix = rng.choice((method, f".to(torch.{DTYPE_NAMES[target]})"))
        source = value.name
        if is_float(value.dtype) and not is_float(target):
            if not self.discrete_ok(value):
                return False
            if target != torch.bool:  # nan, inf and out-of-range floats have no defined integer value
                source = f"{value.name}.nan_to_num(0.0, 100.0, -100.0).clamp(-100, 100)"
        return self.emit(source + suffix, value.shape, target, "cast", exact=value.exact) is not None

    def reduction(self) -> bool:
        value = self.pick()
        if value is None:
            return False
        rng, dtype = self.rng, value.dtype
        if is_float(dtype):
            kinds = ["sum", "mean", "amax", "amin", "prod", "var", "std", "any", "all", "logsumexp"]
            if self.discrete_ok(value):
                kinds.append("argmax")
        elif is_int(dtype):
            kinds = ["sum", "amax", "amin", "argmax", "any", "all"]
        else:
            kinds = ["sum", "any", "all"]
        kind = rng.choice(kinds)
        single_dim = kind in ("argmax", "prod")
        keepdim = rng.random() < 0.5
        if value.rank == 0 or rng.random() < 0.2:
            dims = None
        else:
            count = 1 if single_dim or value.rank == 1 else rng.choice((1, 1, 2))
            dims = sorted(rng.sample(range(value.rank), count))
        if kind == "logsumexp" and dims is None:
            dims = list(range(value.rank))
            if not dims:
                return False
        reduced = range(value.rank) if dims is None else dims
        if kind in ("amax", "amin", "argmax") and any(value.shape[dim] == 0 for dim in reduced):
            return False  # a max over no elements is an error
        if dims is None:
            shape = ()
            args = ""
        else:
            shape = tuple((1 if keepdim else None) if dim in dims else size for dim, size in enumerate(value.shape))
            shape = tuple(size for size in shape if size is not None)
            written = [dim - value.rank if rng.random() < 0.3 else dim for dim in dims]
            dim_text = str(written[0]) if len(written) == 1 else shape_text(written)
            keyword = rng.random() < 0.5 or kind in ("var", "std")  # var(dim, True, correction=) is no overload
            args = f"dim={dim_text}" + (", keepdim=True" if keepdim else "") if keyword else \
                dim_text + (", True" if keepdim else "")
        if kind in ("var", "std"):
            args += ("" if not args else ", ") + f"correction={rng.choice((0, 1))}"
        out_dtype = {"sum": torch.int64 if not is_float(dtype) else dtype, "prod": dtype, "argmax": torch.int64,
                     "any": torch.bool, "all": torch.bool}.get(kind, dtype)
        exact = value.exact and (kind in ("amax", "amin", "argmax", "any", "all") or not is_float(dtype))
        expr = f"{value.name}.{kind}({args})" if rng.random() < 0.6 else \
            f"torch.{kind}({value.name}{', ' + args if args else ''})"
        return self.emit(expr, shape, out_dtype, "reduction", exact=exact) is not None

    def normalization(self) -> bool:
        value = self.pick(lambda value: is_float(value.dtype) and value.rank >= 1 and value.shape[-1] > 0)
        if value is None:
            return False
        rng, name = self.rng, value.name
        last = value.shape[-1]
        dim = rng.randrange(-value.rank, value.rank)
        forms = [f"torch.softmax({name}, dim={dim})", f"F.log_softmax({name}, dim={dim})", f"{name}.softmax({dim})",
                 f"F.layer_norm({name}, {shape_text((last,))})", f"F.rms_norm({name}, {shape_text((last,))})",
                 f"({name} - {name}.mean(-1, keepdim=True)) / torch.sqrt({name}.var(-1, keepdim=True, correction=0)"
                 f" + 1e-5)",
                 f"{name} * torch.rsqrt({name}.pow(2).mean(-1, keepdim=True) + 1e-6)"]
        form = rng.choice(forms)
        if ("layer_norm" in form or "rms_norm" in form) and rng.random() < 0.5:
            weight = self.new_input((last,), value.dtype).name
            if "layer_norm" in form:
                bias = self.new_input((last,), value.dtype).name
                form = form[:-1] + f", {weight}, {bias})"
            else:
                form = form[:-1] + f", {weight})"
        return self.emit(form, value.shape, value.dtype, "normalization") is not None

    def view(self) -> bool:
        value = self.pick()
        if value is None:
            return False
        rng, name, shape, rank = self.rng, value.name, list(value.shape), value.rank
        options = ["reshape", "unsqueeze", "expand", "contiguous"]
        if rank >= 1:
            options += ["slice", "select", "narrow", "flip", "roll", "flatten"]
        if rank >= 2:
            options += ["permute", "transpose", "transpose", "movedim"]
        if 1 in shape:
            options.append("squeeze")
        kind = rng.choice(options)
        exact = value.exact
        if kind == "permute":
            order = list(range(rank))
            while order == sorted(order):
                rng.shuffle(order)
            return self.emit(f"{name}.permute{shape_text(order)}", [shape[dim] for dim in order], value.dtype, "view",
                             view_of=value, exact=exact) is not None
        if kind == "transpose":
            first, second = rng.sample(range(rank), 2)
            shape[first], shape[second] = shape[second], shape[first]
            if rank == 2 and rng.random() < 0.3:
                expr = f"{name}.t()"
            elif rng.random() < 0.2 and {first, second} == {rank - 1, rank - 2}:
                expr = f"{name}.mT"
            else:
                expr = f"{name}.transpose({first}, {second - rank if rng.random() < 0.3 else second})"
            return self.emit(expr, shape, value.dtype, "view", view_of=value, exact=exact) is not None
        if kind == "movedim":
            source, destination = rng.sample(range(rank), 2)
            size = shape.pop(source)
            shape.insert(destination, size)
            return self.emit(f"{name}.movedim({source}, {destination})", shape, value.dtype, "view",
                             view_of=value, exact=exact) is not None
        if kind == "reshape":
            new_shape = self.reshaped(shape)
            if new_shape is None:
                return False
            written = list(new_shape)
            if value.numel > 0 and written and rng.random() < 0.4:
                written[rng.randrange(len(written))] = -1
            return self.emit(f"{name}.reshape{shape_text(written)}", new_shape, value.dtype, "view",
                             view_of=value, exact=exact) is not None
        if kind == "flatten":
            start = rng.randrange(rank)
            end = rng.randrange(start, rank)
            new_shape = shape[:start] + [math.prod(shape[start:end + 1])] + shape[end + 1:]
            return self.emit(f"{name}.flatten({start}, {end})", new_shape, value.dtype, "view",
                             view_of=value, exact=exact) is not None
        if kind == "unsqueeze":
            dim = rng.randint(-rank - 1, rank)
            position = dim if dim >= 0 else dim + rank + 1
            shape.insert(position, 1)
            return self.emit(f"{name}.unsqueeze({dim})", shape, value.dtype, "view", view_of=value,
                             exact=exact) is not None
        if kind == "squeeze":
            ones = [dim for dim, size in enumerate(shape) if size == 1]
            if rng.random() < 0.3:
                return self.emit(f"{name}.squeeze()", [size for size in shape if size != 1], value.dtype, "view",
                                 view_of=value, exact=exact) is not None
            dim = rng.choice(ones)
            shape.pop(dim)
            return self.emit(f"{name}.squeeze({dim})", shape, value.dtype, "view", view_of=value,
                             exact=exact) is not None
        if kind == "expand":
            new_shape = [self.size() if size == 1 and rng.random() < 0.7 else size for size in shape]
            leading = [self.size() for _ in range(rng.choice((0, 0, 1)))]
            if new_shape == shape and not leading:
                return False
            written = leading + [-1 if new == old and rng.random() < 0.5 else new for new, old in zip(new_shape, shape)]
            grows = any(size > 1 for size in leading) or any(new > old for new, old in zip(new_shape, shape))
            return self.emit(f"{name}.expand{shape_text(written)}", leading + new_shape, value.dtype, "view",
                             view_of=value, overlapping=grows, exact=exact) is not None
        if kind == "contiguous":
            if rank == 4 and rng.random() < 0.5:
                return self.emit(f"{name}.contiguous(memory_format=torch.channels_last)", shape, value.dtype, "view",
                                 view_of=value, exact=exact) is not None
            return self.emit(f"{name}.contiguous()", shape, value.dtype, "view", view_of=value,
                             exact=exact) is not None
        dim = rng.randrange(rank)
        size = shape[dim]
        if kind == "slice":
            step = rng.choice((1, 2, 2, 3))
            start = rng.choice((None, 0, 1, -1, -2, size // 2))
            stop = rng.choice((None, None, -1, size - 1, 1))
            if step == 1 and start in (None, 0) and stop is None:
                start = 1
            shape[dim] = len(range(*slice(start, stop, step).indices(size)))
            text = ("" if start is None else str(start)) + ":" + ("" if stop is None else str(stop)) \
                + ("" if step == 1 else f":{step}")
            prefix = "..., " if dim == rank - 1 and rank > 1 and rng.random() < 0.5 else ":, " * dim
            return self.emit(f"{name}[{prefix}{text}]", shape, value.dtype, "view", view_of=value,
                             exact=exact) is not None
        if kind == "select":
            if size == 0:
                return False
            index = rng.randint(-size, size - 1)
            if rng.random() < 0.6 and index >= 0:
                index -= size
            shape.pop(dim)
            expr = f"{name}[{':, ' * dim}{index}]" if rng.random() < 0.7 else f"{name}.select({dim}, {index})"
            return self.emit(expr, shape, value.dtype, "view", view_of=value, exact=exact) is not None
        if kind == "narrow":
            start = rng.randint(0, size)
            length = rng.randint(0, size - start)
            shape[dim] = length
            return self.emit(f"{name}.narrow({dim}, {start}, {length})", shape, value.dtype, "view",
                             view_of=value, exact=exact) is not None
        if kind == "flip":
            dims = sorted(rng.sample(range(rank), rng.randint(1, rank)))
            expr = f"{name}.flip({dims[0]})" if len(dims) == 1 else f"torch.flip({name}, {shape_text(dims)})"
            return self.emit(expr, shape, value.dtype, "flip", exact=exact) is not None
        if kind == "roll":
            if value.numel == 0:
                return False
            shift = rng.choice((1, -1, 2, 3, -4))
            if rng.random() < 0.2:
                expr = f"{name}.roll({shift})"
            elif rank >= 2 and rng.random() < 0.3:
                expr = f"torch.roll({name}, ({shift}, 1), (0, {rank - 1}))"
            else:
                expr = f"torch.roll({name}, shifts={shift}, dims={dim})"
            return self.emit(expr, shape, value.dtype, "roll", exact=exact) is not None
        return False

    def reshaped(self, shape: list) -> tuple | None:
        """A different shape with as many elements: dims merged, split, or 1s inserted."""
        rng = self.rng
        choice = rng.random()
        if choice < 0.25 and shape:
            return (math.prod(shape),) if len(shape) > 1 else None
        if choice < 0.5 and len(shape) >= 2:
            dim = rng.randrange(len(shape) - 1)
            return tuple(shape[:dim] + [shape[dim] * shape[dim + 1]] + shape[dim + 2:])
        if choice < 0.8 and shape:
            dim = rng.randrange(len(shape))
            size = shape[dim]
            factors = [factor for factor in (2, 3, 4) if size > factor and size % factor == 0] or [1]
            factor = rng.choice(factors)
            return tuple(shape[:dim] + [factor, size // factor] + shape[dim + 1:])
        position = rng.randint(0, len(shape))
        return tuple(shape[:position] + [1] + shape[position:])

    def cat(self) -> bool:
        value = self.pick(lambda value: value.rank >= 1)
        if value is None:
            return False
        rng = self.rng
        dim = rng.randrange(value.rank)
        others = self.pick(lambda other: other.rank == value.rank and all(
            other.shape[axis] == value.shape[axis] for axis in range(value.rank) if axis != dim))
        choice = rng.random()
        if others is not None and choice < 0.4:
            parts = [value.name, others.name]
            sizes, dtypes, exact = [value.shape[dim], others.shape[dim]], [value.dtype, others.dtype], value.exact and others.exact
        elif choice < 0.7:
            scaled = f"2 * {value.name}" if value.dtype != torch.bool else f"~{value.name}"
            parts = [value.name, scaled]
            sizes, dtypes, exact = [value.shape[dim]] * 2, [value.dtype, promote(value, 2)], value.exact
            if value.dtype == torch.bool:
                dtypes = [torch.bool, torch.bool]
        else:
            shape = list(value.shape)
            shape[dim] = self.size()
            other = self.new_input(tuple(shape), value.dtype if rng.random() < 0.7 else self.dtype())
            parts = [value.name, other.name]
            sizes, dtypes, exact = [value.shape[dim], shape[dim]], [value.dtype, other.dtype], value.exact
        if rng.random() < 0.2:
            parts.append(value.name)
            sizes.append(value.shape[dim])
            dtypes.append(value.dtype)
        dtype = dtypes[0]
        for other_dtype in dtypes[1:]:
            dtype = torch.promote_types(dtype, other_dtype)
        shape = list(value.shape)
        shape[dim] = sum(sizes)
        written_dim = dim - value.rank if rng.random() < 0.3 else dim
        expr = f"torch.cat([{', '.join(parts)}], {'dim=' if rng.random() < 0.5 else ''}{written_dim})"
        return self.emit(expr, shape, dtype, "cat", exact=exact) is not None

    def stack(self) -> bool:
        value = self.pick()
        if value is None:
            return False
        rng = self.rng
        other = self.pick(lambda other: other is not value and other.shape == value.shape)
        if other is not None and rng.random() < 0.5:
            second, second_dtype, exact = other.name, other.dtype, value.exact and other.exact
        elif rng.random() < 0.5:
            if value.dtype == torch.bool:
                second, second_dtype = f"~{value.name}", torch.bool
            else:
                second, second_dtype = f"{value.name} * 2", promote(value, 2)
            exact = value.exact
        else:
            created = self.new_input(value.shape, value.dtype)
            second, second_dtype, exact = created.name, created.dtype, value.exact
        dim = rng.randint(-value.rank - 1, value.rank)
        shape = list(value.shape)
        shape.insert(dim if dim >= 0 else dim + value.rank + 1, 2)
        return self.emit(f"torch.stack([{value.name}, {second}], {dim})", shape,
                         torch.promote_types(value.dtype, second_dtype), "stack", exact=exact) is not None

    def pad(self) -> bool:
        value = self.pick(lambda value: value.rank >= 1 and value.dtype != torch.bool)
        if value is None:
            return False
        rng = self.rng
        count = rng.randint(1, min(value.rank, 3))
        pads, shape = [], list(value.shape)
        for position in range(count):
            dim = value.rank - 1 - position
            size = shape[dim]
            low, high = rng.choice((0, 0, 1, 2, 3, -1)), rng.choice((0, 1, 2, -1))
            if size + low + high < 0 or low < -size or high < -size:
                low, high = 0, 1
            pads += [low, high]
            shape[dim] = size + low + high
        fill = ""
        if rng.random() < 0.4:
            fill = f", value={rng.choice((0.5, -2.0, 1.0)) if is_float(value.dtype) else rng.choice((1, -3))!r}"
        return self.emit(f"F.pad({value.name}, {shape_text(pads)}{fill})", shape, value.dtype, "pad",
                         exact=value.exact) is not None

    def matmul(self) -> bool:
        value = self.pick(lambda value: is_float(value.dtype) and 1 <= value.rank <= 3)
        if value is None:
            return False
        rng, name, shape = self.rng, value.name, value.shape
        if value.rank >= 2 and rng.random() < 0.3:
            if rng.random() < 0.5:
                return self.emit(f"{name} @ {name}.mT", shape[:-1] + (shape[-2],), value.dtype, "matmul") is not None
            return self.emit(f"{name}.mT @ {name}", shape[:-2] + (shape[-1], shape[-1]), value.dtype,
                             "matmul") is not None
        columns = self.size()
        if value.rank == 3 and rng.random() < 0.5:
            other = self.new_input((shape[0], shape[2], columns), value.dtype)
            return self.emit(f"torch.bmm({name}, {other.name})", (shape[0], shape[1], columns), value.dtype,
                             "matmul") is not None
        other = self.new_input((shape[-1], columns), value.dtype)
        form = rng.choice(("{} @ {}", "torch.matmul({}, {})") + (("torch.mm({}, {})",) if value.rank == 2 else ()))
        return self.emit(form.format(name, other.name), shape[:-1] + (columns,), value.dtype, "matmul") is not None

    def indexing(self) -> bool:
        value = self.pick(lambda value: value.rank >= 1)
        if value is None:
            return False
        rng, name, shape = self.rng, value.name, list(value.shape)
        kind = rng.choice(("index_select", "gather", "embedding", "getitem", "getitem"))
        dim = rng.randrange(value.rank)
        size = shape[dim]
        if kind == "embedding":
            if value.rank != 2 or not is_float(value.dtype):
                kind = "getitem"
            else:
                index_shape = self.shape(rng.choice((1, 2)))
                index = self.index_expr(index_shape, shape[0], negative_ok=False)
                if index is None:
                    return False
                return self.emit(f"F.embedding({index}, {name})", index_shape + (shape[1],), value.dtype,
                                 "indexing", exact=value.exact) is not None
        if kind == "index_select":
            count = self.size()
            index = self.index_expr((count,), size, negative_ok=False)
            if index is None:
                return False
            shape[dim] = count
            expr = f"torch.index_select({name}, {dim}, {index})" if rng.random() < 0.5 else \
                f"{name}.index_select({dim}, {index})"
            return self.emit(expr, shape, value.dtype, "indexing", exact=value.exact) is not None
        if kind == "gather":
            index_shape = tuple(self.size() if axis == dim else rng.randint(min(1, extent), extent)
                                for axis, extent in enumerate(shape))
            index = self.index_expr(index_shape, size, negative_ok=False)
            if index is None:
                return False
            expr = f"torch.gather({name}, {dim}, {index})" if rng.random() < 0.5 else f"{name}.gather({dim}, {index})"
            return self.emit(expr, index_shape, value.dtype, "indexing", exact=value.exact) is not None
        dim = 0 if value.rank == 1 or rng.random() < 0.6 else 1
        size = shape[dim]
        index_shape = self.shape(rng.choice((1, 1, 2)))
        index = self.index_expr(index_shape, size, negative_ok=True)
        if index is None:
            return False
        new_shape = shape[:dim] + list(index_shape) + shape[dim + 1:]
        return self.emit(f"{name}[{':, ' * dim}{index}]", new_shape, value.dtype, "indexing",
                         exact=value.exact) is not None

    def inplace(self) -> bool:
        names = {statement.target for statement in self.statements}
        target = self.pick(lambda value: value.base in names and not value.overlapping)
        if target is None:
            return False
        rng = self.rng
        name, shape, dtype = target.name, list(target.shape), target.dtype
        view_of = target
        if target.rank >= 1 and shape[-1] > 1 and rng.random() < 0.3:  # write through a view
            if rng.random() < 0.5:
                name = f"{name}[..., ::2]"
                shape[-1] = len(range(0, shape[-1], 2))
            else:
                name = f"{name}[{':, ' * (target.rank - 1)}-1]"
                shape.pop()
        shape = tuple(shape)

        def fits(other: Value) -> bool:
            return (other.base != target.base and broadcast(other.shape, shape) == shape
                    and torch.can_cast(promote(target, other), dtype))

        other = self.pick(fits)
        options = []
        if dtype == torch.bool:
            options += [f"{name}.logical_not_()", f"{name}.masked_fill_({{mask}}, True)"]
        else:
            scalar = self.scalar(dtype) if dtype != torch.bool else True
            options += [f"{name}.add_({scalar!r})", f"{name}.mul_({scalar!r})", f"{name}.masked_fill_({{mask}}, {scalar!r})"]
            low, high = (-1.0, 1.5) if is_float(dtype) else (-2, 3)
            options += [f"{name}.clamp_({low!r}, {high!r})", f"{name}.clamp_(min={low!r})"]
            if is_float(dtype):
                options += [f"{name}.relu_()", f"{name}.neg_()", f"{name}.div_(2.0)"]
        if other is not None:
            options += [f"{name}.copy_({other.name})"]
            if dtype != torch.bool:
                options += [f"{name}.add_({other.name})", f"{name}.mul_({other.name})"]
        form = rng.choice(options)
        reads_other = other is not None and form.endswith(f"({other.name})")
        if "{mask}" in form:
            mask = self.pick(lambda value: value.dtype == torch.bool and broadcast(value.shape, shape) == shape)
            if mask is None:
                return False
            form = form.format(mask=mask.name)
        exact = target.exact and (not reads_other or other.exact)
        if is_float(dtype) and any(op in form for op in (".add_(", ".mul_(", ".div_(")):
            exact = False
        return self.emit(form, shape, dtype, "inplace", view_of=view_of, exact=exact) is not None


# (weight, family): the order is part of the seed -> program mapping (see the module docstring).
_FAMILIES = ((12, _Builder.unary), (18, _Builder.binary), (6, _Builder.where), (4, _Builder.clamp),
             (7, _Builder.cast), (12, _Builder.reduction), (6, _Builder.normalization), (16, _Builder.view),
             (4, _Builder.cat), (3, _Builder.stack), (4, _Builder.pad), (3, _Builder.matmul),
             (8, _Builder.indexing), (7, _Builder.inplace))


def generate(seed: int, index: int) -> Program:
    """Program `index` of the run with `seed`: the same text for the same pair, always."""
    builder = _Builder(seed, index)
    rng = builder.rng
    for position in range(rng.choice((1, 1, 2, 3))):
        builder.new_input(builder.shape(), builder.dtype("float" if position == 0 else "any"))
    wanted = rng.randint(4, 25)
    weights = [weight for weight, _ in _FAMILIES]
    attempts = 0
    while len(builder.statements) < wanted and attempts < 20 * wanted:
        attempts += 1
        family = rng.choices(_FAMILIES, weights)[0][1]
        family(builder)
    made = [statement.target for statement in builder.statements]
    outputs = [made[-1]]
    for _ in range(rng.choice((0, 1, 1, 2))):
        extra = rng.choice(made)
        if extra not in outputs:
            outputs.append(extra)
    return Program(seed, index, tuple(builder.inputs), tuple(builder.statements), tuple(outputs))


__all__ = ["GENERATOR_VERSION", "generate", "promote", "DTYPES"]
