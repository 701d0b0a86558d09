"""Does a compiled model's call wait for the GPU? One process per model, on CUDA.

    python -m benchmarks.gpu_sync_check --only gpt2,llama,bert [--backend kiln]

For each model (benchmarks/workloads.py, TARGETS config, eval, bf16 autocast, as benchmarks.run
runs it): compile, warm up, then
- run one call under `torch.cuda.set_sync_debug_mode("warn")`, which warns at every synchronizing
  CUDA call (a D2H copy into pageable memory, `.item()`, a blocking allocator free): each warning's
  message and the Python line it came from;
- time 20 calls back to back (CUDA events, no sync between calls: benchmarks.run's method) and
  20 calls each followed by a synchronize, and the wall time to issue 20 calls.
A program with no sync issues its calls ahead of the GPU: back-to-back per-call time is about
max(host, GPU) and lower than the synchronized one. If it is not, something in the call waits.
"""
from __future__ import annotations

import argparse
import sys
import traceback
import warnings

import torch

from benchmarks import timing, workloads
from benchmarks.case import Runner, compile_program


def check(name: str, backend: str) -> str:
    workload = workloads.build("models", name, small=False, device="cuda")
    workload.program.eval()
    runner = Runner(workload, compile_program(workload.program, backend, "infer", "kiln"), "infer", "cuda",
                    use_autocast=True, mark_cudagraph_steps=False)
    for _ in range(4):
        runner()
    torch.cuda.synchronize()
    syncs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            runner()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    for warning in caught:
        if "synchroniz" in str(warning.message):
            syncs.append(f"{str(warning.message)[:120]} at {warning.filename}:{warning.lineno}")
    torch.cuda.synchronize()
    pipelined = timing.per_call_ms(runner, 20, synchronize_each=False)
    synchronized = timing.per_call_ms(runner, 20, synchronize_each=True)
    issue = timing.issue_ms(runner, 20)
    lines = [f"{name} / {backend}: back-to-back {pipelined:.3f} ms/call, synchronized {synchronized:.3f}, "
             f"issue {issue:.3f}; synchronizing calls in one call: {len(syncs)}"]
    lines += [f"  {item}" for item in syncs[:10]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="gpt2")
    parser.add_argument("--backend", default="kiln")
    args = parser.parse_args(argv)
    for name in args.only.split(","):
        try:
            print(check(name, args.backend), flush=True)
        except Exception:  # a diagnosis reports every case it can
            print(f"{name}: error\n{traceback.format_exc()[-600:]}", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
