"""Matrix-product templates (kiln/ir/template.py, kiln/codegen/triton_templates.py): a 2-d product as a
Triton tiled kernel that its pointwise epilogue joins.

They run here under Triton's interpreter (config.cpu_backend="triton", matmul_template="on"), the same
kernel source a GPU compiles, checked against eager and a float64 reference on random inputs. What
decides between template and cuBLAS (`product_config`, the autotuner's cache and budget) is tested
with its timing replaced, since timing needs a GPU.
"""
from __future__ import annotations

import logging

import pytest
import torch

import kiln
import kiln.testing
from kiln.codegen import templates
from kiln.codegen.triton_templates import INTERPRETED_TILE, TileConfig, candidates
from kiln.runtime import autotune
from tests.backend.test_pipeline import compiled_graphs

F = torch.nn.functional


@pytest.fixture(autouse=True)
def templates_on():
    with kiln.config.patch(cpu_backend="triton", matmul_template="on"):
        yield


def assert_close(fn, *args):
    """Compile `fn`; assert it matches eager within the accuracy rule; its CompiledGraphs."""
    result, graphs = compiled_graphs(fn, *args)
    verdict = kiln.testing.compare(result, fn(*args), fn(*kiln.testing.to_float64(args)))
    assert verdict, verdict.message
    return graphs


def template_kernels(graph) -> list:
    return [kernel for kernel in graph.scheduled.kernels if kernel.template is not None]


def test_a_product_with_bias_gelu_and_residual_is_one_kernel():
    x, w, b, r = torch.randn(33, 70), torch.randn(70, 50), torch.randn(50), torch.randn(33, 50)
    (graph,) = assert_close(lambda x, w, b, r: F.gelu(x @ w + b) + r, x, w, b, r)
    assert graph.kernel_count == 1 and graph.extern_count == 0
    (kernel,) = template_kernels(graph)
    assert kernel.roles == ["template", "full"] and kernel.local_buffers  # the product stays in registers
    text = graph.scheduled.format()
    assert "template mm" in text and "normal_cdf" in text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_linear_layers_of_every_template_dtype(dtype):
    # nn.Linear on a 3-d input: a view, addmm with the weight read transposed (t()), a view back
    x = torch.randn(2, 19, 40, dtype=dtype)
    weights = [torch.randn(72, 40, dtype=dtype) / 6, torch.randn(72, dtype=dtype), torch.randn(24, 72, dtype=dtype) / 8,
               torch.randn(24, dtype=dtype)]
    model = lambda x, w1, b1, w2, b2: F.linear(F.silu(F.linear(x, w1, b1)), w2, b2)  # noqa: E731
    (graph,) = assert_close(model, x, *weights)
    assert len(template_kernels(graph)) == 2 and graph.extern_count == 0


def test_operands_read_transposed_offset_and_strided():
    base, other = torch.randn(90, 64), torch.randn(48, 80)

    def fn(base, other):
        a = base[5:70, 3:51]  # an offset, row stride 64
        b = other.t()[::2]  # [40, 48] read column-major with a row stride of 2
        return a.t() @ a, a @ b.t()

    (graph,) = assert_close(fn, base, other)
    assert len(template_kernels(graph)) == 2


def test_addmm_alpha_beta_and_a_full_bias():
    bias, a, b = torch.randn(17, 21), torch.randn(17, 9), torch.randn(9, 21)
    (graph,) = assert_close(lambda bias, a, b: torch.addmm(bias, a, b, beta=0.5, alpha=-2.0), bias, a, b)
    assert len(template_kernels(graph)) == 1
    nan_bias = torch.full((17, 21), float("nan"))
    (graph,) = assert_close(lambda bias, a, b: torch.addmm(bias, a, b, beta=0), nan_bias, a, b)
    assert not torch.isnan(compiled_graphs(lambda bias, a, b: torch.addmm(bias, a, b, beta=0), nan_bias, a, b)[0]).any()


def test_single_rows_tiny_inner_dims_and_an_empty_product():
    assert_close(lambda a, b: torch.relu(a @ b), torch.randn(1, 37), torch.randn(37, 45))
    assert_close(lambda a, b: a @ b * 3, torch.randn(40, 3), torch.randn(3, 44))  # k far below a tile
    result, _ = compiled_graphs(lambda a, b: a @ b + 1, torch.randn(6, 0), torch.randn(0, 5))
    assert torch.equal(result, torch.ones(6, 5))  # k = 0: the bias alone


