"""Guard and side-effect fuzzer for kiln's frontend: change ONE thing between two calls.

A case is a small program generated from ingredients chosen at random (seeded): each
ingredient adds setup code (a global int, set, dict, tensor, list, a closure cell, a helper
function with defaults, a module, a plain object, ...), a few lines of the program's body
that read it, and the changes that can be made to it between calls. The program always
has the signature `program(x, w, opts, seq, scale=1.5, *, shift=0.25)`, and the input
changes (dtype, shape, strides, storage aliasing, requires_grad, grad mode, inference mode,
autocast, the default dtype) apply to any
case. The case's source is executed twice, into two separate namespaces: one side
compiles `program` with `kiln.compile`, the other runs it eagerly. Both sides then run the
same sequence on their own state (and a third copy runs it in float64, the reference for
kiln.testing's rule):

    call; apply the change (the same statement, exec'd in each namespace); call; call again

and after every call the results and the side effects (argument tensors mutated in place,
globals the program stores, module parameters and buffers, lists it appends to) must agree
under kiln.testing's rule. An exception is accepted only if eager raised too. A case whose
compiled side ran eagerly (a frame kiln could not capture) still counts as correct, but is
counted apart: most cases must be compiled.

    python -m tests.frontend.fuzz_guards --cases 500 --seed 0 [--backend aot_eager]

writes a summary to tests/frontend/results/<date>_guard-fuzz_seed<S>_<N>cases.md (failures
with their generated source, so each is a ready repro). tests/frontend/test_guard_fuzz.py
runs a fixed-seed subset in CI.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import logging
import platform
import random
import sys
import textwrap
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

import kiln
from kiln.testing import compare

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Ingredient:
    """One piece of a generated program. `{i}` in any text is the ingredient's index in the case.

    setup: module-level code; closure: lines run in the factory that defines `program` (its
    names are closure cells of `program`); body: lines of `program` that update `y`; changes:
    statements (exec'd in the case's namespace) that change what the body reads; state: the
    names whose value after each call is compared with eager's (side effects).
    """

    name: str
    body: str
    changes: tuple[str, ...]
    setup: str = ""
    closure: str = ""
    state: tuple[str, ...] = ()
    mutates_w: bool = False  # writes to the argument `w` in place (then `w` must not require grad)


# Module-level code every case starts with: seeded values, helpers for changes.
PRELUDE = '''
import torch
G = torch.Generator().manual_seed(SEED)
RAND_DTYPE = globals().get("RAND_DTYPE", torch.float32)  # float64 in the reference run
def rand(*shape):
    return torch.randn(*shape, generator=G).to(RAND_DTYPE)
def linear():
    layer = torch.nn.Linear(3, 3, dtype=RAND_DTYPE)
    with torch.no_grad():
        layer.weight.copy_(rand(3, 3))
        layer.bias.copy_(rand(3))
    return layer
def cell(fn, name):
    return fn.__closure__[fn.__code__.co_freevars.index(name)]
ARGS = {"x": rand(4, 3), "w": rand(4, 3), "opts": {"a": 1.5, "b": -0.5}, "seq": [1.0, 2.0]}
GRAD = True
MODE = "plain"  # or "inference" (torch.inference_mode) or "autocast" (CPU autocast to bfloat16)
DEFAULT_DTYPE = torch.float32
'''

INGREDIENTS: tuple[Ingredient, ...] = (
    Ingredient("global int", "y = y * K{i}", ("K{i} = K{i} + 1", "K{i} = float(K{i})", "K{i} = True"),
               setup="K{i} = 2"),
    Ingredient("global float", "y = y + F{i}", ("F{i} = 1.25", "F{i} = -F{i}"), setup="F{i} = 0.5"),
    Ingredient("global bool", "if B{i}:\n    y = y.relu()\nelse:\n    y = y - 1", ("B{i} = not B{i}", "B{i} = 0"),
               setup="B{i} = True"),
    Ingredient("global set", "if 'a' in S{i}:\n    y = y * 2\nif len(S{i}) > 2:\n    y = y + 1",
               ("S{i}.add('c')", "S{i}.discard('a')", "S{i} = {'a'}", "S{i}.clear()"), setup="S{i} = {'a', 'b'}"),
    Ingredient("global dict", "y = y * D{i}['k']\nfor key in D{i}:\n    y = y + D{i}[key]",
               ("D{i}['k'] = 3.0", "D{i}['n'] = 1.0", "del D{i}['m']", "D{i} = {'k': 1.0}"),
               setup="D{i} = {'k': 2.0, 'm': 0.5}"),
    Ingredient("global tensor", "y = y + T{i}",
               ("T{i} = T{i}.double()", "T{i}.add_(1.0)", "T{i} = rand(4, 3)", "T{i} = rand(3, 4).t()",
                "T{i} = T{i}.expand(4, 3)", "T{i} = rand(3).requires_grad_()"),
               setup="T{i} = rand(3)"),
    Ingredient("global list", "for v in L{i}:\n    y = y + v\ny = y * len(L{i})",
               ("L{i}.append(3.0)", "L{i}[0] = -1.0", "L{i}.pop()", "L{i} = [L{i}[0], rand(3)]"),
               setup="L{i} = [1.0, 2.0]"),
    Ingredient("aliased containers", "if P{i} is Q{i}:\n    y = y * 2\ny = y + P{i}['k'] + Q{i}['k']",
               ("Q{i} = P{i}", "Q{i} = dict(P{i})", "P{i}['k'] = 4.0", "P{i} = Q{i}"),
               setup="P{i} = {'k': 1.0}\nQ{i} = {'k': 1.0}"),
    Ingredient("nested containers", "if 'on' in N{i}['cfg'][0]:\n    y = y * N{i}['cfg'][1]",
               ("N{i}['cfg'][0].discard('on')", "N{i}['cfg'][1] = 3.0", "N{i}['cfg'] = [{'on'}, -1.0]",
                "N{i}['cfg'][0].add('off')"),
               setup="N{i} = {'cfg': [{'on'}, 2.0]}"),
    Ingredient("closure cell", "y = y * c{i}",
               ("cell(program, 'c{i}').cell_contents = 2.5", "cell(program, 'c{i}').cell_contents = 3"),
               closure="c{i} = 1.5"),
    Ingredient("closure list", "y = y + cl{i}[-1] * len(cl{i})",
               ("cell(program, 'cl{i}').cell_contents.append(5.0)", "cell(program, 'cl{i}').cell_contents[-1] = 0.0",
                "cell(program, 'cl{i}').cell_contents = [4.0]"),
               closure="cl{i} = [1.0, 2.0]"),
    Ingredient("helper with defaults", "y = helper{i}(y)",
               ("helper{i}.__defaults__ = (3.0,)", "helper{i}.__code__ = (lambda t, k=2.0: t - k).__code__",
                "helper{i} = lambda t, k=2.0: t * -k", "helper{i}.__defaults__ = (2.0, 4.0)"),
               setup="def helper{i}(t, k=2.0):\n    return t * k"),
    Ingredient("helper with keyword default", "y = kwhelper{i}(y)",
               ("kwhelper{i}.__kwdefaults__ = {'k': -1.0}", "kwhelper{i}.__kwdefaults__['k'] = 5.0"),
               setup="def kwhelper{i}(t, *, k=2.0):\n    return t + k"),
    Ingredient("program defaults", "y = y * scale + shift",
               ("program.__defaults__ = (2.5,)", "program.__kwdefaults__ = {'shift': -1.0}",
                "program.__kwdefaults__['shift'] = 0.75"),),
    Ingredient("global function", "y = act{i}(y)",
               ("act{i} = torch.tanh", "act{i} = lambda t: t * 3", "act{i} = torch.nn.functional.gelu"),
               setup="act{i} = torch.relu"),
    Ingredient("module", "y = M{i}(y)",
               ("M{i}.eval()", "M{i}.lin = linear()", "M{i}.lin.weight = torch.nn.Parameter(rand(3, 3))",
                "with torch.no_grad():\n    M{i}.lin.weight.add_(1.0)", "M{i}.scale = 3.0",
                "M{i}.norm = torch.nn.Identity()", "M{i}.lin.register_forward_hook(lambda m, i, o: o * 2)",
                "M{i}.lin.bias.requires_grad_(False)", "M{i}.use_norm = False", "M{i}.forward = lambda t: t * 7",
                "M{i}.train(False)\nM{i}.norm.train()", "M{i}.norm.eval()", "M{i}.norm.momentum = 0.5"),
               setup=textwrap.dedent('''\
                   class Net{i}(torch.nn.Module):
                       def __init__(self):
                           super().__init__()
                           self.lin = linear()
                           self.norm = torch.nn.BatchNorm1d(3)
                           self.scale = 2.0
                           self.use_norm = True
                       def forward(self, t):
                           t = self.lin(t) * self.scale
                           if self.use_norm:
                               t = self.norm(t)
                           return t
                   M{i} = Net{i}()'''),
               state=("M{i}",)),
    Ingredient("method and class attribute", "y = H{i}.scale(y)",
               ("Helper{i}.factor = 3.0", "Helper{i}.scale = lambda self, t: t - self.factor", "H{i}.factor = -1.0",
                "H{i}.__class__ = type('Other{i}', (Helper{i},), {'factor': 5.0})",
                "Helper{i}.scale.__defaults__ = (4.0,)"),
               setup="class Helper{i}:\n    factor = 2.0\n    def scale(self, t, bias=0.0):\n"
                     "        return t * self.factor + bias\nH{i} = Helper{i}()"),
    Ingredient("module container", "y = SEQ{i}(y)",
               ("SEQ{i}.append(torch.nn.Tanh())", "SEQ{i}[1] = torch.nn.Sigmoid()", "del SEQ{i}[1]",
                "SEQ{i}[0].bias = None"),
               setup="SEQ{i} = torch.nn.Sequential(linear(), torch.nn.ReLU())", state=("SEQ{i}",)),
    Ingredient("mutated global tensor", "MT{i}.add_(1.0)\ny = y + x",
               ("ARGS['x'] = MT{i}", "ARGS['x'] = MT{i}[:, :]", "MT{i} = rand(4, 3)", "MT{i} = ARGS['x']"),
               setup="MT{i} = rand(4, 3)", state=("MT{i}", "ARGS")),
    Ingredient("tensor attribute", "y = y + HD{i}.t",
               ("HD{i}.t = rand(3).double()", "HD{i}.t = 2.0", "HD{i}.t.mul_(0.0)", "HD{i}.t = rand(1)"),
               setup="class Holder{i}:\n    pass\nHD{i} = Holder{i}()\nHD{i}.t = rand(3)"),
    Ingredient("tuple and string globals", "y = y + TP{i}[1]\nif MODE{i} == 'sum':\n    y = y + 1",
               ("TP{i} = (1.0, 5.0)", "TP{i} = (1.0, 2.0, 3.0)", "MODE{i} = 'max'", "TP{i} = [1.0, 2.0]"),
               setup="TP{i} = (1.0, 2.0)\nMODE{i} = 'sum'"),
    Ingredient("bytearray global", "y = y + len(BA{i})\nif BA{i}[0] == 97:\n    y = y * 2",
               ("BA{i}.append(99)", "BA{i}[0] = 98", "BA{i} = bytearray(b'b')"), setup="BA{i} = bytearray(b'ab')"),
    Ingredient("dict of tensors", "y = y + TD{i}['a']",
               ("TD{i}['a'] = rand(3).double()", "TD{i}['b'] = rand(3)", "TD{i}['a'] = rand(4, 1)",
                "TD{i} = {'a': 1.0}"),
               setup="TD{i} = {'a': rand(3)}"),
    Ingredient("signed zero", "y = y * torch.full((3,), Z{i}).reciprocal().clamp(-1.0, 1.0)",
               ("Z{i} = -0.0", "Z{i} = 0"), setup="Z{i} = 0.0"),
    Ingredient("dtype global", "y = y.to(DT{i}) * 3.0",
               ("DT{i} = torch.float64", "DT{i} = torch.bfloat16"), setup="DT{i} = torch.float32"),
    Ingredient("property", "y = y * P{i}.alpha",
               ("P{i}._alpha = 3.0", "Prop{i}.alpha = property(lambda self: -self._alpha)",
                "Prop{i}.alpha = 4.0"),
               setup="class Prop{i}:\n    def __init__(self):\n        self._alpha = 2.0\n"
                     "    @property\n    def alpha(self):\n        return self._alpha\nP{i} = Prop{i}()"),
    Ingredient("builtin", "y = y * abs(-2) + len(seq)",
               ("abs = lambda value: 10", "len = lambda value: -1", "import builtins\nabs = builtins.abs")),
    Ingredient("creates a tensor", "y = y + torch.ones(3) * 0.5", ("DEFAULT_DTYPE = torch.float64",)),
    Ingredient("grad mode read", "if torch.is_grad_enabled():\n    y = y * 2", ("GRAD = not GRAD",)),
    Ingredient("object attributes", "y = y * O{i}.alpha\nif 'x' in O{i}.tags:\n    y = y + 1",
               ("O{i}.alpha = 0.5", "O{i}.tags.remove('x')", "O{i}.tags = []", "O{i}.alpha = 2"),
               setup="class Cfg{i}:\n    pass\nO{i} = Cfg{i}()\nO{i}.alpha = 2.0\nO{i}.tags = ['x']"),
    Ingredient("mutated argument", "w.mul_(2.0)\ny = y + x",
               ("ARGS['w'] = ARGS['x']", "buffer = rand(5, 3)\nARGS['x'], ARGS['w'] = buffer[:4], buffer[1:]",
                "buffer = rand(4, 6)\nARGS['x'], ARGS['w'] = buffer[:, :3], buffer[:, 3:]",
                "ARGS['x'] = ARGS['w'].view(4, 3)"),
               state=("ARGS",), mutates_w=True),
    Ingredient("appends to a global list", "LOG{i}.append(len(LOG{i}))\ny = y + len(LOG{i})",
               ("LOG{i}.clear()", "LOG{i}.extend([7, 8])"), setup="LOG{i} = []", state=("LOG{i}",)),
    Ingredient("stores a global", "global COUNT{i}\nCOUNT{i} = COUNT{i} + 1\ny = y + COUNT{i}",
               ("COUNT{i} = 10", "COUNT{i} = 0.5"), setup="COUNT{i} = 0", state=("COUNT{i}",)),
    Ingredient("dict argument", "y = y * opts['a']\nif 'c' in opts:\n    y = y - opts['c']",
               ("ARGS['opts'] = dict(ARGS['opts'], c=1.0)", "ARGS['opts']['a'] = 3.0", "del ARGS['opts']['b']",
                "ARGS['opts'] = {'c': 2.0, 'a': 1.0}")),
    Ingredient("forwarding module", "y = FW{i}(y) * FW{i}.gain",
               ("FW{i}.model.gain = 3.0", "FW{i}.gain = -1.0", "del FW{i}.model.gain", "FW{i}.model = linear()",
                "FW{i}.model.weight = torch.nn.Parameter(rand(3, 3))"),
               setup=textwrap.dedent('''\
                   class Forward{i}(torch.nn.Module):  # forwards unknown names to the model it wraps (PEFT's shape)
                       def __init__(self, model):
                           super().__init__()
                           self.model = model
                       def __getattr__(self, name):
                           try:
                               return super().__getattr__(name)
                           except AttributeError:
                               if name == "model":
                                   raise
                               return getattr(self.model, name, 0.5)
                       def forward(self, t):
                           return t @ self.weight.T + self.bias
                   FW{i} = Forward{i}(linear())
                   FW{i}.model.gain = 2.0'''),
               state=("FW{i}",)),
    Ingredient("hook with kwargs", "y = HK{i}(y)",
               ("HANDLE{i}.remove()", "HK{i}.register_forward_pre_hook(lambda m, a, k: ((a[0] - 1,), k), "
                "with_kwargs=True)", "HK{i}.register_forward_pre_hook(lambda m, a: (a[0] * 3,))",
                "HK{i}.register_full_backward_hook(lambda m, gi, go: None)"),
               setup="HK{i} = linear()\nHANDLE{i} = HK{i}.register_forward_pre_hook("
                     "lambda m, a, k: ((a[0] * 2,), k), with_kwargs=True)",
               state=("HK{i}",)),
    # the branch reads the input, not a computed value: a sum that cancels to ~0 (after a batch norm) would take
    # whichever side its rounding gives, in eager as in kiln
    Ingredient("graph break", "if x.sum() > 0:\n    y = y + 1\nelse:\n    y = y - 1\ny = y * BK{i}",
               ("ARGS['x'] = -ARGS['x']", "BK{i} = 3.0", "ARGS['x'] = ARGS['x'] + 100.0"), setup="BK{i} = 2.0"),
    Ingredient("generator with side effects", "for v in gen{i}(y, 3):\n    y = y + v",
               ("GS{i} = 2.0", "GLOG{i}.clear()", "GLOG{i} = [9]"),
               setup="GLOG{i} = []\nGS{i} = 1.0\ndef gen{i}(t, n):\n    for k in range(n):\n"
                     "        GLOG{i}.append(k)\n        yield t * (k + GS{i})",
               state=("GLOG{i}",)),
    Ingredient("endless generator left early", "for k, v in enumerate(ggen{i}(y)):\n    if k == STOP{i}:\n"
               "        break\n    y = y + v",
               ("STOP{i} = 1", "STOP{i} = 4", "GLOG2{i}.clear()"),
               setup="GLOG2{i} = []\nSTOP{i} = 2\ndef ggen{i}(t):\n    k = 0\n    while True:\n"
                     "        GLOG2{i}.append(k)\n        yield t * k\n        k += 1",
               state=("GLOG2{i}",)),
    Ingredient("user context manager", "with CTX{i} as k{i}:\n    y = y * k{i}",
               ("CTX{i}.k = -1.0", "EV{i}.clear()", "CTX{i} = Ctx{i}()", "Ctx{i}.__exit__ = lambda self, *e: "
                "EV{i}.append('other')"),
               setup="EV{i} = []\nclass Ctx{i}:\n    def __init__(self):\n        self.k = 2.0\n"
                     "    def __enter__(self):\n        EV{i}.append('in')\n        return self.k\n"
                     "    def __exit__(self, *exc):\n        EV{i}.append('out')\n        return False\nCTX{i} = Ctx{i}()",
               state=("EV{i}",)),
    Ingredient("caught KeyError", "try:\n    y = y * TRY{i}['k']\nexcept KeyError:\n    y = y + 1",
               ("TRY{i}['k'] = 3.0", "TRY{i} = {'k': -2.0}", "TRY{i}['j'] = 1.0"), setup="TRY{i} = {}"),
    Ingredient("NamedTuple global", "y = y * NTV{i}.a + NTV{i}.b",
               ("NTV{i} = NTV{i}._replace(a=3.0)", "NTV{i} = NTT{i}(1.0, -1.0)", "NTV{i} = (5.0, 1.0)"),
               setup="import typing\nclass NTT{i}(typing.NamedTuple):\n    a: float\n    b: float = 1.0\n"
                     "NTV{i} = NTT{i}(2.0)"),
    Ingredient("enum global", "if COL{i} is Color{i}.RED:\n    y = y * 2\nelse:\n    y = y * COL{i}.value",
               ("COL{i} = Color{i}.BLUE", "COL{i} = 1"),
               setup="import enum\nclass Color{i}(enum.Enum):\n    RED = 1\n    BLUE = 3\nCOL{i} = Color{i}.RED"),
    Ingredient("lru_cache helper", "y = y * cached{i}(KC{i})",
               ("KC{i} = 3", "cached{i}.cache_clear()", "CALLS{i}.clear()"),
               setup="import functools\nCALLS{i} = []\nKC{i} = 2\n@functools.lru_cache\ndef cached{i}(n):\n"
                     "    CALLS{i}.append(n)\n    return n * 2.0",
               state=("CALLS{i}",)),
    Ingredient("getattr fallback object", "y = y * FB{i}.factor",
               ("FB{i}.factor = 4.0", "Fall{i}.factor = -2.0", "Fall{i}.__getattr__ = lambda self, name: 3.0"),
               setup="class Fall{i}:\n    def __getattr__(self, name):\n        return 1.5\nFB{i} = Fall{i}()"),
    Ingredient("partial global", "y = PF{i}(y)",
               ("PF{i} = functools.partial(torch.add, other=1.0)", "PF{i}.keywords['other'] = 5.0"),
               setup="import functools\nPF{i} = functools.partial(torch.mul, other=2.0)"),
    Ingredient("mutates an object's attribute", "CNT{i}.n = CNT{i}.n + 1\ny = y + CNT{i}.n",
               ("CNT{i}.n = 10", "CNT{i}.n = 0.5", "CNT{i} = Counter{i}()\nCNT{i}.n = 3\nCNTD{i} = CNT{i}.__dict__"),
               setup="class Counter{i}:\n    pass\nCNT{i} = Counter{i}()\nCNT{i}.n = 0\nCNTD{i} = CNT{i}.__dict__",
               state=("CNTD{i}",)),
    Ingredient("nonlocal counter", "nonlocal nc{i}\nnc{i} += 1\ny = y + nc{i}",
               ("cell(program, 'nc{i}').cell_contents = 10", "cell(program, 'nc{i}').cell_contents = 0.5"),
               closure="nc{i} = 0"),
    Ingredient("list argument", "for v in seq:\n    y = y + v",
               ("ARGS['seq'].append(4.0)", "ARGS['seq'] = ARGS['seq'][:1]", "ARGS['seq'][0] = rand(3)",
                "ARGS['seq'] = tuple(ARGS['seq'])")),
)

# Changes every case can take: the input tensor, grad mode, or nothing but new values.
INPUT_CHANGES: tuple[str, ...] = (
    "ARGS['x'] = ARGS['x'].double()", "ARGS['x'] = rand(6, 3)", "ARGS['x'] = rand(3, 4).t()",
    "ARGS['x'] = rand(4, 3).requires_grad_()", "GRAD = not GRAD", "ARGS['x'] = rand(4, 3)",
    "ARGS['x'] = ARGS['x'].half()", "ARGS['x'] = rand(4, 6)[:, ::2]", "ARGS['w'] = rand(4, 3).requires_grad_()",
    "MODE = 'inference'", "MODE = 'autocast'", "DEFAULT_DTYPE = torch.float64",
)


@dataclass
class Case:
    """A generated program and the one change made between its calls."""

    index: int
    ingredients: list[tuple[int, Ingredient]]
    change: str
    change_of: str  # the ingredient's name, or "input"

    def source(self, seed: int) -> str:
        setup = [PRELUDE.replace("SEED", str(seed))]
        closure, body = [], ["y = x * 1.0"]
        for index, ingredient in self.ingredients:
            if ingredient.setup:
                setup.append(ingredient.setup.replace("{i}", str(index)))
            if ingredient.closure:
                closure.append(ingredient.closure.replace("{i}", str(index)))
            body.extend(ingredient.body.replace("{i}", str(index)).splitlines())
        body.append("return y")
        lines = ["def make_program():"] + ["    " + line for line in closure]
        lines.append("    def program(x, w, opts, seq, scale=1.5, *, shift=0.25):")
        lines += ["        " + line for line in body]
        lines += ["    return program", "program = make_program()"]
        return "\n".join(setup) + "\n" + "\n".join(lines) + "\n"

    def state_names(self) -> list[str]:
        names = ["ARGS"]
        for index, ingredient in self.ingredients:
            names += [name.replace("{i}", str(index)) for name in ingredient.state]
        return list(dict.fromkeys(names))


def generate(count: int, seed: int) -> list[Case]:
    """`count` cases, the same for the same seed."""
    rng = random.Random(seed)
    cases = []
    for index in range(count):
        chosen = rng.sample(range(len(INGREDIENTS)), rng.randint(1, 4))
        ingredients = [(position, INGREDIENTS[choice]) for position, choice in enumerate(chosen)]
        options = [(change.replace("{i}", str(position)), ingredient.name)
                   for position, ingredient in ingredients for change in ingredient.changes]
        if rng.random() < 0.3 or not options:
            mutates = any(ingredient.mutates_w for _, ingredient in ingredients)
            inputs = [change for change in INPUT_CHANGES if not (mutates and "ARGS['w']" in change)]
            change, change_of = rng.choice(inputs), "input"
        else:
            change, change_of = rng.choice(options)
        cases.append(Case(index, ingredients, change, change_of))
    return cases


@dataclass
class Outcome:
    case: Case
    status: str  # "pass", "wrong", "crash"
    compiled: bool  # every call ran a compiled entry (no eager fallback)
    entries: int
    detail: str = ""
    fallback_reasons: list[str] = field(default_factory=list)
    both_raised: int = 0  # calls where eager raised and so did kiln (the same program error)


def _call(namespace: dict, fn) -> tuple[object, BaseException | None]:
    """Call `fn` on the namespace's arguments, in its grad mode, mode and default dtype."""
    args = namespace["ARGS"]
    mode = {"plain": contextlib.nullcontext(), "inference": torch.inference_mode(),
            "autocast": torch.autocast("cpu", dtype=torch.bfloat16)}[namespace["MODE"]]
    previous_dtype = torch.get_default_dtype()
    try:
        torch.set_default_dtype(namespace["DEFAULT_DTYPE"])
        with torch.set_grad_enabled(namespace["GRAD"]), mode:
            return fn(args["x"], args["w"], args["opts"], args["seq"]), None
    except Exception as error:  # compared with eager's behaviour below
        return None, error
    finally:
        torch.set_default_dtype(previous_dtype)


