"""CPU benchmarks of kiln's C++ backend: kiln vs eager vs torch.compile (Inductor CPU).

    python -m benchmarks.cpu                         # every workload, all three backends
    python -m benchmarks.cpu --only softmax,bert --iterations 10

fp32 inference (torch.no_grad) at CPU sizes: sin(x)+sin(y) on 2^24 elements, gelu(x+b),
layer_norm and softmax over 2048x2048, and 4-layer BERT, GPT-2 and Llama built from
configs with random weights, batch 4. Each (workload, backend) runs in its own process
with empty compile caches (kiln's and Inductor's), so the first call's wall time is a
cold compile; then warm-up calls and timed calls (time.perf_counter, median quoted).
Every compiled result is checked with kiln's accuracy rule (vs eager and float64).
Results: benchmarks/results/<date>_cpu_<hardware>.{md,json}, with the date, `lscpu`'s
model, core count, versions, commit and command line.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile

import torch

from benchmarks import timing
from benchmarks.case import Runner, check_accuracy, compile_program, error_summary
from benchmarks.workloads import Workload, gelu_bias, layer_norm, sin_add, softmax_last

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = ["sin_add", "gelu_bias", "layer_norm", "softmax"]
MODELS = ["bert", "gpt2", "llama"]
BACKENDS = ["eager", "inductor", "kiln"]


def _kernel_workload(name: str, fn, *inputs) -> Workload:
    shape = " , ".join("x".join(map(str, tensor.shape)) for tensor in inputs)
    return Workload(name, shape, fn, infer_args=inputs, autocast=False)


def cpu_workload(name: str) -> Workload:
    """One workload at the CPU benchmark's size (fp32)."""
    import transformers

    torch.manual_seed(0)
    if name == "sin_add":
        return _kernel_workload(name, sin_add, torch.randn(1 << 24), torch.randn(1 << 24))
    if name == "gelu_bias":
        return _kernel_workload(name, gelu_bias, torch.randn(2048, 2048), torch.randn(2048))
    if name == "layer_norm":
        return _kernel_workload(name, layer_norm, torch.randn(2048, 2048), torch.randn(2048), torch.randn(2048))
    if name == "softmax":
        return _kernel_workload(name, softmax_last, torch.randn(2048, 2048))
    if name == "bert":
        config = transformers.BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                         intermediate_size=1024)
        model, batch, seq = transformers.BertModel(config), 4, 128
    elif name == "gpt2":
        config = transformers.GPT2Config(n_layer=4, n_embd=384, n_head=6, vocab_size=8192, n_positions=256)
        model, batch, seq = transformers.GPT2LMHeadModel(config), 4, 256
    elif name == "llama":
        config = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=512, num_attention_heads=8,
                                          num_key_value_heads=4, intermediate_size=1376, vocab_size=8192,
                                          max_position_embeddings=256)
        model, batch, seq = transformers.LlamaForCausalLM(config), 4, 128
    else:
        raise KeyError(f"unknown workload {name!r}; choose from {KERNELS + MODELS}")
    model.eval()
    input_ids = torch.randint(0, config.vocab_size, (batch, seq))
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    return Workload(name, f"{batch} x {seq} tokens, 4 layers, hidden {hidden}", model,
                    infer_kwargs={"input_ids": input_ids}, autocast=False)


def run_one(name: str, backend: str, warmup: int, iterations: int) -> dict:
    """Compile (first call), check, time: one case, in this process."""
    workload = cpu_workload(name)
    program = compile_program(workload.program, backend, "infer", "kiln")
    runner = Runner(workload, program, "infer", "cpu", use_autocast=False, mark_cudagraph_steps=False)
    row = {"workload": name, "backend": backend, "shape": workload.shape}
    compile_seconds, _ = timing.time_first_call(runner, "cpu")
    row["first_call_s"] = round(compile_seconds, 3)
    if backend != "eager":
        eager = Runner(workload, workload.program, "infer", "cpu", use_autocast=False, mark_cudagraph_steps=False)
        row.update(check_accuracy(workload, runner, eager, "infer"))
    for _ in range(warmup):
        runner()
    row.update(timing.summarize(timing.time_calls(runner, "cpu", iterations)))
    if backend == "kiln":
        import kiln

        row["kiln_cpu_backend"] = kiln.config.cpu_backend
    return row


