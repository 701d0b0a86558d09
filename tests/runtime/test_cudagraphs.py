"""CUDA graphs' bookkeeping (kiln/runtime/cudagraphs.py), driven on a CPU with a stand-in recording.

A real CUDA graph replays the recorded launches into the same memory; `RerunRecording`
does the same on a CPU: it reruns the recorded function on the recorded (static) inputs
and writes the results into the recording's outputs. So these tests check what the
runner decides (which inputs are read in place, which are copied, when it must not
replay, when it records again) and that every call's results are right; the GPU check
(benchmarks/gpu_smoke.py) runs the same runner with real graphs.
"""
from __future__ import annotations

import contextlib
import gc
import logging

import pytest
import torch

import kiln
from kiln.runtime import cudagraphs


class RerunRecording:
    def __init__(self, run, stream, pool=None):
        self.run = run
        self.outputs = run()

    def replay(self):
        for static, fresh in zip(self.outputs, self.run()):
            if isinstance(static, torch.Tensor):
                static.copy_(fresh)


def graph_function(args):
    """A boxed compiled graph: (x @ w + b, x.sum() * scale), consuming its argument list."""
    w, b, x, scale = args
    args.clear()
    return [x @ w + b, x.sum() * scale]


def expected(w, b, x, scale):
    return [x @ w + b, x.sum() * scale]


class StandInInvalidator:
    """Records what the runner invalidates (torch's CPU-only builds lack the real binding)."""

    def __init__(self):
        self.invalidated: list = []

    def __call__(self, storage_cdata: int, message: str) -> None:
        self.invalidated.append((storage_cdata, message))


def runner_for(function=graph_function, capture=RerunRecording, invalidate=None, max_shapes=1, **options):
    return cudagraphs.CudaGraphRunner(function, "g0", capture=capture, make_stream=lambda: None,
                                      stream_context=lambda stream: contextlib.nullcontext(), invalidate=invalidate,
                                      max_shapes=max_shapes, **options)


def check(results, w, b, x, scale):
    for got, want in zip(results, expected(w, b, x, scale)):
        torch.testing.assert_close(got, want)


def inputs(count: int) -> list:
    """`count` activations alive at once: each at its own address (an allocator may give a freed
    tensor's address to the next one, which these tests must not depend on)."""
    return [torch.randn(5, 8) for _ in range(count)]


def test_parameters_are_read_in_place_activations_copied_and_every_call_is_right():
    w, b = torch.randn(8, 4), torch.randn(4)
    runner = runner_for()
    for x in inputs(6):
        results = runner([w, b, x, 2.0])
        check(results, w, b, x, 2.0)
        del results  # the caller is done with them: the next call may replay into their memory
    assert [position for position, _ in runner.in_place] == [0, 1]
    assert [position for position, _ in runner.copied] == [2]
    assert runner.replays == 5 and runner.plain_calls == 0 and runner.recordings == 1


def test_an_activation_at_the_same_address_twice_is_copied_in_once_it_moves():
    w, b = torch.randn(8, 4), torch.randn(4)
    x = torch.randn(5, 8)
    runner = runner_for()
    for _ in range(3):  # the same address in calls 1 and 2: read in place
        x.normal_()
        check(runner([w, b, x, 1.0]), w, b, x, 1.0)
    assert [position for position, _ in runner.in_place] == [0, 1, 2]
    for x in inputs(5):  # it moves: recorded again, copied in from then on
        check(runner([w, b, x, 1.0]), w, b, x, 1.0)
    assert [position for position, _ in runner.copied] == [2] and runner.recordings == 2
    assert runner.replays == 2 + 4  # the moved call warms up; the next records and replays


def test_a_moved_parameter_is_read_in_place_again():
    w, b = torch.nn.Parameter(torch.randn(8, 4)), torch.randn(4)
    runner = runner_for()
    for x in inputs(3):
        runner([w, b, x, 1.0])
    w = torch.nn.Parameter(torch.randn(8, 4))
    for x in inputs(3):
        check(runner([w, b, x, 1.0]), w, b, x, 1.0)
    assert [position for position, _ in runner.in_place] == [0, 1] and runner.recordings == 2


