"""Where the fused row kernels' time goes: kiln's own kernel for each TARGETS.md kernel program, timed on the
GPU as generated and with one change at a time, each change's accuracy beside eager's.

    python -m benchmarks.gpu_kernel_variants [--only softmax,layer_norm] [--rows 65536]

For each program (gelu(x + b), layer_norm, softmax, RMSNorm * w, silu, * gate; 65536x4096 bf16) kiln compiles
it, and the one kernel it generates is relaunched here directly: as generated, with other launch configs
(rows per program, warps), and with its source rewritten (IEEE division or libdevice's exp replaced by the
fast forms, a division by a constant power of two as a product, ...). Each variant prints its time (triton's
do_bench, median), its fraction of the copy ceiling measured in the same process, its largest error against
a float64 reference over eager's, and how many elements differ from eager's. A variant that changes
numerics is only a measurement here: nothing in kiln uses it until it passes the accuracy rule.
"""
from __future__ import annotations

import argparse
import math
import re
import types

import torch

import kiln
from benchmarks.workloads import gelu_bias, layer_norm, rmsnorm_silu_gate, softmax_last


def _graphs(fn, args) -> list:
    """kiln's compiled graphs of `fn` on `args`, through the tests' helper (Dynamo capture, kiln's AOT and backend)."""
    from tests.backend.test_pipeline import compiled_graphs
    with torch.no_grad(), kiln.config.patch(graph_cache=False):  # a cached graph keeps no scheduled form
        return compiled_graphs(fn, *args)[1]