def run_interleaved(name: str, backends: list, warmup: int, iterations: int) -> list:
    """All backends in this one process, timed in turns (eager, inductor, kiln, eager, ...), so
    other work on a shared machine slows each of them alike."""
    import time

    workload = cpu_workload(name)
    eager = Runner(workload, workload.program, "infer", "cpu", use_autocast=False, mark_cudagraph_steps=False)
    rows, runners = [], []
    for backend in backends:
        program = compile_program(workload.program, backend, "infer", "kiln")
        runner = Runner(workload, program, "infer", "cpu", use_autocast=False, mark_cudagraph_steps=False)
        row = {"workload": name, "backend": backend, "shape": workload.shape, "interleaved": True}
        row["first_call_s"] = round(timing.time_first_call(runner, "cpu")[0], 3)
        if backend != "eager":
            row.update(check_accuracy(workload, runner, eager, "infer"))
        for _ in range(warmup):
            runner()
        rows.append(row)
        runners.append(runner)
    times: list = [[] for _ in backends]
    for _ in range(iterations):
        for position, runner in enumerate(runners):
            start = time.perf_counter()
            runner()
            times[position].append((time.perf_counter() - start) * 1000.0)
    for row, backend_times in zip(rows, times):
        row.update(timing.summarize(backend_times))
    return rows


def _load_average() -> float:
    """The 1-minute load average: other work on the machine shows in the medians."""
    with open("/proc/loadavg") as handle:
        return float(handle.read().split()[0])


def _run_in_subprocess(name: str, backend: str, args) -> list:
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as caches:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"),
                   KILN_CACHE_DIR=os.path.join(caches, "kiln"), TRITON_CACHE_DIR=os.path.join(caches, "triton"))
        env.setdefault("KILN_CPU_BACKEND", "cpp")
        if args.threads:
            env["OMP_NUM_THREADS"] = str(args.threads)  # torch's, Inductor's and kiln's kernels alike
        command = [sys.executable, "-m", "benchmarks.cpu", "--case", name, backend,
                   "--warmup", str(args.warmup), "--iterations", str(args.iterations)]
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    rows = [{**json.loads(line), "load_average_after": _load_average()}
            for line in done.stdout.splitlines() if line.startswith("{")]
    return rows or [{"workload": name, "backend": backend, "error": (done.stderr or done.stdout)[-600:]}]


def _hardware() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = fields.get("Flags", "")
    return {"cpu": fields.get("Model name", "?").strip(), "cpus": os.cpu_count(),
            "vector": "avx512" if "avx512f" in flags else ("avx2" if "avx2" in flags else "other")}


def _commit() -> str:
    from benchmarks.report import git_commit  # $KILN_GIT_COMMIT, else HEAD ('-dirty' when changed)

    return git_commit(REPO_ROOT)