def _state(namespace: dict, names: list[str]) -> list:
    """The values a call may have changed, as comparable leaves."""
    leaves = []
    for name in names:
        value = namespace.get(name)
        if isinstance(value, torch.nn.Module):
            leaves.append(dict(value.state_dict()))
        elif name == "ARGS":
            leaves.append([value["x"], value["w"], dict(value["opts"]), list(value["seq"])])
        else:
            leaves.append(value)
    return leaves


def _agree(actual, eager, reference=None) -> str | None:
    """None when `actual` matches `eager` (kiln.testing's rule against the float64 `reference`,
    or eager's own result when there is none; plus requires_grad), else why not."""
    verdict = compare(actual, eager, reference)
    if not verdict and not compare(_float64_as_float32(actual), _float64_as_float32(eager),
                                   _float64_as_float32(reference)):
        return verdict.message
    if isinstance(actual, torch.Tensor) and isinstance(eager, torch.Tensor) and \
            actual.requires_grad != eager.requires_grad:
        return f"requires_grad {actual.requires_grad}, eager {eager.requires_grad}"
    return None


def checkout_commit() -> str:
    """The checkout's commit, with '+changes' when the worktree differs from it."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return head + ("+changes" if dirty else "")


def _leaves(value) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value, key=str) for leaf in _leaves(value[key])]
    return [value]


def _same_structure(reference, eager) -> bool:
    """Whether the reference run's value can serve as the reference for eager's (same leaves)."""
    pairs = list(zip(_leaves(reference), _leaves(eager)))
    return len(pairs) == len(_leaves(eager)) == len(_leaves(reference)) and all(
        isinstance(ref, torch.Tensor) == isinstance(want, torch.Tensor) and
        (not isinstance(want, torch.Tensor) or ref.shape == want.shape) for ref, want in pairs)


def _to_float64(namespace: dict) -> None:
    """The reference run's state in float64: modules, tensors, tensors in containers and objects, and float32
    dtype globals (its `rand` already makes float64 values). Without a reference (it raised, or its result has
    another structure), a result is held to eager's own rounding: seed 45's case 30 normalized identical rows,
    where kiln's exact 0 failed against eager's -3.7e-06 because `y.to(DT2)` made the reference raise."""
    def convert(value):
        if value is torch.float32:  # a dtype global the program casts to (`y.to(DT)`): float64 there too, or
            return torch.float64  # the cast would feed float32 to the float64 modules and leave no reference
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
            return value.detach().double().requires_grad_(value.requires_grad)
        if isinstance(value, torch.nn.Module):
            return value.double()
        if isinstance(value, list):
            value[:] = [convert(item) for item in value]
        elif isinstance(value, dict):
            value.update({key: convert(item) for key, item in value.items()})
        elif type(value).__module__ == namespace["__name__"] and hasattr(value, "__dict__") \
                and not isinstance(value, type):
            vars(value).update({key: convert(item) for key, item in vars(value).items()})
        return value

    for name, value in list(namespace.items()):
        if not name.startswith("__"):
            namespace[name] = convert(value)


def _float64_as_float32(value):
    """float64 tensors as float32: a case's values start in float32, and a float32 result promoted
    to float64 later (a float64 global added to it) carries float32 rounding that eager and kiln
    may do differently, so float64 results are held to float32 precision (a guard that failed to
    fire gives errors far larger)."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype == torch.float64 else value
    if isinstance(value, (list, tuple)):
        return [_float64_as_float32(item) for item in value]
    if isinstance(value, dict):
        return {key: _float64_as_float32(item) for key, item in value.items()}
    return value


