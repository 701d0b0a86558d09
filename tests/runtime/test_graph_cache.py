"""The whole-graph cache (kiln/runtime/graph_cache.py): a graph compiled again, in this process
after kiln.reset() or in a new one, loads its generated module from disk instead of lowering it,
and runs exactly as the first compile did; anything that changes the module changes the key."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
from kiln.aot import plain
from kiln.runtime import graph_cache

F = torch.nn.functional
BACKENDS = ["cpp", "triton"]


@pytest.fixture
def cache_dir(tmp_path):
    with kiln.config.patch(graph_cache=True, cache_dir=str(tmp_path)):
        yield tmp_path


def program(x, w, table, ids):
    h = F.layer_norm(x @ w, (w.shape[1],)).softmax(-1)
    return h * 2 + F.embedding(ids, table).sum(1, keepdim=True)


def arguments():
    return (torch.randn(6, 8), torch.randn(8, 5), torch.randn(10, 5), torch.randint(0, 10, (6, 3)))


def compile_and_explain(fn, args):
    kiln.reset()
    report = kiln.explain(fn, *args)
    (graph,) = report.graphs
    return graph


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_compile_loads_the_module_and_matches(cache_dir, backend):
    args = arguments()
    with kiln.config.patch(cpu_backend=backend):
        first = compile_and_explain(program, args)
        assert "lower" in first.stage_seconds and first.kernels > 0
        entries = list((cache_dir / "graphs").rglob("*.pkl"))
        assert len(entries) == 2  # the ATen graph's module, and the torch-level graph's link to it (plain)
        second = compile_and_explain(program, args)
        assert "lower" not in second.stage_seconds and "load" in second.stage_seconds
        assert (second.kernels, second.externs, second.extern_ops) == (first.kernels, first.externs,
                                                                       first.extern_ops)
        kiln.reset()
        compiled = kiln.compile(program)
        for _ in range(2):
            fresh = arguments()
            torch.testing.assert_close(compiled(*fresh), program(*fresh))


def test_an_out_of_range_index_still_raises_from_a_cached_module(cache_dir):
    args = arguments()
    with kiln.config.patch(cpu_backend="triton"):  # the Triton kernels' index flag: an IndexStatus constant
        compile_and_explain(program, args)
        kiln.reset()
        compiled = kiln.compile(program)
        torch.testing.assert_close(compiled(*args), program(*args))
        bad = list(args)
        bad[3] = bad[3].clone()
        bad[3][2, 1] = 10
        with pytest.raises(IndexError, match="out of range"):
            compiled(*bad)
        torch.testing.assert_close(compiled(*args), program(*args))
        assert "lower" not in compile_and_explain(program, args).stage_seconds


def key(fn, args, **options):
    """The cache key of `fn`'s one ATen graph, as the backend computes it."""
    keys = []
    original = graph_cache.key_of

    def recording(gm, example_inputs, mode, **kwargs):
        found = original(gm, example_inputs, mode, **kwargs)
        if kwargs.get("level", "aten") == "aten":
            keys.append(found)
        return found

    graph_cache.key_of = recording
    original_plain_key, plain.key_of = plain.key_of, lambda *args, **kwargs: None  # no links: every compile lowers
    try:
        with kiln.config.patch(**options):
            kiln.reset()
            kiln.compile(fn)(*args)
    finally:
        graph_cache.key_of, plain.key_of = original, original_plain_key
    (found,) = keys
    return found


def test_what_changes_the_module_changes_the_key(cache_dir):
    x = torch.randn(4, 6)

    def scale(x):
        return (x * 3).relu().sum(0)

    base = key(scale, (x,))
    assert base is not None and key(scale, (torch.randn(4, 6),)) == base  # values are not part of it
    assert key(scale, (torch.randn(4, 7),)) != base  # shapes are
    assert key(scale, (torch.randn(6, 4).t(),)) != base  # strides
    assert key(scale, (x.double(),)) != base  # dtypes
    assert key(scale, (x,), max_fusion_ops=17) != base  # any option
    assert key(scale, (x,), cpu_backend="triton") != base

    def scale_by_four(x):
        return (x * 4).relu().sum(0)

    assert key(scale_by_four, (x,)) != base  # the graph's constants


def test_a_constant_tensors_values_are_part_of_the_key(cache_dir):
    def add_constant(x):
        return x + torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])

    def add_other(x):
        return x + torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 7.0])

    x = torch.randn(3, 6)
    assert key(add_constant, (x,)) != key(add_other, (x,))
    kiln.reset()
    torch.testing.assert_close(kiln.compile(add_other)(x), add_other(x))


def test_symbolic_shapes_are_not_cached(cache_dir):
    def scale(x):
        return x.sin() * 2

    kiln.reset()
    compiled = kiln.compile(scale, dynamic=True)
    for rows in (5, 7):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(compiled(x), scale(x))
    assert not list(cache_dir.rglob("*.pkl"))