def test_a_product_feeding_a_reduction_is_stored_for_it():
    # The norm after the residual add cannot join the product's tile (it needs whole rows).
    x, w, gamma = torch.randn(24, 32), torch.randn(32, 48), torch.randn(48)
    (graph,) = assert_close(lambda x, w, g: F.layer_norm(x @ w + 1.0, (48,), g), x, w, gamma)
    (kernel,) = template_kernels(graph)
    assert not kernel.local_buffers and graph.kernel_count == 2


def test_a_body_whose_operand_is_not_a_strided_matrix_is_not_a_template():
    # x [4, 6, 5] read as x.permute(1, 0, 2).reshape(6, 20): no one stride walks a row
    import sympy

    from kiln.ir import Body, Buffer, Graph, GraphInput, IRVerificationError, Layout, Template, verify
    from kiln.ir.indexing import FloorDiv, Mod, range_vars
    from kiln.ir.template import template_parts

    x = Buffer("x", torch.device("cpu"), torch.float32, Layout((4, 6, 5), (30, 5, 1)))
    w = Buffer("w", torch.device("cpu"), torch.float32, Layout((20, 7), (7, 1)))
    out = Buffer("out", torch.device("cpu"), torch.float32, Layout((6, 7), (7, 1)))
    (i0, i1), (k,) = range_vars(2, "i"), range_vars(1, "r")
    body = Body()
    product = body.emit("mul", (body.load(x, [FloorDiv(k, 5), i0, Mod(k, 5)]), body.load(w, [k, i1])), torch.float32)
    body.store(out, [i0, i1], body.emit("reduce", (product,), torch.float32, attr="sum"))
    node = Template("node0", [sympy.Integer(6), sympy.Integer(7)], body, ["out"], reduction_ranges=[sympy.Integer(20)])
    graph = Graph(inputs=[GraphInput("tensor", "x", x), GraphInput("tensor", "w", w)],
                  buffers={"x": x, "w": w, "out": out}, nodes=[node], outputs=[])
    with pytest.raises(ValueError, match="not read as a strided matrix"):
        template_parts(node, graph)
    with pytest.raises(IRVerificationError, match="not a mm template"):
        verify(graph)


def test_a_permuted_operand_is_copied_once_then_read_by_the_template():
    x, w = torch.randn(4, 6, 5), torch.randn(4 * 5, 7)
    (graph,) = assert_close(lambda x, w: x.permute(1, 0, 2).reshape(6, 20) @ w, x, w)
    assert len(template_kernels(graph)) == 1 and graph.kernel_count == 2 and graph.extern_count == 0


def test_symbolic_rows_after_a_size_change_compile_once_more():
    w = torch.randn(24, 40)
    fn = lambda x, w: F.gelu(x @ w)  # noqa: E731
    counts = []

    def count_backend(gm, example_inputs):
        counts.append(1)
        return kiln.backend.compile_graph(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=count_backend)
    with kiln.config.patch(strict=True):
        for rows in (8, 13, 29):
            x = torch.randn(rows, 24)
            verdict = kiln.testing.compare(compiled(x, w), fn(x, w), fn(x.double(), w.double()))
            assert verdict, verdict.message
    assert len(counts) == 2  # static, then rows symbolic


def test_the_extern_stays_where_templates_are_off_or_the_backend_is_cpp():
    a, b = torch.randn(20, 30), torch.randn(30, 10)
    for options in ({"matmul_template": "off"}, {"cpu_backend": "cpp"}, {"matmul_template": "auto"}):
        with kiln.config.patch(**options):
            (graph,) = assert_close(lambda a, b: a @ b, a, b)
        assert not template_kernels(graph) and graph.extern_count == 1, options


# ---- choosing: template or cuBLAS, and which tile -------------------------------------------------

def _product(columns=64, inner=64):
    """A stand-in for a product template node: product_config reads its k (reduction_ranges)."""
    import types

    import sympy
    return types.SimpleNamespace(reduction_ranges=[sympy.Integer(inner)])


def test_product_config_follows_the_option_and_the_device():
    with kiln.config.patch(matmul_template="on"):
        assert templates.product_config(_product(), None, torch.empty(64, 64)) == INTERPRETED_TILE
    for setting in ("off", "default"):
        with kiln.config.patch(matmul_template=setting):
            assert templates.product_config(_product(), None, torch.empty(64, 64)) is None
    with kiln.config.patch(matmul_template="on", cpu_backend="cpp"):
        assert templates.product_config(_product(), None, torch.empty(64, 64)) is None
    with kiln.config.patch(matmul_template="auto"):  # the interpreter is never timed: it never wins
        assert templates.product_config(_product(), None, torch.empty(64, 64)) is None
    assert candidates(torch.bfloat16)[0] == TileConfig(128, 128, 64, 8, 3)


