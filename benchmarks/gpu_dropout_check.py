"""Dropout drawn in kiln's kernels on the GPU (kiln/aot/random.py): for fp32 and bf16, a training step of
F.dropout(x * 2, p) * 3 compiled by kiln has one forward kernel and no ATen dropout, saves no bool mask for the
backward, keeps eager's values bit for bit where both kept an element, keeps each element with probability 1 - p,
and its gradient is 6 / (1 - p) times the cotangent exactly where the forward kept; the masks equal what
kiln.testing.philox_draws() makes eager draw (tl.randint on the GPU against the torch reference); and rand_like, drawn
in the kernel too, is uniform on [0, 1) on its dtype's grid; and an inference graph's dropout recorded in a CUDA graph
draws a new mask at each replay. Prints PASS/FAIL per check.

    python -m benchmarks.gpu_dropout_check
"""
from __future__ import annotations

import sys
import traceback

import torch

import kiln
import kiln.testing
from kiln.debug.explain import explain

F = torch.nn.functional


def check(dtype, p=0.3) -> list:
    def program(x):
        return F.dropout(x * 2, p=p, training=True) * 3

    failures = []
    x = (torch.rand(512, 1024, device="cuda") + 0.25).to(dtype)
    kiln.reset()
    report = explain(program, x.clone().requires_grad_())
    (graph,) = report.graphs
    if graph.kernels != 1 or not graph.extern_ops.keys() <= {"aten.randint.low"}:
        failures.append(f"forward: {graph.kernels} kernels, externs {graph.extern_ops}")
    saved, where = [], []

    def pack(tensor):
        if type(tensor) is not torch.Tensor:  # a FakeTensor the first call's trace saves while kiln compiles
            return tensor
        saved.append(tensor)
        if tensor.dtype == torch.bool:  # who saves it: the innermost frames outside torch
            frames = [f"{frame.filename.rsplit('/', 2)[-1]}:{frame.lineno} {frame.name}"
                      for frame in traceback.extract_stack()[:-1]]
            where.append(" <- ".join(reversed(frames[-6:])))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        leaf = x.clone().requires_grad_()
        torch.manual_seed(5)
        out = kiln.compile(program)(leaf)
    cotangent = torch.randn_like(out)
    out.backward(cotangent)
    kept = out != 0
    if any(t.dtype == torch.bool for t in saved):
        listed = ", ".join(f"{t.dtype} {tuple(t.shape)}" for t in saved)
        failures.append(f"a bool tensor was saved for the backward; saved: {listed}; saved at: {' | '.join(where)}")
    eager = program(x)
    both = kept & (eager != 0)
    if not torch.equal(out[both], eager[both]):
        failures.append("kept values differ from eager's")
    fraction = kept.double().mean().item()
    if abs(fraction - (1 - p)) > 5 * ((p * (1 - p) / x.numel()) ** 0.5):
        failures.append(f"kept fraction {fraction:.5f}, expected {1 - p}")
    expected = cotangent.double() * kept * 6 / (1 - p)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    if not torch.allclose(leaf.grad.double(), expected, rtol=tolerance, atol=tolerance):
        failures.append(f"gradient off by {(leaf.grad.double() - expected).abs().max().item():.3g}")
    torch.manual_seed(5)
    with kiln.testing.philox_draws():
        twin = program(x)
    if not torch.equal(twin != 0, kept):
        failures.append("masks differ from kiln.testing.philox_draws()'s eager draw")
    return failures


def check_rand(dtype) -> list:
    """rand_like drawn in the kernel: on [0, 1), on the dtype's significand grid, mean 1/2 and variance 1/12."""
    def program(x):
        return torch.rand_like(x) + x

    failures = []
    x = torch.zeros(1024, 1024, device="cuda", dtype=dtype)
    kiln.reset()
    with torch.no_grad():
        (graph,) = explain(program, x).graphs
        values = kiln.compile(program)(x).double()
    if graph.extern_ops.keys() != {"aten.randint.low"}:
        failures.append(f"externs {graph.extern_ops}")
    bits = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}[dtype]
    if values.min() < 0 or values.max() >= 1 or not torch.equal(values * 2 ** bits, (values * 2 ** bits).round()):
        failures.append("values off [0, 1) or off the grid")
    # the uniform law on the grid {0, 2^-bits, ..., 1 - 2^-bits}: mean (1 - 2^-bits) / 2 (bfloat16: 0.5 - 2^-9),
    # variance (1 - 2^-2bits) / 12
    n, step = values.numel(), 2.0 ** -bits
    mean, variance = (1 - step) / 2, (1 - step * step) / 12
    if abs(values.mean().item() - mean) > 5 * (variance / n) ** 0.5 or \
            abs(values.var().item() - variance) > 5 * (1 / 180 / n) ** 0.5:
        failures.append(f"mean {values.mean().item():.5f}, variance {values.var().item():.5f}")
    return failures


def check_replays(dtype, mode=None) -> list:
    """Dropout in an inference graph (train mode under no_grad) that kiln records as a CUDA graph (the default mode's
    graphs; `mode="reduce-overhead"`): each replay draws a new seed, so every call's mask differs, at rate 1 - p."""
    from benchmarks.case import cuda_graph_counts

    def program(x, w):  # six launches: the default mode records graphs of at least four (MIN_DEFAULT_LAUNCHES)
        dropped = F.dropout(x, p=0.5, training=True)
        hidden = torch.tanh(torch.relu(dropped @ w) @ w) @ w
        return dropped, hidden

    failures = []
    x = torch.ones(256, 1024, device="cuda", dtype=dtype)
    w = torch.randn(1024, 1024, device="cuda", dtype=dtype) / 32
    kiln.reset()
    compiled = kiln.compile(program, mode=mode)
    with torch.no_grad():
        masks = [(compiled(x, w)[0] != 0).clone() for _ in range(6)]
    counts = cuda_graph_counts()
    if not counts.get("cuda_graph_replays"):
        failures.append(f"no CUDA-graph replay: {counts}")
    if any(torch.equal(masks[i], masks[j]) for i in range(6) for j in range(i)):
        failures.append("two calls drew the same mask")
    fractions = [mask.double().mean().item() for mask in masks]
    if any(abs(fraction - 0.5) > 5 * (0.25 / x.numel()) ** 0.5 for fraction in fractions):
        failures.append(f"kept fractions {fractions}")
    return failures


def main() -> int:
    failed = 0
    checks = (("dropout", check), ("rand_like", check_rand), ("dropout replayed", check_replays),
              ("dropout replayed, reduce-overhead", lambda dtype: check_replays(dtype, "reduce-overhead")))
    for name, checker in checks:
        for dtype in (torch.float32, torch.bfloat16):
            failures = checker(dtype)
            failed += bool(failures)
            print(f"gpu_dropout_check {name} {dtype}: {'PASS' if not failures else 'FAIL: ' + '; '.join(failures)}",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
