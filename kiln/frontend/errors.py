"""Why a frame could not be captured, and where.

`Unsupported` is raised inside the symbolic interpreter for any Python construct it
does not model; the interpreter adds the user source location (file:line and the
inlining stack) before it leaves. Without `fullgraph=True` the dispatcher then runs
the frame eagerly; with it, `FullgraphError` reaches the user.
"""
from __future__ import annotations

from kiln.backend import KilnCompileError


class Unsupported(Exception):
    """A construct the symbolic interpreter does not model (message says which)."""

    def __init__(self, message: str, breakable: bool = True):
        super().__init__(message)
        self.message = message
        self.locations: list[str] = []  # innermost first: "file:line in function"
        self.frames: list = []  # the interpreter frames it left, innermost first (where a graph break can go)
        # False for what must not run in Python from an entry function, whose frame is not the program's:
        # warnings and log records (they name their caller's line), frame introspection.
        self.breakable = breakable

    def add_location(self, location: str) -> None:
        if location not in self.locations:
            self.locations.append(location)

    def describe(self) -> str:
        if not self.locations:
            return self.message
        where = self.locations[0]
        stack = "".join(f"\n    called from {location}" for location in self.locations[1:])
        return f"{self.message}\n  at {where}{stack}"


class unbreakable:
    """`with unbreakable():` marks the Unsupported raised inside as one a graph break must not run in Python."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        if isinstance(exc, Unsupported):
            exc.breakable = False
        return False


class AttributeFailure(Unsupported):
    """An attribute lookup that fails the way Python's would (hasattr/getattr-with-default catch it)."""


class FullgraphError(KilnCompileError):
    """kiln.compile(fullgraph=True) met code it cannot put into one graph."""


HOW_TO_FIX = ("move the construct out of the compiled function, or compile without fullgraph=True "
              "to run this function eagerly")

HOW_TO_FIX_EAGER = ("move the construct out of the compiled function, or compile the parts around it "
                    "separately; kiln.compile(fullgraph=True) raises here instead")
