"""Resume functions' code objects: a copy of a frame's code that starts after a graph break.

`resume_code` makes one: its parameters are the value stack and the live locals, by kind
(a value, an iterator passed as its remaining items, a generator passed as the resume
function of its own code, a lazy iterator passed as its parts), and a short prologue pushes
them back and jumps to the instruction after the break; `closure_function` makes the function
over the frame's cells. The tables kept beside each resume code map it back to the user's
code (`original_position`: a break in a loop resumes through one function on every
iteration) and tell a loop's iterations apart (`iterator_parameters`).

resume.py decides what the entry does at a break and which kind each value has; this module
only writes bytecode, so it lives apart.
"""
from __future__ import annotations

import functools
import inspect
import types
import weakref
from typing import Any, Callable

from kiln.frontend import bytecode, versions
from kiln.frontend.break_analysis import _FAST_OPS, _PROLOGUE_OPS, _names

_DEREF_OPS = frozenset({"LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF", "LOAD_CLOSURE", "LOAD_FROM_DICT_OR_DEREF",
                        "MAKE_CELL"})


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
