"""kiln's demo: compile real models with `kiln.compile`, check them, time them, show the kernels.

    python scripts/demo.py                       # every model, backend "kiln"
    python scripts/demo.py --models bert,cnn --backend aot_eager

Models: transformers' BERT, GPT-2 and Llama built from configs with random weights, and
a small ResNet-style CNN. On a GPU they run at the sizes of the benchmarks (BERT-base
8x512, GPT-2 8x512, an 8-layer Llama 4x1024, the CNN on 64 images of 224x224) under bf16
autocast. On a CPU with the C++ backend (KILN_CPU_BACKEND=cpp) the transformers run in
float32 at the CPU benchmark's sizes (4 layers, hidden 256-512, batch 4; benchmarks/cpu.py)
and the speedup over eager is kiln's; with KILN_CPU_BACKEND=triton kiln's kernels run under
the Triton interpreter, so the models are tiny and CPU times only show that they run right.

For each model: the compiled output is checked with kiln's accuracy rule (no farther from
a float64 reference than eager), then eager and kiln are timed (median of a few calls).
The first model is compiled with `kiln.config.debug=True`, and the files kiln wrote for
it (kernels, wrapper, LoopIR) are listed. Exit status 1 if any model fails.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)  # benchmarks/ (model builders, timing) lives beside kiln/

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import kiln  # noqa: E402
from benchmarks import timing  # noqa: E402
from benchmarks.case import KilnLogCounter, Runner, check_accuracy, error_summary  # noqa: E402
from benchmarks.cpu import cpu_workload  # noqa: E402
from benchmarks.workloads import build  # noqa: E402

MODELS = ["bert", "gpt2", "llama", "cnn"]
CPU_MODELS = ["bert", "gpt2", "llama"]  # at benchmarks/cpu.py's sizes when the C++ backend runs them
CPU_CPP = not ON_GPU and kiln.config.cpu_backend == "cpp"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma list of " + ",".join(MODELS))
    parser.add_argument("--backend", default=os.environ.get("KILN_DEMO_BACKEND", "kiln"),
                        help="kiln ladder rung: kiln (default), aot_eager, eager")
    parser.add_argument("--mode", default="default", choices=("default", "reduce-overhead"),
                        help="kiln.compile mode (reduce-overhead = CUDA graphs, GPU only)")
    return parser.parse_args()


def demo_model(name: str, backend: str, mode: str, device: str, debug: bool) -> dict:
    """Compile one model, check it against eager and float64, time eager and kiln."""
    if CPU_CPP and name in CPU_MODELS:
        workload = cpu_workload(name)
    else:
        workload = build("models", name, small=not ON_GPU, device=device)
    workload.program.eval()
    with kiln.config.patch(debug=debug):
        compiled = kiln.compile(workload.program, backend=backend, mode=mode)
        kiln_runner = Runner(workload, compiled, "infer", device, use_autocast=ON_GPU, mark_cudagraph_steps=False)
        compile_seconds, _ = timing.time_first_call(kiln_runner, device)
    eager_runner = Runner(workload, workload.program, "infer", device, use_autocast=ON_GPU,
                          mark_cudagraph_steps=False)
    accuracy = check_accuracy(workload, kiln_runner, eager_runner, "infer")
    warmup, iterations = (3, 20) if ON_GPU else ((2, 10) if CPU_CPP else (1, 3))
    medians = {}
    for label, runner in (("eager", eager_runner), ("kiln", kiln_runner)):
        for _ in range(warmup):
            runner()
        medians[label] = timing.summarize(timing.time_calls(runner, device, iterations))["median_ms"]
    return {"shape": workload.shape, "compile_s": compile_seconds, **accuracy,
            "eager_ms": medians["eager"], "kiln_ms": medians["kiln"]}


def list_debug_files(since: float) -> list[str]:
    """Files under kiln.config.debug_dir written after `since` (this run's dumps)."""
    found = []
    for folder, _, files in os.walk(kiln.config.debug_dir):
        for filename in files:
            path = os.path.join(folder, filename)
            if os.path.getmtime(path) >= since:
                found.append(path)
    return sorted(found, key=_natural_key)


def _natural_key(path: str) -> list:
    """kernel_k2 before kernel_k10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def main() -> int:
    args = parse_args()
    device = "cuda" if ON_GPU else "cpu"
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    if ON_GPU:
        where = torch.cuda.get_device_name(0) + ", bf16 autocast"
    elif CPU_CPP:
        where = f"CPU ({os.cpu_count()} cores), float32; kiln's C++/OpenMP kernels"
    else:
        where = "CPU, float32, tiny models; kiln's Triton kernels run under the Triton interpreter (slow)"
    print(f"kiln demo: backend={args.backend!r}, mode={args.mode!r} on {where}")
    print(f"torch {torch.__version__}, kiln {kiln.__version__}\n", flush=True)

    warnings = KilnLogCounter()
    logging.getLogger("kiln").addHandler(warnings)
    rows, failures = [], 0
    debug_started = time.time() - 1
    for position, name in enumerate(names):
        torch.manual_seed(0)
        warnings_before = warnings.count
        try:
            row = demo_model(name, args.backend, args.mode, device, debug=(position == 0))
        except Exception as error:  # shown, counted, never hidden
            row = {"error": error_summary(error)[:300]}
        row["name"] = name
        row["kiln_warnings"] = warnings.count - warnings_before
        failed = "error" in row or not row.get("accuracy_ok", False)
        failures += failed
        rows.append(row)
        status = row.get("error") or ("ok" if row["accuracy_ok"] else "ACCURACY FAIL: " + row["accuracy"])
        print(f"  {name}: {status}", flush=True)

    print()
    print("| model | input | eager ms | kiln ms | speedup | first call s | accuracy vs eager & float64 | "
          "graphs run eagerly |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['name']} | | | | | | FAILED: {row['error']} | {row['kiln_warnings']} |")
            continue
        accuracy = "ok" if row["accuracy_ok"] else "FAIL: " + row["accuracy"]
        print(f"| {row['name']} | {row['shape']} | {row['eager_ms']:.2f} | {row['kiln_ms']:.2f} | "
              f"{row['eager_ms'] / row['kiln_ms']:.2f}x | {row['compile_s']:.1f} | {accuracy} | "
              f"{row['kiln_warnings']} |")
    if not ON_GPU and not CPU_CPP:
        print("\nNote: kiln's kernels ran in the Triton interpreter, so 'kiln ms' measures the "
              "interpreter, not kiln.\nSpeed is measured on a GPU, or on this CPU with KILN_CPU_BACKEND=cpp.")
    if CPU_CPP:
        print(f"\nCompiled C++ kernels (one shared library per distinct kernel) are cached under "
              f"{os.path.join(kiln.config.cache_dir, 'cpp')}/.")
    if any(row["kiln_warnings"] for row in rows):
        print("\n'graphs run eagerly' counts kiln's warnings: a graph kiln could not compile ran as "
              "plain PyTorch (KILN_STRICT=1 makes that an error). First: " + "; ".join(warnings.first))

    dumped = list_debug_files(debug_started)
    print(f"\nGenerated code for '{names[0]}' (kiln.config.debug=True) under {kiln.config.debug_dir}/:")
    kernels = [p for p in dumped if os.path.basename(p).startswith("kernel_")]
    others = [p for p in dumped if p not in kernels]
    for path in kernels[:12] + others[:12]:
        print(f"  {path}")
    if len(kernels) > 12 or len(others) > 12:
        print(f"  ... {len(dumped)} files in all")
    if not dumped:
        print("  (none: this backend generates no code; the 'kiln' backend writes kernels and a wrapper)")
    print(f"\n{len(rows) - failures} of {len(rows)} models compiled and matched eager.")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
