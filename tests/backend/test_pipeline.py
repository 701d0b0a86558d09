"""The backend end to end: kernel counts, debug dumps, fusion, recompiles, fallbacks."""
from __future__ import annotations

import glob
import os

import pytest
import torch

import kiln
import kiln.testing
from kiln.backend import compile_graph


@pytest.fixture(autouse=True, params=["cpp", "triton"])
def cpu_backend(request):
    """Every test here runs on both CPU backends: C++ and the Triton interpreter."""
    with kiln.config.patch(cpu_backend=request.param):
        yield request.param


def compiled_graphs(fn, *args, **compile_kwargs):
    """Compile `fn` through Dynamo with kiln's backend; return (result, CompiledGraph list)."""
    graphs = []

    def backend(gm, example_inputs):
        from kiln.aot import aot_compile
        from kiln.backend import compile_aten_graph

        def record(aten_gm, aten_inputs):
            compiled = compile_aten_graph(aten_gm, aten_inputs)
            graphs.append(compiled)
            return compiled

        return aot_compile(gm, example_inputs, record)

    torch._dynamo.reset()
    with kiln.config.patch(strict=True):
        result = torch.compile(fn, backend=backend)(*args)
    return result, graphs


def assert_matches(fn, *args):
    result, graphs = compiled_graphs(fn, *args)
    verdict = kiln.testing.compare(result, fn(*args), fn(*kiln.testing.to_float64(args)))
    assert verdict, verdict.message
    return graphs


def test_sin_plus_sin_is_one_kernel(tmp_path, cpu_backend):
    x, y = torch.randn(1000), torch.randn(1000)
    with kiln.config.patch(debug=True, debug_dir=str(tmp_path)):
        graphs = assert_matches(lambda a, b: torch.sin(a) + torch.sin(b), x, y)
    assert [g.kernel_count for g in graphs] == [1]
    assert graphs[0].extern_count == 0
    kernels = glob.glob(os.path.join(str(tmp_path), "*", "*", "kernel_*.*"))
    assert len(kernels) == 1
    source = open(kernels[0]).read()
    if cpu_backend == "triton":
        assert kernels[0].endswith(".py") and "libdevice.sin" in source and "tl.store" in source
    else:
        assert kernels[0].endswith(".cpp") and "std::sin" in source and "#pragma omp" in source


def test_layer_norm_gelu_is_one_kernel():
    x, w, b = torch.randn(6, 48), torch.randn(48), torch.randn(48)
    fn = lambda x, w, b: torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (48,), w, b))  # noqa: E731
    graphs = assert_matches(fn, x, w, b)
    assert graphs[0].kernel_count == 1


def test_layer_norm_feeding_a_matmul_is_one_kernel_past_an_unrelated_node():
    # As under autocast: a weight's cast sits between the norm's reduction and its normalization,
    # and the matmul reads the normalized rows through a reshape ([2, 8, 48] -> [16, 48]).
    def fn(x, w, b, weight):
        normalized = torch.nn.functional.layer_norm(x, (48,), w, b)
        scaled_weight = weight * 2
        return (normalized + 1).view(-1, 48) @ scaled_weight

    graphs = assert_matches(fn, torch.randn(2, 8, 48), torch.randn(48), torch.randn(48), torch.randn(48, 5))
    assert graphs[0].kernel_count == 2  # the norm, the weight's scaling
    assert "cols=[48] persistent" in graphs[0].scheduled.format()


def test_a_residual_stream_is_not_recomputed_layer_after_layer():
    # Each norm's output has two readers (the "attention" and the residual add); inlining it into
    # both made every layer's kernel recompute all earlier layers from the embedding.
    def fn(x, w, b, weight):
        for _ in range(4):
            normalized = torch.nn.functional.layer_norm(x, (32,), w, b)
            x = x + normalized + (normalized @ weight)
        return x

    graphs = assert_matches(fn, torch.randn(16, 32), torch.randn(32), torch.randn(32), torch.randn(32, 32) / 8)
    reads_per_kernel = [len({op.buffer for node in kernel.nodes for op in node.body.reads()})
                        for kernel in graphs[0].scheduled.kernels]
    half = len(reads_per_kernel) // 2
    assert max(reads_per_kernel[half:]) <= max(reads_per_kernel[:half]), reads_per_kernel  # no growth


