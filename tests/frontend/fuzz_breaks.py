"""Graph-break fuzzer for kiln's frontend: random programs that break, in random places, amid side effects.

A case is a small program `program(x, w)` generated at random (seeded, deterministic) from
three kinds of pieces:

- break points: `print` of a tensor (also in an f-string), `.item()` / `.tolist()` / `bool()`
  / `int()` of a tensor read into Python and used (arithmetic, an `if`, a `range`, a LOG
  entry), some in the middle of an expression (values on the stack cross the break), an `if`
  or `while` on a tensor, a data-dependent shape (`x[x > 0]`, `nonzero`), C functions kiln
  does not model (`time.perf_counter()`, its value or its difference discarded; `os.getpid()`
  in a check without effect), `torch._dynamo.graph_break()` (which kiln traces as the no-op
  Python function it is: no break), and a list comprehension of `.item()` reads. Every
  data-dependent decision reads the input `x` only, whose elements are
  at least 0.5 away from zero (random signs, magnitudes in [0.5, 1.5], times 4 on the last two
  calls), and compares against thresholds far from any value it can take (`x.abs().sum()`
  is in [6, 18] or [24, 72], compared with 21): no decision depends on rounding;
- places: straight-line code, `for` over a range (maybe left by `break` or skipped by
  `continue` on the data) or a list, `while`, `with` a user context manager that logs its
  enter and exit, `with torch.no_grad()` (and enable_grad, set_grad_enabled), `try/except/
  finally` (with or without a KeyError raised and caught), helper functions (called with
  positional, keyword or unpacked arguments; maybe returning early; nesting gives 1-3 levels),
  a method of an object that counts its calls, generators (consumed by a `for`, or left early
  with `break`, endless or not), a list comprehension calling a helper that breaks, closures
  (reading the frame's arguments as cells; one kind also assigns a `nonlocal`). Places nest,
  and loop counters in scope index the data a break reads;
- side effects around the breaks: appends to a global LOG list, dict mutations, attribute
  stores on a plain object, global stores, list mutations, in-place ops on the argument `w`,
  `print` of Python values, and reads of that state back into the result.

Each case's source is exec'd into three fresh namespaces: one side compiles `program` with
`kiln.compile(program, backend=...)`, one runs it eagerly, and the third runs it eagerly in
float64 (the reference for kiln.testing's rule). Each side makes four calls, each on fresh
state (the source's `reset()`) and fresh arguments: call 1 and 2 on the same values, 3 and
4 on other values (other signs, 4x magnitudes: data-dependent branches go the other way).
After every call these must agree with eager's: the result (kiln.testing.compare, the
float64 run as reference; structure, ints, strings and bools exactly; which results are the
arguments themselves), the arguments (mutated in place), LOG (contents and order), the dict,
the objects' attributes, the globals, torch's grad mode after the call, and stdout: each
write's text and the length of LOG at that moment (its order among LOG's events). An
exception counts only if eager raised the same type.

Outcomes: `wrong` (a difference), `crash` (kiln raised where eager did not, or another
exception type), `retraced` (call 2 or call 4, whose state and arguments equal the call
before, traced something: the second call must reuse compiled entries. A case that keeps
a clock value live across a break is exempt: that float differs on every call, and kiln
specializes it, so each call may trace again, up to the recompile limit), `eager`
(a frame ran eagerly instead of breaking: counted apart as fuzz_guards counts fallbacks;
the results are still checked and a wrong one is `wrong`), `pass`.

    python -m tests.frontend.fuzz_breaks --cases 500 --seed 0 [--backend aot_eager|kiln] [--no-write]

writes tests/frontend/results/<date>_break-fuzz_seed<S>_<N>cases_<backend>.md, every
failure with its generated source (a ready repro: run `program` eagerly and compiled after
`reset()` on `make_args(SEED, 1.0)`). tests/frontend/test_break_fuzz.py runs a fixed-seed
subset in CI.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import logging
import platform
import random
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

import kiln
from kiln.frontend import dispatcher as frontend_dispatcher
from kiln.frontend import stats as frontend_stats
from kiln.testing import compare
from tests.frontend.fuzz_guards import checkout_commit

RESULTS = Path(__file__).resolve().parent / "results"
CASE_TIMEOUT_S = 180

# Module-level code every case starts with. `make_args(seed, scale)`: x with elements +-[0.5, 1.5] * scale,
# w random; RAND_DTYPE is float64 in the reference run (the same values, widened).
PRELUDE = '''\
import os
import time
import torch
RAND_DTYPE = globals().get("RAND_DTYPE", torch.float32)
def make_args(seed, scale):
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (4, 3), generator=g) * 2 - 1
    x = (torch.rand(4, 3, generator=g) + 0.5) * signs * scale
    w = torch.randn(4, 3, generator=g)
    return x.to(RAND_DTYPE), w.to(RAND_DTYPE)
LOG = []
D = {}
ITEMS = []
class Obj:
    pass
OBJ = Obj()
class Ctx:
    """A user context manager: logs its enter and exit (and whether an exception left the block)."""
    def __init__(self, tag):
        self.tag = tag
    def __enter__(self):
        LOG.append(("enter", self.tag))
        return self
    def __exit__(self, kind, value, tb):
        LOG.append(("exit", self.tag, kind is None))
        return False
GC = 0
'''


@dataclass
class Scope:
    """What the code being generated can read: int-valued locals (loop counters) and the enclosing kind."""

    ints: list[str] = field(default_factory=list)
    in_generator: bool = False


class Builder:
    """Generates one case's program (see the module docstring)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.counter = 0
        self.defs: list[list[str]] = []  # module-level functions and classes
        self.globals: list[str] = ["GC"]  # every generated function declares them `global`
        self.workers: list[str] = []  # objects with a method (their attributes are compared)
        self.features: collections.Counter = collections.Counter()
        self.reads_clock = False

    def next(self) -> int:
        self.counter += 1
        return self.counter

    # ------------------------------------------------------------ program

    def program(self) -> str:
        rng = self.rng
        body = ["y = x * 0.5 + w"]
        for _ in range(rng.choice((1, 1, 2, 2, 3))):
            body += self.segment(0, Scope())
            if rng.random() < 0.3:
                body += self.compute()
        body += self.result()
        lines = ["def program(x, w):", "    __GLOBALS__"] + indent(body)
        return "\n".join(lines)

    def result(self) -> list[str]:
        choice = self.rng.randrange(5)
        self.features["return " + ("y", "(y, w)", "(y, len(LOG))", "dict", "(x, y)")[choice]] += 1
        return [("return y", "return y, w", "return y, len(LOG)", "return {'y': y, 'n': D['n'], 'log': len(LOG)}",
                 "return x, y")[choice]]

    def segment(self, depth: int, scope: Scope) -> list[str]:
        """A break point with side effects around it, inside 0-3 nested places."""
        chance = (0.8, 0.45, 0.2, 0.0)[depth]
        if self.rng.random() < chance:
            names, weights = zip(*PLACES)
            place = self.rng.choices(names, weights)[0]
            self.features["in " + place] += 1
            return getattr(self, "place_" + place)(depth, scope)
        return self.core(scope)

    def body(self, depth: int, scope: Scope) -> list[str]:
        lines = self.segment(depth + 1, scope)
        if self.rng.random() < 0.25:
            lines += self.segment(depth + 1, scope)
        return lines

    def core(self, scope: Scope) -> list[str]:
        rng = self.rng
        lines = []
        for _ in range(rng.choice((0, 1, 1, 2))):
            lines += self.effect(scope)
        lines += self.breakpoint(scope)
        if rng.random() < 0.2:
            lines += self.breakpoint(scope)
        for _ in range(rng.choice((0, 1, 1, 2))):
            lines += self.effect(scope)
        if rng.random() < 0.4:
            lines += self.compute()
        return lines

    def compute(self) -> list[str]:
        return [self.rng.choice(("y = y * 1.5 + w", "y = torch.tanh(y) + x", "y = y - x * 0.5",
                                 "y = (y * w).relu() + 1.0", "y = y + w.sum(dim=0)"))]

    def pick_int(self, scope: Scope) -> str:
        return self.rng.choice(scope.ints) if scope.ints and self.rng.random() < 0.7 else str(self.rng.randrange(5))

    # ------------------------------------------------------------ break points

    def breakpoint(self, scope: Scope) -> list[str]:
        names, weights = zip(*BREAKS)
        kind = self.rng.choices(names, weights)[0]
        self.features["break " + kind] += 1
        return getattr(self, "break_" + kind)(self.next(), scope)

    def rc(self, scope: Scope | None = None) -> tuple[str, int]:
        """A row of x (a constant, or a loop counter in scope: then it changes between iterations) and a column."""
        if scope is not None and scope.ints and self.rng.random() < 0.4:
            return f"{self.rng.choice(scope.ints)} % 4", self.rng.randrange(3)
        return str(self.rng.randrange(4)), self.rng.randrange(3)

    def break_print_tensor(self, i: int, scope: Scope) -> list[str]:
        r, c = self.rc(scope)
        value = self.rng.choice((f"x[{r}] * 2", "(x > 0).sum()", f"x[{r}, {c}]", f"x.sign()[:, {c}]",
                                 f"x[{r}].abs().max()"))
        extra = f", {self.pick_int(scope)}" if self.rng.random() < 0.4 else ""
        return [f"print('p{i}', {value}{extra})"]

    def break_item_arith(self, i: int, scope: Scope) -> list[str]:
        r, c = self.rc(scope)
        read, use = self.rng.choice((
            (f"x.abs().max().item()", f"y = y * v{i}"),
            (f"x[{r}, {c}].item()", f"y = y + v{i}"),
            (f"x.abs().sum().item()", f"y = y + v{i} / 10"),
            (f"x[{r}].abs().mean().item()", f"y = y * (v{i} + 1.0)"),
            (f"x[{r}, {c}].item()", f"LOG.append(('v{i}', v{i} > 0, v{i} * 2))"),
            (f"x.abs().max().item()", f"D['v{i}'] = v{i}\ny = y + D['v{i}']"),
            (f"x[{r}, {c}].item()", f"OBJ.v{i} = v{i} * 3 + 1\ny = y - OBJ.v{i}"),
        ))
        return [f"v{i} = {read}"] + use.split("\n")

    def break_item_if(self, i: int, scope: Scope) -> list[str]:
        r, c = self.rc(scope)
        return [f"if x[{r}, {c}].item() > 0:", f"    y = y + {self.rng.choice((1, 2, 3))}",
                f"    LOG.append(('pos{i}', {self.pick_int(scope)}))", "else:", "    y = y * 0.5",
                f"    LOG.append(('neg{i}',))"]

    def break_tensor_if(self, i: int, scope: Scope) -> list[str]:
        r, c = self.rc(scope)
        condition = self.rng.choice(("x.abs().sum() > 21.0", f"x[{r}, {c}] > 0", f"(x[{r}] > 0).all()",
                                     f"x[{r}, {c}] < 0 and x.abs().max() > 0.25", f"not (x[:, {c}] > 0).any()"))
        lines = [f"if {condition}:", f"    y = y + x[{r}]", f"    LOG.append(('then{i}',))"]
        if self.rng.random() < 0.7:
            lines += ["else:", "    y = y - 1.0", f"    D['else{i}'] = D.get('else{i}', 0) + 1"]
        return lines

    def break_tensor_while(self, i: int, scope: Scope) -> list[str]:
        # a loop on a tensor whose values are exact (small integers): each test is a break
        return [f"c{i} = torch.zeros(())", f"while c{i} < {self.rng.choice((1.5, 2.5))}:", f"    c{i} = c{i} + 1",
                f"    y = y + c{i}", f"    LOG.append(('while{i}',))"]

    def break_tolist(self, i: int, scope: Scope) -> list[str]:
        r, c = self.rc(scope)
        return [f"vals{i} = x[{r}].tolist()", f"y = y + vals{i}[{c}]", f"LOG.append(('list{i}', len(vals{i})))"]

    def break_int_range(self, i: int, scope: Scope) -> list[str]:
        r, _ = self.rc()
        return [f"for m{i} in range(int((x[{r}] > 0).sum())):", f"    y = y + 0.5",
                f"    LOG.append(('count{i}', m{i}))"]

    def break_bool(self, i: int, scope: Scope) -> list[str]:
        r, c = self.rc(scope)
        return [f"flag{i} = bool(x[{r}, {c}] > 0)", f"LOG.append(('flag{i}', flag{i}))",
                f"y = y + (1.0 if flag{i} else -1.0)"]

    def break_masked(self, i: int, scope: Scope) -> list[str]:
        # a result whose shape depends on the data (a single instruction run in Python)
        r, c = self.rc(scope)
        return self.rng.choice(([f"pos{i} = x[x > 0]", f"y = y + pos{i}.sum()",
                                 f"LOG.append(('masked{i}', pos{i}.numel()))"],
                                [f"nz{i} = torch.nonzero(x[{r}] > 0)", f"LOG.append(('nonzero{i}', len(nz{i})))"]))

    def break_fstring(self, i: int, scope: Scope) -> list[str]:
        r, c = self.rc(scope)
        return [self.rng.choice((f"print(f'p{i} {{x[{r}, {c}]}} {{len(LOG)}}')",
                                 f"LOG.append(f'{{x[{r}, {c}] > 0}}')"))]

    def break_mid_expression(self, i: int, scope: Scope) -> list[str]:
        # values already on the stack (a bound method, len(LOG) read before the break) cross the break
        r, c = self.rc(scope)
        return [self.rng.choice((f"LOG.append((len(LOG), bool(x[{r}, {c}] > 0), D['n']))",
                                 f"y = y * 2 + x.abs().max().item() * w",
                                 f"D['m{i}'] = [len(LOG), x[{r}].tolist()[{c}] > 0, OBJ.count]",
                                 f"y = torch.cat([y, x * x[{r}, {c}].item()]).reshape(2, 4, 3).sum(0)"))]

    def break_clock(self, i: int, scope: Scope) -> list[str]:
        if self.rng.random() < 0.5:
            return ["time.perf_counter()", "y = y * 1.0"]  # its value discarded at once
        # the difference discarded: the first value is live across the second call's break, a float that differs on
        # every call (kiln specializes it: torch cannot make that arithmetic symbolic), so such a case may trace
        # again on every call, up to the recompile limit
        self.reads_clock = True
        return [f"t{i} = time.perf_counter()", "y = y * 1.0", f"_ = time.perf_counter() - t{i}"]

    def break_pid(self, i: int, scope: Scope) -> list[str]:
        return self.rng.choice(([f"if os.getpid() > 0:", "    y = y + 1.0"],
                                [f"pid{i} = os.getpid()", f"LOG.append(('pid{i}', pid{i} > 0))"]))

    def break_dynamo(self, i: int, scope: Scope) -> list[str]:
        return ["torch._dynamo.graph_break()"]

    def break_listcomp_item(self, i: int, scope: Scope) -> list[str]:
        _, c = self.rc()
        return self.rng.choice((
            [f"vals{i} = [x[k, {c}].item() for k in range(4)]", f"y = y + max(vals{i})"],
            [f"flags{i} = [bool(x[k, {c}] > 0) for k in range(4)]", f"LOG.append(('flags{i}', flags{i}))"],
        ))

    # ------------------------------------------------------------ side effects

    def effect(self, scope: Scope) -> list[str]:
        names, weights = zip(*EFFECTS)
        kind = self.rng.choices(names, weights)[0]
        self.features["effect " + kind] += 1
        return getattr(self, "effect_" + kind)(self.next(), scope)

    def effect_log(self, i: int, scope: Scope) -> list[str]:
        return [self.rng.choice((f"LOG.append(('e{i}', {self.pick_int(scope)}))", f"LOG.append('e{i}')",
                                 f"LOG.extend([{i}, len(LOG)])", f"LOG.append(('e{i}', D['n']))"))]

    def effect_dict(self, i: int, scope: Scope) -> list[str]:
        return [self.rng.choice((f"D['d{i}'] = D.get('d{i}', 0) + 1", "D['n'] += 1",
                                 f"D.setdefault('seen', []).append({self.pick_int(scope)})",
                                 f"D.pop('d{i - 1}', None)", f"D['d{i}'] = len(LOG)"))]

    def effect_attribute(self, i: int, scope: Scope) -> list[str]:
        return [self.rng.choice((f"OBJ.a{i} = getattr(OBJ, 'a{i}', 0) + 1", "OBJ.count += 1",
                                 f"OBJ.last = 'e{i}'", f"OBJ.last = {self.pick_int(scope)}",
                                 f"OBJ.flag = {self.rng.choice(('True', 'False', 'None'))}",
                                 f"OBJ.t{i} = x[{self.rng.randrange(4)}] * 2",
                                 f"OBJ.count = OBJ.count * 2 + {self.pick_int(scope)}"))]

    def effect_global(self, i: int, scope: Scope) -> list[str]:
        if self.rng.random() < 0.5:
            return ["GC = GC + 1"]
        self.globals.append(f"G{i}")
        return [f"G{i} = {self.pick_int(scope)} + GC"]

    def effect_inplace(self, i: int, scope: Scope) -> list[str]:
        line = self.rng.choice(("w.add_(1.0)", "w.mul_(2.0)", f"w[{self.rng.randrange(4)}].neg_()",
                                "w.clamp_(min=-1.0)"))
        return [line] + (["y = y + w"] if self.rng.random() < 0.5 else [])

    def effect_read(self, i: int, scope: Scope) -> list[str]:
        # state written earlier (maybe before a break) read back into the result
        return [self.rng.choice(("y = y + OBJ.count + GC + D['n']", "y = y + len(LOG) * 0.25 + len(ITEMS)",
                                 "y = y * (1.0 if OBJ.count % 2 else -1.0)", "y = y + w[0, 0]"))]

    def effect_list(self, i: int, scope: Scope) -> list[str]:
        return [self.rng.choice((f"ITEMS.append('i{i}')", "ITEMS.insert(0, ITEMS.pop())", f"ITEMS[0] = 'z{i}'",
                                 "ITEMS.reverse()"))]

    def effect_print(self, i: int, scope: Scope) -> list[str]:
        return [self.rng.choice((f"print('e{i}', {self.pick_int(scope)}, len(LOG))", f"print('e{i}', D['n'])",
                                 f"print(f'e{i} {{OBJ.count}}')", f"print('e{i}', sep='', end='|')"))]

    # ------------------------------------------------------------ places

    def place_for_range(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        inner = Scope(scope.ints + [f"k{i}"], scope.in_generator)
        body = self.body(depth, inner)
        control = self.rng.random()
        if control < 0.3:  # leaves the loop, or skips an iteration, on the sign of an element of x
            c = self.rng.randrange(3)
            word = self.rng.choice(("break", "continue"))
            check = [f"if x[k{i} % 4, {c}] < 0:", f"    LOG.append(('{word}{i}', k{i}))", f"    {word}"]
            body = check + body if self.rng.random() < 0.5 else body + check + self.compute()
        return [f"for k{i} in range({self.rng.choice((2, 2, 3))}):"] + indent(body)

    def place_for_list(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        if self.rng.random() < 0.5:
            return [f"for v{i} in [0.5, -1.0, 2.0][:{self.rng.choice((2, 3))}]:",
                    f"    y = y * v{i}"] + indent(self.body(depth, scope))
        return [f"for s{i} in ITEMS[:{self.rng.choice((2, 3))}]:", f"    LOG.append(('item', s{i}))"] + \
            indent(self.body(depth, scope))

    def place_while(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        inner = Scope(scope.ints + [f"n{i}"], scope.in_generator)
        return [f"n{i} = 0", f"while n{i} < {self.rng.choice((2, 2, 3))}:"] + indent(self.body(depth, inner)) + \
            [f"    n{i} += 1"]

    def place_with(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        return [f"with Ctx('c{i}'):"] + indent(self.body(depth, scope))

    def place_grad_mode(self, depth: int, scope: Scope) -> list[str]:
        # a grad-mode block: kiln resumes inside it (GradModeExit); what it reads shows the mode
        i = self.next()
        header = self.rng.choice(("with torch.no_grad():", "with torch.enable_grad():",
                                  "with torch.set_grad_enabled(False):"))
        return [header, f"    LOG.append(('grad{i}', torch.is_grad_enabled()))"] + indent(self.body(depth, scope)) + \
            [f"LOG.append(('grad{i} after', torch.is_grad_enabled()))"]

    def place_try(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        lines = ["try:"] + indent(self.body(depth, scope))
        if self.rng.random() < 0.5:
            lines += [f"    LOG.append(('raising{i}',))", "    D['missing']"]  # a KeyError, caught below
        return lines + ["except KeyError:", f"    LOG.append(('caught{i}',))", "finally:",
                        f"    LOG.append(('finally{i}',))"]

    def place_helper(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        body = self.body(depth, Scope())
        if self.rng.random() < 0.25:  # an early return on the sign of an element of x
            r, c = self.rc()
            body = [f"if x[{r}, {c}] > 0:", f"    LOG.append(('early{i}',))", "    return y * 2.0"] + body
        self.defs.append([f"def helper{i}(x, w, y):", "    __GLOBALS__"] + indent(body) + ["    return y"])
        return [self.rng.choice((f"y = helper{i}(x, w, y)", f"y = helper{i}(x, w=w, y=y)",
                                 f"y = helper{i}(*(x, w), **{{'y': y}})"))]

    def place_method(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        self.workers.append(f"WK{i}")
        self.defs.append([f"class Worker{i}:", "    def run(self, x, w, y):", "        __GLOBALS__",
                          "        self.calls = self.calls + 1"] + indent(self.body(depth, Scope()), 2) +
                         ["        self.last = y.shape[0]", "        return y", f"WK{i} = Worker{i}()"])
        return [f"y = WK{i}.run(x, w, y)"]

    def place_generator(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        inner = Scope([f"k{i}"], True)
        self.defs.append([f"def gen{i}(x, w, y):", "    __GLOBALS__",
                          f"    for k{i} in range({self.rng.choice((2, 3))}):",
                          f"        LOG.append(('gen{i}', k{i}))"] + indent(self.body(depth, inner), 2) +
                         ["        yield y", f"    LOG.append(('gen{i} done',))"])
        return [f"for y in gen{i}(x, w, y):", f"    LOG.append(('got{i}',))"]

    def place_generator_left_early(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        inner = Scope([f"k{i}"], True)
        if self.rng.random() < 0.5:
            loop = [f"    k{i} = 0", "    while True:"]
            step = [f"        k{i} += 1"]
        else:
            loop, step = [f"    for k{i} in range(5):"], []
        self.defs.append([f"def gen{i}(x, w, y):", "    __GLOBALS__"] + loop +
                         [f"        LOG.append(('gen{i}', k{i}))"] +
                         indent(self.body(depth, inner), 2) + ["        yield y"] + step)
        stop = self.rng.choice((0, 1, 2))
        return [f"for j{i}, out{i} in enumerate(gen{i}(x, w, y)):", f"    y = out{i}", f"    if j{i} == {stop}:",
                "        break", f"    LOG.append(('next{i}', j{i}))"]

    def place_listcomp(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        self.defs.append([f"def part{i}(x, w, y, k):", "    __GLOBALS__"] + indent(self.body(depth, Scope(["k"]))) +
                         ["    return y * (k + 1)"])
        count = self.rng.choice((2, 3))
        if self.rng.random() < 0.7:  # `y` goes in through the outermost iterable, evaluated in the frame
            lines = [f"parts{i} = [part{i}(x, w, base, k) for k, base in enumerate([y] * {count})]"]
        else:
            # on 3.11 a local the comprehension reads is a cell of the frame, and kiln runs a resume function that
            # assigns a cell (here after an earlier break) eagerly (docs/design/frontend.md)
            lines = [f"base{i} = y", f"parts{i} = [part{i}(x, w, base{i}, k) for k in range({count})]"]
        return lines + [f"y = parts{i}[-1] - parts{i}[0] * 0.5"]

    def place_closure(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        if self.rng.random() < 0.5:  # reads only the frame's arguments (x, w: cells made in the prologue)
            return [f"def inner{i}(y):", "    __GLOBALS__"] + indent(self.body(depth, Scope(list(scope.ints)))) + \
                ["    return y * 1.5", f"y = inner{i}(y)"]
        # a cell assigned in the body: after a break, kiln runs such a resume function eagerly (frontend.md)
        return [f"sc{i} = {self.rng.choice((0.5, 1.5, -1.0))}", f"def inner{i}(y):", "    __GLOBALS__"] + \
            indent(self.body(depth, Scope(list(scope.ints)))) + [f"    return y * sc{i}", f"y = inner{i}(y)"]

    def place_closure_nonlocal(self, depth: int, scope: Scope) -> list[str]:
        i = self.next()
        return [f"cnt{i} = 0", f"def inner{i}(y):", "    __GLOBALS__", f"    nonlocal cnt{i}"] + \
            indent(self.body(depth, Scope(list(scope.ints)))) + \
            [f"    cnt{i} += 1", f"    return y + cnt{i}", f"y = inner{i}(y)", f"y = inner{i}(y)",
             f"LOG.append(('cnt{i}', cnt{i}))"]

    # ------------------------------------------------------------ the source

    def source(self, seed: int, program: str) -> str:
        declare = "global " + ", ".join(dict.fromkeys(self.globals))
        reset = ["def reset():", "    " + declare, "    LOG.clear()", "    D.clear()", "    D['n'] = 0",
                 "    ITEMS[:] = ['a', 'b', 'c']", "    vars(OBJ).clear()", "    OBJ.count = 0"]
        reset += [f"    {name} = 0" for name in dict.fromkeys(self.globals)]
        reset += [f"    vars({name}).clear()\n    {name}.calls = 0" for name in self.workers]
        parts = [PRELUDE, f"SEED = {seed}"]
        parts += ["\n".join(lines) for lines in self.defs]
        parts += ["\n".join(reset), program]
        text = "\n".join(parts) + "\n"
        return text.replace("__GLOBALS__", declare)


def indent(lines: list[str], levels: int = 1) -> list[str]:
    return ["    " * levels + line for line in lines]


# (name, weight)
PLACES = (("for_range", 3), ("for_list", 2), ("while", 2), ("with", 0.7), ("grad_mode", 1), ("try", 0.7),
          ("helper", 3), ("method", 1.5), ("generator", 2), ("generator_left_early", 2), ("listcomp", 1),
          ("closure", 2), ("closure_nonlocal", 0.5))
BREAKS = (("print_tensor", 3), ("item_arith", 3), ("item_if", 2), ("tensor_if", 3), ("tensor_while", 1),
          ("tolist", 1), ("int_range", 1), ("bool", 1.5), ("clock", 1), ("pid", 1), ("dynamo", 0.5),
          ("listcomp_item", 0.6), ("masked", 0.7), ("fstring", 0.7), ("mid_expression", 1.5))
EFFECTS = (("log", 3), ("dict", 2), ("attribute", 2.5), ("global", 1.5), ("inplace", 1.5), ("print", 2),
           ("list", 1), ("read", 1.5))


@dataclass
class Case:
    index: int
    seed: int  # the case's own seed: its program and its arguments' values
    source: str
    reads_clock: bool
    features: collections.Counter
    workers: list[str]
    global_names: list[str]


def generate(count: int, seed: int) -> list[Case]:
    """`count` cases, the same for the same seed."""
    rng = random.Random(seed)
    cases = []
    for index in range(count):
        case_seed = rng.randrange(2 ** 31)
        builder = Builder(random.Random(case_seed))
        program = builder.program()
        cases.append(Case(index, case_seed, builder.source(case_seed, program), builder.reads_clock,
                          builder.features, builder.workers, list(dict.fromkeys(builder.globals))))
    return cases


def case_from_program(program: str, seed: int = 0, index: int = 0, global_names: tuple[str, ...] = ()) -> Case:
    """A case from a hand-written `def program(x, w): ...` (a minimized repro, a test's program), run as the
    generated ones are: the prelude's state (LOG, D, OBJ, ITEMS, GC) and `global_names` (set to 0 by `reset`)."""
    builder = Builder(random.Random(seed))
    builder.globals += [name for name in global_names if name not in builder.globals]
    return Case(index, seed, builder.source(seed, program.strip()), "time.perf_counter() - " in program,
                collections.Counter(), [], list(dict.fromkeys(builder.globals)))


# ---------------------------------------------------------------- running a case

# Four calls: (argument seed offset, scale). Calls 2 and 4 repeat the call before on fresh state.
CALLS = ((0, 1.0), (0, 1.0), (1, 4.0), (1, 4.0))


class _Channel:
    """sys.stdout during a call: each write kept with the length of the namespace's LOG at that moment."""

    def __init__(self, namespace: dict):
        self.namespace = namespace
        self.events: list[list] = []

    def write(self, text: str) -> int:
        position = len(self.namespace["LOG"])
        if self.events and self.events[-1][0] == position:  # print writes its pieces separately
            self.events[-1][1] += text
        else:
            self.events.append([position, text])
        return len(text)

    def flush(self) -> None:
        pass


@dataclass
class Call:
    result: object = None
    error: BaseException | None = None
    state: dict = field(default_factory=dict)  # name -> frozen value
    output: list = field(default_factory=list)
    identities: list = field(default_factory=list)


def _freeze(value, depth: int = 0):
    """A copy later calls cannot change: tensors cloned, containers and objects' attributes copied."""
    if depth > 10:
        return "<deep>"
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list):
        return [_freeze(item, depth + 1) for item in value]
    if isinstance(value, tuple):
        return tuple(_freeze(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return {key: _freeze(item, depth + 1) for key, item in value.items()}
    return value


def _identities(result, arguments: dict) -> list:
    """Which leaves of the result are the arguments themselves (`return y, w` returns w)."""
    leaves = result if isinstance(result, (tuple, list)) else list(result.values()) if isinstance(result, dict) \
        else [result]
    return [next((name for name, argument in arguments.items() if leaf is argument), None) for leaf in leaves]


def _call(namespace: dict, fn, case: Case, seed_offset: int, scale: float) -> Call:
    torch.set_grad_enabled(True)  # a call that left grad mode changed is reported, and must not change the next one
    namespace["reset"]()
    x, w = namespace["make_args"](case.seed + seed_offset, scale)
    channel = _Channel(namespace)
    call = Call()
    try:
        with contextlib.redirect_stdout(channel):
            call.result = fn(x, w)
    except Exception as error:  # compared with eager's
        call.error = error
    call.output = channel.events
    call.identities = _identities(call.result, {"x": x, "w": w}) if call.error is None else []
    state = {"result": call.result, "x after": x, "w after": w, "LOG": namespace["LOG"], "D": namespace["D"],
             "OBJ": dict(vars(namespace["OBJ"])), "ITEMS": namespace["ITEMS"],
             "grad mode after the call": torch.is_grad_enabled()}
    state.update({name: namespace[name] for name in case.global_names})
    state.update({name: dict(vars(namespace[name])) for name in case.workers})
    call.state = {name: _freeze(value) for name, value in state.items()}
    return call


def _skeleton(value):
    """Everything but the float values: types, lengths, dict keys in order, strings, ints and bools exactly,
    tensors' shapes and dtypes."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.requires_grad)
    if isinstance(value, float):
        return "float"
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_skeleton(item) for item in value])
    if isinstance(value, dict):
        return ("dict", [(key, _skeleton(item)) for key, item in value.items()])
    return value


def _numbers(value) -> list:
    """The float and tensor leaves, in order."""
    if isinstance(value, (torch.Tensor, float)):
        return [value]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _numbers(item)]
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _numbers(item)]
    return []


def _difference(got: Call, want: Call, reference: Call | None) -> str | None:
    """Why `got` (kiln) differs from `want` (eager), or None."""
    if got.output != want.output:
        return f"stdout differs (LOG length at each write, text):\n  kiln:  {got.output!r}\n  eager: {want.output!r}"
    if got.identities != want.identities:
        return f"result identity differs: kiln {got.identities}, eager {want.identities}"
    for name, wanted in want.state.items():
        actual = got.state.get(name)
        if _skeleton(actual) != _skeleton(wanted):
            return f"{name} differs{_where(actual, wanted)}:\n  kiln:  {_short(actual)}\n  eager: {_short(wanted)}"
        numbers, wanted_numbers = _numbers(actual), _numbers(wanted)
        reference_numbers = None
        if reference is not None and reference.error is None:
            candidate = _numbers(reference.state.get(name))
            if len(candidate) == len(wanted_numbers) and all(
                    isinstance(ref, torch.Tensor) == isinstance(item, torch.Tensor) and
                    (not isinstance(item, torch.Tensor) or ref.shape == item.shape)
                    for ref, item in zip(candidate, wanted_numbers)):
                reference_numbers = candidate
        verdict = compare(numbers, wanted_numbers, reference_numbers)
        if not verdict:
            return f"{name} differs: {verdict.message}\n  kiln:  {_short(actual)}\n  eager: {_short(wanted)}"
    return None


def _where(actual, wanted, path: str = "") -> str:
    """The first place where the skeletons of two values differ, as ' at [3][1]: kiln ..., eager ...'."""
    if isinstance(actual, (list, tuple)) and isinstance(wanted, (list, tuple)) and type(actual) is type(wanted):
        for index, (a, b) in enumerate(zip(actual, wanted)):
            if _skeleton(a) != _skeleton(b):
                return _where(a, b, f"{path}[{index}]")
        if len(actual) != len(wanted):
            return f" at {path or 'top'}: length {len(actual)}, eager {len(wanted)}"
    if isinstance(actual, dict) and isinstance(wanted, dict):
        if list(actual) != list(wanted):
            return f" at {path or 'top'}: keys {list(actual)}, eager {list(wanted)}"
        for key in wanted:
            if _skeleton(actual[key]) != _skeleton(wanted[key]):
                return _where(actual[key], wanted[key], f"{path}[{key!r}]")
    return f" at {path or 'top'}: kiln {_short(actual, 200)}, eager {_short(wanted, 200)}"


def _short(value, limit: int = 600) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."


@dataclass
class Outcome:
    case: Case
    status: str  # "pass", "wrong", "crash", "retraced", "eager"
    detail: str = ""
    eager_reasons: list[str] = field(default_factory=list)
    captures: list[int] = field(default_factory=list)  # frames traced by each call
    breaks: int = 0  # graph breaks made, all calls
    seconds: float = 0.0


class _Recorder(logging.Handler):
    """kiln's warnings during a case (recompile limits), kept instead of printed."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Timeout(f"the case ran past {CASE_TIMEOUT_S} s")


def run_case(case: Case, backend: str = "aot_eager") -> Outcome:
    """Run one case on the three sides; see the module docstring."""
    start = time.perf_counter()
    sides = []
    for rand_dtype in (torch.float32, torch.float32, torch.float64):
        namespace = {"__name__": f"kiln_break_fuzz_case_{case.index}", "RAND_DTYPE": rand_dtype}
        exec(compile(case.source, f"<kiln break fuzz case {case.index}>", "exec"), namespace)
        sides.append(namespace)
    compiled_side, eager_side, reference_side = sides
    # torch remembers, process-wide, the float symbols a trace had to specialize (TensorifyState), and later traces
    # then skip the restart that made kiln specialize them: clear it so a case runs the same alone or after others
    torch._dynamo.symbolic_convert.TensorifyState.clear()
    eager_reasons: list[str] = []
    captures: list[int] = []
    breaks = [0]

    def on_capture(_dispatcher, entry):
        if entry.eager_reason is not None:
            eager_reasons.append(entry.eager_reason)

    def on_break(_graph_break):
        breaks[0] += 1

    recorder = _Recorder()
    logger = logging.getLogger("kiln")
    frontend_dispatcher.capture_listeners.append(on_capture)
    frontend_dispatcher.break_listeners.append(on_break)
    logger.addHandler(recorder)
    previous_alarm = signal.signal(signal.SIGALRM, _on_alarm) if _can_alarm() else None
    if previous_alarm is not None:
        signal.alarm(CASE_TIMEOUT_S)
    status, detail = "pass", ""
    try:
        compiled = kiln.compile(compiled_side["program"], backend=backend)
        for number, (offset, scale) in enumerate(CALLS, 1):
            before = frontend_stats.captures
            try:
                got = _call(compiled_side, compiled, case, offset, scale)
            finally:
                captures.append(frontend_stats.captures - before)
            want = _call(eager_side, eager_side["program"], case, offset, scale)
            reference = _call(reference_side, reference_side["program"], case, offset, scale)
            step = f"call {number} (arguments make_args(SEED + {offset}, {scale}))"
            if want.error is not None:
                if got.error is None:
                    status, detail = "wrong", f"{step}: eager raised {want.error!r}, kiln did not"
                elif type(got.error) is not type(want.error):
                    status, detail = "crash", (f"{step}: kiln raised {type(got.error).__name__}, eager "
                                               f"{type(want.error).__name__}:\n" + _format(got.error))
                if status != "pass":
                    break
            elif got.error is not None:
                status, detail = "crash", f"{step}: kiln raised, eager did not:\n" + _format(got.error)
                break
            problem = _difference(got, want, reference)
            if problem is not None:
                status, detail = "wrong", f"{step}: {problem}"
                break
    except _Timeout as error:
        status, detail = "crash", str(error)
    finally:
        torch.set_grad_enabled(True)
        if previous_alarm is not None:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous_alarm)
        frontend_dispatcher.capture_listeners.remove(on_capture)
        frontend_dispatcher.break_listeners.remove(on_break)
        logger.removeHandler(recorder)
    eager_reasons += [message for message in recorder.messages if "recompile limit" in message]
    if status == "pass":
        retraced = [] if case.reads_clock else [number for number in (2, 4)
                                                if len(captures) >= number and captures[number - 1]]
        if retraced:
            status = "retraced"
            detail = (f"call(s) {retraced} traced again on the same state and arguments as the call before "
                      f"(frames traced per call: {captures})")
        elif eager_reasons:
            status = "eager"
    return Outcome(case, status, detail, eager_reasons, captures, breaks[0], time.perf_counter() - start)


def _can_alarm() -> bool:
    import threading

    return hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()


def _format(error: BaseException) -> str:
    return "".join(traceback.format_exception(error)[-8:])


def run(count: int, seed: int, backend: str = "aot_eager", progress: bool = False, first: int = 0) -> list[Outcome]:
    outcomes = []
    logger = logging.getLogger("kiln")
    propagate = logger.propagate
    logger.propagate = False  # kiln's warnings are counted (eager frames), not printed
    try:
        for case in generate(count, seed)[first:]:
            outcomes.append(run_case(case, backend))
            if progress and (case.index + 1) % 50 == 0:
                counts = collections.Counter(outcome.status for outcome in outcomes)
                print(f"{case.index + 1} cases: {dict(counts)}", file=sys.stderr, flush=True)
    finally:
        logger.propagate = propagate
    return outcomes


# ---------------------------------------------------------------- the report


def _reason_key(reason: str) -> str:
    """An eager reason without its line numbers and case numbers, to count alike reasons together."""
    import re

    first = reason.splitlines()[0]
    first = re.sub(r"<kiln break fuzz case \d+>:\d+", "<case>", first)
    first = re.sub(r"\b(helper|gen|part|inner|Worker|WK|cnt|sc|k|n|v|c|s|j|out|m|vals|flags|flag|t|pid|base|parts)"
                   r"\d+\b", r"\1N", first)
    first = re.sub(r"_resume_at_line_\d+", "_resume_at_line_N", first)
    first = re.sub(r"(changed from) [-\d.]+", r"\1 N", first)
    first = re.sub(r"__globals\d+", "__globalsN", first)
    return first[:220]


def summary(outcomes: list[Outcome], seed: int, backend: str, seconds: float, command: str | None = None) -> str:
    statuses = collections.Counter(outcome.status for outcome in outcomes)
    reasons = collections.Counter(_reason_key(reason) for outcome in outcomes
                                  for reason in dict.fromkeys(_reason_key(r) for r in outcome.eager_reasons))
    features = collections.Counter()
    for outcome in outcomes:
        features.update(set(outcome.case.features))
    command = command or (f"python -m tests.frontend.fuzz_breaks --cases {len(outcomes)} --seed {seed} "
                          f"--backend {backend}")
    lines = [f"# kiln graph-break fuzzer: {len(outcomes)} cases, seed {seed}, backend {backend}", "",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
             f"- python {platform.python_version()}, torch {torch.__version__}, {seconds:.0f} s",
             f"- kiln commit: {checkout_commit()}",
             f"- command: {command}", "",
             "| passed | wrong answers | crashes | retraced | ran a frame eagerly (correct) |",
             "| ---: | ---: | ---: | ---: | ---: |",
             f"| {statuses['pass']} | {statuses['wrong']} | {statuses['crash']} | {statuses['retraced']} | "
             f"{statuses['eager']} |", "",
             f"Calls: {4 * len(outcomes)} (4 per case: two on the same state and arguments, then two on others). "
             f"Frames traced: {sum(sum(outcome.captures) for outcome in outcomes)}; graph breaks made: "
             f"{sum(outcome.breaks for outcome in outcomes)}; cases with no break at all: "
             f"{sum(outcome.breaks == 0 for outcome in outcomes)}.", "",
             "Cases containing each ingredient: " + ", ".join(f"{name} {count}" for name, count in
                                                              sorted(features.items())), ""]
    if reasons:
        lines += ["## Frames run eagerly, by reason (cases)", ""]
        lines += [f"- {count}: {reason}" for reason, count in reasons.most_common()]
        lines.append("")
    failures = [outcome for outcome in outcomes if outcome.status in ("wrong", "crash", "retraced")]
    if failures:
        lines += ["## Failures", ""]
        for outcome in failures:
            lines += [f"### case {outcome.case.index}: {outcome.status}", "", "```", outcome.detail.strip(), "```", "",
                      "```python", outcome.case.source.strip(), "```", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="aot_eager", help="a rung of kiln's ladder: eager, aot_eager, kiln")
    parser.add_argument("--no-write", action="store_true", help="print the summary only")
    parser.add_argument("--show", type=int, default=None, metavar="INDEX", help="print one case's source and exit")
    options = parser.parse_args()
    if options.show is not None:
        print(generate(options.show + 1, options.seed)[options.show].source)
        return
    start = time.perf_counter()
    outcomes = run(options.cases, options.seed, options.backend, progress=True)
    text = summary(outcomes, options.seed, options.backend, time.perf_counter() - start)
    print(text)
    if not options.no_write:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / (f"{datetime.date.today().isoformat()}_break-fuzz_seed{options.seed}_"
                          f"{options.cases}cases_{options.backend}.md")
        path.write_text(text)
        print(f"written: {path}")
    if any(outcome.status in ("wrong", "crash", "retraced") for outcome in outcomes):
        sys.exit(1)


if __name__ == "__main__":
    main()
