"""Graph breaks: resume functions, live locals, and the calls a break makes in plain Python.

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
jumps to the instruction after the break (`resume_code`). It is compiled through its own
dispatcher, so its tensor work becomes the next graph, and it can break again.

`call_compiled` makes the broken call: a Python function (or a method, or an nn.Module)
that the trace was inlining is itself compiled through a dispatcher, so only the
construct that stopped the trace runs eagerly; builtins, C functions, classes and
functions of the standard library and of torch are called as they are.

What a break needs, checked by `plan_break` (otherwise the frame runs eagerly, as before):
the instruction is a call, a conditional jump or another instruction the entry can run
(`can_break_at`); it is outside every `with` block but those of grad mode, inference mode and
user classes, and outside an `except` clause's own body (`protected`); the code is not a
generator, and uses its cells only through their own opcodes (`resumable`); and every stack
value and live local can be rebuilt by the entry (tensors become graph outputs; objects are
re-read from their source). The frame's cells become the resume function's closure.

A break inside a try block: an exception the broken operation raises goes to the block's
handler, as it would in the frame. The entry catches it and calls a resume function that
starts at the handler, with the stack the handler expects (the exception-table entry's
depth, then the exception); it runs in plain Python, uncompiled (an exception is the rare
path). The normal resume function keeps the code's exception table, so an exception raised
later in the block reaches the handler inside it. An exception raised inside the compiled
graph itself (a kernel's error) is not the handler's to see, as under TorchDynamo.
"""
from __future__ import annotations

import functools
import inspect
import operator
import os
import sys
import sysconfig
import types
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

from kiln.frontend import bytecode, versions
from kiln.frontend.errors import Unsupported
from kiln.frontend.interpreter_variables import ContextExitVariable, GeneratorVariable
from kiln.frontend.variables.base import NONE, NULL
from kiln.frontend.variables.containers import BaseIteratorVariable, DictViewVariable

CALL_OPS = frozenset({"CALL", "CALL_KW", "CALL_FUNCTION_EX"})
JUMP_OPS = frozenset({"POP_JUMP_IF_FALSE", "POP_JUMP_IF_TRUE", "JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP"})

_READS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST", "LOAD_FAST_LOAD_FAST",
                    "LOAD_FAST_BORROW", "LOAD_FAST_BORROW_LOAD_FAST_BORROW"})
_WRITES = frozenset({"STORE_FAST", "STORE_FAST_STORE_FAST"})
_FAST_OPS = _READS | _WRITES | {"STORE_FAST_LOAD_FAST"}
_DEREF_OPS = frozenset({"LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF", "LOAD_CLOSURE", "LOAD_FROM_DICT_OR_DEREF",
                        "MAKE_CELL"})
_PROLOGUE_OPS = frozenset({"COPY_FREE_VARS", "MAKE_CELL", "RESUME"})
_STOPS = frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"})


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


def _names(instruction: bytecode.Instruction) -> tuple[str, ...]:
    value = instruction.argval
    return tuple(value) if isinstance(value, tuple) else (value,)


