"""Plots of a benchmark results file (benchmarks/report.py's JSON): what `kiln bench` draws.

- `<stem>_speedup.{png,svg}`: speedup over eager per workload, one bar per compiled column
  (torch.compile, kiln, and their CUDA-graph and training columns), as the markdown tables
  compute it: inference and CUDA-graph cases over eager inference, training over eager training.
- `<stem>_times.{png,svg}`: the distribution of per-call times (each case's `times_ms`), one
  panel per workload and mode family, one box per backend.

matplotlib is optional: `plot_results` raises `MissingMatplotlib` when it is not installed.
Only the results file is read, so an installed kiln draws plots without the harness.
"""
from __future__ import annotations

import json
import math

# Column titles as benchmarks/report.py names them (the harness may not be importable here).
COLUMN_TITLES = {
    ("inductor", "infer"): "torch.compile", ("kiln", "infer"): "kiln",
    ("inductor", "cudagraphs"): "torch.compile CUDA graphs", ("kiln", "cudagraphs"): "kiln CUDA graphs",
    ("inductor", "train"): "torch.compile train", ("kiln", "train"): "kiln train",
}
COLORS = {"eager": "#888888", "inductor": "#ee7733", "kiln": "#0077bb"}


class MissingMatplotlib(RuntimeError):
    """matplotlib is not installed."""


def _ok(case) -> bool:
    return case is not None and case.get("status") == "ok" and case.get("median_ms")


def speedups(cases: list[dict]) -> dict:
    """{(backend, mode): {workload: eager ms / case ms}} for every compiled case that ran."""
    index = {(c.get("workload"), c.get("backend"), c.get("mode")): c for c in cases}
    table: dict = {}
    for case in cases:
        column = (case.get("backend"), case.get("mode"))
        if column not in COLUMN_TITLES or not _ok(case):
            continue
        baseline = index.get((case["workload"], "eager", "train" if case["mode"] == "train" else "infer"))
        if _ok(baseline):
            table.setdefault(column, {})[case["workload"]] = baseline["median_ms"] / case["median_ms"]
    return table


def _workloads(cases: list[dict]) -> list[str]:
    return list(dict.fromkeys(c["workload"] for c in cases if "workload" in c))


def _title(document: dict) -> str:
    env = document.get("environment", {})
    hardware = env.get("gpu") or env.get("cpu") or "CPU"
    parts = [hardware, f"torch {env['torch']}" if env.get("torch") else "",
             f"kiln {env['git_commit']}" if env.get("git_commit") else "", env.get("date", "")[:10]]
    return ", ".join(part for part in parts if part)


def plot_results(json_path: str) -> list[str]:
    """Draw both plots beside `json_path`; the paths written."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise MissingMatplotlib("matplotlib is not installed (pip install matplotlib): no plots drawn") from error
    with open(json_path) as handle:
        document = json.load(handle)
    cases = document.get("cases", [])
    stem = json_path[:-len(".json")] if json_path.endswith(".json") else json_path
    written = []
    for name, draw in (("speedup", _draw_speedups), ("times", _draw_times)):
        figure = draw(plt, cases, _title(document))
        if figure is None:
            continue
        for suffix in (".png", ".svg"):
            path = f"{stem}_{name}{suffix}"
            figure.savefig(path, dpi=120, bbox_inches="tight")
            written.append(path)
        plt.close(figure)
    return written


def _draw_speedups(plt, cases, title):
    table = speedups(cases)
    if not table:
        return None
    workloads = [w for w in _workloads(cases) if any(w in column for column in table.values())]
    columns = [column for column in COLUMN_TITLES if column in table]
    width = 0.8 / len(columns)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.2 * len(workloads) * max(1, len(columns)) / 2 + 2), 4.2))
    for position, column in enumerate(columns):
        xs = [k + (position - (len(columns) - 1) / 2) * width for k in range(len(workloads))]
        values = [table[column].get(workload, math.nan) for workload in workloads]
        color = COLORS.get(column[0], None)
        hatch = {"infer": "", "cudagraphs": "//", "train": ".."}.get(column[1], "")
        bars = axes.bar(xs, values, width, label=COLUMN_TITLES[column], color=color, hatch=hatch,
                        edgecolor="white", linewidth=0.5)
        for bar, value in zip(bars, values):
            if not math.isnan(value):
                axes.annotate(f"{value:.2f}", (bar.get_x() + bar.get_width() / 2, value), ha="center",
                              va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(workloads)), workloads)
    axes.set_ylabel("speedup over eager (x, higher is better)")
    axes.set_title(f"Speedup over eager (median per call)\n{title}", fontsize=10)
    axes.legend(fontsize=8, frameon=False)
    axes.spines[["top", "right"]].set_visible(False)
    return figure


def _draw_times(plt, cases, title):
    panels: dict = {}  # (workload, mode family) -> [(label, times)]
    for case in cases:
        if not _ok(case) or not case.get("times_ms"):
            continue
        family = "train" if case["mode"] == "train" else "infer"
        label = "eager" if case["backend"] == "eager" else COLUMN_TITLES.get((case["backend"], case["mode"]),
                                                                              f"{case['backend']} {case['mode']}")
        panels.setdefault((case["workload"], family), []).append((label, case["backend"], case["times_ms"]))
    if not panels:
        return None
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, grid = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.0 * rows), squeeze=False)
    for axes, ((workload, family), boxes) in zip(grid.flat, panels.items()):
        plot = axes.boxplot([times for _, _, times in boxes], vert=False, patch_artist=True, widths=0.6,
                            showfliers=True, flierprops={"markersize": 3},
                            medianprops={"color": "black"})
        for patch, (_, backend, _) in zip(plot["boxes"], boxes):
            patch.set_facecolor(COLORS.get(backend, "#cccccc"))
            patch.set_alpha(0.75)
        axes.set_yticks(range(1, len(boxes) + 1), [label for label, _, _ in boxes], fontsize=8)
        axes.set_xlabel("ms per call", fontsize=8)
        axes.set_title(f"{workload} ({'training' if family == 'train' else 'inference'})", fontsize=9)
        axes.tick_params(axis="x", labelsize=8)
        axes.spines[["top", "right"]].set_visible(False)
    for axes in list(grid.flat)[len(panels):]:
        axes.set_visible(False)
    figure.suptitle(f"Per-call times (box: p25-p75, line: median)\n{title}", fontsize=10)
    figure.tight_layout()
    return figure


__all__ = ["MissingMatplotlib", "plot_results", "speedups"]
