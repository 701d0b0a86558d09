"""The wrapper's tail (kiln/codegen/wrapper.py `_tail_start`) and the default mode's CUDA graph that records only
the head (kiln/runtime/cudagraphs.py, `Split` of kiln/runtime/loader.py), driven on a CPU with the stand-in
recording of test_cudagraphs.py: the tail's outputs are made after each replay in memory of their own, never on
the graph's pool and never copied; everything else is as a whole recording's."""
from __future__ import annotations

import pytest
import torch

import kiln
from tests.backend.test_pipeline import compiled_graphs
from tests.runtime.test_cudagraphs import RerunRecording, _on_graph_memory, preserving_runner


def lm_head(x, w_in, w_out):
    """A block, then an LM head: the logits are the last step's only output."""
    hidden = torch.tanh(x @ w_in) * 2
    return hidden.sum(-1), hidden, hidden @ w_out


def weights():
    return torch.randn(32, 32), torch.randn(32, 96)


@pytest.fixture
def tail_options():
    # CPU graphs keep intermediates in a scratch block, which a tail cannot be cut from; a small threshold makes
    # the 16 x 96 logits a tail's output.
    with kiln.config.patch(cpu_scratch_arena=False, cuda_graph_tail_min_bytes=16 * 96 * 4):
        yield


def split_graph(cpu_backend: str, w_in, w_out):
    with kiln.config.patch(cpu_backend=cpu_backend):
        _, (graph,) = compiled_graphs(lambda x: lm_head(x, w_in, w_out), torch.randn(16, 32))
    return graph


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_the_last_product_becomes_the_tail_and_the_split_computes_the_same(tail_options, cpu_backend):
    w_in, w_out = weights()
    graph = split_graph(cpu_backend, w_in, w_out)
    wrapper = graph.module_source.wrapper
    assert "def call_head(args):" in wrapper and "def call_tail(live):" in wrapper, wrapper
    assert graph.split is not None and graph.split.steps == 1 and graph.split.output_bytes == 16 * 96 * 4
    for _ in range(2):
        x = torch.randn(16, 32)
        live = list(graph.split.head([x, w_in, w_out]))
        for got, want in zip(graph.split.tail(live), lm_head(x, w_in, w_out)):
            torch.testing.assert_close(got, want)
        assert live == []  # the tail takes the head's values over, so each dies after its last use
        for got, want in zip(graph([x, w_in, w_out]), lm_head(x, w_in, w_out)):
            torch.testing.assert_close(got, want)


def test_no_tail_below_the_threshold_or_with_a_scratch_block():
    w_in, w_out = weights()
    with kiln.config.patch(cpu_scratch_arena=False, cuda_graph_tail_min_bytes=16 * 96 * 4 + 1):
        assert split_graph("cpp", w_in, w_out).split is None

    def with_intermediate(x):  # relu(...) * 2 is an intermediate kernel output: it goes in the scratch block
        hidden = torch.relu(x @ w_in) * 2
        return hidden.sum(-1), hidden @ w_out

    with kiln.config.patch(cuda_graph_tail_min_bytes=1):  # the head would have to hand the block over
        _, (graph,) = compiled_graphs(with_intermediate, torch.randn(16, 32))
        assert "_arena.acquire()" in graph.module_source.wrapper and graph.split is None


@pytest.mark.parametrize("cpu_backend", ["cpp", "triton"])
def test_default_mode_records_the_head_and_makes_the_tails_outputs_after_each_replay(tail_options, cpu_backend):
    w_in, w_out = weights()
    graph = split_graph(cpu_backend, w_in, w_out)
    heads = []

    class HeadRecording(RerunRecording):
        def __init__(self, run, stream, pool=None):
            heads.append(run)
            super().__init__(run, stream, pool)

    runner = preserving_runner(graph, capture=HeadRecording)
    kept = []
    for _ in range(6):
        x = torch.randn(16, 32)
        results = runner([x, w_in, w_out])
        kept.append((results, x))
        assert not _on_graph_memory(results, runner)
    assert runner.recordings == 1 and runner.replays == 5 and runner.plain_calls == 0
    assert heads[0].args[0] is graph.split.head  # the recording ran the head only
    assert [kind for kind, _ in runner.outputs] == ["pool", "pool", "fresh"]
    recorded = {value.untyped_storage().data_ptr() for value in runner.recording.outputs}
    logits = [results[2].untyped_storage().data_ptr() for results, _ in kept[1:]]
    assert not recorded & set(logits)  # the logits are never on the recording's memory
    for results, x in kept:  # every call's results stay valid, as eager's do
        for got, want in zip(results, lm_head(x, w_in, w_out)):
            torch.testing.assert_close(got, want)


def test_a_graph_that_falls_back_to_eager_has_no_split(tail_options):
    w_in, w_out = weights()
    graph = split_graph("cpp", w_in, w_out)
    assert graph.split is not None
    graph.fallback_reason = "a kernel failed to compile"
    assert graph.split is None
