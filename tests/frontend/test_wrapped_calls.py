"""kiln/frontend/wrapped_calls.py: a decorator's wrapper calls a function that breaks, from where the wrapper's
frame cannot break (inside an `except` clause's body).

The wrapper's frame runs in Python and the function it calls through its closure cell is compiled on its
own, breaking in turn. Each test checks results and side effects against eager, and that graphs
were compiled and no frame ran eagerly. transformers' wrappers call the function inside a try block,
where the frame breaks at the call (test_graph_breaks.py); they are checked here too, with the modules.
"""
from __future__ import annotations

import functools
import os

import numpy
import pytest
import torch

import kiln
import kiln.testing
from kiln.frontend.dispatcher import Dispatcher

from tests.frontend.test_graph_breaks import _compile, _eager_frames_and_breaks

restored: list = []


def restoring(func):
    """A decorator in transformers' shape: reads the function's signature, calls it in a try block, and
    puts something back in `finally`."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        assert "x" in func.__code__.co_varnames  # the stand-in in the cell reads as the function
        try:
            return func(*args, **kwargs)
        finally:
            restored.append(len(args))
    return wrapper


def retrying(func):
    """A decorator whose call sits in an `except` clause's body, where its frame cannot break."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        assert "x" in func.__code__.co_varnames  # the stand-in in the cell reads as the function
        try:
            raise LookupError("first try")
        except LookupError:
            restored.append(len(args))
            return func(*args, **kwargs)
    return wrapper


def _breaks_inside(x, y):
    a = torch.relu(x) * y
    pid = os.getpid()  # a C function kiln does not model: a graph break
    return a.exp() + (pid > 0)


@pytest.mark.parametrize("decorator", [retrying, restoring])
def test_the_wrapper_runs_in_python_and_the_function_it_calls_is_compiled(decorator):
    """In an except clause, the wrapper runs in Python and the function it calls is compiled on its own; in a try
    block (transformers' shape), the wrapper's frame breaks at the call, which goes to the function's own
    dispatcher: either way the function breaks in turn, and the wrapper's own code runs on each call."""
    breaks_inside = decorator(_breaks_inside)
    compiled, graphs = _compile(breaks_inside)
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    restored.clear()
    report = _eager_frames_and_breaks(lambda: compiled(x, y))
    expected = _breaks_inside(x, y).clone()
    torch.testing.assert_close(compiled(x, y), expected)
    assert restored == [2, 2], "the wrapper's own code ran on each call"
    assert len(graphs) == 2 and not report.eager_frames, (graphs, report.eager_frames)
    assert report.break_count == 2  # the wrapper's, then getpid's in the function
    assert ("cannot break" in report.breaks[0].reason) == (decorator is retrying)
    assert "getpid" in report.breaks[1].reason


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    @restoring
    def forward(self, x):
        h = self.linear(x)
        if h.sum() > 0:  # a branch on data: a graph break
            h = h * 2
        return torch.tanh(h)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_module_whose_forward_is_wrapped_compiles_around_a_break(sign):
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(3, 8) * sign
    expected = block(x)
    compiled, graphs = _compile(block)
    report = _eager_frames_and_breaks(lambda: compiled(x))
    torch.testing.assert_close(compiled(x), expected)
    assert len(graphs) >= 2 and report.break_count >= 2 and not report.eager_frames, report


def test_a_module_with_hooks_is_called_as_python_calls_it():
    """The copy of forward skips nn.Module's call machinery: a hook added after the trace still runs."""
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(3, 8)
    compiled = Dispatcher(block, lambda gm, _: gm.forward)
    compiled(x)
    calls = []
    handle = block.register_forward_hook(lambda module, args, output: calls.append(1))
    try:
        torch.testing.assert_close(compiled(x), block(x))
    finally:
        handle.remove()
    assert calls == [1, 1]


def reassigning(func):
    def wrapper(x):
        nonlocal func
        try:
            raise LookupError("first try")
        except LookupError:
            func = func  # the wrapper assigns its cell: no copy is made
            return func(x)
    return wrapper


@reassigning
def breaks_too(x):
    return x + (os.getpid() > 0)


def test_a_wrapper_that_assigns_its_cell_runs_eagerly():
    compiled, graphs = _compile(breaks_too)
    x = torch.randn(3)
    report = _eager_frames_and_breaks(lambda: compiled(x))
    torch.testing.assert_close(compiled(x), x + 1)
    assert len(report.eager_frames) == 1 and not graphs