@functools.lru_cache(maxsize=1024)
def live_locals(code: types.CodeType, start: int) -> frozenset[str]:
    """Locals some path from instruction `start` reads before writing (exception handlers included)."""
    decoded = bytecode.decode(code)
    instructions = decoded.instructions
    index_of = {id(instruction): index for index, instruction in enumerate(instructions)}
    handlers: dict[int, list[int]] = {}
    for entry in decoded.exception_table:
        for index in range(index_of[id(entry.start)], index_of[id(entry.end)] + 1):
            handlers.setdefault(index, []).append(index_of[id(entry.target)])
    successors: list[list[int]] = []
    for index, instruction in enumerate(instructions):
        following = list(handlers.get(index, ()))
        if instruction.target is not None:
            following.append(index_of[id(instruction.target)])
        unconditional = instruction.opname.startswith("JUMP") and "IF" not in instruction.opname \
            and instruction.opname not in ("JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP")
        if instruction.opname not in _STOPS and not unconditional and index + 1 < len(instructions):
            following.append(index + 1)
        successors.append(following)
    uses: list[frozenset[str]] = []
    defs: list[frozenset[str]] = []
    for instruction in instructions:
        name = instruction.opname
        if name in _READS:
            uses.append(frozenset(_names(instruction)))
            defs.append(frozenset())
        elif name in _WRITES:
            uses.append(frozenset())
            defs.append(frozenset(_names(instruction)))
        elif name == "STORE_FAST_LOAD_FAST":
            stored, loaded = instruction.argval
            uses.append(frozenset() if loaded == stored else frozenset({loaded}))
            defs.append(frozenset({stored}))
        else:
            uses.append(frozenset())
            defs.append(frozenset())
    live: list[frozenset[str]] = [frozenset()] * len(instructions)
    changed = True
    while changed:
        changed = False
        for index in range(len(instructions) - 1, -1, -1):
            out = frozenset().union(*(live[successor] for successor in successors[index]))
            value = (out - defs[index]) | uses[index]
            if value != live[index]:
                live[index] = value
                changed = True
    return live[start] if start < len(instructions) else frozenset()


@dataclass(frozen=True)
class TryHandler:
    """Where an exception raised at an instruction goes: instruction `target`, with the value stack cut to
    `depth` items, then (`lasti`) the raising instruction's offset, then the exception. `with_cleanup`: the
    handler is a `with` block's (it calls the block's exit, then re-raises unless the exit suppressed it)."""

    target: int
    depth: int
    lasti: bool
    with_cleanup: bool


@functools.lru_cache(maxsize=1024)
def try_handler(code: types.CodeType, index: int) -> TryHandler | None:
    """The handler an exception raised at instruction `index` goes to (the exception-table range around it: a try
    block's, or a `with` block's cleanup), else None (none, or 3.12's restoring of an inlined comprehension's
    locals, which re-raises out of the frame). An exception the entry's broken operation raises goes to that
    handler (`break_tail`), whose code then passes it on to the handlers around it, as the frame would."""
    decoded = bytecode.decode(code)
    instructions = decoded.instructions
    index_of = {id(instruction): position for position, instruction in enumerate(instructions)}
    for entry in decoded.exception_table:
        if not index_of[id(entry.start)] <= index <= index_of[id(entry.end)]:
            continue
        handler = index_of[id(entry.target)]
        if _restores_locals(instructions, handler):
            return None
        following = [instruction.opname for instruction in instructions[handler:handler + 2]]
        return TryHandler(handler, entry.depth, entry.lasti, following == ["PUSH_EXC_INFO", "WITH_EXCEPT_START"])
    return None


def protected(code: types.CodeType, index: int) -> bool:
    """Whether instruction `index` lies inside an `except` clause's own body, where a break cannot resume: the
    stack there holds the exception being handled and the one it replaced (PUSH_EXC_INFO's), which the entry
    cannot pass on, and the clause's cleanup handler restores them."""
    entry = try_handler(code, index)
    return entry is not None and entry.lasti and not entry.with_cleanup


def _restores_locals(instructions: list, handler: int) -> bool:
    """Whether the handler at `handler` only puts back the locals of a 3.12 inlined comprehension (PEP 709) and
    re-raises: an exception leaving the entry leaves the frame too, so there is nothing to restore."""
    for instruction in instructions[handler:]:
        if instruction.opname == "RERAISE":
            return True
        if instruction.opname not in ("SWAP", "POP_TOP", "STORE_FAST"):
            return False
    return False


@functools.lru_cache(maxsize=1024)
def resumable(code: types.CodeType) -> str | None:
    """None if a frame of `code` can be resumed by a generated function, else why not."""
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR |
                        inspect.CO_ITERABLE_COROUTINE):
        return f"{code.co_qualname} is a generator or coroutine"
    return _cells_as_locals(code)


