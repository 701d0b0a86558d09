"""kiln's own frontend: capture a Python function's tensor work by interpreting its bytecode.

    dispatcher = kiln.frontend.compile_function(fn, graph_compiler, fullgraph=False)

`kiln.compile` uses it when `kiln.config.frontend == "kiln"`. The pieces, in data
order: bytecode.py/versions.py (decode and re-assemble bytecode on 3.11-3.13),
interpreter.py (the symbolic interpreter), variables/ (the trackers), output.py (FX
graph, entry function; entry_codegen.py writes the entry's expressions, side_effects.py
the side effects it replays), guards.py (guard functions), dispatcher.py (cache
entries, recompiles). See docs/design/frontend.md.
"""
from __future__ import annotations

from typing import Callable

from kiln.frontend.dispatcher import RECOMPILE_LIMIT, CacheEntry, Dispatcher, stats
from kiln.frontend.errors import FullgraphError, Unsupported


def compile_function(fn: Callable, graph_compiler: Callable, *, fullgraph: bool = False,
                     dynamic: bool | None = None) -> Dispatcher:
    """A dispatcher that traces `fn` (a function, bound method or nn.Module) on first call.

    dynamic: None (static first; sizes and int/float arguments that change become symbolic),
    True (symbolic from the first trace) or False (always static); see frontend/dynamic.py."""
    return Dispatcher(fn, graph_compiler, fullgraph=fullgraph, dynamic=dynamic)


__all__ = ["compile_function", "Dispatcher", "CacheEntry", "FullgraphError", "Unsupported", "RECOMPILE_LIMIT",
           "stats"]
