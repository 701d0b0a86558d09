"""Sweep results: a status per case, totals, the .md/.json report, and the known-failure table.

A case (op x dtype x direction) has one status:
    pass             every sample that ran passed
    known failure    a sample failed and the case is in known_failures.py
    new failure      a sample failed and the case is not in the table: fix kiln or add it
    unexpected pass  the case is in the table but passed: shrink the table
    skipped          nothing to compare (eager raised on every sample, or no samples)
    not run          the sweep was interrupted before the case finished

The table is regenerated from a sweep's JSON by `update_known_failures`: failing cases
of the sweep are added (a reason taken from the first failing sample), passing ones
removed, and cases the sweep did not run are kept as they were.
"""
from __future__ import annotations

import collections
import datetime
import json
import pathlib
import platform
import pprint
import runpy

from tests.ops.harness import Case, Outcome, SampleResult

KNOWN_FAILURES_PATH = pathlib.Path(__file__).with_name("known_failures.py")
STATUSES = ("pass", "known failure", "new failure", "unexpected pass", "skipped", "not run")


def known_failures(path: pathlib.Path = KNOWN_FAILURES_PATH) -> dict:
    """The table as the file says now (read afresh: the sweep may just have rewritten it)."""
    return dict(runpy.run_path(str(path))["KNOWN_FAILURES"])


def known_failure_reason(case: Case, table: dict | None = None) -> str | None:
    """The table's reason for `case` (an entry with dtype '*' covers every dtype), or None."""
    table = known_failures() if table is None else table
    wildcard = (case.op_name, case.variant, "*", case.direction)
    return table.get(case.key) or table.get(wildcard)


# --------------------------------------------------------------------------- one case


def case_summary(case: Case, samples: list[SampleResult], error: str | None, finished: bool,
                 table: dict) -> dict:
    """The JSON row of one case: status, lowering, counts and the first failure."""
    counts = collections.Counter(sample.outcome for sample in samples)
    failures = [sample for sample in samples if sample.outcome in Outcome.FAILURES]
    passes = [sample for sample in samples if sample.outcome == Outcome.PASS]
    known = known_failure_reason(case, table)
    if not finished:
        status = "not run"
    elif failures or error:
        status = "known failure" if known else "new failure"
    elif passes:
        status = "unexpected pass" if known else "pass"
    else:
        status = "skipped"
    if failures:
        first = failures[0]
        first_failure = f"{first.outcome} ({len(failures)}/{len(samples)} samples): {first.message}"
    else:
        first_failure = f"case error: {error}" if error else ""
    skip_note = next((f"{sample.outcome}: {sample.message}" for sample in samples
                      if sample.outcome in Outcome.SKIPS), "")
    return {
        "op": case.op_name, "variant": case.variant, "dtype": case.dtype, "direction": case.direction,
        "status": status, "lowering": _case_lowering(passes),
        "check": "+".join(sorted({sample.check for sample in passes}, reverse=True)) or "values",
        "counts": dict(counts), "first_failure": first_failure, "skip_note": skip_note,
        "known_reason": known or "", "error": error or "",
        "seconds": round(sum(sample.seconds for sample in samples), 2),
        # Passing samples are summed up above; the others are kept whole, to be looked at.
        "samples": [sample.to_json() for sample in samples if sample.outcome != Outcome.PASS],
    }


def _case_lowering(passes: list[SampleResult]) -> str:
    """kernels: every passing sample ran in kiln kernels (views count); externs: some used externs."""
    kinds = {sample.lowering for sample in passes}
    if not kinds:
        return ""
    if "unknown" in kinds:
        return "unknown"
    if kinds & {"externs", "mixed"}:
        return "externs" if kinds <= {"externs", "no compute"} else "mixed"
    return "kernels" if "kernels" in kinds else "no compute"


# --------------------------------------------------------------------------- totals and files


