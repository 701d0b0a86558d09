"""The benchmark harness's command line: plan the cases, run each in its own process, report.

    python -m benchmarks.run --suite models --backends eager,inductor,kiln --modes infer,cudagraphs
    python -m benchmarks.run --suite all --small            # everything, shrunk, on this CPU

Each case (workload x backend x mode) runs as `python -m benchmarks.case` in a fresh
process with its own timeout and (by default) its own empty compile caches, so every
"first call" is a cold compile. Results go to benchmarks/results/<date>_<label>_<hardware>.{md,json,log},
rewritten after every case. A case that crashes, times out or is skipped is recorded
with its reason. See benchmarks/README.md for the columns.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks import report
from benchmarks.workloads import DEFAULT_MODELS, DEFAULT_SMALL_MODELS, KERNELS, MODELS

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("eager", "inductor", "kiln")
MODES = ("infer", "cudagraphs", "train", "train-cudagraphs", "autotune")
DEFAULT_MODES = ("infer", "cudagraphs", "train")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("models", "kernels", "all"), default="models")
    parser.add_argument("--backends", default="eager,inductor,kiln", help="comma list of " + ",".join(BACKENDS))
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help="comma list of " + ",".join(MODES) +
                        " (autotune: inference under mode='max-autotune')")
    parser.add_argument("--only", default="", help="comma list of model / kernel names (default: all of the suite)")
    parser.add_argument("--small", action="store_true",
                        help="shrink every model and shape; CPU, float32, no autocast unless --device cuda")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default: cuda when available and not --small, else cpu")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 3; 1 with --small)")
    parser.add_argument("--iterations", type=int, default=None, help="timed calls (default 30; 5 with --small)")
    parser.add_argument("--spin-up", type=float, default=1.0,
                        help="seconds of matmuls on the GPU after the first call, before the warm-up calls, "
                             "so timed calls run at steady clocks (0: off; ignored on a CPU)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case before it is killed")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole run; cases that would start after it are recorded as skipped")
    parser.add_argument("--kiln-backend", default=os.environ.get("KILN_BENCH_BACKEND", "kiln"),
                        help="kiln ladder rung for the 'kiln' column: kiln (default), aot_eager, eager")
    parser.add_argument("--kiln-strict", action="store_true",
                        help="KILN_STRICT for kiln cases: a graph kiln cannot compile fails the case "
                             "instead of running eagerly (default: off, and kiln's warnings are counted)")
    parser.add_argument("--no-check", action="store_true", help="skip the accuracy checks")
    parser.add_argument("--shared-cache", action="store_true",
                        help="let cases share compile caches (default: each case starts cold)")
    parser.add_argument("--label", default=None,
                        help="file name part for the results (default: suite, modes unless all, --only names, -small)")
    parser.add_argument("--results-dir", default=os.path.join(REPO_ROOT, "benchmarks", "results"))
    parser.add_argument("--copy-to", default=None, help="also keep the .md/.json/.log current in this folder")
    args = parser.parse_args(argv)
    args.backends = _split(args.backends, BACKENDS, "backend")
    args.modes = _split(args.modes, MODES, "mode")
    args.warmup = args.warmup if args.warmup is not None else (1 if args.small else 3)
    args.iterations = args.iterations if args.iterations is not None else (5 if args.small else 30)
    return args


def _split(text: str, allowed: tuple, what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in items if item not in allowed]
    if unknown:
        raise SystemExit(f"unknown {what}(s) {unknown}; choose from {list(allowed)}")
    return items


def choose_device(args) -> str:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here; use --small (CPU) instead")
    if args.device:
        return args.device
    if args.small or not torch.cuda.is_available():
        if not args.small:
            raise SystemExit("no CUDA device: the full-size suite needs a GPU; run with --small on a CPU")
        return "cpu"
    return "cuda"


def plan(args, device: str) -> tuple[list[dict], dict]:
    """Every case to run, in order (per workload: eager first, so partial runs give whole rows)."""
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    known = set(MODELS) | set(KERNELS)
    if any(name not in known for name in only):
        raise SystemExit(f"--only: unknown {sorted(set(only) - known)}; models {sorted(MODELS)}, kernels {KERNELS}")
    suites = ["models", "kernels"] if args.suite == "all" else [args.suite]
    chosen = {"models": [], "kernels": []}
    if "models" in suites:
        default_models = DEFAULT_SMALL_MODELS if args.small else DEFAULT_MODELS
        chosen["models"] = [m for m in (only or default_models) if m in MODELS]
    if "kernels" in suites:
        chosen["kernels"] = [k for k in KERNELS if not only or k in only or k == "copy"]
    specs = []
    for suite in suites:
        for workload in chosen[suite]:
            for mode in MODES:
                if mode not in args.modes or (suite == "kernels" and mode.startswith("train")):
                    continue
                for backend in args.backends:
                    if (backend == "eager" and mode in ("cudagraphs", "train-cudagraphs", "autotune")) or \
                            (workload == "copy" and backend != "eager"):
                        continue
                    if workload == "copy" and mode != "infer":
                        continue
                    specs.append({"suite": suite, "workload": workload, "backend": backend, "mode": mode,
                                  "device": device, "small": args.small, "warmup": args.warmup,
                                  "iterations": args.iterations, "kiln_backend": args.kiln_backend,
                                  "kiln_strict": args.kiln_strict, "check": not args.no_check,
                                  "spin_up_s": args.spin_up if device == "cuda" else 0.0})
    autocast = "bf16 autocast" if device == "cuda" and not args.small else (
        "bf16 autocast (models), float32 kernels" if device == "cuda" else "float32, no autocast")
    method = (f"{device}, {autocast}; inference under torch.no_grad(); training = forward + loss.backward() "
              f"(no optimizer step); first call timed as compile time (wall); "
              f"{f'{args.spin_up:g} s of GPU spin-up, ' if device == 'cuda' and args.spin_up > 0 else ''}"
              f"{args.warmup} warm-up calls; "
              f"{args.iterations} timed calls ({'CUDA events' if device == 'cuda' else 'time.perf_counter'}), "
              f"median quoted; each case in its own process"
              f"{' with cold compile caches' if not args.shared_cache else ''}")
    summary = {"suites": suites, "models": chosen["models"], "kernels": chosen["kernels"],
               "backends": args.backends, "modes": args.modes, "small": args.small, "device": device,
               "kiln_backend": args.kiln_backend, "kiln_strict": args.kiln_strict, "method": method}
    return specs, summary


def default_label(args) -> str:
    """The results' file name part: suite, modes unless all, models/kernels when --only, '-small'."""
    parts = [args.suite]
    if args.modes != list(DEFAULT_MODES):
        parts += args.modes
    parts += [name.strip() for name in args.only.split(",") if name.strip()]
    return "-".join(parts) + ("-small" if args.small else "")


