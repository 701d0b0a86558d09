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

from kiln import backend as _backend
from kiln.config import config

log = logging.getLogger("kiln")
MODES = ("default", "reduce-overhead", "max-autotune")


def list_backends() -> list[str]:
    """The backend ladder, least to most of kiln: a wrong answer is bisected down it."""
    return list(_backend.LADDER)


@functools.lru_cache(maxsize=None)
def _warn_mode_not_implemented(mode: str) -> None:
    """Once: autotuning ("max-autotune") is not built yet."""
    log.warning("kiln.compile(mode=%r): not implemented yet; kiln compiles as in mode='default' "
                "(correct results, without autotuning)", mode)


def compile(fn_or_module=None, *, mode: str = "default", fullgraph: bool = False,
            backend: str = "kiln", dynamic: bool | None = None):
    """Compile a function or module with kiln; usable as `@kiln.compile` or `@kiln.compile(...)`.

    mode: "default"; "reduce-overhead": inference graphs on CUDA replay through CUDA graphs
        (kiln/runtime/cudagraphs.py: a result stays valid until the next call, which first checks
        that no earlier result is still referenced, else runs without the graph);
        "max-autotune": not built yet, runs as "default".
    fullgraph: raise instead of running unsupported code eagerly.
    backend: one of `kiln.list_backends()`.
    dynamic: None (static first, dynamic after a shape change), True or False.
    """
    if fn_or_module is None:
        return functools.partial(compile, mode=mode, fullgraph=fullgraph, backend=backend, dynamic=dynamic)
    if mode not in MODES:
        raise ValueError(f"kiln.compile: unknown mode {mode!r}; choose one of {MODES}")
    if backend not in _backend.LADDER:
        raise ValueError(f"kiln.compile: unknown backend {backend!r}; choose one of {list_backends()}")
    if mode == "max-autotune":
        _warn_mode_not_implemented(mode)
    graph_compiler = _backend.graph_compiler(backend, mode=mode, fullgraph=fullgraph)
    if _is_ddp(fn_or_module):
        inner = _capture(fn_or_module.module.forward, graph_compiler, fullgraph=fullgraph, dynamic=dynamic)
        return OptimizedModule(fn_or_module, _DistributedCall(fn_or_module, inner))
    if isinstance(fn_or_module, torch.nn.Module):
        compiled = _capture(fn_or_module, graph_compiler, fullgraph=fullgraph, dynamic=dynamic)
        return OptimizedModule(fn_or_module, compiled)
    if not callable(fn_or_module):
        raise TypeError(f"kiln.compile expects a function or nn.Module, got {type(fn_or_module).__name__}")
    compiled = _capture(fn_or_module, graph_compiler, fullgraph=fullgraph, dynamic=dynamic)
    return functools.wraps(fn_or_module)(compiled)


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


class OptimizedModule(torch.nn.Module):
    """A compiled module that *is* the original for everything but calling.

    Parameters, buffers, `state_dict`, `train()/eval()` and attributes are the original
    module's (shared, not copied); only `__call__` goes through the compiled program.
    """

    _DELEGATED = ("state_dict", "load_state_dict", "named_parameters", "named_buffers", "parameters",
                  "buffers", "named_modules", "modules", "children", "named_children", "train", "eval",
                  "to", "cuda", "cpu", "half", "float", "bfloat16", "requires_grad_", "zero_grad", "apply")

    def __init__(self, module: torch.nn.Module, compiled_call: Callable):
        super().__init__()
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_compiled_call", compiled_call)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled_call(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled_call(*args, **kwargs)

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
        setattr(self._orig_mod, name, value)

    def __repr__(self) -> str:
        return f"kiln.OptimizedModule({self._orig_mod!r})"


def _returning(wrapper: OptimizedModule, method: Callable) -> Callable:
    """Module methods that return `self` return the wrapper, so chaining keeps the compiled call."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        return wrapper if result is wrapper._orig_mod else result

    return call
