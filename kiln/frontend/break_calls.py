"""The calls a graph break makes in plain Python: `call_compiled` and the callee it picks.

At a break the entry makes the call the trace could not. A Python function, method or
nn.Module the trace was inlining is itself compiled through a dispatcher (`compiled_callee`:
one per function, shared by functions that behave the same, `_equivalent_callee`), so only
the construct that stopped the trace runs eagerly; builtins, C functions, classes and
functions of the standard library and of torch run as they are (`runs_as_it_is`), and an
nn.Sequential runs its children one by one, each called as a break calls it.

These run when the entry runs, not when it is written (resume.py writes it), so they live
apart.
"""
from __future__ import annotations

import functools
import inspect
import os
import sysconfig
import types
import weakref
from typing import Any, Callable

import torch

def _library_paths() -> tuple[str, ...]:
    paths = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}
    paths.add(os.path.dirname(torch.__file__))
    paths.add(os.path.dirname(os.path.dirname(__file__)))  # kiln itself
    return tuple(os.path.join(path, "") for path in paths)


_LIBRARY_PATHS = _library_paths()
_callees: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _is_library(function: types.FunctionType) -> bool:
    filename = function.__code__.co_filename
    return filename.startswith(_LIBRARY_PATHS) and "site-packages/transformers" not in filename


# 3.11's comprehension functions: one called at a break broke inside its loop (else it was traced inline), and
# compiled on its own it would break at every item, a graph each; it runs as it is, as TorchDynamo runs it.
_COMPREHENSIONS = frozenset(("<listcomp>", "<dictcomp>", "<setcomp>"))


def runs_as_it_is(fn: Any) -> bool:
    """Whether a break calls `fn` as it is (`compiled_callee` gives it back unchanged) whatever its receiver: a C
    function, a class, or a plain function of the standard library or torch. The entry then calls it itself, not
    through `call_compiled`, so its caller is the entry, which stands in for the program's frame: `globals()` is
    the program's, `namedtuple` names the program's module."""
    if isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType, type)):
        return True
    return isinstance(fn, types.FunctionType) and _is_library(fn) and \
        not fn.__code__.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR)


def _callee_object(function) -> Any:
    """The object a break's callee tracker stands for, read without pinning it: a Python function's tracker is
    guarded by its code (all `runs_as_it_is` reads of it), not by its identity, until the trace depends on that."""
    fn = getattr(function, "fn", None)
    return fn if isinstance(fn, types.FunctionType) else function.identity()


def compiled_callee(make_dispatcher: Callable, fn: Any) -> tuple[Any, Any]:
    """(callable, bound receiver or None) to run for `fn` at a break: compiled where kiln can trace it."""
    receiver = None
    target = fn
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        receiver, target = fn.__self__, fn.__func__
    if isinstance(target, torch.nn.Module):
        if type(target).__call__ is not torch.nn.Module.__call__ or isinstance(target, torch.nn.RNNBase):
            return fn, None
        if _is_library_module(target):
            if type(target).forward is torch.nn.Sequential.forward:
                return functools.partial(_call_sequential, make_dispatcher, target), None
            return fn, None
    elif not isinstance(target, types.FunctionType) or _is_library(target) or \
            target.__code__.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR) or \
            target.__code__.co_name in _COMPREHENSIONS:
        return fn, None
    try:
        compiled = _callees.setdefault(target, {})
    except TypeError:  # not weakly referenceable
        return fn, None
    dispatcher = compiled.get(make_dispatcher)
    if dispatcher is not None and isinstance(target, types.FunctionType) and dispatcher.fn is not target and \
            not _same_function_behaviour(dispatcher.fn, target):
        dispatcher = None  # either function's code or defaults were reassigned since they were found alike
    if dispatcher is None:
        dispatcher = _equivalent_callee(make_dispatcher, target) or make_dispatcher(target)
        compiled[make_dispatcher] = dispatcher
    if isinstance(target, types.FunctionType) and target.__code__.co_freevars:
        return functools.partial(dispatcher.call_function, target), receiver  # with this closure's cells
    return dispatcher, receiver


