"""A fuzz program as data: its inputs, its statements and its outputs, printable as Python.

A `Program` is what the generator makes, the runner runs and the minimizer shrinks. It is
plain data (picklable, so it crosses to worker processes) and prints as a runnable
repro: a `make_inputs(device)` function that builds the inputs from fixed seeds (with
their layouts: transposed, stepped, expanded, channels_last, offset) and a `program(...)`
function, one statement per line, that kiln compiles.
"""
from __future__ import annotations

import linecache
import math
from dataclasses import dataclass, replace

import torch

DTYPE_NAMES = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.float64: "float64", torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}
DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}

LAYOUTS = ("contiguous", "transposed", "permuted", "stepped", "expanded", "channels_last", "offset")


def shape_text(shape) -> str:
    """`(3, 4)`, `(3,)` or `()`: a shape as Python source."""
    shape = tuple(shape)
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


@dataclass(frozen=True)
class InputSpec:
    """How one input tensor is built: values from a seed, then a layout around them.

    values: "randn" (normal times `scale`, a fraction `nonfinite` of nan/+inf/-inf),
    "randint" (uniform in [low, high)), "bool" (True with probability one half), and for
    hand-written regressions "uniform" (in [0, scale)), "arange" (low, low + 1, ...) and
    "full" (every element `scale`).
    layout: see LAYOUTS; `layout_arg` is the layout's detail (the swapped or permuted
    dims, the stepped dim and its step, the expanded dims, the storage offset).
    """

    name: str
    shape: tuple
    dtype: str
    values: str = "randn"
    scale: float = 1.0
    low: int = 0
    high: int = 1
    nonfinite: float = 0.0
    layout: str = "contiguous"
    layout_arg: tuple = ()
    seed: int = 0

    def base_shape(self) -> tuple:
        """The shape of the contiguous tensor that the layout is made from."""
        shape = list(self.shape)
        if self.layout == "transposed":
            first, second = self.layout_arg
            shape[first], shape[second] = shape[second], shape[first]
        elif self.layout == "permuted":
            shape = [self.shape[dim] for dim in self.layout_arg]
        elif self.layout == "stepped":
            dim, start, step = self.layout_arg
            shape[dim] = start + shape[dim] * step
        elif self.layout == "expanded":
            leading, dims = self.layout_arg
            shape = [1 if dim in dims else size for dim, size in enumerate(shape)][leading:]
        elif self.layout == "offset":
            (offset,) = self.layout_arg
            shape = [offset + math.prod(shape)]
        return tuple(shape)

    def layout_source(self) -> str:
        """The method calls that turn the base tensor into this input's layout."""
        if self.layout == "transposed":
            return ".transpose({}, {})".format(*self.layout_arg)
        if self.layout == "permuted":
            inverse = [self.layout_arg.index(dim) for dim in range(len(self.shape))]
            return f".permute{shape_text(inverse)}"
        if self.layout == "stepped":
            dim, start, step = self.layout_arg
            return "[" + ":, " * dim + f"{start}::{step}]"
        if self.layout == "expanded":
            return f".expand{shape_text(self.shape)}"
        if self.layout == "channels_last":
            return ".contiguous(memory_format=torch.channels_last)"
        if self.layout == "offset":
            (offset,) = self.layout_arg
            return f"[{offset}:].view{shape_text(self.shape)}"
        return ""

    def source_lines(self) -> list[str]:
        base = shape_text(self.base_shape())
        generator = f"torch.Generator().manual_seed({self.seed})"
        if self.values == "randint":
            lines = [f"{self.name} = torch.randint({self.low}, {self.high}, {base}, generator={generator})"]
        elif self.values == "bool":
            lines = [f"{self.name} = torch.rand({base}, generator={generator}) < 0.5"]
        elif self.values == "uniform":
            lines = [f"{self.name} = torch.rand({base}, generator={generator}) * {self.scale!r}"]
        elif self.values == "arange":
            lines = [f"{self.name} = torch.arange({self.low}, {self.low + math.prod(self.base_shape())})"
                     f".reshape({base})"]
        elif self.values == "full":
            lines = [f"{self.name} = torch.full({base}, {self.scale!r})"]
        else:
            lines = [f"g = {generator}", f"{self.name} = torch.randn({base}, generator=g) * {self.scale!r}"]
            if self.nonfinite:
                lines += [f"special = torch.tensor([float('nan'), float('inf'), float('-inf')])"
                          f"[torch.randint(0, 3, {base}, generator=g)]",
                          f"{self.name} = torch.where(torch.rand({base}, generator=g) < {self.nonfinite!r}, "
                          f"special, {self.name})"]
        lines.append(f"{self.name} = {self.name}.to(device=device, dtype=torch.{self.dtype}){self.layout_source()}")
        return lines