def totals(rows: list[dict]) -> dict:
    """Counts over all cases; the headline numbers of a sweep."""
    status = collections.Counter(row["status"] for row in rows)
    samples = collections.Counter()
    for row in rows:
        samples.update(row["counts"])
    passing = [row for row in rows if row["status"] in ("pass", "unexpected pass")]

    def cases_with(outcome: str) -> int:
        return sum(1 for row in rows if row["counts"].get(outcome))

    return {
        "ops": len({(row["op"], row["variant"]) for row in rows}),
        "cases": len(rows),
        **{f"cases {name}": status.get(name, 0) for name in STATUSES},
        "passing cases fully lowered to kernels": sum(row["lowering"] in ("kernels", "no compute") for row in passing),
        "passing cases using externs": sum(row["lowering"] in ("externs", "mixed") for row in passing),
        "passing cases with unknown lowering": sum(row["lowering"] == "unknown" for row in passing),
        "cases checked for shape only (random or uninitialized)": sum(row["check"] == "shape" for row in rows),
        "cases with some samples checked for shape only": sum(row["check"] == "values+shape" for row in rows),
        **{f"cases with a {outcome}": cases_with(outcome) for outcome in Outcome.FAILURES},
        **{f"samples {outcome}": samples.get(outcome, 0) for outcome in (Outcome.PASS, *Outcome.FAILURES, *Outcome.SKIPS)},
    }


def build_report(records, meta: dict) -> dict:
    """The JSON document of a sweep, from the pool's CaseRecords."""
    table = known_failures()
    rows = [case_summary(record.case, record.samples, record.error, record.finished, table) for record in records]
    return {"meta": meta, "totals": totals(rows), "cases": rows}


def sweep_meta(backend: str, dtypes: list[str], command: str, **settings) -> dict:
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    return {"backend": backend, "dtypes": dtypes, "command": command,
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "torch": torch.__version__, "triton": triton_version, "python": platform.python_version(),
            "cpu_backend": _cpu_backend(), **settings}


def _cpu_backend() -> str:
    """Which kernels ran the CPU samples (workers read KILN_CPU_BACKEND like this process)."""
    import os

    from kiln.config import config

    return os.environ.get("KILN_CPU_BACKEND", config.cpu_backend)


