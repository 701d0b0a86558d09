"""Dropout drawn in kernels (kiln/aot/random.py, kiln/lowering/random.py): Philox bits equal on the reference,
Triton and C++; a training step's dropout fused into its neighbours' kernel, its mask recomputed in the backward
(no bool mask saved), kept values equal to eager's bit for bit, each element kept with probability 1 - p, a new
mask on every call, the same ones after torch.manual_seed, and gradients that use the forward's mask."""
from __future__ import annotations

import math
import os

import pytest
import torch

import kiln
from kiln.philox import keep_threshold, philox
from kiln.debug.explain import explain

F = torch.nn.functional
BACKENDS = pytest.mark.parametrize("backend", ["cpp", "triton"])


def test_philox_known_answer():
    """Random123's known-answer vector for philox4x32-10 with counter and key 0 (first word)."""
    assert int(philox(torch.tensor(0), torch.tensor(0))) == 0x6627E8D5


def test_philox_reference_is_tritons_randint():
    """kiln's reference is what Triton's tl.randint computes with int64 seeds and offsets (under the interpreter
    here; the kernels call it on the GPU)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs Triton's interpreter (CPU tensors)")
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def draw(seeds, offsets, out, n: tl.constexpr):
        index = tl.arange(0, n)
        bits = tl.randint(tl.load(seeds + index), tl.load(offsets + index))
        tl.store(out + index, bits.to(tl.int64))

    generator = torch.Generator().manual_seed(0)
    seeds = torch.randint(-2 ** 63, 2 ** 63 - 1, (64,), generator=generator, dtype=torch.int64)
    offsets = torch.randint(-2 ** 63, 2 ** 63 - 1, (64,), generator=generator, dtype=torch.int64)
    offsets[:8] = torch.arange(8)
    out = torch.empty(64, dtype=torch.int64)
    draw[(1,)](seeds, offsets, out, n=64)
    assert torch.equal(out, philox(seeds, offsets))


def _step(program, x, backend, dynamic=None, **options):
    """The compiled program's result and x's gradient (a fixed random cotangent), and what it saved for the backward."""
    saved = []

    def pack(tensor):
        if type(tensor) is torch.Tensor:  # not the FakeTensors the first call's trace saves while kiln compiles
            saved.append(tensor)
        return tensor

    with kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False, **options), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        x = x.detach().requires_grad_()
        out = kiln.compile(program, dynamic=dynamic)(x)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    out.backward(cotangent)
    return out.detach(), x.grad, cotangent, saved


def _program(p):
    def program(x):
        return F.dropout(x * 2, p=p, training=True) * 3  # exact in every dtype but the last rounding

    return program


@BACKENDS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_training_step(backend, dtype):
    p = 0.3
    program = _program(p)
    x = torch.rand(64, 96, generator=torch.Generator().manual_seed(0)).to(dtype) + 0.25  # never 0: kept is out != 0
    kiln.reset()
    with kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
        report = explain(program, x.clone().requires_grad_())
    torch.manual_seed(7)
    out, grad, cotangent, saved = _step(program, x, backend)
    kept = out != 0
    # one kernel: the product, the mask and the scale; no ATen dropout
    (forward,) = report.graphs
    assert forward.kernels == 1 and forward.extern_ops.keys() <= {"aten.randint.low"}, report
    # no bool mask saved: the backward recomputes it from the seed
    assert not [tensor for tensor in saved if tensor.dtype == torch.bool], [t.shape for t in saved]
    # kept values are eager's bit for bit: eager's own dropout where it kept the same elements
    torch.manual_seed(11)
    eager = program(x)
    both = kept & (eager != 0)
    assert both.sum() > 1000
    torch.testing.assert_close(out[both], eager[both], rtol=0, atol=0)
    assert abs(kept.double().mean().item() - (1 - p)) < 0.03
    # the gradient is 6 / (1 - p) where the forward kept an element, 0 elsewhere, times the cotangent
    expected = cotangent.double() * kept * 6 / (1 - p)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(grad.double(), expected, rtol=tolerance, atol=tolerance)


@BACKENDS
def test_dropout_statistics_and_seeding(backend):
    """Each element kept with probability 1 - p (within 5 standard deviations over 2**16 elements), independently of
    its neighbours and of the other dropout; a new mask each call; the same masks after the same manual_seed."""
    p = 0.25

    def program(x):
        return F.dropout(x, p=p, training=True), F.dropout(x, p=p, training=True)

    x = torch.ones(256, 256)
    with kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False), torch.no_grad():
        compiled = kiln.compile(program)
        torch.manual_seed(3)
        first, second = (out != 0 for out in compiled(x))
        again = compiled(x)[0] != 0
        torch.manual_seed(3)
        repeated = compiled(x)[0] != 0
    n = x.numel()
    sigma = math.sqrt(p * (1 - p) / n)
    for mask in (first, second, again):
        assert abs(mask.double().mean().item() - (1 - p)) < 5 * sigma
    both = (first & second).double().mean().item()  # independent masks: kept by both with probability (1 - p)^2
    assert abs(both - (1 - p) ** 2) < 5 * math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / n)
    neighbours = (first[:, 1:] & first[:, :-1]).double().mean().item()
    assert abs(neighbours - (1 - p) ** 2) < 5 * math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / n)
    assert not torch.equal(first, again)
    assert torch.equal(first, repeated)
    assert keep_threshold(p) == 2 ** 30


@BACKENDS
def test_kernels_draw_the_reference_masks(backend):
    """The kernels' masks are the eager implementation's (kiln.compile(..., backend="aot_eager") runs the same ATen
    graph with torch's kernels and the custom ops' torch code), and its values."""
    def program(x):
        return F.dropout(x * 2, p=0.5, training=True)

    x = torch.randn(33, 65, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
        torch.manual_seed(5)
        got = kiln.compile(program)(x)
        kiln.reset()
        torch.manual_seed(5)
        expected = kiln.compile(program, backend="aot_eager")(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_in_kernel_dropout_off_keeps_atens_dropout():
    program = _program(0.3)
    x = torch.randn(16, 16, requires_grad=True)
    kiln.reset()
    with kiln.config.patch(strict=True, in_kernel_dropout=False, graph_cache=False):
        report = explain(program, x)
    assert "native_dropout" in str(report)


@BACKENDS
def test_training_forward_stores_no_mask(backend):
    """The forward of a training step saves the seed: its memory plan has no bool buffer (the mask is not stored)."""
    from kiln.debug.dump import GraphDump

    dumps = []

    def keep(dump, gm):
        dump.kept = {}
        dumps.append(dump)

    program = _program(0.3)
    x = torch.randn(16, 32, requires_grad=True)
    kiln.reset()
    GraphDump.observer = keep
    try:
        with kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
            kiln.compile(program)(x)
    finally:
        GraphDump.observer = None
    (forward,) = dumps
    plan = forward.kept["memory_plan.txt"]
    assert "f32" in plan or "float32" in plan, plan
    assert "b8" not in plan and "bool" not in plan, plan


@BACKENDS
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rand_like_is_drawn_in_the_kernel(backend, dtype):
    """rand_like: uniform on [0, 1) (mean and variance within 5 standard errors over 2**16 values), on the dtype's
    significand grid (so never rounded up to 1), fused with its consumer, new values each call, the same after the
    same manual_seed."""
    def program(x):
        return torch.rand_like(x) + x

    x = torch.zeros(256, 256, dtype=dtype)
    kiln.reset()
    with torch.no_grad(), kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
        (graph,) = explain(program, x).graphs
        compiled = kiln.compile(program)
        torch.manual_seed(1)
        first = compiled(x)
        second = compiled(x)
        torch.manual_seed(1)
        repeated = compiled(x)
    assert graph.kernels == 1 and graph.extern_ops.keys() == {"aten.randint.low"}, graph.lines()
    values = first.double()
    assert first.dtype == dtype and values.min() >= 0 and values.max() < 1
    bits = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}[dtype]
    scaled = values * 2 ** bits
    assert torch.equal(scaled, scaled.round())
    # the uniform law on that grid: mean (1 - 2^-bits) / 2 (bfloat16: 0.5 - 2^-9), variance (1 - 2^-2bits) / 12;
    # (u - mean)^2 has variance about 1/180
    n, step = values.numel(), 2.0 ** -bits
    mean, variance = (1 - step) / 2, (1 - step * step) / 12
    assert abs(values.mean().item() - mean) < 5 * math.sqrt(variance / n)
    assert abs(values.var().item() - variance) < 5 * math.sqrt(1 / 180 / n)
    assert not torch.equal(first, second) and torch.equal(first, repeated)


@BACKENDS
def test_bernoulli_and_rand_are_drawn_in_the_kernel(backend):
    def program(x):
        return x.bernoulli(0.3), torch.rand(128, 512) * 2

    x = torch.zeros(256, 256)
    kiln.reset()
    with torch.no_grad(), kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
        (graph,) = explain(program, x).graphs
        ones, scaled = kiln.compile(program)(x)
    assert graph.extern_ops.keys() == {"aten.randint.low"}, graph.lines()
    fraction = ones.mean().item()
    assert set(ones.unique().tolist()) == {0.0, 1.0}
    assert abs(fraction - 0.3) < 5 * math.sqrt(0.3 * 0.7 / ones.numel())
    assert scaled.shape == (128, 512) and 0 <= scaled.min() and scaled.max() < 2
    assert abs(scaled.mean().item() - 1.0) < 5 * math.sqrt(4 / 12 / scaled.numel())


@BACKENDS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_twins_draw_the_kernels_values(backend, dtype):
    """Under kiln.testing.philox_draws(), eager's rand, rand_like and dropout give what kiln's kernels give."""
    import kiln.testing

    def program(x):
        return torch.rand_like(x) + torch.rand(x.shape, dtype=x.dtype) * 2 + F.dropout(x, 0.4) * 3

    x = torch.randn(40, 72, generator=torch.Generator().manual_seed(3)).to(dtype)
    with torch.no_grad(), kiln.config.patch(strict=True, cpu_backend=backend, graph_cache=False):
        torch.manual_seed(9)
        got = kiln.compile(program)(x)
    torch.manual_seed(9)
    with torch.no_grad(), kiln.testing.philox_draws():
        expected = program(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@BACKENDS
def test_dropout_with_symbolic_sizes_saves_the_seed(backend):
    """A shape-generic training graph: the backward takes the sizes from its symbolic inputs and recomputes the mask."""
    p = 0.5
    program = _program(p)
    kiln.reset()
    for rows in (17, 33, 65):
        x = torch.rand(rows, 24, generator=torch.Generator().manual_seed(rows)) + 0.25
        out, grad, cotangent, saved = _step(program, x, backend, dynamic=True)
        kept = out != 0
        assert not [tensor for tensor in saved if tensor.dtype == torch.bool], [t.shape for t in saved]
        torch.testing.assert_close(grad.double(), cotangent.double() * kept * 6 / (1 - p), rtol=1e-6, atol=1e-6)
