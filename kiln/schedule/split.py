"""Split reductions with few rows and long columns into two stages (LoopIR -> LoopIR).

A kernel runs one program per row (or block of rows). `x.sum()` over 16M elements is
one row: one program on one SM (or one CPU thread) loops over everything while the
rest of the machine idles. Splitting the columns into S chunks makes stage 1 reduce
rows x S chunks in parallel into a small partial buffer, and stage 2 reduce the S
partials of each row and finish as the original node did:

    sum over [R]            ->   stage 1: ranges [S] cols [R / S]  -> partial [S] (fp32)
                                 stage 2: cols [S]                 -> the original output

Reductions of several rows whose result feeds a loop over their whole input (softmax,
norms) are left whole: they fuse with it into one kernel; unless the rows are few and too long
for registers (`_long_rows`: an NCHW batch norm's statistics), where that kernel would read each
row twice anyway. A single row is always split. Only sum, prod, max and min are split
(argmax/argmin would carry indices), and welford where outer or long rows (`_split`); only
static sizes, and only when S divides the columns exactly (no masks). What follows the reduce
in the body (a mean's division, a cast) must depend on the reduced value and constants
only; it moves to stage 2.

Outer reductions (kiln/schedule/outer.py: rows contiguous, columns strided) are split
whatever their consumers, into about `split_outer_target_programs` programs, with the
partials chunk-major ([S, rows]); an outer welford splits as welfords of chunks of x - K (K an
element of the row), merged by two sums (`_welford_split`; a row welford splits the same way).
"""
from __future__ import annotations

import sympy

from kiln.config import config
from kiln.ir import Body, Buffer, Graph, Layout, LoopNode, Op, Reduction, Template
from kiln.ir.indexing import contiguous_strides, index_var, product, unravel
from kiln.ir.nodes import indirect_value
from kiln.schedule.inline import buffer_uses, copy_op
from kiln.schedule.outer import OUTER_ROWS_PER_PROGRAM, is_outer_reduction

SPLITTABLE = ("sum", "prod", "max", "min")


def split_reductions(graph: Graph) -> Graph:
    uses = buffer_uses(graph)
    nodes = []
    for node in graph.nodes:
        stages = None
        if isinstance(node, LoopNode) and node.is_reduction and not isinstance(node, Template):
            if is_outer_reduction(node, graph.buffers):
                stages = _split(node, graph, outer=True)
            elif product(node.ranges) == 1 or not _feeds_its_rows(node, uses):
                stages = _split(node, graph)
            elif _long_rows(node):
                stages = _split(node, graph, long_rows=True)
        nodes += stages if stages else [node]
    graph.nodes = nodes
    return graph


def _feeds_its_rows(node: LoopNode, uses: dict) -> bool:
    """Whether a consumer iterates the reduction's whole input space (softmax's max feeding
    exp(x - max), a norm's statistics feeding the normalization): those fuse with the reduction
    into one kernel over whole rows, which splitting would break into several."""
    total = product([*node.ranges, *node.reduction_ranges])
    for name in node.outputs:
        for user, _ in uses.get(name, []):
            if isinstance(user, LoopNode) and \
                    sympy.expand(product([*user.ranges, *user.reduction_ranges]) - total) == 0:
                return True
    return False


def _long_rows(node: LoopNode) -> bool:
    """Few rows too long for one kernel to keep in registers, and long enough that one program streaming a row
    takes longer than a launch (`split_long_row_min_columns`; static sizes). A consumer that reads the rows
    again either fuses and loops over each row a second time, as a split's stage 1 and the consumer's own
    kernel read it, or does not fuse at all (an NCHW batch norm's normalization, over N, C, H, W, whose
    leading dim is not the channel): splitting costs no more reads. Unsplit, the rows alone leave most of
    the GPU idle: ResNet-50's NCHW batch norms in training at batch 64 were 64 to 2,048 programs, each
    looping over 25,088 to 802,816 elements."""
    extent = _static_extent(node)
    if extent is None:
        return False
    rows, columns = extent
    return 0 < rows < config.split_long_row_programs and \
        columns >= max(config.split_long_row_min_columns, config.persistent_reduction_max + 1)


def _static_extent(node: LoopNode) -> tuple | None:
    """(rows, columns) of a reduction whose sizes are all static, else None (a split needs exact chunks)."""
    sizes = [*node.ranges, *node.reduction_ranges]
    if not all(sympy.sympify(size).is_Integer for size in sizes):
        return None
    return int(product(node.ranges)), int(product(node.reduction_ranges))