@dataclass(frozen=True)
class Statement:
    """`target = expr`, with the shape and dtype the generator expects `target` to have."""

    target: str
    expr: str
    shape: tuple = ()
    dtype: str = ""
    family: str = ""  # the generator's op family (for coverage counts)

    def source(self) -> str:
        return f"{self.target} = {self.expr}"


@dataclass(frozen=True)
class Program:
    """One random program: named by `(seed, index)` when the generator made it."""

    seed: int
    index: int
    inputs: tuple
    statements: tuple
    outputs: tuple
    note: str = ""   # free text (regression programs: what they exercise)
    label: str = ""  # a hand-written program's name (generated ones are named by seed and index)

    @property
    def name(self) -> str:
        return self.label or f"seed{self.seed}_prog{self.index}"

    def input_names(self) -> list[str]:
        return [spec.name for spec in self.inputs]

    def function_source(self) -> str:
        lines = [f"def program({', '.join(self.input_names())}):"]
        lines += ["    " + statement.source() for statement in self.statements]
        outputs = ", ".join(self.outputs) + ("," if len(self.outputs) == 1 else "")
        lines.append(f"    return ({outputs})")
        return "\n".join(lines) + "\n"

    def inputs_source(self) -> str:
        lines = ["def make_inputs(device='cpu'):"]
        for spec in self.inputs:
            lines += ["    " + line for line in spec.source_lines()]
        lines.append(f"    return [{', '.join(self.input_names())}]")
        return "\n".join(lines) + "\n"

    def source(self) -> str:
        """The program and its inputs as a module's text (what `load` executes)."""
        header = "import torch\nimport torch.nn.functional as F\n\n"
        return header + self.inputs_source() + "\n\n" + self.function_source()

    def repro_source(self, backend: str = "cpp", device: str = "cpu") -> str:
        """A standalone script that compares kiln with eager on this program."""
        interpret = "1" if device == "cpu" else "0"
        return (f"# {self.name}{': ' + self.note if self.note else ''}\n"
                f"import os\nos.environ.setdefault('TRITON_INTERPRET', '{interpret}')\n"
                + self.source() +
                f"\n\nif __name__ == '__main__':\n"
                f"    import kiln\n"
                f"    kiln.config.cpu_backend = {backend!r}\n"
                f"    inputs = make_inputs({device!r})\n"
                f"    expected = program(*inputs)\n"
                f"    actual = kiln.compile(program)(*inputs)\n"
                f"    reference = program(*kiln.testing.to_float64(inputs))\n"
                f"    print(kiln.testing.compare(list(actual), list(expected), list(reference)))\n"
                f"    for got, want in zip(actual, expected):\n"
                f"        print('kiln ', got)\n"
                f"        print('eager', want)\n")

    def load(self):
        """(make_inputs, program): the two functions, compiled from `source()`.

        The text is registered with linecache so that tracebacks (and kiln's messages)
        show the program's lines.
        """
        source = self.source()
        filename = f"<fuzz {self.name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        namespace: dict = {}
        exec(compile(source, filename, "exec"), namespace)
        return namespace["make_inputs"], namespace["program"]

    def with_changes(self, **changes) -> "Program":
        return replace(self, **changes)
