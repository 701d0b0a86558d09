"""kiln: a just-in-time compiler for PyTorch.

    model = kiln.compile(model)          # or torch.compile(model, backend="kiln")

See docs/design/ for how the pipeline is built.
"""
from kiln.api import OptimizedModule, compile, list_backends
from kiln.backend import KilnCompileError, compile_graph, register as _register
from kiln.config import config
from kiln import testing  # noqa: F401  (kiln.testing.compare is public)
from kiln.debug.explain import explain


def reset() -> None:
    """Forget TorchDynamo's compiled graphs (`frontend="dynamo"`, `torch.compile(backend="kiln")`).

    kiln's own frontend keeps its cache in each `kiln.compile(...)` result: compiling again
    starts fresh. The on-disk kernel cache always stays.
    """
    from kiln import _torch

    _torch.dynamo_reset()


_register()

__all__ = ["compile", "compile_graph", "config", "explain", "list_backends", "reset", "OptimizedModule", "KilnCompileError"]
__version__ = "0.1.0"
