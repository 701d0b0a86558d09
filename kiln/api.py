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
    mode: "default" (None means it); "reduce-overhead": graphs on CUDA replay through
        CUDA graphs (kiln/runtime/cudagraphs.py: a result stays valid until the next call, whose
        replay overwrites it; reading it after that raises, saying to keep a `.clone()`; a training
        step's saved tensors and gradients are never overwritten while referenced);
        "max-autotune": as "reduce-overhead"; "max-autotune-no-cudagraphs": as "default". Their autotuning
        (config.matmul_template, config.autotune_kernels; docs/design/templates.md) is off until its illegal
        memory access on the H200 is found; the options turn it on explicitly.
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

    def __init__(self, ddp: torch.nn.Module, compiled_forward: Callable):
        self.ddp = ddp
        self.compiled_forward = compiled_forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from kiln.frontend.wrapped_calls import forward_swapped

        with forward_swapped(self.ddp.module, self.compiled_forward):
            return self.ddp(*args, **kwargs)

    @property
    def entries(self):
        return getattr(self.compiled_forward, "entries", [])


class OptimizedModule(_torch.compiled_module_base()):
    """A compiled module laid out as torch.compile's: the original is its one submodule, `_orig_mod`.

    Users swap `torch.compile(model)` for `kiln.compile(model)` and keep their checkpoints, so the
    wrapper names state as torch's does: `state_dict`, `named_parameters`, `named_buffers` and
    `named_modules` give the original's names under `_orig_mod.`, and `load_state_dict` takes those
    keys (a plain model's checkpoint goes into `compiled._orig_mod`, as with torch.compile).
    torch.distributed.checkpoint relies on that layout: under an OptimizedModule it expects every key
    to go through `_orig_mod.` (it asserts otherwise) and drops that prefix, so `get_model_state_dict`,
    `set_model_state_dict` and `get_state_dict` (an optimizer over `compiled.parameters()`) name the
    state by the original's keys, for the compiled module and for a model of `fully_shard`ed compiled blocks.

    Parameters and buffers are the original's (shared, not copied); nn.Module's methods (`train()`,
    `.to()`, `zero_grad()`, ...) reach them through the submodule and return the wrapper. As with
    torch's wrapper, whose class it subclasses (so tools that unwrap that, such as Accelerate's
    `unwrap_model`, unwrap this), `training` and any attribute the wrapper does not own are read from
    and set on the original, and class attributes (`__class__`, as FSDP2's `fully_shard` sets it) on
    the wrapper itself. Only `__call__` goes through the compiled program; hooks registered on the
    wrapper itself (FSDP2's) run around it.
    """

    _OWN = frozenset(("_compiled_call", "_super_module_initialized", "dynamo_ctx"))

    def __init__(self, module: torch.nn.Module, compiled_call: Callable, compile_same_way: Callable | None = None):
        # Not torch's OptimizedModule.__init__, which would compile with TorchDynamo. Until nn.Module's __init__
        # has made `_modules`, `_orig_mod` is a plain attribute, as in torch's: its `training` property reads it,
        # and its setter ignores nn.Module's __init__ setting `training` while `_super_module_initialized` is False.
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_compiled_call", compiled_call)
        # `dynamo_ctx(fn)` compiles `fn` as this module was compiled (torch's wrapper has the same attribute)
        object.__setattr__(self, "dynamo_ctx", compile_same_way or compile)
        object.__setattr__(self, "_super_module_initialized", False)
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "_super_module_initialized", True)
        self._orig_mod = module  # registered as a submodule (nn.Module's __setattr__ drops the plain attribute)

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

    def __getattr__(self, name: str) -> Any:
        original = torch.nn.Module.__getattr__(self, "_orig_mod")  # from `_modules`
        return original if name == "_orig_mod" else getattr(original, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in OptimizedModule._OWN:  # plain attributes, never submodules (torch.compile's call, with the
            object.__setattr__(self, name, value)  # dynamo frontend, is a module: its state is the original's)
        elif name == "_orig_mod" or hasattr(type(self), name):
            # the submodule; class attributes: `__class__`, `forward`, `training` (torch's property: the original's)
            torch.nn.Module.__setattr__(self, name, value)
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        if name in OptimizedModule._OWN or name == "_orig_mod" or hasattr(type(self), name):
            torch.nn.Module.__delattr__(self, name)
        else:
            delattr(self._orig_mod, name)

    def __reduce__(self):
        """`copy.deepcopy` and pickle rebuild the wrapper by compiling the (copied) original the same way.
        torch's `__reduce__` calls the class with `dynamo_ctx` as the compiled call, which kiln's is not."""
        return (self.dynamo_ctx, (self._orig_mod,))

    def __repr__(self) -> str:
        return f"kiln.OptimizedModule({self._orig_mod!r})"