@functools.lru_cache(maxsize=1024)
def _cells_as_locals(code: types.CodeType) -> str | None:
    """Why a resume function of `code` could not take its cells as its closure, or None."""
    if code.co_cellvars:
        # A resume function takes the frame's cells as its closure; a cell made or read as a plain local past
        # the prologue (3.12's inlined comprehensions: MAKE_CELL, LOAD_FAST_AND_CLEAR of a cell) has no such form.
        body = bytecode.decode(code).instructions
        first = 0
        while first < len(body) and body[first].opname in _PROLOGUE_OPS:
            first += 1
        for instruction in body[first:]:
            if instruction.opname == "MAKE_CELL" or (instruction.opname in _FAST_OPS and
                                                     set(_names(instruction)) & set(code.co_cellvars)):
                return f"{code.co_qualname} makes or reads a captured variable as a plain local ({instruction.opname})"
    return None


def closure_function(code: types.CodeType, fn_globals: dict, cells: tuple) -> types.FunctionType:
    """A resume function over these cells (the entry makes one per call; one dispatcher runs them all)."""
    return types.FunctionType(code, fn_globals, code.co_name, None, cells or None)


def closure_names(code: types.CodeType) -> tuple[str, ...]:
    """The free variables of a resume function of `code`: its cell variables, then its free variables."""
    return tuple(code.co_cellvars) + tuple(code.co_freevars)


def _parameter_count(kind) -> int:
    """How many parameters of a resume function one stack slot or local of this kind takes."""
    if kind == "null":
        return 0
    if kind in ("value", "iter"):
        return 1
    if kind[0] == "generator":
        return 2  # the resume function of its code, and the tuple of what it takes
    return sum(_parameter_count(part) for part in kind[2])  # ("call", callable, parts)


def _leaf_kinds(kind) -> list:
    """The kind of each parameter one stack slot or local of this kind takes (a "call" kind's parts one by one,
    so an "iter" part, a count of items left, still tells a loop's iterations apart: `iterator_parameters`)."""
    if kind in ("null", "value", "iter"):
        return [] if kind == "null" else [kind]
    if kind[0] == "generator":
        return [kind, kind]
    return [leaf for part in kind[2] for leaf in _leaf_kinds(part)]


