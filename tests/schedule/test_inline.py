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


def _masked_graph(producer_ops):
    """A producer `made` = f(x) read by one consumer under a mask (i1 < 500), as cat and pad read."""
    x, made, out = _buffer("x", (ROWS, COLS)), _buffer("made", (ROWS, COLS)), _buffer("out", (ROWS, COLS))
    body = Body()
    value = producer_ops(body, body.load(x, [I0, I1]))
    body.store(made, [I0, I1], value)
    producer = Pointwise("producer", [sympy.Integer(ROWS), sympy.Integer(COLS)], body, ["made"])
    use = Body()
    inside = use.emit("lt", (use.index_expr(I1), use.index_expr(sympy.Integer(500))), torch.bool)
    loaded = use.load(made, [I0, I1], mask=inside)
    use.store(out, [I0, I1], use.emit("where", (inside, loaded, use.constant(1.0, torch.float32)), torch.float32))
    consumer = Pointwise("use", [sympy.Integer(ROWS), sympy.Integer(COLS)], use, ["out"])
    return Graph(buffers={b.name: b for b in (x, made, out)}, nodes=[producer, consumer],
                 outputs=[TensorArg("out", out.layout)])


def test_a_producer_read_under_a_mask_is_inlined_with_its_loads_masked():
    graph = inline_pointwise(_masked_graph(lambda body, x: body.emit("neg", (x,), torch.float32)))
    assert [node.name for node in graph.nodes] == ["use"]
    ops = graph.nodes[0].body.ops
    (load,) = [op for op in ops if op.name == "load"]
    assert load.buffer == "x" and load.operands, "the inlined load of x must carry the consumer's mask"
    # masked lanes of the consumer's load read 0, as the load it replaces did
    assert [op.name for op in ops].count("where") == 2


def test_a_producer_with_an_index_check_is_not_inlined_under_a_mask():
    """Its loads would read 0 in masked lanes, and an index computed from 0 may fail its check there."""
    def gather_position(body, x):
        position = body.emit("to_dtype", (x,), torch.int64)
        return body.emit("to_dtype", (body.check_index(position, sympy.Integer(COLS)),), torch.float32)

    graph = inline_pointwise(_masked_graph(gather_position))
    assert [node.name for node in graph.nodes] == ["producer", "use"]


def test_a_zero_dim_producer_is_judged_too():
    """A 0-dim node (no ranges: its element count is the int 1) reading a 0-dim buffer (fuzz seed 9401 #49)."""
    scalar, made, out = _buffer("s", ()), _buffer("made", ()), _buffer("out", ())
    body = Body()
    body.store(made, [], body.emit("neg", (body.load(scalar, []),), torch.float32))
    use = Body()
    loaded = use.load(made, [])
    use.store(out, [], use.emit("add", (loaded, use.load(made, [])), torch.float32))
    second = Body()
    second.store(_buffer("out2", ()), [], second.load(made, []))
    graph = Graph(buffers={b.name: b for b in (scalar, made, out, _buffer("out2", ()))},
                  nodes=[Pointwise("producer", [], body, ["made"]), Pointwise("use", [], use, ["out"]),
                         Pointwise("use2", [], second, ["out2"])],
                  outputs=[TensorArg("out", out.layout), TensorArg("out2", out.layout)])
    assert [node.name for node in inline_pointwise(graph).nodes] == ["use", "use2"]


def test_a_batch_norms_per_channel_inverse_std_is_computed_once_per_channel(kernel_sources):
    """1 / sqrt(var + eps) of an inference batch norm is one value per channel: inlined into the activation's
    kernel, the GPU computed it per element (an IEEE square root and division, 40 of that kernel's 56 sm_90
    instructions per element over an NHWC bf16 activation). It is written once by a kernel over the channels."""
    import torch.nn.functional as F

    import kiln
    import kiln.testing
    from kiln.backend import compile_graph

    def fn(x, mean, var, weight, bias):
        return (F.relu(F.batch_norm(x, mean, var, weight, bias, training=False)),)

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, 10, 10, generator=generator)
    mean, weight, bias = (torch.randn(16, generator=generator) for _ in range(3))
    var = torch.rand(16, generator=generator) + 0.5
    with kiln.config.patch(cpu_backend="triton", strict=True):
        compiled = compile_graph(torch.fx.symbolic_trace(fn), [x, mean, var, weight, bias])
        result = compiled(x, mean, var, weight, bias)
    verdict = kiln.testing.compare(list(result), list(fn(x, mean, var, weight, bias)),
                                   list(fn(*(t.double() for t in (x, mean, var, weight, bias)))))
    assert verdict, verdict.message
    (channels,) = [source for source in kernel_sources if "tl.sqrt_rn(" in source]
    (activation,) = [source for source in kernel_sources if source is not channels]
    assert "x0 = xindex" in channels and "//" not in channels  # over the 16 channels alone
    assert "tl.div_rn(" not in activation and "tl.where(" in activation  # (x - mean) * invstd * w + b, relu
