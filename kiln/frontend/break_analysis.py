"""What a frame's bytecode says about a graph break: live locals, handlers, comprehensions.

Static analyses of one code object, each cached per code:
- `live_locals`: the locals some path from an instruction reads before writing (a backward
  liveness pass, exception handlers included): what a resume function must be passed;
- `try_handler` and `protected`: the exception-table entry around an instruction (a try
  block's handler or a `with` block's cleanup), and whether it lies in an `except` clause's
  own body, where a break cannot resume;
- `resumable`: whether a resume function of the code can take its cells as its closure;
- `Comprehension` and `inlined_comprehension`: 3.12's comprehensions inlined into their
  function, whose span a break runs whole.

The dispatcher asks them where a break may go; resume.py and resume_codegen.py use them to
build the entry's last lines and the resume code. They read bytecode only (no trackers, no
frames), so they live apart from the code generation.
"""
from __future__ import annotations

import functools
import inspect
import types
from dataclasses import dataclass

from kiln.frontend import bytecode, versions

_READS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "DELETE_FAST", "LOAD_FAST_LOAD_FAST",
                    "LOAD_FAST_BORROW", "LOAD_FAST_BORROW_LOAD_FAST_BORROW"})
_WRITES = frozenset({"STORE_FAST", "STORE_FAST_STORE_FAST"})
_FAST_OPS = _READS | _WRITES | {"STORE_FAST_LOAD_FAST"}
_PROLOGUE_OPS = frozenset({"COPY_FREE_VARS", "MAKE_CELL", "RESUME"})
_STOPS = frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"})


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