def run_case(case: Case, seed: int, backend: str) -> Outcome:
    """Run one case on both sides; see the module docstring."""
    source = case.source(seed)
    sides = []
    for rand_dtype in (torch.float32, torch.float32, torch.float64):
        namespace = {"__name__": f"kiln_fuzz_case_{case.index}", "RAND_DTYPE": rand_dtype}
        exec(compile(source, f"<kiln fuzz case {case.index}>", "exec"), namespace)
        sides.append(namespace)
    compiled_side, eager_side, reference_side = sides
    _to_float64(reference_side)
    compiled = kiln.compile(compiled_side["program"], backend=backend)
    steps = ["first call", f"after change: {case.change!r}", "third call"]
    both_raised = 0
    for step_index, step in enumerate(steps):
        if step_index == 1:
            for namespace in sides:
                exec(case.change, namespace)
        got, got_error = _call(compiled_side, compiled)
        want, want_error = _call(eager_side, eager_side["program"])
        reference, reference_error = _call(reference_side, reference_side["program"])
        if reference_error is not None or not _same_structure(reference, want):
            reference = None
        if want_error is not None:
            if got_error is None:
                return _outcome(case, compiled, "wrong", f"{step}: eager raised {want_error!r}, kiln did not")
            both_raised += 1
            continue  # both raised: the same program error on both sides
        if got_error is not None:
            text = "".join(traceback.format_exception(got_error)[-6:])
            return _outcome(case, compiled, "crash", f"{step}: kiln raised, eager did not:\n{text}")
        problem = _agree(got, want, reference)
        if problem is None:
            state, eager_state = _state(compiled_side, case.state_names()), _state(eager_side, case.state_names())
            reference_state = _state(reference_side, case.state_names())
            problem = _agree(state, eager_state, reference_state if _same_structure(reference_state, eager_state)
                             else None)
            if problem is not None:
                problem = "side effects differ: " + problem
        if problem is not None:
            return _outcome(case, compiled, "wrong", f"{step}: {problem}")
    return _outcome(case, compiled, "pass", both_raised=both_raised)


