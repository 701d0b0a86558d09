"""Trackers that the interpreter's own opcodes make: generators, a with-block's `__exit__`, `super()`.

- `GeneratorVariable`: calling a generator function (`Frame.inline_call`) makes one; it holds
  the generator's own `Frame` and steps it to its next `yield` on each `next()`, `send` or
  `throw`;
- `ContextExitVariable`: what BEFORE_WITH pushes (the manager's `__exit__`), and `bound_exit`,
  how a resume function's prologue binds a user manager's exit again;
- `SuperVariable`: `super()` and LOAD_SUPER_ATTR.

They live apart from `Frame` (interpreter.py, which imports this module) because they are
trackers, not opcodes, and resume.py rebuilds generators and with-block exits at a graph
break from them; unlike the trackers of variables/, they belong to the interpreter (a
generator runs a `Frame`), so this module is not one of `variables.kinds`' makers.
"""
from __future__ import annotations

import inspect
import types
from typing import Any, Callable

from kiln.frontend.errors import ProgramException, Unsupported
from kiln.frontend.exceptions import exception_object, stop_iteration_error
from kiln.frontend.variables import builder
from kiln.frontend.variables.base import NONE, ConstantVariable, Variable, is_same
from kiln.frontend.variables.containers import MAX_ITERATION_STEPS, BaseIteratorVariable
from kiln.frontend.variables.objects import ClassVariable, ExceptionVariable, bind_class_attribute
from kiln.frontend.variables.torch_special import (GradModeExit, GradModeVariable, InferenceModeVariable,
                                                   NullContextVariable)


class GeneratorVariable(BaseIteratorVariable):
    """A generator made during the trace: its frame runs to the next `yield` on each `next()`.

    Python runs a generator's body only as far as its consumer asks, so stepping it lazily
    keeps side effects and the values the consumer sees in eager's order; a consumer that
    stops early (break, any(), next()) leaves the rest of the body unrun.
    """

    # A generator passed on at a graph break is rebuilt by the entry (resume.reconstruct_generator, registered by
    # resume.py, which sits above this module), one object wherever the trace put it.
    rebuild: Any = None
    built_once = True

    def __init__(self, frame: Frame):
        self.frame = frame
        self.finished = False
        self.running = False
        self.steps = 0
        self.just_returned = False  # it returned on the last step: the next StopIteration carries the value

    def stop_arguments(self) -> list[Variable]:
        value, self.just_returned = self.frame.return_value if self.just_returned else NONE, False
        return [] if is_same(value, NONE) else [value]

    def reconstruct(self, codegen) -> str:
        if GeneratorVariable.rebuild is None:
            return super().reconstruct(codegen)
        return GeneratorVariable.rebuild(codegen, self)

    def describe(self) -> str:
        return f"generator {self.frame.code.co_qualname}"

    def python_type(self) -> type:
        return types.GeneratorType

    def next_item(self, tx) -> Variable | None:
        return self.send(tx, NONE)

    def send(self, tx, value: Variable, thrown: ProgramException | None = None) -> Variable | None:
        """Resume with `value` (or with the exception `thrown` raised at its yield: generator.throw); the next
        yielded value, or None once it has ended."""
        if self.finished:
            if thrown is not None:
                raise thrown
            return None
        if self.running:
            raise Unsupported(f"{self.describe()} resumed while it runs (the program raises ValueError)")
        if self.frame.current is None and not (isinstance(value, ConstantVariable) and value.value is None):
            raise Unsupported(f"sending a value to {self.describe()} before it started (the program raises TypeError)")
        self.steps += 1
        if self.steps > MAX_ITERATION_STEPS:
            raise Unsupported(f"{self.describe()} yielded more than {MAX_ITERATION_STEPS} times during the trace "
                              "(an endless generator?)", breakable=False)
        self.running = True
        try:
            item = self.frame.throw(tx, thrown) if thrown is not None else self.frame.resume(tx, value)
        except ProgramException as raised:  # an exception leaving the generator ends it
            self.finished = True
            if issubclass(raised.exception_type, StopIteration):  # PEP 479
                error = stop_iteration_error(exception_object(raised))
                raise ProgramException("generator raised StopIteration", RuntimeError, exception=error) from None
            raise
        finally:
            self.running = False
        if item is None:
            self.finished = self.just_returned = True
        return item

    def abandoned_with_cleanup(self) -> bool:
        """Suspended where dropping it would make Python run a `finally` or `__exit__`."""
        return not self.finished and self.frame.suspended_in_cleanup_block() and not self.frame.closes_quietly()

    def call_method(self, tx, name, args, kwargs) -> Variable:
        if (name == "send" and len(args) == 1) or (name == "throw" and 1 <= len(args) <= 3):
            thrown = None
            if name == "throw":  # throw(exception), or the older throw(type, value, traceback)
                given = args[1] if len(args) > 1 and not is_same(args[1], NONE) else args[0]
                exception = tx.exception_to_raise(given)
                thrown = ProgramException(f"{exception.describe()} thrown into {self.describe()}", exception.cls,
                                          exception=exception)
            item = self.send(tx, args[0] if thrown is None else NONE, thrown)
            if item is None:
                raise ProgramException(f"{self.describe()}.{name}(): the generator ended", StopIteration,
                                       self.stop_arguments())
            return item
        if name == "close" and not args:
            if self.frame.current is not None and not self.finished and \
                    self.frame.suspended_in_cleanup_block() and not self.frame.closes_quietly():
                return self._close_with_cleanup(tx)
            self.finished = True
            return NONE
        return super().call_method(tx, name, args, kwargs)


    def _close_with_cleanup(self, tx) -> Variable:
        """`close()` of a generator suspended inside `try`/`with`: GeneratorExit thrown in at its yield runs its
        cleanup (`finally`, `__exit__`, handlers), as CPython's close does; the GeneratorExit (or StopIteration)
        leaving it ends the close, a value yielded instead is the program's RuntimeError."""
        exit_error = ExceptionVariable(GeneratorExit, [])
        thrown = ProgramException(f"GeneratorExit thrown into {self.describe()}", GeneratorExit, exception=exit_error)
        try:
            item = self.send(tx, NONE, thrown)
        except ProgramException as raised:
            if not issubclass(raised.exception_type, GeneratorExit):
                raise
            self.finished = True
            return NONE
        if item is not None:
            message = "generator ignored GeneratorExit"
            raise ProgramException(message, RuntimeError, [ConstantVariable(message)])
        return NONE


