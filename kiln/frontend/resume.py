"""Graph breaks: where a retrace stops, and the entry's last lines that go on from there.

When the interpreter meets a call or a branch it cannot trace, the dispatcher retraces
the frame up to that instruction (`BreakPoint`), compiles the graph so far, and the entry
function then does what the frame would do next, in Python:

    def __entry(x):
        __outs = __compiled(x)             # the graph up to the break
        ...                                # side effects so far, in program order
        __r = __call(time.perf_counter)    # the unsupported call, made for real
        return __resume0(__outs[0], __r)   # the rest of the frame, compiled in turn

A resume function is a copy of the frame's code object that takes the values on the
value stack and the live locals as parameters: a short prologue pushes the stack back and
jumps to the instruction after the break (`resume_code`, resume_codegen.py). It is compiled
through its own dispatcher, so its tensor work becomes the next graph, and it can break again.

`call_compiled` (break_calls.py) makes the broken call: a Python function (or a method,
or an nn.Module) that the trace was inlining is itself compiled through a dispatcher, so
only the construct that stopped the trace runs eagerly; builtins, C functions, classes and
functions of the standard library and of torch are called as they are.

What a break needs, checked by `plan_break` (otherwise the frame runs eagerly, as before):
the instruction is a call, a conditional jump or another instruction the entry can run
(`can_break_at`); it is outside every `with` block but those of grad mode, inference mode and
user classes, and outside an `except` clause's own body (`protected`); the code is not a
generator, and uses its cells only through their own opcodes (`resumable`; both in
break_analysis.py, with the liveness of locals); and every stack value and live local can
be rebuilt by the entry (tensors become graph outputs; objects are re-read from their
source). The frame's cells become the resume function's closure.

A break inside a try block: an exception the broken operation raises goes to the block's
handler, as it would in the frame. The entry catches it and calls a resume function that
starts at the handler, with the stack the handler expects (the exception-table entry's
depth, then the exception); it runs in plain Python, uncompiled (an exception is the rare
path). The normal resume function keeps the code's exception table, so an exception raised
later in the block reaches the handler inside it. An exception raised inside the compiled
graph itself (a kernel's error) is not the handler's to see, as under TorchDynamo.
"""
from __future__ import annotations

import operator
import sys
import types
from dataclasses import dataclass
from typing import Callable

from kiln.frontend import bytecode, versions
from kiln.frontend.break_analysis import _cells_as_locals, _comprehensions, live_locals, try_handler
from kiln.frontend.break_calls import _callee_object, runs_as_it_is
from kiln.frontend.errors import Unsupported
from kiln.frontend.interpreter_variables import ContextExitVariable, GeneratorVariable
from kiln.frontend.resume_codegen import _origins, _starts, body_start, closure_function, original_position, resume_code
from kiln.frontend.variables.base import NONE, NULL
from kiln.frontend.variables.containers import BaseIteratorVariable, DictViewVariable

CALL_OPS = frozenset({"CALL", "CALL_KW", "CALL_FUNCTION_EX"})
JUMP_OPS = frozenset({"POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE", "JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP"})


@dataclass(frozen=True)
class BreakPoint:
    """Where a retrace stops: the `count`-th run of instruction `index` in the frame `depth` calls deep."""

    depth: int
    code: types.CodeType
    index: int
    count: int
    reason: str
    location: str
    # the broken call is made from the entry itself, not through `call_compiled` (Unsupported.reads_frames)
    direct_call: bool = False


# ------------------------------------------------------------------------------------------------
# Instructions a break runs on their own


def _store_subscript(value, container, key):
    container[key] = value


def _store_attribute(value, obj, name):
    setattr(obj, name, value)


def _subscript_slice(container, start, stop):
    return container[start:stop]


