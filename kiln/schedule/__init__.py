"""kiln/schedule: decide the kernels.

    schedule_graph(graph) = group_kernels(split_reductions(inline_pointwise(graph)))

1. `inline_pointwise` substitutes each pointwise producer into its consumers' bodies
   (a chain of pointwise ops becomes one body) unless that would recompute a large
   body several times, recompute a body whose value depends on its loop (the C++
   backend's libm vs libmvec), grow a body past `max_fusion_ops`, or the value must
   exist in memory (graph outputs, extern inputs, masked reads).
2. `split_reductions` splits a reduction with few, long rows (`x.sum()`) into two
   stages, so that many programs share its columns.
3. `group_kernels` walks the nodes in order and fuses each into the open kernel when
   it iterates over the same rows (and columns): reductions over the same rows share
   one kernel, pointwise epilogues join the reduction that feeds them. A value
   produced and consumed inside one kernel never touches memory.
Then kiln/backend.py runs `passes.optimize(scheduled)`: LoopIR -> LoopIR rewrites of the
kernels' bodies every backend gets (strength reduction, common subexpressions) and the
loop variables each value depends on (for loop-invariant code motion).
The memory plan (memory.py, `plan_memory`, its own stage after these) decides where each
buffer lives and when it is freed; the wrapper (kiln/codegen/wrapper.py) renders it.
"""
from kiln.schedule.fusion import group_kernels
from kiln.schedule.inline import inline_pointwise
from kiln.ir.kernel import Kernel, ScheduledGraph
from kiln.schedule.split import split_reductions
from kiln.schedule.verify import verify_scheduled


def schedule_graph(graph, loop_dependent_ops: frozenset = frozenset(), check=None) -> ScheduledGraph:
    """`loop_dependent_ops`: ops whose value the backend may compute differently in two loops
    (the KernelBackend's `loop_dependent_ops`, kiln/codegen/common.py); a body using them is computed once.
    `check(stage, form)` (kiln/backend.py's `_check`, which decides whether to verify) is called on the
    graph after split_reductions; the caller checks the scheduled form it returns."""
    inlined = inline_pointwise(graph, loop_dependent_ops)
    split = split_reductions(inlined)
    if check is not None:
        check("split_reductions", split)
    return group_kernels(split)


__all__ = ["Kernel", "ScheduledGraph", "schedule_graph", "verify_scheduled"]