@functools.lru_cache(maxsize=1024)
def resume_code(code: types.CodeType, target: int, stack: tuple, live: tuple[tuple[str, Any], ...],
                stop: int | None = None) -> types.CodeType:
    """A copy of `code` that starts at instruction `target` with a value stack and locals given as parameters.

    `stack` gives each stack slot's kind, bottom first: "null" (pushed back by PUSH_NULL),
    "value" (a leading parameter `__stack<i>`), "iter" (an iterator, passed as the tuple
    of its remaining items and turned back into one by GET_ITER), ("generator", started)
    (a generator the trace made, passed as the resume function of its own code and the tuple
    that function takes: the prologue calls it and, if it had started, runs it to its yield
    with next(), so a trace of this code steps the generator itself), or ("call", callable,
    parts) (a lazy iterator: `callable(*parts)`, e.g. enumerate of a generator and its next
    count). The `live` locals ((name, kind) pairs) follow. The locals not passed start
    unbound, as they are at that point of the original frame. With `stop`, instruction `stop`
    becomes a return of the top of the stack: the copy runs one span of the code (an inlined
    comprehension, `Comprehension`) and gives back what that span left on top.
    """
    decoded = bytecode.decode(code)
    instructions = decoded.instructions
    target_instruction = instructions[target]
    if stop is not None:
        instruction = instructions[stop]  # jumps keep their target object: it becomes the return in place
        instruction.opname, instruction.arg, instruction.argval, instruction.argrepr = "RETURN_VALUE", None, None, ""
        instruction.target, instruction.op = None, versions.normalized_opname("RETURN_VALUE", None)
    first = body_start(code)
    body = instructions[first:]

    def names(base: str, kind) -> list[str]:
        count = _parameter_count(kind)
        return [base] if count == 1 and kind in ("value", "iter") else [f"{base}_{index}" for index in range(count)]

    stack_names = [name for position, kind in enumerate(stack) for name in names(f"__stack{position}", kind)]
    simple_live = tuple(name for name, kind in live if kind in ("value", "iter"))
    live_names = [name for local, kind in live
                  for name in (names(local, kind) if kind in ("value", "iter") else names(f"__live_{local}", kind))]
    # The frame's cells (its own, made by MAKE_CELL, and its closure's) are the resume function's closure:
    # the entry passes the very cells, so inner functions made before the break share them.
    freevars = closure_names(code)
    varnames = tuple(stack_names) + tuple(live_names) + tuple(
        name for name in code.co_varnames if name not in simple_live and name not in code.co_cellvars)
    position_of = {name: position for position, name in enumerate(varnames)}
    position_of.update({name: len(varnames) + index for index, name in enumerate(freevars)})
    for instruction in body:
        if instruction.opname in _FAST_OPS:
            names_used = _names(instruction)
            if len(names_used) == 1:
                instruction.arg = position_of[names_used[0]]
            else:  # 3.13's paired forms: two 4-bit indices
                instruction.arg = (position_of[names_used[0]] << 4) | position_of[names_used[1]]
        elif instruction.opname in _DEREF_OPS:
            instruction.arg = position_of[instruction.argval]
    consts = list(code.co_consts)
    prologue = []

    def add(opname: str, arg: int | None = None, argval: Any = None) -> None:
        prologue.append(bytecode.create_instruction(opname, arg, argval))

    def load_fast(name: str) -> None:
        add("LOAD_FAST", position_of[name], name)

    def load_const(value: Any) -> None:
        for index, known in enumerate(consts):
            if known is value:
                break
        else:
            index = len(consts)
            consts.append(value)
        add("LOAD_CONST", index, value)

    def call(count: int) -> None:
        if versions.PY311:
            add("PRECALL", count)
        add("CALL", count)

    def push_callable(load: Callable[[], None]) -> None:
        if versions.NULL_BELOW_CALLABLE:
            add("PUSH_NULL")
            load()
        else:
            load()
            add("PUSH_NULL")

    def emit(kind, parameters) -> None:
        """Push the value of one slot of this kind, from its parameters."""
        if kind == "null":
            add("PUSH_NULL")
        elif kind == "value":
            load_fast(next(parameters))
        elif kind == "iter":
            load_fast(next(parameters))
            add("GET_ITER")
        elif kind[0] == "generator":
            function, arguments = next(parameters), next(parameters)
            push_callable(lambda: load_fast(function))
            load_fast(arguments)
            add("CALL_FUNCTION_EX", 0)
            if kind[1]:  # started: run it to the yield it was suspended at, dropping that yield's placeholder
                push_callable(lambda: load_const(next))
                add("COPY", 3)
                call(1)
                add("POP_TOP")
        else:
            _, function, parts = kind
            push_callable(lambda: load_const(function))
            for part in parts:
                emit(part, parameters)
            call(len(parts))

    if freevars:
        add("COPY_FREE_VARS", len(freevars))
    if code.co_flags & inspect.CO_GENERATOR:  # a generator's: calling it makes the generator, next() runs the rest
        add("RETURN_GENERATOR")
        add("POP_TOP")
    add("RESUME", 0)
    live_parameters = iter(live_names)
    for name, kind in live:
        if kind == "value":
            next(live_parameters)
        elif kind == "iter":
            next(live_parameters)
            load_fast(name)
            add("GET_ITER")
            add("STORE_FAST", position_of[name], name)
        else:
            emit(kind, live_parameters)
            add("STORE_FAST", position_of[name], name)
    stack_parameters = iter(stack_names)
    for kind in stack:
        emit(kind, stack_parameters)
    prologue.append(bytecode.create_instruction("JUMP_FORWARD", target=target_instruction))
    decoded.instructions = prologue + body
    # A handler range that began in the dropped prologue (3.12's around a generator's body starts at its RESUME)
    # begins at the body; the new prologue runs no user code, so it needs none.
    kept = {id(instruction) for instruction in body}
    for entry in decoded.exception_table:
        if id(entry.start) not in kept:
            entry.start = body[0]
    decoded.exception_table = [entry for entry in decoded.exception_table if id(entry.end) in kept]
    line = target_instruction.lineno or code.co_firstlineno
    base = code.co_name.split("_resume_at_line_")[0]
    name = f"{base}_{'resume' if stop is None else 'comprehension'}_at_line_{line}"
    flags = code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    resumed = bytecode.assemble(decoded, co_varnames=varnames, co_nlocals=len(varnames), co_cellvars=(),
                                co_freevars=freevars,
                                co_argcount=len(stack_names) + len(live_names), co_posonlyargcount=0,
                                co_consts=tuple(consts),
                                co_kwonlyargcount=0, co_flags=flags, co_name=name,
                                co_qualname=f"{code.co_qualname.split('_resume_at_line_')[0]}{name[len(base):]}")
    resumed = resumed.replace(co_stacksize=max(bytecode.max_stack_depth(decoded), len(stack), 1))
    original, shift = _origins.get(code, (code, 0))
    _origins[resumed] = (original, shift + first - len(prologue))  # its body is `code`'s from `first` on
    _starts[resumed] = target + shift
    parameter_kinds = [leaf for kind in stack for leaf in _leaf_kinds(kind)] + \
        [leaf for _, kind in live for leaf in _leaf_kinds(kind)]
    _iterator_parameters[resumed] = tuple(position for position, kind in enumerate(parameter_kinds) if kind == "iter")
    return resumed