def test_a_result_still_referenced_is_never_overwritten(caplog):
    # Where torch cannot invalidate a storage (invalidate=None: its CPU-only builds), a result still
    # referenced blocks the replay instead.
    w, b = torch.randn(8, 4), torch.randn(4)
    x1, x2, x_kept, x4, x5 = inputs(5)
    runner = runner_for()
    runner([w, b, x1, 1.0])
    runner([w, b, x2, 1.0])  # recorded
    kept = runner([w, b, x_kept, 1.0])[0]
    view_kept = kept[1:3]  # a view keeps the memory alive as well
    del kept
    with caplog.at_level(logging.WARNING, logger="kiln"):
        check(runner([w, b, x4, 1.0]), w, b, x4, 1.0)
    assert runner.plain_calls == 1 and "still referenced" in caplog.text
    torch.testing.assert_close(view_kept, (x_kept @ w + b)[1:3])
    del view_kept
    check(runner([w, b, x5, 1.0]), w, b, x5, 1.0)
    assert runner.plain_calls == 1 and runner.replays == 3  # replayed again once nothing was kept


def test_a_result_still_referenced_is_invalidated_and_the_graph_replays():
    # torch.compile's semantics: a result is valid until the next call; one still referenced then is marked
    # so that reading it raises (the real marking: test_reading_a_stale_result_raises_and_says_clone).
    invalidator = StandInInvalidator()
    w, b = torch.randn(8, 4), torch.randn(4)
    runner = runner_for(invalidate=invalidator)
    out = None
    for x in inputs(6):  # the `out = model(x)` loop: the previous `out` is alive during the call
        out = runner([w, b, x, 2.0])
        check(out, w, b, x, 2.0)
    assert runner.replays == 5 and runner.plain_calls == 0
    # calls 3..6 each found the previous replay's two results alive (the record call's were the first)
    assert runner.invalidated == 2 * 4 and len(invalidator.invalidated) == 8
    assert all("clone()" in message and "g0" in message for _, message in invalidator.invalidated)
    kept = out[0][1:3]  # a view of this call's result: the next replay invalidates its storage
    del out
    x = torch.randn(5, 8)
    check(runner([w, b, x, 2.0]), w, b, x, 2.0)
    assert invalidator.invalidated[-1][0] == kept.untyped_storage()._cdata
    # results that share a buffer share a storage; results of different calls never do
    first, second = runner([w, b, torch.randn(5, 8), 2.0]), runner([w, b, torch.randn(5, 8), 2.0])
    assert first[0].untyped_storage()._cdata != second[0].untyped_storage()._cdata
    assert first[0].data_ptr() == second[0].data_ptr()  # the same memory: the graph's output buffer


def test_a_result_fed_back_as_an_input_runs_plain(caplog):
    def function(args):  # a cache-like step: the state it returns is its next input
        state, x = args
        args.clear()
        return [state * 0.5 + x]

    runner = runner_for(function, invalidate=StandInInvalidator())
    state = torch.zeros(4)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for x in [torch.randn(4) for _ in range(5)]:
            want = state * 0.5 + x
            (state,) = runner([state, x])
            torch.testing.assert_close(state, want)
    assert "is an input of this one" in caplog.text and runner.plain_calls >= 1


def test_dropping_the_runner_invalidates_the_results_still_referenced():
    invalidator = StandInInvalidator()
    w, b = torch.randn(8, 4), torch.randn(4)
    runner = runner_for(invalidate=invalidator)
    for x in inputs(3):
        out = runner([w, b, x, 1.0])
    handle = out[0].untyped_storage()._cdata
    del runner  # the graph's memory goes with it
    gc.collect()  # should a reference cycle hold the runner
    assert handle in [cdata for cdata, _ in invalidator.invalidated]


@pytest.mark.skipif(cudagraphs._torch.storage_invalidator() is None,
                    reason="this torch build has no storage invalidation (CPU-only builds)")
