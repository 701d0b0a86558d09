"""Benchmark results: the run's environment, the markdown tables and the JSON file.

Every case is one dict (see benchmarks/case.py for its fields) plus `suite`, `workload`,
`backend`, `mode` and `status` ("ok", "error", "timeout", "skipped"). Tables quote the
median time and the speedup over eager in the same mode family (inference cases and
CUDA-graph cases over eager inference, training over eager training); a geometric mean
closes each speedup column, over the rows where that column has a number.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys

from benchmarks.workloads import KERNEL_TITLES, geometric_mean

COLUMN_TITLES = {
    ("eager", "infer"): "eager", ("inductor", "infer"): "torch.compile", ("kiln", "infer"): "kiln",
    ("inductor", "cudagraphs"): "torch.compile CUDA graphs", ("kiln", "cudagraphs"): "kiln CUDA graphs",
    ("eager", "train"): "eager", ("inductor", "train"): "torch.compile", ("kiln", "train"): "kiln",
    ("inductor", "train-cudagraphs"): "torch.compile CUDA graphs", ("kiln", "train-cudagraphs"): "kiln CUDA graphs",
    ("inductor", "autotune"): "torch.compile max-autotune", ("kiln", "autotune"): "kiln max-autotune",
}


# --------------------------------------------------------------------------- environment

def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit(repo_root: str) -> str:
    """$KILN_GIT_COMMIT when set (a device machine's copy of the tree may carry a stale .git), else HEAD
    (plus '-dirty' when tracked files changed)."""
    if os.environ.get("KILN_GIT_COMMIT"):
        return os.environ["KILN_GIT_COMMIT"]
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")  # read-only: never refresh the index
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root, env=env, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_root,
                                 env=env, capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("-dirty" if changed else "")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("KILN_GIT_COMMIT", "unknown")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str, repo_root: str, command_line: str) -> dict:
    import torch

    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": device,
        "gpu": gpu,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "timm": _version("timm"),
        "torchvision": _version("torchvision"),
        "git_commit": git_commit(repo_root),
        "command": command_line,
        "executable": sys.executable,
    }


def hardware_tag(env: dict) -> str:
    name = env["gpu"] or "cpu"
    tag = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return tag


def text_header(title: str, env: dict, doc: str) -> list[str]:
    """A text result's first lines: its title, the environment (date, hardware, versions, commit, command)
    and its method: the third paragraph of the tool's docstring `doc` (after its title and usage)."""
    method = doc.split("\n\n")[2].replace("\n", " ")
    return [f"# {title}", "", *(f"- {key}: {value}" for key, value in env.items() if value is not None),
            f"- method: {method}", ""]


def write_text_result(kind: str, env: dict, lines: list[str]) -> str:
    """`lines` written to benchmarks/results/<date>_<kind>_<hardware>.md; its path."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                        f"{env['date'][:10]}_{kind}_{hardware_tag(env)}.md")
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def names(text: str) -> list[str]:
    """The items of a comma-separated command-line list (`--models bert,llama`), blanks dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


# --------------------------------------------------------------------------- tables

def _index(cases: list[dict]) -> dict:
    return {(c["suite"], c["workload"], c["backend"], c["mode"]): c for c in cases}


def _ok(case: dict | None) -> bool:
    return case is not None and case.get("status") == "ok"


def _time_cell(case: dict | None, scale: float = 1.0, digits: int = 2) -> str:
    if case is None:
        return ""
    if not _ok(case):
        return case.get("status", "?")
    return f"{case['median_ms'] * scale:.{digits}f}"


def _speedup(case: dict | None, baseline: dict | None) -> float | None:
    if _ok(case) and _ok(baseline) and case["median_ms"] > 0:
        return baseline["median_ms"] / case["median_ms"]
    return None


def _fmt_ratio(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else ""


def _geomean_cell(values: list) -> str:
    present = [v for v in values if v is not None]
    mean = geometric_mean(present)
    return f"**{mean:.2f}** (n={len(present)})" if mean is not None else ""


def _accuracy_cell(case: dict | None) -> str:
    if not _ok(case) or "accuracy_ok" not in case:
        return ""
    return "ok" if case["accuracy_ok"] else "FAIL"


def _model_table(cases, workloads, compiled_columns, mode_family: str) -> list[str]:
    """One row per model: eager ms, then per compiled column its ms and speedup."""
    index = _index(cases)
    baseline_mode = "train" if mode_family == "train" else "infer"
    header = ["model", "shape", "eager ms"]
    for column in compiled_columns:
        header += [f"{COLUMN_TITLES[column]} ms", "x"]
    header += ["first call s (" + " / ".join(COLUMN_TITLES[c] for c in compiled_columns) + ")"]
    header += ["peak GiB (eager / " + " / ".join(COLUMN_TITLES[c] for c in compiled_columns) + ")"]
    header += ["peak reserved GiB (eager / " + " / ".join(COLUMN_TITLES[c] for c in compiled_columns) + ")"]
    header += ["accuracy"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    speedups: dict = {column: [] for column in compiled_columns}
    for workload in workloads:
        baseline = index.get(("models", workload, "eager", baseline_mode))
        row_cases = [index.get(("models", workload) + column) for column in compiled_columns]
        if baseline is None and all(case is None for case in row_cases):
            continue
        shape = next((c.get("shape") for c in [baseline, *row_cases] if c and c.get("shape")), "")
        row = [workload, shape, _time_cell(baseline)]
        for column, case in zip(compiled_columns, row_cases):
            ratio = _speedup(case, baseline)
            speedups[column].append(ratio)
            row += [_time_cell(case), _fmt_ratio(ratio)]
        row.append(" / ".join(f"{c['first_call_s']:.1f}" if _ok(c) else "-" for c in row_cases))
        for key in ("peak_gib", "peak_reserved_gib"):
            row.append(" / ".join(f"{c[key]:.2f}" if _ok(c) and c.get(key) is not None else "-"
                                  for c in [baseline, *row_cases]))
        row.append(" / ".join(_accuracy_cell(c) or "-" for c in row_cases))
        lines.append("| " + " | ".join(row) + " |")
    geomean_row = ["geomean", "", ""]
    for column in compiled_columns:
        geomean_row += ["", _geomean_cell(speedups[column])]
    geomean_row += ["", "", "", ""]
    lines.append("| " + " | ".join(geomean_row) + " |")
    return lines


def _kernel_table(cases, workloads, compiled_columns) -> list[str]:
    index = _index(cases)
    copy = index.get(("kernels", "copy", "eager", "infer"))
    ceiling = copy.get("gb_per_s") if _ok(copy) else None
    lines = [f"Copy ceiling (read + write, measured in this run): "
             f"{_bandwidth(ceiling) + ' GB/s' if ceiling else 'not measured'}", ""]
    header = ["program", "shape", "eager us"]
    for column in compiled_columns:
        header += [f"{COLUMN_TITLES[column]} us", "x"]
    header += ["GB/s (eager / " + " / ".join(COLUMN_TITLES[c] for c in compiled_columns) + ")",
               "of ceiling", "accuracy"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    speedups: dict = {column: [] for column in compiled_columns}
    for workload in workloads:
        if workload == "copy":
            continue
        baseline = index.get(("kernels", workload, "eager", "infer"))
        row_cases = [index.get(("kernels", workload) + column) for column in compiled_columns]
        if baseline is None and all(case is None for case in row_cases):
            continue
        shape = next((c.get("shape") for c in [baseline, *row_cases] if c and c.get("shape")), "")
        row = [KERNEL_TITLES.get(workload, workload), shape, _time_cell(baseline, 1000.0, 1)]
        for column, case in zip(compiled_columns, row_cases):
            ratio = _speedup(case, baseline)
            speedups[column].append(ratio)
            row += [_time_cell(case, 1000.0, 1), _fmt_ratio(ratio)]
        all_cases = [baseline, *row_cases]
        # products are compute-bound: no bandwidth, no copy ceiling (`gb_per_s` absent)
        row.append(" / ".join(_bandwidth(c['gb_per_s']) if _ok(c) and "gb_per_s" in c else "-" for c in all_cases))
        row.append(" / ".join(f"{c['gb_per_s'] / ceiling:.2f}" if _ok(c) and ceiling and "gb_per_s" in c else "-"
                              for c in all_cases))
        row.append(" / ".join(_accuracy_cell(c) or "-" for c in row_cases))
        lines.append("| " + " | ".join(row) + " |")
    geomean_row = ["geomean", "", ""]
    for column in compiled_columns:
        geomean_row += ["", _geomean_cell(speedups[column])]
    lines.append("| " + " | ".join(geomean_row + ["", "", ""]) + " |")
    return lines


def _bandwidth(gb_per_s: float) -> str:
    return f"{gb_per_s:,.0f}" if gb_per_s >= 100 else f"{gb_per_s:.3g}"


def _problems(cases) -> list[str]:
    """Every case that did not end well, and every failed accuracy check, with the reason."""
    lines = []
    for case in cases:
        name = f"{case['suite']}/{case['workload']} {case['backend']} {case['mode']}"
        if case.get("status") != "ok":
            lines.append(f"- {name}: **{case.get('status')}**: {case.get('error', '')}")
        elif case.get("accuracy_ok") is False:
            lines.append(f"- {name}: **accuracy FAIL**: {case.get('accuracy')}")
        if case.get("kiln_warnings"):
            first = "; ".join(case.get("kiln_first_warnings", []))
            lines.append(f"- {name}: {case['kiln_warnings']} kiln warning(s), e.g. {first}")
    return lines


def _details(cases) -> list[str]:
    header = ["suite", "workload", "backend", "mode", "status", "median ms", "p20-p80 ms", "first call s",
              "peak GiB", "peak reserved GiB", "graphs / breaks", "accuracy"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in cases:
        ok = _ok(c)
        lines.append("| " + " | ".join([
            c["suite"], c["workload"], c["backend"], c["mode"], c.get("status", "?"),
            f"{c['median_ms']:.4g}" if ok else "",
            f"{c['p20_ms']:.4g}-{c['p80_ms']:.4g}" if ok else "",
            f"{c['first_call_s']:.2f}" if ok else "",
            f"{c['peak_gib']:.2f}" if ok and c.get("peak_gib") is not None else "",
            f"{c['peak_reserved_gib']:.2f}" if ok and c.get("peak_reserved_gib") is not None else "",
            (f"{c['graphs']} / {c['graph_breaks']}" + (f" (+{c['eager_frames']} eager frames)"
                                                        if c.get("eager_frames") else "")) if "graphs" in c else "",
            (c.get("accuracy", "") if ok else c.get("error", "")).replace("|", "/")[:160],
        ]) + " |")
    return lines


def summary_sections(cases: list[dict], plan: dict) -> list[str]:
    """The tables a reader wants first: inference, training, kernels, problems."""
    out: list[str] = []
    models, kernels = plan.get("models", []), plan.get("kernels", [])
    compiled_backends = [b for b in plan["backends"] if b != "eager"]
    infer_columns = [(b, m) for m in ("infer", "cudagraphs", "autotune") if m in plan["modes"]
                     for b in compiled_backends]
    if models and any(m in plan["modes"] for m in ("infer", "cudagraphs", "autotune")):
        out += ["## Inference (median ms per call; x = speedup over eager)", ""]
        out += _model_table(cases, models, infer_columns, "infer") + [""]
    train_columns = [(b, m) for m in ("train", "train-cudagraphs") if m in plan["modes"] for b in compiled_backends]
    if models and train_columns:
        out += ["## Training: forward + backward (median ms per call; x = speedup over eager)", ""]
        out += _model_table(cases, models, train_columns, "train") + [""]
    if kernels:
        kernel_columns = [c for c in infer_columns]
        out += ["## Kernels vs the memory roofline (median us per call)", ""]
        out += _kernel_table(cases, kernels, kernel_columns) + [""]
    problems = _problems(cases)
    out += ["## Problems (errors, timeouts, skips, accuracy failures, kiln warnings)", ""]
    out += (problems or ["none"]) + [""]
    return out


def markdown(env: dict, cases: list[dict], plan: dict, label: str) -> str:
    versions = ", ".join(f"{name} {env[name]}" for name in ("python", "torch", "cuda", "triton", "transformers",
                                                            "timm", "torchvision") if env.get(name))
    hardware = env["gpu"] or f"CPU only: {env['cpu']}"
    lines = [
        f"# kiln benchmarks: {label}", "",
        f"- date: {env['date']}",
        f"- hardware: {hardware} ({env['cpu_count']} CPU cores)",
        f"- versions: {versions}",
        f"- kiln commit: {env['git_commit']}; kiln backend rung: {plan.get('kiln_backend', 'kiln')}",
        f"- command: `{env['command']}`",
        f"- method: {plan['method']}", "",
    ]
    lines += summary_sections(cases, plan)
    lines += ["## All cases", ""] + _details(cases) + [""]
    return "\n".join(lines)


def write(results_dir: str, stem: str, env: dict, cases: list[dict], plan: dict, label: str,
          copy_to: str | None = None) -> list[str]:
    """Write <stem>.md and <stem>.json (again after every case, so a cut-off run keeps what it has)."""
    os.makedirs(results_dir, exist_ok=True)
    paths = []
    document = {"environment": env, "plan": plan, "cases": cases}
    for folder in [results_dir] + ([copy_to] if copy_to else []):
        os.makedirs(folder, exist_ok=True)
        md_path, json_path = os.path.join(folder, stem + ".md"), os.path.join(folder, stem + ".json")
        with open(md_path + ".tmp", "w") as handle:
            handle.write(markdown(env, cases, plan, label))
        os.replace(md_path + ".tmp", md_path)
        with open(json_path + ".tmp", "w") as handle:
            json.dump(document, handle, indent=1, default=str)
        os.replace(json_path + ".tmp", json_path)
        paths += [md_path, json_path]
    return paths


class Tee:
    """Writes to several open files at once (a benchmark's log in the results folder and in --copy-to)."""

    def __init__(self, handles):
        self.handles = handles

    def write(self, text: str) -> None:
        for handle in self.handles:
            handle.write(text)

    def flush(self) -> None:
        for handle in self.handles:
            handle.flush()