def test_an_expensive_value_read_broadcast_is_computed_once():
    # Llama's rotary embedding: cos/sin of a [seq, dim] table, read by q and k of every head.
    # Inlined, each of the 8 heads x 2 consumers would compute its own cos; written once, it is read.
    def fn(positions, q, k):
        cos, sin = positions.cos(), positions.sin()
        return q * cos + q.flip(-1) * sin, k * cos - k.flip(-1) * sin

    positions, q, k = torch.randn(16, 8), torch.randn(2, 4, 16, 8), torch.randn(2, 4, 16, 8)
    graphs = assert_matches(fn, positions, q, k)
    counts = [sum(op.name in ("cos", "sin") for node in kernel.nodes for op in node.body.ops)
              for kernel in graphs[0].scheduled.kernels]
    assert sum(counts) == 2, graphs[0].scheduled.format()  # one cos and one sin, in the table's kernel
    # Read element for element (no broadcast), an expensive value is still inlined into its reader.
    graphs = assert_matches(lambda x: torch.sin(x) * 2 + 1, torch.randn(64))
    assert graphs[0].kernel_count == 1
    # Empty tensors (the OpInfo sweep's softmax and logspace samples) compute nothing: no ratio.
    assert_matches(lambda x, y: (x.exp() * y).sum(-1), torch.randn(0, 1), torch.randn(0, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_few_long_rows_are_reduced_in_two_stages(dtype):
    # x.sum() is one row: without the split, one program loops over every element.
    x, y = torch.randn(4096, dtype=dtype), torch.randn(4, 3, 1024, dtype=dtype)
    fn = lambda x, y: (x.sum(), x.mean(), x - x.amax(), y.sum((1, 2)), (y * 2).amin((0, 2)))  # noqa: E731
    with kiln.config.patch(split_reduction_min_columns=2048):  # small sizes keep the interpreter quick
        graphs = assert_matches(fn, x, y)
    text = graphs[0].scheduled.format()
    assert text.count("_stage1 (reduction)") == 5 and text.count("_stage2 (reduction)") == 5
    assert "kernel k0: rows=[4] cols=[1024]" in text  # x's three reductions: 4 chunks of 1024, one kernel


def test_the_same_kernel_in_every_layer_is_one_source():
    # A model's layers repeat their kernels; named after their own text, with no buffer names
    # inside, they are compiled (and cached) once, however many layers there are.
    def fn(x, w, b, weight):
        for _ in range(3):
            x = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (48,), w, b)) @ weight
        return x

    graphs = assert_matches(fn, torch.randn(6, 48), torch.randn(48), torch.randn(48), torch.randn(48, 48) / 7)
    sources = [getattr(kernel, "source", None) or kernel.listing for kernel in graphs[0].module_source.kernel_sources]
    assert len(sources) >= 3 and len(set(sources)) < len(sources)


def test_softmax_is_one_kernel_persistent_and_looped():
    for columns in (100, 9000):
        graphs = assert_matches(lambda x: torch.softmax(x, -1), torch.randn(4, columns))
        assert graphs[0].kernel_count == 1
        text = graphs[0].scheduled.format()
        assert ("persistent" if columns == 100 else "looped") in text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reductions(dtype):
    x = torch.randn(5, 37, dtype=dtype)
    fn = lambda x: (x.sum(1), x.amax(0), x.argmax(1), x.argmin(0), torch.var_mean(x, 1), x.mean(), x.prod(1))  # noqa: E731
    assert_matches(fn, x)


