"""kiln's user-facing API (kiln/api.py, kiln/backend.py's entry points): what a new user meets first.

- the `torch_dynamo_backends` entry point and `import kiln` register the backends exactly once,
  in whatever order (each case in a fresh interpreter, against the installed entry point);
"""
from __future__ import annotations

import copy
import inspect
import io
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

import kiln

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _fresh_python(code: str, cwd: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
    """Run `code` in a new interpreter that imports this checkout's kiln (PYTHONPATH), from `cwd`."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------- 1. registration, once, in any order

_RESOLVES_HERE = """
    import importlib.metadata, os, sys
    (entry_point,) = [ep for ep in importlib.metadata.entry_points(group="torch_dynamo_backends") if ep.name == "kiln"]
    assert entry_point.value == "kiln.backend:compile_graph", entry_point.value
    loaded = entry_point.load()
    import kiln
    assert loaded is kiln.backend.compile_graph
    assert os.path.realpath(kiln.__file__) == os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else {init!r}), kiln.__file__
    print("resolved", kiln.__file__)
"""


def test_the_installed_entry_point_resolves_to_this_checkouts_kiln(tmp_path):
    result = _fresh_python(_RESOLVES_HERE.format(init=str(ROOT / "kiln" / "__init__.py")), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "resolved" in result.stdout


_CASES = {
    # torch finds kiln through the entry point alone: the issue's `duplicate name: kiln`.
    "entry point only": """
        import torch
        f = torch.compile(lambda x: torch.sin(x) + 1, backend="kiln")
        x = torch.randn(8)
        torch.testing.assert_close(f(x), torch.sin(x) + 1)
        import kiln
        assert torch._dynamo.lookup_backend("kiln") is kiln.backend.compile_graph
        assert "kiln" in torch._dynamo.list_backends()
    """,
    "import kiln first": """
        import kiln, torch
        f = torch.compile(lambda x: x * 2, backend="kiln_eager")
        torch.testing.assert_close(f(torch.ones(3)), torch.full((3,), 2.0))
        assert torch._dynamo.lookup_backend("kiln") is kiln.backend.compile_graph
        assert "kiln" in torch._dynamo.list_backends()
    """,
    # torch has discovered the entry point (list_backends) before kiln is imported.
    "entry point discovered, then import kiln": """
        import torch
        assert "kiln" in torch._dynamo.list_backends()
        import kiln
        kiln.backend.register()  # again: a no-op
        assert torch._dynamo.lookup_backend("kiln") is kiln.backend.compile_graph
        for name in ("kiln_eager", "kiln_aot_eager"):
            f = torch.compile(lambda x: x - 1, backend=name)
            torch.testing.assert_close(f(torch.ones(3)), torch.zeros(3))
    """,
    # torch loads the entry point (importing kiln inside lookup_backend), then the user imports kiln too.
    "entry point loaded, then import kiln, register again": """
        import torch
        assert torch._dynamo.lookup_backend("kiln") is not None
        import kiln
        kiln.backend.register()
        kiln.backend.register()
        assert torch._dynamo.lookup_backend("kiln") is kiln.backend.compile_graph
        assert torch._dynamo.lookup_backend("kiln_aot_eager") is not None
        f = kiln.compile(lambda x: x + 1, backend="eager")
        torch.testing.assert_close(f(torch.ones(2)), torch.full((2,), 2.0))
    """,
}


@pytest.mark.parametrize("order", list(_CASES))
def test_backends_register_exactly_once_whatever_is_imported_first(order, tmp_path):
    result = _fresh_python(_CASES[order], tmp_path)
    assert result.returncode == 0, f"{order}:\n{result.stderr[-3000:]}"
    assert "duplicate name" not in result.stderr
