"""What every kernel backend shares: text helpers both generators use, and the backend protocol.

- `LineBuffer`: generated lines at an indentation depth, with blocks that can be filled in later;
- `pointer_name`: a kernel's parameter name for a buffer (`ptr<k>`, in first-use order: nothing in a
  kernel's text names a buffer, so identical kernels share one compiled artifact);
- `kernel_ranges`: a scheduled kernel's loop variables (x<k> rows, r<k> columns) -> their extents;
- `reduction_identity`: which value a reduction's accumulator starts from, for a backend to spell;
- `KernelBackend`: what a backend implements. kiln/codegen/backends.py registers one per device
  type (docs/design/backends.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

from kiln.ir import Graph
from kiln.ir.indexing import index_var

# The identities of REDUCTION_KINDS (kiln/ir/nodes.py): "largest" is +inf for floats, the dtype's
# maximum for integers and True for bool; "smallest" is -inf, the minimum, False.
REDUCTION_IDENTITIES = {
    "sum": "zero", "welford": "zero", "any": "zero", "prod": "one", "all": "one",
    "min": "largest", "argmin": "largest", "max": "smallest", "argmax": "smallest",
}


def reduction_identity(kind: str) -> str:
    """The initial value of a `kind` reduction's accumulator: "zero", "one", "largest" or "smallest"."""
    return REDUCTION_IDENTITIES[kind]


def pointer_name(pointer_names: dict, buffer_name: str) -> str:
    """The kernel parameter for `buffer_name`, `ptr<k>` in first-use order, added to `pointer_names`."""
    if buffer_name not in pointer_names:
        pointer_names[buffer_name] = f"ptr{len(pointer_names)}"
    return pointer_names[buffer_name]


def kernel_ranges(kernel) -> dict:
    """{loop variable: extent} of a scheduled kernel: x<k> over its rows, r<k> over its columns."""
    ranges = {index_var("x", k): size for k, size in enumerate(kernel.row_ranges)}
    ranges.update({index_var("r", k): size for k, size in enumerate(kernel.col_ranges)})
    return ranges


@dataclass
class LineBuffer:
    """Lines of generated source, each indented by four spaces per level of `depth`."""

    lines: list = field(default_factory=list)  # text, or a nested block written later
    depth: int = 1

    def add(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def block(self) -> "LineBuffer":
        """A block at this point, at this depth, that can still be written after later lines."""
        nested = type(self)(depth=self.depth)
        self.lines.append(nested)
        return nested

    def flat(self) -> list:
        """Every line, nested blocks' in place."""
        return [line for item in self.lines for line in (item.flat() if isinstance(item, LineBuffer) else [item])]


@runtime_checkable
class KernelBackend(Protocol):
    """A kernel backend: the source half (kiln/codegen) paired with its loading half (kiln/runtime).

    A kernel source is the object `generate_kernel` returns. The wrapper and the loader read these
    of it: `name`, `buffer_args`, `size_args`, `skip`, `listing` (the text dumped for KILN_DEBUG),
    `file_suffix` (the dump's extension).
    """

    name: str  # how config and reports name it: "triton", "cpp"
    device_type: str

    def generate_kernel(self, kernel, graph: Graph):
        """The source of one scheduled kernel (kiln/ir/kernel.py) of `graph`."""

    def loop_dependent_ops(self) -> frozenset:
        """The LoopIR ops whose value for one element can depend on the loop that computes it
        (vectorized or not) on this backend. The scheduler computes a value built from them once,
        in one loop, rather than again in each consumer: two copies of it that differ by an ulp
        turn `x - mean(x)` of a single value into noise (fuzz seed 3009 #5079)."""

    def kernel_call(self, source, argument_sources: list, python_source: Callable) -> str:
        """The wrapper's line that runs `source` with these arguments (buffer names, then size
        expressions as Python); `python_source(expr)` spells a size expression for the wrapper."""

    def load_kernels(self, kernel_sources: list) -> dict:
        """{kernel name: callable} for one graph's kernel sources, compiled and loaded (kiln/runtime)."""

    def kernel_generated(self, source) -> None:
        """Told of each kernel source as the wrapper's generator makes it: a backend may start compiling it
        (Triton: kiln/runtime/loader.py `compile_early`)."""
