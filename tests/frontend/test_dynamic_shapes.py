"""Automatic dynamic shapes in kiln's own frontend (kiln/frontend/dynamic.py).

A size that changes between calls makes the next compile symbolic in that dim; an int or
float argument that changes becomes a graph input; `dynamic=True` is symbolic from the
first compile. Each entry's guard checks the relations its trace relied on, so a later
call that breaks one recompiles, and every result is eager's. The compiling tests run the
full kiln backend on both CPU backends (C++ and Triton's interpreter), strict.
"""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

import kiln
import kiln.testing
from kiln.frontend import stats


@pytest.fixture(params=["cpp", "triton"])
def cpu_backend(request):
    """Both CPU backends, strict: a graph the backend cannot compile raises instead of running eagerly."""
    with kiln.config.patch(cpu_backend=request.param, strict=True):
        yield request.param


def assert_matches_eager(result, fn, *args):
    verdict = kiln.testing.compare(result, fn(*args))
    assert verdict, verdict.message


class Captures:
    """How many traces (compiles) ran inside the block."""

    def __enter__(self):
        self.start = stats.captures
        return self

    def __exit__(self, *exc):
        return False

    @property
    def count(self) -> int:
        return stats.captures - self.start


def dispatcher(compiled):
    """The Dispatcher behind `kiln.compile(...)` of a function or module."""
    return getattr(compiled, "_compiled_call", compiled)


def graph_inputs(entry) -> list:
    """The example values of an entry's graph placeholders."""
    return [node.meta["example_value"] for node in entry.graph_module.graph.nodes if node.op == "placeholder"]


def is_symbolic(value) -> bool:
    if isinstance(value, torch.Tensor):
        return any(isinstance(size, torch.SymInt) for size in value.shape)
    return isinstance(value, (torch.SymInt, torch.SymFloat))


class AttentionBlock(nn.Module):
    """Token embedding, pre-norm causal self-attention and an MLP, each with a residual."""

    def __init__(self, vocab: int = 100, width: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, width)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, ids):
        x = self.embed(ids)
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


def test_twenty_sequence_lengths_compile_at_most_twice(cpu_backend):
    model = AttentionBlock().eval()
    compiled = kiln.compile(model)
    with Captures() as captures, torch.no_grad():
        for length in range(2, 22):
            ids = torch.randint(0, 100, (2, length))
            assert_matches_eager(compiled(ids), model, ids)
    assert captures.count == 2
    dynamic_entry = dispatcher(compiled).entries[0]
    assert any(is_symbolic(value) for value in graph_inputs(dynamic_entry))


@kiln.config.patch(cpu_backend="cpp", strict=True)  # the Triton interpreter's backward kernels are slow
def test_training_steps_over_lengths_give_eager_gradients():
    model = AttentionBlock()
    eager = AttentionBlock()
    eager.load_state_dict(model.state_dict())
    compiled = kiln.compile(model)
    with Captures() as captures:
        for length in (3, 5, 8, 4):
            ids = torch.randint(0, 100, (2, length))
            compiled(ids).pow(2).mean().backward()
            eager(ids).pow(2).mean().backward()
            for (name, parameter), expected in zip(model.named_parameters(), eager.parameters()):
                verdict = kiln.testing.compare(parameter.grad, expected.grad)
                assert verdict, f"{name}, length {length}: {verdict.message}"
            model.zero_grad()
            eager.zero_grad()
    assert captures.count == 2


def test_a_transformers_model_compiles_twice_for_many_lengths():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    compiled = kiln.compile(model, backend="aot_eager")
    with Captures() as captures, torch.no_grad(), kiln.config.patch(strict=True):
        for length in range(2, 22):
            ids = torch.randint(0, 100, (2, length))
            verdict = kiln.testing.compare(compiled(ids).logits, model(ids).logits)
            assert verdict, verdict.message
    assert captures.count == 2


def test_dynamic_true_is_shape_generic_from_the_first_compile(cpu_backend):
    def fn(x, y):
        return torch.softmax(x * 2, -1) + y.sum(0)

    compiled = kiln.compile(fn, dynamic=True)
    with Captures() as captures:
        for rows, columns in ((3, 8), (5, 13), (2, 300), (7, 7)):
            x, y = torch.randn(rows, columns), torch.randn(4, columns)
            assert_matches_eager(compiled(x, y), fn, x, y)
    assert captures.count == 1
    x_fake, y_fake = [value for value in graph_inputs(compiled.entries[0]) if isinstance(value, torch.Tensor)]
    assert all(isinstance(size, torch.SymInt) for size in x_fake.shape)
    assert y_fake.shape[1] is x_fake.shape[1] or str(y_fake.shape[1]) == str(x_fake.shape[1])  # one symbol


