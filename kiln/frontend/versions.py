"""Every CPython-version difference the frontend knows about, in one place.

kiln supports CPython 3.11 and 3.12 and is written to be ready for 3.13. The
bytecode of those versions differs in small, well-defined ways; this module turns
each difference into a question with one answer per version, so the rest of the
frontend (bytecode.py, interpreter.py) never tests `sys.version_info` itself:

- opcode tables: inline CACHE entries per opcode, which opcodes jump and whether
  backwards (`inline_cache_count`, `is_jump`, `is_backward_jump`);
- normalized opcode names for the symbolic interpreter (`normalized_opname`): the
  3.11 direction-specific jumps (`POP_JUMP_FORWARD_IF_FALSE`) become
  `POP_JUMP_IF_FALSE`, `PRECALL` becomes a no-op, 3.12's `LOAD_ATTR` with the method
  bit becomes `LOAD_METHOD`, and so on;
- the stack layout of calls (`split_callable_pair`, `push_callable_with_null`):
  3.11/3.12 keep `NULL` *below* the callable, 3.13 keeps it *above*;
- what an exhausted `FOR_ITER` skips (`for_iter_exhaust_skip`).
"""
from __future__ import annotations

import dis
import opcode
import sys

PY311 = sys.version_info[:2] == (3, 11)
PY312 = sys.version_info[:2] == (3, 12)
PY313_OR_LATER = sys.version_info >= (3, 13)

if sys.version_info < (3, 11):
    raise ImportError("kiln.frontend needs CPython 3.11 or newer")

CACHE_OPCODE = dis.opmap["CACHE"]
EXTENDED_ARG_OPCODE = dis.opmap["EXTENDED_ARG"]

_JUMP_OPCODES = frozenset(dis.hasjrel) | frozenset(getattr(dis, "hasjump", ()))
_BACKWARD_JUMP_NAMES = frozenset(name for name in dis.opmap if "JUMP_BACKWARD" in name)


def _cache_table() -> dict[str, int]:
    """opname -> number of inline CACHE code units following the instruction."""
    entries = opcode._inline_cache_entries  # a list indexed by opcode (3.11, 3.12) or a dict by name (3.13)
    if isinstance(entries, dict):
        return {name: int(entries.get(name, 0)) for name in dis.opmap}
    return {name: int(entries[code]) for name, code in dis.opmap.items() if code < len(entries)}


_CACHE_COUNTS = _cache_table()


def inline_cache_count(opname: str) -> int:
    """How many CACHE units follow an instruction named `opname` in this CPython."""
    return _CACHE_COUNTS.get(opname, 0)


def is_jump(opcode_number: int) -> bool:
    """Whether the instruction's argument is a relative jump offset."""
    return opcode_number in _JUMP_OPCODES


def is_backward_jump(opname: str) -> bool:
    return opname in _BACKWARD_JUMP_NAMES


def jump_target_offset(offset: int, opname: str, arg: int) -> int:
    """Byte offset a relative jump at `offset` with argument `arg` goes to.

    The jump is relative to the instruction after this one and its inline caches.
    """
    after = offset + 2 + 2 * inline_cache_count(opname)
    return after - 2 * arg if is_backward_jump(opname) else after + 2 * arg


def jump_argument(offset: int, opname: str, target_offset: int) -> int:
    """The inverse of `jump_target_offset`: the argument that reaches `target_offset`."""
    after = offset + 2 + 2 * inline_cache_count(opname)
    delta = (after - target_offset) if is_backward_jump(opname) else (target_offset - after)
    if delta < 0 or delta % 2:
        raise ValueError(f"{opname} at {offset} cannot reach {target_offset}")
    return delta // 2


# ---------------------------------------------------------------------------------------------
# Normalized opcode names for the symbolic interpreter.

_RENAMES = {
    "POP_JUMP_FORWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_FORWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_FORWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_BACKWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_BACKWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "JUMP_FORWARD": "JUMP",
    "JUMP_BACKWARD": "JUMP",
    "JUMP_BACKWARD_NO_INTERRUPT": "JUMP",
    "JUMP_NO_INTERRUPT": "JUMP",
    "LOAD_FAST_CHECK": "LOAD_FAST",
    "LOAD_CLOSURE": "LOAD_CLOSURE",
    "PRECALL": "NOP",
    "RESUME": "NOP",
    "CACHE": "NOP",
    "EXTENDED_ARG": "NOP",
    "COPY_FREE_VARS": "NOP",
    "MAKE_CELL": "NOP",
    "NOT_TAKEN": "NOP",
}


def normalized_opname(opname: str, arg: int | None) -> str:
    """The interpreter's name for an instruction (same meaning on every version)."""
    if opname == "LOAD_ATTR" and not PY311 and arg is not None and arg & 1:
        return "LOAD_METHOD"  # 3.12+: the low bit of LOAD_ATTR asks for the method form
    return _RENAMES.get(opname, opname)


def load_global_pushes_null(opname: str, arg: int | None) -> bool:
    """Whether LOAD_GLOBAL also pushes a NULL for a following CALL (low bit, 3.11+)."""
    return opname == "LOAD_GLOBAL" and bool(arg is not None and arg & 1)


def load_super_attr_is_method(arg: int) -> bool:
    """3.12+ LOAD_SUPER_ATTR: bit 0 asks for the method form."""
    return bool(arg & 1)


def compare_operator(argval) -> str:
    """COMPARE_OP's operator symbol ('<', '==', ...) whatever the version encodes."""
    text = str(argval)
    if text.startswith("bool(") and text.endswith(")"):  # 3.13 marks a bool-coercing compare
        text = text[5:-1]
    return text


# ---------------------------------------------------------------------------------------------
# Call stack layout.

NULL_BELOW_CALLABLE = not PY313_OR_LATER


def split_callable_pair(lower, upper, null):
    """The two stack slots under a CALL's arguments -> (callable, self_or_None).

    3.11/3.12: [NULL, callable] or [method, self].  3.13: [callable, NULL] or [method, self].
    """
    if NULL_BELOW_CALLABLE:
        if lower is null:
            return upper, None
        return lower, upper
    if upper is null:
        return lower, None
    return lower, upper


def push_callable_with_null(stack: list, callable_value, null) -> None:
    """Push a callable together with a NULL, in this version's order."""
    if NULL_BELOW_CALLABLE:
        stack.append(null)
        stack.append(callable_value)
    else:
        stack.append(callable_value)
        stack.append(null)


# Pairs CPython's specializing interpreter assumes adjacent: 3.11's PRECALL specializations
# skip the CALL that must follow them directly.
MUST_BE_ADJACENT = frozenset({("PRECALL", "CALL")}) if PY311 else frozenset()


def for_iter_exhaust_skip() -> tuple[str, ...]:
    """Instructions at an exhausted FOR_ITER's target that CPython skips.

    3.11 jumps straight past the loop; 3.12 jumps over the END_FOR at the target;
    3.13 over END_FOR and the POP_TOP after it.
    """
    if PY311:
        return ()
    if PY312:
        return ("END_FOR",)
    return ("END_FOR", "POP_TOP")


def send_exhaustion_pops_receiver() -> bool:
    """Whether SEND, when its delegate is exhausted, replaces the delegate by the return value (3.11) or pushes
    the value above it for the END_SEND at its target to remove (3.12+)."""
    return PY311


def intrinsic_name(argrepr: str) -> str:
    """CALL_INTRINSIC_1's function name (3.12+), e.g. 'INTRINSIC_LIST_TO_TUPLE'."""
    return argrepr
