"""Guard cost per call: kiln's frontend vs torch.compile on a small module, both with the eager backend.

Both compile the same small MLP (inference, no_grad) with a backend that runs the captured
FX graph as it is (`kiln.compile(..., backend="eager")`, `torch.compile(..., backend="eager")`),
so what a compiled call costs beyond calling the graph itself is the frontend's per-call
work: the wrapper, the guard check, pulling the graph's inputs out of the arguments and
parameters, calling the graph, rebuilding the result. Measured, in microseconds per call:

- eager module call, and the captured FX graph called directly (kiln's graph, same inputs);
- the guard alone: kiln's generated guard function; Dynamo's guard manager `check()`;
- a whole compiled call: `kiln.compile(model)`, kiln's dispatcher alone, `torch.compile(model)`;
- overhead = compiled call - graph called directly;
- the same compiled calls with a "replay" backend whose graph returns outputs computed at
  compile time: the whole call is then the frontend's own per-call cost, free of the
  noise of the graph's tensor work;
- the same, and kiln's guard alone, for a deep module tree (transformers' BERT, 12 narrow
  layers: about 200 tensors and 1,000 guard checks), when transformers is installed.

Each quantity is timed in several rounds, interleaved (one round of every quantity, then
the next), and the median and minimum over rounds are reported, so that load from other
processes hits all of them alike. Results go to benchmarks/results/<date>_guard-overhead_<host>.{md,json}
with the date, hardware, versions and command:

    python -m benchmarks.guard_overhead [--iterations N] [--rounds R] [--no-write]

(as a module: run as a script, benchmarks/profile.py would shadow the standard library's profile)
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
from pathlib import Path

import torch
import torch.nn as nn

import kiln

RESULTS = Path(__file__).resolve().parent / "results"


class SmallMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(16, 32)
        self.second = nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.second(torch.relu(self.first(x))) + x)


def _time_per_call_us(fn, args, iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        fn(*args)
    return (time.perf_counter() - start) / iterations * 1e6


def _dynamo_guard(model: nn.Module, x: torch.Tensor):
    """Dynamo's guard manager for the compiled forward and the frame locals it checks, or None."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        entries = _debug_get_cache_entry_list(type(model).forward)
        manager = entries[0].guard_manager
        frame_locals = {"self": model, "x": x}
        if manager.check(frame_locals) is not True:
            return None
        return manager.check, (frame_locals,)
    except Exception:  # a private torch API: absent or changed in this torch
        return None


def _replay_backend(gm: torch.fx.GraphModule, example_inputs: list):
    """A backend whose graph costs (almost) nothing: it returns the outputs computed once at compile time.

    With it, a compiled call's time is the frontend's own work alone (guards, dispatch,
    input extraction, output rebuilding), not the tensor work the graph would do.
    """
    outputs = gm(*example_inputs)

    def replay(*inputs):
        return outputs

    return replay


def _quantities(backend_name: str, kiln_backend, dynamo_backend, model: nn.Module, x: torch.Tensor) -> dict:
    """name -> (callable, args) for one backend pair; checks every compiled call is right first."""
    with kiln.config.patch(frontend="kiln"):
        kiln_module = kiln.compile(model, backend="eager") if kiln_backend == "eager" else None
    if kiln_module is None:
        from kiln.api import OptimizedModule
        from kiln.frontend import compile_function

        kiln_module = OptimizedModule(model, compile_function(model, kiln_backend))
    torch._dynamo.reset()
    dynamo_module = torch.compile(model, backend=dynamo_backend)
    expected = model(x)
    for compiled in (kiln_module, dynamo_module):
        torch.testing.assert_close(compiled(x), expected)
        torch.testing.assert_close(compiled(x), expected)
    dispatcher = kiln_module._compiled_call
    entry = dispatcher.entries[0]
    assert len(dispatcher.entries) == 1 and entry.eager_reason is None and entry.guard(model, x) is None
    quantities = {
        f"kiln.compile(model) call [{backend_name}]": (kiln_module, (x,)),
        f"kiln dispatcher call, no module wrapper [{backend_name}]": (dispatcher, (x,)),
        f"torch.compile(model) call [{backend_name}]": (dynamo_module, (x,)),
    }
    if backend_name == "eager":
        inputs = [x, model.first.weight, model.first.bias, model.second.weight, model.second.bias,
                  model.norm.weight, model.norm.bias]
        torch.testing.assert_close(entry.graph_module.forward(*inputs)[0], expected)
        quantities["captured graph called directly [eager]"] = (entry.graph_module.forward, inputs)
        quantities["kiln guard function alone"] = (entry.guard, (model, x))
        dynamo_guard = _dynamo_guard(model, x)
        if dynamo_guard is not None:
            quantities["dynamo guard manager check alone"] = dynamo_guard
    return quantities, entry


