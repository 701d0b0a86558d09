"""CUDA graphs for a training step under mode="reduce-overhead" (kiln/runtime/cudagraphs.py: `saved_from`,
`block_results`, `warm_up_calls`; kiln/aot `training_role`), driven on a CPU with the stand-in recordings of
tests/runtime/test_cudagraphs.py: a forward's saved tensors are never invalidated and block its replay while held, a
backward reads them in place and a gradient kept alive blocks its replay, and whole training loops through
AOTAutograd's runtime match eager's. The GPU check is benchmarks/gpu_smoke.py `check_training_cuda_graphs`.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import logging

import pytest
import torch

import kiln
from kiln.runtime import cudagraphs
from tests.runtime.test_cudagraphs import RerunRecording, StandInInvalidator, inputs, runner_for


def forward_function(args):
    """A training forward as AOTAutograd partitions it: the user's outputs (y, a loss), then the tensors saved for
    the backward (y again, the same buffer, and h), from position 2 on."""
    w, x = args
    args.clear()
    h = x @ w
    y = torch.tanh(h)
    return [y, y.sum(), y, h * 3]


def forward_expected(w, x):
    h = x @ w
    y = torch.tanh(h)
    return [y, y.sum(), y, h * 3]


def check_all(results, want):
    for got, expected_value in zip(results, want, strict=True):
        torch.testing.assert_close(got, expected_value)


def test_a_training_forwards_saved_tensors_are_never_invalidated_and_block_the_replay_while_held(caplog):
    invalidator = StandInInvalidator()
    w = torch.nn.Parameter(torch.randn(8, 4))
    xs = inputs(7)
    runner = runner_for(forward_function, invalidate=invalidator, saved_from=2)
    runner([w, xs[0]])  # warm-up; its backward runs (the saved tensors go)
    out = runner([w, xs[1]])  # recorded
    check_all(out, forward_expected(w, xs[1]))
    user, saved = out[:2], out[2:]
    # y is the user's and saved: the user's is a copy, so that writing into it (or invalidating it) never
    # reaches the tensor the backward reads, which eager's autograd would have caught by its version counter
    assert user[0].data_ptr() != saved[0].data_ptr()
    user[0].add_(1.0)
    check_all(saved, forward_expected(w, xs[1])[2:])
    del out, saved  # the backward ran
    out = runner([w, xs[2]])  # the previous user results alive: invalidated (the copy needs not), and it replays
    invalidated = [cdata for cdata, _ in invalidator.invalidated]
    assert user[1].untyped_storage()._cdata in invalidated and runner.replays == 2
    assert user[0].untyped_storage()._cdata not in invalidated
    torch.testing.assert_close(user[0], forward_expected(w, xs[1])[0] + 1.0)
    user, saved = out[:2], out[2:]  # this call's backward has not run when the next forward is called
    del out
    held = [result.untyped_storage()._cdata for result in saved]
    with caplog.at_level(logging.WARNING, logger="kiln"):
        check_all(runner([w, xs[3]]), forward_expected(w, xs[3]))  # run without the graph
        check_all(runner([w, xs[4]]), forward_expected(w, xs[4]))
    assert runner.plain_calls == 2 and runner.replays == 2
    warnings = [record.getMessage() for record in caplog.records if "without its CUDA graph" in record.getMessage()]
    assert len(warnings) == 1 and "saved tensors are still held because its backward has not run" in warnings[0]
    check_all(saved, forward_expected(w, xs[2])[2:])  # never overwritten
    assert not set(held) & {cdata for cdata, _ in invalidator.invalidated}
    del saved  # the backward ran: the next call replays
    check_all(runner([w, xs[5]]), forward_expected(w, xs[5]))
    assert runner.replays == 3 and runner.plain_calls == 2 and runner.recordings == 1
    assert not set(held) & {cdata for cdata, _ in invalidator.invalidated}


def test_saved_tensors_held_keep_the_recording_when_a_parameter_moves_and_go_with_the_runner():
    # recording again would free the memory a pending backward reads: the call runs without the graph instead
    invalidator = StandInInvalidator()
    w = torch.nn.Parameter(torch.randn(8, 4))
    xs = inputs(5)
    runner = runner_for(forward_function, invalidate=invalidator, saved_from=2)
    runner([w, xs[0]])
    saved = runner([w, xs[1]])[2:]  # recorded; its backward pending
    w = torch.nn.Parameter(torch.randn(8, 4))  # reassigned
    check_all(runner([w, xs[2]]), forward_expected(w, xs[2]))
    assert runner.recording is not None and runner.recordings == 1 and not invalidator.invalidated
    del saved
    runner([w, xs[3]])  # the moved parameter: warm up again
    saved = runner([w, xs[4]])[2:]  # recorded again
    assert runner.recordings == 2
    handles = {result.untyped_storage()._cdata for result in saved}
    del runner  # the graph's memory goes with it: the saved tensors still held are invalidated
    gc.collect()  # should a reference cycle hold the runner
    freed = {cdata for cdata, message in invalidator.invalidated if "saved for the backward" in message}
    assert handles <= freed


def backward_function(args):
    """A training backward: the forward's saved tensors (x, and y = tanh(x @ w + b)), then the incoming gradient;
    its results are the gradients of w and b."""
    x, y, grad_y = args
    args.clear()
    grad_h = grad_y * (1 - y * y)
    return [x.t() @ grad_h, grad_h.sum(0)]


def backward_expected(x, y, grad_y):
    grad_h = grad_y * (1 - y * y)
    return [x.t() @ grad_h, grad_h.sum(0)]


def test_a_backward_warms_up_twice_reads_saved_tensors_in_place_and_a_kept_gradient_blocks_the_replay(caplog):
    invalidator = StandInInvalidator()
    runner = runner_for(backward_function, invalidate=invalidator, block_results=True, warm_up_calls=2)
    # the forward's saved tensors: new tensors at its first (plain) call, then its graph's buffers, at the same
    # addresses each replay, holding each step's values
    graph_x, graph_y = torch.empty(5, 8), torch.empty(5, 4)
    grads_y = [torch.randn(5, 4) for _ in range(6)]  # the incoming gradients: new tensors each step

    def step(call):
        x, y = torch.randn(5, 8), torch.tanh(torch.randn(5, 4))
        if call > 0:
            graph_x.copy_(x)
            graph_y.copy_(y)
            x, y = graph_x, graph_y
        want = backward_expected(x.clone(), y.clone(), grads_y[call])
        got = runner([x, y, grads_y[call]])
        check_all(got, want)
        return got, want

    step(0)  # warm-up, with the plain forward's tensors
    step(1)  # warm-up, with the forward's graph's: these addresses decide what is read in place
    assert runner.recording is None and runner.first_call[:2] == [graph_x.data_ptr(), graph_y.data_ptr()]
    step(2)  # recorded; its gradients dropped (zero_grad(set_to_none=True))
    assert runner.recordings == 1 and runner.replays == 1
    assert [position for position, _ in runner.in_place] == [0, 1]  # the saved tensors, never copied
    assert [position for position, _ in runner.copied] == [2]
    kept, kept_want = step(3)  # replayed; gradients kept to accumulate into
    assert runner.replays == 2 and runner.plain_calls == 0
    with caplog.at_level(logging.WARNING, logger="kiln"):
        step(4)  # must not overwrite them: runs without the graph
    assert runner.plain_calls == 1 and runner.replays == 2
    assert "gradient of the previous call is still referenced" in caplog.text and "set_to_none=True" in caplog.text
    check_all(kept, kept_want)
    assert not invalidator.invalidated  # a backward's results are never invalidated
    del kept
    step(5)  # released: replays
    assert runner.replays == 3 and runner.plain_calls == 1 and runner.recordings == 1


@pytest.mark.parametrize("fresh, replays, recordings", [((2,), 5, 1), ((), 3, 2)])
def test_a_backwards_tangents_are_copied_in_even_where_their_address_repeats(fresh, replays, recordings):
    # The incoming gradient is a new tensor each step, and the allocator may give it the last one's address: the
    # same tensor at the second warm-up and the recording here. Kept in place (no `fresh`, as before), its next
    # move warmed up twice and recorded again: 2 replays lost over 7 steps (on the GPU, Llama's training in
    # benchmarks/gpu_smoke.py replayed 8 times of 9). Copied in as a tangent, every call from the third replays.
    runner = runner_for(backward_function, invalidate=StandInInvalidator(), block_results=True, warm_up_calls=2,
                        fresh=fresh)
    x, y = torch.randn(5, 8), torch.tanh(torch.randn(5, 4))
    repeated = torch.randn(5, 4)
    for grad_y in [torch.randn(5, 4), repeated, repeated] + [torch.randn(5, 4) for _ in range(4)]:
        check_all(runner([x, y, grad_y]), backward_expected(x, y, grad_y))
    assert (runner.replays, runner.recordings, runner.plain_calls) == (replays, recordings, 0)
    assert [position for position, _ in runner.copied] == [2]


def test_other_sizes_get_runners_with_the_same_training_options():
    def function(args):  # a backward of a shape-generic graph: its size (a non-tensor input) first
        rows, x, grad = args
        args.clear()
        return [x[:rows].t() @ grad[:rows]]

    runner = runner_for(function, invalidate=StandInInvalidator(), max_shapes=4, block_results=True, warm_up_calls=2)
    x, grad = torch.randn(5, 8), torch.randn(5, 4)
    for rows in (5, 3, 3, 3):
        torch.testing.assert_close(runner([rows, x, grad])[0], x[:rows].t() @ grad[:rows])
    other = runner.shapes[(3,)]
    assert other.block_results and other.warm_up_calls == 2 and other.saved_from is None
    assert other.recordings == 1 and other.replays == 1  # two warm-ups, then recorded


class TwoOutputs(torch.nn.Module):
    """Two outputs, and a batch norm whose three buffers (running mean, variance, batch count) the forward
    writes in the graph (kiln/aot/mutations.py): its outputs are the two, the user's part, then the saved tensors."""

    def __init__(self):
        super().__init__()
        self.first, self.norm, self.second = torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)

    def forward(self, x):
        hidden = torch.tanh(self.norm(self.first(x)))
        return self.second(hidden), hidden.sum()


