"""Error of each backend's model outputs against a float64 run of the same model (CPU, fp32).

    python -m benchmarks.cpu_accuracy [--only bert,gpt2,llama] [--label cpu-accuracy]

For each model of benchmarks.cpu: eager fp32, Inductor, kiln with products on oneDNN (the
default) and kiln with aten.mm (KILN_CPU_GEMM=aten), each compared with the model run in
float64: max abs error, relative RMS error, and the verdict of kiln.testing.compare (error
within 2x eager's plus 16 ulp of the output's scale). Writes benchmarks/results/<date>_<label>_<host>.md.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import sys

import torch

from benchmarks.case import compile_program
from benchmarks.cpu import MODELS, _commit, _hardware, cpu_workload

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _output(result) -> torch.Tensor:
    for name in ("logits", "last_hidden_state"):
        if hasattr(result, name):
            return getattr(result, name)
    return result[0]


def _errors(got: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    difference = got.double() - reference
    return float(difference.abs().max()), float((difference.pow(2).mean() / reference.pow(2).mean()).sqrt())


def measure(name: str) -> list[dict]:
    import kiln
    from kiln.testing import compare

    workload = cpu_workload(name)
    model, inputs = workload.program, workload.infer_kwargs
    with torch.no_grad():
        reference = _output(copy.deepcopy(model).double()(**inputs)).double()
        eager = _output(model(**inputs))
        rows = []
        cases = [("eager", None, {}), ("inductor", "inductor", {}), ("kiln (oneDNN products)", "kiln", {}),
                 ("kiln (aten.mm products)", "kiln", {"cpu_gemm": "aten"})]
        for label, backend, options in cases:
            if backend is None:
                got = eager
            else:
                with kiln.config.patch(**options):
                    program = compile_program(model, backend, "infer", "kiln")
                    got = _output(program(**inputs))
                torch._dynamo.reset()
            max_error, relative_rms = _errors(got, reference)
            verdict = compare(got, eager, reference)
            rows.append({"model": name, "backend": label, "max_error": max_error, "relative_rms": relative_rms,
                         "verdict": verdict.message})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(MODELS))
    parser.add_argument("--label", default="cpu-accuracy")
    args = parser.parse_args(argv)
    rows = [row for name in args.only.split(",") for row in measure(name)]
    hardware = _hardware()
    lines = [f"# Model outputs against float64, CPU fp32, {datetime.datetime.now().isoformat(timespec='seconds')}", "",
             f"`python -m benchmarks.cpu_accuracy {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
             f"{hardware['cpu']}, {hardware['cpus']} cores; torch {torch.__version__}, Python {platform.python_version()}; "
             f"commit {_commit()}.", "",
             "Output: logits (GPT-2, Llama) or last hidden state (BERT) for the benchmark's input, against the same "
             "model in float64. Verdict: kiln.testing.compare against eager fp32 (max and norm error within 2x "
             "eager's plus 16 ulp of the output's scale).", "",
             "| model | backend | max abs error | relative RMS error | verdict |", "|---|---|---:|---:|---|"]
    lines += [f"| {row['model']} | {row['backend']} | {row['max_error']:.3g} | {row['relative_rms']:.3g} | "
              f"{row['verdict']} |" for row in rows]
    slug = f"{hardware['cpu'].lower().replace(' ', '-')}-{hardware['cpus']}core"
    path = os.path.join(REPO_ROOT, "benchmarks", "results",
                        f"{datetime.date.today().isoformat()}_{args.label}_{slug}.md")
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
