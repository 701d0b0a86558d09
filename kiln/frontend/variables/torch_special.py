"""torch (and a few library) callables the interpreter models instead of calling or inlining.

- "am I compiling?" queries: `torch.compiler.is_compiling()` is True inside a kiln
  trace (libraries use it to pick compile-friendly code paths); scripting/tracing
  queries are False.
- grad mode and autocast as context managers (`no_grad`, `enable_grad`,
  `set_grad_enabled`, `autocast`): entering one changes the mode for the rest of
  the trace (so fake tensors see it) and puts the same change into the graph;
  profiler ranges (`record_function`) are dropped, as Dynamo drops them.
- constant constructors (`torch.Size`, `torch.device`, `torch.finfo`, ...) run at
  trace time on constant arguments.
- `warnings.warn`, loggers and the `logging` module's functions are recorded and
  replayed after the graph, in program order, from the location Python would name
  (kiln/frontend/replay.py); a logger's level checks are guarded.

The table of handled callables is registered with `builder.register_call_handlers`:
functions and classes find their handler there when called (`builder.call_handler`),
without importing this module, which sits above them.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import typing
import warnings
from typing import Any, Callable

import torch

from kiln.frontend import replay
from kiln.frontend.errors import ProgramException, Unsupported, unbreakable
from kiln.frontend.variables import builder
from kiln.frontend.variables.base import NONE, ConstantVariable, TrackerMethod, Variable
from kiln.frontend.variables.containers import ListVariable, TupleVariable
from kiln.frontend.variables.functions import BoundMethodVariable
from kiln.frontend.variables.modules import _MODULE_CALLS, ModuleVariable, call_module
from kiln.frontend.variables.objects import ExceptionVariable
from kiln.frontend.variables.tensor import TensorVariable


def _constant(value):
    return lambda tx, args, kwargs: ConstantVariable(value)


def _constant_call(fn):
    def handler(tx, args, kwargs):
        try:
            values = [arg.as_constant() for arg in args]
            keywords = {key: arg.as_constant() for key, arg in kwargs.items()}
        except Unsupported:
            raise Unsupported(f"{fn.__qualname__} with non-constant arguments") from None
        return ConstantVariable(fn(*values, **keywords))

    return handler


def _grad_mode(enabled: bool):
    return lambda tx, args, kwargs: GradModeVariable(enabled)


def _set_grad_enabled(tx, args, kwargs):
    mode = GradModeVariable(bool((args[0] if args else kwargs["mode"]).as_constant()))
    mode.apply_now(tx)  # set_grad_enabled(False) as a call takes effect at once, even outside `with`
    return mode


def _is_grad_enabled(tx, args, kwargs):
    return ConstantVariable(torch.is_grad_enabled())


def _inference_mode(tx, args, kwargs):
    """torch.inference_mode(mode=True)."""
    mode = kwargs.get("mode", args[0] if args else ConstantVariable(True))
    return InferenceModeVariable(bool(mode.as_constant()))


def _is_inference_mode_enabled(tx, args, kwargs):
    tx.output.guard_inference_mode()
    return ConstantVariable(tx.output.inference_mode)


def _is_inference(tx, args, kwargs):
    """torch.is_inference(t), as t.is_inference()."""
    if len(args) != 1 or kwargs or not isinstance(args[0], TensorVariable):
        raise Unsupported("torch.is_inference() of other than one tensor")
    return args[0].call_method(tx, "is_inference", [], {})


def _autocast(tx, args, kwargs):
    values = [arg.as_constant() for arg in args]
    keywords = {key: arg.as_constant() for key, arg in kwargs.items()}
    return AutocastVariable(torch.autocast(*values, **keywords))


def _warn(tx, args, kwargs):
    """warnings.warn(message, category=None, stacklevel=1, source=None, *, skip_file_prefixes=()).

    A warning names its caller's line, so it never becomes a graph break (called from an entry
    function it would name the entry's): what cannot be replayed runs the frame eagerly."""
    with unbreakable():
        return _replay_warning(tx, args, kwargs)