def test_a_training_steps_forward_and_backward_reach_wrap_with_their_parts(monkeypatch):
    wrapped = []
    wrap = cudagraphs.wrap

    def recording_wrap(compiled, name, example_inputs, *, inference, **part):
        wrapped.append((inference, part, len(example_inputs)))
        return wrap(compiled, name, example_inputs, inference=inference, **part)  # CPU inputs: no runner

    monkeypatch.setattr(cudagraphs, "wrap", recording_wrap)
    torch.manual_seed(0)
    model = TwoOutputs()
    reference = TwoOutputs()
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, mode="reduce-overhead")
    for _ in range(2):
        x = torch.randn(3, 4)
        for module in (compiled, reference):
            out, total = module(x)
            (out.sum() + total).backward()
    (forward_part, (_, backward_part, backward_inputs)) = wrapped
    # two outputs and the saved tensors; the norm's running statistics (inputs 3, 4, 5) are written in the graph
    assert forward_part[:2] == (False, {"saved_from": 2, "mutated": (3, 4, 5)})
    # the backward's last two inputs are the gradients of the two outputs: copied in, never read in place
    assert backward_part == {"backward": True, "tangents": (backward_inputs - 2, backward_inputs - 1), "mutated": ()}
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-4)  # float32, summed in another order


