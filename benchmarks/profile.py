"""Where a compiled model's time goes, on a GPU: device time, host time, top kernels.

    python -m benchmarks.profile --only bert,llama --backends kiln,inductor [--modes infer,cudagraphs] [--out DIR]

For each model x backend (each in a process of its own, as benchmarks.run runs a case; `--in-process`
runs them all in this one), after compiling and warming up:

- device ms per call: median of CUDA-event-timed calls, each followed by a synchronize;
- back-to-back ms per call: median of CUDA-event-timed calls issued without a synchronize
  (benchmarks.run's method: about max(host, GPU) once the host runs ahead);
- host ms per call: wall time to *issue* 20 calls without synchronizing, per call.
  When host ms is close to device ms, the program is launch-bound (Python and launch
  overhead), not kernel-bound;
- kernel launches per call, GPU kernel ms per call (the device events' own time, summed) and the
  top kernels by device time (torch.profiler);
- memory: peak allocated GiB over the timed calls (what benchmarks.run reports), and the
  allocator's reserved GiB. Under CUDA graphs the two backends' allocated bytes do not compare:
  torch.compile's CUDA-graph trees hand out outputs from their pool without the allocator
  counting them, so reserved (every segment the caching allocator holds, graph pools
  included) is the figure to compare there.
Run with KILN_DEBUG=1 KILN_DEBUG_DIR=$OUT/kiln_debug to keep kiln's kernels and wrappers.

Writes profile_<model>_<backend>.txt per case and profile_summary.md under --out.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from benchmarks import timing, workloads
from benchmarks.case import Runner, compile_program


def _profile_table(runner, calls: int = 5) -> tuple[str, float, float]:
    """The profiler's table, device events per call, and the device events' own milliseconds per call."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            runner()
        torch.cuda.synchronize()
    events = prof.key_averages()
    device_events = [event for event in events if getattr(event, "device_type", None) is not None
                     and "CUDA" in str(event.device_type)]
    launches = sum(event.count for event in device_events) / calls
    # the device events' own time, as the profiler's "Self CUDA time total" sums it (a CPU op's row repeats
    # its kernels' time, so only device-side events count); microseconds in the profile
    own_time = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    kinds: dict = {}  # kind -> [launches, ms] per call
    for event in device_events:
        if not getattr(event, "is_user_annotation", False):
            per_kind = kinds.setdefault(kernel_kind(event.key), [0.0, 0.0])
            per_kind[0] += event.count / calls
            per_kind[1] += getattr(event, own_time) / calls / 1000.0
    kernel_ms = sum(ms for _, ms in kinds.values())
    table = events.table(sort_by="self_cuda_time_total" if hasattr(events[0], "self_cuda_time_total")
                         else "self_device_time_total", row_limit=30, max_name_column_width=90)
    breakdown = "GPU time by kind (per call): " + "; ".join(
        f"{kind} {ms:.3f} ms in {count:.0f}" for kind, (count, ms) in sorted(kinds.items(), key=lambda item: -item[1][1]))
    return breakdown + "\n\n" + table, launches, kernel_ms


# What a device kernel's name says it is: the first kind whose words it contains (lower case).
KERNEL_KINDS = (("layout transform", ("nchwtonhwc", "nhwctonchw", "transpose")),
                ("batch norm (ATen, cuDNN)", ("batch_norm", "bn_fw", "bn_bw")),
                ("convolution", ("conv", "dgrad", "wgrad", "xmma", "implicit_gemm", "cudnn")),
                ("matmul", ("gemm", "cutlass", "cublas", "nvjet")),
                ("generated (Triton)", ("kernel_", "triton_")),
                ("ATen elementwise", ("elementwise", "vectorized", "unrolled")),
                ("ATen reduction", ("reduce",)),
                ("copy / memset", ("memcpy", "memset", "copy")))


def kernel_kind(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, words in KERNEL_KINDS if any(word in lower for word in words)), "other")


def _python_profile(runner, calls: int = 20, rows: int = 45) -> str:
    """Where the host's time goes, by Python function (cProfile), over `calls` calls issued without a
    synchronize (the last one synchronizes, outside the profile): the wrapper, the launcher, the guards,
    each ATen call made from Python. Sorted by own time."""
    import cProfile
    import io
    import pstats

    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        runner()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(rows)
    return f"cProfile over {calls} calls (seconds are totals over them)\n" + text.getvalue()