def _case_environment(device: str, cache_dir: str | None) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if device == "cpu":
        env.setdefault("TRITON_INTERPRET", "1")  # kiln's Triton kernels run under the interpreter on a CPU
    if cache_dir:
        for variable, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
                              ("KILN_CACHE_DIR", "kiln")):
            env[variable] = os.path.join(cache_dir, sub)
    return env


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else "(no output)"


def run_case(spec: dict, timeout: float, shared_cache: bool, log) -> dict:
    """Run one case in a child process; always return a record, whatever happened to the child."""
    scratch = tempfile.mkdtemp(prefix="kiln_bench_")
    result_path = os.path.join(scratch, "result.json")
    output_path = os.path.join(scratch, "output.txt")
    env = _case_environment(spec["device"], None if shared_cache else os.path.join(scratch, "cache"))
    command = [sys.executable, "-m", "benchmarks.case", json.dumps(spec), result_path]
    started = time.perf_counter()
    record = {key: spec[key] for key in ("suite", "workload", "backend", "mode")}
    try:
        with open(output_path, "w") as output:
            child = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                returncode = child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)  # the child's own process group: it and its compile workers
                child.wait()
                returncode = None
        with open(output_path, errors="replace") as output:
            text = output.read()
        log.write(f"\n===== {record} (exit {returncode}) =====\n{text}")
        log.flush()
        if returncode is None:
            record.update(status="timeout", error=f"killed after {timeout:.0f} s; last output: {_last_line(text)}")
        elif os.path.exists(result_path):
            with open(result_path) as handle:
                record.update(json.load(handle))
        else:
            record.update(status="error", error=f"exit code {returncode}: {_last_line(text)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    record["wall_s"] = round(time.perf_counter() - started, 2)
    return record


def _progress_line(position: int, total: int, case: dict) -> str:
    name = f"[{position}/{total}] {case['suite']}/{case['workload']} {case['backend']} {case['mode']}"
    if case.get("status") != "ok":
        return f"{name}: {case.get('status')}: {case.get('error', '')}"
    accuracy = ""
    if "accuracy_ok" in case:
        accuracy = "  accuracy ok" if case["accuracy_ok"] else f"  accuracy FAIL: {case['accuracy']}"
    return (f"{name}: {case['median_ms']:.4g} ms  first call {case['first_call_s']:.1f} s"
            f"{accuracy}  ({case['wall_s']:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command_line = "python -m benchmarks.run " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    device = choose_device(args)
    specs, summary = plan(args, device)
    env = report.environment(device, REPO_ROOT, command_line)
    label = args.label or default_label(args)
    tag = report.hardware_tag(env)
    stem = f"{datetime.date.today().isoformat()}_{label}_{tag}"
    os.makedirs(args.results_dir, exist_ok=True)
    log_paths = [os.path.join(args.results_dir, stem + ".log")]
    if args.copy_to:
        log_paths.append(os.path.join(args.copy_to, stem + ".log"))
        os.makedirs(args.copy_to, exist_ok=True)
    print(f"kiln benchmarks: {len(specs)} cases on {env['gpu'] or 'CPU'}; results: "
          f"{os.path.join(args.results_dir, stem)}.{{md,json,log}}", flush=True)

    deadline = time.perf_counter() + args.budget if args.budget else None
    cases: list[dict] = []
    logs = [open(path, "w") for path in log_paths]
    log = report.Tee(logs)
    try:
        for position, spec in enumerate(specs, 1):
            remaining = deadline - time.perf_counter() if deadline else None
            if remaining is not None and remaining < 20:
                case = {key: spec[key] for key in ("suite", "workload", "backend", "mode")}
                case.update(status="skipped", error=f"time budget of {args.budget:.0f} s spent")
            elif spec["mode"] in ("cudagraphs", "train-cudagraphs") and device != "cuda":
                case = {key: spec[key] for key in ("suite", "workload", "backend", "mode")}
                case.update(status="skipped", error="CUDA graphs need a GPU")
            else:
                timeout = min(args.timeout, remaining) if remaining is not None else args.timeout
                case = run_case(spec, timeout, args.shared_cache, log)
            cases.append(case)
            print(_progress_line(position, len(specs), case), flush=True)
            report.write(args.results_dir, stem, env, cases, summary, label, copy_to=args.copy_to)
    finally:
        for handle in logs:
            handle.close()
    print()
    print("\n".join(report.summary_sections(cases, summary)))
    print(f"written: {os.path.join(args.results_dir, stem)}.{{md,json,log}}")
    failed = [c for c in cases if c.get("status") in ("error", "timeout") or c.get("accuracy_ok") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
