"""Bytecode as editable instruction objects, and back to a code object.

`decode(code)` turns a code object into a `Bytecode`: a list of `Instruction`s in
which jump targets are `Instruction` objects (not offsets), `EXTENDED_ARG` prefixes
and inline `CACHE` units are gone, and the exception table is a list of
`ExceptionTableEntry`s that also point at instructions. `assemble(bytecode)` does
the reverse: it lays the instructions out, re-inserts caches and as few
`EXTENDED_ARG`s as reach every target (iterating to a fixed point, since a longer
jump argument can move later targets), and re-encodes the exception table and the
location table (PEP 626 positions).

Round trip: `assemble(decode(code))` reproduces `co_code`, `co_exceptiontable` and
`co_positions()` of code CPython compiled (tests/frontend/test_bytecode.py checks
this over the standard library and transformers). Version differences come from
kiln/frontend/versions.py.
"""
from __future__ import annotations

import dis
import types
from dataclasses import dataclass, field
from typing import Iterator

from kiln.frontend import versions


@dataclass(eq=False)
class Instruction:
    """One instruction; `target` is the instruction a jump goes to (None otherwise)."""

    opname: str
    arg: int | None = None
    argval: object = None
    argrepr: str = ""
    target: "Instruction | None" = None
    positions: dis.Positions | None = None
    offset: int | None = None  # byte offset in the code it was decoded from (None for new ones)
    op: str = ""  # the normalized name the interpreter dispatches on (versions.normalized_opname)

    @property
    def opcode(self) -> int:
        return dis.opmap[self.opname]

    @property
    def lineno(self) -> int | None:
        return self.positions.lineno if self.positions else None

    def __repr__(self) -> str:
        where = f"@{self.offset}" if self.offset is not None else ""
        target = f" -> @{self.target.offset}" if self.target is not None else ""
        return f"Instruction({self.opname} {self.argrepr or self.arg or ''}{where}{target})"


@dataclass(eq=False)
class ExceptionTableEntry:
    """Instructions `start`..`end` (inclusive) handled at `target` with stack `depth`."""

    start: Instruction
    end: Instruction
    target: Instruction
    depth: int
    lasti: bool


@dataclass(eq=False)
class Bytecode:
    """A decoded code object: instructions, exception table, and the code it came from."""

    code: types.CodeType
    instructions: list[Instruction]
    exception_table: list[ExceptionTableEntry] = field(default_factory=list)

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)


def create_instruction(opname: str, arg: int | None = None, argval: object = None, target=None,
                       positions: dis.Positions | None = None) -> Instruction:
    """A new instruction (for generated code); `arg` is filled in by `assemble` for jumps."""
    return Instruction(opname, arg, argval, str(argval) if argval is not None else "", target, positions,
                       None, versions.normalized_opname(opname, arg))


# ---------------------------------------------------------------------------------------------
# Decoding


