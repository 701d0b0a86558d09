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
    """Forget every compiled graph (the on-disk kernel cache stays)."""
    from kiln import _torch

    _torch.dynamo_reset()


_register()

__all__ = ["compile", "compile_graph", "config", "explain", "list_backends", "reset", "OptimizedModule", "KilnCompileError"]
__version__ = "0.1.0"