def _is_library_module(module: torch.nn.Module) -> bool:
    """A module whose `forward` is torch's own (nn.Linear, nn.ReLU, nn.Sequential, a subclass that keeps it): at a
    break it runs as it is, as a library function does, and as TorchDynamo runs torch.nn's frames that eager code
    calls. A user module it holds is still compiled where the library calls it by a rule kiln knows
    (`_call_sequential`)."""
    forward = getattr(type(module), "forward", None)
    return isinstance(forward, types.FunctionType) and _is_library(forward) and "forward" not in module.__dict__


def _call_sequential(make_dispatcher: Callable, sequential: torch.nn.Sequential, /, *args: Any, **kwargs: Any) -> Any:
    """`sequential(input)` at a break, as nn.Module's call and Sequential.forward run it (no hooks: each child
    in order on the previous one's output), with each child called as a break calls it (`call_compiled`): a
    user module inside gets its own dispatcher, torch's own modules run as they are. Anything else nn.Module's
    call would do differently (hooks, a JIT trace, other arguments) calls the Sequential as it is."""
    from torch.nn.modules import module as module_module

    if len(args) != 1 or kwargs or torch._C._get_tracing_state() or "forward" in sequential.__dict__ or \
            sequential._forward_pre_hooks or sequential._forward_hooks or sequential._backward_hooks or \
            sequential._backward_pre_hooks or module_module._global_forward_pre_hooks or \
            module_module._global_forward_hooks or module_module._global_backward_hooks or \
            module_module._global_backward_pre_hooks:
        return sequential(*args, **kwargs)
    (value,) = args
    for module in sequential:
        value = call_compiled(make_dispatcher, module, value)
    return value


# code object -> [(make_dispatcher, dispatcher)]: callees shared by functions that behave the same
_callees_by_code: "weakref.WeakKeyDictionary[types.CodeType, list]" = weakref.WeakKeyDictionary()
_SHARED_PER_CODE = 8  # past this many (defaults made anew on each call), each function gets its own


def _equivalent_callee(make_dispatcher: Callable, target: Any) -> Any:
    """The dispatcher of another function that runs exactly as `target` does, else None (and `target`'s, once
    made, is offered to the next one).

    A lambda or a function defined in the caller is a new object on each call of the caller; compiling each
    through a dispatcher of its own would trace it again on every call. A function is determined by its
    code, globals, builtins, defaults and closure cells (its name and attributes are not visible to its own
    frame), so a dispatcher made for one such function runs any other: a closure's through
    `Dispatcher.call_function`, whose guards and entries read the cells of the function they are given.
    """
    if not isinstance(target, types.FunctionType):
        return None
    shared = _callees_by_code.setdefault(target.__code__, [])
    for maker, dispatcher in shared:
        if maker is make_dispatcher and _same_function_behaviour(dispatcher.fn, target):
            return dispatcher
    if len(shared) < _SHARED_PER_CODE:
        dispatcher = make_dispatcher(target)
        shared.append((make_dispatcher, dispatcher))
        return dispatcher
    return None


def _same_function_behaviour(function: types.FunctionType, other: types.FunctionType) -> bool:
    """Whether two functions run the same but for their closure cells: same code, globals, builtins, and the
    same default objects."""
    if function.__code__ is not other.__code__ or function.__globals__ is not other.__globals__ or \
            function.__builtins__ is not other.__builtins__ or function.__defaults__ is not other.__defaults__:
        return False
    kwdefaults, other_kwdefaults = function.__kwdefaults__, other.__kwdefaults__
    if kwdefaults is None or other_kwdefaults is None:
        return kwdefaults is other_kwdefaults
    return len(kwdefaults) == len(other_kwdefaults) and all(
        name in other_kwdefaults and other_kwdefaults[name] is value for name, value in kwdefaults.items())


def call_compiled(make_dispatcher: Callable, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """Call `fn` as a break does: through a dispatcher if it is Python kiln can trace, else as it is."""
    target, receiver = compiled_callee(make_dispatcher, fn)
    if receiver is not None:
        return target(receiver, *args, **kwargs)
    return target(*args, **kwargs)
