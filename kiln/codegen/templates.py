"""Which kernel computes a 2-d product on the Triton backends: the extern (cuBLAS) or the template.

`product_config(node, graph, meta)` is asked by the product's lowering rule (kiln/lowering/matmul.py)
with the template node it would add; it returns the tile to run the template with, or None for the
extern. `config.matmul_template` decides:

- "off": always the extern;
- "default" outside the max-autotune modes: the extern, except a CUDA 2-d product of 16-bit operands
  whose n is not a multiple of 8 (`cublas_misaligned`), which takes the template with its default tile:
  cuBLAS runs those rows misaligned, 4.1x slower than the template on the H200 for GPT-2's LM head
  (512x768 @ 768x50257 bf16: 504.6 us against 122.7; benchmarks/results/2026-12-05_template-check-1db0582_nvidia-h200.md);
- "on": always the template, with the default tile (the tests run it under Triton's interpreter);
- "auto" (and "default" under mode="max-autotune"), CUDA and static sizes only: every candidate tile
  (codegen/triton_templates.py CANDIDATES) of the bare product is timed against cuBLAS's product plus
  one pass over its output (a copy, the least a separate epilogue kernel costs, which a fused
  epilogue saves), and the fastest wins. Timing and its cache are kiln/runtime/autotune.py's.

A template's epilogue is not known here (the scheduler fuses it later), so the comparison is of the
bare product, with the epilogue's saving counted as that one pass.
"""
from __future__ import annotations

import logging

import torch

from kiln import _torch
from kiln.codegen.triton import generate_kernel
from kiln.codegen.triton_templates import candidates, default_tile
from kiln.codegen.tuning import compile_candidates, launcher, random_buffers
from kiln.config import config
from kiln.ir import Body, Buffer, Graph, GraphInput, Layout, Template
from kiln.ir.indexing import contiguous_strides, range_vars
from kiln.ir.kernel import Kernel
from kiln.ir.template import MatrixOperand, template_parts
from kiln.runtime import autotune

log = logging.getLogger("kiln")

EXTERN = "extern"


def product_config(node: Template, graph: Graph, meta: torch.Tensor):
    """The TileConfig for the product template `node` (its body up to the `reduce`; operands in
    `graph`), or None: lower the product as the extern."""
    setting = config.matmul_template
    device = meta.device.type
    if not templates_considered(meta, node.reduction_ranges[0]):
        return None
    if setting in ("on", "default"):  # "default" is considered only where cuBLAS is misaligned
        return default_tile(meta.dtype, device)
    if not autotune.timeable(device):
        return None  # timing needs a GPU; the interpreter never beats the extern
    sizes = [*node.ranges, *node.reduction_ranges]
    if not all(size.is_Integer for size in sizes):
        return None  # timing needs sizes
    return _tuned_tile(node, graph, meta, [int(size) for size in sizes])


def templates_considered(meta: torch.Tensor, inner) -> bool:
    """Whether the product whose result is like `meta`, summing over `inner` terms, may be a template at all
    (a cheap check, before any is built)."""
    setting = config.matmul_template
    if setting == "default":
        return meta.device.type == "cuda" and cublas_misaligned(meta, inner)
    return setting in ("on", "auto") and _triton_runs(meta.device.type)


MISALIGNED_MIN_SIZE = 64  # smaller products were not measured: they keep cuBLAS


def cublas_misaligned(meta: torch.Tensor, inner) -> bool:
    """Whether a 2-d product of 16-bit operands has a static n that is not a multiple of 8 (16 bytes: the
    rows of its output start misaligned for cuBLAS), with m, n and k all at least 64. (An odd k, as in the
    LM head's input gradient, misaligns the operands' rows instead, and a batched product with an odd n
    runs other cuBLAS kernels: neither was measured, so both keep cuBLAS.)"""
    sizes = [*meta.shape[-2:], inner]
    static = all(isinstance(size, int) or getattr(size, "is_Integer", False) for size in sizes)
    if meta.dim() != 2 or meta.dtype.itemsize != 2 or not static:
        return False
    rows, columns, inner = (int(size) for size in sizes)
    return min(rows, columns, inner) >= MISALIGNED_MIN_SIZE and columns % 8 != 0


def templates_forced(device_type: str) -> bool:
    """Whether every product on `device_type` is to be a template (matmul_template "on" where Triton runs)."""
    return config.matmul_template == "on" and _triton_runs(device_type)


def _triton_runs(device_type: str) -> bool:
    """Whether the device's kernels are Triton's (templates exist only there)."""
    return device_type == "cuda" or (device_type == "cpu" and config.cpu_backend == "triton")