def test_a_corrupt_entry_is_rebuilt(cache_dir, caplog):
    args = arguments()
    compile_and_explain(program, args)
    for entry in (cache_dir / "graphs").rglob("*.pkl"):  # the module's entry and the link to it
        entry.write_bytes(entry.read_bytes()[:-100] + b"x" * 100)
    graph = compile_and_explain(program, args)
    assert "lower" in graph.stage_seconds  # a miss: compiled again
    assert "graph_cache" in caplog.text or "corrupt" in caplog.text or "seal" in caplog.text
    assert "lower" not in compile_and_explain(program, args).stage_seconds  # and stored again, whole
    kiln.reset()
    torch.testing.assert_close(kiln.compile(program)(*args), program(*args))


def test_off_stores_nothing(cache_dir):
    with kiln.config.patch(graph_cache=False):
        compile_and_explain(program, arguments())
    assert not (cache_dir / "graphs").exists()


SCRIPT = textwrap.dedent("""
    import sys, torch, kiln
    from kiln.debug.explain import explain
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4)).eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        report = explain(model, x)
        out = kiln.compile(model)(x)
        torch.testing.assert_close(out, model(x))
    (graph,) = report.graphs
    print("HIT" if "lower" not in graph.stage_seconds else "MISS", graph.kernels)
""")


def test_a_new_process_hits(tmp_path):
    env = {**os.environ, "KILN_GRAPH_CACHE": "1", "KILN_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    first, second = (run.stdout.split()[-2:] for run in runs)
    assert first[0] == "MISS" and second[0] == "HIT" and first[1] == second[1] and int(first[1]) > 0


# ---- plain inference graphs: a warm start without AOTAutograd (kiln/aot/plain.py)

@pytest.fixture
def traces(monkeypatch):
    """How many times the backend traced a graph to ATen (kiln.aot.aot_compile)."""
    import kiln.aot

    calls = []
    original = kiln.aot.aot_compile

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(kiln.aot, "aot_compile", counting)
    return calls


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_warm_plain_inference_graph_is_not_traced_again(cache_dir, backend, traces):
    with kiln.config.patch(cpu_backend=backend):
        kiln.reset()
        kiln.compile(program)(*arguments())
        assert len(traces) == 1
        kiln.reset()
        compiled = kiln.compile(program)
        for _ in range(2):
            fresh = arguments()
            result = compiled(*fresh)
            torch.testing.assert_close(result, program(*fresh))
            assert isinstance(result, torch.Tensor) and not result.requires_grad
        assert len(traces) == 1  # the second compile loaded the module by the torch-level graph's link


def test_a_warm_autocast_graph_computes_as_the_cold_one(cache_dir, traces):
    """The ATen graph holds autocast's casts: called warm, it runs with autocast off, as AOTAutograd runs it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 8), torch.nn.Softmax(-1)).eval()
    warm, expected = _cold_then_warm_under_autocast(model, torch.randn(8, 16), traces)
    assert warm.dtype == expected.dtype == torch.bfloat16  # computed in bfloat16, as eager's autocast does
    torch.testing.assert_close(warm, expected, atol=2e-2, rtol=2e-2)


def _cold_then_warm_under_autocast(fn, x, traces):
    """`fn` compiled twice, each time after kiln.reset(), under no_grad (an inference graph) and CPU
    autocast: the second compile must load the first one's module without tracing to ATen, and give the
    same values. Returns (the warm result, eager's)."""
    results = []
    for _ in range(2):
        kiln.reset()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            results.append(kiln.compile(fn)(x))
    assert len(traces) == 1
    cold, warm = results
    assert torch.equal(cold, warm)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return warm, fn(x)


def _writes_its_input(x):
    x.mul_(2)
    return x + 1


def _returns_a_view_of_its_input(x):
    return x.t(), x.sin()


def _returns_one_value_twice(x):
    y = x.cos()
    return y, y[1:]


@pytest.mark.parametrize("fn, reason", [(_writes_its_input, "may write in place"),
                                        (_returns_a_view_of_its_input, "an output shares storage with an input"),
                                        (_returns_one_value_twice, "two outputs share storage")])
def test_graphs_that_are_not_plain_are_traced_again(cache_dir, traces, fn, reason, caplog):
    """An input written in place, an output that aliases an input or another output: AOTAutograd's wrapper
    does work around the ATen graph, so a warm start traces them again (their modules still come from the cache),
    and KILN_LOGS=perf says why."""
    for _ in range(2):
        kiln.reset()
        x = torch.randn(4, 5)
        expected_input, expected = x.clone(), fn(x.clone())
        with kiln.config.patch(logs="perf"), caplog.at_level(logging.WARNING, logger="kiln"):
            result = kiln.compile(fn)(x)
        assert reason in caplog.text and "a warm start traces this graph to ATen" in caplog.text
        caplog.clear()
        torch.testing.assert_close(result, expected)
        if fn is _writes_its_input:
            torch.testing.assert_close(x, expected_input * 2)
    assert len(traces) == 2


def test_a_graph_that_needs_autograd_is_traced_again(cache_dir, traces):
    weight = torch.randn(5, 3, requires_grad=True)

    def project(x, w):
        return (x @ w).tanh()

    for _ in range(2):
        kiln.reset()
        x = torch.randn(4, 5)
        result = kiln.compile(project)(x, weight)
        result.sum().backward()
    assert len(traces) == 2 and weight.grad is not None


def test_the_warm_call_runs_as_aotautograds_inference_wrapper():
    """Grad off and autocast off (where it was on when the graph was traced) around the ATen graph's callable;
    the eager fallback, called inside, runs the torch-level graph under that autocast again."""
    seen = []

    def compiled(args):
        seen.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), len(args)))
        return (args[0] * 2,)

    compiled._boxed_call = True
    facts = {"autocast": (("cpu", True, torch.bfloat16), ("cuda", False, torch.float16))}
    call = plain.runtime_wrapper(compiled, facts)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (result,) = call(torch.ones(3), torch.ones(2))
    assert seen == [(False, False, 2)] and torch.equal(result, torch.full((3,), 2.0))

    gm = torch.fx.symbolic_trace(lambda x, w: (x @ w,))
    fallback = plain.eager_fallback(gm, facts)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        (product,) = fallback([torch.randn(2, 3), torch.randn(3, 4)])
    assert product.dtype == torch.bfloat16


