"""Guard cost per call: kiln's frontend vs torch.compile(backend="eager") on a small module.

Both compile the same small MLP with a backend that runs the captured FX graph as
is, so the difference between a compiled call and an eager call is the frontend's
per-call work: guards, argument extraction, calling the graph. Reported per call,
in microseconds (median of repeats):

    python benchmarks/guard_overhead.py [--iterations N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

from kiln.backend import graph_compiler
from kiln.frontend import compile_function


class SmallMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(16, 32)
        self.second = nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.second(torch.relu(self.first(x))) + x)


DYNAMO = "torch.compile(backend='eager') call"


def per_call_us(fn, args, iterations: int, repeats: int = 7) -> float:
    for _ in range(50):
        fn(*args)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            fn(*args)
        samples.append((time.perf_counter() - start) / iterations * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    options = parser.parse_args()
    torch.manual_seed(0)
    model = SmallMLP().eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        kiln_module = compile_function(model, graph_compiler("eager"))
        dynamo_module = torch.compile(model, backend="eager")
        kiln_module(x)
        dynamo_module(x)
        entry = kiln_module.entries[0]
        graph_call = entry.graph_module.forward
        inputs = [x, model.first.weight, model.first.bias, model.second.weight, model.second.bias,
                  model.norm.weight, model.norm.bias]
        results = {
            "eager module call": per_call_us(model, (x,), options.iterations),
            "captured graph called directly": per_call_us(graph_call, inputs, options.iterations),
            "kiln guard function alone": per_call_us(entry.guard, (model, x), options.iterations),
            "kiln compiled call": per_call_us(kiln_module, (x,), options.iterations),
            DYNAMO: per_call_us(dynamo_module, (x,), options.iterations),
        }
    width = max(len(name) for name in results)
    for name, value in results.items():
        print(f"{name:<{width}}  {value:8.2f} us")
    print(f"{'kiln overhead over the graph':<{width}}  {results['kiln compiled call'] - results['captured graph called directly']:8.2f} us")
    print(f"{'dynamo overhead over the graph':<{width}}  "
          f"{results[DYNAMO] - results['captured graph called directly']:8.2f} us")
    print(f"guard checks: {entry.guard_source.count(chr(10) + '        if ')} lines")


if __name__ == "__main__":
    main()