def _single_instruction(instruction) -> tuple[int, Callable, str] | None:
    """(values it takes from the stack, the Python function doing it, what it pushes: "value",
    "method" or "nothing") for an instruction a graph break can run on its own, else None."""
    from kiln.frontend.operations import BINARY_OPERATORS, COMPARE_OPERATORS, INPLACE_OPERATORS

    op = instruction.op
    if op == "BINARY_OP":
        symbol = instruction.argrepr
        if symbol.endswith("=") and symbol[:-1] in INPLACE_OPERATORS:
            return 2, INPLACE_OPERATORS[symbol[:-1]], "value"
        return (2, BINARY_OPERATORS[symbol], "value") if symbol in BINARY_OPERATORS else None
    if op == "COMPARE_OP":
        symbol = versions.compare_operator(instruction.argval)
        return (2, COMPARE_OPERATORS[symbol], "value") if symbol in COMPARE_OPERATORS else None
    if op == "CONTAINS_OP":
        negated = bool(instruction.arg)  # the stack holds the item, then the container
        return 2, (lambda item, container: (item in container) != negated), "value"
    if op == "BINARY_SUBSCR":
        return 2, operator.getitem, "value"
    if op == "BINARY_SLICE":
        return 3, _subscript_slice, "value"
    if op == "STORE_SUBSCR":
        return 3, _store_subscript, "nothing"
    if op == "DELETE_SUBSCR":
        return 2, operator.delitem, "nothing"
    if op in ("UNARY_NEGATIVE", "UNARY_INVERT", "UNARY_NOT"):
        return 1, {"UNARY_NEGATIVE": operator.neg, "UNARY_INVERT": operator.invert,
                   "UNARY_NOT": operator.not_}[op], "value"
    if op == "FORMAT_VALUE":  # 3.11, 3.12: an f-string's field (a tensor's text needs its values)
        flags = instruction.arg
        convert = _CONVERSIONS[flags & 0x03]
        if flags & 0x04:
            return 2, (lambda value, spec: format(convert(value), spec)), "value"
        return 1, (lambda value: format(convert(value))), "value"
    if op in ("FORMAT_SIMPLE", "CONVERT_VALUE"):  # 3.13
        convert = format if op == "FORMAT_SIMPLE" else _CONVERSIONS[instruction.arg]
        return 1, convert, "value"
    if op == "FORMAT_WITH_SPEC":
        return 2, format, "value"
    name = instruction.argval
    if op == "LOAD_ATTR":
        return 1, (lambda obj: getattr(obj, name)), "value"
    if op == "LOAD_METHOD":
        return 1, (lambda obj: getattr(obj, name)), "method"
    if op == "STORE_ATTR":
        return 2, (lambda obj, value: _store_attribute(value, obj, name)), "nothing"
    return None


# FORMAT_VALUE's and CONVERT_VALUE's conversions: none, !s, !r, !a
_CONVERSIONS = {0: lambda value: value, 1: str, 2: repr, 3: ascii}


def can_break_at(instruction) -> bool:
    return instruction.op in CALL_OPS or instruction.op in JUMP_OPS or instruction.op == "FOR_ITER" or \
        _single_instruction(instruction) is not None


def branch_targets(instruction: bytecode.Instruction, index: int, index_of: dict[int, int]) -> tuple[int, int]:
    """(instruction index when the condition is true, when false) of a conditional jump at `index`."""
    jumped = index_of[id(instruction.target)]
    if instruction.op in ("POP_JUMP_IF_TRUE", "JUMP_IF_TRUE_OR_POP"):  # normalized: 3.11's FORWARD/BACKWARD forms
        return jumped, index + 1
    return index + 1, jumped


def keeps_condition(instruction: bytecode.Instruction, when: bool) -> bool:
    """Whether the condition stays on the stack on that side (3.11's JUMP_IF_..._OR_POP when it jumps)."""
    if instruction.op == "JUMP_IF_TRUE_OR_POP":
        return when
    if instruction.op == "JUMP_IF_FALSE_OR_POP":
        return not when
    return False


# ------------------------------------------------------------------------------------------------
# The end of an entry that breaks


def _kind(variable, codegen):
    """How one stack slot or live local reaches a resume function (resume_code's kinds). A generator or lazy
    iterator the entry has already built as a real object (an argument of the broken call) is passed as it."""
    if variable is NULL:
        return "null"
    if isinstance(variable, BaseIteratorVariable) and variable.passed_as_items and variable.rebuild_parts() is None:
        return "iter"
    if codegen.is_built(variable):
        return "value"
    if isinstance(variable, GeneratorVariable) and not variable.finished and not variable.running:
        return "generator", variable.frame.current is not None
    if isinstance(variable, (BaseIteratorVariable, ContextExitVariable, DictViewVariable)):
        parts = variable.rebuild_parts()
        if parts is not None:
            function, arguments = parts
            return "call", function, tuple(_kind(argument, codegen) for argument in arguments)
    return "value"


