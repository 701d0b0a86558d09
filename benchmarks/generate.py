"""Greedy `generate()` with the KV cache: tokens per second, eager / torch.compile / kiln.

The documented way for both compilers: compile the model's forward and call `generate()`
as usual (`model.forward = kiln.compile(model.forward)`), with the model's DEFAULT config
(its DynamicCache included). One process per case; the driver compares each case's tokens
with eager's and writes a results file:

    python -m benchmarks.generate --out benchmarks/results --label generate-<commit>
    python -m benchmarks.generate --case kiln --small --device cpu     # one case, printed

A case: build the Llama-style model (benchmarks/workloads.py's TARGETS config, or the small
one), run one untimed generate() (prefill + decode compile there), then time `--repeats`
generate() calls of `--new-tokens` greedy tokens each and quote the median. It reports the
tokens, tokens per second, and how many graphs the compiler made (bounded: a prefill and a
decode graph, not one per token).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

CASES = ("eager", "torch.compile", "kiln")


def _model(small: bool, device: str):
    from benchmarks.workloads import llama

    workload = llama(small, device)
    model = workload.program.eval()
    prompt = workload.infer_kwargs["input_ids"][:1, : (8 if small else 128)]
    return model, prompt


def _graph_count(case: str) -> int | None:
    if case == "kiln":
        from kiln.frontend.dispatcher import stats

        return stats.graphs
    if case == "torch.compile":
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    return None


def run_case(case: str, small: bool, device: str, new_tokens: int, repeats: int) -> dict:
    torch.manual_seed(0)
    model, prompt = _model(small, device)
    if case == "torch.compile":
        model.forward = torch.compile(model.forward)
    elif case == "kiln":
        import kiln

        model.forward = kiln.compile(model.forward)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast(
        "cpu", enabled=False)

    def generate():
        with torch.no_grad(), autocast:
            out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        if device == "cuda":
            torch.cuda.synchronize()
        return out

    start = time.perf_counter()
    tokens = generate()
    first = time.perf_counter() - start
    graphs_after_first = _graph_count(case)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = generate()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"case": case, "tokens": tokens[0, prompt.shape[1]:].tolist(), "prompt_tokens": prompt.shape[1],
            "new_tokens": new_tokens, "first_call_s": first, "median_s": median,
            "tokens_per_s": new_tokens / median, "graphs_after_first": graphs_after_first,
            "graphs_after_all": _graph_count(case)}


def _commit() -> str:
    """The commit of the tree that ran (report.git_commit: $KILN_GIT_COMMIT, else HEAD, '-dirty' when changed)."""
    from benchmarks.report import git_commit

    return git_commit(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def drive(args) -> int:
    results = []
    for case in CASES:
        command = [sys.executable, "-m", "benchmarks.generate", "--case", case, "--device", args.device,
                   "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
        if args.small:
            command.append("--small")
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            results.append({"case": case, "error": (done.stderr or done.stdout)[-2000:]})
            continue
        results.append(json.loads(lines[-1]))
    eager = next((result for result in results if result["case"] == "eager" and "tokens" in result), None)
    for result in results:
        if eager is not None and "tokens" in result:
            same = sum(a == b for a, b in zip(result["tokens"], eager["tokens"]))
            result["tokens_matching_eager"] = f"{same}/{len(eager['tokens'])}"
            result["speedup_over_eager"] = result["tokens_per_s"] / eager["tokens_per_s"]
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    import transformers

    header = {"date": datetime.date.today().isoformat(), "device": device_name, "python": platform.python_version(),
              "torch": torch.__version__, "transformers": transformers.__version__, "commit": _commit(),
              "command": "python -m benchmarks.generate " + " ".join(sys.argv[1:]),
              "model": "Llama-style (benchmarks/workloads.py llama, " + ("small" if args.small else "TARGETS") +
                       " config), greedy, bf16 autocast on CUDA"}
    lines = [f"# generate() tokens per second ({header['date']}, {device_name})", ""]
    lines += [f"- {key}: {value}" for key, value in header.items()]
    lines += ["", "| case | tokens/s | speedup | first call s | graphs after first / all | tokens = eager |",
              "|---|---:|---:|---:|---:|---:|"]
    for result in results:
        if "error" in result:
            lines.append(f"| {result['case']} | error: {result['error'][-200:].replace('|', '/')} | | | | |")
            continue
        lines.append(f"| {result['case']} | {result['tokens_per_s']:.1f} | {result.get('speedup_over_eager', 0):.2f} | "
                     f"{result['first_call_s']:.1f} | {result['graphs_after_first']} / {result['graphs_after_all']} | "
                     f"{result.get('tokens_matching_eager', '')} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, f"{header['date']}_{args.label}_{args.device}")
        with open(stem + ".md", "w") as handle:
            handle.write(text)
        with open(stem + ".json", "w") as handle:
            json.dump({"header": header, "results": results}, handle, indent=1)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=CASES)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=int, default=300)
    parser.add_argument("--out", default="")
    parser.add_argument("--label", default="generate")
    args = parser.parse_args()
    if args.case is None:
        return drive(args)
    print(json.dumps(run_case(args.case, args.small, args.device, args.new_tokens, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