class ByAddressRecording(RerunRecording):
    """As a CUDA graph, it holds none of the inputs it was recorded with: its reruns read them through storage
    objects over their memory that do not own it (RerunRecording's `run` holds them, which would keep a forward's
    saved tensors alive after their backward, as no CUDA graph does). Parameters are read as they are. As a CUDA
    graph's capture runs no kernel, the inputs keep the values they had before it: a graph that writes its inputs
    (batch norm's running statistics, kiln/aot/mutations.py) writes them once, at the replay."""

    def __init__(self, run, stream, pool=None):
        compiled, static_args = run.args  # functools.partial(_run_on, compiled, static_args)
        before = [(value, value.detach().clone()) for value in static_args if isinstance(value, torch.Tensor)]
        self.outputs = run()
        with torch.no_grad():
            for value, saved in before:
                value.copy_(saved)
        by_address = [cudagraphs._torch.tensor_on(cudagraphs._torch.storage_alias(value), value)
                      if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) else value
                      for value in static_args]
        self.run = lambda: list(compiled(list(by_address)))


class StandInRunner(cudagraphs.CudaGraphRunner):
    """The runner wrap() builds, driven on a CPU: the stand-in recording and invalidator, no streams."""

    def __init__(self, compiled, name, **options):
        options = {"capture": ByAddressRecording, "make_stream": lambda: None, "invalidate": StandInInvalidator(),
                   "stream_context": lambda stream: contextlib.nullcontext(), "release_workspaces": None, **options}
        super().__init__(compiled, name, **options)