def _float32_region(x):
    """Llama's rotary embedding's shape: autocast turned off around float32 math, inside an autocast region."""
    with torch.autocast("cpu", enabled=False):
        angles = x.float().sin()
    return (x @ x.t()) + angles.sum(-1)


def _autocast_graph(close: bool) -> torch.fx.GraphModule:
    """x @ x.t() inside an autocast-off region, closed or left open (as a graph break inside one leaves it)."""
    enter, exit_ = kiln._torch.autocast_region_functions()
    x = torch.randn(4, 4)
    graph = torch.fx.Graph()
    placeholder = graph.placeholder("x")
    placeholder.meta["example_value"] = x
    region = graph.call_function(enter, ("cpu", None, False, None))
    region.meta["example_value"] = None
    transposed = graph.call_method("t", (placeholder,))
    transposed.meta["example_value"] = x.t()
    product = graph.call_function(torch.matmul, (placeholder, transposed))
    product.meta["example_value"] = x @ x.t()
    if close:
        graph.call_function(exit_, (region,)).meta["example_value"] = None
    graph.output(product)
    return torch.fx.GraphModule(torch.nn.Module(), graph), x


def test_a_graph_is_plain_only_if_it_closes_its_autocast_regions(cache_dir):
    with torch.no_grad():
        closed, x = _autocast_graph(close=True)
        assert plain.key_of(closed, [x], "default") is not None
        left_open, x = _autocast_graph(close=False)
        assert plain.key_of(left_open, [x], "default") is None


def test_a_warm_graph_with_an_autocast_off_region_is_not_traced_again(cache_dir, traces):
    warm, expected = _cold_then_warm_under_autocast(_float32_region, torch.randn(6, 6), traces)
    assert warm.dtype == expected.dtype
    torch.testing.assert_close(warm, expected, atol=5e-2, rtol=2e-2)


def test_a_plain_graph_without_a_linked_module_says_so_under_perf(cache_dir, traces, caplog):
    """KILN_LOGS=perf names why a plain graph was traced to ATen: a cold start's cache has no module for it (a warm
    start that logs this has a key that its cold start did not link); the warm start, which loads it, says nothing."""
    for _ in range(2):
        kiln.reset()
        with kiln.config.patch(logs="perf"), caplog.at_level(logging.WARNING, logger="kiln"):
            kiln.compile(program)(*arguments())
    messages = [record.getMessage() for record in caplog.records if "traced to ATen" in record.getMessage()]
    assert len(messages) == 1 and "links to no ATen graph" in messages[0]
    assert len(traces) == 1
    for entry in (cache_dir / "graphs").rglob("*.pkl"):  # the link stays, the module it names goes
        if b"aten_key" not in entry.read_bytes():
            entry.unlink()
    caplog.clear()
    kiln.reset()
    with kiln.config.patch(logs="perf"), caplog.at_level(logging.WARNING, logger="kiln"):
        kiln.compile(program)(*arguments())
    assert "the ATen graph its key links to is not in the whole-graph cache" in caplog.text and len(traces) == 2


def test_under_perf_each_torch_level_key_keeps_its_text(cache_dir):
    """Two processes' texts of one graph's key, diffed, show why a warm start found no link."""
    kiln.reset()
    with kiln.config.patch(logs="perf"):
        kiln.compile(program)(*arguments())
    texts = list((cache_dir / "keys").rglob("k*.txt"))
    assert len(texts) == 1
    text = texts[0].read_text()
    assert text.startswith("level torch") and "input 0 T(" in text
    kiln.reset()
    kiln.compile(program)(*arguments())
    assert len(list((cache_dir / "keys").rglob("k*.txt"))) == 1  # without perf, nothing more is written