def _cuda_like(*shape, dtype=torch.bfloat16):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # a CUDA result's metadata, without a GPU
        return torch.empty(*shape, dtype=dtype, device="cuda")


@pytest.mark.parametrize("rows, columns, inner, dtype, template", [
    (512, 50257, 768, torch.bfloat16, True),    # GPT-2's LM head: n odd (4.1x faster as the template on the H200)
    (512, 1001, 768, torch.float16, True),      # fp16, another odd n
    (4096, 768, 50257, torch.bfloat16, False),  # the LM head's input gradient: k odd, not measured: cuBLAS
    (4096, 3072, 768, torch.bfloat16, False),   # aligned: cuBLAS
    (512, 50257, 768, torch.float32, False),    # fp32 rows are 4-byte: not measured, cuBLAS
    (32, 50257, 768, torch.bfloat16, False),    # a few rows (decode): cuBLAS
    (512, 1001, 60, torch.bfloat16, False),     # a short k: cuBLAS
])
def test_the_default_takes_the_template_where_cublas_is_misaligned(rows, columns, inner, dtype, template):
    meta = _cuda_like(rows, columns, dtype=dtype)
    with kiln.config.patch(matmul_template="default"):
        assert not templates.templates_considered(_cuda_like(4, rows, columns, dtype=dtype), inner)  # batched: cuBLAS
        assert templates.templates_considered(meta, inner) is template
        tile = templates.product_config(_product(columns, inner), None, meta)
    assert tile == (candidates(dtype)[0] if template else None)
    with kiln.config.patch(matmul_template="off"):
        assert not templates.templates_considered(meta, inner)
    with kiln.config.patch(matmul_template="default"):  # CPU: never by default
        assert not templates.templates_considered(torch.empty(rows, columns, dtype=dtype), inner)


@pytest.fixture
def fake_timings(monkeypatch, tmp_path):
    """autotune.time_ms replaced by each candidate's stand-in time; returns the list of timed names."""
    timed = []

    def time_ms(run):
        name, milliseconds = run()
        timed.append(name)
        return milliseconds

    monkeypatch.setattr(autotune, "time_ms", time_ms)
    with kiln.config.patch(cache_dir=str(tmp_path)):
        yield timed


def test_the_fastest_candidate_is_chosen_and_remembered(fake_timings):
    runs = {"extern": lambda: ("extern", 0.30), "tile a": lambda: ("tile a", 0.21), "tile b": lambda: ("tile b", 0.25)}
    assert autotune.choose("key 1", runs, "a product") == "tile a"
    assert fake_timings == ["extern", "tile a", "tile b"]
    assert autotune.cached_choice("key 1")["timings"] == {"extern": 0.30, "tile a": 0.21, "tile b": 0.25}
    assert autotune.choose("key 1", runs, "a product") == "tile a" and len(fake_timings) == 3  # not timed again
    runs["extern"] = lambda: ("extern", 0.1)
    assert autotune.choose("key 2", runs, "a product") == "extern"


def test_a_candidate_that_fails_is_skipped_and_a_spent_budget_stops_timing(fake_timings):
    runs = {"broken": lambda: ("broken", None), "tile": lambda: ("tile", 0.5)}
    assert autotune.choose("key 3", runs, "a product") == "tile"
    with kiln.config.patch(autotune_budget_s=0.0), autotune.graph_budget():
        assert autotune.choose("key 4", {"tile": lambda: ("tile", 0.5)}, "a product") is None
    assert autotune.cached_choice("key 4") is None  # nothing timed, nothing remembered


# ---- pointwise and reduction kernels' launch configs (kiln/codegen/tuning.py) ---------------------

def _kernel_sources(fn, *args):
    _, (graph,) = compiled_graphs(fn, *args)
    return graph, graph.module_source.kernel_sources


