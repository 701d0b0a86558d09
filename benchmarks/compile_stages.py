"""A cold compile's Python stages on the CPU, for a full-size TARGETS model: what a GPU first call spends before
its kernels compile, measured where no GPU time is needed.

    python -m benchmarks.compile_stages --only llama,bert [--runs 3] [--profile 40 [--sort tottime]]

Each run is a new process with empty caches (the whole-graph cache off). The model is built on the CPU in its
TARGETS config (benchmarks/workloads.py) and called under bf16 autocast, with kiln's Triton backend for CPU tensors
(`KILN_CPU_BACKEND=triton`: the kernels a CUDA graph gets) and channels-last convolutions (`KILN_CONV_LAYOUT=
channels_last`: the CUDA default); the call stops when the graph's module is about to load, before any kernel is
compiled or run. Printed per run: the seconds from the call to that point, and the seconds inside each of kiln's steps
(benchmarks/first_call_compiles.py STAGES, inclusive; the outer steps, the frontend's capture and the graph compile,
are still running then and are not printed). resnet50 and vit need timm, which this project's CPU machines
lack. The GPU machine's Python ran these stages 1.5-2x slower than the CPU machine's (2026-12-06).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

_CHILD = r'''
import io, os, pstats, cProfile, sys, time
from benchmarks import first_call_compiles
stages = first_call_compiles._time_stages()
import torch, kiln
from kiln.runtime import loader
from benchmarks import workloads
name, entries, order = sys.argv[1], int(sys.argv[2]), sys.argv[3]
workload = getattr(workloads, name)(False, "cpu")
compiled = kiln.compile(workload.program.eval())
profile = cProfile.Profile()
started = [0.0]
def stop(*args, **kwargs):
    seconds = time.perf_counter() - started[0]
    profile.disable()
    print(f"{name}: {seconds:.2f} s to load; " + ", ".join(f"{label} {stages[label][0]:.2f}"
          for _, _, label in first_call_compiles.STAGES if label in stages), flush=True)
    if entries:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(entries)
        print(text.getvalue())
    os._exit(0)
loader.load_module = stop
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    started[0] = time.perf_counter()
    if entries:
        profile.enable()
    compiled(*workload.infer_args, **workload.infer_kwargs)
print(f"{name}: the call ended without loading a module (it ran eagerly?)")
'''


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_stages", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="llama,bert,gpt2")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--profile", type=int, default=0, help="cProfile entries to print (0: no profiler)")
    parser.add_argument("--sort", default="cumulative", help="the profile's order: cumulative or tottime")
    args = parser.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for _ in range(args.runs):
        for name in args.only.split(","):
            with tempfile.TemporaryDirectory(prefix="kiln_stages_") as cache:
                environment = dict(os.environ, KILN_CPU_BACKEND="triton", KILN_CONV_LAYOUT="channels_last",
                                   KILN_GRAPH_CACHE="0", KILN_CACHE_DIR=cache,
                                   PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
                result = subprocess.run([sys.executable, "-c", _CHILD, name, str(args.profile), args.sort], env=environment,
                                        capture_output=True, text=True, timeout=600)
                lines = [line for line in result.stdout.splitlines() if line.strip()]
                print("\n".join(lines) if lines else f"{name}: failed\n{result.stderr[-2000:]}", flush=True)


if __name__ == "__main__":
    main()