def test_reading_a_stale_result_raises_and_says_clone():
    w, b = torch.randn(8, 4), torch.randn(4)
    runner = runner_for(invalidate=cudagraphs._torch.storage_invalidator())
    for x in inputs(3):
        out = runner([w, b, x, 1.0])
    stale, kept = out[0], out[0].clone()
    x = torch.randn(5, 8)
    check(runner([w, b, x, 1.0]), w, b, x, 1.0)
    assert stale.shape == (5, 4)  # metadata still reads
    with pytest.raises(RuntimeError, match=r"\.clone\(\)"):
        stale.sum()
    torch.testing.assert_close(kept, kept.clone())


def test_new_sizes_get_recordings_of_their_own_up_to_a_bound(caplog):
    # A shape-generic graph takes its sizes as non-tensor inputs (here `scale` stands for one).
    w, b = torch.randn(8, 4), torch.randn(4)
    runner = runner_for(max_shapes=4)
    for x in inputs(3):
        check(runner([w, b, x, 1.0]), w, b, x, 1.0)
    for scale, x in zip((3.0, 3.0, 3.0, 1.0, 3.0), inputs(5)):  # warm up, record, replay; the first sizes replay
        check(runner([w, b, x, scale]), w, b, x, scale)
    assert runner.replays == 3 and runner.plain_calls == 0  # the record call's, one more, and 1.0's
    (other,) = runner.shapes.values()  # 3.0's: warm-up, record (it replays too), two replays
    assert other.replays == 3 and other.plain_calls == 0 and other.recordings == 1
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for scale, x in zip((4.0, 5.0, 6.0, 7.0, 6.0, 5.0, 5.0), inputs(7)):  # two more runners; past MAX_SHAPES,
            check(runner([w, b, x, scale]), w, b, x, scale)                  # plain calls
    assert len(runner.shapes) + 1 == runner.max_shapes == 4
    assert "at most 4" in caplog.text and runner.plain_calls == 3  # 6.0, 7.0, 6.0
    assert runner.shapes[(5.0,)].replays == 2  # 5.0's runner: warm-up, record, replay


def test_the_defaults_invalidate_stale_results_and_record_up_to_eight_sizes():
    runner = cudagraphs.CudaGraphRunner(graph_function, "g0", capture=RerunRecording, make_stream=lambda: None,
                                        stream_context=lambda stream: contextlib.nullcontext())
    assert runner.max_shapes == 8 and runner._invalidate is cudagraphs._torch.storage_invalidator()


def test_with_invalidation_off_other_sizes_past_the_bound_run_without_graphs_and_live_results_block_the_replay():
    with kiln.config.patch(cudagraph_invalidate=False, cudagraph_max_shapes=1):
        runner = cudagraphs.CudaGraphRunner(graph_function, "g0", capture=RerunRecording, make_stream=lambda: None,
                                            stream_context=lambda stream: contextlib.nullcontext())
    assert runner.max_shapes == 1 and runner._invalidate is None
    w, b = torch.randn(8, 4), torch.randn(4)
    for scale, x in zip((1.0, 1.0, 1.0, 2.0, 2.0, 2.0), inputs(6)):
        check(runner([w, b, x, scale]), w, b, x, scale)
    assert runner.replays == 2 and runner.plain_calls == 3 and not runner.shapes


def test_a_failed_recording_turns_graphs_off_with_the_reason(caplog):
    def failing_capture(run, stream, pool=None):
        raise RuntimeError("operation not permitted when stream is capturing")

    w, b = torch.randn(8, 4), torch.randn(4)
    runner = runner_for(capture=failing_capture)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for x in inputs(3):
            check(runner([w, b, x, 1.0]), w, b, x, 1.0)
    assert runner.disabled_reason.startswith("recording failed: RuntimeError")
    assert "CUDA graphs off for graph g0" in caplog.text


def test_outputs_that_are_inputs_are_returned_as_they_are_and_copied_ones_cloned():
    def function(args):
        w, x = args
        args.clear()
        return [w, x, x * 2]

    w = torch.randn(3)
    runner = runner_for(function)
    for x in [torch.randn(3) for _ in range(4)]:
        w_out, x_out, doubled = runner([w, x])
        assert w_out is w
        torch.testing.assert_close(x_out, x)
        torch.testing.assert_close(doubled, x * 2)
    assert [kind for kind, _ in runner.outputs] == ["input", "clone", "pool"]