def _replay_warning(tx, args, kwargs):
    parameters = _bind("warnings.warn", ("message", "category", "stacklevel", "source"), args, kwargs,
                       ("skip_file_prefixes",))
    message = parameters["message"]
    category = parameters.get("category", NONE).as_constant()
    stacklevel = parameters.get("stacklevel", ConstantVariable(1)).as_constant()
    if parameters.get("source", NONE).as_constant() is not None or \
            parameters.get("skip_file_prefixes", ConstantVariable(())).as_constant():
        raise Unsupported("warnings.warn with source= or skip_file_prefixes=")
    if isinstance(message, ExceptionVariable) and issubclass(message.cls, Warning):
        message_value = message.cls(*[replay.snapshot(arg, "warnings.warn").value for arg in message.args])
    else:
        message_value = replay.snapshot(message, "warnings.warn").value
    if isinstance(message_value, Warning):
        category = type(message_value)
    elif category is None:
        category = UserWarning
    if not (isinstance(category, type) and issubclass(category, Warning)):
        raise Unsupported(f"warnings.warn with category {category!r}, not a Warning subclass (the program raises "
                          "TypeError)")
    if type(stacklevel) is not int:
        raise Unsupported(f"warnings.warn with stacklevel={stacklevel!r}")
    filename, lineno, _, module_globals = replay.caller_location(tx, stacklevel, "warnings.warn")
    held = [replay.HeldValue(value) for value in (message_value, category, filename, lineno, module_globals)]
    tx.output.side_effects.replay_call(replay.warn, held, {})
    return NONE


def _bind(name: str, positional: tuple[str, ...], args, kwargs, keyword_only: tuple[str, ...] = ()) -> dict:
    """A builtin's arguments by parameter name (refusing what Python would reject)."""
    if len(args) > len(positional):
        raise Unsupported(f"{name}() with {len(args)} positional arguments (the program raises TypeError)")
    bound = dict(zip(positional, args))
    for key, value in kwargs.items():
        if key in bound or key not in positional + keyword_only:
            raise Unsupported(f"{name}() with keyword argument {key!r} (the program raises TypeError)")
        bound[key] = value
    if positional and positional[0] not in bound:
        raise Unsupported(f"{name}() without {positional[0]!r} (the program raises TypeError)")
    return bound


def _get_logger(tx, args, kwargs):
    """logging.getLogger(name): the logger itself (made now if new, as the call would make it)."""
    name = args[0].as_constant() if args else kwargs.get("name", NONE).as_constant()
    if name is not None and not isinstance(name, str):
        raise Unsupported(f"logging.getLogger({name!r})")
    return LoggerVariable(logging.getLogger(name))


def _logging_function(method: str):
    """logging.warning(...) and friends: the root logger's method, configuring it first if it has no handler."""
    def handler(tx, args, kwargs):
        return LoggerVariable(logging.root).log_call(tx, method, args, kwargs, configure_root=True)

    return handler


def _cast(tx, args, kwargs):
    return args[1]


def _module_call(tx, args, kwargs):
    if not args or not isinstance(args[0], ModuleVariable):
        raise Unsupported("nn.Module.__call__ on something that is not a module")
    return call_module(tx, args[0], list(args[1:]), kwargs, own_call=True)


def _check(tx, args, kwargs):
    condition = args[0]
    if condition.is_constant() and condition.as_constant():
        return NONE
    raise Unsupported("torch._check on a value not known at trace time")


def real_callable(variable: Variable) -> Any:
    """The real Python callable a tracker stands for (for introspection such as inspect.signature)."""
    if isinstance(variable, BoundMethodVariable):
        import types

        return types.MethodType(real_callable(variable.function), real_callable(variable.bound_self))
    for attribute in ("fn", "value"):
        if hasattr(variable, attribute):
            return getattr(variable, attribute)
    raise Unsupported(f"introspecting {variable.describe()}")


def _signature(tx, args, kwargs):
    return ConstantVariable(inspect.signature(real_callable(args[0])))


def _nullcontext(tx, args, kwargs):
    return NullContextVariable(args[0] if args else kwargs.get("enter_result", NONE))  # (the keyword was dropped)