class Kernel:
    """kiln's one kernel of a program, relaunchable with a rewritten source and another launch config."""

    def __init__(self, fn, args):
        from kiln.codegen.triton import generate_kernel
        (graph,) = _graphs(fn, args)
        scheduled = graph.scheduled
        (kernel,) = scheduled.kernels
        self.device = args[0].device.type
        self.source = generate_kernel(kernel, scheduled.graph, self.device)
        names = [getattr(graph_input.buffer, "name", None) for graph_input in scheduled.graph.inputs]
        self.tensors = {}
        for name in self.source.buffer_args:
            if name in names:
                self.tensors[name] = args[names.index(name)]
            else:  # the output: the one buffer the kernel writes
                buffer = scheduled.graph.buffers[name]
                size = [int(s) for s in buffer.layout.size]
                stride = [int(s) for s in buffer.layout.stride]
                self.tensors[name] = torch.empty_strided(size, stride, dtype=buffer.dtype, device=self.device)
                self.output = name
        self.sizes = [int(s) for s in self.source.size_args]

    def launcher(self, text: str | None = None, xblock: int | None = None, num_warps: int | None = None):
        from kiln import _triton
        from kiln.runtime.loader import _execute
        source = self.source
        module = types.ModuleType("kiln_variant")
        _execute(text or source.source, "triton", module.__dict__)
        jit = _triton.jit_for_device(getattr(module, source.function_name), self.device)
        constexprs = dict(source.constexprs)
        if xblock is not None:
            constexprs["XBLOCK"] = xblock
        options = dict(source.launch_options)
        if num_warps is not None:
            options["num_warps"] = num_warps
        grid = (-(-int(source.xnumel) // constexprs["XBLOCK"]),)
        pointers = [self.tensors[name] for name in source.buffer_args]

        def launch():
            jit[grid](*pointers, *self.sizes, **constexprs, **options)
            return self.tensors[self.output]
        return launch


def _rewrites(source: str) -> dict:
    """Named source rewrites that apply to `source`, each changing one thing."""
    found = {}
    if "tl.div_rn(" in source:
        found["div.full (a / b)"] = _plain_division(source)
    if "libdevice.exp(" in source:
        found["ex2.approx exp (tl.exp)"] = source.replace("libdevice.exp(", "tl.exp(")
    if "tl.div_rn(" in source and "libdevice.exp(" in source:
        found["both"] = _plain_division(source).replace("libdevice.exp(", "tl.exp(")
    text = source
    for name, value in re.findall(r"(\w+) = tl\.full\(\[1, 1\], (\d+\.0), tl\.float32\)", source):
        if float(value) == 2 ** round(math.log2(float(value))):
            text = re.sub(rf"tl\.div_rn\((\w+), {name}\)", rf"(\1 * {1 / float(value)!r})", text)
    if text != source:
        found["x / 2^k as x * 2^-k"] = text
    uncompensated = re.sub(r"(\w+)_0 = (\w+)_m0 \+ \w+_c / \d+", r"\1_0 = \2_m0", source)
    if uncompensated != source:
        found["mean without its correction"] = uncompensated
    return found


def _plain_division(source: str) -> str:
    """`tl.div_rn(a, b)` -> `(a) / (b)`, with a and b balanced-parenthesis expressions."""
    out, position = [], 0
    while True:
        start = source.find("tl.div_rn(", position)
        if start < 0:
            return "".join(out) + source[position:]
        out.append(source[position:start])
        i, depth, split = start + len("tl.div_rn("), 1, None
        j = i
        while depth:
            c = source[j]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "," and depth == 1:
                split = j
            j += 1
        out.append(f"(({source[i:split]}) / ({source[split + 1:j - 1].strip()}))")
        position = j


def _errors(result: torch.Tensor, eager: torch.Tensor, reference: torch.Tensor) -> str:
    mine = (result.double() - reference).abs().max().item()
    theirs = (eager.double() - reference).abs().max().item()
    differ = (result != eager).sum().item()
    return f"max err {mine:.3g} (eager {theirs:.3g}), {differ} elements differ from eager"


def main() -> None:
    import triton.testing
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="gelu_bias,layer_norm,softmax,rmsnorm_silu_gate")
    parser.add_argument("--rows", type=int, default=65536)
    options = parser.parse_args()
    rows, cols = options.rows, 4096
    torch.manual_seed(0)

    def randn(*size):
        return torch.randn(*size, device="cuda", dtype=torch.bfloat16)

    programs = {"gelu_bias": (gelu_bias, lambda: (randn(rows, cols), randn(cols))),
                "layer_norm": (layer_norm, lambda: (randn(rows, cols), randn(cols), randn(cols))),
                "softmax": (softmax_last, lambda: (randn(rows, cols),)),
                "rmsnorm_silu_gate": (rmsnorm_silu_gate, lambda: (randn(rows, cols), randn(cols), randn(rows, cols)))}
    source = torch.randn(1 << 28, device="cuda")
    destination = torch.empty_like(source)
    copy_us = triton.testing.do_bench(lambda: destination.copy_(source), return_mode="median") * 1e3
    ceiling = 2 * source.numel() * 4 / copy_us / 1e3  # GB/s
    del source, destination
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} copy ceiling {ceiling:,.0f} GB/s", flush=True)
    for name in options.only.split(","):
        fn, make = programs[name]
        args = make()
        bytes_moved = sum(t.numel() * t.element_size() for t in args) + args[0].numel() * args[0].element_size()
        with torch.no_grad():
            eager = fn(*args)
            reference = fn(*[a.double() for a in args])
        eager_us = triton.testing.do_bench(lambda: fn(*args), return_mode="median") * 1e3
        print(f"\n== {name}: eager {eager_us:.1f} us ({bytes_moved / eager_us / 1e3 / ceiling:.2f} of ceiling)")
        kernel = Kernel(fn, args)
        base = kernel.source
        print(f"   kiln's kernel: XBLOCK {base.xblock} RBLOCK {base.rblock} warps {base.num_warps}")
        variants = [("as generated", None, None, None)]
        rewrites = _rewrites(base.source)
        variants += [(label, text, None, None) for label, text in rewrites.items()]
        fastest = rewrites.get("both") or rewrites.get("div.full (a / b)")
        blocks = [1, 2, 4] if base.rblock else [512, 1024, 2048, 4096]
        for xblock in blocks:
            for warps in (2, 4, 8, 16):
                if (xblock, warps) != (base.xblock, base.num_warps) and (base.rblock or warps <= 8):
                    variants.append((f"XBLOCK {xblock} warps {warps}", None, xblock, warps))
                    if fastest and base.rblock:
                        variants.append((f"XBLOCK {xblock} warps {warps}, fast", fastest, xblock, warps))
        for label, text, xblock, warps in variants:
            try:
                launch = kernel.launcher(text, xblock, warps)
                result = launch().clone()
                us = triton.testing.do_bench(launch, return_mode="median") * 1e3
                print(f"   {label:32s} {us:8.1f} us  {bytes_moved / us / 1e3 / ceiling:.2f} of ceiling  "
                      f"{_errors(result, eager, reference)}", flush=True)
            except Exception as error:  # a config Triton rejects (too many registers, ...) is reported, not fatal
                print(f"   {label:32s} failed: {type(error).__name__}: {str(error)[:160]}", flush=True)
        del args, eager, reference, kernel
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
