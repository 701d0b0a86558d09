"""Shrink a failing fuzz program while it keeps failing the same way.

`minimize_program` runs the program once to learn its failure (outcome, and for a crash
the exception's type; for a wrong answer the kind of mismatch), then tries smaller
candidates, greedily keeping each one that fails the same way:

1. keep one output (the failing one first), or return an intermediate instead;
2. drop dead statements; drop each statement, its uses replaced by an earlier value of
   the same shape and dtype (an input or one of its own operands first), or by a new
   input of that shape and dtype;
3. drop unused inputs; make each input contiguous, finite, unscaled; shrink each
   input dim (to 1, to half, by one).

A program that passes after falling back to eager shrinks while it falls back for the
same reason. A candidate that eager rejects (a shrunk shape a later reshape no longer fits) is
`invalid`, which is not the same failure, so it is simply not kept. Every candidate runs
in one long-lived worker process (tests/fuzz/workers.py), so a crash costs a restart,
not the minimizer. The result prints as a repro script and as a REGRESSIONS entry.
"""
from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Callable, Iterator

import torch

from tests.fuzz.program import DTYPE_NAMES, InputSpec, Program
from tests.fuzz.report import reason_key
from tests.fuzz.runner import Outcome, trace_values
from tests.fuzz.workers import Task, WorkerSession

SHRINKABLE = Outcome.FAILURES + (Outcome.STRIDE, Outcome.SENSITIVE)


def failure_signature(result) -> tuple:
    """What must stay the same while shrinking: the outcome and the kind of failure.

    A program that passes after a fallback shrinks too, while it falls back for the same
    reason (numbers and names blurred), so fallbacks can be triaged like failures.
    """
    message = result.message or result.stride_message
    if result.outcome == Outcome.PASS and result.fallbacks:
        return "fallback", reason_key(result.fallbacks[0])
    if result.outcome == Outcome.CRASH:
        return result.outcome, message.split(":", 1)[0]
    if result.outcome == Outcome.WRONG:
        for kind in ("shape", "dtype", "NaN", "infinities", "elements differ", "max error", "norm error", "outputs"):
            if kind in message:
                return result.outcome, kind
    return result.outcome, ""


def _uses(text: str, name: str) -> bool:
    return re.search(rf"\b{name}\b", text) is not None


def _substitute(text: str, name: str, replacement: str) -> str:
    return re.sub(rf"\b{name}\b", replacement, text)


def _failing_output(result) -> int | None:
    match = re.match(r"output (\d+)", result.message or result.stride_message or "")
    return int(match.group(1)) if match else None


def _without_statement(program: Program, position: int, replacement: str | None) -> Program | None:
    target = program.statements[position].target
    later = program.statements[position + 1:]
    if replacement is None and (any(_uses(statement.expr, target) for statement in later) or target in program.outputs):
        return None
    statements = list(program.statements[:position])
    for statement in later:
        expr = _substitute(statement.expr, target, replacement) if replacement else statement.expr
        statements.append(replace(statement, expr=expr))
    outputs = tuple(replacement if output == target else output for output in program.outputs)
    outputs = tuple(dict.fromkeys(outputs))  # a replacement may already be an output
    return program.with_changes(statements=tuple(statements), outputs=outputs)


def _dead_code_removed(program: Program) -> Program:
    """Statements whose target nothing later reads (in-place writes are kept: they act on their operand)."""
    kept = []
    needed_text = " ".join(program.outputs)
    for statement in reversed(program.statements):
        inplace = re.search(r"\w_\(", statement.expr) is not None
        if inplace or _uses(needed_text, statement.target):
            kept.append(statement)
            needed_text += " " + statement.expr
    return program.with_changes(statements=tuple(reversed(kept)))


def _as_input(program: Program, position: int, shape: tuple, dtype) -> Program:
    """The program with statement `position`'s value made a new input of its shape and dtype.

    This cuts the statement off from everything that computed it (the new input has
    fresh random values), so the failure must come from what follows.
    """
    used = [int(spec.name[1:]) for spec in program.inputs if spec.name[1:].isdigit()]
    name = f"x{max(used, default=-1) + 1}"
    if dtype == torch.bool:
        spec = InputSpec(name, shape, "bool", "bool", seed=position)
    elif dtype.is_floating_point:
        spec = InputSpec(name, shape, DTYPE_NAMES[dtype], "randn", seed=position)
    else:
        spec = InputSpec(name, shape, DTYPE_NAMES[dtype], "randint", low=-4, high=5, seed=position)
    without = _without_statement(program, position, name)
    return without.with_changes(inputs=program.inputs + (spec,))


def candidates(program: Program, failing_output: int | None) -> Iterator[Program]:
    """Smaller variants of `program`, most promising first (none returns an input itself)."""
    for candidate in _all_candidates(program, failing_output):
        # A program returning an input slips into another failure (the frontend once returned the wrong input).
        if candidate != program and not set(candidate.input_names()).intersection(candidate.outputs):
            yield candidate