def _deep_model_cases() -> dict:
    """A deep module tree: transformers' BERT with 12 layers (narrow), replay backend, kwargs input.

    Many modules, parameters and config reads make many guard checks (about 1,000), the
    case where a Python guard is at its worst against Dynamo's C++ one.
    """
    try:
        import transformers
    except ImportError:
        return {}
    from kiln.api import OptimizedModule
    from kiln.frontend import compile_function

    config = transformers.BertConfig(num_hidden_layers=12, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100)
    bert = transformers.BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 16))
    kiln_bert = OptimizedModule(bert, compile_function(bert, _replay_backend))
    torch._dynamo.reset()
    dynamo_bert = torch.compile(bert, backend=_replay_backend)
    expected = bert(input_ids=ids).last_hidden_state
    for compiled in (kiln_bert, dynamo_bert):
        for _ in range(2):
            torch.testing.assert_close(compiled(input_ids=ids).last_hidden_state, expected)
    entry = kiln_bert._compiled_call.entries[0]
    assert entry.guard(bert, input_ids=ids) is None
    return {
        "BERT-12: kiln guard function alone": (lambda: entry.guard(bert, input_ids=ids), ()),
        "BERT-12: kiln.compile(model) call [replay]": (lambda: kiln_bert(input_ids=ids), ()),
        "BERT-12: torch.compile(model) call [replay]": (lambda: dynamo_bert(input_ids=ids), ()),
    }


def _decay(buffer, a, b, c, d):
    """An in-place update of one of five tensor inputs: its guard checks their storage sharing."""
    buffer.mul_(0.9).add_(a * b + c * d)
    return buffer


def _mutation_cases() -> dict:
    """The guard of a function that mutates an input (the storage aliasing check: one storage
    address per tensor input), next to the same function's guard without the mutation."""
    from kiln.frontend import compile_function

    def pure(buffer, a, b, c, d):
        return buffer * 0.9 + (a * b + c * d)

    cases = {}
    for label, fn in (("in-place update of 1 of 5 tensors", _decay), ("same, out of place", pure)):
        compiled = compile_function(fn, _replay_backend)
        tensors = [torch.randn(16) for _ in range(5)]
        compiled(*tensors)
        entry = compiled.entries[0]
        assert entry.guard(*tensors) is None and entry.eager_reason is None
        cases[f"{label}: kiln guard function alone"] = (entry.guard, tensors)
    return cases


def measure(iterations: int, rounds: int) -> dict[str, dict[str, float]]:
    torch.manual_seed(0)
    model = SmallMLP().eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        cases = {"eager module call": (model, (x,))}
        eager_cases, entry = _quantities("eager", "eager", "eager", model, x)
        cases.update(eager_cases)
        replay_cases, _ = _quantities("replay", _replay_backend, _replay_backend, model, x)
        cases.update(replay_cases)
        cases.update(_mutation_cases())
        cases.update(_deep_model_cases())
        for fn, args in cases.values():  # warm up
            for _ in range(200):
                fn(*args)
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(rounds):
            for name, (fn, args) in cases.items():
                calls = max(iterations // 20, 10) if name.startswith("BERT") else iterations
                samples[name].append(_time_per_call_us(fn, args, calls))
    results = {name: {"median_us": statistics.median(values), "min_us": min(values)}
               for name, values in samples.items()}
    graph = results["captured graph called directly [eager]"]
    for name in ("kiln.compile(model) call [eager]", "kiln dispatcher call, no module wrapper [eager]",
                 "torch.compile(model) call [eager]"):
        results[f"overhead: {name} - graph"] = {key: results[name][key] - graph[key] for key in graph}
    results["_guard_lines"] = {"count": entry.guard_source.count("\n        if ")}
    return results


def environment() -> dict[str, str]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = os.environ.get("KILN_GIT_COMMIT", "unknown")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "hardware": f"{cpu}, {os.cpu_count()} cores visible, load average {os.getloadavg()[0]:.1f}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "kiln commit": commit,
        "command": "python -m benchmarks.guard_overhead " + " ".join(sys.argv[1:]),
    }


def _machine_label() -> str:
    """'amd-epyc-2core'-style name for result files (CPU model and cores)."""
    cpu = environment()["hardware"].split(",")[0].lower()
    slug = "-".join("".join(c if c.isalnum() else " " for c in cpu).split()[:2]) or "cpu"
    return f"{slug}-{os.cpu_count()}core"


def render(results: dict, env: dict, iterations: int, rounds: int) -> str:
    lines = ["# Guard cost per call: kiln's frontend vs torch.compile (both backend='eager')", ""]
    lines += [f"- {key}: {value}" for key, value in env.items()]
    lines += [f"- method: SmallMLP (Linear 16->32, ReLU, Linear 32->16, residual, LayerNorm), x of shape [8, 16], "
              f"no_grad; {rounds} interleaved rounds of {iterations} calls per quantity "
              f"({max(iterations // 20, 10)} for the BERT-12 rows: BertModel, 12 layers of width 64, 2x16 tokens)", "",
              "| quantity | median us/call | min us/call |", "| --- | ---: | ---: |"]
    for name, value in results.items():
        if not name.startswith("_"):
            lines.append(f"| {name} | {value['median_us']:.2f} | {value['min_us']:.2f} |")
    lines += ["", f"kiln's guard function has {results['_guard_lines']['count']} checks."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per quantity")
    parser.add_argument("--no-write", action="store_true", help="print only; write nothing under results/")
    options = parser.parse_args()
    results = measure(options.iterations, options.rounds)
    env = environment()
    text = render(results, env, options.iterations, options.rounds)
    print(text)
    if not options.no_write:
        stem = RESULTS / f"{datetime.date.today().isoformat()}_guard-overhead_{_machine_label()}"
        RESULTS.mkdir(exist_ok=True)
        stem.with_suffix(".md").write_text(text)
        stem.with_suffix(".json").write_text(json.dumps({"environment": env, "results": results}, indent=2) + "\n")
        print(f"written: {stem}.md, {stem}.json")


if __name__ == "__main__":
    main()