def iterator_parameters(code: types.CodeType) -> tuple[int, ...]:
    """The positions of a resume function's parameters that pass an iterator as the tuple of its remaining items
    (resume_code's "iter" kind); () for any other code. Their lengths tell a loop's iterations apart: the
    dispatcher keeps a recompile limit per iteration (`Dispatcher.loop_position`)."""
    return _iterator_parameters.get(code, ())


@functools.lru_cache(maxsize=1024)
def body_start(code: types.CodeType) -> int:
    """The index of `code`'s first instruction past its prologue (free variables, cells, a generator's
    RETURN_GENERATOR and the POP_TOP of the value its first next() sends, RESUME)."""
    instructions = bytecode.decode(code).instructions
    first = 0
    while first < len(instructions) and (
            instructions[first].opname in _PROLOGUE_OPS or instructions[first].opname == "RETURN_GENERATOR" or
            (first > 0 and instructions[first - 1].opname == "RETURN_GENERATOR" and
             instructions[first].opname == "POP_TOP")):
        first += 1
    return first


# resume code -> (the user's code it continues, what to add to an instruction index to find it there)
_origins: "weakref.WeakKeyDictionary[types.CodeType, tuple[types.CodeType, int]]" = weakref.WeakKeyDictionary()
# resume code -> the instruction of the user's code it starts at
_starts: "weakref.WeakKeyDictionary[types.CodeType, int]" = weakref.WeakKeyDictionary()
# resume code -> the positions of its parameters of the "iter" kind
_iterator_parameters: "weakref.WeakKeyDictionary[types.CodeType, tuple[int, ...]]" = weakref.WeakKeyDictionary()


def original_position(code: types.CodeType, index: int) -> tuple[types.CodeType, int]:
    """Instruction `index` of `code` as (code object, index) in the user's code a resume function continues.

    A resume function that breaks again resumes from the user's code, not from itself: a break in a loop
    then gets the same resume function on every iteration (one dispatcher, whose entries serve them all),
    not a new one per iteration."""
    original, shift = _origins.get(code, (code, 0))
    return original, _landing(original, index + shift)