def _dividing_count(most: int, columns: int, chunk: int) -> int:
    """The largest count, at most `most`, that divides `columns` into chunks of at least `chunk` (1: none)."""
    for count in range(min(most, columns // chunk), 1, -1):
        if columns % count == 0:
            return count
    return 1


def long_row_split_count(rows: int, columns: int) -> int:
    """How many chunks to split each of a few long rows into (`_long_rows`; 1: do not split): rows x chunks
    about `split_long_row_programs`, each chunk at least 1,024 columns, the chunks dividing the row exactly."""
    return _dividing_count(config.split_long_row_programs // rows, columns, 1024)


def split_count(rows: int, columns: int) -> int:
    """How many chunks to split each row into (1: do not split)."""
    if rows > config.split_reduction_max_rows or columns < config.split_reduction_min_columns:
        return 1
    return _dividing_count(max(2, config.split_reduction_target_programs // rows), columns, 1024)


def outer_split_count(rows: int, columns: int) -> int:
    """How many chunks to split an outer reduction's columns into (1: do not split): enough that
    its row tiles times the chunks make about `split_outer_target_programs` programs, each chunk at
    least 256 columns long. On the H200 at 07ceca6, 256 programs (4 chunks) gave x.sum(0) of a
    65536 x 4096 bf16 matrix 0.34 of the copy ceiling, eager 0.87: too few warps to hide its loads."""
    programs = -(-rows // OUTER_ROWS_PER_PROGRAM)
    target = config.split_outer_target_programs
    if programs == 0 or 2 * programs > target:
        return 1
    return _dividing_count(target // programs, columns, 256)


def _split(node: LoopNode, graph: Graph, outer: bool = False, long_rows: bool = False) -> list | None:
    """`node` as two stages (a welford: three), or None where it cannot or need not split. A welford splits
    only where outer or `long_rows`: its split mean, K + d, is exact only to about K's ulp, where a mean far
    smaller than K lost relative digits that the unsplit kernel keeps (var_mean of 5 x 9000 bf16 values, in
    tests/codegen/test_cpp.py, came out 1 ulp off where eager's was exact). In a batch norm it shifts the
    normalized values by about K's ulp over the spread: ~4e-7 in float32 for a K three spreads out."""
    extent = _static_extent(node)
    if extent is None:
        return None
    reduces = [position for position, op in enumerate(node.body.ops) if op.name == "reduce"]
    if len(reduces) != 1:
        return None
    kind = node.body.ops[reduces[0]].attr
    if kind not in SPLITTABLE and not (kind == "welford" and (outer or long_rows)):
        return None
    position = reduces[0]
    carried = _constants_used_after(node.body, position)
    if carried is None:
        return None
    rows, columns = extent
    count = (outer_split_count if outer else long_row_split_count if long_rows else split_count)(rows, columns)
    if count == 1:
        return None
    if kind == "welford":
        return _welford_split(node, graph, position, carried, count, columns, outer)
    reduce_op = node.body.ops[position]
    output = graph.buffers[node.outputs[0]]
    # An outer reduction's partials are chunk-major ([chunks, rows]): stage 1 then stores, and
    # stage 2 loads, neighbouring rows next to each other, as the outer tiling wants.
    row_sizes = [sympy.Integer(int(size)) for size in node.ranges]
    partial_sizes = [sympy.Integer(count), *row_sizes] if outer else [*row_sizes, sympy.Integer(count)]
    partial = Buffer(f"{node.name}_partial", output.device, reduce_op.dtype,
                     Layout(tuple(partial_sizes), tuple(contiguous_strides(partial_sizes))))
    graph.buffers[partial.name] = partial
    return [_first_stage(node, position, partial, count, columns, outer),
            _second_stage(node, position, partial, count, carried, outer)]


def _constants_used_after(body: Body, position: int) -> set | None:
    """The constants that ops after the reduce read (None if they read any other earlier value,
    or index through a gathered value, whose SSA number would change)."""
    carried = set()
    for op in body.ops[position + 1:]:
        exprs = list(op.index or ()) + ([op.attr] if op.name == "index_expr" else [])
        if any(indirect_value(symbol) is not None for expr in exprs for symbol in sympy.sympify(expr).free_symbols):
            return None
        for operand in op.operands:
            if operand < position:
                if body.ops[operand].name != "constant":
                    return None
                carried.add(operand)
    return carried


def _chunked_body(node: LoopNode, position: int, count: int, columns: int, outer: bool) -> tuple:
    """The node's ops before its reduce, rewritten so that each (row, chunk) visits columns
    [chunk * width, (chunk + 1) * width): (body, chunk variable, row variables, ranges, width). The chunk is the
    last row variable, or the first for an outer reduction (the node's own rows then move up by one)."""
    width = columns // count
    rank = len(node.ranges)
    chunk = index_var("i", 0 if outer else rank)
    row_vars = [index_var("i", k + 1 if outer else k) for k in range(rank)]
    reduction_vars = [index_var("r", k) for k in range(len(node.reduction_ranges))]
    original = dict(zip(reduction_vars, unravel(chunk * width + index_var("r", 0), list(node.reduction_ranges))))
    original.update(zip([index_var("i", k) for k in range(rank)], row_vars))  # one simultaneous xreplace
    body = Body()
    for op in node.body.ops[:position]:
        body.ops.append(_substituted(op, original))
    ranges = [sympy.Integer(count), *node.ranges] if outer else [*node.ranges, sympy.Integer(count)]
    return body, chunk, row_vars, ranges, width


def _first_stage(node: LoopNode, position: int, partial: Buffer, count: int, columns: int,
                 outer: bool) -> Reduction:
    """Each (row, chunk) reduces its chunk of columns into the partial buffer."""
    body, chunk, row_vars, ranges, width = _chunked_body(node, position, count, columns, outer)
    body.ops.append(node.body.ops[position])  # the reduce (no index)
    body.store(partial, [chunk, *row_vars] if outer else [*row_vars, chunk], position)
    return Reduction(f"{node.name}_stage1", ranges, body, [partial.name], reduction_ranges=[sympy.Integer(width)])


def _second_stage(node: LoopNode, position: int, partial: Buffer, count: int, carried: set,
                  outer: bool) -> Reduction:
    """Reduce each row's partials, then finish as the original body did after its reduce."""
    body = Body()
    renumber = _carry(body, node, carried)
    row_vars = [index_var("i", k) for k in range(len(node.ranges))]
    chunk = index_var("r", 0)
    loaded = body.load(partial, [chunk, *row_vars] if outer else [*row_vars, chunk])
    reduce_op = node.body.ops[position]
    renumber[position] = body.emit("reduce", (loaded,), reduce_op.dtype, attr=reduce_op.attr)
    _finish(body, node, position, renumber)
    return Reduction(f"{node.name}_stage2", list(node.ranges), body, list(node.outputs),
                     reduction_ranges=[sympy.Integer(count)])


def _carry(body: Body, node: LoopNode, carried: set) -> dict:
    """Append the constants the node's finish reads; {their old SSA ids: new}."""
    renumber = {}
    for operand in sorted(carried):
        body.ops.append(node.body.ops[operand])
        renumber[operand] = len(body.ops) - 1
    return renumber


def _finish(body: Body, node: LoopNode, position: int, renumber: dict, getitem=None) -> None:
    """Append the node's ops after its reduce, renumbered; with `getitem(op)`, each getitem of the reduce's
    result is that value instead (a welford's mean, m2 or count)."""
    for offset, op in enumerate(node.body.ops[position + 1:], start=position + 1):
        if getitem is not None and op.name == "getitem" and op.operands == (position,):
            renumber[offset] = getitem(op)
            continue
        body.ops.append(Op(op.name, tuple(renumber[operand] for operand in op.operands), op.dtype, op.buffer,
                           op.index, op.attr))
        renumber[offset] = len(body.ops) - 1


def _welford_split(node: LoopNode, graph: Graph, position: int, carried: set, count: int, columns: int,
                   outer: bool) -> list | None:
    """A welford (var_mean: a batch norm's training statistics, over leading dims where channels-last, or a
    few long rows where NCHW) in one read of x, over deviations from K, one element of x per row (the first
    column's); the partials chunk-major where `outer`, as any outer split's:

        stage 1   per (chunk, row): welford of x - K over the chunk's w columns -> mu_c, m2_c
        stage 2a  per row: d = sum(mu_c) / chunks                              (the mean deviation)
        stage 2b  per row: m2 = sum(m2_c + w (mu_c - d)^2);  mean = K + d      then the original finish

    Stage 2b is Chan's merge of equal-sized chunks, as two sums (2a feeds 2b's loop, as softmax's max
    feeds its sum, so they fuse). Merging welford's values in float32 partials loses digits where the mean
    is large against the spread (1000 +- 0.01: every mu_c near 1000, their differences rounded at its
    ulp); deviations from K are of the spread's size, and x - K is exact where x is near K. So the
    result is as accurate as the unsplit welford kernel's: a row of equal values has its exact mean and
    variance 0 (eager's), 1000 +- 0.01 and a K far out in the row (an outlier, a row of zeros but one)
    lose no more than it (tests/schedule/test_outer.py). Plain shifted sums, sum(x - K) and sum((x - K)^2),
    lost 3 digits of the variance for a K 100 spreads out."""
    reduce_op = node.body.ops[position]
    dtype, value = reduce_op.dtype, reduce_op.operands[0]
    if not _copyable_at(node.body, value):
        return None
    row_sizes = [sympy.Integer(int(size)) for size in node.ranges]
    device = graph.buffers[node.outputs[0]].device
    rows = [index_var("i", k) for k in range(len(node.ranges))]
    first_column = {index_var("r", k): sympy.Integer(0) for k in range(len(node.reduction_ranges))}

    def buffer(suffix, sizes):
        made = Buffer(f"{node.name}_{suffix}", device, dtype, Layout(tuple(sizes), tuple(contiguous_strides(sizes))))
        graph.buffers[made.name] = made
        return made

    partial_sizes = [sympy.Integer(count), *row_sizes] if outer else [*row_sizes, sympy.Integer(count)]
    means, m2s, mean_deviation = buffer("mu", partial_sizes), buffer("m2", partial_sizes), buffer("d", row_sizes)

    body, chunk, shifted_rows, ranges, width = _chunked_body(node, position, count, columns, outer)
    shift = _copy_at(body, node.body, value, {**first_column, **dict(zip(rows, shifted_rows))})
    reduced = body.emit("reduce", (body.emit("sub", (value, shift), dtype),), dtype, attr="welford")
    at = [chunk, *shifted_rows] if outer else [*shifted_rows, chunk]
    body.store(means, at, body.emit("getitem", (reduced,), dtype, attr=0))
    body.store(m2s, at, body.emit("getitem", (reduced,), dtype, attr=1))
    first = Reduction(f"{node.name}_stage1", ranges, body, [means.name, m2s.name],
                      reduction_ranges=[sympy.Integer(width)])

    chunks = [index_var("r", 0), *rows] if outer else [*rows, index_var("r", 0)]
    body = Body()
    total = body.emit("reduce", (body.load(means, chunks),), dtype, attr="sum")
    body.store(mean_deviation, rows, body.emit("truediv", (total, body.constant(float(count), dtype)), dtype))
    second = Reduction(f"{node.name}_stage2a", list(node.ranges), body, [mean_deviation.name],
                       reduction_ranges=[sympy.Integer(count)])

    body = Body()
    renumber = _carry(body, node, carried)
    deviation = body.load(mean_deviation, rows)
    apart = body.emit("sub", (body.load(means, chunks), deviation), dtype)
    term = body.emit("add", (body.load(m2s, chunks), body.emit("mul", (
        body.constant(float(width), dtype), body.emit("mul", (apart, apart), dtype)), dtype)), dtype)
    m2 = body.emit("reduce", (term,), dtype, attr="sum")
    mean = body.emit("add", (_copy_at(body, node.body, value, first_column), deviation), dtype)
    _finish(body, node, position, renumber,
            lambda op: mean if op.attr == 0 else m2 if op.attr == 1 else body.constant(float(columns), op.dtype))
    third = Reduction(f"{node.name}_stage2b", list(node.ranges), body, list(node.outputs),
                      reduction_ranges=[sympy.Integer(count)])
    return [first, second, third]


def _copyable_at(body: Body, value: int) -> bool:
    """Whether `value` can be computed again at other indices: loads and arithmetic, no reduce, no gather."""
    seen, stack = set(), [value]
    while stack:
        position = stack.pop()
        if position in seen:
            continue
        seen.add(position)
        op = body.ops[position]
        if op.name in ("reduce", "store", "getitem"):
            return False
        exprs = list(op.index or ()) + ([op.attr] if op.name == "index_expr" else [])
        if any(indirect_value(symbol) is not None for expr in exprs for symbol in sympy.sympify(expr).free_symbols):
            return False
        stack.extend(op.operands)
    return True


def _copy_at(target: Body, source: Body, value: int, mapping: dict) -> int:
    """Append to `target` the ops of `source` that `value` depends on, their indices substituted by
    `mapping`; the copy's SSA id of `value`."""
    copied: dict = {}

    def copy(position):
        if position not in copied:
            for operand in source.ops[position].operands:
                copy(operand)
            copied[position] = copy_op(target, source.ops[position], copied, mapping)
        return copied[position]

    return copy(value)


def _substituted(op: Op, mapping: dict) -> Op:
    index = None if op.index is None else tuple(sympy.sympify(expr).xreplace(mapping) for expr in op.index)
    attr = sympy.sympify(op.attr).xreplace(mapping) if op.name == "index_expr" else op.attr
    return Op(op.name, op.operands, op.dtype, op.buffer, index, attr)


__all__ = ["long_row_split_count", "outer_split_count", "split_count", "split_reductions"]