class ContextExitVariable(Variable):
    """The `__exit__` BEFORE_WITH pushes: called with (None, None, None) on a normal exit, with the exception's
    type, value and traceback by WITH_EXCEPT_START."""

    def __init__(self, manager: Variable):
        self.manager = manager

    def describe(self) -> str:
        return f"__exit__ of {self.manager.describe()}"

    def call(self, tx, args, kwargs) -> Variable:
        return self.manager.call_method(tx, "__exit__", list(args), {})

    def rebuild_parts(self) -> tuple[Callable, list[Variable]] | None:
        """A user context manager's exit, passed to a resume function as its manager: the resume function's prologue
        calls `bound_exit(manager)`, which its trace takes for this tracker again (so it guards the manager as any
        argument, not the identity of a bound method made anew on each call)."""
        return (bound_exit, [self.manager]) if _user_context_manager(self.manager) else None

    def reconstruct(self, codegen) -> str:
        """At a graph break inside the block: an object restoring what the block's exit would."""
        manager = self.manager
        if isinstance(manager, GradModeVariable) and manager.previous:
            return codegen.constant(GradModeExit.restoring(manager.previous[-1]))
        if isinstance(manager, NullContextVariable):
            return codegen.constant(GradModeExit.restoring(None))
        if isinstance(manager, InferenceModeVariable) and manager.exit_object() is not None:
            return codegen.constant(manager.exit_object())  # the entry enters it before the break (output.finish)
        if _user_context_manager(manager):  # its own `__exit__`, bound to the object as the trace left it
            return f"{codegen.constant(bound_exit)}({codegen.value(manager)})"
        raise Unsupported(f"a graph break inside `with` {manager.describe()} (grad-mode and inference-mode blocks "
                          "and user classes with their own __enter__ and __exit__ can be resumed; not this one)")


def _user_context_manager(manager: Variable) -> bool:
    """An instance of a user class whose `__enter__` and `__exit__` are plain Python functions (not contextlib's
    generator-based managers, whose exit steps a generator suspended inside the block)."""
    from kiln.frontend.variables.objects import NewObjectVariable, UserObjectVariable

    if not isinstance(manager, (NewObjectVariable, UserObjectVariable)):
        return False
    cls = manager.python_type()
    methods = [inspect.getattr_static(cls, name, None) for name in ("__enter__", "__exit__")]
    return all(isinstance(method, types.FunctionType) for method in methods) and \
        not cls.__module__.startswith("contextlib")


def bound_exit(manager: Any) -> Callable:
    """`type(manager).__exit__` bound to `manager`: what BEFORE_WITH pushes (a special method, looked up on the type)."""
    return type(manager).__exit__.__get__(manager)


builder.register_call_handler(bound_exit, lambda tx, args, kwargs: ContextExitVariable(args[0]))


class SuperVariable(Variable):
    """super(cls, obj): attribute lookup starting after `cls` in obj's MRO."""

    def __init__(self, cls: type, receiver: Variable):
        self.cls = cls
        self.receiver = receiver

    def describe(self) -> str:
        return f"super({self.cls.__qualname__})"

    def getattr(self, tx, name: str) -> Variable:
        receiver_type = self.receiver.python_type()  # a class's is its metaclass: super() in Meta.__call__
        if isinstance(self.receiver, ClassVariable) and issubclass(self.receiver.value, self.cls):
            receiver_type = self.receiver.value  # super() in a classmethod or __new__
        mro = receiver_type.__mro__
        for klass in mro[mro.index(self.cls) + 1:]:
            if name in klass.__dict__:
                raw = klass.__dict__[name]
                if raw is object.__init__ or raw is object.__init_subclass__:
                    return _NoOpCallable()
                return bind_class_attribute(tx, raw, name, self.receiver, receiver_type, None)
        raise Unsupported(f"super().{name}: not found after {self.cls.__qualname__}")


class _NoOpCallable(Variable):
    def call(self, tx, args, kwargs) -> Variable:
        return NONE
