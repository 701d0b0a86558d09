"""Timing and memory, as TARGETS.md measures them.

On CUDA each call is bracketed by its own pair of CUDA events (GPU time of that call,
including the gaps where the GPU waits for the host to launch work); on a CPU each
call is timed with `time.perf_counter`. The first call is timed separately, in wall
seconds with the device synchronized on both sides: it is the compile time.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import torch


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def spin_up(device: str, seconds: float) -> None:
    """Keep the GPU busy with matmuls for `seconds`, so that the warm-up and timed calls that
    follow run at steady clocks rather than after an idle spell (compiling leaves the GPU idle)."""
    if not device.startswith("cuda") or seconds <= 0:
        return
    matrix = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(8):
            torch.mm(matrix, matrix)
        torch.cuda.synchronize()


def time_first_call(call: Callable[[], Any], device: str) -> tuple[float, Any]:
    """Wall seconds of one call (the compiling one) and its result.

    With KILN_BENCH_PROFILE_FIRST_CALL=<path>, the call also runs under cProfile and the functions
    with the most cumulative time are written to <path> (a diagnosis of where a first call goes;
    the profiler's own cost is in the seconds returned then)."""
    profile_path = os.environ.get("KILN_BENCH_PROFILE_FIRST_CALL")
    profiler = None
    if profile_path:
        import cProfile

        profiler = cProfile.Profile()
    synchronize(device)
    start = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    result = call()
    synchronize(device)
    if profiler is not None:
        profiler.disable()
    seconds = time.perf_counter() - start
    if profiler is not None:
        _write_profile(profiler, profile_path, seconds)
    return seconds, result


def _write_profile(profiler, path: str, seconds: float) -> None:
    import io
    import pstats

    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(120)
    stats.sort_stats("tottime").print_stats(60)
    with open(path, "w") as handle:
        handle.write(f"first call {seconds:.2f} s under cProfile\n\n" + text.getvalue())


def time_calls(call: Callable[[], Any], device: str, iterations: int,
               before_each: Callable[[], None] | None = None) -> list[float]:
    """Milliseconds of each of `iterations` calls; `before_each` runs outside the timed span."""
    if device.startswith("cuda"):
        return _time_cuda(call, iterations, before_each)
    times = []
    for _ in range(iterations):
        if before_each is not None:
            before_each()
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def _time_cuda(call, iterations, before_each) -> list[float]:
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iterations)]
    torch.cuda.synchronize()
    for start, end in events:
        if before_each is not None:
            before_each()
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def per_call_ms(call: Callable[[], Any], calls: int, synchronize_each: bool) -> float:
    """Median CUDA-event milliseconds of `calls` calls, each followed by a synchronize or issued back
    to back (benchmarks.run's method: the host may run ahead of the GPU)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        call()
        end.record()
        if synchronize_each:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def issue_ms(call: Callable[[], Any], calls: int) -> float:
    """Wall milliseconds per call to issue `calls` calls without waiting for the GPU."""
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(calls):
        call()
    issued = time.perf_counter() - begin
    torch.cuda.synchronize()
    return issued * 1000 / calls


def summarize(times_ms: list[float]) -> dict:
    """Median (the quoted number) plus spread, in milliseconds."""
    ordered = sorted(times_ms)
    return {
        "median_ms": statistics.median(ordered),
        "min_ms": ordered[0],
        "p20_ms": ordered[len(ordered) // 5],
        "p80_ms": ordered[(4 * len(ordered)) // 5 - 1 if len(ordered) >= 5 else -1],
        "iterations": len(ordered),
        "times_ms": [round(t, 5) for t in times_ms],  # in call order, to see drift or outliers
    }


def reset_peak_memory(device: str) -> None:
    """Start the peaks from what the program holds now: the allocator's unused cached blocks (left by the
    compile, the warm-up) go back to the driver first, so the reserved peak counts only memory that is in use
    or that the calls take: live tensors, and a CUDA graph's private memory pool (`peak_reserved_gib`)."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib(device: str) -> float | None:
    """Peak bytes allocated by torch on the GPU since the last reset (None on a CPU)."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return None


def peak_reserved_gib(device: str) -> float | None:
    """Peak bytes the caching allocator held from the GPU since the last reset (None on a CPU).

    Where the allocated peak undercounts: torch.compile's CUDA graphs (cudagraph trees) hand out each replay's
    results on storages made from the graph pool's pointers, outside the allocator, so its allocated peak leaves
    out the results and the pool (Llama-style under reduce-overhead: 0.62 GiB allocated, with 0.60 GiB of
    parameters, measured, and 0.37 GiB of logits and KV cache returned, by the config's sizes). The reserved peak counts the pool's segments for
    every backend alike."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_reserved() / 2**30
    return None