def _texts(codegen, variable, call: object, kind) -> list[str]:
    """The expressions the entry passes for one stack slot or local of this kind (`_kind`, taken when the resume
    code was made), one per parameter it takes (an iterator: its remaining items; a generator: the resume
    function of its code and what that takes; a lazy iterator: its parts). A generator or lazy iterator passed
    on this way is rebuilt by the resume function itself, so it must be held nowhere else
    (`EntryCodegen.pass_on`)."""
    if kind == "null":
        return []
    if kind == "iter":
        items = [codegen.value(item) for item in variable.remaining_items()]
        return ["(" + "".join(f"{item}, " for item in items) + ")"]
    if kind == "value":
        return [codegen.value(variable)]
    codegen.pass_on(variable, call)
    if kind[0] == "generator":
        function, arguments, kinds = _generator_parts(codegen, variable)
        passed = "".join(f"{text}, " for argument, part in zip(arguments, kinds)
                         for text in _texts(codegen, argument, call, part))
        return [function, f"({passed})"]
    _, arguments = variable.rebuild_parts()
    return [text for argument, part in zip(arguments, kind[2]) for text in _texts(codegen, argument, call, part)]


def rebuild_generator(function: types.FunctionType, arguments: tuple, started: bool):
    """A generator in the state a traced one was left in: `function` is a resume function of its code (see
    `generator_resume`); a started one is run to the yield it was suspended at, whose value is dropped, so that
    it takes `send`, `throw` and `close` there as the original would."""
    generator = function(*arguments)
    if started:
        next(generator)
    return generator


def generator_resume(frame, codegen) -> tuple[types.CodeType, list, tuple]:
    """(resume code, trackers it takes, their kinds) rebuilding the generator whose suspended frame is `frame`.

    An unstarted generator resumes at the first instruction of its body with its arguments; a suspended one
    at the YIELD_VALUE it stopped at, with its value stack (and a placeholder for the value yielded there,
    which `rebuild_generator` drops) and its live locals. Its cells are the resume function's closure."""
    original, shift = _origins.get(frame.code, (frame.code, 0))
    reason = _cells_as_locals(original)
    if reason is not None:
        raise Unsupported(f"rebuilding generator {frame.code.co_qualname}: {reason}")
    if frame.current is None:
        target = _starts.get(frame.code, body_start(original))
        stack: list = []
    else:
        if frame.current.opname != "YIELD_VALUE":
            raise Unsupported(f"rebuilding generator {frame.code.co_qualname} suspended at {frame.current.opname}")
        target = frame.index_of[id(frame.current)] + shift
        stack = list(frame.stack) + [NONE]
    if any(item is NULL for item in stack):
        raise Unsupported(f"rebuilding generator {frame.code.co_qualname} with a NULL on its stack")
    bound = {name: value for name, value in frame.locals.items() if value is not NULL}
    live = tuple((name, _kind(bound[name], codegen)) for name in original.co_varnames
                 if name in live_locals(original, target) and name in bound)
    stack_kinds = tuple(_kind(item, codegen) for item in stack)
    code = resume_code(original, target, stack_kinds, live)
    return code, stack + [bound[name] for name, _ in live], stack_kinds + tuple(kind for _, kind in live)


def _generator_parts(codegen, generator) -> tuple[str, list, tuple]:
    """(the entry's expression for the resume function of the generator's code, the trackers it takes, their
    kinds)."""
    if generator.finished or generator.running:
        raise Unsupported(f"passing on {generator.describe()} once it has "
                          f"{'ended' if generator.finished else 'started running'}")
    frame = generator.frame
    code, arguments, kinds = generator_resume(frame, codegen)
    cells = "".join(f"{codegen.value(frame.cells[name])}, " for name in code.co_freevars)
    function = f"{codegen.constant(closure_function)}({codegen.constant(code)}, {codegen.constant(frame.fn_globals)}, " \
               f"({cells}))"
    return function, arguments, kinds


def reconstruct_generator(codegen, generator) -> str:
    """The entry's expression for a generator the trace made (interpreter_variables.GeneratorVariable), as it
    was left."""
    function, arguments, kinds = _generator_parts(codegen, generator)
    call = object()
    passed = "".join(f"{text}, " for argument, kind in zip(arguments, kinds)
                     for text in _texts(codegen, argument, call, kind))
    return f"{codegen.constant(rebuild_generator)}({function}, ({passed}), {generator.frame.current is not None})"


# What the entry's FOR_ITER step holds when the iterator is exhausted (its StopIteration caught)
_EXHAUSTED = object()


@dataclass
class Continuation:
    """Where the frame goes on after the break: an instruction, with this stack (bottom first)."""

    target: int
    stack: list


def _guarded(codegen, stack: list, lines: list[str]) -> list[str]:
    """`lines` (the broken operation), so that an exception leaving it runs the exits of the with-blocks a
    break left open (innermost first), as leaving the blocks in eager would."""
    exits = [codegen.value(item) for item in reversed(stack) if isinstance(item, ContextExitVariable)]
    if not exits:
        return lines
    info = codegen.constant(sys.exc_info)
    return (["try:"] + ["    " + line for line in lines] + ["except BaseException:"] +
            [f"    {exit_text}(*{info}())" for exit_text in exits] + ["    raise"])


