"""The symbolic interpreter: runs a frame's bytecode on variable trackers.

A `Frame` holds a value stack and locals of trackers and executes the normalized
instructions of one code object (kiln/frontend/bytecode.py, versions.py) one by
one; each opcode is one method named after it (`LOAD_FAST`, `CALL`, ...). Calls of
Python functions are inlined by running a child `Frame`; tensor operations reach
the `OutputGraph` through the trackers. Conditional jumps need the condition's
value at trace time: constants, shapes and Python containers are fine; a tensor
condition is data-dependent and unsupported. Calling a generator function makes a
`GeneratorVariable` (interpreter_variables.py) whose frame is resumed to its next
`yield` on each `next()` (`Frame.resume`), so generators run exactly as far as their
consumers ask.

Adding an opcode: write a method with its normalized name, on `Frame` or on the
mixin of its family (name_opcodes.py, container_opcodes.py, exceptions.py, matching.py).
Adding a variable kind: see kiln/frontend/variables/ and `variables.builder.wrap`.
"""
from __future__ import annotations

import builtins
import contextlib
import functools
import inspect
import operator
import types
from typing import Any

from kiln.frontend import bytecode, versions
from kiln.frontend.container_opcodes import ContainerOpcodes
from kiln.frontend.errors import ProgramException, Unsupported
from kiln.frontend.exceptions import ExceptionHandling, exception_table
from kiln.frontend.interpreter_variables import ContextExitVariable, GeneratorVariable, SuperVariable
from kiln.frontend.matching import PatternMatching
from kiln.frontend.name_opcodes import NameOpcodes
from kiln.frontend.operations import binary_op, compare_op, contains, unary_op
from kiln.frontend.output import OutputGraph
from kiln.frontend.sources import Source
from kiln.frontend.variables import builder
from kiln.frontend.variables import kinds  # noqa: F401 (its import registers every tracker kind with builder.wrap)
from kiln.frontend.variables.base import NONE, NULL, ConstantVariable, Variable, is_same
from kiln.frontend.variables.containers import (BaseIteratorVariable, DictVariable, ExternalDictVariable, ListVariable,
                                                SliceVariable, hashable_key, iterate, unpack_iterable)
from kiln.frontend.variables.functions import (BaseFunctionVariable, CellVariable, NestedFunctionVariable,
                                               OpaqueFunctionVariable)
from kiln.frontend.variables.objects import ClassVariable
from kiln.frontend.variables.tensor import TensorVariable

MAX_INLINE_DEPTH = 64
_GENERATOR_FLAGS = inspect.CO_GENERATOR
_UNSUPPORTED_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


@functools.lru_cache(maxsize=4096)
def _decoded(code: types.CodeType) -> tuple[list[bytecode.Instruction], dict[int, int]]:
    instructions = bytecode.decode(code).instructions
    return instructions, {id(instruction): index for index, instruction in enumerate(instructions)}


@functools.lru_cache(maxsize=1024)
def _cleanup_protected(code: types.CodeType) -> frozenset[int]:
    """Indices of the instructions inside a `try`/`with` whose handler runs code when the frame is abandoned.

    A generator suspended there and dropped would run that cleanup (GeneratorExit) in
    Python. The handler 3.12 puts around a whole generator body (turning a stray
    StopIteration into RuntimeError) runs nothing on GeneratorExit, so it does not count.
    """
    decoded = bytecode.decode(code)
    index_of = {id(instruction): index for index, instruction in enumerate(decoded.instructions)}
    protected: set[int] = set()
    for entry in decoded.exception_table:
        handler = entry.target
        if handler.opname == "CALL_INTRINSIC_1" and "STOPITERATION" in str(handler.argrepr).upper():
            continue
        protected.update(range(index_of[id(entry.start)], index_of[id(entry.end)] + 1))
    return frozenset(protected)


class _Return(Exception):
    def __init__(self, value: Variable):
        self.value = value


class BreakHere(BaseException):
    """The retrace reached its graph break: `frame` stops before its current instruction.

    A BaseException, so that no handler meant for tracing errors swallows it on its way to
    the dispatcher.
    """

    def __init__(self, frame: "Frame"):
        self.frame = frame


class _Yield(Exception):
    """A generator frame suspends: YIELD_VALUE hands `value` to whoever resumed it."""

    def __init__(self, value: Variable):
        self.value = value


