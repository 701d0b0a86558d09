"""C++ kernels from scheduled LoopIR kernels: the CPU backend.

One scheduled `Kernel` (the same object the Triton backend gets) becomes one C++
function `extern "C" int kiln_kernel(pointers..., sizes...)` compiled into its own
shared library by kiln/runtime/cpp_build.py.

Loop structure:
- pointwise kernels: one loop per row dim, nested in the kernel's walk order (its output's
  memory order: kiln/schedule/loop_order.py); the innermost (the contiguous one) is `#pragma omp simd`, the outer ones are shared out over OpenMP
  threads (`parallel for collapse`) when the kernel is large enough;
- reduction kernels: the row loops run in parallel; inside a row, nodes run in order:
  a "reduction" node accumulates into LANES vector lanes (an array the compiler keeps
  in vector registers) over the column loops, then merges the lanes; consecutive
  "full" nodes share one simd column loop; a "row" node is straight-line code.
  Persistent and looped reductions are the same loops here.
A body's SSA values become C++ locals, emitted on demand from the stores, in the
innermost scope where they are needed. Values stored inside the kernel are read back
from that local (row values) or a per-thread row scratch array (column values read
by a later loop), never from memory they were not written to.

Semantics follow triton.py and torch: fp16/bf16 values are held as float (loaded
exactly, rounded to nearest even by `to_dtype` and on store); max/min propagate NaN;
argmax/argmin pick the first index; integer ops wrap (-fwrapv) and divide like
Python; index math is int64; masked loads read nothing outside the mask; gathered
positions are checked by their `check_index` op (the kernel returns 1 and the wrapper
raises IndexError).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar

import sympy
import torch

from kiln.codegen.common import LineBuffer, kernel_ranges, pointer_name, reduction_identity
from kiln.codegen.cpp_prelude import PRELUDE
from kiln.codegen.printing import expr_to_source
from kiln.config import config
from kiln.ir import Graph
from kiln.ir.indexing import contiguous_strides, index_var, simplify_index
from kiln.ir.nodes import EXPENSIVE_OPS, dtype_name, indirect_value
from kiln.ir.ops import OPS, cpp_variants
from kiln.runtime.cpp_build import KERNEL_SYMBOL, KernelSignature, compile_kernels, toolchain
from kiln.ir.kernel import Kernel, loop_variables, var_map

LANES = 16  # vector accumulator lanes of a reduction (one AVX-512 register of float)
SUM_BLOCK = 16 * LANES  # columns a floating sum adds up in fresh lanes before compensating (_compensated_sum)

VALUE_TYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "float", torch.bfloat16: "float",
    torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int32_t", torch.int64: "int64_t",
    torch.uint8: "uint8_t", torch.bool: "bool",
}
STORAGE_TYPES = {**VALUE_TYPES, torch.float16: "_Float16", torch.bfloat16: "uint16_t"}
LOW_PRECISION_ROUND = {torch.bfloat16: "kiln_round_bf16", torch.float16: "kiln_round_f16"}

# The pointwise ops' renderings are kiln/ir/ops.py's `cpp` column. Its `vector_math` ops call glibc's
# libm in a scalar loop and its vector libmvec in an `omp simd` loop (cpp_prelude's KILN_VECTOR_MATH
# declarations). The two round differently: atan2f differed in 9 of 16 values. exp, sigmoid and
# normal_cdf are kiln's own inline code, the same in both.
VECTOR_MATH_OPS = frozenset(name for name, row in OPS.items() if row.vector_math)


def math_expression(name: str, dtype: torch.dtype, args: list) -> str:
    """A unary or binary op's C++ expression: the op table's first variant that applies to the result
    dtype (kiln/ir/ops.py). An fp16/bf16 result is rounded to its format unless the op is exact."""
    row, expression = OPS[name], None
    for variant in cpp_variants(dtype):
        template = row.cpp.get(variant)
        if template is not None:
            expression = template.format(*args, T=VALUE_TYPES[dtype], D=dtype_name(dtype))
            break
    if expression is None:
        raise NotImplementedError(f"C++ codegen for op {name} giving {dtype}: ops.py has no rendering")
    if dtype in LOW_PRECISION_ROUND and not row.exact:
        expression = f"{LOW_PRECISION_ROUND[dtype]}({expression})"
    return expression


def loop_dependent_ops() -> frozenset:
    """VECTOR_MATH_OPS where kernels are built with libmvec (the toolchain found it), else none."""
    return VECTOR_MATH_OPS if toolchain().vector_math else frozenset()


# How one reduction kind folds a value into an accumulator (also how two lanes merge).
COMBINE = {
    "sum": "({0} + {1})", "prod": "({0} * {1})", "max": "kiln_maximum<{T}>({0}, {1})",
    "min": "kiln_minimum<{T}>({0}, {1})", "any": "({0} | ({1} != 0))", "all": "({0} & ({1} != 0))",
}


@dataclass
class CppKernelSource:
    """A generated C++ kernel and how the wrapper calls it.

    `source` names no buffer and no kernel, so identical kernels (a model's repeated
    layers) share one compiled library; `listing` adds a header naming them, for dumps.
    """

    name: str
    source: str
    buffer_args: list  # buffer names, in parameter order (passed as data pointers)
    size_args: list  # sympy expressions passed as int64
    signature: KernelSignature
    checks_bounds: bool  # the kernel returns 1 when a gathered index was out of range (check_index)
    skip: bool = False  # empty iteration space: allocate only, never call
    device_type: str = "cpu"
    listing: str = ""
    file_suffix: ClassVar[str] = ".cpp"  # of the KILN_DEBUG dump

    def launch(self, argument_sources: list) -> str:
        """The wrapper's line that calls this kernel with raw pointers and int sizes."""
        pointers = [f"{name}.data_ptr()" for name in argument_sources[:len(self.buffer_args)]]
        call = f"{self.name}({', '.join(pointers + argument_sources[len(self.buffer_args):])})"
        if self.checks_bounds:
            return f"if {call}: raise_index_error({'kernel ' + self.name!r})"
        return call