def test_wrap_applies_to_cuda_graphs_whose_part_is_known():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # example inputs as AOTAutograd passes them; no GPU needed
        cuda_inputs = [torch.empty(2, device="cuda")]
    compiled = object()
    inference = cudagraphs.wrap(compiled, "g", cuda_inputs, inference=True)
    assert isinstance(inference, cudagraphs.CudaGraphRunner) and inference.saved_from is None
    assert not inference.block_results and inference.warm_up_calls == 1
    forward = cudagraphs.wrap(compiled, "g", cuda_inputs, inference=False, saved_from=3)
    assert forward.saved_from == 3 and not forward.block_results and forward.warm_up_calls == 1
    backward = cudagraphs.wrap(compiled, "g", cuda_inputs, inference=False, backward=True)
    assert backward.block_results and backward.warm_up_calls == 2 and backward.saved_from is None
    assert cudagraphs.wrap(compiled, "g", cuda_inputs, inference=False) is compiled  # a training graph, part unknown
    assert cudagraphs.wrap(compiled, "g", [torch.randn(2)], inference=True) is compiled  # CPU inputs
    assert cudagraphs.wrap(compiled, "g", [torch.randn(2)], inference=False, backward=True) is compiled


def test_reduce_overhead_mode_on_a_cpu_runs_and_does_not_warn(caplog):
    fn = lambda x: torch.relu(x) * 2  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="kiln"):
        compiled = kiln.compile(fn, mode="reduce-overhead")
        x = torch.randn(10)
        torch.testing.assert_close(compiled(x), fn(x))
    assert "not implemented" not in caplog.text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_cuda_graph_replays_with_the_right_results():
    w, b = torch.randn(8, 4, device="cuda"), torch.randn(4, device="cuda")
    runner = cudagraphs.CudaGraphRunner(graph_function, "g0")
    for _ in range(5):
        x = torch.randn(5, 8, device="cuda")
        check(runner([w, b, x, 2.0]), w, b, x, 2.0)
    assert runner.replays == 4


def test_a_replay_raises_when_a_kernel_flagged_an_out_of_range_index():
    # A replay runs no wrapper code, so the runner runs the kernels' index-error check itself (on a
    # CPU flag, read at once: the call that gathered raises).
    from kiln.runtime.support import IndexStatus

    status = torch.zeros(1, dtype=torch.int32)

    def graph(args):  # its kernel flags a negative index, as check_index does (the wrapper's read skipped)
        (x,) = args
        args.clear()
        status.fill_(int(bool((x < 0).any())))
        return [x * 2]

    graph.index_status = [IndexStatus(status, "kernel k0")]
    runner = runner_for(graph)
    for _ in range(3):  # warm up, record, replay
        x = torch.rand(4)
        torch.testing.assert_close(runner([x])[0], x * 2)
    with pytest.raises(IndexError, match="out of range"):
        runner([-torch.rand(4)])
    assert runner.replays == 3 and status.item() == 0  # reset: the next replay is clean
    x = torch.rand(4)
    torch.testing.assert_close(runner([x])[0], x * 2)


# ---- the default mode: results as fresh as eager's ("preserve") -------------------------------------------------


class SharedPoolRecording(RerunRecording):
    """A stand-in for recordings that share one memory pool: a replay writes garbage over the output buffers
    of every other recording (on a GPU its intermediates may sit in buffers the pool gave them) before
    writing its own outputs."""

    made: list = []

    def __init__(self, run, stream, pool=None):
        super().__init__(run, stream, pool)
        self.made.append(self)

    def replay(self):
        for other in self.made:
            for static in other.outputs:
                static.fill_(float("nan"))
        super().replay()


class StandInStream:
    """A CUDA stream as the pool's ordering sees it: which streams it was made to wait for."""

    def __init__(self, name):
        self.name, self.waited_for = name, []

    def wait_stream(self, other):
        self.waited_for.append(other.name)


def preserving_runner(function=graph_function, capture=RerunRecording, pool=None):
    pool = pool or cudagraphs.PreservingPool(current_stream=lambda: StandInStream("main"))
    return cudagraphs.CudaGraphRunner(function, "g0", capture=capture, stream_context=lambda stream: contextlib.nullcontext(),
                                      preserve=pool, is_capturing=lambda: False)