def test_views_and_indexing():
    fn = lambda x, i: (x.t().reshape(-1)[3:40:2] * 2, x[i], x.unsqueeze(0).expand(3, -1, -1).sum(0),  # noqa: E731
                       torch.cat([x, x * 3], 1), torch.gather(x, 1, i.view(-1, 1).expand(-1, 2) % 4))
    assert_matches(fn, torch.randn(7, 9), torch.tensor([1, -2, 3, 0, 6, 5, 2]))


def test_extern_matmul_with_fused_epilogue():
    graphs = assert_matches(lambda x, w: torch.relu(x @ w + 1.5), torch.randn(8, 16), torch.randn(16, 4))
    assert graphs[0].extern_count == 1 and graphs[0].kernel_count == 1


def test_views_of_inputs_and_extern_results_that_are_themselves_views():
    # An input with a storage offset, viewed for an extern (torch.as_strided counts offsets from
    # the storage's start), and a split whose parts feed an extern: the GPT-2 attention bug.
    base = torch.randn(5, 64)
    def fn(x, w):
        y = x.t() @ w
        return [part.t() @ y for part in y.split([16, 8], 1)]

    graphs = assert_matches(fn, base[1:, :16], torch.randn(4, 24))
    assert graphs[0].extern_count >= 3


def test_products_with_unaligned_rows_write_padded_rows():
    # GPT-2's LM head (50257 columns): cuBLAS is fast only on 16-byte aligned rows.
    def fn(x, w, b):
        return (x @ w.t()) * 2, torch.addmm(b, x, w.t()).view(4, 8, -1)

    x, w, b = torch.randn(32, 64), torch.randn(2051, 64), torch.randn(2051)
    with kiln.config.patch(cpu_gemm="aten"):  # aten's out= variants take the padded layout; oneDNN's linear does not
        result, graphs = compiled_graphs(fn, x, w, b)
    assert kiln.testing.compare(result, fn(x, w, b), fn(x.double(), w.double(), b.double()))
    assert "aten.mm.out" in graphs[0].scheduled.format()
    # The padded rows stay inside the graph: its outputs have eager's strides (tests/backend/test_strides.py).
    assert [out.stride() for out in result] == [out.stride() for out in fn(x, w, b)]


def test_changed_dtype_and_shape_recompile_correctly():
    fn = kiln.compile(lambda x: torch.tanh(x) * 2)
    for x in (torch.randn(10), torch.randn(10, dtype=torch.float64), torch.randn(3, 4), torch.randn(17)):
        with kiln.config.patch(strict=True):
            assert kiln.testing.compare(fn(x), torch.tanh(x) * 2)


def test_dynamic_shapes_compile_shape_generic():
    fn = kiln.compile(lambda x: torch.softmax(x * 2, -1), dynamic=True)
    for rows, columns in ((3, 8), (5, 13), (2, 300)):
        x = torch.randn(rows, columns)
        with kiln.config.patch(strict=True):
            assert kiln.testing.compare(fn(x), torch.softmax(x * 2, -1))


def test_unsupported_graph_falls_back_to_eager(monkeypatch):
    import kiln.backend as backend

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr("kiln.lowering.lower_graph", broken)
    fn = kiln.compile(lambda x: x.cos() + 1)
    x = torch.randn(5)
    assert torch.equal(fn(x), x.cos() + 1)
    # Dynamo wraps backend errors; the message still names the failure.
    with pytest.raises((backend.KilnCompileError, torch._dynamo.exc.BackendCompilerFailed), match="injected failure"):
        torch._dynamo.reset()
        kiln.compile(lambda x: x.sin() + 2, fullgraph=True)(x)


def test_compile_graph_is_a_torch_compile_backend():
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.exp(x).sum(), backend="kiln")
    x = torch.randn(33)
    assert kiln.testing.compare(fn(x), torch.exp(x).sum())
    assert callable(compile_graph)
