"""Raising and catching exceptions inside interpreted frames: the exception opcodes of `Frame`.

CPython (3.11+) compiles `try`/`except`/`finally`/`with` into an exception table: ranges of
instructions, each with the handler that runs when one of them raises, the value-stack
depth to cut back to, and whether the handler wants the raising instruction's offset. The
interpreter follows it the same way. What the program raises is a `ProgramException`
(kiln/frontend/errors.py): RAISE_VARARGS and RERAISE, or a tracker that knows Python raises
there (a missing dict key, an attribute lookup that fails, `next()` on an exhausted
iterator, a builtin on constants). When one leaves an instruction, `catch` looks the
instruction up in the frame's table: the stack is cut to the handler's depth, the exception
object pushed, and interpretation goes on at the handler (PUSH_EXC_INFO, CHECK_EXC_MATCH,
POP_EXCEPT, RERAISE, WITH_EXCEPT_START run it). Without a handler the exception leaves the
frame and reaches the instruction of its caller that made the call, which does the same. One
that no interpreted frame catches leaves the compiled function: kiln cannot capture that
frame (eager Python raises it).

The exception being handled (what a bare `raise` re-raises) is kept as CPython keeps it:
PUSH_EXC_INFO saves the previous one on the value stack and POP_EXCEPT restores it; each
frame holds the one its own handler is running, and a frame without one sees its caller's.
Side effects made before the raise stay made, as in Python. `generator.throw` runs the same
machinery at a suspended `yield`; `except*` is not modelled.
"""
from __future__ import annotations

import functools
import sys
import types

from kiln.frontend import bytecode
from kiln.frontend.errors import ProgramException, Unsupported
from kiln.frontend.variables.base import NONE, ConstantVariable, Variable
from kiln.frontend.variables.containers import TupleVariable
from kiln.frontend.variables.modules import PythonModuleVariable
from kiln.frontend.variables.objects import ClassVariable, ExceptionVariable


@functools.lru_cache(maxsize=1024)
def exception_table(code: types.CodeType) -> tuple[tuple[int, int, int, int, bool], ...]:
    """(first, last, handler, depth, lasti) per entry, as instruction indices of `bytecode.decode(code)`."""
    decoded = bytecode.decode(code)
    index_of = {id(instruction): index for index, instruction in enumerate(decoded.instructions)}
    return tuple((index_of[id(entry.start)], index_of[id(entry.end)], index_of[id(entry.target)], entry.depth,
                  entry.lasti) for entry in decoded.exception_table)


class SavedException(Variable):
    """What PUSH_EXC_INFO leaves on the value stack: the exception that was being handled before (or None)."""

    def __init__(self, exception: Variable | None):
        self.exception = exception

    def describe(self) -> str:
        return "saved exception state"


class TracebackVariable(Variable):
    """The traceback `__exit__` receives: kiln has none to give, so only its identity is known."""

    def describe(self) -> str:
        return "traceback"

    def python_type(self) -> type:
        return types.TracebackType