def _all_candidates(program: Program, failing_output: int | None) -> Iterator[Program]:
    if len(program.outputs) > 1:
        order = list(range(len(program.outputs)))
        if failing_output is not None and failing_output < len(order):
            order.remove(failing_output)
            order.insert(0, failing_output)
        for position in order:
            yield program.with_changes(outputs=(program.outputs[position],))
    pruned = _dead_code_removed(program)
    if len(pruned.statements) < len(program.statements):
        yield pruned
    try:
        traced = trace_values(program)
    except Exception:
        traced = {}
    for position in reversed(range(len(program.statements))):
        statement = program.statements[position]
        removed = _without_statement(program, position, None)
        if removed is not None:
            yield removed
            continue
        signature = traced.get(statement.target)
        earlier = program.input_names() + [other.target for other in program.statements[:position]]
        operands = [name for name in earlier if _uses(statement.expr, name)]
        same_type = [name for name in operands[::-1] + earlier if traced.get(name) == signature]
        for replacement in list(dict.fromkeys(same_type))[:3]:
            candidate = _without_statement(program, position, replacement)
            if candidate is not None:
                yield candidate
        if signature is not None:
            yield _as_input(program, position, *signature)
    for statement in program.statements[:-1]:  # the wrong value may already be an intermediate
        if statement.target not in program.outputs:
            yield _dead_code_removed(program.with_changes(outputs=(statement.target,)))
    text = " ".join(statement.expr for statement in program.statements) + " " + " ".join(program.outputs)
    used = tuple(spec for spec in program.inputs if _uses(text, spec.name))
    if len(used) < len(program.inputs):
        yield program.with_changes(inputs=used)
    for position, spec in enumerate(program.inputs):
        simpler = []
        if spec.layout != "contiguous":
            simpler.append(replace(spec, layout="contiguous", layout_arg=()))
        if spec.nonfinite:
            simpler.append(replace(spec, nonfinite=0.0))
        if spec.values == "randn" and spec.scale != 1.0:
            simpler.append(replace(spec, scale=1.0))
        for dim, size in enumerate(spec.shape):
            for smaller in dict.fromkeys((1, size // 2, size - 1)):
                if 0 <= smaller < size and not (smaller == 0 and size == 1):
                    shape = spec.shape[:dim] + (smaller,) + spec.shape[dim + 1:]
                    simpler.append(replace(spec, shape=shape, layout="contiguous", layout_arg=())
                                   if spec.layout in ("expanded", "stepped") else replace(spec, shape=shape))
        for new_spec in simpler:
            inputs = list(program.inputs)
            inputs[position] = new_spec
            yield program.with_changes(inputs=tuple(inputs))


def minimize_program(program: Program, *, backend: str = "cpp", device: str = "cpu", timeout: float = 60.0,
                     budget_seconds: float = 1200.0, log: Callable[[str], None] = print,
                     run: Callable[[Program], object] | None = None) -> Program | None:
    """The smallest variant of `program` found that fails like it does (None: it does not fail).

    `run` (a program -> ProgramResult function) replaces the worker process, for tests.
    """
    if run is not None:
        return _minimize(program, run, backend, device, budget_seconds, log)
    with WorkerSession(timeout=timeout) as session:
        return _minimize(program, lambda candidate: session.run(Task(candidate, backend, device)),
                         backend, device, budget_seconds, log)


def _minimize(program: Program, run: Callable, backend: str, device: str, budget_seconds: float,
              log: Callable[[str], None]) -> Program | None:
    started = time.monotonic()
    first = run(program)
    if first.outcome not in SHRINKABLE and not first.fallbacks:
        log(f"{program.name}: {first.outcome} on {backend}: nothing to minimize")
        return None
    wanted = failure_signature(first)
    log(f"{program.name}: {first.outcome}: {first.message or first.stride_message or first.fallbacks[0]}")
    log(f"minimizing while the failure stays {wanted} ...")
    current, last, runs = program, first, 0
    seen = {program}  # candidates can lead back to an earlier program (outputs swapped around an in-place write)
    improved = True
    while improved and time.monotonic() - started < budget_seconds:
        improved = False
        for candidate in candidates(current, _failing_output(last)):
            if candidate in seen:
                continue
            seen.add(candidate)
            if time.monotonic() - started > budget_seconds:
                log("time budget spent: stopping with what was found")
                break
            result = run(candidate)
            runs += 1
            if failure_signature(result) == wanted:
                current, last, improved = candidate, result, True
                log(f"  {len(current.statements)} statements, {len(current.inputs)} inputs, "
                    f"{[spec.shape for spec in current.inputs]}: {result.message[:120]}")
                break
    log(f"\n# minimal program after {runs} runs ({time.monotonic() - started:.0f} s): "
        f"{last.outcome}: {last.message or last.stride_message}\n")
    log(current.repro_source(backend, device))
    log("# as a tests/fuzz/regressions.py entry:\n" + regression_entry(current, backend))
    return current


def regression_entry(program: Program, backend: str) -> str:
    """Source of a REGRESSIONS entry for `program` (the bug class left for the reader to name)."""
    inputs = ",\n                         ".join(repr(spec) for spec in program.inputs)
    body = "\n".join(statement.source() for statement in program.statements)
    return (f"    Regression(explicit({program.name + '_min'!r}, [{inputs}],\n"
            f"                        {body!r}, {tuple(program.outputs)!r}),\n"
            f"               \"<what it exercises>\", {{{backend!r}: BUG_<CLASS>}}),")
