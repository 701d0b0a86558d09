"""How accurate kiln's split channels-last batch-norm statistics are, on the CPU (Triton's interpreter).

    python -m benchmarks.welford_accuracy

var_mean over (N, H, W) of a channels-last float32 x, 8x24x16x16, relative error of the variance against
float64, for: kiln's split form (an outer welford, kiln/schedule/split.py `_welford_split`), kiln's unsplit
welford kernel (the outer rule patched off), and eager's float32. Inputs: 1000 + 0.01 * N(0, 1) (a mean 1e5
times the spread), with the row's first element (the split's shift K) moved `far` spreads out; and a channel of
zeros but K and one other element ("dead").
"""
from __future__ import annotations

from unittest import mock

import torch

import kiln
from kiln.backend import compile_graph


def _stats(x):
    return torch.var_mean(x, dim=(0, 2, 3))


def _relative_error(variance, reference) -> float:
    return float(((variance.double() - reference) / reference).abs().max())


def inputs():
    generator = torch.Generator().manual_seed(7)
    for far in (0, 3, 10, 100, 1000):
        x = torch.randn((8, 24, 16, 16), generator=generator) * 0.01 + 1000
        x[0, :, 0, 0] = 1000 + far * 0.01
        yield f"1000 +- 0.01, K {far} spreads out", x
    dead = torch.zeros(8, 24, 16, 16)
    dead[0, :, 0, 0] = 5.0
    dead[3, 5, 2, 2] = -1.0
    yield "zeros but K = 5 and one -1", dead


def main() -> int:
    print("| input | kiln split | kiln unsplit welford | eager float32 |")
    print("|---|---|---|---|")
    for name, x in inputs():
        x = x.to(memory_format=torch.channels_last)
        reference = _stats(x.double())[0]
        with kiln.config.patch(strict=True, cpu_backend="triton", graph_cache=False):
            split = compile_graph(torch.fx.symbolic_trace(_stats), [x])(x)[0]
            with mock.patch("kiln.schedule.split.is_outer_reduction", lambda node, buffers: False), \
                    mock.patch("kiln.schedule.fusion.is_outer_reduction", lambda node, buffers: False):
                whole = compile_graph(torch.fx.symbolic_trace(_stats), [x])(x)[0]
        print(f"| {name} | {_relative_error(split, reference):.2e} | {_relative_error(whole, reference):.2e} | "
              f"{_relative_error(_stats(x)[0], reference):.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