_UNCONDITIONAL_JUMPS = frozenset({"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP"})


@functools.lru_cache(maxsize=1024)
def _landing(code: types.CodeType, index: int) -> int:
    """Where instruction `index` leads once unconditional jumps are followed: a resume function starts there
    (3.12 tests a `while` loop's condition at its top and at its bottom; both true sides then resume at the
    loop body through one function)."""
    instructions = bytecode.decode(code).instructions
    index_of = {id(instruction): position for position, instruction in enumerate(instructions)}
    seen = set()
    while index < len(instructions) and index not in seen and instructions[index].opname in _UNCONDITIONAL_JUMPS \
            and instructions[index].target is not None:
        seen.add(index)
        index = index_of[id(instructions[index].target)]
    return index


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


@dataclass(frozen=True)
class Comprehension:
    """A comprehension Python 3.12+ inlined into its function: from `start` (its first LOAD_FAST_AND_CLEAR,
    which saves the variables it binds: `names`) to `end` (the instruction after its loop, where the stack
    holds the saved values and then the result). A break inside its loop goes to `start`, and the entry runs
    the whole span in Python (`resume_code` with `stop`), as TorchDynamo does: breaking inside the loop would
    break at every item, a graph each. 3.11 calls a comprehension as a function, run whole the same way
    (`_COMPREHENSIONS`)."""

    start: int
    end: int
    names: tuple[str, ...]


@functools.lru_cache(maxsize=256)
def _comprehensions(code: types.CodeType) -> tuple[Comprehension, ...]:
    """The inlined comprehensions of `code`, outer ones before those nested in them."""
    instructions = bytecode.decode(code).instructions
    index_of = {id(instruction): position for position, instruction in enumerate(instructions)}
    found = []
    position = 0
    while position < len(instructions):
        if instructions[position].opname != "LOAD_FAST_AND_CLEAR":
            position += 1
            continue
        start = position
        while position < len(instructions) and instructions[position].opname == "LOAD_FAST_AND_CLEAR":
            position += 1
        # then SWAP, BUILD_LIST/SET/MAP, SWAP (an iterator below the new container), and the loop's FOR_ITER
        loop = next((index for index in range(position, min(position + 4, len(instructions)))
                     if instructions[index].op == "FOR_ITER"), None)
        if loop is None or instructions[loop].target is None:
            continue
        end = index_of[id(instructions[loop].target)]
        for skipped in versions.for_iter_exhaust_skip():
            if instructions[end].opname == skipped:
                end += 1
        found.append(Comprehension(start, end, tuple(instruction.argval for instruction in instructions[start:position])))
    return tuple(found)


def inlined_comprehension(code: types.CodeType, index: int) -> Comprehension | None:
    """The outermost inlined comprehension whose loop holds instruction `index`, if a break can run it whole: it
    stores no local but its own variables (an assignment expression inside would be lost with the span's frame)."""
    for span in _comprehensions(code):
        if not span.start < index < span.end:
            continue
        instructions = bytecode.decode(code).instructions[span.start:span.end]
        own = {instruction.argval for instruction in instructions if instruction.opname == "LOAD_FAST_AND_CLEAR"}
        stored = {name for instruction in instructions if instruction.opname in _WRITES | {"DELETE_FAST"}
                  for name in _names(instruction)}
        return span if stored <= own else None
    return None


# FORMAT_VALUE's and CONVERT_VALUE's conversions: none, !s, !r, !a
_CONVERSIONS = {0: lambda value: value, 1: str, 2: repr, 3: ascii}


def can_break_at(instruction) -> bool:
    return instruction.op in CALL_OPS or instruction.op in JUMP_OPS or instruction.op == "FOR_ITER" or \
        _single_instruction(instruction) is not None


# ------------------------------------------------------------------------------------------------
# Calls made by a break


