"""`kiln.compile()`: the user's one line.

It wraps a function or an `nn.Module`; capture goes through one function, `_capture`,
which hands the program to kiln's own frontend (kiln/frontend) or, with
`kiln.config.frontend = "dynamo"`, to TorchDynamo with kiln's backend. The backend
ladder (`eager`, `aot_eager`, `kiln`) bisects a wrong answer: the same capture, less and less of kiln's pipeline.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import torch

from kiln import _torch, backend as _backend
from kiln.config import config

log = logging.getLogger("kiln")
MODES = _backend.MODES


def list_backends() -> list[str]:
    """The backend ladder, least to most of kiln: a wrong answer is bisected down it."""
    return list(_backend.LADDER)


def compile(model=None, *, fullgraph: bool = False, dynamic: bool | None = None,
            backend: str | Callable = "kiln", mode: str | None = None, options: dict | None = None,
            disable: bool = False):
    """Compile a function or module with kiln; usable as `@kiln.compile` or `@kiln.compile(...)`.

    Takes torch.compile's arguments:
    fullgraph: raise instead of running unsupported code eagerly.
    dynamic: None (static first, dynamic after a shape change), True or False.
    backend: a rung of `kiln.list_backends()`, or a callable `backend(gm, example_inputs) -> callable`
        (torch.compile's backend contract) that compiles each graph kiln's frontend captures.
    mode: "default" (None means it); "reduce-overhead": inference graphs on CUDA replay through
        CUDA graphs (kiln/runtime/cudagraphs.py: a result stays valid until the next call, whose
        replay overwrites it; reading it after that raises, saying to keep a `.clone()`);
        "max-autotune": not built yet, runs as "default" (with a warning).
    options: kiln.config options ({"cpu_backend": "triton", ...}, see `kiln.config.describe()`),
        in force while this model's graphs are captured, compiled and run; an unknown name raises.
    disable: True returns `model` itself, uncompiled (as torch.compile does).
    """
    if model is None:
        return functools.partial(compile, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                                 options=options, disable=disable)
    mode = _backend.checked_mode(mode, "kiln.compile")
    options = config.checked(options or {})
    if not (callable(backend) or backend in _backend.LADDER):
        raise ValueError(f"kiln.compile: unknown backend {backend!r}; choose one of {list_backends()}, "
                         f"or pass a callable backend(gm, example_inputs) -> callable")
    if disable:
        return model
    if not callable(model):
        raise TypeError(f"kiln.compile expects a function or nn.Module, got {type(model).__name__}")
    graph_compiler = backend if callable(backend) else _backend.graph_compiler(backend, mode=mode, fullgraph=fullgraph)
    with config.patch(**options):  # the frontend reads options (graph_breaks, frontend) when it is built too
        # what compiles another callable the same way (torch's OptimizedModule.dynamo_ctx: Lightning's
        # from_compiled compiles the module's training_step and other methods with it)
        same_way = compile(fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options)
        if _is_ddp(model):
            inner = _capture(model.module.forward, graph_compiler, fullgraph=fullgraph, dynamic=dynamic)
            return OptimizedModule(model, _backend.run_with_options(_DistributedCall(model, inner), options), same_way)
        compiled = _backend.run_with_options(_capture(model, graph_compiler, fullgraph=fullgraph, dynamic=dynamic),
                                             options)
    if isinstance(model, torch.nn.Module):
        return OptimizedModule(model, compiled, same_way)
    return functools.wraps(model)(compiled)


def _capture(fn: Callable, graph_compiler: Callable, *, fullgraph: bool, dynamic: bool | None) -> Callable:
    """Capture `fn`'s tensor work as FX graphs and compile each with `graph_compiler`.

    `config.frontend` picks the capture: "kiln" (kiln/frontend, the default) or "dynamo"
    (TorchDynamo). `dynamic` means the same to both: None specializes on sizes first and
    makes those that change symbolic (and int/float arguments that change graph inputs),
    True is shape-generic from the first call, False always static.
    """
    frontend = config.frontend
    if frontend not in ("kiln", "dynamo"):
        raise ValueError(f"kiln.config.frontend: unknown frontend {frontend!r}; choose 'kiln' or 'dynamo'")
    if frontend == "dynamo":
        return torch.compile(fn, backend=graph_compiler, fullgraph=fullgraph, dynamic=dynamic)
    from kiln.frontend import compile_function

    return compile_function(fn, graph_compiler, fullgraph=fullgraph, dynamic=dynamic)


def _is_ddp(module: Any) -> bool:
    parallel = getattr(torch.nn, "parallel", None)
    return parallel is not None and isinstance(module, parallel.DistributedDataParallel)


class _DistributedCall:
    """`kiln.compile(DDP(model))`: DDP's own forward runs as it is, the model's forward is compiled.

    DDP's forward is bookkeeping in Python (bucket rebuilds, the reducer's state, unused-parameter
    search, its communication hooks), which TorchDynamo also leaves uncompiled; what it calls,
    `self.module(...)`, is the model, and that is what is compiled. For the length of each call
    the wrapped module's instance attribute `forward` is the compiled forward (nn.Module's call
    machinery and the module's hooks still run around it), then it is restored. Gradients flow
    into the same parameters, so the reducer's hooks see them as in eager DDP.
    """

    _ABSENT = object()

    def __init__(self, ddp: torch.nn.Module, compiled_forward: Callable):
        self.ddp = ddp
        self.compiled_forward = compiled_forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inner = self.ddp.module
        previous = inner.__dict__.get("forward", self._ABSENT)
        inner.__dict__["forward"] = self.compiled_forward
        try:
            return self.ddp(*args, **kwargs)
        finally:
            if previous is self._ABSENT:
                inner.__dict__.pop("forward", None)
            else:
                inner.__dict__["forward"] = previous

    @property
    def entries(self):
        return getattr(self.compiled_forward, "entries", [])


class OptimizedModule(_torch.compiled_module_base()):
    """A compiled module that *is* the original for everything but calling.

    Parameters, buffers, `state_dict` (its keys are the original's, no `_orig_mod.` prefix),
    `train()/eval()` and attributes are the original module's (shared, not copied); only
    `__call__` goes through the compiled program. Like torch.compile's wrapper, whose class it
    subclasses (so tools that unwrap that, such as Accelerate's `unwrap_model`, unwrap this),
    it holds the original as `_orig_mod`, sets class attributes (`__class__`, as FSDP2's
    `fully_shard` does) on itself and any other attribute on the original. Hooks registered on
    the wrapper itself (FSDP2's) run around the compiled call.
    """

    _DELEGATED = ("state_dict", "load_state_dict", "named_parameters", "named_buffers", "parameters",
                  "buffers", "children", "named_children", "train", "eval",
                  "to", "cuda", "cpu", "half", "float", "bfloat16", "requires_grad_", "zero_grad", "apply")
    _OWN = frozenset(("_orig_mod", "_compiled_call", "_super_module_initialized", "dynamo_ctx"))

    def __init__(self, module: torch.nn.Module, compiled_call: Callable, compile_same_way: Callable | None = None):
        # Not torch's OptimizedModule.__init__, which would compile with TorchDynamo. Its `training`
        # property reads `_super_module_initialized` when nn.Module's __init__ sets `training`.
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_compiled_call", compiled_call)
        # `dynamo_ctx(fn)` compiles `fn` as this module was compiled (torch's wrapper has the same attribute)
        object.__setattr__(self, "dynamo_ctx", compile_same_way or compile)
        object.__setattr__(self, "_super_module_initialized", False)
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "_super_module_initialized", True)

        def forward(*args: Any, **kwargs: Any) -> Any:
            return compiled_call(*args, **kwargs)

        # `inspect.signature(compiled.forward)` is the model's: HF Trainer keeps the dataset columns that
        # the forward's signature names, and dropped every one for a (*args, **kwargs) forward.
        functools.update_wrapper(forward, module.forward)
        object.__setattr__(self, "forward", forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state = object.__getattribute__(self, "__dict__")
        if state["_forward_pre_hooks"] or state["_forward_hooks"] or state["_backward_pre_hooks"] \
                or state["_backward_hooks"]:
            return torch.nn.Module.__call__(self, *args, **kwargs)  # the hooks, then self.forward
        return state["_compiled_call"](*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled_call(*args, **kwargs)

    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True):
        """The wrapper itself, then the original's modules, all under the original's names (the wrapper and
        the original both under `prefix`): state that tools keep on the wrapper (FSDP2's) is found from it."""
        memo = set() if memo is None else memo
        if self not in memo or not remove_duplicate:
            if remove_duplicate:
                memo.add(self)
            yield prefix, self
        yield from self._orig_mod.named_modules(memo, prefix, remove_duplicate)

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def __getattribute__(self, name: str) -> Any:
        if name in OptimizedModule._DELEGATED:
            result = getattr(object.__getattribute__(self, "_orig_mod"), name)
            if name in ("train", "eval", "to", "cuda", "cpu", "half", "float", "bfloat16",
                        "requires_grad_", "apply"):
                return _returning(self, result)
            return result
        if name == "training":
            return object.__getattribute__(self, "_orig_mod").training
        return super().__getattribute__(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_orig_mod"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in OptimizedModule._OWN:
            object.__setattr__(self, name, value)  # not nn.Module's: `_orig_mod` is no submodule (no key prefix)
        elif hasattr(type(self), name):  # `__class__`, `forward`, `training` (torch's property: the original's)
            torch.nn.Module.__setattr__(self, name, value)
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        if name in OptimizedModule._OWN or hasattr(type(self), name):
            torch.nn.Module.__delattr__(self, name)
        else:
            delattr(self._orig_mod, name)

    def __repr__(self) -> str:
        return f"kiln.OptimizedModule({self._orig_mod!r})"


def _returning(wrapper: OptimizedModule, method: Callable) -> Callable:
    """Module methods that return `self` return the wrapper, so chaining keeps the compiled call."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        return wrapper if result is wrapper._orig_mod else result

    return call
