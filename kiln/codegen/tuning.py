"""Autotuning generated Triton kernels' launch configs on CUDA: block sizes and warps.

A kernel's heuristic config (codegen/triton.py: XBLOCK, RBLOCK, num_warps) is one guess per shape.
Under `config.autotune_kernels` ("auto", which mode="max-autotune" sets where it is "default"), each
CUDA kernel with static sizes is timed on random buffers of its own sizes with a few configs that
compute the same values, and the fastest is kept:

- pointwise: XBLOCK 256..2048, 4 or 8 warps;
- persistent reductions: the whole row stays in one block (RBLOCK is fixed by the row); rows per
  program (XBLOCK) and warps vary;
- looped reductions: RBLOCK 512..4096 and warps (a different RBLOCK sums in another order, still
  compensated; the accuracy rule judges it like any other);
- outer reductions, kernels over symbolic sizes and templates (codegen/templates.py tunes those) keep
  their config.

Timing, its per-graph budget and the cache of choices are kiln/runtime/autotune.py's. `random_buffers`
and `launcher` are shared with the product templates' tuning. Nothing here imports codegen/triton.py
(which calls `tune_kernel`): a KernelSource is read by its fields.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import sympy
import torch

from kiln import _torch
from kiln.config import config
from kiln.runtime import autotune

INDEX_STATUS = "_index_status"  # codegen/triton.py's pseudo-buffer: the index-error flag


def tuning_wanted() -> bool:
    return config.autotune_kernels == "auto"


def random_buffers(names: list, dtypes: list, graph) -> dict:
    """{buffer name: a tensor of its storage span on its device}: floats random, integers (indices) and
    bools zero; the index-error flag on the first buffer's device."""
    tensors = {}
    for name, dtype in zip(names, dtypes):
        if name in tensors:
            continue
        if name == INDEX_STATUS:
            device = next(graph.buffers[other].device for other in names if other != INDEX_STATUS)
            tensors[name] = torch.zeros(1, dtype=torch.int32, device=device)
            continue
        buffer = graph.buffers[name]
        span = max(int(buffer.layout.storage_span()), 1)
        if dtype.is_floating_point:
            tensors[name] = torch.randn(span, device=buffer.device).to(dtype)
        else:
            tensors[name] = torch.zeros(span, dtype=dtype, device=buffer.device)
    return tensors


def compile_candidates(candidates: list) -> None:
    """Compile each (KernelSource, constexprs, options) of `candidates` at once, on the compile workers
    (kiln/runtime/launch.py compile_ahead), so that timing them does not compile them one after
    another: a tile's compile (seconds) dwarfs its timing (milliseconds)."""
    import os

    from kiln.runtime.launch import compile_ahead
    from kiln.runtime.loader import load_kernel

    jobs = [(load_kernel(source.function_name, source.source, source.device_type), source.pointer_dtypes,
             [int(size) for size in source.size_args], constexprs, options)
            for source, constexprs, options in candidates]
    with autotune.charged():
        compile_ahead(jobs, config.compile_workers or os.cpu_count() or 1)


def launcher(source, tensors: dict, constexprs: dict, options: dict, programs: int) -> Callable[[], None]:
    """A function launching `source`'s kernel on `tensors` with these constexprs and launch options."""
    from kiln.runtime.launch import COMPILE_OPTIONS
    from kiln.runtime.loader import load_kernel

    kernel = load_kernel(source.function_name, source.source, source.device_type)
    pointers = [tensors[name] for name in source.buffer_args]
    ints = [int(size) for size in source.size_args]

    def run():
        kernel[(programs,)](*pointers, *ints, **constexprs, **options, **COMPILE_OPTIONS)

    return run


def _static(values) -> list | None:
    ints = []
    for value in values:
        value = sympy.sympify(value)
        if not value.is_Integer:
            return None
        ints.append(int(value))
    return ints


def candidate_configs(source, kernel) -> list:
    """(xblock, rblock or None, num_warps) configs computing the same values as the heuristic's (first)."""
    heuristic = (source.xblock, source.rblock, source.num_warps)
    xnumel = int(source.xnumel)
    found = [heuristic]
    if source.rblock is None:
        limit = max(16, 1 << (max(xnumel, 1) - 1).bit_length())
        found += [(xblock, None, warps) for xblock in (256, 512, 1024, 2048) for warps in (4, 8)
                  if xblock <= limit]
    elif kernel.outer:
        return found
    elif kernel.persistent:
        rows_limit = max(1, 1 << (max(xnumel, 1) - 1).bit_length())
        found += [(xblock, source.rblock, warps) for xblock in (1, 2, 4, 8, 16, 32)
                  for warps in (4, 8, 16) if xblock <= rows_limit and xblock * source.rblock <= 16384
                  and warps * 32 <= max(xblock * source.rblock, 128)]
    else:
        found += [(1, rblock, warps) for rblock in (512, 1024, 2048, 4096) for warps in (4, 8, 16)
                  if warps * 32 * 4 <= rblock]
    unique = []
    for config_ in found:
        xblock, rblock, _ = config_
        if source.full_rows and xnumel % xblock or source.full_columns and rblock != source.rblock:
            continue  # the source has no mask for a partial block
        if config_ not in unique:
            unique.append(config_)
    return unique


def _label(config_: tuple) -> str:
    xblock, rblock, warps = config_
    return f"x{xblock}" + (f" r{rblock}" if rblock else "") + f" w{warps}"


def tune_kernel(source, kernel, graph):
    """`source` (a KernelSource) with the fastest of its candidate configs, or itself where it is not
    tuned (not timeable (CUDA), not wanted, a template, empty, symbolic sizes, one candidate)."""
    if not tuning_wanted() or not autotune.timeable(source.device_type) or source.skip or \
            source.constexpr_values is not None:
        return source
    ints = _static(list(source.size_args) + [source.xnumel])
    if ints is None:
        return source
    configs = candidate_configs(source, kernel)
    if len(configs) < 2:
        return source
    key = "|".join([f"kernel {autotune.source_digest(source.source)}", f"sizes {ints}",
                    f"pointers {[str(dtype) for dtype in source.pointer_dtypes]}", autotune.environment_key()])
    found = autotune.cached_choice(key)
    labels = {_label(config_): config_ for config_ in configs}
    if found is None:
        launches = {label: ({"XBLOCK": xblock, **({"RBLOCK": rblock} if rblock else {})}, {"num_warps": warps})
                    for label, (xblock, rblock, warps) in labels.items()}
        if autotune.budget_left() > 0:
            compile_candidates([(source, constexprs, options) for constexprs, options in launches.values()])
        with _torch.real_tensors():  # codegen runs under the compile's fake mode: time on real tensors
            tensors = random_buffers(source.buffer_args, source.pointer_dtypes, graph)
            runs = {label: launcher(source, tensors, constexprs, options,
                                    -(-int(source.xnumel) // constexprs["XBLOCK"]))
                    for label, (constexprs, options) in launches.items()}
            choice = autotune.choose(key, runs, f"kernel {source.name} ({source.function_name})")
    else:
        choice = found["choice"]
    if choice not in labels:
        return source
    xblock, rblock, warps = labels[choice]
    return dataclasses.replace(source, xblock=xblock, rblock=rblock, num_warps=warps)