def _tuned_tile(node: Template, graph: Graph, meta: torch.Tensor, sizes: list):
    *batch, rows, columns, inner = sizes
    parts = template_parts(node, graph)
    tiles = {str(tile): tile for tile in candidates(meta.dtype)}
    shape = "x".join(map(str, sizes))
    key = "|".join([f"{node.kind} {shape}", str(meta.dtype), node.precision,
                    _describe(parts.a, graph), _describe(parts.b, graph), autotune.environment_key()])
    found = autotune.cached_choice(key)
    if found is not None and (found["choice"] == EXTERN or found["choice"] in tiles):
        return tiles.get(found["choice"])
    # The lowering runs under the compile's fake mode: the timed tensors must be real ones, or the
    # kernels are launched on a fake tensor's pointer (an illegal memory access on the GPU).
    with _torch.real_tensors():
        names = list(dict.fromkeys((parts.a.buffer, parts.b.buffer)))
        operands = random_buffers(names, [graph.buffers[name].dtype for name in names], graph)
        a, b = (_strided(operands[operand.buffer], (*batch, *shape), operand)
                for operand, shape in ((parts.a, (rows, inner)), (parts.b, (inner, columns))))
        out, copied = (torch.empty((*batch, rows, columns), dtype=meta.dtype, device=meta.device) for _ in range(2))
        product = torch.bmm if batch else torch.mm

        def extern():
            product(a, b, out=out)
            copied.copy_(out)

        runs = {name: _template_run(node, parts, graph, tile, operands, out) for name, tile in tiles.items()}
        if autotune.budget_left() > 0:  # every tile compiled at once, not one by one as it is first timed
            compile_candidates([(run.source, run.source.constexprs, run.source.launch_options)
                                for run in runs.values()])
        reference = torch.matmul(a.double(), b.double())
        runs = {EXTERN: extern, **{name: run for name, run in runs.items()
                                   if _computes(run, out, reference, node.precision, name)}}
        choice = autotune.choose(key, runs, f"{node.kind} {shape} {meta.dtype}")
    return tiles.get(choice)  # None: the extern won, or nothing was timed


def _computes(run, out: torch.Tensor, reference: torch.Tensor, precision: str, name: str) -> bool:
    """Whether the tile `run` (writing `out`) computes the product `reference` (float64): a tile that
    cannot run, or computes wrong values, is not timed. The bound is loose: 8 units of the result's
    precision (TF32's where allowed) times the result's largest magnitude plus one. An operand's
    rounding, summed over k, is a fraction of the sum, so errors grow with the result's size. It
    catches a wrong kernel, not a slightly less precise one, which the accuracy rule of the tests judges."""
    try:
        out.fill_(float("nan"))
        run()
        error = (out.double() - reference).abs().max().item()
    except Exception as failure:  # noqa: BLE001 (a tile that does not compile, or needs more shared memory)
        autotune.perf_log("kiln: autotuning leaves out %s: %s: %s", name, type(failure).__name__, failure)
        return False
    unit = {torch.float32: 2.0 ** -10 if precision != "ieee" else 2.0 ** -20}.get(out.dtype, 2.0 ** -8)
    bound = 8 * unit * (reference.abs().max().item() + 1.0)
    if not error <= bound:  # NaN (an unwritten element) fails too
        log.warning("kiln: the product template's %s computed a wrong result (max error %.3g, bound %.3g): "
                    "it is not used; please report this", name, error, bound)
        return False
    return True


def _describe(operand: MatrixOperand, graph: Graph) -> str:
    buffer = graph.buffers[operand.buffer]
    return (f"{buffer.dtype} offset {operand.offset} strides {operand.batch_stride} {operand.row_stride} "
            f"{operand.column_stride}")


def _strided(storage: torch.Tensor, shape: tuple, operand: MatrixOperand) -> torch.Tensor:
    strides = (int(operand.row_stride), int(operand.column_stride))
    if len(shape) == 3:
        strides = (int(operand.batch_stride),) + strides
    return storage.as_strided(shape, strides, int(operand.offset))


def _template_run(node: Template, parts, graph: Graph, tile, operands: dict, out: torch.Tensor):
    """A function launching the bare product template `node` (whose template_parts are `parts`; its result
    stored to `out`) with `tile`; its `source` attribute is the tile's KernelSource."""
    body = Body(list(node.body.ops[:parts.reduce_index + 1]))
    sizes = list(node.ranges)
    result = Buffer("tuned_out", out.device, out.dtype, Layout(tuple(sizes), tuple(contiguous_strides(sizes))))
    body.store(result, range_vars(len(sizes), "i"), body.to_dtype(parts.reduce_index, out.dtype))
    bare = Template(node.name, list(node.ranges), body, [result.name], reduction_ranges=list(node.reduction_ranges),
                    kind=node.kind, config=tile, precision=node.precision)
    inputs = {name: graph.buffers[name] for name in operands}
    alone = Graph(inputs=[GraphInput("tensor", name, buffer) for name, buffer in inputs.items()],
                  buffers={**inputs, result.name: result}, nodes=[bare])
    source = generate_kernel(Kernel("tuned", sizes[:-1], sizes[-1:], [bare], ["template"]), alone, "cuda")
    run = launcher(source, {**operands, result.name: out}, source.constexprs, source.launch_options,
                   int(source.xnumel))
    run.source = source
    return run