class Frame(ExceptionHandling, PatternMatching, NameOpcodes, ContainerOpcodes):
    """One function activation being interpreted symbolically."""

    def __init__(self, output: OutputGraph, code: types.CodeType, fn_globals: dict, local_values: dict[str, Variable],
                 cells: dict[str, CellVariable], parent: "Frame | None" = None, is_generator: bool = False,
                 hidden_callers: int | None = 0):
        self.output = output
        self.code = code
        self.fn_globals = fn_globals
        self.locals = local_values
        self.cells = cells
        self.parent = parent
        self.depth = 0 if parent is None else parent.depth + 1
        self.instructions, self.index_of = _decoded(code)
        self.stack: list[Variable] = []
        self.ip = 0
        self.kw_names: tuple[str, ...] | None = None
        self.is_generator = is_generator
        self.return_value: Variable = NONE  # a generator's, once it returned
        # Frames Python runs between the parent's call and this one that kiln does not interpret
        # (nn.Module's call machinery, a decorator's wrapper): None when not known exactly.
        self.hidden_callers = hidden_callers
        self._callee_hidden_callers: int | None = 0
        self.current: bytecode.Instruction | None = None
        self.globals_source = output.named_source("__globals", fn_globals)
        self.visits = [0] * len(self.instructions)  # runs of each instruction (a graph break names one run)

    # -- running ---------------------------------------------------------------------------------

    def run(self) -> Variable:
        """Run to the end and return the frame's result (a generator frame is stepped by `resume`)."""
        try:
            self.run_handling_exceptions()
        except _Return as done:
            return done.value
        raise AssertionError("a frame that is not a generator yielded")

    def resume(self, caller: "Frame", sent: Variable) -> Variable | None:
        """Run a generator frame to its next yield (its value) or its end (None); `caller` resumed it."""
        self.parent = caller  # Python's stack while the generator runs: it is called from its consumer
        self.hidden_callers = 0
        self.depth = caller.depth + 1
        if self.depth >= MAX_INLINE_DEPTH:
            raise Unsupported(f"inlining deeper than {MAX_INLINE_DEPTH} calls at generator {self.code.co_qualname}")
        if self.current is not None:  # a suspended YIELD_VALUE evaluates to what was sent
            self.push(sent)
        try:
            self.run_handling_exceptions()
        except _Yield as suspended:
            return suspended.value
        except _Return as done:
            self.return_value = done.value  # what `yield from` this generator evaluates to
            return None
        raise AssertionError("a generator frame stopped without yielding or returning")

    def throw(self, caller: "Frame", raised: ProgramException) -> Variable | None:
        """generator.throw: `raised` at the suspended yield, handled as the generator's code says; then the next
        yield's value, or None when the generator returned. Uncaught, it leaves the generator (which has ended)."""
        self.parent = caller
        self.hidden_callers = 0
        self.depth = caller.depth + 1
        index = self.index_of[id(self.current)] if self.current is not None else 0
        if index > 0 and self.instructions[index - 1].op == "SEND":
            raise Unsupported(f"throwing into generator {self.code.co_qualname} suspended in `yield from` (Python "
                              "throws into the delegate first)")
        if self.current is None or not self.catch(raised):  # not started, or not caught: it ends the generator
            raise raised
        try:
            self.run_handling_exceptions()
        except _Yield as suspended:
            return suspended.value
        except _Return as done:
            self.return_value = done.value
            return None
        raise AssertionError("a generator frame stopped without yielding or returning")

    def _execute(self) -> None:
        try:
            while True:
                index = self.ip
                instruction = self.instructions[index]
                self.current = instruction
                if self.output.break_point is not None and self._breaks_at(index):
                    raise BreakHere(self)
                self.visits[index] += 1
                self.ip += 1
                handler = getattr(self, instruction.op, None)
                if handler is None:
                    raise Unsupported(f"Python bytecode {instruction.opname} ({_describe_opcode(instruction)})")
                handler(instruction)
        except (_Return, _Yield):
            raise
        except Unsupported as error:
            error.add_location(self.location())
            error.frames.append(self)
            raise
        except Exception as error:  # a frontend bug or a user error met while tracing: remember where
            _note_location(error, self.location())
            raise

    def _breaks_at(self, index: int) -> bool:
        """Whether the retrace stops here: the graph break the first trace found (kiln/frontend/resume.py)."""
        point = self.output.break_point
        return point.index == index and point.code is self.code and point.depth == self.depth and \
            point.count == self.visits[index]

    def location(self) -> str:
        return f"{self.code.co_filename}:{self.lineno()} in {self.code.co_qualname}"

    def lineno(self) -> int:
        """The line Python's frame would report now (`f_lineno`): that of the instruction running."""
        line = self.current.lineno if self.current is not None else None
        return line if line is not None else self.code.co_firstlineno

    def python_caller(self, levels: int) -> "Frame | None":
        """The frame `levels` calls up Python's stack from this one (0: this one), as `sys._getframe` sees it.

        None when the answer lies outside the trace (above the compiled frame) or behind
        calls kiln models without interpreting (nn.Module's call machinery): then the
        real frame is not known at trace time.
        """
        frame: Frame | None = self
        while levels > 0 and frame is not None:
            if frame.hidden_callers != 0:
                return None
            frame = frame.parent
            levels -= 1
        if frame is not None and frame.parent is None and frame.fn_globals.get("__name__") == "kiln.frontend.dispatcher":
            return None  # kiln's own frame for a compiled module or callable object: eager has the user's caller there
        return frame

    def suspended_in_cleanup_block(self) -> bool:
        """A started, unfinished generator paused inside a `try`/`with` (abandoning it would run cleanup)."""
        return self.current is not None and self.ip - 1 in _cleanup_protected(self.code)

    def wrap(self, value: Any, source: Source | None, guard: bool = True) -> Variable:
        return builder.wrap(self, value, source, guard)

    def wrap_sourceless(self, value: Any) -> Variable:
        return builder.wrap_sourceless(self, value)

    def push(self, value: Variable) -> None:
        self.stack.append(value)

    def pop(self) -> Variable:
        return self.stack.pop()

    def popn(self, count: int) -> list[Variable]:
        if count == 0:
            return []
        values = self.stack[-count:]
        del self.stack[-count:]
        return values

    def jump(self, instruction: bytecode.Instruction) -> None:
        self.ip = self.index_of[id(instruction.target)]

    # -- calls -------------------------------------------------------------------------------------

    def call_function(self, fn: Variable, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        return fn.call(self, args, kwargs)

    @contextlib.contextmanager
    def behind_uninterpreted_frames(self):
        """Calls inlined inside this block are reached in Python through frames kiln models without
        interpreting (nn.Module's `__call__`, a decorator's wrapper): their callers are not known exactly."""
        previous, self._callee_hidden_callers = self._callee_hidden_callers, None
        try:
            yield
        finally:
            self._callee_hidden_callers = previous

    def inline_call(self, function: BaseFunctionVariable, args: list[Variable], kwargs: dict[str, Variable]) -> Variable:
        """Run a Python function's bytecode in a child frame and return its result tracker."""
        code = function.code()
        if self.depth >= MAX_INLINE_DEPTH:
            raise Unsupported(f"inlining deeper than {MAX_INLINE_DEPTH} calls (recursion?) at {code.co_qualname}")
        if code.co_flags & _UNSUPPORTED_FLAGS:
            raise Unsupported(f"calling async function {code.co_qualname}")
        bound = function.bind(self, args, kwargs)
        cells: dict[str, CellVariable] = {}
        for name in code.co_cellvars:
            cells[name] = CellVariable(bound.pop(name) if name in bound else CellVariable.EMPTY)
        for name, cell in zip(code.co_freevars, function.closure_cells(self)):
            cells[name] = cell
        is_generator = bool(code.co_flags & _GENERATOR_FLAGS)
        child = Frame(self.output, code, function.function_globals(), bound, cells, self, is_generator,
                      self._callee_hidden_callers)
        if is_generator:  # calling a generator function runs none of its body: next() steps it
            generator = GeneratorVariable(child)
            self.output.generators.append(generator)
            return generator
        return child.run()

    def make_super(self, args: list[Variable]) -> "SuperVariable":
        if args:
            return SuperVariable(args[0].as_constant(), args[1])
        if "__class__" not in self.cells or not self.code.co_varnames:
            raise Unsupported("super() without arguments outside a method")
        cls = self.cells["__class__"].load(self).as_constant()
        first = self.code.co_varnames[0]
        receiver = self.locals.get(first)
        if receiver is None and first in self.cells:
            receiver = self.cells[first].load(self)
        return SuperVariable(cls, receiver)

    def _call_with_stack(self, args: list[Variable], kwargs: dict[str, Variable]) -> None:
        upper = self.pop()
        lower = self.pop()
        fn, bound_self = versions.split_callable_pair(lower, upper, NULL)
        if bound_self is not None:
            args = [bound_self, *args]
        self.push(self.call_function(fn, args, kwargs))

    # -- opcodes: stack and constants (locals, cells and globals: name_opcodes.py) ------------------

    def NOP(self, instruction):
        pass

    def POP_TOP(self, instruction):
        self.pop()

    def PUSH_NULL(self, instruction):
        self.push(NULL)

    def COPY(self, instruction):
        self.push(self.stack[-instruction.arg])

    def SWAP(self, instruction):
        self.stack[-1], self.stack[-instruction.arg] = self.stack[-instruction.arg], self.stack[-1]

    def LOAD_CONST(self, instruction):
        value = instruction.argval
        if isinstance(value, (type, types.BuiltinFunctionType)) or \
                (isinstance(value, types.FunctionType) and builder.call_handler(value) is not None):
            # only in resume code: enumerate, next, bound_exit (resume.py)
            self.push(self.wrap_sourceless(value))
            return
        self.push(ConstantVariable(value))

    def RETURN_CONST(self, instruction):
        raise _Return(ConstantVariable(instruction.argval))

    def RETURN_VALUE(self, instruction):
        raise _Return(self.pop())

    # -- opcodes: attributes and items ----------------------------------------------------------------

    def LOAD_ATTR(self, instruction):
        self.push(self.pop().getattr(self, instruction.argval))

    def LOAD_METHOD(self, instruction):
        receiver = self.pop()
        versions.push_callable_with_null(self.stack, receiver.getattr(self, instruction.argval), NULL)

    def LOAD_SUPER_ATTR(self, instruction):
        receiver = self.pop()
        cls = self.pop()
        self.pop()  # the global `super`
        attribute = SuperVariable(cls.as_constant(), receiver).getattr(self, instruction.argval)
        if versions.load_super_attr_is_method(instruction.arg):
            versions.push_callable_with_null(self.stack, attribute, NULL)
        else:
            self.push(attribute)

    def STORE_ATTR(self, instruction):
        target = self.pop()
        value = self.pop()
        target.setattr(self, instruction.argval, value)

    def DELETE_ATTR(self, instruction):
        target = self.pop()
        deleter = getattr(target, "delattr", None)
        if deleter is None:
            raise Unsupported(f"del on attribute {instruction.argval!r} of {target.describe()}")
        deleter(self, instruction.argval)

    def BINARY_SUBSCR(self, instruction):
        key = self.pop()
        container = self.pop()
        self.push(container.getitem(self, key))

    def STORE_SUBSCR(self, instruction):
        key = self.pop()
        container = self.pop()
        value = self.pop()
        container.setitem(self, key, value)

    def DELETE_SUBSCR(self, instruction):
        key = self.pop()
        container = self.pop()
        if isinstance(container, ExternalDictVariable):
            container.call_method(self, "__delitem__", [key], {})
        elif isinstance(container, DictVariable):
            container.call_method(self, "__delitem__", [key], {})
        elif isinstance(container, ListVariable):
            del container.items[key.as_constant()]
            container._mutated(self)
        else:
            raise Unsupported(f"del on an item of {container.describe()}")

    def BINARY_SLICE(self, instruction):
        stop = self.pop()
        start = self.pop()
        container = self.pop()
        self.push(container.getitem(self, SliceVariable(start, stop, NONE)))

    def STORE_SLICE(self, instruction):
        stop = self.pop()
        start = self.pop()
        container = self.pop()
        value = self.pop()
        container.setitem(self, SliceVariable(start, stop, NONE), value)

    def BUILD_SLICE(self, instruction):
        parts = self.popn(instruction.arg)
        if len(parts) == 2:
            parts.append(NONE)
        self.push(SliceVariable(*parts))

    # -- opcodes: operators ----------------------------------------------------------------------------

    def BINARY_OP(self, instruction):
        right = self.pop()
        left = self.pop()
        self.push(binary_op(self, instruction.argrepr, left, right))

    def UNARY_NEGATIVE(self, instruction):
        self.push(unary_op(self, operator.neg, self.pop()))

    def UNARY_POSITIVE(self, instruction):
        self.push(unary_op(self, operator.pos, self.pop()))

    def UNARY_INVERT(self, instruction):
        self.push(unary_op(self, operator.invert, self.pop()))

    def UNARY_NOT(self, instruction):
        self.push(ConstantVariable(not self.pop().truth(self)))

    def TO_BOOL(self, instruction):
        self.push(ConstantVariable(self.pop().truth(self)))

    def COMPARE_OP(self, instruction):
        right = self.pop()
        left = self.pop()
        self.push(compare_op(self, versions.compare_operator(instruction.argval), left, right))

    def IS_OP(self, instruction):
        right = self.pop()
        left = self.pop()
        self.push(ConstantVariable(is_same(left, right, self) != bool(instruction.arg)))

    def CONTAINS_OP(self, instruction):
        container = self.pop()
        item = self.pop()
        self.push(ConstantVariable(contains(self, container, item) != bool(instruction.arg)))

    # -- opcodes: control flow ---------------------------------------------------------------------------

    def JUMP(self, instruction):
        self.jump(instruction)

    def POP_JUMP_IF_FALSE(self, instruction):
        if not self.pop().truth(self):
            self.jump(instruction)

    def POP_JUMP_IF_TRUE(self, instruction):
        condition = self.pop()
        if isinstance(condition, TensorVariable):  # `assert (a > 0).all(), "message"`: a graph node, not a break
            message = self._assertion_message()
            if message is not None and self._uncaught_here() and condition.assert_true(self, message):
                self.jump(instruction)
                return
        if condition.truth(self):
            self.jump(instruction)

    def _assertion_message(self) -> str | None:
        """The message of the `assert` whose failure branch starts at the next instruction (CPython's shape:
        LOAD_ASSERTION_ERROR, then RAISE_VARARGS, or a constant string called in and raised); else None."""
        following = [instruction for instruction in self.instructions[self.ip:self.ip + 8] if instruction.op != "NOP"]
        ops = [instruction.op for instruction in following]
        if ops[:2] == ["LOAD_ASSERTION_ERROR", "RAISE_VARARGS"]:
            return "assertion error"
        if ops[:4] == ["LOAD_ASSERTION_ERROR", "LOAD_CONST", "CALL", "RAISE_VARARGS"] and \
                isinstance(following[1].argval, str) and following[2].arg == 0:
            return following[1].argval
        return None

    def _uncaught_here(self) -> bool:
        """Whether an exception raised at the current instruction leaves every interpreted frame (no `try` or
        `with` around it here or in a caller): one the graph raises cannot reach a handler in the trace."""
        frame = self
        while frame is not None:
            if frame.current is not None:
                index = frame.index_of[id(frame.current)]
                if any(first <= index <= last for first, last, *_ in exception_table(frame.code)):
                    return False
            frame = frame.parent
        return True

    def POP_JUMP_IF_NONE(self, instruction):
        if is_same(self.pop(), NONE):
            self.jump(instruction)

    def POP_JUMP_IF_NOT_NONE(self, instruction):
        if not is_same(self.pop(), NONE):
            self.jump(instruction)

    def JUMP_IF_FALSE_OR_POP(self, instruction):
        if not self.stack[-1].truth(self):
            self.jump(instruction)
        else:
            self.pop()

    def JUMP_IF_TRUE_OR_POP(self, instruction):
        if self.stack[-1].truth(self):
            self.jump(instruction)
        else:
            self.pop()

    def GET_ITER(self, instruction):
        self.push(iterate(self, self.pop()))

    def FOR_ITER(self, instruction):
        iterator = self.stack[-1]
        if not isinstance(iterator, BaseIteratorVariable):
            raise Unsupported(f"FOR_ITER over {iterator.describe()}")
        item = iterator.next_item(self)
        if item is not None:
            self.push(item)
            return
        self.pop()
        self.jump(instruction)
        for skipped in versions.for_iter_exhaust_skip():
            if self.instructions[self.ip].opname == skipped:
                self.ip += 1

    def END_FOR(self, instruction):
        self.pop()
        if versions.PY312:
            self.pop()

    def POP_ITER(self, instruction):
        self.pop()

    # -- opcodes: calls and functions -----------------------------------------------------------------------

    def KW_NAMES(self, instruction):
        self.kw_names = self.code.co_consts[instruction.arg]  # dis leaves argval unresolved on 3.11

    def CALL(self, instruction):
        args = self.popn(instruction.arg)
        names = self.kw_names or ()
        self.kw_names = None
        kwargs = {}
        if names:
            kwargs = dict(zip(names, args[len(args) - len(names):]))
            args = args[:len(args) - len(names)]
        self._call_with_stack(args, kwargs)

    def CALL_KW(self, instruction):
        self.kw_names = self.pop().as_constant()
        self.CALL(instruction)

    def CALL_FUNCTION_EX(self, instruction):
        kwargs_variable = self.pop() if instruction.arg & 1 else None
        args = unpack_iterable(self, self.pop())
        kwargs = {}
        if kwargs_variable is not None:
            if isinstance(kwargs_variable, ExternalDictVariable):
                kwargs = {key: kwargs_variable.item(self, key) for key in kwargs_variable.keys(self)}
            elif isinstance(kwargs_variable, DictVariable):
                kwargs = {hashable_key(self, key): value for key, value in kwargs_variable.entries.values()}
            else:
                raise Unsupported(f"** on {kwargs_variable.describe()}")
        self._call_with_stack(args, kwargs)

    def MAKE_FUNCTION(self, instruction):
        code = self.pop().as_constant()
        flags = instruction.arg or 0
        closure = self.pop().unpack(self) if flags & 0x08 else None
        if flags & 0x04:
            self.pop()  # annotations
        kwdefaults = self.pop() if flags & 0x02 else None
        defaults = self.pop().unpack(self) if flags & 0x01 else None
        kwdefault_values = {hashable_key(self, key): value for key, value in kwdefaults.entries.values()} \
            if isinstance(kwdefaults, DictVariable) else None
        self.push(NestedFunctionVariable(code, self.fn_globals, code.co_name, defaults, kwdefault_values, closure))

    def SET_FUNCTION_ATTRIBUTE(self, instruction):
        function = self.pop()
        value = self.pop()
        if instruction.arg == 0x08:
            function.closure = value.unpack(self)
        elif instruction.arg == 0x02:
            function.kwdefaults = {hashable_key(self, key): item for key, item in value.entries.values()}
        elif instruction.arg == 0x01:
            function.defaults = value.unpack(self)
        self.push(function)

    def RETURN_GENERATOR(self, instruction):
        self.push(NONE)  # what the POP_TOP after it drops: the value the first next() sends

    def YIELD_VALUE(self, instruction):
        if not self.is_generator:
            raise Unsupported("yield outside a generator being inlined")
        raise _Yield(self.pop())

    def GET_YIELD_FROM_ITER(self, instruction):
        self.push(iterate(self, self.pop()))

    def SEND(self, instruction):
        """`yield from`: step the delegate; its next value is yielded, its end jumps with its return value."""
        sent = self.pop()
        receiver = self.stack[-1]
        if isinstance(receiver, GeneratorVariable):
            item = receiver.send(self, sent)
            result = receiver.frame.return_value if item is None else None
        elif isinstance(receiver, BaseIteratorVariable) and is_same(sent, NONE):
            item, result = receiver.next_item(self), NONE
        else:
            raise Unsupported(f"`yield from` {receiver.describe()} sending {sent.describe()}")
        if item is not None:
            self.push(item)
            return
        if versions.send_exhaustion_pops_receiver():
            self.stack[-1] = result
        else:
            self.push(result)
        self.jump(instruction)

    def END_SEND(self, instruction):
        del self.stack[-2]

    def BEFORE_WITH(self, instruction):
        manager = self.pop()
        exit_method = ContextExitVariable(manager)
        entered = manager.call_method(self, "__enter__", [], {})
        self.push(exit_method)
        self.push(entered)

    def IMPORT_NAME(self, instruction):
        fromlist = self.pop().as_constant()
        level = self.pop().as_constant()
        module = __import__(instruction.argval, self.fn_globals, None, fromlist, level)
        # The trace imported this module object; the entry holds it by name (a graph break may pass it on).
        self.push(self.wrap(module, self.output.named_source("__module", module), guard=False))

    def IMPORT_FROM(self, instruction):
        self.push(self.stack[-1].getattr(self, instruction.argval))

    def LOAD_ASSERTION_ERROR(self, instruction):
        self.push(ClassVariable(AssertionError))

    def LOAD_BUILD_CLASS(self, instruction):
        # Calling it is unsupported: a graph break defines the class in Python.
        self.push(OpaqueFunctionVariable(builtins.__build_class__))


def _note_location(error: Exception, location: str) -> None:
    try:
        locations = error.__dict__.setdefault("kiln_locations", [])
    except AttributeError:  # exceptions without a __dict__
        return
    if location not in locations:
        locations.append(location)


def _describe_opcode(instruction: bytecode.Instruction) -> str:
    return f"normalized {instruction.op}, arg {instruction.argrepr or instruction.arg}"