def _on_graph_memory(results, runner) -> bool:
    buffers = {value.untyped_storage().data_ptr() for kind, value in runner.outputs if kind == "pool"}
    return any(result.untyped_storage().data_ptr() in buffers for result in results)


def test_default_mode_results_stay_valid_in_an_out_equals_model_loop():
    w, b = torch.nn.Parameter(torch.randn(8, 4)), torch.randn(4)
    runner = preserving_runner()
    kept = []
    out = None
    for x in inputs(6):
        out = runner([w, b, x, 2.0])  # the previous `out` alive during the call
        assert not _on_graph_memory(out, runner)
        kept.append((out, out[0][1:3], x))  # every result, and a view of one, kept
    assert runner.replays == 5 and runner.plain_calls == 0 and runner.recordings == 1
    for results, view, x in kept:
        check(results, w, b, x, 2.0)
        torch.testing.assert_close(view, (x @ w + b)[1:3])


def test_default_mode_results_that_share_a_buffer_still_share_memory():
    def function(args):
        w, x = args
        args.clear()
        y = x @ w
        return [y, y[1:], y.t()]

    w = torch.randn(8, 4)
    runner = preserving_runner(function)
    for x in inputs(4):
        y, tail, transposed = runner([w, x])
        assert tail.untyped_storage().data_ptr() == y.untyped_storage().data_ptr() == transposed.data_ptr()
        y.zero_()  # a write through one shows through the others, as in eager
        assert not tail.any() and not transposed.any()
    assert runner.replays == 3


def test_default_mode_replays_with_a_result_fed_back_as_an_input():
    def function(args):  # a cache-like step: the state it returns is its next input
        state, x = args
        args.clear()
        return [state * 0.5 + x]

    runner = preserving_runner(function)
    state, history = torch.zeros(4), []
    for x in [torch.randn(4) for _ in range(6)]:
        want = state * 0.5 + x
        (state,) = runner([state, x])
        history.append((state, want))
    for got, want in history:
        torch.testing.assert_close(got, want)
    assert runner.plain_calls == 0 and runner.replays == 5


def test_default_mode_graphs_sharing_a_pool_never_overwrite_each_others_results():
    SharedPoolRecording.made = []
    pool = cudagraphs.PreservingPool(current_stream=lambda: StandInStream("main"))
    first = preserving_runner(capture=SharedPoolRecording, pool=pool)
    second = preserving_runner(capture=SharedPoolRecording, pool=pool)
    w, b = torch.randn(8, 4), torch.randn(4)
    xs = inputs(10)
    kept = []
    for runner, x in zip([first, second] * 5, xs):
        kept.append((runner([w, b, x, 1.0]), x))
    assert first.replays == second.replays == 4
    for results, x in kept:
        check(results, w, b, x, 1.0)


def test_default_mode_a_moved_parameter_turns_the_graph_off_at_info(caplog):
    w, b = torch.nn.Parameter(torch.randn(8, 4)), torch.randn(4)
    runner = preserving_runner()
    kept = []
    for x in inputs(3):
        kept.append((runner([w, b, x, 1.0]), w, x))
    w = torch.nn.Parameter(torch.randn(8, 4))  # reassigned, or a second module's weight through a reused graph
    with caplog.at_level(logging.INFO, logger="kiln"):
        for x in inputs(3):
            kept.append((runner([w, b, x, 1.0]), w, x))
    assert runner.disabled_reason.startswith("parameters moved") and runner.recording is None
    assert "CUDA graphs off" in caplog.text and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    for results, weight, x in kept:
        check(results, weight, b, x, 1.0)


def test_default_mode_runs_plain_while_the_caller_records_a_graph_of_its_own():
    w, b = torch.randn(8, 4), torch.randn(4)
    runner = preserving_runner()
    for x in inputs(3):
        runner([w, b, x, 1.0])
    runner._caller_is_capturing = lambda: True
    x = torch.randn(5, 8)
    check(runner([w, b, x, 1.0]), w, b, x, 1.0)
    assert runner.plain_calls == 1 and runner.replays == 2  # the record call's and the third's; none while capturing