def break_tail(frame, make_resume: Callable, call_name: str | None) -> Callable:
    """The entry's last lines for a frame stopped before its current instruction (a call or a branch).

    `make_resume(frame, code)` gives the compiled resume function for a code object of the
    frame; `call_name` is the name the entry binds `call_compiled` to, or None for a call the entry
    makes itself (frame introspection: then the callee's caller is the entry, the program's stand-in).
    """
    index = frame.index_of[id(frame.current)]
    instruction = frame.current
    stack = list(frame.stack)

    def resume_call(codegen, continuation: Continuation, pushed: list[str], stop: int | None = None,
                    compiled: bool = True) -> str:
        """`<resume>(stack..., locals...)`; `pushed` are texts of values pushed on top of the stack. With `stop`
        (an instruction of the frame's code), a plain function running from the target to there, not compiled;
        with `compiled=False`, a plain function running the rest of the frame."""
        bound = {name: value for name, value in frame.locals.items() if value is not NULL}
        original, target = original_position(frame.code, continuation.target)
        live = tuple((name, _kind(bound[name], codegen)) for name in original.co_varnames
                     if name in live_locals(original, target) and name in bound)
        kinds = tuple(_kind(item, codegen) for item in continuation.stack) + ("value",) * len(pushed)
        code = resume_code(original, target, kinds, live,
                           None if stop is None else original_position(frame.code, stop)[1])
        call = object()
        texts = [text for item, kind in zip(continuation.stack, kinds) for text in _texts(codegen, item, call, kind)]
        texts += pushed
        texts += [text for name, kind in live for text in _texts(codegen, bound[name], call, kind)]
        if code.co_freevars:  # the frame's cells, the very objects (inner functions made before the break share them)
            cells = "".join(f"{codegen.value(frame.cells[name])}, " for name in code.co_freevars)
            function = f"{codegen.constant(closure_function)}({codegen.constant(code)}, " \
                       f"{codegen.constant(frame.fn_globals)}, ({cells}))"
            if stop is not None or not compiled:
                return f"{function}({', '.join(texts)})"
            return f"{codegen.constant(make_resume(frame, code))}.call_function({', '.join([function] + texts)})"
        if stop is not None or not compiled:
            return f"{codegen.constant(closure_function(code, frame.fn_globals, ()))}({', '.join(texts)})"
        return f"{codegen.constant(make_resume(frame, code))}({', '.join(texts)})"

    handler = try_handler(frame.code, index)

    def guarded(codegen, below: list, lines: list[str]) -> list[str]:
        """`lines` (the broken operation, which returns nothing), so that an exception leaving it goes where it
        would in the frame: to the handler around the break, a try block's or a with-block's cleanup (its resume
        function, in plain Python, whose code passes it on to the handlers around that one), else out of the
        entry (past the exits of the with-blocks the break left open, `_guarded`)."""
        if handler is None:
            return _guarded(codegen, below, lines)
        # The offset below the exception (`lasti`) only places a re-raise's traceback line (CPython looks the
        # next handler up from the RERAISE itself): the resume function's first instruction.
        pushed = (["0"] if handler.lasti else []) + ["__raised"]
        caught = resume_call(codegen, Continuation(handler.target, stack[:handler.depth]), pushed, compiled=False)
        # The handler's resume function runs after the entry's own `except`, not in it: inside, the thread's
        # handled exception would outlive the user's try statement (sys.exc_info() after it).
        return (["try:"] + ["    " + line for line in lines] +
                ["except BaseException as __error:", "    __raised = __error", "else:", "    __raised = None",
                 "if __raised is not None:", f"    return {caught}"])

    span = next((span for span in _comprehensions(frame.code) if span.start == index), None) \
        if instruction.opname == "LOAD_FAST_AND_CLEAR" else None
    if span is not None:
        # at its end the iterator (on top now) is gone; the saved variables (NULL where unbound, as
        # LOAD_FAST_AND_CLEAR pushes them) and then the span's result are on the stack
        saved = [frame.locals.get(name, NULL) for name in span.names]

        def tail(codegen) -> list[str]:
            run = resume_call(codegen, Continuation(index, stack), [], stop=span.end)
            resumed = resume_call(codegen, Continuation(span.end, stack[:-1] + saved), ["__broken"])
            return guarded(codegen, stack, [f"__broken = {run}"]) + [f"return {resumed}"]

        return tail

    if instruction.op in CALL_OPS:
        if instruction.op == "CALL_FUNCTION_EX":
            has_kwargs = bool(instruction.arg & 1)
            consumed = 3 + int(has_kwargs)
        else:
            names = frame.kw_names or ()
            consumed = instruction.arg + 2
            if instruction.op == "CALL_KW":
                consumed += 1
                names = stack[-1].as_constant()
        items = stack[-consumed:]
        below = stack[:-consumed]
        function, receiver = versions.split_callable_pair(items[0], items[1], NULL)

        def tail(codegen) -> list[str]:
            arguments = [codegen.value(function)]
            if receiver is not None:
                arguments.append(codegen.value(receiver))
            if instruction.op == "CALL_FUNCTION_EX":
                arguments.append("*" + codegen.value(items[2]))
                if has_kwargs:
                    arguments.append("**" + codegen.value(items[3]))
            else:
                positional = items[2:2 + instruction.arg]
                keywords = positional[len(positional) - len(names):] if names else []
                positional = positional[:len(positional) - len(names)] if names else positional
                arguments += [codegen.value(item) for item in positional]
                arguments += [f"{name}={codegen.value(item)}" for name, item in zip(names, keywords)]
            resumed = resume_call(codegen, Continuation(index + 1, below), ["__broken"])
            direct = call_name is None or runs_as_it_is(_callee_object(function))
            call = f"({arguments[0]})({', '.join(arguments[1:])})" if direct else \
                f"{call_name}({', '.join(arguments)})"
            return guarded(codegen, below, [f"__broken = {call}"]) + [f"return {resumed}"]

        return tail
    if instruction.op in JUMP_OPS:
        condition = stack[-1]
        true_target, false_target = branch_targets(instruction, index, frame.index_of)

        def tail(codegen) -> list[str]:
            text = codegen.value(condition)
            sides = []
            for when, target in ((True, true_target), (False, false_target)):
                kept = stack if keeps_condition(instruction, when) else stack[:-1]
                sides.append(resume_call(codegen, Continuation(target, kept), []))
            return guarded(codegen, stack, [f"__condition = {codegen.constant(bool)}({text})"]) + \
                ["if __condition:", f"    return {sides[0]}", f"return {sides[1]}"]

        return tail
    if instruction.op == "FOR_ITER":
        # The step runs in Python, on the iterator as the trace left it (a generator rebuilt where it was suspended):
        # what it runs (a generator's body up to its next yield, a `__next__`) is what the trace could not. The
        # loop body resumes with the real iterator, whose later steps break here again.
        below = stack[:-1]
        exhausted = frame.index_of[id(instruction.target)]
        for skipped in versions.for_iter_exhaust_skip():
            if frame.instructions[exhausted].opname == skipped:
                exhausted += 1

        def tail(codegen) -> list[str]:
            iterator = codegen.value(stack[-1])
            done = resume_call(codegen, Continuation(exhausted, below), [])
            stepped = resume_call(codegen, Continuation(index + 1, below), [iterator, "__item"])
            exhausted_marker = codegen.constant(_EXHAUSTED)
            return guarded(codegen, below, ["try:", f"    __item = {codegen.constant(next)}({iterator})",
                                            f"except {codegen.constant(StopIteration)}:",
                                            f"    __item = {exhausted_marker}"]) + \
                [f"if __item is {exhausted_marker}:", f"    return {done}", f"return {stepped}"]

        return tail
    single = _single_instruction(instruction)
    if single is None:
        raise Unsupported(f"a graph break at {instruction.opname}")
    consumed, function, pushes = single
    items = stack[-consumed:]
    below = stack[:-consumed]
    if instruction.op == "STORE_ATTR":  # stack: value, object
        items = [items[1], items[0]]

    def tail(codegen) -> list[str]:
        arguments = ", ".join(codegen.value(item) for item in items)
        call = f"{codegen.constant(function)}({arguments})"
        if pushes == "nothing":
            return guarded(codegen, below, [call]) + [f"return {resume_call(codegen, Continuation(index + 1, below), [])}"]
        after = list(below)
        if pushes == "method":  # the bound method, with the NULL a method load pushes below it (3.11, 3.12)
            if not versions.NULL_BELOW_CALLABLE:
                raise Unsupported("a graph break at a method load (NULL above the method: Python 3.13)")
            after.append(NULL)
        return guarded(codegen, below, [f"__broken = {call}"]) + \
            [f"return {resume_call(codegen, Continuation(index + 1, after), ['__broken'])}"]

    return tail


__all__ = ["BreakPoint", "CALL_OPS", "JUMP_OPS", "break_tail", "can_break_at"]


GeneratorVariable.rebuild = staticmethod(reconstruct_generator)