def _identity(kind: str, dtype: torch.dtype) -> str:
    """The C++ initial value of a reduction's accumulator."""
    value_type = VALUE_TYPES[dtype]
    identity = reduction_identity(kind)
    if identity in ("zero", "one"):
        return f"({value_type}){0 if identity == 'zero' else 1}"
    largest = identity == "largest"
    if dtype.is_floating_point:
        return f"{'' if largest else '-'}std::numeric_limits<{value_type}>::infinity()"
    if dtype == torch.bool:
        return "true" if largest else "false"
    return f"std::numeric_limits<{value_type}>::{'max' if largest else 'lowest'}()"


def constant_source(value, dtype: torch.dtype) -> str:
    """A C++ literal of `dtype` (fp16/bf16 constants rounded to their precision first)."""
    if isinstance(value, sympy.Basic):
        value = int(value) if value.is_Integer else float(value)
    value_type = VALUE_TYPES[dtype]
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        if dtype in LOW_PRECISION_ROUND:
            value = torch.tensor(value, dtype=dtype).item()
        if math.isnan(value):
            return f"std::numeric_limits<{value_type}>::quiet_NaN()"
        if math.isinf(value):
            return f"{'' if value > 0 else '-'}std::numeric_limits<{value_type}>::infinity()"
        return f"({value_type}){value.hex()}"
    value = int(value)
    if value == -2**63:
        return "std::numeric_limits<int64_t>::min()"
    return f"({value_type}){value}LL"


class _Scope:
    """C++ locals visible at one loop depth: SSA values and buffer values kept in registers.

    `variables` are the loop variables this scope's loops bind; `preheader`, when set, is the
    block just before those loops (in the enclosing scope) where values that do not depend on
    them are defined instead, once per enclosing iteration (set only where the loops run at
    least once: a hoisted load must not run when the loop would not have)."""

    def __init__(self, variables=(), preheader: "_Lines | None" = None):
        self.values: dict = {}  # (node position, op index) -> C++ name
        self.buffers: dict = {}  # buffer name -> C++ name holding the value stored in this scope
        self.variables = set(variables)
        self.preheader = preheader


class _Lines(LineBuffer):
    """C++ lines: a LineBuffer whose blocks open and close with braces."""

    def open(self, text: str) -> None:
        self.add(f"{text} {{" if text else "{")
        self.depth += 1

    def close(self) -> None:
        self.depth -= 1
        self.add("}")