def profile_case(name: str, backend: str, mode: str, out_dir: str, tag: str = "",
                 python_profile: bool = False) -> str:
    """One model x backend x mode ("infer", "cudagraphs" or "train"): its row of the summary table."""
    workload = workloads.build("models", name, small=False, device="cuda")
    if workload.is_module:
        # inference, as benchmarks.run measures it (no dropout); training: forward and backward, dropout on
        workload.program.train(mode == "train")
    program = compile_program(workload.program, backend, mode, "kiln")
    runner = Runner(workload, program, mode, "cuda", use_autocast=True,
                    mark_cudagraph_steps=(backend == "inductor" and mode == "cudagraphs"))
    begin = time.perf_counter()
    runner()
    torch.cuda.synchronize()
    first_call = time.perf_counter() - begin
    for _ in range(3):
        runner()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    device_ms = timing.per_call_ms(runner, 20, synchronize_each=True)
    back_to_back_ms = timing.per_call_ms(runner, 20, synchronize_each=False)
    host_ms = timing.issue_ms(runner, 20)
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    reserved_gib = torch.cuda.memory_reserved() / 2**30
    table, launches, kernel_ms = _profile_table(runner)
    lines = [f"# {name} / {backend} / {mode}", f"first call {first_call:.1f} s; device {device_ms:.3f} ms/call; "
             f"back-to-back {back_to_back_ms:.3f} ms/call; host (issue only) {host_ms:.3f} ms/call; "
             f"GPU kernels {kernel_ms:.3f} ms/call; ~{launches:.0f} device events/call; "
             f"peak allocated {peak_gib:.2f} GiB, reserved {reserved_gib:.2f} GiB"]
    lines += ["", table]
    if python_profile:
        lines += ["", _python_profile(runner)]
    with open(os.path.join(out_dir, f"profile_{name}_{backend}_{mode}{tag}.txt"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return (f"| {name} | {backend}{tag} | {mode} | {device_ms:.3f} | {back_to_back_ms:.3f} | {host_ms:.3f} | "
            f"{kernel_ms:.3f} | {launches:.0f} | {peak_gib:.2f} | {reserved_gib:.2f} | {first_call:.1f} |")


_ROW = "profile row: "


def _case_in_its_own_process(name: str, backend: str, mode: str, args) -> str:
    """Runs one case as `python -m benchmarks.profile --in-process ...` and returns its row."""
    import subprocess

    command = [sys.executable, "-m", "benchmarks.profile", "--in-process", "--row-only", "--only", name,
               "--backends", backend, "--modes", mode, "--out", args.out, f"--tag={args.tag}"]
    if args.python_profile:
        command.append("--python-profile")
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    rows = [line[len(_ROW):] for line in done.stdout.splitlines() if line.startswith(_ROW)]
    if rows:
        return rows[-1]
    return (f"| {name} | {backend} | {mode} | error: exit {done.returncode}: "
            f"{(done.stderr or done.stdout)[-200:]!r} | | | | | | | | |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="bert,gpt2,llama,resnet50,vit,resnet18")
    parser.add_argument("--backends", default="kiln,inductor")
    parser.add_argument("--modes", default="infer", help="infer, cudagraphs (reduce-overhead) and/or train")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results/out"))
    parser.add_argument("--tag", default="", help="suffix for the file names (e.g. which kiln options were set)")
    parser.add_argument("--python-profile", action="store_true",
                        help="add a cProfile table of the host's Python time per function to each case's file")
    parser.add_argument("--in-process", action="store_true", help="every case in this process")
    parser.add_argument("--row-only", action="store_true", help=argparse.SUPPRESS)  # a case's own process
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case in its own process")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = ["| model | backend | mode | device ms | back-to-back ms | host ms | GPU kernel ms | device events/call | "
            "peak allocated GiB | reserved GiB | first call s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in args.only.split(","):
        for mode in args.modes.split(","):
            for backend in args.backends.split(","):
                if not args.in_process:
                    rows.append(_case_in_its_own_process(name, backend, mode, args))
                    print(rows[-1], flush=True)
                    continue
                try:
                    rows.append(profile_case(name, backend, mode, args.out, args.tag, args.python_profile))
                except Exception as error:  # a diagnosis run reports every case it can
                    rows.append(f"| {name} | {backend} | {mode} | error: {type(error).__name__}: "
                                f"{str(error)[:200]} | | | | | | | | |")
                print((_ROW if args.row_only else "") + rows[-1], flush=True)
                torch._dynamo.reset()
                torch.cuda.empty_cache()
    if args.row_only:
        return 0
    summary = "\n".join(rows) + "\n"
    from benchmarks import report

    env = report.environment("cuda" if torch.cuda.is_available() else "cpu",
                             os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "python -m benchmarks.profile " + " ".join(argv))
    header = report.text_header(f"Profile: {args.only} x {args.backends} x {args.modes}", env, __doc__)
    text = "\n".join(header) + "\n" + summary
    with open(os.path.join(args.out, f"profile_summary{args.tag}.md"), "w") as handle:
        handle.write(text)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