@pytest.mark.parametrize("program, rows, columns, kind", [
    (lambda x: torch.sin(x) * 2 + x, 300, 70, "pointwise"),
    (lambda x: torch.softmax(x, dim=-1), 40, 300, "persistent"),
    (lambda x: x.sum(-1) + x.amax(-1), 40, 9000, "looped"),
])
def test_every_candidate_config_computes_the_heuristics_values(program, rows, columns, kind):
    """Each config the tuner may pick gives the heuristic config's result (a looped reduction, whose
    RBLOCK changes its summation order, within float32 rounding)."""
    from kiln.codegen.tuning import candidate_configs, launcher, random_buffers

    graph, sources = _kernel_sources(program, torch.randn(rows, columns))
    kernels = {kernel.name: kernel for kernel in graph.scheduled.kernels}
    tried = 0
    for source in sources:
        kernel = kernels[source.name]
        configs = candidate_configs(source, kernel)
        assert configs[0] == (source.xblock, source.rblock, source.num_warps)
        assert kind == ("pointwise" if source.rblock is None else "persistent" if kernel.persistent else "looped")
        if kind == "persistent":
            assert all(rblock == source.rblock for _, rblock, _ in configs)  # the whole row in one block
        torch.manual_seed(0)
        inputs = random_buffers(source.buffer_args, source.pointer_dtypes, graph.scheduled.graph)
        results = []
        for xblock, rblock, warps in configs[:6]:
            tensors = {name: tensor.clone() for name, tensor in inputs.items()}
            constexprs = {"XBLOCK": xblock, **({"RBLOCK": rblock} if rblock else {})}
            launcher(source, tensors, constexprs, {"num_warps": warps}, -(-int(source.xnumel) // xblock))()
            results.append(tensors)
            tried += 1
        for other in results[1:]:
            for name in results[0]:
                if kind == "looped":
                    torch.testing.assert_close(other[name], results[0][name], rtol=1e-5, atol=1e-5)
                else:
                    assert torch.equal(other[name], results[0][name]), name
    assert tried > len(sources)


def test_kernels_are_not_tuned_off_cuda_or_when_not_asked():
    from kiln.codegen.tuning import tune_kernel

    graph, (source,) = _kernel_sources(lambda x: torch.cos(x) + 1, torch.randn(500))
    (kernel,) = graph.scheduled.kernels
    with kiln.config.patch(autotune_kernels="auto"):
        assert tune_kernel(source, kernel, graph.scheduled.graph) is source  # a CPU kernel: never timed
    with kiln.config.patch(autotune_kernels="off"):
        assert tune_kernel(source, kernel, graph.scheduled.graph) is source


def test_kernels_tune_on_real_tensors_under_the_compiles_fake_mode(monkeypatch, tmp_path):
    # Each candidate config runs (on real tensors: under the compile's fake mode a launch would get a
    # fake tensor's pointer) and is timed faster than the one before: the last candidate wins.
    from kiln.codegen.tuning import candidate_configs

    ran = []

    def time_ms(run):
        run()
        ran.append(run)
        return 10.0 - len(ran)

    monkeypatch.setattr(autotune, "timeable", lambda device_type: True)
    monkeypatch.setattr(autotune, "time_ms", time_ms)
    with kiln.config.patch(autotune_kernels="auto", cache_dir=str(tmp_path)):
        (graph,) = assert_close(lambda x: torch.softmax(x, dim=-1), torch.randn(40, 300))
    (source,) = graph.module_source.kernel_sources
    (kernel,) = graph.scheduled.kernels
    with kiln.config.patch(autotune_kernels="off"):  # the heuristic's configs, as the tuner saw them
        _, (untuned,) = _kernel_sources(lambda x: torch.softmax(x, dim=-1), torch.randn(40, 300))
    configs = candidate_configs(untuned, kernel)
    assert len(ran) == len(configs) > 2 and (source.xblock, source.rblock, source.num_warps) == configs[-1]


@pytest.fixture
def interpreted_timing(monkeypatch, tmp_path):
    """The "auto" path on the CPU: interpreted kernels count as timeable and each run is timed as
    its tile says (the 64x64 tiles fastest, then the other tiles, then cuBLAS's extern), after
    running it once for real; returns the list of what ran ("extern" or the tile's constexprs)."""
    ran = []

    def time_ms(run):
        run()
        source = getattr(run, "source", None)
        ran.append("extern" if source is None else source.constexprs)
        if source is None:
            return 1.0
        return 0.5 if (source.constexprs["BLOCK_M"], source.constexprs["BLOCK_N"]) == (64, 64) else 0.8

    monkeypatch.setattr(autotune, "timeable", lambda device_type: True)
    monkeypatch.setattr(autotune, "time_ms", time_ms)
    with kiln.config.patch(matmul_template="auto", cache_dir=str(tmp_path)):
        yield ran


def test_autotuning_runs_its_candidates_on_real_tensors_and_uses_the_winner(interpreted_timing):
    # The lowering runs under the compile's fake mode: a candidate launched on fake tensors read no
    # memory of its own (on the H200: an illegal memory access); and the winner has to reach the kernel.
    x, w, b = torch.randn(40, 24), torch.randn(24, 72), torch.randn(72)
    (graph,) = assert_close(lambda x, w, b: F.gelu(x @ w + b), x, w, b)
    (kernel,) = template_kernels(graph)
    assert kernel.template.config == TileConfig(64, 64, 32, 4, 3)  # fp32's 64x64 tile
    assert interpreted_timing.count("extern") == 1 and len(interpreted_timing) == 1 + len(candidates(torch.float32))


def test_a_tile_computing_a_wrong_product_is_never_timed(interpreted_timing, monkeypatch, caplog):
    original = templates._template_run

    def template_run(node, parts, graph, tile, operands, out):
        run = original(node, parts, graph, tile, operands, out)
        if (tile.block_m, tile.block_n) != (64, 64):
            return run

        def wrong():  # the fastest tile, broken: its result one element off
            run()
            out.view(-1)[7] += 1.0

        wrong.source = run.source
        return wrong

    monkeypatch.setattr(templates, "_template_run", template_run)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        (graph,) = assert_close(lambda a, b: a @ b, torch.randn(40, 24), torch.randn(24, 72))
    (kernel,) = template_kernels(graph)
    assert (kernel.template.config.block_m, kernel.template.config.block_n) != (64, 64)
    assert "computed a wrong result" in caplog.text
    assert all(entry == "extern" or (entry["BLOCK_M"], entry["BLOCK_N"]) != (64, 64) for entry in interpreted_timing)


def test_compiling_candidates_counts_against_the_graphs_budget(monkeypatch):
    import time as time_module

    from kiln.codegen import tuning
    from kiln.runtime import launch

    monkeypatch.setattr(launch, "compile_ahead", lambda jobs, workers: time_module.sleep(0.2) or len(jobs))
    graph, (source,) = _kernel_sources(lambda x: torch.cos(x) + 1, torch.randn(500))
    with kiln.config.patch(autotune_budget_s=1.0), autotune.graph_budget():
        tuning.compile_candidates([(source, source.constexprs, source.launch_options)])
        assert 0.7 < autotune.budget_left() <= 0.8


def test_a_product_that_is_also_an_output_is_stored_beside_its_epilogue():
    def fn(a, b):
        product = a @ b
        return product, torch.relu(product) * 2

    (graph,) = assert_close(fn, torch.randn(20, 30), torch.randn(30, 40))
    (kernel,) = template_kernels(graph)
    assert not kernel.local_buffers and len(kernel.outputs()) == 2 and graph.kernel_count == 1


def test_an_epilogue_reading_the_product_transposed_is_its_own_kernel():
    a, b, c = torch.randn(24, 16), torch.randn(16, 24), torch.randn(24, 24)
    (graph,) = assert_close(lambda a, b, c: (a @ b).t() + c, a, b, c)
    (kernel,) = template_kernels(graph)
    assert kernel.roles == ["template"] and graph.kernel_count == 2


def test_the_time_autotuning_took_is_reported_per_graph(fake_timings, caplog):
    import logging

    with kiln.config.patch(logs="perf"), caplog.at_level(logging.WARNING, logger="kiln"), autotune.graph_budget():
        with autotune.charged():
            pass
        autotune.choose("key 5", {"tile": lambda: ("tile", 0.5), "extern": lambda: ("extern", 0.7)}, "a product")
    assert "autotuned a product" in caplog.text and "tile 0.5000 ms, extern 0.7000 ms" in caplog.text
    assert "autotuning took" in caplog.text and "of this graph's compile" in caplog.text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_products_are_templates_with_their_epilogue(dtype):
    q, k, v = (torch.randn(3, 33, 20, dtype=dtype), torch.randn(3, 45, 20, dtype=dtype),
               torch.randn(3, 45, 16, dtype=dtype))

    def attention(q, k, v):  # a batched product read transposed, its scale as epilogue, then another product
        return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.25, dim=-1), v) + 1

    (graph,) = assert_close(attention, q, k, v)
    kernels = template_kernels(graph)
    assert [kernel.template.kind for kernel in kernels] == ["bmm", "bmm"] and graph.extern_count == 0
    assert kernels[1].roles == ["template", "full"]  # the + 1


def test_a_4d_matmul_is_a_batched_template():
    a, b = torch.randn(2, 3, 17, 24), torch.randn(2, 3, 29, 24)
    (graph,) = assert_close(lambda a, b: torch.relu(a @ b.transpose(-1, -2)) + 1, a, b)
    (kernel,) = template_kernels(graph)
    # its epilogue reads the product through the view that merged the batch dims, and still joins it
    assert kernel.template.kind == "bmm" and kernel.roles == ["template", "full"] and graph.kernel_count == 1