def test_wrap_in_the_default_mode_takes_static_cuda_inference_graphs_only(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(cudagraphs, "preserving_pool", lambda device: cudagraphs.PreservingPool(current_stream=object))
    with FakeTensorMode():
        cuda_inputs = [torch.empty(2, device="cuda"), torch.empty(3, device="cuda")]
    compiled = object()
    runner = cudagraphs.wrap(compiled, "g", cuda_inputs, inference=True, preserve=True)
    assert isinstance(runner, cudagraphs.CudaGraphRunner) and runner.preserve is not None
    assert runner._invalidate is None  # the preserve policy copies results; it never invalidates them
    assert cudagraphs.wrap(compiled, "g", cuda_inputs + [4], inference=True, preserve=True) is compiled  # a size input
    assert cudagraphs.wrap(compiled, "g", cuda_inputs, inference=False, preserve=True) is compiled
    assert cudagraphs.wrap(compiled, "g", [torch.randn(2)], inference=True, preserve=True) is compiled
    # where copying the results costs more than the launches a replay spares: no graph
    assert isinstance(cudagraphs.wrap(compiled, "g", cuda_inputs, inference=True, preserve=True, launches=100,
                                      output_bytes=100 << 20), cudagraphs.CudaGraphRunner)
    assert cudagraphs.wrap(compiled, "g", cuda_inputs, inference=True, preserve=True, launches=1,
                           output_bytes=1024) is compiled
    assert cudagraphs.wrap(compiled, "g", cuda_inputs, inference=True, preserve=True, launches=10,
                           output_bytes=512 << 20) is compiled


def test_the_default_mode_wraps_cuda_graphs_by_config(monkeypatch):
    from kiln import backend

    calls = []
    monkeypatch.setattr(cudagraphs, "wrap",
                        lambda compiled, name, inputs, inference, preserve=False, **_: calls.append(preserve) or compiled)
    compiled = object()
    assert backend._with_cuda_graphs(compiled, "g", [], "default", inference=True) is compiled
    assert backend._with_cuda_graphs(compiled, "g", [], "reduce-overhead", inference=True) is compiled
    with kiln.config.patch(default_cuda_graphs=False):
        backend._with_cuda_graphs(compiled, "g", [], "default", inference=True)
    backend._with_cuda_graphs(compiled, "g", [], "max-autotune-no-cudagraphs", inference=True)
    assert calls == [True, False]


def test_output_bytes_reads_static_sizes_and_never_guards_a_symbolic_one():
    # int() on a symbolic size would guard it to its value: every new size would compile again
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from kiln import backend

    shape_env = ShapeEnv()
    with FakeTensorMode(shape_env=shape_env):
        static = torch.empty(3, 5)
    graph = torch.fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    graph.output((a, b))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    a.meta["val"], b.meta["val"] = static, static
    assert backend._output_bytes(gm) == 2 * 15 * 4
    size = shape_env.create_symintnode(shape_env.create_symbol(4, ConstantSource("rows")), hint=4)
    with FakeTensorMode(shape_env=shape_env):
        b.meta["val"] = torch.empty(size, 5)
    guards_before = len(shape_env.guards)
    assert backend._output_bytes(gm) is None
    assert len(shape_env.guards) == guards_before


def test_default_mode_a_call_from_another_thread_runs_without_the_graph():
    # eager's calls are safe from any thread; a recording's static buffers are shared, so only the pool's thread
    # replays
    import threading

    w, b = torch.randn(8, 4), torch.randn(4)
    runner = preserving_runner()
    for x in inputs(3):
        runner([w, b, x, 1.0])
    results = {}
    x = torch.randn(5, 8)
    worker = threading.Thread(target=lambda: results.setdefault("out", runner([w, b, x, 1.0])))
    worker.start()
    worker.join()
    check(results["out"], w, b, x, 1.0)
    assert runner.plain_calls == 1 and runner.replays == 2


def test_default_mode_a_replay_on_another_stream_waits_for_the_last_one():
    # the previous replay (on its stream) may still read the static inputs this call overwrites, or have its
    # results still to copy out of buffers this replay writes
    streams = {"now": StandInStream("s1")}
    pool = cudagraphs.PreservingPool(current_stream=lambda: streams["now"])
    runner = preserving_runner(pool=pool)
    w, b = torch.randn(8, 4), torch.randn(4)
    xs = inputs(5)
    for x in xs[:3]:  # warm-up, record (and its replay), replay: all on s1
        runner([w, b, x, 1.0])
    assert streams["now"].waited_for == []
    s2 = streams["now"] = StandInStream("s2")
    check(runner([w, b, xs[3], 1.0]), w, b, xs[3], 1.0)
    check(runner([w, b, xs[4], 1.0]), w, b, xs[4], 1.0)
    assert s2.waited_for == ["s1"]  # once: the second replay on s2 follows the first in stream order


@pytest.mark.parametrize("preserve", [False, True])
def test_an_expanded_input_is_copied_into_its_buffer_element_by_element(preserve):
    # copy_ into a buffer with a stride-0 dim raises (its elements overlap): eager takes such an input, so must a
    # recording (a mask or a bias expanded by the caller, a new tensor each call)
    def function(args):
        w, mask = args
        args.clear()
        return [w * mask, mask.sum(0)]

    runner = preserving_runner(function) if preserve else runner_for(function)
    w = torch.randn(6, 4)
    for _ in range(5):
        row = torch.randn(4)
        mask = row.expand(6, 4)  # stride (0, 1)
        got = runner([w, mask])
        torch.testing.assert_close(got[0], w * mask)
        torch.testing.assert_close(got[1], mask.sum(0))
        del got
    assert runner.replays == 4 and runner.plain_calls == 0 and runner.broadcast == {1}


def test_an_input_whose_rows_overlap_is_copied_and_replays_right():
    # rows that share elements without a stride of 0: torch cannot tell the overlap (copy_ goes ahead, writing
    # each shared location with the same value), so the buffer holds what the input holds
    def function(args):
        (x,) = args
        args.clear()
        return [x * 2]

    runner = runner_for(function)
    for _ in range(4):
        x = torch.randn(8).as_strided((3, 4), (2, 1))
        torch.testing.assert_close(runner([x])[0], x * 2)
    assert runner.replays == 3 and runner.plain_calls == 0


def test_an_input_that_cannot_be_copied_into_its_buffer_turns_the_graph_off(monkeypatch, caplog):
    monkeypatch.setattr(cudagraphs, "_held_part", lambda tensor: (_ for _ in ()).throw(RuntimeError("overlap")))
    def function(args):
        w, mask = args
        args.clear()
        return [w * mask]

    runner = runner_for(function)
    w = torch.randn(6, 4)
    with caplog.at_level(logging.WARNING, logger="kiln"):
        for _ in range(4):
            mask = torch.randn(4).expand(6, 4)
            torch.testing.assert_close(runner([w, mask])[0], w * mask)
    assert runner.disabled_reason == "input 1 cannot be copied into a buffer of its layout: overlap"
    assert runner.plain_calls == 3 and runner.recording is None


# ---- cuBLAS workspaces and the side stream ------------------------------------------------------------------


class WorkspaceEvents:
    """Stands in for torch's cuBLAS workspace release, recording when the runner asks for it: between
    the runner's own steps (the warm-up, the capture), never on a replay."""

    def __init__(self):
        self.log: list = []

    def release(self):
        self.log.append("release")

    def capture(self, run, stream, pool=None):
        self.log.append("capture")
        return RerunRecording(run, stream, pool)

    def function(self, args):
        self.log.append("run")
        return graph_function(args)


@pytest.mark.parametrize("preserve", [False, True])
def test_cublas_workspaces_are_released_around_the_warm_up_and_the_capture_only(preserve):
    events = WorkspaceEvents()
    options = dict(capture=events.capture, stream_context=lambda stream: contextlib.nullcontext(),
                   release_workspaces=events.release)
    if preserve:
        pool = cudagraphs.PreservingPool(current_stream=lambda: StandInStream("main"))
        runner = cudagraphs.CudaGraphRunner(events.function, "g0", preserve=pool, is_capturing=lambda: False, **options)
    else:
        runner = cudagraphs.CudaGraphRunner(events.function, "g0", make_stream=lambda: None, invalidate=None,
                                            **options)
    w, b, scale = torch.randn(8, 3), torch.randn(3), 0.5
    for step, x in enumerate(inputs(4)):
        results = runner([w, b, x, scale])
        check(results, w, b, x, scale)
        del results
        if step == 0:
            assert events.log == ["release", "run", "release"]  # the warm-up, between two releases
        elif step == 1:  # the capture (the stand-in runs the function to record it), between two releases
            assert events.log[3:] == ["release", "capture", "run", "release", "run"]
    assert events.log.count("release") == 4  # the two replays released nothing
    assert runner.replays == 3


def test_the_runner_releases_torchs_workspaces_by_default_and_hands_the_choice_to_other_sizes(monkeypatch):
    released = []
    monkeypatch.setattr(cudagraphs._torch, "cublas_workspace_releaser", lambda: lambda: released.append(1))
    runner = cudagraphs.CudaGraphRunner(graph_function, "g0", capture=RerunRecording, make_stream=lambda: None,
                                        stream_context=lambda stream: contextlib.nullcontext(), invalidate=None)
    assert runner._release_workspaces is not None and runner._options["release_workspaces"] is runner._release_workspaces
    w, b, x = torch.randn(8, 3), torch.randn(3), torch.randn(5, 8)
    runner([w, b, x, 0.5])
    assert len(released) == 2


def test_runners_share_one_side_stream_per_device_and_thread(monkeypatch):
    made = []

    class Stream(StandInStream):
        def __init__(self):
            super().__init__(f"side{len(made)}")
            made.append(self)

    device = [0]
    monkeypatch.setattr(cudagraphs, "_side_streams", {})
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device[0])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: StandInStream("main"))
    first, second = cudagraphs.side_stream(), cudagraphs.side_stream()
    assert first is second and len(made) == 1
    assert first.waited_for == ["main", "main"]  # ordered after the caller's stream each time it is handed out
    device[0] = 1
    assert cudagraphs.side_stream() is not first and len(made) == 2
    other = []
    import threading

    thread = threading.Thread(target=lambda: other.append(cudagraphs.side_stream()))
    thread.start()
    thread.join()
    assert other[0] is not first and len(made) == 3