def write_report(report: dict, out_dir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """Write sweep_<backend>_<date>.json and .md under `out_dir`; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"sweep_{report['meta']['backend']}_{report['meta']['date'][:10]}"
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    md_path.write_text(render_markdown(report))
    return json_path, md_path


def _cell(text: str, limit: int = 220) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _name(row: dict) -> str:
    return f"{row['op']}.{row['variant']}" if row["variant"] else row["op"]


def render_markdown(report: dict) -> str:
    meta, rows = report["meta"], report["cases"]
    lines = [f"# OpInfo sweep: backend `{meta['backend']}`, {meta['date']}", "",
             f"`{meta['command']}`", "",
             f"torch {meta['torch']}, triton {meta['triton']}, Python {meta['python']}; "
             f"CPU kernels: {meta.get('cpu_backend', 'not recorded')}; "
             f"dtypes {', '.join(meta['dtypes'])}; at most {meta.get('max_samples') or 'all'} samples per case; "
             f"{meta.get('timeout')} s per sample; {meta.get('jobs')} workers; {meta.get('seconds', 0):.0f} s in all.",
             ""]
    if meta.get("direction", "forward") != "forward":
        lines += [f"Direction: {meta['direction']} (gradients of a fixed random cotangent, against eager's and float64's).",
                  ""]
    if meta.get("budget"):
        lines += [f"Time budget {meta['budget']:.0f} s: " + ("cut by the budget (cases not started are `not run`)."
                                                           if meta.get("cut_by_budget") else "finished within it."), ""]
    lines += ["## Totals", "", "| | count |", "|---|---:|"]
    lines += [f"| {name} | {value} |" for name, value in report["totals"].items()]

    def section(title: str, status: str, column: str, note: str = "") -> None:
        chosen = [row for row in rows if row["status"] == status]
        lines.extend(["", f"## {title} ({len(chosen)})", ""] + ([note, ""] if note else []))
        if chosen:
            lines.extend(["| op | dtype | samples | detail |", "|---|---|---|---|"])
            lines.extend(f"| {_name(row)} | {row['dtype']} | {_counts(row)} | {_cell(row[column])} |"
                         for row in chosen)

    update = "python -m tests.ops.sweep --update-known-failures <this report's .json>"
    section("New failures", "new failure", "first_failure", f"Fix kiln, or record them: `{update}`.")
    section("Unexpected passes", "unexpected pass", "known_reason", f"Shrink the table: `{update}`.")
    section("Known failures", "known failure", "first_failure")
    section("Not run (interrupted)", "not run", "first_failure")
    lines.extend(["", "## All cases", "", "| op | dtype | status | samples | lowering | check | seconds | note |",
                  "|---|---|---|---|---|---|---:|---|"])
    for row in rows:
        note = row["first_failure"] or row["skip_note"]
        lines.append(f"| {_name(row)} | {row['dtype']} | {row['status']} | {_counts(row)} | {row['lowering']} "
                     f"| {row['check']} | {row['seconds']} | {_cell(note, 160)} |")
    return "\n".join(lines) + "\n"


def _counts(row: dict) -> str:
    return ", ".join(f"{count} {outcome}" for outcome, count in sorted(row["counts"].items())) or "none"


# --------------------------------------------------------------------------- the known-failure table

_TABLE_HEADER = '''"""Known OpInfo failures, as data: {(op, variant_test_name, dtype, direction): reason}.

Produced by measurement, not written by hand: regenerate entries from a sweep with

    python -m tests.ops.sweep --backend kiln            # writes tests/ops/results/sweep_kiln_<date>.json
    python -m tests.ops.sweep --update-known-failures tests/ops/results/sweep_kiln_<date>.json

which adds the sweep's failing cases, removes the ones that now pass, and keeps the
entries for cases the sweep did not run. A reason you edit by hand is kept for as long
as the case keeps failing. dtype "*" covers every dtype. The sweep reports an entry that
passes as an "unexpected pass"; the pytest subset (test_opinfo.py) marks entries xfail
(strict=False).
"""

'''


def failure_reason(row: dict, backend: str) -> str:
    reason = row["first_failure"] or (f"case error: {row['error']}" if row["error"] else "failed")
    reason = " ".join(reason.split())
    reason = reason if len(reason) <= 300 else reason[:297] + "..."
    return reason if backend == "kiln" else f"[{backend}] {reason}"


def update_known_failures(report: dict, path: pathlib.Path = KNOWN_FAILURES_PATH) -> dict:
    """Merge a sweep's measured failures into the table file; returns what changed."""
    table = known_failures(path)
    backend = report["meta"]["backend"]
    added, removed, kept = [], [], 0
    for row in report["cases"]:
        key = (row["op"], row["variant"], row["dtype"], row["direction"])
        if row["status"] == "not run":
            continue
        failing = row["status"] in ("known failure", "new failure")
        if failing and known_failure_reason(Case(*key), table) is None:
            table[key] = failure_reason(row, backend)
            added.append(key)
        elif failing:
            kept += 1
        elif key in table:
            del table[key]
            removed.append(key)
    write_known_failures(table, path)
    return {"added": added, "removed": removed, "kept": kept, "entries": len(table)}


def write_known_failures(table: dict, path: pathlib.Path = KNOWN_FAILURES_PATH) -> None:
    lines = [_TABLE_HEADER, "KNOWN_FAILURES: dict[tuple[str, str, str, str], str] = {"]
    for key in sorted(table):
        lines.append(f"    {pprint.pformat(key, width=200)}:")
        lines.append(f"        {table[key]!r},")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")