def test_wav2vec2_trains_in_pieces_around_its_breaks():
    """Wav2Vec2 (default config, small) in train mode sets requires_grad on a view of its input inside
    a forward wrapped twice by transformers: the breaks go into the calls, and forward and backward match
    eager's (dropout and the time masks drawn alike)."""
    transformers = pytest.importorskip("transformers")
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    config = transformers.Wav2Vec2Config(conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3),
                                         num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, **small)
    torch.manual_seed(0)
    model = transformers.Wav2Vec2Model(config).train()
    reference = __import__("copy").deepcopy(model)
    x = torch.randn(2, 800)

    def step(module):
        torch.manual_seed(1234)
        numpy.random.seed(1234)
        output = module(input_values=x).last_hidden_state
        output.float().sum().backward()
        return output

    with kiln.testing.philox_draws():  # eager draws kiln's dropout masks
        expected = step(reference)
    outputs = []
    report = _eager_frames_and_breaks(lambda: outputs.append(step(kiln.compile(model))))
    torch.testing.assert_close(outputs[0], expected, rtol=1e-3, atol=1e-4)
    assert report.graph_count >= 3, report.graph_count
    # only the time masks' drawing with numpy (_compute_mask_indices) runs eagerly
    assert [reason for frame in report.eager_frames if "cython" not in (reason := frame.eager_reason)] == []
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        assert (got.grad is None) == (want.grad is None), name
        if want.grad is not None:
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-3, atol=1e-4, msg=name)


# --------------------------------------------------------------------------- hooks kiln cannot trace (ForwardCompiled)

class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x, *, scale=1.0):
        return torch.relu(self.linear(x)) * scale


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = _Block(), _Block()

    def forward(self, x):
        return self.second(self.first(x) + 1, scale=2.0).sum(-1)


def _hook_kwargs(calls):
    """A forward pre-hook registered with kwargs, as FSDP2 registers its own: it sees and may change them."""
    def hook(module, args, kwargs):
        calls.append(("pre", type(module).__name__, sorted(kwargs)))
        return (args[0] * 3,), kwargs
    return hook


@pytest.mark.parametrize("where", ["root", "child"])
def test_hooks_registered_with_kwargs_run_in_python_and_the_forward_is_compiled(where):
    """FSDP2's shape: the module's call runs in Python (hooks with kwargs, a backward hook), its forward is
    compiled on its own. Results, gradients and the hooks' calls are eager's; no frame runs eagerly."""
    torch.manual_seed(0)
    model, reference = _Model(), _Model()
    reference.load_state_dict(model.state_dict())
    calls, expected_calls = [], []
    for module, log in ((model, calls), (reference, expected_calls)):
        hooked = module if where == "root" else module.second
        hooked.register_forward_pre_hook(_hook_kwargs(log), with_kwargs=True)
        hooked.register_full_backward_hook(lambda module, grad_in, grad_out, log=log: log.append(("backward",)))
    compiled, graphs = _compile(model)
    x = torch.randn(3, 4)
    for _ in range(2):
        report = _eager_frames_and_breaks(lambda: compiled(x).sum().backward())
        reference(x).sum().backward()
        assert not report.eager_frames, report
    assert calls == expected_calls and len(calls) == 4
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad)
    assert graphs  # the forward (and, for a child, the model's frame around its call) compiled
    assert "forward" not in model.__dict__ and "forward" not in model.second.__dict__  # left as found
    assert len(compiled.forward_dispatchers) == (1 if where == "root" else 0)


def test_hooks_with_kwargs_around_an_instances_own_bound_forward():
    """accelerate patches `model.forward` with a bound method of its own; with FSDP2-style hooks the call runs in
    Python and that forward is the one compiled."""
    import types

    torch.manual_seed(0)
    model = _Block()
    calls = []
    model.register_forward_pre_hook(_hook_kwargs(calls), with_kwargs=True)

    def patched(self, x, *, scale=1.0):
        return _Block.forward(self, x, scale=scale) - 1

    model.forward = types.MethodType(patched, model)
    compiled, graphs = _compile(model)
    x = torch.randn(3, 4)
    report = _eager_frames_and_breaks(lambda: compiled(x))
    torch.testing.assert_close(compiled(x), model(x))
    assert not report.eager_frames and graphs and len(calls) == 3
    assert [dispatcher.fn for dispatcher in compiled.forward_dispatchers] == [patched]
    assert model.__dict__["forward"].__func__ is patched  # left as found