def _accumulating_graph(args):
    """A boxed graph that writes its input 1 (a running total, as a batch norm's statistics): total += x.sum(0)."""
    x, total = args
    args.clear()
    total.add_(x.sum(0))
    return [x * 2]


class CaptureWritesNothing(RerunRecording):
    """As a real capture: recording runs no kernel, so the recorded inputs keep their values (RerunRecording's
    run at capture would write a written input twice: at capture and at the first replay)."""

    def __init__(self, run, stream, pool=None):
        inputs = [value for value in run.args[1] if isinstance(value, torch.Tensor)]
        saved = [value.clone() for value in inputs]
        super().__init__(run, stream, pool)
        for value, before in zip(inputs, saved):
            value.copy_(before)


@pytest.mark.parametrize("mutated", [(1,), ()])
def test_an_input_the_graph_writes_is_read_in_place_even_where_it_moved(mutated):
    """kiln/aot/mutations.py names the written inputs: never copied into a buffer of the runner's, where a replay's
    write would not reach the caller's tensor. A total that moves (a new tensor each call) records again, and each
    call's write lands; without `mutated` (the negative case) the moved total is copied in and its write is lost."""
    runner = runner_for(_accumulating_graph, capture=CaptureWritesNothing, mutated=mutated)
    totals, lost = [], 0
    for index in range(6):
        x = torch.randn(3, 4)
        total = torch.zeros(4) if index % 2 else (totals[-1] if totals else torch.zeros(4))
        before = total.clone()
        (result,) = runner([x, total])
        torch.testing.assert_close(result, x * 2)
        lost += not torch.allclose(total, before + x.sum(0))
        totals.append(total)
        del result
    if mutated:
        assert lost == 0 and 1 not in runner.moved and runner.copied == []
    else:
        assert lost > 0  # what the runner did before it knew which inputs the graph writes