def _library_paths() -> tuple[str, ...]:
    paths = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}
    paths.add(os.path.dirname(torch.__file__))
    paths.add(os.path.dirname(os.path.dirname(__file__)))  # kiln itself
    return tuple(os.path.join(path, "") for path in paths)


_LIBRARY_PATHS = _library_paths()
_callees: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _is_library(function: types.FunctionType) -> bool:
    filename = function.__code__.co_filename
    return filename.startswith(_LIBRARY_PATHS) and "site-packages/transformers" not in filename


# 3.11's comprehension functions: one called at a break broke inside its loop (else it was traced inline), and
# compiled on its own it would break at every item, a graph each; it runs as it is, as TorchDynamo runs it.
_COMPREHENSIONS = frozenset(("<listcomp>", "<dictcomp>", "<setcomp>"))


def runs_as_it_is(fn: Any) -> bool:
    """Whether a break calls `fn` as it is (`compiled_callee` gives it back unchanged) whatever its receiver: a C
    function, a class, or a plain function of the standard library or torch. The entry then calls it itself, not
    through `call_compiled`, so its caller is the entry, which stands in for the program's frame: `globals()` is
    the program's, `namedtuple` names the program's module."""
    if isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType, type)):
        return True
    return isinstance(fn, types.FunctionType) and _is_library(fn) and \
        not fn.__code__.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR)


def _callee_object(function) -> Any:
    """The object a break's callee tracker stands for, read without pinning it: a Python function's tracker is
    guarded by its code (all `runs_as_it_is` reads of it), not by its identity, until the trace depends on that."""
    fn = getattr(function, "fn", None)
    return fn if isinstance(fn, types.FunctionType) else function.identity()


def compiled_callee(make_dispatcher: Callable, fn: Any) -> tuple[Any, Any]:
    """(callable, bound receiver or None) to run for `fn` at a break: compiled where kiln can trace it."""
    receiver = None
    target = fn
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        receiver, target = fn.__self__, fn.__func__
    if isinstance(target, torch.nn.Module):
        if type(target).__call__ is not torch.nn.Module.__call__ or isinstance(target, torch.nn.RNNBase):
            return fn, None
        if _is_library_module(target):
            if type(target).forward is torch.nn.Sequential.forward:
                return functools.partial(_call_sequential, make_dispatcher, target), None
            return fn, None
    elif not isinstance(target, types.FunctionType) or _is_library(target) or \
            target.__code__.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR) or \
            target.__code__.co_name in _COMPREHENSIONS:
        return fn, None
    try:
        compiled = _callees.setdefault(target, {})
    except TypeError:  # not weakly referenceable
        return fn, None
    dispatcher = compiled.get(make_dispatcher)
    if dispatcher is not None and isinstance(target, types.FunctionType) and dispatcher.fn is not target and \
            not _same_function_behaviour(dispatcher.fn, target):
        dispatcher = None  # either function's code or defaults were reassigned since they were found alike
    if dispatcher is None:
        dispatcher = _equivalent_callee(make_dispatcher, target) or make_dispatcher(target)
        compiled[make_dispatcher] = dispatcher
    if isinstance(target, types.FunctionType) and target.__code__.co_freevars:
        return functools.partial(dispatcher.call_function, target), receiver  # with this closure's cells
    return dispatcher, receiver


def _is_library_module(module: torch.nn.Module) -> bool:
    """A module whose `forward` is torch's own (nn.Linear, nn.ReLU, nn.Sequential, a subclass that keeps it): at a
    break it runs as it is, as a library function does, and as TorchDynamo runs torch.nn's frames that eager code
    calls. A user module it holds is still compiled where the library calls it by a rule kiln knows
    (`_call_sequential`)."""
    forward = getattr(type(module), "forward", None)
    return isinstance(forward, types.FunctionType) and _is_library(forward) and "forward" not in module.__dict__