class ExceptionHandling:
    """Frame's exception handling (mixed into interpreter.Frame, which provides the stack, code and `_execute`)."""

    handled_exception: Variable | None = None  # the exception this frame's handler is running, if any

    def run_handling_exceptions(self) -> None:
        """`_execute`, resumed at the handler each time a ProgramException the frame catches leaves an instruction."""
        while True:
            try:
                self._execute()
            except ProgramException as raised:
                if not self.catch(raised):
                    raise

    def catch(self, raised: ProgramException) -> bool:
        """Route `raised` to this frame's handler for the instruction running now; False when it has none."""
        exception = exception_object(raised)
        if self.current is None:
            return False
        index = self.index_of[id(self.current)]
        for first, last, handler, depth, lasti in exception_table(self.code):
            if first <= index <= last:
                break
        else:
            return False
        del self.stack[depth:]
        if lasti:
            self.push(ConstantVariable(self.current.offset))
        self.push(exception)
        self.ip = handler
        return True

    def current_exception(self) -> Variable | None:
        """The exception being handled, as `sys.exc_info()` would see it from this frame."""
        frame = self
        while frame is not None:
            if frame.handled_exception is not None:
                return frame.handled_exception
            frame = frame.parent
        return None

    def exception_info(self) -> Variable:
        """`sys.exc_info()`: the exception a handler of the trace is running (its traceback opaque), else
        (None, None, None), guarded: a caller running an `except` clause would make Python see its exception."""
        exception = self.current_exception()
        if exception is None:
            if self.output.caller_handles_exception:
                raise Unsupported("sys.exc_info() with no handler running in the trace, called while the caller "
                                  "handles an exception (Python would see the caller's)")
            guards = self.output.guards
            guards.add(None, f"{guards.constant(sys.exc_info)}()[0] is not None",
                       "called while an exception is being handled")
            return TupleVariable([NONE, NONE, NONE])
        return TupleVariable([ClassVariable(exception.python_type()), exception, TracebackVariable()])

    def closes_quietly(self) -> bool:
        """Whether closing this suspended generator frame runs none of the program.

        `close()` (what dropping a generator does) throws GeneratorExit in at the `yield`. When
        the handlers on its way only test `except` clauses that do not match it and re-raise
        (`try: yield ... except IndexError:`, as `Sequence.__iter__` has), nothing runs and
        the generator may be left suspended. The handlers' loads are made (and guarded) on a
        copy of the stack; a `finally`, a `with`, a clause that matches, or any other
        instruction means the program's code would run: not quiet.
        """
        saved = (self.stack, self.ip, self.current, self.handled_exception)
        self.stack = list(self.stack)
        raised = ProgramException("GeneratorExit", GeneratorExit, exception=ExceptionVariable(GeneratorExit, []))
        try:
            while self.catch(raised):
                raised = self._run_quiet_handler()
                if raised is None:
                    return False
            return True  # it leaves the frame: close() is done
        except Unsupported:
            return False
        finally:
            self.stack, self.ip, self.current, self.handled_exception = saved

    def _run_quiet_handler(self) -> ProgramException | None:
        """Run a handler that only tests and re-raises; the exception it re-raises, or None if it would do more."""
        for _ in range(1_000):
            instruction = self.instructions[self.ip]
            self.current = instruction
            self.ip += 1
            op = instruction.op
            if op == "LOAD_ATTR" and not isinstance(self.stack[-1], PythonModuleVariable):
                return None  # an attribute of an object could run a property
            if op == "CALL_INTRINSIC_1" and "STOPITERATION" not in str(instruction.argrepr).upper():
                return None
            if op == "RERAISE":
                try:
                    self.RERAISE(instruction)
                except ProgramException as again:
                    return again
            if op == "CLEANUP_THROW":  # 3.12's `yield from` passes GeneratorExit on (its delegate is checked itself)
                exception = self.stack[-1]
                if not isinstance(exception, ExceptionVariable) or issubclass(exception.cls, StopIteration):
                    return None
                return ProgramException("GeneratorExit", exception.cls, exception=exception)
            if op not in _QUIET_HANDLER_OPS:
                return None
            getattr(self, op)(instruction)
            if op == "CHECK_EXC_MATCH" and self.stack[-1].as_constant():
                return None  # the clause catches GeneratorExit: its body runs
        return None

    # -- opcodes ---------------------------------------------------------------------------------

    def RAISE_VARARGS(self, instruction):
        if instruction.arg == 0:
            exception = self.current_exception()
            if exception is None:
                raise Unsupported("a bare `raise` with no exception handled inside the compiled function (the program "
                                  "re-raises its caller's exception, or raises RuntimeError)")
            raise ProgramException(f"{exception.describe()} raised again", exception.python_type(),
                                   exception=exception)
        cause = self.pop() if instruction.arg == 2 else None
        exception = self.exception_to_raise(self.pop())
        context = self.current_exception()
        if context is not None and context is not exception:
            exception.attributes["__context__"] = context
        if cause is not None:
            is_none = isinstance(cause, ConstantVariable) and cause.value is None
            exception.attributes["__cause__"] = NONE if is_none else self.exception_to_raise(cause)
            exception.attributes["__suppress_context__"] = ConstantVariable(True)
        raise ProgramException(f"{exception.describe()} raised and not caught inside the compiled function",
                               exception.cls, exception=exception)

    def exception_to_raise(self, value: Variable) -> ExceptionVariable:
        """The exception object `raise value` raises: the object itself, or an instance of the class."""
        if isinstance(value, ExceptionVariable):
            return value
        if isinstance(value, ClassVariable) and isinstance(value.value, type) and \
                issubclass(value.value, BaseException):
            made = value.call(self, [], {})  # `raise ValueError` makes ValueError()
            if isinstance(made, ExceptionVariable):
                return made
        raise Unsupported(f"raising {value.describe()} (the program raises TypeError unless it is an exception)")

    def PUSH_EXC_INFO(self, instruction):
        exception = self.pop()
        self.push(SavedException(self.handled_exception))
        self.handled_exception = exception
        self.push(exception)

    def POP_EXCEPT(self, instruction):
        saved = self.pop()
        if not isinstance(saved, SavedException):
            raise Unsupported(f"POP_EXCEPT found {saved.describe()} where the saved exception state belongs")
        self.handled_exception = saved.exception

    def CHECK_EXC_MATCH(self, instruction):
        wanted = self.pop()
        exception = self.stack[-1]
        classes = wanted.as_constant()
        for cls in classes if isinstance(classes, tuple) else (classes,):
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                raise Unsupported(f"`except {wanted.describe()}`: not an exception class (the program raises "
                                  "TypeError)")
        self.push(ConstantVariable(issubclass(exception.python_type(), classes)))

    def RERAISE(self, instruction):
        exception = self.pop()  # (with an arg, CPython also reads the traceback's offset below it, in place)
        if not isinstance(exception, ExceptionVariable):
            raise Unsupported(f"RERAISE of {exception.describe()}")
        raise ProgramException(f"{exception.describe()} raised and not caught inside the compiled function",
                               exception.cls, exception=exception)

    def WITH_EXCEPT_START(self, instruction):
        """A `with` block left by an exception: `__exit__(type, value, traceback)`; a true result swallows it."""
        exception = self.stack[-1]
        exit_method = self.stack[-4]
        self.push(exit_method.call(self, [ClassVariable(exception.python_type()), exception, TracebackVariable()],
                                   {}))

    def CHECK_EG_MATCH(self, instruction):
        raise Unsupported("`except*` (exception groups) inside a compiled function")


# What an `except` clause that does not match runs: loads of the class, the test, the jump, and the re-raise.
_QUIET_HANDLER_OPS = frozenset({
    "PUSH_EXC_INFO", "POP_EXCEPT", "CHECK_EXC_MATCH", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE", "JUMP", "NOP", "COPY",
    "SWAP", "POP_TOP", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_FAST", "LOAD_CONST", "LOAD_ATTR", "BUILD_TUPLE",
    "CALL_INTRINSIC_1"})


def exception_object(raised: ProgramException) -> ExceptionVariable:
    """The tracker of the exception `raised` stands for (made, once, from its type and arguments)."""
    if raised.exception is None:
        raised.exception = ExceptionVariable(raised.exception_type, raised.exception_args)
    return raised.exception


def stop_iteration_error(exception: Variable) -> Variable:
    """PEP 479: a StopIteration leaving a generator becomes RuntimeError (3.12's INTRINSIC_STOPITERATION_ERROR)."""
    if isinstance(exception, ExceptionVariable) and issubclass(exception.cls, StopIteration):
        error = ExceptionVariable(RuntimeError, [ConstantVariable("generator raised StopIteration")])
        error.attributes["__cause__"] = exception
        return error
    return exception
