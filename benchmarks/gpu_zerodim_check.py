"""GPU check of 0-dim results (issue 11, item 9b): shape, strides, dtype and values equal eager's.

On torch 2.11 `torch.minimum(torch.linalg.vector_norm(x, dim=-1), x.amax())` with x of shape (1,)
came back from kiln with shape (1,): torch's shape rule for vector_norm kept a size-1 dim named by
a negative index (fixed in kiln/_torch.py). This runs that class on CUDA tensors: vector_norm with
each ord and each spelling of the only dim, reductions and scalar indexing, each alone and combined
by minimum / maximum / add with another 0-dim value, in f32, bf16 and f16, sizes 1, 2 and 7, through
kiln.compile, torch.compile(backend="kiln") (static and dynamic) and mode="reduce-overhead", and a
0-dim CPU tensor mixed with CUDA ones. One line per variant (PASS / FAIL / ERROR), then a count;
exit status 1 on any failure. Under a minute on an H200:

    python -m benchmarks.gpu_zerodim_check
"""
from __future__ import annotations

import sys
import time
import traceback

import torch

import kiln
import kiln.testing
from kiln.debug.explain import ExplainReport, _recording

INF = float("inf")
PRODUCERS = {
    "norm2_dim0": lambda x: torch.linalg.vector_norm(x, dim=0),
    "norm2_dim-1": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "norm2_dims(-1,)": lambda x: torch.linalg.vector_norm(x, dim=(-1,)),
    "norm2_all": lambda x: torch.linalg.vector_norm(x),
    "norm1_dim-1": lambda x: torch.linalg.vector_norm(x, 1, dim=-1),
    "norminf_dim-1": lambda x: torch.linalg.vector_norm(x, INF, dim=-1),
    "norm3_dim-1": lambda x: torch.linalg.vector_norm(x, 3, dim=-1),
    "norm_keepdim_squeezed": lambda x: torch.linalg.vector_norm(x, dim=-1, keepdim=True).squeeze(-1),
    "tensor_norm-1": lambda x: x.norm(dim=-1),
    "sum": lambda x: x.sum(), "amax": lambda x: x.amax(), "mean-1": lambda x: x.mean(-1),
    "var": lambda x: x.var(correction=0), "index-1": lambda x: x[-1],
}
COMBINATIONS = ("alone", "minimum(., amax)", "maximum(input0d, .)", ". + input0d")


def program(x, scalar):
    other = x.amax()
    results = []
    for produce in PRODUCERS.values():
        value = produce(x)
        results += [value, torch.minimum(value, other), torch.maximum(scalar, value), value + scalar]
    return tuple(results)


def variant_names():
    return [f"{name} {combination}" for name in PRODUCERS for combination in COMBINATIONS]


BUDGET_SECONDS = 55  # later checks print SKIP past it (Triton compiles each kernel at its first launch)
_STARTED = time.perf_counter()


def check(label: str, compile_fn, inputs_list, *, strict: bool = True) -> int:
    """Compile `program` with `compile_fn`, call it on each inputs in turn, one line per variant."""
    if time.perf_counter() - _STARTED > BUDGET_SECONDS:
        print(f"SKIP   {label}: past the {BUDGET_SECONDS} s budget", flush=True)
        return 0
    failures = 0
    report = ExplainReport()
    try:
        with kiln.config.patch(strict=strict), _recording(report):
            compiled = compile_fn(program)
            calls = [(inputs, compiled(*inputs)) for inputs in inputs_list]
    except Exception:
        print(f"ERROR {label}: {traceback.format_exc()[-1200:]}", flush=True)
        return 1
    fallbacks = [graph.fallback for graph in report.graphs if graph.fallback]
    note = f" (ran eagerly: {fallbacks[0][:100]})" if fallbacks else ("" if report.graphs else " (no graph)")
    for inputs, got in calls:
        want = program(*inputs)
        reference = program(*kiln.testing.to_float64(inputs))
        size = tuple(inputs[0].shape)
        for name, got_value, want_value, ref_value in zip(variant_names(), got, want, reference):
            problems = []
            if got_value.shape != want_value.shape:
                problems.append(f"shape {tuple(got_value.shape)} != eager's {tuple(want_value.shape)}")
            if got_value.stride() != want_value.stride():
                problems.append(f"stride {got_value.stride()} != eager's {want_value.stride()}")
            if got_value.dtype != want_value.dtype:
                problems.append(f"dtype {got_value.dtype} != eager's {want_value.dtype}")
            if got_value.device != want_value.device:
                problems.append(f"device {got_value.device} != eager's {want_value.device}")
            if not problems:
                verdict = kiln.testing.compare(got_value, want_value, ref_value)
                if not verdict:
                    problems.append(verdict.message)
            failures += bool(problems)
            verdict = "FAIL " + "; ".join(problems) if problems else "PASS"
            print(f"{verdict:6} {label} x{size} {name}{note if not problems else ''}", flush=True)
    return failures


def cuda_inputs(size: int, dtype) -> list:
    return [torch.randn(size, dtype=dtype, device="cuda"), torch.randn((), dtype=dtype, device="cuda")]


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_zerodim_check: CUDA only")
        return 2
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {torch.cuda.get_device_name()}, "
          f"vector_norm shape rule fixed by kiln: {getattr(kiln._torch, "fix_vector_norm_shape_rule", lambda: "n/a")()}", flush=True)
    torch.manual_seed(0)
    failures = 0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for size in (1, 2, 7):
            kiln.reset()
            failures += check(f"kiln.compile {str(dtype)[6:]}", kiln.compile, [cuda_inputs(size, dtype)])
    for dynamic in (False, True):
        torch._dynamo.reset()
        failures += check(f"torch.compile(dynamic={dynamic}) float32",
                          lambda fn: torch.compile(fn, backend="kiln", dynamic=dynamic),
                          [cuda_inputs(1, torch.float32), cuda_inputs(3, torch.float32)])
    kiln.reset()
    failures += check("kiln.compile(reduce-overhead) float32", lambda fn: kiln.compile(fn, mode="reduce-overhead"),
                      [cuda_inputs(1, torch.float32) for _ in range(3)])
    # A 0-dim CPU tensor beside CUDA ones (eager allows it; kiln may run that graph eagerly).
    kiln.reset()
    failures += check("kiln.compile float32, 0-dim input on the CPU", kiln.compile,
                      [[torch.randn(1, device="cuda"), torch.randn(())]], strict=False)
    print(f"{failures} failures in {time.perf_counter() - _STARTED:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