def _call_sequential(make_dispatcher: Callable, sequential: torch.nn.Sequential, /, *args: Any, **kwargs: Any) -> Any:
    """`sequential(input)` at a break, as nn.Module's call and Sequential.forward run it (no hooks: each child
    in order on the previous one's output), with each child called as a break calls it (`call_compiled`): a
    user module inside gets its own dispatcher, torch's own modules run as they are. Anything else nn.Module's
    call would do differently (hooks, a JIT trace, other arguments) calls the Sequential as it is."""
    from torch.nn.modules import module as module_module

    if len(args) != 1 or kwargs or torch._C._get_tracing_state() or "forward" in sequential.__dict__ or \
            sequential._forward_pre_hooks or sequential._forward_hooks or sequential._backward_hooks or \
            sequential._backward_pre_hooks or module_module._global_forward_pre_hooks or \
            module_module._global_forward_hooks or module_module._global_backward_hooks or \
            module_module._global_backward_pre_hooks:
        return sequential(*args, **kwargs)
    (value,) = args
    for module in sequential:
        value = call_compiled(make_dispatcher, module, value)
    return value


# code object -> [(make_dispatcher, dispatcher)]: callees shared by functions that behave the same
_callees_by_code: "weakref.WeakKeyDictionary[types.CodeType, list]" = weakref.WeakKeyDictionary()
_SHARED_PER_CODE = 8  # past this many (defaults made anew on each call), each function gets its own


def _equivalent_callee(make_dispatcher: Callable, target: Any) -> Any:
    """The dispatcher of another function that runs exactly as `target` does, else None (and `target`'s, once
    made, is offered to the next one).

    A lambda or a function defined in the caller is a new object on each call of the caller; compiling each
    through a dispatcher of its own would trace it again on every call. A function is determined by its
    code, globals, builtins, defaults and closure cells (its name and attributes are not visible to its own
    frame), so a dispatcher made for one such function runs any other: a closure's through
    `Dispatcher.call_function`, whose guards and entries read the cells of the function they are given.
    """
    if not isinstance(target, types.FunctionType):
        return None
    shared = _callees_by_code.setdefault(target.__code__, [])
    for maker, dispatcher in shared:
        if maker is make_dispatcher and _same_function_behaviour(dispatcher.fn, target):
            return dispatcher
    if len(shared) < _SHARED_PER_CODE:
        dispatcher = make_dispatcher(target)
        shared.append((make_dispatcher, dispatcher))
        return dispatcher
    return None


def _same_function_behaviour(function: types.FunctionType, other: types.FunctionType) -> bool:
    """Whether two functions run the same but for their closure cells: same code, globals, builtins, and the
    same default objects."""
    if function.__code__ is not other.__code__ or function.__globals__ is not other.__globals__ or \
            function.__builtins__ is not other.__builtins__ or function.__defaults__ is not other.__defaults__:
        return False
    kwdefaults, other_kwdefaults = function.__kwdefaults__, other.__kwdefaults__
    if kwdefaults is None or other_kwdefaults is None:
        return kwdefaults is other_kwdefaults
    return len(kwdefaults) == len(other_kwdefaults) and all(
        name in other_kwdefaults and other_kwdefaults[name] is value for name, value in kwdefaults.items())


def call_compiled(make_dispatcher: Callable, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """Call `fn` as a break does: through a dispatcher if it is Python kiln can trace, else as it is."""
    target, receiver = compiled_callee(make_dispatcher, fn)
    if receiver is not None:
        return target(receiver, *args, **kwargs)
    return target(*args, **kwargs)


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


__all__ = ["BreakPoint", "CALL_OPS", "Comprehension", "JUMP_OPS", "break_tail", "can_break_at", "call_compiled", "compiled_callee", "live_locals",
           "inlined_comprehension", "iterator_parameters", "protected", "resumable", "try_handler", "resume_code", "runs_as_it_is"]


GeneratorVariable.rebuild = staticmethod(reconstruct_generator)
