"""kiln/schedule/inline.py: which pointwise producers are inlined into their consumers."""
from __future__ import annotations

import sympy
import torch

from kiln.ir import Body, Buffer, Graph, Layout, Pointwise, TensorArg
from kiln.ir.indexing import range_vars
from kiln.schedule.inline import inline_pointwise

I0, I1 = range_vars(2)
ROWS, COLS = 64, 1000


def _buffer(name, size):
    size = tuple(sympy.Integer(s) for s in size)
    stride, running = [], sympy.Integer(1)
    for s in reversed(size):
        stride.insert(0, running)
        running *= s
    return Buffer(name, torch.device("cpu"), torch.float32, Layout(size, tuple(stride)))


def _index(buffer):
    """[i0, i1] for a [rows, cols] buffer, [i0, 0] for a per-row one, [] for a scalar."""
    return [I0, I1][:len(buffer.layout.size)] if buffer.layout.size != (ROWS, 1) else [I0, sympy.Integer(0)]


def _sum_of(name, out, reads):
    body = Body()
    value = None
    for buffer in reads:
        loaded = body.load(buffer, _index(buffer))
        value = loaded if value is None else body.emit("add", (value, loaded), torch.float32)
    body.store(out, [I0, I1], value)
    return Pointwise(name, [sympy.Integer(ROWS), sympy.Integer(COLS)], body, [out.name])


def _graph(producer_reads):
    """A producer of `producer_reads`' sum, read by two consumers whose results are the outputs."""
    made, first, second = (_buffer(name, (ROWS, COLS)) for name in ("made", "first", "second"))
    buffers = {buffer.name: buffer for buffer in [*producer_reads, made, first, second]}
    nodes = [_sum_of("producer", made, producer_reads), _sum_of("use1", first, [made]),
             _sum_of("use2", second, [made, made])]
    return Graph(buffers=buffers, nodes=nodes, outputs=[TensorArg("first", first.layout),
                                                        TensorArg("second", second.layout)])


def test_a_producer_reading_one_full_buffer_and_broadcast_values_is_inlined_into_several_consumers():
    """nll_loss's backward: -1 at the target, times a masked scalar ratio, read by the row sum and by
    the gradient. The target, mask and scalars are per row or per graph: they stay in cache."""
    reads = [_buffer("x", (ROWS, COLS)), _buffer("target", (ROWS, 1)), _buffer("mask", (ROWS, 1)),
             _buffer("scale", ()), _buffer("count", ())]
    graph = inline_pointwise(_graph(reads))
    assert [node.name for node in graph.nodes] == ["use1", "use2"]
    assert "made" not in graph.buffers


def test_a_producer_reading_many_full_buffers_is_written_once():
    reads = [_buffer(name, (ROWS, COLS)) for name in ("a", "b", "c", "d")]
    graph = inline_pointwise(_graph(reads))
    assert [node.name for node in graph.nodes] == ["producer", "use1", "use2"]
