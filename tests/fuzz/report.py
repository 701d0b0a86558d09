"""The summary of a fuzz run: counts by outcome, fallbacks by reason, every failure, and where it ran.

`summarize` turns the results into plain data (written as JSON); `markdown` renders the
short human summary kept beside it in tests/fuzz/results/.
"""
from __future__ import annotations

import collections
import datetime
import os
import platform
import re
import subprocess
import sys

from tests.fuzz.runner import Outcome


def environment() -> dict:
    """Versions, commit, date and machine of this run."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except Exception:
        triton_version = None
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # A device machine gets a copy of the working tree whose .git (if any) is not this checkout's:
    # the caller names the commit there.
    commit = os.environ.get("KILN_GIT_COMMIT")
    try:
        if commit:
            raise LookupError(commit)
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        commit += "+dirty" if dirty else ""
    except LookupError:
        pass
    except Exception:
        commit = "unknown"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit, "python": sys.version.split()[0], "torch": torch.__version__,
            "triton": triton_version, "machine": f"{platform.node()} ({platform.machine()}, "
                                                 f"{os.cpu_count()} cores{', ' + gpu if gpu else ''})"}


def reason_key(reason: str) -> str:
    """A fallback reason with its program-specific details (names, numbers, shapes) blurred, for grouping."""
    text = re.sub(r"\b[vx]\d+\b", "<v>", reason)
    text = re.sub(r"\d+", "N", text)
    return text[:160]


def summarize(results: list, *, seed: int, backend: str, device: str, seconds: float, arguments: dict) -> dict:
    counts = collections.Counter(result.outcome for result in results)
    fallbacks = collections.Counter(reason_key(reason) for result in results for reason in set(result.fallbacks))
    failures = [result.to_json() for result in results if result.outcome not in (Outcome.PASS,)]
    return {
        "seed": seed, "backend": "triton" if device == "cuda" else backend,  # CUDA tensors always run Triton
        "device": device, "arguments": arguments,
        "environment": environment(),
        "programs": len(results),
        "compiled": sum(result.compiled for result in results),
        "fell_back": sum(bool(result.fallbacks) for result in results),
        "fallback_reasons": dict(fallbacks.most_common()),
        "outcomes": {outcome: counts.get(outcome, 0) for outcome in Outcome.ALL},
        "seconds": round(seconds, 1),
        "programs_per_second": round(len(results) / seconds, 3) if seconds else None,
        "not_passing": failures,
        "fell_back_programs": [{"name": result.name, "outcome": result.outcome, "fallbacks": result.fallbacks}
                               for result in results if result.fallbacks],
    }


def summary_lines(summary: dict) -> list[str]:
    """The final summary the CLI prints."""
    outcomes = summary["outcomes"]
    lines = [f"{summary['programs']} programs (seed {summary['seed']}, {summary['backend']} on {summary['device']}) "
             f"in {summary['seconds']:.0f} s ({summary['programs_per_second']} programs/s)",
             f"  compiled {summary['compiled']}, fell back {summary['fell_back']}, wrong {outcomes['wrong']}, "
             f"crashed {outcomes['crash']}, timed out {outcomes['timeout']}, stride mismatches {outcomes['stride']}, "
             f"rounding-sensitive {outcomes['sensitive']}, invalid (generator bugs) {outcomes['invalid']}"]
    for reason, count in summary["fallback_reasons"].items():
        lines.append(f"  fallback x{count}: {reason}")
    return lines


def markdown(summary: dict) -> str:
    env = summary["environment"]
    lines = [f"# Fuzz run: {summary['backend']} on {summary['device']}, seed {summary['seed']}", "",
             f"{env['date']}, commit {env['commit']}, Python {env['python']}, torch {env['torch']}, "
             f"triton {env['triton']}, {env['machine']}.", "",
             f"Command: `python -m tests.fuzz {summary['arguments'].get('command_line', '')}`", "",
             "| programs | compiled | fell back | wrong | crash | timeout | stride | sensitive | invalid | seconds | programs/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    outcomes = summary["outcomes"]
    lines.append(f"| {summary['programs']} | {summary['compiled']} | {summary['fell_back']} | {outcomes['wrong']} | "
                 f"{outcomes['crash']} | {outcomes['timeout']} | {outcomes['stride']} | {outcomes['sensitive']} | "
                 f"{outcomes['invalid']} | {summary['seconds']:.0f} | {summary['programs_per_second']} |")
    if summary["fallback_reasons"]:
        lines += ["", "## Fallbacks by reason", ""]
        lines += [f"- {count} x `{reason}`" for reason, count in summary["fallback_reasons"].items()]
    if summary["fell_back_programs"]:
        lines += ["", "Programs that fell back: " + ", ".join(f"`{entry['name']}`"
                                                              for entry in summary["fell_back_programs"]) + "."]
    failing = [result for result in summary["not_passing"] if result["outcome"] != Outcome.PASS]
    if failing:
        lines += ["", "## Programs that did not pass", "",
                  "Repro: `python -m tests.fuzz --show --seed S --index K`; shrink: `--minimize`.", ""]
        for result in failing:
            message = (result["message"] or result["stride_message"]).replace("|", "/")[:240]
            lines.append(f"- `{result['name']}` {result['outcome']}: {message}")
    return "\n".join(lines) + "\n"
