"""Why a frame could not be captured, and where.

`Unsupported` is raised inside the symbolic interpreter for any Python construct it
does not model; the interpreter adds the user source location (file:line and the
inlining stack) before it leaves. Without `fullgraph=True` the dispatcher then runs
the frame eagerly; with it, `FullgraphError` reaches the user.
"""
from __future__ import annotations

from kiln.backend import KilnCompileError


class GraphRaised(Exception):
    """A compiled graph raised (its `__cause__` says what: an out-of-range gather index, say). Nothing of the
    frame's has been seen yet (the entry replays the side effects and AOTAutograd writes the mutated inputs back
    only after the graph returns), while the program's own run would have made the effects that come before the
    failing op: the dispatcher runs the frame again eagerly, which makes them and raises eager's error."""


class Unsupported(Exception):
    """A construct the symbolic interpreter does not model (message says which)."""

    def __init__(self, message: str, breakable: bool = True):
        super().__init__(message)
        self.message = message
        self.locations: list[str] = []  # innermost first: "file:line in function"
        self.frames: list = []  # the interpreter frames it left, innermost first (where a graph break can go)
        # False for what must not run in Python from an entry function, whose frame is not the program's:
        # warnings and log records (they name their caller's line and module's registry).
        self.breakable = breakable
        # True for frame introspection (`sys._getframe`): a break makes the call from the entry function
        # itself, which stands in for the program's frame (its file, name, line and globals), so no frame
        # of kiln's lies between the call and that stand-in (resume.break_tail).
        self.reads_frames = False

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


class ProgramException(Unsupported):
    """The program itself raises here, as Python would: an exception of `exception_type`.

    The interpreter hands it to the innermost `try` of the interpreted frames that catches
    it (the frame's exception table, as CPython does); one no frame catches leaves the
    compiled function, which kiln cannot capture (eager Python raises it). `exception` is
    the tracker of the exception object once there is one (`raise err` of an object the
    trace made, a re-raise); otherwise one is made from `exception_type` and
    `exception_args` (trackers, or None where kiln does not know Python's exact arguments,
    such as an AttributeError's message: reading them is then unsupported).
    """

    def __init__(self, message: str, exception_type: type[BaseException] = Exception, exception_args=None,
                 exception=None):
        super().__init__(message)
        self.exception_type = exception_type
        self.exception_args = exception_args
        self.exception = exception


class AttributeFailure(ProgramException):
    """An attribute lookup that fails the way Python's would (hasattr/getattr-with-default catch it)."""

    def __init__(self, message: str):
        super().__init__(message, AttributeError)


class FullgraphError(KilnCompileError):
    """kiln.compile(fullgraph=True) met code it cannot put into one graph."""


HOW_TO_FIX = ("move the construct out of the compiled function, or compile without fullgraph=True "
              "to run this function eagerly")

HOW_TO_FIX_EAGER = ("move the construct out of the compiled function, or compile the parts around it "
                    "separately; kiln.compile(fullgraph=True) raises here instead")
