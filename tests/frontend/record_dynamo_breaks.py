"""Dynamo's graph and break counts on the graph-break corpus, for tests/frontend/test_break_corpus.py.

    python -m tests.frontend.record_dynamo_breaks [--only NAME ...]

For each program it runs `torch._dynamo.explain(fn)(*args)` (graphs compiled with the
"eager" backend) on fresh state, the same arguments the test uses, and records: a checksum
of its source, graph_count, graph_break_count, break reasons (first line and user location),
and the frames of the corpus Dynamo skipped (ran eagerly, whole), with the reasons its
graph-break log gives (Dynamo's own counters of frames tried and converted are kept too). Where it
skipped one, the program's twin is recorded too, under "twin". The test reads
results/break_corpus_dynamo.json; rerun this whenever a program or its arguments change, or
torch is upgraded (`--only` updates the named programs and keeps the rest).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import platform
import sys
import warnings

import torch

from tests.frontend import corpus_breaks, corpus_breaks_effects  # noqa: F401  (they register the programs)
from tests.frontend.break_corpus_support import PROGRAMS, STDOUT, BreakProgram, fingerprint, fresh_args, reset_state

RESULTS = os.path.join(os.path.dirname(__file__), "results", "break_corpus_dynamo.json")


class _SkipLog(logging.Handler):
    """Dynamo's graph-break log lines that say a whole frame fell back to eager: (file, reason)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.skips: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "Skipping the function" in message or "frame skipped" in message:
            head = message.splitlines()
            where = os.path.basename(head[0].replace("Graph break in user code at ", ""))
            detail = next((line.strip() for line in head[1:] if line.strip() and not line.startswith("Graph Break")),
                          "")
            self.skips.append((where, f"{where}: {detail}"[:300]))


def _location(reason) -> str:
    stack = getattr(reason, "user_stack", None) or []
    if not stack:
        return ""
    frame = stack[-1]
    return f"{os.path.basename(frame.filename)}:{frame.lineno}"


def explain_once(fn, program: BreakProgram) -> dict:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    skips = _SkipLog()
    break_log = logging.getLogger("torch._dynamo.symbolic_convert.__graph_breaks")
    break_log.addHandler(skips)
    reset_state()
    try:
        with contextlib.redirect_stdout(STDOUT), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            output = torch._dynamo.explain(fn)(*fresh_args(program))
    finally:
        break_log.removeHandler(skips)
        reset_state()
    frames = dict(counters["frames"])
    torch._dynamo.reset()
    total, ok = frames.get("total", 0), frames.get("ok", 0)
    # Only frames of the corpus count: Dynamo also skips frames of the logging module's
    # internals, which run as frames of their own after a logging call breaks the graph.
    skipped = list(dict.fromkeys(reason for where, reason in skips.skips if where.startswith("corpus_breaks")))
    if total > ok and not skips.skips:
        skipped = ["(a frame failed; no reason logged)"]
    return {
        "graph_count": output.graph_count,
        "graph_break_count": output.graph_break_count,
        "break_reasons": [{"reason": reason.reason.strip().splitlines()[0][:200], "location": _location(reason)}
                          for reason in output.break_reasons],
        "frames_total": total,
        "frames_ok": ok,
        "skipped_frames": skipped,
    }


def record(program: BreakProgram) -> dict:
    try:
        entry = {"source": fingerprint(program), **explain_once(program.fn, program)}
    except Exception as error:  # Dynamo itself failed: the test reports it; the program must change
        torch._dynamo.reset()
        reset_state()
        return {"source": fingerprint(program),
                "error": f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"}
    if entry["skipped_frames"] and program.twin is not None:
        entry["twin"] = explain_once(program.twin, program)
        if entry["twin"]["skipped_frames"]:
            print(f"warning: Dynamo skips a frame of {program.name}'s twin too", file=sys.stderr)
    return entry


def _bound(entry: dict) -> dict:
    return entry["twin"] if entry["skipped_frames"] and "twin" in entry else entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="program names to record again (the others are kept)")
    options = parser.parse_args()
    # Dynamo's graph-break log is an artifact logger: at DEBUG, so skipped frames give their
    # reason to _SkipLog, and kept off the terminal.
    break_log = logging.getLogger("torch._dynamo.symbolic_convert.__graph_breaks")
    break_log.setLevel(logging.DEBUG)
    break_log.propagate = False
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    programs = {}
    if options.only and os.path.exists(RESULTS):
        with open(RESULTS) as file:
            programs = json.load(file)["programs"]
    for program in PROGRAMS:
        if options.only and program.name not in options.only:
            continue
        programs[program.name] = record(program)
        entry = programs[program.name]
        if "error" in entry:
            print(f"{program.name}: Dynamo failed: {entry['error']}", file=sys.stderr)
            continue
        skipped = f", skipped {len(entry['skipped_frames'])} frame(s)" if entry["skipped_frames"] else ""
        twin = f", twin {entry['twin']['graph_count']} graphs" if "twin" in entry else ""
        print(f"{program.name}: {entry['graph_count']} graphs, {entry['graph_break_count']} breaks{skipped}{twin}",
              file=sys.stderr)
    names = [program.name for program in PROGRAMS]
    programs = {name: programs[name] for name in names if name in programs}
    document = {
        "about": "torch._dynamo.explain on tests/frontend/corpus_breaks*.py "
                 "(python -m tests.frontend.record_dynamo_breaks)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "total_graphs": sum(entry.get("graph_count", 0) for entry in programs.values()),
        "total_breaks": sum(max(entry.get("graph_break_count", 0), 0) for entry in programs.values()),
        "programs_with_a_skipped_frame": sum(1 for entry in programs.values() if entry.get("skipped_frames")),
        # what kiln is held to: the twin's counts where Dynamo skips a frame of the program
        "total_graphs_bound": sum(_bound(entry)["graph_count"] for entry in programs.values() if "error" not in entry),
        "total_breaks_bound": sum(max(_bound(entry)["graph_break_count"], 0) for entry in programs.values()
                                  if "error" not in entry),
        "programs": programs,
    }
    with open(RESULTS, "w") as file:
        json.dump(document, file, indent=1)
        file.write("\n")
    print(f"wrote {RESULTS}: {len(programs)} programs", file=sys.stderr)


if __name__ == "__main__":
    main()