class InlineFunctionContext:
    """The `ctx` of a torch.autograd.Function's forward traced inline where no gradient can flow
    (`_autograd_function_apply`): it keeps what the forward stores on it and records nothing for a backward."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


def _autograd_function_apply(tx, args, kwargs):
    """`Fn.apply(*args)` for a torch.autograd.Function: where no gradient can flow (grad mode off, or no tensor
    argument requires grad) its forward is traced inline, under no_grad as autograd runs it, with a context
    that records nothing (the custom backward can never run). Where one can, `Fn.apply` is one node of the
    graph (its arguments tensors and constants): AOTAutograd runs its forward, and traces its own backward
    into the backward graph."""
    cls_variable, *arguments = args
    cls = cls_variable.as_constant()
    leaves = [*arguments, *kwargs.values()]
    leaves = [item for leaf in leaves for item in (leaf.unpack(tx) if isinstance(leaf, (TupleVariable, ListVariable))
                                                    else [leaf])]
    opaque = any(not isinstance(leaf, TensorVariable) and not leaf.is_constant() for leaf in leaves)
    if torch.is_grad_enabled() and (opaque or any(isinstance(leaf, TensorVariable) and leaf.fake.requires_grad
                                                  for leaf in leaves)):
        if opaque:
            raise Unsupported(f"{cls.__qualname__}.apply where a gradient can flow, with arguments other than "
                              "tensors and constants (it runs in Python, with its own backward)")
        # Fn.apply itself in the graph: AOTAutograd traces its forward, and its backward into the joint graph
        return tx.output.call_tensor_op(tx, "call_function", cls.apply, list(arguments), dict(kwargs))
    forward = cls_variable.getattr(tx, "forward")
    no_grad = GradModeVariable(False)
    no_grad.enter(tx)
    try:
        if _setup_context_defined(cls):  # forward(*args); setup_context only fills ctx for a backward
            result = forward.call(tx, arguments, kwargs)
        else:
            needs_input_grad = ConstantVariable(tuple(False for _ in arguments))
            ctx = tx.wrap(InlineFunctionContext, None, guard=False).call(tx, [needs_input_grad], {})
            result = forward.call(tx, [ctx, *arguments], kwargs)
    except ProgramException:
        no_grad.exit(tx)
        raise
    no_grad.exit(tx)
    return result


def _setup_context_defined(cls: type) -> bool:
    base = inspect.getattr_static(torch.autograd.function._SingleLevelFunction, "setup_context")
    return inspect.getattr_static(cls, "setup_context") is not base


def _record_function(tx, args, kwargs):
    """`torch.profiler.record_function(name)`: a profiler range, which a trace drops (as Dynamo's does): the
    compiled code runs no range of its own, and a break inside the block resumes like one in a nullcontext."""
    return NullContextVariable(NONE)


def _foreach_pointwise_with_tensor_scalars(tx, name: str, args: list, kwargs: dict) -> Variable:
    """`torch._foreach_addcdiv_(xs, as, bs, scalars)` (or addcmul, in place or not) with `scalars` a 1-D tensor
    (torch.optim's foreach Adam while compiling: `_stack_if_compiling` stacks the step sizes). torch's fake kernel
    refuses a CPU scalars tensor ("Expected scalars to be on CPU, got meta"), so the call is decomposed into foreach
    ops on tensor lists: `xs + [a / b for a, b] * scalars.unbind()`, every element in the graph."""
    output = tx.output
    operands = list(args) + [kwargs[key] for key in ("scalars",) if key in kwargs]
    scalars = operands[3] if len(operands) == 4 else None
    if not isinstance(scalars, TensorVariable) or len(kwargs) > 1 or set(kwargs) - {"scalars"} or \
            scalars.fake.dim() != 1:
        raise Unsupported(f"torch.{name}() with these arguments ({', '.join(arg.describe() for arg in operands)})")
    combine = torch._foreach_div if "addcdiv" in name else torch._foreach_mul
    terms = output.call_tensor_op(tx, "call_function", combine, operands[1:3], {})
    parts = output.call_tensor_op(tx, "call_function", torch.unbind, [scalars], {})
    scaled = output.call_tensor_op(tx, "call_function", torch._foreach_mul, [terms, ListVariable(parts.unpack(tx))],
                                   {})
    add = torch._foreach_add_ if name.endswith("_") else torch._foreach_add
    return output.call_tensor_op(tx, "call_function", add, [operands[0], scaled], {})


def _foreach_with_scalars(name: str) -> Callable:
    """A foreach addcdiv/addcmul: as it is, unless its `scalars` are a tensor (decomposed, above)."""
    function = getattr(torch, name)

    def handler(tx, args, kwargs):
        scalars = args[3] if len(args) == 4 else kwargs.get("scalars")
        if isinstance(scalars, TensorVariable):
            return _foreach_pointwise_with_tensor_scalars(tx, name, args, kwargs)
        return tx.output.call_tensor_op(tx, "call_function", function, list(args), kwargs)

    return handler


def _optimizer_value(tx, args, kwargs):
    """torch.optim's `_get_value(step)`: eagerly `step.item()`, a Python float, so the bias corrections that follow
    (`1 - beta2 ** step`, `lr / ...`) are double-precision arithmetic. While compiling torch returns the tensor
    itself, and those corrections become float32 tensor math, whose cancellation in `1 - 0.999 ** step` costs about
    1e-4 of relative error (parameters drift from eager's by several times eager's own rounding). In the graph it is
    the number `.item()` gives: the tensor detached, as a 0-d float64 tensor, so the arithmetic on it is eager's,
    and where it meets a float32 tensor it is rounded to float32 as eager's Python float is. A step that is not a
    floating-point number (an int or bool, whose Python arithmetic a tensor's would not follow) is unsupported."""
    value = args[0] if args else kwargs.get("x")
    if not isinstance(value, TensorVariable):
        return value
    if value.fake.numel() != 1 or not value.fake.is_floating_point():
        raise Unsupported(f"torch.optim's _get_value() of {value.describe()}: kiln models it only for a one-element "
                          "floating-point tensor (a Python float, read as a float64 tensor in the graph)")
    output = tx.output
    number = output.call_tensor_op(tx, "call_method", "detach", [value], {})
    if value.fake.dim() != 0:
        number = output.call_tensor_op(tx, "call_method", "reshape", [number, ConstantVariable(())], {})
    return output.call_tensor_op(tx, "call_method", "to", [number, ConstantVariable(torch.float64)], {})


def _build_table() -> dict[Any, Callable]:
    table: dict[Any, Callable] = {
        torch.compiler.is_compiling: _constant(True),
        torch.compiler.is_dynamo_compiling: _constant(True),
        torch._dynamo.is_compiling: _constant(True),
        torch.jit.is_scripting: _constant(False),
        torch.jit.is_tracing: _constant(False),
        torch._C._get_tracing_state: _constant(None),
        torch.no_grad: _grad_mode(False),
        torch.enable_grad: _grad_mode(True),
        torch.set_grad_enabled: _set_grad_enabled,
        torch.is_grad_enabled: _is_grad_enabled,
        torch.inference_mode: _inference_mode,
        torch.is_inference_mode_enabled: _is_inference_mode_enabled,
        torch.is_inference: _is_inference,
        torch.autocast: _autocast,
        torch.amp.autocast: _autocast,
        torch.Size: _constant_call(torch.Size),
        torch.device: _constant_call(torch.device),
        torch.finfo: _constant_call(torch.finfo),
        torch.iinfo: _constant_call(torch.iinfo),
        torch.get_default_dtype: _constant_call(torch.get_default_dtype),
        torch.is_autocast_enabled: _constant_call(torch.is_autocast_enabled),
        torch._check: _check,
        torch._assert: _check,
        warnings.warn: _warn,
        logging.getLogger: _get_logger,
        typing.cast: _cast,
        contextlib.nullcontext: _nullcontext,
        torch.autograd.profiler.record_function: _record_function,
        inspect.getattr_static(torch.autograd.Function, "apply").__func__: _autograd_function_apply,
        inspect.signature: _signature,
    }
    from torch.optim import optimizer  # the table is built on the first call, after torch's own imports

    table[optimizer._get_value] = _optimizer_value
    for name in ("_foreach_addcdiv_", "_foreach_addcdiv", "_foreach_addcmul_", "_foreach_addcmul"):
        table[getattr(torch, name)] = _foreach_with_scalars(name)
    for method in (*_LOG_LEVELS, "log"):
        if hasattr(logging, method):
            table[getattr(logging, method)] = _logging_function(method)
    for fn in _MODULE_CALLS:
        table[fn] = _module_call
    fx_tracing = getattr(torch.fx._symbolic_trace, "is_fx_tracing", None)
    if fx_tracing is not None:
        table[fx_tracing] = _constant(False)
    return table


builder.register_call_handlers(_build_table)


class ContextManagerVariable(Variable):
    """A context manager the interpreter understands: `enter` and `exit` act on the trace."""

    def enter(self, tx) -> Variable:
        raise NotImplementedError

    def exit(self, tx) -> None:
        raise NotImplementedError

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "__enter__":
            return self.enter(tx)
        if name == "__exit__":
            self.exit(tx)
            return ConstantVariable(False)
        return super().call_method(tx, name, args, kwargs)

    def call(self, tx, args, kwargs) -> Variable:
        """Used as a decorator: `@torch.no_grad()` wraps a function."""
        if len(args) == 1 and not kwargs:
            return DecoratedFunctionVariable(self, args[0])
        raise Unsupported(f"calling {self.describe()}")


class GradModeVariable(ContextManagerVariable):
    """no_grad / enable_grad / set_grad_enabled."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.previous: list[bool] = []

    def describe(self) -> str:
        return f"grad mode {'enabled' if self.enabled else 'disabled'}"

    def python_type(self) -> type:
        return torch.set_grad_enabled

    def apply_now(self, tx) -> None:
        self.previous.append(torch.is_grad_enabled())
        tx.output.set_grad_enabled(tx, self.enabled)

    def enter(self, tx) -> Variable:
        if not self.previous or torch.is_grad_enabled() != self.enabled:
            self.apply_now(tx)
        return NONE

    def exit(self, tx) -> None:
        if self.previous:
            tx.output.set_grad_enabled(tx, self.previous.pop())


class GradModeExit:
    """The `__exit__` of a grad-mode `with` block a graph break left open: restores `previous`
    (None: the exit of a block that changes nothing, `contextlib.nullcontext`).

    A resume function continuing inside `with torch.no_grad():` finds it on its stack where
    the block's `__exit__` was, so the block's normal end and its exception handler both
    restore grad mode, as the original `__exit__` would.
    """

    __slots__ = ("previous",)

    def __init__(self, previous: bool | None):
        self.previous = previous

    @classmethod
    def restoring(cls, previous: bool | None) -> "GradModeExit":
        """The one object restoring `previous`: entries made by different traces pass the resume function the
        same object, which its guards compare by identity (a new object per trace made a resume entry per trace)."""
        return _GRAD_MODE_EXITS[previous]

    def __call__(self, exc_type=None, exc=None, traceback=None) -> bool:
        if self.previous is not None:
            torch._C._set_grad_enabled(self.previous)
        return False


_GRAD_MODE_EXITS = {previous: GradModeExit(previous) for previous in (True, False, None)}


class GradModeExitVariable(Variable):
    def __init__(self, value: GradModeExit, source=None):
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"exit of a with-block left open by a graph break (restores grad mode {self.value.previous})"

    def python_type(self) -> type:
        return GradModeExit

    def call(self, tx, args, kwargs) -> Variable:
        if any(not (isinstance(arg, ConstantVariable) and arg.value is None) for arg in args):
            raise Unsupported("a with-block exited by an exception")
        if self.value.previous is not None:
            tx.output.set_grad_enabled(tx, self.value.previous)
        return ConstantVariable(False)


class InferenceModeVariable(ContextManagerVariable):
    """torch.inference_mode(mode): a region whose tensors are inference tensors, with grad mode off (on for
    mode=False). The trace models it (`OutputGraph.set_inference_mode`); the real mode is switched only by an
    entry function that breaks inside the region (`InferenceModeExit`)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.previous: list[tuple[bool, bool, "InferenceModeExit"]] = []

    def describe(self) -> str:
        return f"inference_mode({self.enabled})"

    def python_type(self) -> type:
        return torch.inference_mode

    def enter(self, tx) -> Variable:
        output = tx.output
        region = InferenceModeExit.of(self.enabled, output.inference_mode, torch.is_grad_enabled())
        self.previous.append((output.inference_mode, torch.is_grad_enabled(), region))
        output.open_inference.append(region)
        output.set_inference_mode(tx, self.enabled, grad_after=not self.enabled)
        return NONE

    def exit(self, tx) -> None:
        if self.previous:
            inference, grad, region = self.previous.pop()
            tx.output.open_inference.remove(region)
            tx.output.set_inference_mode(tx, inference, grad_after=grad)

    def exit_object(self) -> "InferenceModeExit | None":
        """The exit a resume function finds on its stack when the trace breaks inside this region."""
        return self.previous[-1][2] if self.previous else None


class InferenceModeExit:
    """The real side of an inference-mode region a graph break left open. The breaking entry calls `enter()`
    (the program is inside the region when the broken call and the resume function run); the resume function
    finds the object where the block's `__exit__` was, and its entry calls it (after its graph) where the
    block ends, or its handler does when an exception leaves the block.

    One object per (mode, inference mode and grad mode before it): the entry holds it as a constant, so a
    resume function's guard on its identity pins all three. What it entered is kept per thread, innermost last."""

    _made: dict[tuple[bool, bool, bool], "InferenceModeExit"] = {}

    def __init__(self, enabled: bool, inference_before: bool, grad_before: bool):
        self.enabled = enabled
        self.inference_before = inference_before
        self.grad_before = grad_before
        self._entered = threading.local()

    @classmethod
    def of(cls, enabled: bool, inference_before: bool, grad_before: bool) -> "InferenceModeExit":
        key = (enabled, inference_before, grad_before)
        if key not in cls._made:
            cls._made[key] = cls(*key)
        return cls._made[key]

    def _stack(self) -> list:
        if not hasattr(self._entered, "stack"):
            self._entered.stack = []
        return self._entered.stack

    def enter(self) -> "InferenceModeExit":
        context = torch.inference_mode(self.enabled)
        context.__enter__()
        self._stack().append(context)
        return self

    def __call__(self, exc_type=None, exc=None, traceback=None) -> bool:
        self._stack().pop().__exit__(exc_type, exc, traceback)
        return False


class InferenceModeExitVariable(Variable):
    def __init__(self, value: InferenceModeExit, source=None):
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"exit of an inference_mode({self.value.enabled}) block left open by a graph break"

    def python_type(self) -> type:
        return InferenceModeExit

    def call(self, tx, args, kwargs) -> Variable:
        if any(not (isinstance(arg, ConstantVariable) and arg.value is None) for arg in args):
            raise Unsupported("an inference_mode block exited by an exception")
        # the real mode is left after this entry's graph, in program order with its other effects
        tx.output.side_effects.replay_call(self.value, [], {})
        tx.output.set_inference_mode(tx, self.value.inference_before, grad_after=self.value.grad_before)
        return ConstantVariable(False)


class AutocastVariable(ContextManagerVariable):
    """torch.autocast(...): a region whose ops run in lower precision."""

    def __init__(self, autocast: torch.autocast):
        self.autocast = autocast
        self.mode_node = None

    def describe(self) -> str:
        return f"autocast({self.autocast.device}, {self.autocast.fast_dtype})"

    def enter(self, tx) -> Variable:
        self.mode_node = tx.output.enter_autocast(self.autocast)
        return NONE

    def exit(self, tx) -> None:
        tx.output.exit_autocast(self.autocast, self.mode_node)


class NullContextVariable(ContextManagerVariable):
    def __init__(self, value: Variable):
        self.value = value

    def enter(self, tx) -> Variable:
        return self.value

    def exit(self, tx) -> None:
        pass


class DecoratedFunctionVariable(Variable):
    """A function decorated with a context manager (`@torch.no_grad()`)."""

    def __init__(self, manager: ContextManagerVariable, function: Variable):
        self.manager = manager
        self.function = function

    def call(self, tx, args, kwargs) -> Variable:
        self.manager.enter(tx)
        try:
            with tx.behind_uninterpreted_frames():  # Python calls the function from the decorator's wrapper
                result = self.function.call(tx, args, kwargs)
        except ProgramException:  # the decorator's `with` exits on the way out, as in Python
            self.manager.exit(tx)
            raise
        self.manager.exit(tx)
        return result


_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
               "error": logging.ERROR, "exception": logging.ERROR, "critical": logging.CRITICAL,
               "fatal": logging.CRITICAL}
_LOG_OPTIONS = frozenset({"exc_info", "stack_info", "stacklevel", "extra"})


class LoggerVariable(Variable):
    """A logging.Logger or LoggerAdapter: log calls are replayed after the graph, level checks are guarded.

    `logger.warning("x=%s", 3)` is recorded with its arguments and the file, line and
    function `findCaller` would report, and made again by the entry function
    (kiln/frontend/replay.py), which checks the level then, as the call would.
    `isEnabledFor`/`getEffectiveLevel`/`level`/`disabled` are answered now and guarded,
    so the trace can branch on them. A method a library added to Logger (transformers'
    `warning_once`) is called as it is, after the graph. Anything else (adding handlers,
    changing levels) is refused.
    """

    def __init__(self, value, source=None):
        self.value = value
        self.source = source

    def describe(self) -> str:
        return f"logger {getattr(self.value, 'name', '')!r}"

    def python_type(self) -> type:
        return type(self.value)

    def identity(self) -> Any:
        return self.value

    def _guard_source(self, tx):
        return self.source if self.source is not None else tx.output.named_source("__logger", self.value)

    def _guarded(self, tx, expression: str, value: Any) -> ConstantVariable:
        """`logger<expression>` answered now; the entry is reused only while it gives the same answer."""
        tx.output.guards.add(self._guard_source(tx), f"{{}}{expression} != {value!r}",
                             f"logger{expression} changed from {value!r}")
        return ConstantVariable(value)

    def getattr(self, tx, name: str) -> Variable:
        if name == "name":
            return ConstantVariable(self.value.name)
        if name in ("level", "disabled", "propagate") and isinstance(self.value, logging.Logger):
            return self._guarded(tx, f".{name}", getattr(self.value, name))
        if name in ("isEnabledFor", "getEffectiveLevel", "log") or name in _LOG_LEVELS or self._library_method(name):
            return TrackerMethod(self, name)
        raise Unsupported(f"{name!r} of {self.describe()} (only logging calls and level checks are modelled)")

    def _library_method(self, name: str) -> bool:
        """A logging method a library patched onto the logger's class (`warning_once`, `info_once`)."""
        method = getattr(self.value, name, None)
        own = getattr(getattr(method, "__func__", method), "__module__", None) == "logging"
        return not own and name.startswith(tuple(_LOG_LEVELS)) and callable(method)

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if name == "isEnabledFor":
            level = args[0].as_constant()
            return self._guarded(tx, f".isEnabledFor({level!r})", self.value.isEnabledFor(level))
        if name == "getEffectiveLevel":
            return self._guarded(tx, ".getEffectiveLevel()", self.value.getEffectiveLevel())
        if name in _LOG_LEVELS or name == "log":
            with unbreakable():  # a record names its caller's line: never run from an entry function
                return self.log_call(tx, name, args, kwargs)
        if self._library_method(name):
            held = [replay.snapshot(arg, f"{self.describe()}.{name}()") for arg in args]
            options = {key: replay.snapshot(arg, f"{self.describe()}.{name}()") for key, arg in kwargs.items()}
            tx.output.side_effects.replay_call(getattr(self.value, name), held, options)
            return NONE
        return self.getattr(tx, name).call(tx, args, kwargs)

    def log_call(self, tx, method: str, args, kwargs, configure_root: bool = False) -> Variable:
        """`logger.<method>(...)` recorded for replay with the caller `findCaller` would name."""
        what = f"{self.describe()}.{method}()"
        args = list(args)
        if method == "log":
            if not args:
                raise Unsupported(f"{what} without a level (the program raises TypeError)")
            level = args.pop(0).as_constant()
            if not isinstance(level, int):
                raise Unsupported(f"{what} with level {level!r}")
        else:
            level = _LOG_LEVELS[method]
        if not args:
            raise Unsupported(f"{what} without a message (the program raises TypeError)")
        unknown = set(kwargs) - _LOG_OPTIONS
        if unknown:
            raise Unsupported(f"{what} with keyword arguments {sorted(unknown)} (the program raises TypeError)")
        options = {key: replay.snapshot(value, what).value for key, value in kwargs.items()}
        if method == "exception":
            options.setdefault("exc_info", True)
        if options.get("stack_info"):
            raise Unsupported(f"{what} with stack_info=True (the stack is not known at trace time)")
        filename, lineno, function, _ = replay.caller_location(tx, options.get("stacklevel", 1), what)
        message, *values = [replay.snapshot(arg, what).value for arg in args]
        held = [replay.HeldValue(value) for value in
                (self.value, level, message, tuple(values), (filename, lineno, function), options, configure_root)]
        tx.output.side_effects.replay_call(replay.log, held, {})
        return NONE