def _outcome(case: Case, compiled, status: str, detail: str = "", both_raised: int = 0) -> Outcome:
    entries = compiled.entries
    reasons = [entry.eager_reason for entry in entries if entry.eager_reason is not None]
    if compiled._cache.over_limit:
        reasons.append("recompile limit")
    return Outcome(case, status, not reasons and bool(entries), len(entries), detail, reasons, both_raised)


def run(count: int, seed: int, backend: str = "aot_eager", progress: bool = False) -> list[Outcome]:
    outcomes = []
    logger = logging.getLogger("kiln")
    level = logger.level
    logger.setLevel(logging.ERROR)  # eager-fallback warnings are counted, not printed
    try:
        for case in generate(count, seed):
            outcomes.append(run_case(case, seed, backend))
            if progress and (case.index + 1) % 50 == 0:
                print(f"{case.index + 1} cases", file=sys.stderr)
    finally:
        logger.setLevel(level)
    return outcomes


def summary(outcomes: list[Outcome], seed: int, backend: str, seconds: float) -> str:
    """A Markdown report: counts, fallbacks by reason, and every failure with its source."""
    statuses = collections.Counter(outcome.status for outcome in outcomes)
    compiled = sum(outcome.compiled for outcome in outcomes)
    reasons = collections.Counter(reason.splitlines()[0][:160] for outcome in outcomes
                                  for reason in dict.fromkeys(outcome.fallback_reasons))
    changes = collections.Counter(outcome.case.change_of for outcome in outcomes)
    lines = [f"# kiln guard fuzzer: {len(outcomes)} cases, seed {seed}, backend {backend}", "",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
             f"- python {platform.python_version()}, torch {torch.__version__}, {seconds:.0f} s",
             f"- kiln commit: {checkout_commit()}",
             f"- command: python -m tests.frontend.fuzz_guards --cases {len(outcomes)} --seed {seed} "
             f"--backend {backend}", "",
             f"| passed | wrong answers | crashes | compiled (no fallback) | fell back to eager |",
             "| ---: | ---: | ---: | ---: | ---: |",
             f"| {statuses['pass']} | {statuses['wrong']} | {statuses['crash']} | {compiled} | "
             f"{len(outcomes) - compiled} |", "",
             f"Calls: {3 * len(outcomes)}, of which {sum(outcome.both_raised for outcome in outcomes)} raised the "
             "same program error in eager and kiln (a change can make the program invalid, e.g. a float64 input "
             "to a float32 module). Entries made: "
             f"{sum(outcome.entries for outcome in outcomes)} ({len(outcomes)} first compiles, the rest recompiles).",
             "",
             "Changes made, by what they changed: " + ", ".join(f"{name} {count}" for name, count in
                                                                 sorted(changes.items())), ""]
    if reasons:
        lines += ["## Fallbacks to eager, by reason (cases)", ""]
        lines += [f"- {count}: {reason}" for reason, count in reasons.most_common()]
        lines.append("")
    failures = [outcome for outcome in outcomes if outcome.status != "pass"]
    if failures:
        lines += ["## Failures", ""]
        for outcome in failures:
            lines += [f"### case {outcome.case.index}: {outcome.status}", "", "```", outcome.detail.strip(), "```",
                      "", "```python", outcome.case.source(seed).strip(), f"# change: {outcome.case.change}", "```",
                      ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="aot_eager", help="a rung of kiln's ladder: eager, aot_eager, kiln")
    parser.add_argument("--no-write", action="store_true", help="print the summary only")
    options = parser.parse_args()
    start = time.perf_counter()
    outcomes = run(options.cases, options.seed, options.backend, progress=True)
    text = summary(outcomes, options.seed, options.backend, time.perf_counter() - start)
    print(text)
    if not options.no_write:
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / (f"{datetime.date.today().isoformat()}_guard-fuzz_seed{options.seed}_"
                          f"{options.cases}cases_{options.backend}.md")
        path.write_text(text)
        print(f"written: {path}")
    if any(outcome.status != "pass" for outcome in outcomes):
        sys.exit(1)


if __name__ == "__main__":
    main()
