"""Cold and warm first calls: the same case twice, in two new processes sharing one set of caches.

    python -m benchmarks.warm_start --only bert,llama [--backends kiln,inductor] [--out DIR]

For each model and backend, a fresh cache folder (kiln's KILN_CACHE_DIR, Triton's and Inductor's
caches under it) is made; `benchmarks.case` runs the model's inference case in a new process (the
cold start: empty caches), then again in another new process with the caches the first one left
(the warm start: what a user's second run of the same script costs). The first compiled call's wall
time is quoted for each, as benchmarks.run does (bf16 autocast on CUDA). Results go to
benchmarks/results/<date>_<label>_<hardware>.md with the date, hardware, versions, commit and
command.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from benchmarks import report
from benchmarks.run import REPO_ROOT, _case_environment


# What kiln logs (KILN_LOGS=perf) when a warm start cannot skip AOTAutograd for a graph (kiln/aot/plain.py).
_RETRACE_MESSAGES = ("a warm start traces this graph to ATen", "is not linked to its ATen graph",
                     "so it is traced to ATen")


def first_call(spec: dict, cache_dir: str, timeout: float, profile_path: str | None = None) -> dict:
    """One case in a new process with `cache_dir` as its caches: its result record, with "retraced": what
    kiln logged about graphs it traced to ATen although their modules may be cached (and, with
    `profile_path`, a cProfile of its first call written there)."""
    scratch = tempfile.mkdtemp(prefix="kiln_warm_")
    result_path = os.path.join(scratch, "result.json")
    try:
        command = [sys.executable, "-m", "benchmarks.case", json.dumps(spec), result_path]
        env = _case_environment(spec["device"], cache_dir)
        env["KILN_LOGS"] = ",".join(filter(None, [env.get("KILN_LOGS", ""), "perf"]))
        if profile_path:
            env["KILN_BENCH_PROFILE_FIRST_CALL"] = profile_path
        completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if os.path.exists(result_path):
            with open(result_path) as handle:
                record = json.load(handle)
            record["retraced"] = sorted({line.strip() for line in completed.stderr.splitlines()
                                         if any(message in line for message in _RETRACE_MESSAGES)})
            return record
        return {"status": "error", "error": (completed.stdout + completed.stderr).strip()[-300:]}
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"killed after {timeout:.0f} s"}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _key_texts(cache_dir: str) -> dict:
    """{file: text} of the torch-level keys kiln kept under `cache_dir` (KILN_LOGS=perf: kiln/runtime/graph_cache.py)."""
    texts = {}
    for folder, _, files in os.walk(os.path.join(cache_dir, "kiln", "keys")):  # KILN_CACHE_DIR (benchmarks.run)
        for name in files:
            with open(os.path.join(folder, name)) as handle:
                texts[name] = handle.read()
    return texts


def _key_diffs(cold: dict, warm: dict, lines: int = 40) -> list[str]:
    """For each key the warm process made that the cold one did not (a graph whose link it could not find), the
    difference from the cold key of the most similar length: what made one graph's keys differ."""
    import difflib

    diffs = []
    for name in sorted(set(warm) - set(cold)):
        text = warm[name].splitlines()
        if not cold:
            diffs.append(f"{name}: the cold process kept no key")
            continue
        nearest = min(cold, key=lambda other: abs(len(cold[other].splitlines()) - len(text)))
        diff = list(difflib.unified_diff(cold[nearest].splitlines(), text, "cold " + nearest, "warm " + name,
                                         n=0, lineterm=""))
        diffs.append("\n".join(line[:300] for line in diff[:lines]))
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_start", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="bert,llama", help="comma list of models")
    parser.add_argument("--backends", default="kiln", help="comma list: kiln, inductor")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per process")
    parser.add_argument("--label", default="warm-start")
    parser.add_argument("--out", default=None, help="also copy the .md here")
    parser.add_argument("--profile-dir", default=None,
                        help="also run a third (warm) process under cProfile and write its first call's profile here")
    parser.add_argument("--profile-cold", action="store_true",
                        help="with --profile-dir: also a cold process (empty caches of its own) under cProfile, "
                             "cold_first_call_<model>_<backend>.txt: where a cold first call's seconds go")
    args = parser.parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    small = device == "cpu"
    rows = []
    for model in report.names(args.only):
        for backend in report.names(args.backends):
            spec = {"suite": "models", "workload": model, "backend": backend, "mode": "infer", "device": device,
                    "small": small, "warmup": 1, "iterations": 3, "kiln_backend": "kiln", "kiln_strict": False,
                    "check": True, "spin_up_s": 0.0}
            cache_dir = tempfile.mkdtemp(prefix="kiln_warm_cache_")
            try:
                cold = first_call(spec, cache_dir, args.timeout)
                cold_keys = _key_texts(cache_dir)
                warm = first_call(spec, cache_dir, args.timeout)
                warm["key_diffs"] = _key_diffs(cold_keys, _key_texts(cache_dir))
                if args.profile_dir:  # a third process, profiled, so that the two timed ones are not
                    os.makedirs(args.profile_dir, exist_ok=True)
                    first_call(spec, cache_dir, args.timeout,
                               os.path.join(os.path.abspath(args.profile_dir), f"warm_first_call_{model}_{backend}.txt"))
                    if args.profile_cold:
                        cold_cache = tempfile.mkdtemp(prefix="kiln_cold_cache_")
                        try:
                            first_call(spec, cold_cache, args.timeout, os.path.join(
                                os.path.abspath(args.profile_dir), f"cold_first_call_{model}_{backend}.txt"))
                        finally:
                            shutil.rmtree(cold_cache, ignore_errors=True)
            finally:
                shutil.rmtree(cache_dir, ignore_errors=True)
            rows.append((model, backend, cold, warm))
            print(f"{model:10} {backend:9} cold {cold.get('first_call_s', cold.get('error'))} s, "
                  f"warm {warm.get('first_call_s', warm.get('error'))} s, accuracy {cold.get('accuracy_ok')} / "
                  f"{warm.get('accuracy_ok')}", flush=True)
    command = "python -m benchmarks.warm_start " + " ".join(shlex.quote(arg) for arg in (argv or sys.argv[1:]))
    env = report.environment(device, REPO_ROOT, command)
    lines = [f"# Cold and warm first calls ({args.label})", "",
             *(f"- {key}: {value}" for key, value in env.items() if value is not None),
             "- method: each row is one case run twice, each time in a new process; the two share one cache "
             "folder (KILN_CACHE_DIR, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR), empty before the first (cold) "
             "and as the first left it for the second (warm); first call = wall time of the first compiled call (each result checked against eager and float64), "
             "inference" + (", bf16 autocast" if device == "cuda" else ", float32, small models"), "",
             "| model | backend | cold first call s | warm first call s | median ms (cold / warm process) | accuracy "
             "(cold / warm) |",
             "|---|---|---:|---:|---|---|"]
    for model, backend, cold, warm in rows:
        def cell(record, key="first_call_s"):
            value = record.get(key)
            return f"{value:.2f}" if isinstance(value, (int, float)) else record.get("status", "?")
        def verdict(record):
            return {True: "ok", False: "WRONG " + str(record.get("accuracy", ""))[:80]}.get(record.get("accuracy_ok"),
                                                                                            "-")

        lines.append(f"| {model} | {backend} | {cell(cold)} | {cell(warm)} | "
                     f"{cell(cold, 'median_ms')} / {cell(warm, 'median_ms')} | {verdict(cold)} / {verdict(warm)} |")
    warm_notes = [(model, backend, line) for model, backend, _, warm in rows for line in warm.get("retraced", [])]
    cold_notes = [(model, backend, line) for model, backend, cold, _ in rows for line in cold.get("retraced", [])
                  if "is not linked" in line]
    for title, notes in (("Graphs the warm process traced to ATen again", warm_notes),
                         ("What the cold process could not link for a warm start", cold_notes)):
        if notes:
            lines += ["", f"## {title} (KILN_LOGS=perf)", "",
                      *(f"- {model}, {backend}: {line}" for model, backend, line in notes)]
    diffs = [(model, backend, diff) for model, backend, _, warm in rows for diff in warm.get("key_diffs", [])]
    if diffs:
        lines += ["", "## Keys the warm process made that the cold one did not (diffed against the cold key nearest in "
                  "length)", ""]
        for model, backend, diff in diffs:
            lines += [f"- {model}, {backend}:", "", "```", diff, "```", ""]
    text = "\n".join(lines) + "\n"
    stem = f"{env['date'][:10]}_{args.label}_{report.hardware_tag(env)}"
    path = os.path.join(REPO_ROOT, "benchmarks", "results", stem + ".md")
    with open(path, "w") as handle:
        handle.write(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        shutil.copy(path, args.out)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