def render(rows: list, meta: dict) -> str:
    lines = [f"# CPU benchmarks: kiln (C++ backend) vs eager vs torch.compile, {meta['date']}", "",
             f"`{meta['command']}`", "",
             f"{meta['hardware']['cpu']}, {meta['hardware']['cpus']} cores ({meta['hardware']['vector']}); "
             f"torch {meta['torch']}, Python {meta['python']}, {meta['compiler']}; commit {meta['commit']}.", "",
             meta["method"], "",
             "| workload | shape | eager ms | inductor ms | kiln ms | kiln vs eager | kiln vs inductor | "
             "inductor compile s | kiln compile s | accuracy (inductor / kiln) | load avg (e / i / k) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    # Times are "median (min)": on a shared machine the minimum shows the code, the median the wait.
    # With several rounds, a case's row is the median over rounds of each process's median (and the
    # least minimum), and the last column lists kiln vs Inductor round by round.
    by_case: dict = {}
    for row in rows:
        by_case.setdefault((row["workload"], row["backend"]), []).append(row)
    rounds = max((row.get("round", 0) for row in rows), default=0) + 1
    if rounds > 1:
        lines[-2] = lines[-2].rstrip() + " kiln vs inductor, each round |"
        lines[-1] += "---|"

    def combined(case_rows: list) -> dict:
        timed = [row for row in case_rows if "median_ms" in row]
        if not timed:
            return case_rows[0] if case_rows else {}
        row = dict(timed[0])
        row["median_ms"] = statistics.median(r["median_ms"] for r in timed)
        row["min_ms"] = min(r["min_ms"] for r in timed)
        row["first_call_s"] = statistics.median(r["first_call_s"] for r in timed)
        row["accuracy_ok"] = all(r.get("accuracy_ok", True) for r in timed)
        return row

    for name in meta["workloads"]:
        eager, inductor, kiln = (combined(by_case.get((name, backend), [])) for backend in BACKENDS)

        def ms(row):
            if "median_ms" not in row:
                return "error" if row.get("error") else "-"
            return f"{row['median_ms']:.2f} ({row['min_ms']:.2f})"

        def ratio(a, b):
            if "median_ms" not in a or "median_ms" not in b:
                return "-"
            return f"{a['median_ms'] / b['median_ms']:.2f}x ({a['min_ms'] / b['min_ms']:.2f}x)"

        def first(row):
            return f"{row['first_call_s']:.1f}" if "first_call_s" in row else "-"

        def load(row):
            return f"{row['load_average_after']:.1f}" if "load_average_after" in row else "-"

        def accuracy(row):
            return "ok" if row.get("accuracy_ok") else (row.get("accuracy") or row.get("error", "-"))[:80]

        shape = (eager or kiln).get("shape", "")
        lines.append(f"| {name} | {shape} | {ms(eager)} | {ms(inductor)} | {ms(kiln)} | {ratio(eager, kiln)} | "
                     f"{ratio(inductor, kiln)} | {first(inductor)} | {first(kiln)} | "
                     f"{accuracy(inductor)} / {accuracy(kiln)} | {load(eager)} / {load(inductor)} / {load(kiln)} |")
        if rounds > 1:
            per_round = []
            for number in range(rounds):
                pair = [next((row for row in by_case.get((name, backend), []) if row.get("round", 0) == number
                              and "median_ms" in row), None) for backend in ("inductor", "kiln")]
                per_round.append(f"{pair[0]['median_ms'] / pair[1]['median_ms']:.2f}" if all(pair) else "-")
            lines[-1] += " " + ", ".join(per_round) + " |"
    lines += ["", "Times: median (min) of the timed calls. Ratios: speedups of kiln (>1: kiln faster), of the "
              "medians (of the minimums). Compile s = wall time of the first call with cold caches (includes "
              "graph capture). Load avg: the machine's 1-minute load average after each case (2 cores: above 2 means "
              "other work competed for them)."]
    errors = [row for row in rows if row.get("error")]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {row['workload']} / {row['backend']}: "
                                          f"{' '.join(row['error'].split())[:400]}" for row in errors]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma list of " + ",".join(KERNELS + MODELS))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per case")
    parser.add_argument("--label", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for every case (0: the default)")
    parser.add_argument("--interleaved", action="store_true",
                        help="per workload, one process compiles all backends and times them in turns "
                             "(fairer on a machine shared with other work)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every case this many times, each in a fresh process, the backends' order "
                             "rotated each round; the table gives the median over rounds")
    parser.add_argument("--case", nargs=2, metavar=("WORKLOAD", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        name, backend = args.case
        try:
            if "," in backend:
                rows = run_interleaved(name, backend.split(","), args.warmup, args.iterations)
            else:
                rows = [run_one(name, backend, args.warmup, args.iterations)]
        except Exception as error:  # recorded in the table, never hidden
            rows = [{"workload": name, "backend": backend, "error": error_summary(error)}]
        for row in rows:
            print(json.dumps(row))
        return 0

    from kiln.runtime.cpp_build import toolchain

    names = [n for n in (args.only.split(",") if args.only else KERNELS + MODELS) if n]
    backends = [b for b in args.backends.split(",") if b]
    date = datetime.datetime.now().isoformat(timespec="seconds")
    hardware = _hardware()
    meta = {"date": date, "command": "python -m benchmarks.cpu " + " ".join(map(shlex.quote, argv or sys.argv[1:])),
            "hardware": hardware, "torch": torch.__version__, "python": platform.python_version(),
            "compiler": toolchain().version, "commit": _commit(), "workloads": names,
            "method": f"fp32 inference under torch.no_grad(); "
                      + ("per workload one process compiles eager, Inductor and kiln and times them in turns"
                         if args.interleaved else "each case in its own process")
                      + (f", {args.rounds} rounds (backend order rotated)" if args.rounds > 1 else "")
                      + f", with empty kiln and Inductor caches; first call = compile (wall); {args.warmup} warm-up "
                      f"calls, {args.iterations} timed calls (time.perf_counter), median; torch threads: "
                      f"{args.threads or torch.get_num_threads()}."}
    stem = os.path.join(REPO_ROOT, "benchmarks", "results",
                        f"{date[:10]}_{args.label}_{hardware['cpu'].lower().replace(' ', '-')}-{hardware['cpus']}core")
    rows = []
    for name in names:
        for number in range(args.rounds):
            order = backends[number % len(backends):] + backends[:number % len(backends)]
            for group in ([",".join(order)] if args.interleaved else order):
                for row in _run_in_subprocess(name, group, args):
                    rows.append({**row, "round": number})
                    print(json.dumps(rows[-1]), flush=True)
                print(json.dumps(row), flush=True)
                with open(stem + ".json", "w") as handle:
                    json.dump({"meta": meta, "rows": rows}, handle, indent=1)
                with open(stem + ".md", "w") as handle:
                    handle.write(render(rows, meta))
    print(f"wrote {stem}.md and {stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