def decode(code: types.CodeType) -> Bytecode:
    """Decode `code` into instruction objects with resolved jump and handler targets."""
    raw = code.co_code
    described = {instr.offset: instr for instr in dis.get_instructions(code)}
    positions = list(code.co_positions())
    instructions: list[Instruction] = []
    by_offset: dict[int, Instruction] = {}
    jumps: list[tuple[Instruction, int]] = []
    offset = 0
    while offset < len(raw):
        number = raw[offset]
        if number in (versions.CACHE_OPCODE, versions.EXTENDED_ARG_OPCODE):
            offset += 2
            continue
        info = described[offset]
        opname = dis.opname[number]
        instruction = Instruction(opname, info.arg, info.argval, info.argrepr, None,
                                  dis.Positions(*positions[offset // 2]), offset,
                                  versions.normalized_opname(opname, info.arg))
        if versions.is_jump(number):
            target = versions.jump_target_offset(offset, opname, info.arg)
            if isinstance(info.argval, int) and info.argval != target:
                raise AssertionError(f"{opname} at {offset}: dis says the target is {info.argval}, "
                                     f"kiln's version table says {target}; update kiln/frontend/versions.py")
            jumps.append((instruction, target))
        instructions.append(instruction)
        by_offset[offset] = instruction
        offset += 2
    for instruction, target in jumps:
        instruction.target = _instruction_at(by_offset, target)
    table = [ExceptionTableEntry(_instruction_at(by_offset, start), _last_instruction_before(instructions, end),
                                 _instruction_at(by_offset, target), depth, lasti)
             for start, end, target, depth, lasti in _parse_exception_table(code.co_exceptiontable)]
    return Bytecode(code, instructions, table)


def _instruction_at(by_offset: dict[int, Instruction], offset: int) -> Instruction:
    # A target may point at an EXTENDED_ARG prefix; the instruction is the next real one.
    while offset not in by_offset:
        offset += 2
    return by_offset[offset]


def _last_instruction_before(instructions: list[Instruction], end_offset: int) -> Instruction:
    last = None
    for instruction in instructions:
        if instruction.offset >= end_offset:
            break
        last = instruction
    assert last is not None
    return last


def _read_varint(data: bytes, index: int) -> tuple[int, int]:
    byte = data[index]
    index += 1
    value = byte & 63
    while byte & 64:
        byte = data[index]
        index += 1
        value = (value << 6) | (byte & 63)
    return value, index


def _parse_exception_table(table: bytes) -> list[tuple[int, int, int, int, bool]]:
    """(start, end, target, depth, lasti) in byte offsets; `end` is exclusive."""
    entries = []
    index = 0
    while index < len(table):
        start, index = _read_varint(table, index)
        length, index = _read_varint(table, index)
        target, index = _read_varint(table, index)
        depth_lasti, index = _read_varint(table, index)
        entries.append((start * 2, (start + length) * 2, target * 2, depth_lasti >> 1, bool(depth_lasti & 1)))
    return entries


# ---------------------------------------------------------------------------------------------
# Assembling


def assemble(bytecode: Bytecode, **code_changes) -> types.CodeType:
    """Lay out `bytecode` into a new code object (`code_changes` go to `code.replace`)."""
    instructions = bytecode.instructions
    for previous, following in zip(instructions, instructions[1:]):
        if previous.opname in _MUST_PRECEDE and (previous.opname, following.opname) not in versions.MUST_BE_ADJACENT:
            raise ValueError(f"{previous.opname} must be followed directly by {_MUST_PRECEDE[previous.opname]}, "
                             f"not {following.opname}")
    extended = {id(instruction): _extended_arg_count(instruction.arg or 0) for instruction in instructions}
    while True:
        offsets = _layout(instructions, extended)
        changed = False
        for instruction in instructions:
            if instruction.target is not None:
                # A jump lands on the target's EXTENDED_ARG prefixes, not after them.
                target = instruction.target
                instruction.arg = versions.jump_argument(offsets[id(instruction)], instruction.opname,
                                                         offsets[id(target)] - 2 * extended[id(target)])
            needed = _extended_arg_count(instruction.arg or 0)
            if needed > extended[id(instruction)]:
                extended[id(instruction)] = needed
                changed = True
        if not changed:
            break
    code_bytes = bytearray()
    location_units: list[dis.Positions | None] = []
    for instruction in instructions:
        arg = instruction.arg or 0
        for shift in range(extended[id(instruction)], 0, -1):
            code_bytes += bytes((versions.EXTENDED_ARG_OPCODE, (arg >> (8 * shift)) & 0xFF))
            location_units.append(instruction.positions)
        code_bytes += bytes((instruction.opcode, arg & 0xFF))
        location_units.append(instruction.positions)
        for _ in range(versions.inline_cache_count(instruction.opname)):
            code_bytes += bytes((versions.CACHE_OPCODE, 0))
            location_units.append(instruction.positions)
    first_line = code_changes.get("co_firstlineno", bytecode.code.co_firstlineno)
    changes = {
        "co_code": bytes(code_bytes),
        "co_exceptiontable": _encode_exception_table(bytecode.exception_table, offsets, extended),
        "co_linetable": _encode_location_table(location_units, first_line),
    }
    changes.update(code_changes)
    return bytecode.code.replace(**changes)


_MUST_PRECEDE = {first: second for first, second in versions.MUST_BE_ADJACENT}


def _extended_arg_count(arg: int) -> int:
    count = 0
    while arg > 0xFF:
        arg >>= 8
        count += 1
    return count


def _layout(instructions: list[Instruction], extended: dict[int, int]) -> dict[int, int]:
    """id(instruction) -> byte offset of the instruction itself (after its EXTENDED_ARGs)."""
    offsets = {}
    offset = 0
    for instruction in instructions:
        offset += 2 * extended[id(instruction)]
        offsets[id(instruction)] = offset
        offset += 2 + 2 * versions.inline_cache_count(instruction.opname)
    return offsets


def _write_varint(out: bytearray, value: int, first: bool) -> None:
    chunks = [value & 63]
    value >>= 6
    while value:
        chunks.append(value & 63)
        value >>= 6
    chunks.reverse()
    for position, chunk in enumerate(chunks):
        if position < len(chunks) - 1:
            chunk |= 64
        if first and position == 0:
            chunk |= 128
        out.append(chunk)


def _encode_exception_table(entries: list[ExceptionTableEntry], offsets: dict[int, int],
                            extended: dict[int, int]) -> bytes:
    out = bytearray()
    for entry in entries:
        # An entry covers the EXTENDED_ARG prefixes of its first instruction and the caches of its last.
        start = offsets[id(entry.start)] - 2 * extended[id(entry.start)]
        end = offsets[id(entry.end)] + 2 + 2 * versions.inline_cache_count(entry.end.opname)
        target = offsets[id(entry.target)] - 2 * extended[id(entry.target)]
        _write_varint(out, start // 2, True)
        _write_varint(out, (end - start) // 2, False)
        _write_varint(out, target // 2, False)
        _write_varint(out, (entry.depth << 1) | int(entry.lasti), False)
    return bytes(out)


def _write_location_varint(out: bytearray, value: int) -> None:
    while value >= 64:
        out.append(64 | (value & 63))
        value >>= 6
    out.append(value)


def _write_location_svarint(out: bytearray, value: int) -> None:
    _write_location_varint(out, (-value << 1) | 1 if value < 0 else value << 1)


def _encode_location_table(units: list[dis.Positions | None], first_line: int) -> bytes:
    """PEP 626 location table: runs of equal positions, each entry at most 8 code units long.

    Uses the long form (code 14), the no-column form (13) and no-location (15); CPython
    may choose shorter forms, so tables are compared by `co_positions()`, not bytes.
    """
    out = bytearray()
    previous_line = first_line
    index = 0
    while index < len(units):
        position = units[index]
        run = 1
        while index + run < len(units) and run < 8 and units[index + run] == position:
            run += 1
        if position is None or position.lineno is None:
            out.append(0x80 | (15 << 3) | (run - 1))
        elif position.col_offset is None or position.end_lineno is None or position.end_col_offset is None:
            out.append(0x80 | (13 << 3) | (run - 1))
            _write_location_svarint(out, position.lineno - previous_line)
            previous_line = position.lineno
        else:
            out.append(0x80 | (14 << 3) | (run - 1))
            _write_location_svarint(out, position.lineno - previous_line)
            _write_location_varint(out, position.end_lineno - position.lineno)
            _write_location_varint(out, position.col_offset + 1)
            _write_location_varint(out, position.end_col_offset + 1)
            previous_line = position.lineno
        index += run
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# Stack depth of generated code


def max_stack_depth(bytecode: Bytecode) -> int:
    """The deepest value stack any path through `bytecode` reaches (for `co_stacksize`)."""
    instructions = bytecode.instructions
    index_of = {id(instruction): index for index, instruction in enumerate(instructions)}
    depth_at: dict[int, int] = {}
    worklist = [(0, 0)]
    for entry in bytecode.exception_table:
        worklist.append((index_of[id(entry.target)], entry.depth + 1 + int(entry.lasti)))
    deepest = 0
    while worklist:
        index, depth = worklist.pop()
        while index < len(instructions):
            if depth_at.get(index, -1) >= depth:
                break
            depth_at[index] = depth
            instruction = instructions[index]
            number = instruction.opcode
            arg = instruction.arg if number >= dis.HAVE_ARGUMENT else None
            if instruction.target is not None:
                jumped = depth + dis.stack_effect(number, arg, jump=True)
                deepest = max(deepest, jumped)
                worklist.append((index_of[id(instruction.target)], jumped))
            depth += dis.stack_effect(number, arg, jump=False)
            if instruction.opname == "RETURN_GENERATOR":
                depth += 1  # the value the first next() sends, which the POP_TOP after it drops (dis says 0)
            deepest = max(deepest, depth)
            if instruction.opname in _ENDS_BLOCK:
                break
            index += 1
    return deepest


_ENDS_BLOCK = frozenset({"RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "JUMP_FORWARD",
                         "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT"})
