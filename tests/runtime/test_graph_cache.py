"""The whole-graph cache (kiln/runtime/graph_cache.py): a graph compiled again, in this process
after kiln.reset() or in a new one, loads its generated module from disk instead of lowering it,
and runs exactly as the first compile did; anything that changes the module changes the key."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kiln
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
        assert len(entries) == 1
        second = compile_and_explain(program, args)
        assert "lower" not in second.stage_seconds and "graph_cache" in second.stage_seconds
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

    def recording(gm, example_inputs, mode):
        keys.append(original(gm, example_inputs, mode))
        return keys[-1]

    graph_cache.key_of = recording
    try:
        with kiln.config.patch(**options):
            kiln.reset()
            kiln.compile(fn)(*args)
    finally:
        graph_cache.key_of = original
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
    (entry,) = list((cache_dir / "graphs").rglob("*.pkl"))
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