class CppKernelGenerator:
    """Writes one kernel's C++ function (see the module docstring for the loop structure)."""

    def __init__(self, kernel: Kernel, graph: Graph):
        self.kernel, self.graph = kernel, graph
        self.pointer_names: dict[str, str] = {}  # buffer name -> parameter name
        self.stored: set = set()  # buffers written to memory (their pointers are not const)
        self.size_symbols: set = set()
        self.local_symbols: set = set()  # names of C++ locals used inside index expressions
        self.conversions = 0  # stored values converted to their buffer's dtype (numbers their locals)
        self.out = _Lines()
        self.scopes: list[_Scope] = []
        # (node position, op index) -> its level (_level) under the open scopes; reset when they change
        self.levels: dict = {}
        self._position: int | None = None  # the node whose ops are being emitted (for `ind<k>` symbols)
        self.mappings = [var_map(node, role, kernel.row_ranges, kernel.col_ranges)
                         for node, role in zip(kernel.nodes, kernel.roles)]
        # per node, per op: the loop variables its value depends on (schedule/passes.py annotates them)
        self.loop_variables = kernel.op_loop_variables or loop_variables(kernel)
        self.written = {name for node in kernel.nodes for name in node.outputs}  # loads of these stay in place
        self.groups = self._groups()
        self.scratch = self._scratch_buffers()
        self.gathers = any(op.name == "check_index" for node in kernel.nodes for op in node.body.ops)
        # (reduction position, op index) -> row array it is saved to; (position, op index) -> array it is read from
        self.reuse_saves: dict = {}
        self.reuse_loads: dict = {}
        if kernel.is_reduction and kernel.persistent:
            self._reused_values()

    # ---- set-up -------------------------------------------------------------------------
    def _groups(self) -> list:
        """(role, node positions): consecutive "full" nodes share one column loop."""
        groups: list = []
        for position, role in enumerate(self.kernel.roles):
            if role == "full" and groups and groups[-1][0] == "full":
                groups[-1][1].append(position)
            else:
                groups.append((role, [position]))
        return groups

    def _scratch_buffers(self) -> dict:
        """Local buffers stored by one column loop and read by another: buffer -> scratch array."""
        if not self.kernel.is_reduction:
            return {}
        group_of = {position: number for number, (_, positions) in enumerate(self.groups) for position in positions}
        producer_group = {}
        for position, (node, role) in enumerate(zip(self.kernel.nodes, self.kernel.roles)):
            if role == "full":
                for name in node.outputs:
                    if name in self.kernel.local_buffers:
                        producer_group[name] = group_of[position]
        scratch = {}
        for position, node in enumerate(self.kernel.nodes):
            for op in node.body.reads():
                if op.buffer in producer_group and producer_group[op.buffer] != group_of[position]:
                    scratch.setdefault(op.buffer, f"scratch_{len(scratch)}")
        return scratch

    def _value_keys(self, position: int) -> list:
        """Per op of node `position`: (structural key in kernel variables, expensive?), or None.

        Two values with one key compute the same thing at the same row and column.
        """
        node = self.kernel.nodes[position]
        keys: list = []
        for op in node.body.ops:
            operands = [keys[operand] for operand in op.operands]
            if op.name in ("store", "reduce", "getitem") or any(key is None for key in operands):
                keys.append(None)
                continue
            mapped = None
            if op.name == "load":
                if self._is_gather(op):
                    keys.append(None)
                    continue
                index = [sympy.sympify(expr).xreplace(self.mappings[position]) for expr in op.index]
                layout = self.graph.buffers[op.buffer].layout
                mapped = (op.buffer, str(simplify_index(sympy.expand(layout.offset_of(index)), self._ranges())))
            elif op.name == "index_expr":
                mapped = str(simplify_index(sympy.sympify(op.attr).xreplace(self.mappings[position]), self._ranges()))
            key = (op.name, op.dtype, repr(op.attr) if mapped is None else mapped,
                   tuple(operand[0] for operand in operands))
            keys.append((key, op.name in EXPENSIVE_OPS or any(operand[1] for operand in operands)))
        return keys

    def _reused_values(self) -> None:
        """Expensive column values a reduction computes and a later loop recomputes (softmax's
        exp(x - max), summed, then divided): the reduction saves them in a per-thread row array
        and the later loop reads them back instead of computing them twice."""
        computed: dict = {}  # key -> (reduction position, op index) computing it before its reduce
        for position, (node, role) in enumerate(zip(self.kernel.nodes, self.kernel.roles)):
            keys = self._value_keys(position)
            if role == "full" and computed:
                visited: set = set()

                def visit(op_index: int) -> None:
                    if op_index in visited:
                        return
                    visited.add(op_index)
                    entry = keys[op_index]
                    if entry is not None and entry[1] and entry[0] in computed:
                        source = computed[entry[0]]
                        if source not in self.reuse_saves:
                            self.reuse_saves[source] = f"reuse_{len(self.reuse_saves)}"
                        self.reuse_loads[(position, op_index)] = self.reuse_saves[source]
                        return
                    for operand in node.body.ops[op_index].operands:
                        visit(operand)

                for op_index, op in enumerate(node.body.ops):
                    if op.name == "store":
                        visit(op_index)
            if role == "reduction":
                reduce_index = next(k for k, op in enumerate(node.body.ops) if op.name == "reduce")
                for op_index in range(reduce_index):
                    if keys[op_index] is not None and keys[op_index][1]:
                        computed.setdefault(keys[op_index][0], (position, op_index))

    @staticmethod
    def _is_gather(op) -> bool:
        return any(indirect_value(symbol) is not None for expr in op.index
                   for symbol in sympy.sympify(expr).free_symbols)

    # ---- text helpers -------------------------------------------------------------------
    def index(self, expr) -> str:
        """C++ int64 source of an index expression over kernel variables and sizes."""
        expr = sympy.sympify(expr)
        for symbol in expr.free_symbols:
            name = str(symbol)
            is_loop_var = name[0] in "xr" and name[1:].isdigit()
            if indirect_value(symbol) is None and not is_loop_var and name not in self.local_symbols:
                self.size_symbols.add(symbol)
        return expr_to_source(expr, rename=self._rename, language="cpp")

    def _rename(self, symbol):
        value = indirect_value(symbol)
        return None if value is None else self.value(self._position, value)

    def pointer(self, buffer_name: str) -> str:
        return pointer_name(self.pointer_names, buffer_name)

    def _ranges(self) -> dict:
        return kernel_ranges(self.kernel)

    def _column_flat_index(self) -> str:
        columns = self.kernel.col_ranges
        strides = contiguous_strides(columns)
        return self.index(sum((index_var("r", k) * stride for k, stride in enumerate(strides)), sympy.Integer(0)))

    # ---- scopes and values --------------------------------------------------------------
    def lookup(self, key, kind: str = "values"):
        for scope in reversed(self.scopes):
            found = getattr(scope, kind).get(key)
            if found is not None:
                return found
        return None

    def value(self, position: int, op_index: int) -> str:
        """The C++ name of SSA value %op_index of node `position`, emitted here if not in scope."""
        found = self.lookup((position, op_index))
        if found is None and (position, op_index) in self.reuse_loads:
            array = self.reuse_loads[(position, op_index)]
            found = self.define(f"n{position}_{op_index}", self.kernel.nodes[position].body.ops[op_index].dtype,
                                f"{array}[{self._column_flat_index()}]")
            self.scopes[-1].values[(position, op_index)] = found
        elif found is None:
            target = self._target_scope(self._level(position, op_index, self.levels))
            saved = self._position, self.out
            self._position = position
            if target < len(self.scopes) - 1:
                self.out = self.scopes[target + 1].preheader
            try:
                found = self._emit_op(position, op_index)
            finally:
                self._position, self.out = saved
            self.scopes[target].values[(position, op_index)] = found
        return found

    def _target_scope(self, level: int) -> int:
        """The scope a value of `level` is defined in: its own, unless a loop in between may not run."""
        target = len(self.scopes) - 1
        while target > level and self.scopes[target].preheader is not None:
            target -= 1
        return target

    def _level(self, position: int, op_index: int, memo: dict) -> int:
        """The outermost open scope where value %op_index of node `position` can be computed:
        the innermost scope binding a loop variable it depends on (loop-invariant code motion; the
        variables are the kernel's `op_loop_variables`). Values read from this kernel's own stores,
        row arrays and reused values stay innermost, and so do the values computed from them."""
        key = (position, op_index)
        if key in memo:
            return memo[key]
        innermost = len(self.scopes) - 1
        for level, scope in enumerate(self.scopes):
            if key in scope.values:
                memo[key] = level
                return level
        op = self.kernel.nodes[position].body.ops[op_index]
        level = 0
        if op.name in ("reduce", "store") or key in self.reuse_loads:
            level = innermost
        elif op.name == "load" and (op.buffer in self.written or op.buffer in self.scratch):
            found = [depth for depth, scope in enumerate(self.scopes) if op.buffer in scope.buffers]
            level = found[-1] if found and not op.operands else innermost
        else:
            level = self._variables_level(self.loop_variables[position][op_index])
            for operand in op.operands + self._gathered(op):
                level = max(level, self._level(position, operand, memo))
        memo[key] = min(level, innermost)
        return memo[key]

    def _variables_level(self, names) -> int:
        """The innermost scope binding one of the loop variables `names`, 0 when none is bound (the
        innermost when a loop variable is not bound: an outer column loop's)."""
        level = 0
        for name in names:
            bound = [depth for depth, scope in enumerate(self.scopes) if name in scope.variables]
            level = max(level, bound[-1] if bound else len(self.scopes) - 1)
        return level

    @staticmethod
    def _gathered(op) -> tuple:
        """The values whose `ind<k>` symbols a load's index or an index_expr uses."""
        expressions = list(op.index or ()) if op.name == "load" else [op.attr] if op.name == "index_expr" else []
        return tuple(value for expr in expressions for symbol in sympy.sympify(expr).free_symbols
                     if (value := indirect_value(symbol)) is not None)

    def define(self, name: str, dtype: torch.dtype, expression: str) -> str:
        self.out.add(f"{VALUE_TYPES[dtype]} {name} = {expression};")
        return name

    # ---- ops --------------------------------------------------------------------------
    def _emit_op(self, position: int, op_index: int) -> str:
        node = self.kernel.nodes[position]
        op = node.body.ops[op_index]
        name = f"n{position}_{op_index}"
        if op.name == "load":
            return self._load(position, op, name)
        if op.name == "getitem":
            return f"{self.value(position, op.operands[0])}_{op.attr}"
        if op.name == "reduce":
            raise AssertionError(f"{node.name}: a reduce is emitted by its loop, not on demand")
        if op.name == "constant":
            return self.define(name, op.dtype, constant_source(op.attr, op.dtype))
        if op.name == "check_index":
            return self._check_index(position, op, name)
        if op.name == "index_expr":
            expression = simplify_index(sympy.sympify(op.attr).xreplace(self.mappings[position]), self._ranges())
            return self.define(name, op.dtype, f"static_cast<{VALUE_TYPES[op.dtype]}>({self.index(expression)})")
        args = [self.value(position, operand) for operand in op.operands]
        value_type = VALUE_TYPES[op.dtype]
        if op.name == "to_dtype":
            source_dtype = node.body.ops[op.operands[0]].dtype
            return self.define(name, op.dtype, self._convert(args[0], source_dtype, op.dtype))
        if op.name == "where":
            expression = f"({args[0]} ? ({value_type}){args[1]} : ({value_type}){args[2]})"
        elif op.name in OPS:
            expression = math_expression(op.name, op.dtype, args)
        else:
            raise NotImplementedError(f"C++ codegen for op {op.name}")
        return self.define(name, op.dtype, expression)

    @staticmethod
    def _convert(value: str, source: torch.dtype, target: torch.dtype) -> str:
        if target == source:
            return value
        if target == torch.bool:
            return f"({value} != 0)"
        if target in LOW_PRECISION_ROUND:
            return f"{LOW_PRECISION_ROUND[target]}((float){value})"
        return f"static_cast<{VALUE_TYPES[target]}>({value})"

    def _offset(self, position: int, op) -> str:
        """The storage offset of a load or store (gathered positions were checked by check_index)."""
        layout = self.graph.buffers[op.buffer].layout
        index = [sympy.sympify(expr).xreplace(self.mappings[position]) for expr in op.index]
        offset = simplify_index(sympy.expand(layout.offset_of(index)), self._ranges())
        return self.index(offset)

    def _check_index(self, position: int, op, name: str) -> str:
        """check_index: an out-of-range position sets the kernel's status (the wrapper raises
        IndexError) and reads 0 instead. No branch and no atomic: the loop stays a simd loop
        (kiln_status is an OpenMP `|` reduction). Like any value, it is defined in the outermost
        scope its operand allows: an embedding's row index is checked once per row, not per column."""
        value = self.value(position, op.operands[0])
        size = self.index(op.attr)
        self.out.add(f"bool {name}_outside = {value} < 0 || {value} >= {size};")
        self.out.add(f"kiln_status |= {name}_outside;")
        return self.define(name, torch.int64, f"{name}_outside ? (int64_t)0 : {value}")

    def _load(self, position: int, op, name: str) -> str:
        dtype = self.graph.buffers[op.buffer].dtype
        if not op.operands:
            in_register = self.lookup(op.buffer, "buffers")
            if in_register is not None:
                return in_register
            if op.buffer in self.scratch:
                return self.define(name, dtype, f"{self.scratch[op.buffer]}[{self._column_flat_index()}]")
        if op.buffer in self.kernel.local_buffers:
            raise AssertionError(f"local buffer {op.buffer} read where no loop holds it")
        mask = self.value(position, op.operands[0]) if op.operands else None
        access = f"{self.pointer(op.buffer)}[{self._offset(position, op)}]"
        if dtype == torch.bfloat16:
            access = f"kiln_from_bf16({access})"
        elif dtype == torch.float16:
            access = f"(float){access}"
        if mask is not None:  # masked: lanes outside the mask read nothing and yield 0
            return self.define(name, dtype, f"({mask} ? {access} : ({VALUE_TYPES[dtype]})0)")
        return self.define(name, dtype, access)

    def _store(self, position: int, op) -> None:
        node = self.kernel.nodes[position]
        source_dtype = node.body.ops[op.operands[0]].dtype
        dtype = self.graph.buffers[op.buffer].dtype
        value = self.value(position, op.operands[0])
        if source_dtype != dtype:
            self.conversions += 1
            value = self.define(f"stored{self.conversions}_{dtype_name(dtype)}", dtype,
                                self._convert(value, source_dtype, dtype))
        self.scopes[-1].buffers[op.buffer] = value
        if op.buffer in self.scratch:
            self.out.add(f"{self.scratch[op.buffer]}[{self._column_flat_index()}] = {value};")
        if op.buffer in self.kernel.local_buffers:
            return
        self.stored.add(op.buffer)
        if dtype == torch.bfloat16:
            stored = f"kiln_to_bf16({value})"
        elif dtype == torch.float16:
            stored = f"(_Float16){value}"
        else:
            stored = value
        self.out.add(f"{self.pointer(op.buffer)}[{self._offset(position, op)}] = {stored};")

    def _emit_stores(self, position: int, start: int = 0) -> None:
        """Every store of node `position` from op `start` on, with the values they need, and every
        index check (values are emitted on demand, and a checked position that no load reads, as
        under an expand, must still raise)."""
        for op_index, op in enumerate(self.kernel.nodes[position].body.ops[start:], start=start):
            if op.name == "store":
                self._store(position, op)
            elif op.name == "check_index":
                self.value(position, op_index)

    # ---- loops ------------------------------------------------------------------------
    def _status_reduction(self) -> str:
        """The clause that combines the threads' and lanes' out-of-bounds flags, when indices are checked."""
        return " reduction(|:kiln_status)" if self.gathers else ""

    def _simd(self) -> str:
        return "#pragma omp simd" + self._status_reduction()

    def _open_scope(self, header: str | None = None, variables=(), preheader: _Lines | None = None) -> None:
        if header is not None:
            self.out.open(header)
        self.scopes.append(_Scope(variables, preheader))
        self.levels = {}

    def _preheader(self, extents) -> _Lines | None:
        """A block before loops over `extents` for the values they do not change; None unless
        every extent is a known positive number."""
        if all(sympy.sympify(extent).is_Integer and int(extent) > 0 for extent in extents):
            return self.out.block()
        return None

    def _close_scope(self, braces: bool = True) -> None:
        self.scopes.pop()
        self.levels = {}
        if braces:
            self.out.close()

    def _loop(self, variable: str, extent) -> str:
        return f"for (int64_t {variable} = 0; {variable} < {self.index(extent)}; {variable}++)"

    def _parallel_clause(self, work) -> str:
        return f"if(parallel: {self.index(work)} >= {config.cpp_parallel_min})"

    def _pointwise_kernel(self) -> None:
        rows = self.kernel.row_ranges
        positions = list(range(len(self.kernel.nodes)))
        if not rows:
            self._open_scope("")
            for position in positions:
                self._emit_stores(position)
            self._close_scope()
            return
        parallel = self._parallel_clause(self.kernel.row_numel)
        if len(rows) == 1:
            self.out.add(f"#pragma omp parallel for simd {parallel}{self._status_reduction()}")
            self._open_scope(self._loop("x0", rows[0]), ["x0"])
        else:
            *outer, inner = self.kernel.walk_order  # the loops' nesting, outermost first
            self.out.add(f"#pragma omp parallel for collapse({len(rows) - 1}) {parallel}{self._status_reduction()}")
            for dim in outer:
                self.out.open(self._loop(f"x{dim}", rows[dim]))
            self._open_scope(None, [f"x{dim}" for dim in outer])
            preheader = self._preheader([rows[inner]])  # per outer row: what the simd loop does not change
            self.out.add(self._simd())
            self._open_scope(self._loop(f"x{inner}", rows[inner]), [f"x{inner}"], preheader)
        for position in positions:
            self._emit_stores(position)
        self._close_scope()
        if len(rows) > 1:
            self._close_scope(braces=False)
            for _ in rows[:-1]:
                self.out.close()

    def _reduction_kernel(self) -> None:
        rows = self.kernel.row_ranges
        if rows:
            self.out.add(f"#pragma omp parallel {self._parallel_clause(self.kernel.row_numel * self.kernel.col_numel)}")
        self.out.open("")
        arrays = {array: self.graph.buffers[buffer_name].dtype for buffer_name, array in self.scratch.items()}
        arrays.update({array: self.kernel.nodes[position].body.ops[op_index].dtype
                       for (position, op_index), array in self.reuse_saves.items()})
        for array, dtype in arrays.items():
            value_type = VALUE_TYPES[dtype]
            self.out.add(f"std::unique_ptr<{value_type}[]> {array}_owner(new {value_type}"
                         f"[{self.index(self.kernel.col_numel)}]);")
            self.out.add(f"{value_type}* {array} = {array}_owner.get();")
        if rows:
            self.out.add(f"#pragma omp for collapse({len(rows)}){self._status_reduction()}")
        for dim, extent in enumerate(rows):
            self.out.open(self._loop(f"x{dim}", extent))
        self._open_scope(None, [f"x{dim}" for dim in range(len(rows))])
        for role, positions in self.groups:
            if role == "full":
                self._column_group(positions)
            elif role == "reduction":
                self._reduction_node(positions[0])
            else:
                self._emit_stores(positions[0])
        self._close_scope(braces=False)
        for _ in rows:
            self.out.close()
        self.out.close()

    def _column_variables(self) -> list:
        return [f"r{dim}" for dim in range(len(self.kernel.col_ranges))]

    def _open_outer_columns(self) -> None:
        for dim, extent in enumerate(self.kernel.col_ranges[:-1]):
            self.out.open(self._loop(f"r{dim}", extent))

    def _close_outer_columns(self) -> None:
        for _ in self.kernel.col_ranges[:-1]:
            self.out.close()

    def _column_group(self, positions: list) -> None:
        """Consecutive full nodes: one loop over the row's columns, innermost simd."""
        preheader = self._preheader(self.kernel.col_ranges)
        self._open_outer_columns()
        last = len(self.kernel.col_ranges) - 1
        self.out.add(self._simd())
        self._open_scope(self._loop(f"r{last}", self.kernel.col_ranges[last]), self._column_variables(), preheader)
        for position in positions:
            self._emit_stores(position)
        self._close_scope()
        self._close_outer_columns()

    def _reduction_node(self, position: int) -> None:
        """A reduction over the row's columns, then the node's row ops (its stores)."""
        node = self.kernel.nodes[position]
        reduce_index = next(k for k, op in enumerate(node.body.ops) if op.name == "reduce")
        reduce_op = node.body.ops[reduce_index]
        kind = reduce_op.attr
        input_dtype = node.body.ops[reduce_op.operands[0]].dtype
        name = f"n{position}_{reduce_index}"
        if kind == "welford":
            # Three passes over the row, each a compensated sum: the mean estimate m0 = sum(x / n)
            # (x / n: no overflow where the sum of x would), its correction mean = m0 +
            # sum(x - m0) / n, then m2 = sum((x - mean)^2). Eager's Welford combine gives a row
            # of equal values their exact mean and var 0; the correction does the same here
            # (x - m0 is exact, so is the corrected mean), where sum / n alone is a few ulp off
            # and (x - mean) * rsqrt(var + eps) turns that into noise.
            value_type = VALUE_TYPES[input_dtype]
            count = f"({value_type})({self.index(self.kernel.col_numel)})"
            inverse = self.define(f"{name}_inv", input_dtype, f"({value_type})1 / {count}")
            estimate = self._lane_reduction(position, reduce_op, "sum", f"{name}_m0", input_dtype, input_dtype,
                                            fold="({0} + {1} * " + inverse + ")")
            correction = self._lane_reduction(position, reduce_op, "sum", f"{name}_dev", input_dtype, input_dtype,
                                              fold="({0} + ({1} - " + estimate + "))", save_reused=False)
            self.define(f"{name}_0", input_dtype, f"{estimate} + {correction} / {count}")
            deviation = f"(({{1}} - {name}_0) * ({{1}} - {name}_0))"
            self._lane_reduction(position, reduce_op, "sum", f"{name}_1", input_dtype, input_dtype,
                                 fold="({0} + " + deviation + ")", save_reused=False)
            self.define(f"{name}_2", input_dtype, count)
        else:
            accumulate = torch.bool if kind in ("any", "all") else input_dtype
            self._lane_reduction(position, reduce_op, kind, name, accumulate, reduce_op.dtype)
        self.scopes[-1].values[(position, reduce_index)] = name
        self._emit_stores(position, start=reduce_index + 1)

    def _lane_reduction(self, position: int, reduce_op, kind: str, name: str, accumulate: torch.dtype,
                        result_dtype: torch.dtype, fold: str | None = None, save_reused: bool = True) -> str:
        """Fold the reduce's operand over the columns into LANES accumulators, merge them into `name`.

        The innermost column loop runs in chunks of LANES, one lane per element of a chunk
        (a simd loop: the lanes are one vector), then the tail into lane 0; each lane sees its
        columns in increasing order, so ties keep the lower index. `fold` overrides how a
        value enters a lane ({0}: the lane, {1}: the value); lanes always merge by `kind`.
        Floating sums are blocked (_compensated_sum) to be as accurate as eager's.
        """
        value_type = VALUE_TYPES[accumulate]
        if kind == "sum" and accumulate.is_floating_point:
            return self._compensated_sum(position, reduce_op, name, value_type, result_dtype, fold, save_reused)
        self.out.add(f"{value_type} {name}_acc[{LANES}];")
        arg = kind in ("argmax", "argmin")
        if arg:
            self.out.add(f"int64_t {name}_index[{LANES}];")
        self.out.open(f"for (int lane = 0; lane < {LANES}; lane++)")
        self.out.add(f"{name}_acc[lane] = {_identity(kind, accumulate)};")
        if arg:
            self.out.add(f"{name}_index[lane] = 0;")
        self.out.close()

        def fold_into(lane: str) -> None:
            self._fold(position, reduce_op, kind, f"{name}_acc", name, lane, value_type, fold, save_reused)

        self._column_loops(name, fold_into)

        self.out.open(f"for (int lane = 1; lane < {LANES}; lane++)")
        if arg:
            self.out.add(f"bool keep = kiln_arg_keep<{value_type}>({name}_acc[0], {name}_index[0], {name}_acc[lane], "
                         f"{name}_index[lane], {'true' if kind == 'argmax' else 'false'});")
            self.out.add(f"{name}_acc[0] = keep ? {name}_acc[0] : {name}_acc[lane];")
            self.out.add(f"{name}_index[0] = keep ? {name}_index[0] : {name}_index[lane];")
        else:
            merged = COMBINE[kind].format(f"{name}_acc[0]", f"{name}_acc[lane]", T=value_type)
            self.out.add(f"{name}_acc[0] = {merged};")
        self.out.close()
        return self.define(name, result_dtype, f"{name}_index[0]" if arg else f"{name}_acc[0]")

    def _column_loops(self, name: str, fold_into: Callable[[str], None], *, open_block=None, close_block=None,
                      after_tail=None) -> None:
        """The column loops every lane reduction runs: the columns but the last as plain loops
        (`_open_outer_columns`), the last in chunks of LANES as a simd loop with one lane per
        column (`fold_into("lane")`), then its tail into lane 0 (`fold_into("0")`).

        open_block() -> (start, stop), when given, opens a loop around the simd loop that runs
        it over [start, stop) (the compensated sum's blocks); close_block() ends that loop, and
        after_tail() runs after the tail.
        """
        last = len(self.kernel.col_ranges) - 1
        extent = self.index(self.kernel.col_ranges[last])
        term = extent if sympy.sympify(self.kernel.col_ranges[last]).is_Atom else f"({extent})"  # `-1 + s0`
        preheader = self._preheader(self.kernel.col_ranges)  # before the loops: together they run
        self._open_outer_columns()
        self.out.add(f"int64_t {name}_end = {term} - {term} % {LANES};")
        start, stop = open_block() if open_block is not None else ("0", f"{name}_end")
        self.out.open(f"for (int64_t {name}_base = {start}; {name}_base < {stop}; {name}_base += {LANES})")
        self.out.add(self._simd())
        self._open_scope(f"for (int64_t lane = 0; lane < {LANES}; lane++)", self._column_variables(), preheader)
        self.out.add(f"int64_t r{last} = {name}_base + lane;")
        fold_into("lane")
        self._close_scope()
        self.out.close()
        if close_block is not None:
            close_block()
        self._open_scope(f"for (int64_t r{last} = {name}_end; r{last} < {extent}; r{last}++)",
                         self._column_variables(), preheader)
        fold_into("0")
        self._close_scope()
        if after_tail is not None:
            after_tail()
        self._close_outer_columns()

    def _compensated_sum(self, position: int, reduce_op, name: str, value_type: str, result_dtype: torch.dtype,
                         fold: str | None, save_reused: bool) -> str:
        """A floating sum as accurate as eager's blocked (cascade) sum, at the same speed.

        One lane summing n / LANES values in turn loses about sqrt(n) ulp (a 2^24-element
        fp32 sum: 3-8x eager's error; a variance: far more). So the simd loop sums blocks of
        SUM_BLOCK columns into fresh lanes (`_part`, short sums: their rounding errors are
        independent and small), each block is added to the running lanes with Kahan's
        compensation (`_acc`, `_comp`: once per block, negligible work), and the lanes merge
        pairwise. A compensation that is not finite (an inf or NaN sum) is dropped, so
        infinities and NaN propagate as in a plain sum.
        """
        self.out.add(f"{value_type} {name}_acc[{LANES}];")
        self.out.add(f"{value_type} {name}_comp[{LANES}];")
        self.out.add(f"{value_type} {name}_part[{LANES}];")
        self.out.open(f"for (int lane = 0; lane < {LANES}; lane++)")
        self.out.add(f"{name}_acc[lane] = 0; {name}_comp[lane] = 0;")
        self.out.close()

        def flush(lane: str) -> None:
            part, acc, comp = f"{name}_part[{lane}]", f"{name}_acc[{lane}]", f"{name}_comp[{lane}]"
            self.out.add(f"{value_type} {name}_y = {part} - {comp};")
            self.out.add(f"{value_type} {name}_t = {acc} + {name}_y;")
            self.out.add(f"{comp} = ({name}_t - {name}_t) == 0 ? ({name}_t - {acc}) - {name}_y : "
                         f"({value_type})0;")
            self.out.add(f"{acc} = {name}_t;")

        def fold_into(lane: str) -> None:
            self._fold(position, reduce_op, "sum", f"{name}_part", name, lane, value_type, fold, save_reused)

        def open_block() -> tuple[str, str]:
            self.out.open(f"for (int64_t {name}_block = 0; {name}_block < {name}_end; {name}_block += {SUM_BLOCK})")
            self.out.add(f"int64_t {name}_stop = {name}_block + {SUM_BLOCK} < {name}_end ? "
                         f"{name}_block + {SUM_BLOCK} : {name}_end;")
            self.out.open(f"for (int lane = 0; lane < {LANES}; lane++)")
            self.out.add(f"{name}_part[lane] = 0;")
            self.out.close()
            return f"{name}_block", f"{name}_stop"

        def close_block() -> None:
            self.out.add("#pragma omp simd")
            self.out.open(f"for (int lane = 0; lane < {LANES}; lane++)")
            flush("lane")
            self.out.close()
            self.out.close()
            self.out.add(f"{name}_part[0] = 0;")

        def after_tail() -> None:
            self.out.open("")
            flush("0")
            self.out.close()

        self._column_loops(name, fold_into, open_block=open_block, close_block=close_block, after_tail=after_tail)

        self.out.open(f"for (int lane = 0; lane < {LANES}; lane++)")
        self.out.add(f"{name}_acc[lane] -= {name}_comp[lane];")
        self.out.close()
        width = LANES // 2
        while width:
            self.out.open(f"for (int lane = 0; lane < {width}; lane++)")
            self.out.add(f"{name}_acc[lane] = {name}_acc[lane] + {name}_acc[lane + {width}];")
            self.out.close()
            width //= 2
        return self.define(name, result_dtype, f"{name}_acc[0]")

    def _fold(self, position: int, reduce_op, kind: str, accumulators: str, name: str, lane: str, value_type: str,
              fold: str | None, save_reused: bool) -> None:
        """Fold the reduce's operand at this column into `accumulators[lane]` (argmax/argmin: the
        indices in `name`_index)."""
        value = self.value(position, reduce_op.operands[0])
        ops = self.kernel.nodes[position].body.ops
        reduce_index = next(k for k, op in enumerate(ops) if op.name == "reduce")
        for op_index in range(reduce_index):
            if ops[op_index].name == "check_index":  # emitted even where the reduced value does not read it
                self.value(position, op_index)
        if save_reused:
            for (source, op_index), array in self.reuse_saves.items():
                if source == position:
                    self.out.add(f"{array}[{self._column_flat_index()}] = {self.value(position, op_index)};")
        accumulator = f"{accumulators}[{lane}]"
        if kind in ("argmax", "argmin"):
            column = self._column_flat_index()
            self.out.add(f"bool {name}_keep = kiln_arg_keep<{value_type}>({accumulator}, {name}_index[{lane}], "
                         f"{value}, {column}, {'true' if kind == 'argmax' else 'false'});")
            self.out.add(f"{accumulator} = {name}_keep ? {accumulator} : {value};")
            self.out.add(f"{name}_index[{lane}] = {name}_keep ? {name}_index[{lane}] : {column};")
            return
        folded = (fold or COMBINE[kind]).format(accumulator, value, T=value_type)
        self.out.add(f"{accumulator} = {folded};")

    # ---- the function --------------------------------------------------------------------
    def generate(self, name: str) -> CppKernelSource:
        kernel = self.kernel
        if kernel.is_reduction:
            self._reduction_kernel()
        else:
            self._pointwise_kernel()
        sizes = sorted(self.size_symbols, key=str)
        parameters = []
        for buffer_name, pointer in self.pointer_names.items():
            storage = STORAGE_TYPES[self.graph.buffers[buffer_name].dtype]
            parameters.append(f"{'' if buffer_name in self.stored else 'const '}{storage}* {pointer}")
        parameters += [f"int64_t {symbol}" for symbol in sizes]
        body = "\n".join(self.out.flat())
        source = (PRELUDE + f'\nextern "C" int {KERNEL_SYMBOL}({", ".join(parameters)}) {{\n'
                  f"    int kiln_status = 0;\n{body}\n    return kiln_status;\n}}\n")
        rows = sympy.sympify(kernel.row_numel)
        skip = bool(rows.is_Integer and int(rows) == 0)  # no output; an empty reduction still writes its rows
        header = [f"// kiln kernel {name}: {'reduction' if kernel.is_reduction else 'pointwise'} "
                  f"rows={list(kernel.row_ranges)} cols={list(kernel.col_ranges)}"]
        header += [f"//   {pointer} = {buffer_name}: {self.graph.buffers[buffer_name]}"
                   for buffer_name, pointer in self.pointer_names.items()]
        listing = "\n".join(header) + "\n" + source[len(PRELUDE):]
        signature = KernelSignature(len(self.pointer_names), len(sizes))
        return CppKernelSource(name, source, list(self.pointer_names), list(sizes), signature, self.gathers, skip,
                               listing=listing)


def generate_kernel(kernel: Kernel, graph: Graph) -> CppKernelSource:
    """The C++ source of one scheduled kernel."""
    return CppKernelGenerator(kernel, graph).generate(kernel.name)


@dataclass(frozen=True)
class CppBackend:
    """The C++/OpenMP backend for CPU tensors (a KernelBackend, kiln/codegen/common.py); its kernels
    are built and loaded by kiln/runtime/cpp_build.py."""

    name: ClassVar[str] = "cpp"
    device_type: ClassVar[str] = "cpu"

    def generate_kernel(self, kernel: Kernel, graph: Graph) -> CppKernelSource:
        return generate_kernel(kernel, graph)

    def loop_dependent_ops(self) -> frozenset:
        return loop_dependent_ops()

    def kernel_call(self, source: CppKernelSource, argument_sources: list, python_source: Callable) -> str:
        return source.launch(argument_sources)

    def load_kernels(self, kernel_sources: list) -> dict:
        """Kernels with an empty iteration space are never called, so never built."""
        return compile_kernels([source for source in kernel_sources if not source.skip])

    def kernel_generated(self, source: CppKernelSource) -> None:
        """C++ kernels are built together, in parallel, when the module loads (kiln/runtime/cpp_build.py)."""