def test_dynamic_true_with_sizes_the_trace_divides(cpu_backend):
    def heads(x, w):  # the width is symbolic too: the views' sizes are `s2 // 2` (torch's FloorDiv)
        batch, length, width = x.shape
        h = (x @ w).view(batch, length, 2, width // 2).transpose(1, 2)
        return nn.functional.scaled_dot_product_attention(h, h, h).transpose(1, 2).reshape(batch, length, width)

    compiled = kiln.compile(heads, dynamic=True)
    with Captures() as captures:
        for batch, length in ((2, 3), (3, 5), (2, 9)):
            x, w = torch.randn(batch, length, 8), torch.randn(8, 8)
            assert_matches_eager(compiled(x, w), heads, x, w)
    assert captures.count == 1


def test_dynamic_false_stays_static():
    compiled = kiln.compile(lambda x: x + 1, backend="eager", dynamic=False)
    with Captures() as captures:
        for length in (3, 4, 5):
            compiled(torch.randn(length))
    assert captures.count == 3
    assert not any(is_symbolic(value) for entry in compiled.entries for value in graph_inputs(entry))


def test_ints_that_change_become_graph_inputs(cpu_backend):
    def fn(x, step):
        return x * (step + 1) - step // 2, torch.arange(step) * 2

    compiled = kiln.compile(fn)
    with Captures() as captures:
        for step in (3, 4, 7, 10, 2, 5):
            x = torch.randn(4, 3)
            assert_matches_eager(compiled(x, step), fn, x, step)
    assert captures.count == 2
    assert any(isinstance(value, torch.SymInt) for value in graph_inputs(compiled.entries[0]))


def test_negative_int_arguments_floor_like_python(cpu_backend):
    """A symbolic int argument may be negative: `k // 4` and `k % 3` floor as Python does (the C++ kernels printed
    truncating `/` and `%`, fit only for sizes: k = -1 gave k // 4 == 0, a silent wrong answer)."""
    def fn(x, k):
        return x * k + k // 4, x - k % 3

    compiled = kiln.compile(fn)
    for k in (1, 2, 5, -1, -5, -8, 7):
        x = torch.randn(3)
        assert_matches_eager(compiled(x, k), fn, x, k)


class _Counter:
    def __init__(self):
        self.calls = 0


COUNTER = _Counter()
STEP = 0


def counted(x):
    global STEP
    COUNTER.calls = COUNTER.calls + 1  # a step counter on an object
    STEP += 2  # and one in the module
    return x * COUNTER.calls + STEP


def test_step_counters_on_objects_and_globals_become_graph_inputs(cpu_backend):
    """A counter the program bumps on every call, on an object or in its module, becomes a graph input at its
    first change (and its new value is written back from the graph's inputs), not a recompile per value."""
    global STEP
    compiled = kiln.compile(counted)
    COUNTER.calls, STEP = 0, 0
    with Captures() as captures:
        results = [compiled(torch.ones(2)) for _ in range(12)]
    assert [result.tolist() for result in results] == [[3.0 * call] * 2 for call in range(1, 13)]
    assert (COUNTER.calls, STEP) == (12, 24)
    assert captures.count == 2 and all(entry.eager_reason is None for entry in compiled.entries)


def test_floats_that_change_become_graph_inputs(cpu_backend):
    def fn(x, lr, step):
        return x - lr * (step + 1) * x

    compiled = kiln.compile(fn)
    with Captures() as captures:
        for step in range(6):
            x = torch.randn(5, 3)
            assert_matches_eager(compiled(x, 0.1 * (step + 1), step), fn, x, 0.1 * (step + 1), step)
    if _dynamo_frame_compiles(fn, [(torch.randn(5, 3), 0.1 * (step + 1), step) for step in range(6)]) > 2:
        # torch 2.11's AOTAutograd cannot tensorify `lr * (step + 1)` and asks for the float to be specialized
        # (TensorifyScalarRestartAnalysis): Dynamo then compiles once per value, and so does kiln, with one
        # more capture for the trace AOTAutograd refused; no frame runs eagerly.
        assert captures.count <= 7 and all(entry.eager_reason is None for entry in compiled.entries)
        return
    assert captures.count == 2
    inputs = graph_inputs(compiled.entries[0])
    assert any(isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype == torch.float64
               for value in inputs)  # the float, as Dynamo passes one: a 0-d float64 tensor


def _dynamo_frame_compiles(fn, calls: list) -> int:
    """How many graphs torch.compile (Dynamo, through AOTAutograd as kiln's) makes of `fn` over `calls`."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=counter)
    for arguments in calls:
        compiled(*arguments)
    torch._dynamo.reset()
    return counter.frame_count


def test_a_returned_symbolic_number_is_recomputed_not_specialized():
    def fn(x, scale):
        return x.sum(), x.shape[0] * 2 + 1, scale * 3.0

    compiled = kiln.compile(fn, backend="eager")
    with Captures() as captures:
        for rows, scale in ((3, 0.5), (4, 1.5), (6, 2.25), (9, -1.0)):
            x = torch.randn(rows, 2)
            result = compiled(x, scale)
            assert result[1:] == fn(x, scale)[1:] and type(result[1]) is int and type(result[2]) is float
    assert captures.count == 2


def test_a_relation_the_trace_branched_on_recompiles_when_it_breaks(cpu_backend, caplog):
    def fn(x):
        if x.shape[0] > 4:
            return x * 2
        return x - 1

    compiled = kiln.compile(fn)
    with kiln.config.patch(logs="recompiles"), caplog.at_level(logging.WARNING, logger="kiln"):
        with Captures() as first:
            for rows in (3, 6, 7, 9):  # static for 3, then symbolic: one entry for every size > 4
                x = torch.randn(rows, 2)
                assert_matches_eager(compiled(x), fn, x)
        assert first.count == 2
        assert "5 <= x.size(0)" in compiled.entries[0].guard_source
        with Captures() as second:
            for rows in (2, 4, 8, 3):  # 2 breaks `x.size(0) > 4`: one more entry, for sizes 2 to 4
                x = torch.randn(rows, 2)
                assert_matches_eager(compiled(x), fn, x)
        assert second.count == 1
    assert any("the entry assumes 5 <= x.size(0)" in record.message for record in caplog.records)


def test_sizes_0_and_1_are_specialized():
    compiled = kiln.compile(lambda x: x * 2, backend="eager")
    with Captures() as captures:
        for rows in (3, 4, 5):
            compiled(torch.randn(rows))
    assert captures.count == 2
    assert "2 <= x.size(0)" in compiled.entries[0].guard_source
    for rows, compiles in ((1, 1), (1, 0), (0, 1), (0, 0), (6, 0)):
        with Captures() as captures:
            x = torch.randn(rows)
            torch.testing.assert_close(compiled(x), x * 2)
        assert captures.count == compiles, rows


def test_inputs_that_shared_a_size_are_checked_to_still_share_it(cpu_backend):
    def fn(x, y):
        return torch.cat([x, y], 1) + x.shape[1]

    compiled = kiln.compile(fn)
    with Captures() as captures:
        for x_columns, y_columns in ((3, 3), (4, 4), (5, 5), (5, 6), (7, 2)):
            x, y = torch.randn(2, x_columns), torch.randn(2, y_columns)
            assert_matches_eager(compiled(x, y), fn, x, y)
    assert captures.count == 3  # static; x and y symbolic and equal (duck sizing); then independent


def test_recompile_log_says_which_dims_become_symbolic(caplog):
    compiled = kiln.compile(lambda x, n: x.sum(0) * n, backend="eager")
    compiled(torch.randn(2, 3), 2)
    with kiln.config.patch(logs="recompiles"), caplog.at_level(logging.WARNING, logger="kiln"):
        compiled(torch.randn(2, 4), 2)
        compiled(torch.randn(2, 5), 3)
    messages = [record.message for record in caplog.records]
    assert any("recompiling" in message and "size mismatch at index 1. expected 3, actual 4" in message
               for message in messages)
    assert any("x: size changed from [2, 3] to [2, 4]; dim 1 symbolic from now on" in message
               for message in messages)
    assert any("recompiling" in message and "n: changed from 2" in message for message in messages)
    assert any("n: changed from 2 to 3; a graph input from now on" in message for message in messages)


def test_static_entries_keep_the_batched_tensor_check():
    compiled = kiln.compile(lambda x, y: x + y, backend="eager")
    compiled(torch.randn(2, 3), torch.randn(2, 3))
    static_guard = compiled.entries[0].guard_source
    assert "__tensors.check(x, y)" in static_guard and ".size(" not in static_guard
    compiled(torch.randn(2, 5), torch.randn(2, 5))
    dynamic_guard = compiled.entries[0].guard_source
    assert "__tensors.check(x, y)" in dynamic_guard  # static dims, dtypes, devices: still one C++ call
    assert "y.size(1) == x.size(1)" in dynamic_guard and "2 <= x.size(1)" in dynamic_guard


def test_parameters_keep_static_sizes():
    linear = nn.Linear(3, 4)
    compiled = kiln.compile(linear, backend="eager")
    with Captures() as captures:
        for rows in (2, 3, 5, 8):
            x = torch.randn(rows, 3)
            torch.testing.assert_close(compiled(x), linear(x))
    assert captures.count == 2
    weight = [value for value in graph_inputs(dispatcher(compiled).entries[0]) if isinstance(value, torch.Tensor)
              and value.dim() == 2 and value.shape[1] == 3 and not is_symbolic(value)]
    assert weight, "the weight stays static"
