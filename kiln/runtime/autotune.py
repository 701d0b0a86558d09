"""Autotuning's runtime half: timing candidates on the GPU, a per-graph time budget, and the choices
cached on disk.

The codegen layer says what to time (kiln/codegen/templates.py: a product template's tiles against
cuBLAS); this module times it and remembers the answer. A choice is a record in the kiln cache
(kiln/runtime/cache.py, `autotune/<hash>.json`) keyed by everything that decided it: the problem
(shapes, strides, dtypes), the GPU's name, and torch's and Triton's versions. A second process,
or a later graph with the same product, reads the choice instead of timing again.

Timing costs compile time, so each graph gets `config.autotune_budget_s` seconds of it
(`graph_budget()`, which kiln/backend.py opens around a graph's compile). Past the budget a
problem is not timed and the caller takes its default; what was spent is logged under
KILN_LOGS=perf.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import time
from typing import Callable, Iterator

from kiln.config import config
from kiln.runtime import cache

log = logging.getLogger("kiln")

_budget_left: contextvars.ContextVar = contextvars.ContextVar("kiln_autotune_budget", default=None)
_CHOICE_FIELDS = {"choice": str, "timings": dict}


@contextlib.contextmanager
def graph_budget() -> Iterator[None]:
    """The block in which one graph compiles: its timing may take `config.autotune_budget_s` seconds."""
    left = [float(config.autotune_budget_s)]
    token = _budget_left.set(left)
    try:
        yield
    finally:
        _budget_left.reset(token)
        spent = float(config.autotune_budget_s) - left[0]
        if spent > 0:
            perf_log("kiln: autotuning took %.1f s of this graph's compile (budget %.0f s, "
                     "config.autotune_budget_s)", spent, config.autotune_budget_s)


def budget_left() -> float:
    """Seconds of timing this graph may still spend (the whole budget outside `graph_budget`)."""
    left = _budget_left.get()
    return float(config.autotune_budget_s) if left is None else left[0]


def _charge(seconds: float) -> None:
    left = _budget_left.get()
    if left is not None:
        left[0] -= seconds


@contextlib.contextmanager
def charged() -> Iterator[None]:
    """The block's wall time counts against the graph's budget (compiling candidates before timing them)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        _charge(time.perf_counter() - started)


def environment_key() -> str:
    """The parts of a choice's key that are not the problem's: the GPU and the libraries."""
    import torch
    import triton

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no-gpu"
    return f"{device}|torch {torch.__version__}|triton {triton.__version__}"


def source_digest(text: str) -> str:
    """A short digest of a kernel's source, for a choice's key."""
    return cache.source_hash(text)[:24]


def _record_name(key: str) -> str:
    return os.path.join("autotune", f"{cache.source_hash(key)[:32]}.json")


def cached_choice(key: str) -> dict | None:
    """The stored choice for `key` ({"choice": name, "timings": {name: ms}}), or None."""
    return cache.load_record(_record_name(key), key, _CHOICE_FIELDS)


def choose(key: str, candidates: dict, what: str) -> str | None:
    """The name of the fastest of `candidates` ({name: a function that runs it once on the GPU,
    None where it cannot}), cached under `key`; None when the budget is spent before any was timed."""
    found = cached_choice(key)
    if found is not None and found["choice"] in candidates:
        return found["choice"]
    started = time.perf_counter()
    timings = {}
    for name, run in candidates.items():
        if budget_left() - (time.perf_counter() - started) <= 0:
            perf_log("kiln: autotuning %s stopped: the graph's budget of %.0f s is spent "
                     "(config.autotune_budget_s)", what, config.autotune_budget_s)
            break
        milliseconds = time_ms(run)
        if milliseconds is not None:
            timings[name] = milliseconds
    spent = time.perf_counter() - started
    _charge(spent)
    if not timings:
        return None
    choice = min(timings, key=timings.get)
    if len(timings) == len(candidates):  # a partial timing (budget spent) is not remembered
        cache.store_record(_record_name(key), key, {"choice": choice, "timings": timings})
    perf_log("kiln: autotuned %s in %.2f s: %s (%s)", what, spent, choice,
             ", ".join(f"{name} {ms:.4f} ms" for name, ms in sorted(timings.items(), key=lambda item: item[1])))
    return choice


def perf_log(message: str, *args) -> None:
    if config.log_enabled("perf"):
        log.warning(message, *args)


def timeable(device_type: str) -> bool:
    """Whether kernels on `device_type` are timed (CUDA's; interpreted kernels' times mean nothing)."""
    return device_type == "cuda"


def time_ms(run: Callable[[], None], *, warmup: int = 3, repeats: int = 20) -> float | None:
    """The median milliseconds of `run()` on the current CUDA stream (CUDA events), or None when it
    raises (a tile that does not compile, or needs more shared memory than the GPU has)."""
    import torch

    try:
        for _ in range(warmup):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    except Exception as error:  # a candidate that cannot run is not chosen; the others still are
        perf_log("kiln: an autotuning candidate failed: %s: %s", type(error).__name__, error)
        return None
    times.sort()
    return times[len(times) // 2]


__all__ = ["budget_left", "cached_choice", "charged", "choose", "environment_key", "graph_budget", "perf_log",
           "source_digest", "time_ms", "timeable"]
