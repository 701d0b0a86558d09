"""kiln's import graph against ARCHITECTURE.md's layering: nothing imports upwards, and no cycles;
and every module imports on its own (the first kiln module of a fresh process).

The graph is read from the source (every `import kiln...` and `from kiln... import ...`,
at module level and inside functions, since an import inside a function is how a cycle
hides), one node per module. Two rules:

- **Layers.** `LAYERS` lists kiln's packages from the top (what users call) to the bottom
  (what everything may use). A module may import its own layer and the layers below it;
  importing a layer above is a violation. `debug` observes every stage: nothing below
  the top imports it.
- **Cycles.** No two modules may import each other, directly or through others.

`KNOWN_CYCLES` and `KNOWN_UPWARD_IMPORTS` hold what breaks them now, and the tests ratchet:
a new cycle or upward import fails, and so does a known one that is gone ("fixed: remove
it from the list"), so the lists only shrink.

`python -m tests.test_layering` prints the cycles and the upward imports.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "kiln"

# Top to bottom. Within a row, modules are peers (they may import each other, cycles aside).
LAYERS = (
    ("kiln", "kiln.api", "kiln.debug"),  # what users call; debug observes every stage
    ("kiln.frontend",),
    ("kiln.backend",),  # compile_graph: the pipeline, one call per stage
    ("kiln.aot",),
    ("kiln.lowering",),
    ("kiln.schedule",),
    ("kiln.codegen",),
    ("kiln.runtime",),
    ("kiln.ir",),
    ("kiln.testing", "kiln.config", "kiln.errors", "kiln._torch", "kiln._triton", "kiln.philox"),
)


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """{module: the kiln modules it imports}, from the source's import statements."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from kiln.x import y`: y is a module when kiln/x/y.py exists, else a name in kiln.x
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]  # `import kiln.x.y.z` names kiln.x.y.z's modules
                if target and target != name and target.startswith("kiln"):
                    graph[name].add(target)
    return graph


def layer_of(name: str) -> int:
    """The index in LAYERS of the longest prefix of `name` that a row lists."""
    best, depth = None, -1
    for index, row in enumerate(LAYERS):
        for prefix in row:
            if (name == prefix or name.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    assert best is not None, f"{name} is in no layer of LAYERS"
    return best


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(source, target) for source, targets in graph.items() for target in targets
            if layer_of(target) < layer_of(source)}


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index_of, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph[start])))]
        index_of[start] = low[start] = len(index_of)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index_of:
                    index_of[successor] = low[successor] = len(index_of)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index_of[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index_of[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(tuple(sorted(component)))

    for name in sorted(graph):
        if name not in index_of:
            visit(name)
    return sorted(found)


# What breaks the rules today (2026-12-01, 625425a). Only ever remove entries.
KNOWN_CYCLES: set[tuple[str, ...]] = set()
KNOWN_UPWARD_IMPORTS: set[tuple[str, str]] = set()


def test_every_module_is_in_a_layer():
    for name in modules():
        layer_of(name)


def test_no_new_cycles_and_no_fixed_ones_listed():
    found = set(cycles(import_graph()))
    assert not found - KNOWN_CYCLES, f"new import cycles: {sorted(found - KNOWN_CYCLES)}"
    assert not KNOWN_CYCLES - found, f"fixed: remove from KNOWN_CYCLES: {sorted(KNOWN_CYCLES - found)}"


def test_no_new_upward_imports_and_no_fixed_ones_listed():
    found = upward_imports(import_graph())
    assert not found - KNOWN_UPWARD_IMPORTS, f"new upward imports: {sorted(found - KNOWN_UPWARD_IMPORTS)}"
    assert not KNOWN_UPWARD_IMPORTS - found, \
        f"fixed: remove from KNOWN_UPWARD_IMPORTS: {sorted(KNOWN_UPWARD_IMPORTS - found)}"


def test_the_graph_reader_sees_imports_inside_functions():
    # the imports that hide cycles: kiln/backend.py imports kiln.aot inside compile functions only
    source = (ROOT / "backend.py").read_text()
    assert "\n    from kiln.aot import aot_compile" in source and "\nfrom kiln.aot" not in source
    assert "kiln.aot" in import_graph()["kiln.backend"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]
    assert cycles({"a": {"b"}, "b": set()}) == []


if __name__ == "__main__":
    graph = import_graph()
    for component in cycles(graph):
        print(f"cycle of {len(component)}: {', '.join(component)}")
    for source, target in sorted(upward_imports(graph)):
        print(f"upward: {source} -> {target}")


_IMPORT_EACH = r"""
import importlib, os, sys
import numpy, sympy, torch  # third-party start-up paid once; kiln itself is never imported here
import torch._dynamo, torch._functorch.aot_autograd  # (torch's own, 4 s that each child would pay again)
try:
    import triton
except ImportError:
    pass
failures, running = [], {}
names = list(sys.argv[1:])
while names or running:
    while names and len(running) < (os.cpu_count() or 1):
        name = names.pop(0)
        pid = os.fork()
        if pid == 0:  # a child with no kiln module loaded: `name` is the first one it imports
            try:
                importlib.import_module(name)
            except BaseException as error:
                print(f"{name}: {type(error).__name__}: {error}", flush=True)
                os._exit(1)
            os._exit(0)
        running[pid] = name
    pid, status = os.wait()
    if status != 0:
        failures.append(running[pid])
    del running[pid]
print("failed:", " ".join(failures))
sys.exit(1 if failures else 0)
"""


def test_each_module_imports_on_its_own():
    """Every kiln module imports as the first kiln module of a fresh process (a forked child of one
    that has imported torch, its compiler stack, sympy and numpy, but nothing of kiln's): an import
    cycle that works in one import order only, or a module that needs another imported first, fails."""
    import os
    import subprocess
    import sys

    if not hasattr(os, "fork"):
        import pytest

        pytest.skip("needs os.fork")
    names = sorted(modules())
    # One OpenMP thread: no thread pool is carried across the forks.
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *names], capture_output=True, text=True,
                            timeout=600, cwd=ROOT.parent, env=env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
