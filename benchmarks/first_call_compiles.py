"""Where a cold first call's seconds go on the GPU: Triton compiles ahead (threads) or at launch, and kiln's stages.

    python -m benchmarks.first_call_compiles --only bert [--profile 25]

For each model (TARGETS.md config, bf16 autocast inference), in this process with empty kiln and Triton caches:
kiln.compile's first call is timed, every Triton compile is recorded through Triton's post-compile hook
(`knobs.runtime.jit_post_compile_hook`: kernel, warmup or launch, seconds since the call began), and the
call's main thread runs under cProfile. Compiles "ahead" are kiln's parallel compile (kiln/runtime/launch.py
compile_ahead, Triton's warmup on worker threads); compiles "at launch" are kernels the first launch did not find
in Triton's cache: each one compiled twice, or one compile_ahead skipped, serially on the call's thread.
Prints a summary and the profile's top entries by cumulative time. With --profile 0 the call runs without cProfile
(whose overhead inflates Python-heavy stages), and `--stages` prints the seconds spent inside each of kiln's steps
(inclusive: a step's time contains the steps it calls), measured by wrapping them for this run.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.first_call_compiles", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="bert")
    parser.add_argument("--profile", type=int, default=25, help="profile entries to print (0: none)")
    parser.add_argument("--stages", action="store_true", help="seconds inside each of kiln's compile steps")
    parser.add_argument("--sort", default="cumulative", help="the profile's order: cumulative or tottime")
    args = parser.parse_args(argv)
    cache = tempfile.mkdtemp(prefix="kiln_first_call_")
    os.environ["KILN_CACHE_DIR"] = os.path.join(cache, "kiln")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")

    import torch
    from triton import knobs

    import kiln
    from benchmarks import workloads

    compiles: list = []
    started = [0.0]

    def post_compile(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        compiles.append((fn.name, "ahead" if is_manual_warmup else "at launch", time.perf_counter() - started[0]))

    knobs.runtime.jit_post_compile_hook = post_compile
    stages = _time_stages() if args.stages else None
    for name in args.only.split(","):
        workload = getattr(workloads, name)(False, "cuda")
        model = workload.program.eval()
        compiled = kiln.compile(model)
        compiles.clear()
        if stages is not None:
            stages.clear()
        profile = cProfile.Profile()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            torch.cuda.synchronize()
            started[0] = time.perf_counter()
            profile.enable()
            compiled(*workload.infer_args, **workload.infer_kwargs)
            torch.cuda.synchronize()
            profile.disable()
            seconds = time.perf_counter() - started[0]
        ahead = [c for c in compiles if c[1] == "ahead"]
        at_launch = [c for c in compiles if c[1] == "at launch"]
        print(f"== {name}: first call {seconds:.2f} s; Triton compiles: {len(ahead)} ahead "
              f"(done by {max((c[2] for c in ahead), default=0):.2f} s), {len(at_launch)} at launch "
              f"({sum(1 for c in at_launch if c[0] in {a[0] for a in ahead})} of them compiled ahead too)")
        for kernel, _, at in at_launch[:10]:
            print(f"   at launch: {kernel} at {at:.2f} s")
        if stages is not None:
            print("   " + ", ".join(f"{label} {stages[label][0]:.2f} s"
                                  + (f" ({stages[label][1]}x)" if stages[label][1] > 1 else "")
                                  for _, _, label in STAGES if label in stages))
        if args.profile:
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats(args.sort).print_stats(args.profile)
            print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


# kiln's steps of a first call, outermost first: (module, attribute, the name printed)
STAGES = (
    ("kiln.frontend.dispatcher", "Dispatcher._capture", "frontend capture (all below)"),
    ("kiln.backend", "_compile_graph", "graph compile"),
    ("kiln.aot.plain", "trace_to_aten", "trace to ATen"),
    ("kiln.aot", "choose_conv_layouts", "conv layouts"),
    ("kiln.backend", "_compile_aten_graph", "ATen graph compile"),
    ("kiln.lowering", "apply_patterns", "patterns"),
    ("kiln.lowering", "lower_graph", "lower"),
    ("kiln.schedule", "schedule_graph", "schedule"),
    ("kiln.schedule.passes", "optimize", "LoopIR passes"),
    ("kiln.codegen.wrapper", "generate_wrapper", "codegen"),
    ("kiln.runtime.loader", "load_module", "load"),
    ("kiln.runtime.loader", "_compile_ahead", "Triton compile ahead"),
    ("kiln.runtime.cudagraphs", "CudaGraphRunner.__call__", "graph runner calls"),
    ("kiln.runtime.compile_workers", "CompileWorkers.compile", "in workers (threads' sum)"),
    ("triton.backends.nvidia.driver", "compile_module_from_src", "launcher builds here (threads' sum)"),
)


def _time_stages() -> dict:
    """Wrap each of STAGES so that its calls add to {name: [seconds, calls]} (a new process's modules, patched
    where they are looked up: each is called through its module or class)."""
    import functools
    import importlib

    totals: dict = {}
    for module_name, attribute, label in STAGES:
        owner = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)

        def timed(*args, __original=original, __label=label, **kwargs):
            start = time.perf_counter()
            try:
                return __original(*args, **kwargs)
            finally:
                entry = totals.setdefault(__label, [0.0, 0])
                entry[0] += time.perf_counter() - start
                entry[1] += 1

        setattr(owner, name, functools.wraps(original)(timed))
    return totals


if __name__ == "__main__":
    main()