def test_a_training_loop_replays_its_forward_and_backward_and_matches_eager(monkeypatch):
    # AOTAutograd's own runtime around the runners: it drops the saved tensors as the backward runs, and the
    # optimizer's zero_grad(set_to_none=True) drops the gradients, so the forward replays from its second call
    # and the backward from its third
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        cuda_inputs = [torch.empty(1, device="cuda")]
    runners = {}
    wrap = cudagraphs.wrap

    def wrap_as_on_cuda(compiled, name, example_inputs, *, inference, **part):
        runners["backward" if part.get("backward") else "forward"] = runner = wrap(
            compiled, name, cuda_inputs, inference=inference, **part)
        return runner

    monkeypatch.setattr(cudagraphs, "CudaGraphRunner", StandInRunner)
    monkeypatch.setattr(cudagraphs, "wrap", wrap_as_on_cuda)
    torch.manual_seed(0)
    # the input goes through tanh first, so that every activation saved is the forward's graph's (a saved input
    # would be a copy, whose address malloc may repeat or not); each step's incoming gradient is a tensor of its own
    model = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, mode="reduce-overhead")
    optimizer, reference_optimizer = (torch.optim.SGD(module.parameters(), lr=0.1) for module in (model, reference))
    grads = [torch.randn(5, 2) for _ in range(8)]

    def step(module, optimizer, x, grad, accumulate=False):
        if not accumulate:
            optimizer.zero_grad(set_to_none=True)
        out = module(x)
        out.backward(grad)
        if not accumulate:
            optimizer.step()
        return out.detach().clone()

    def steps(xs, grads, accumulate=False):
        for x, grad in zip(xs, grads, strict=True):
            torch.testing.assert_close(step(compiled, optimizer, x, grad, accumulate),
                                       step(reference, reference_optimizer, x, grad, accumulate))

    steps(inputs(6), grads[:6])
    forward, backward = runners["forward"], runners["backward"]
    assert forward.replays == 5 and backward.replays == 4 and forward.plain_calls == backward.plain_calls == 0
    assert forward.recordings == backward.recordings == 1
    saved = {value.data_ptr() for kind, value in forward.outputs[forward.saved_from:] if kind == "pool"}
    assert saved and saved <= {address for _, address in backward.in_place}  # read where the forward wrote them
    steps(inputs(2), grads[6:], accumulate=True)  # gradients kept to accumulate into: not overwritten
    assert backward.plain_calls == 2 and backward.replays == 4  # .grad holds the last replay's gradients
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad)
    assert not backward._invalidate.invalidated


def test_a_conv_nets_training_with_batch_norm_statistics_replays_and_matches_eager(monkeypatch):
    # A forward that also writes its inputs (batch norm's running statistics, kept in the graph: one _foreach_copy_,
    # kiln/aot/mutations.py), a loss computed outside the graph and kept alive into the next step, as
    # benchmarks/gpu_smoke.py's ResNet-18 training check does on the GPU: every step's loss, gradients and
    # statistics are eager's
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        cuda_inputs = [torch.empty(1, device="cuda")]
    runners = []
    wrap = cudagraphs.wrap
    monkeypatch.setattr(cudagraphs, "CudaGraphRunner", StandInRunner)
    monkeypatch.setattr(cudagraphs, "wrap", lambda compiled, name, example_inputs, *, inference, **part: (
        runners.append(wrap(compiled, name, cuda_inputs, inference=inference, **part)) or runners[-1]))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10)).train()
    eager = copy.deepcopy(model)
    compiled = kiln.compile(model, mode="reduce-overhead")
    optimizer, eager_optimizer = (torch.optim.SGD(m.parameters(), lr=1e-2) for m in (model, eager))
    loss = None
    for _ in range(6):
        x = torch.randn(4, 3, 16, 16)
        for m, o in ((model, optimizer), (eager, eager_optimizer)):
            o.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(compiled(x), torch.arange(4))  # the last step's alive meanwhile
        loss.backward()
        eager_loss = torch.nn.functional.cross_entropy(eager(x), torch.arange(4))
        eager_loss.backward()
        torch.testing.assert_close(loss.detach(), eager_loss.detach())
        for got, want in zip([*model.parameters(), *model.buffers()], [*eager.parameters(), *eager.buffers()]):
            torch.testing.assert_close(got.grad if got.grad is not None else got,
                                       want.grad if want.grad is not None else want)
        optimizer.step()
        eager_optimizer.step()
    forward, backward = runners
    assert forward.saved_from is not None and backward.block_results
    assert (forward.replays, backward.replays, forward.plain_calls, backward.plain_calls) == (5, 4, 0, 0)


def test_a_forward_whose_outputs_changed_after_the_partitioner_has_no_known_part():
    # AOTAutograd may drop effect tokens or inline saved-tensor hooks after partitioning: which outputs are
    # saved is then unknown, and the graph runs without CUDA graphs
    from kiln import aot

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output((x, x))
    forward = torch.fx.GraphModule(torch.nn.Module(), graph)
    forward.meta.update({aot.SAVED_FROM: 1, aot.FORWARD_OUTPUTS: 2})
    assert aot.training_role(forward) == {"saved_from": 1}
    forward.meta[aot.FORWARD_OUTPUTS] = 3
    assert aot.training_role(forward) == {}
    forward.meta.clear()
    assert aot.training_role(forward) == {}
    forward.meta[aot.BACKWARD] = True
    assert aot.training_role(forward) == {"backward": True, "tangents": ()}
    graph = torch.fx.Graph()  # a backward as AOTAutograd names its inputs: saved values, then tangents
    saved, tangent = graph.placeholder("mm"), graph.placeholder("tangents_1")
    graph.output((graph.call_function(torch.mul, (saved, tangent)),))
    backward = torch.fx.GraphModule(torch.nn.Module(), graph)
    backward.meta[aot.BACKWARD] = True
    assert aot.training_role(backward) == {"backward": True, "tangents": (1,)}
