"""The full OpInfo sweep (run outside CI), and the command that refreshes known_failures.py.

    python -m tests.ops.sweep                                   # kiln, float32+bfloat16, every op
    python -m tests.ops.sweep --backend aot_eager --jobs 4       # validate the harness itself
    python -m tests.ops.sweep --ops add,max.binary,nn.functional.gelu --max-samples 3
    python -m tests.ops.sweep --subset                          # the CI subset's cases, in workers
    python -m tests.ops.sweep --grad --cpu-backend cpp --budget 3600   # gradients (float32, ops with autograd)
    python -m tests.ops.sweep --update-known-failures tests/ops/results/sweep_kiln_<date>.json

A sweep writes tests/ops/results/sweep_<backend>_<date>.md and .json (sweep_grad_<backend>_<date>
with --grad) and exits with 1 when a case failed that the known-failure table does not list, 0
otherwise. With --budget, cases not started when the budget runs out are reported as not run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shlex
import signal
import sys
import time

from tests.ops import harness, report
from tests.ops.subset import GRAD_SAMPLES_PER_CASE, SAMPLES_PER_CASE, grad_subset_cases, subset_cases
from tests.ops.workers import run_pool

RESULTS_DIR = pathlib.Path(__file__).with_name("results")
DEFAULT_MAX_SAMPLES = 25


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.ops.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="kiln", choices=harness.BACKENDS, help="rung of kiln's ladder")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated, of: " + ",".join(harness.DTYPES))
    parser.add_argument("--ops", default="", help="comma-separated OpInfo names ('max' = all variants, 'max.binary' = one)")
    parser.add_argument("--subset", action="store_true",
                        help="the CI subset's cases (tests/ops/subset.py), with its sample cap unless --max-samples")
    parser.add_argument("--cpu-backend", default=None, choices=("cpp", "triton"),
                        help="kiln's kernels for CPU tensors (KILN_CPU_BACKEND); reports are named "
                             "sweep_<backend>-<cpu backend>_<date> when given")
    parser.add_argument("--direction", default="forward", choices=harness.DIRECTIONS)
    parser.add_argument("--grad", action="store_true",
                        help="the gradient sweep: --direction backward in float32, every op that supports autograd")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds; stop (and report what finished) after this long (0: no limit)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--max-samples", type=int, default=DEFAULT_MAX_SAMPLES,
                        help="at most this many samples per case, spread over OpInfo's list (0: all; "
                             "some ops have over a thousand)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per sample before it counts as a timeout")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS_DIR, help="where the report goes")
    parser.add_argument("--update-known-failures", type=pathlib.Path, metavar="SWEEP_JSON",
                        help="do not sweep: merge this sweep's failures into known_failures.py")
    args = parser.parse_args(argv)
    if args.grad:
        args.direction = "backward"
        if args.dtypes == parser.get_default("dtypes"):
            args.dtypes = ",".join(harness.GRAD_DTYPES)
    unknown = set(args.dtypes.split(",")) - set(harness.DTYPES)
    if unknown:
        parser.error(f"unknown dtypes {sorted(unknown)}; choose from {sorted(harness.DTYPES)}")
    return args


def select_cases(ops: str, dtypes: list[str], direction: str) -> tuple[list[harness.Case], int]:
    """The cases to sweep, and how many selected ops support none of `dtypes` on CPU."""
    opinfos = harness.find_opinfos(ops.split(",") if ops else None)
    cases, unsupported = [], 0
    for op in opinfos:
        op_cases = harness.cases_for(op, dtypes, [direction])
        unsupported += not op_cases
        cases.extend(op_cases)
    return cases, unsupported


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.update_known_failures:
        changes = report.update_known_failures(json.loads(args.update_known_failures.read_text()))
        print(f"known_failures.py: {len(changes['added'])} added, {len(changes['removed'])} removed, "
              f"{changes['kept']} still failing, {changes['entries']} entries")
        for key in changes["added"]:
            print("  + ", key)
        for key in changes["removed"]:
            print("  - ", key)
        return 0

    label = args.backend
    if args.cpu_backend:
        os.environ["KILN_CPU_BACKEND"] = args.cpu_backend  # read by kiln.config in each worker
        label = f"{args.backend}-{args.cpu_backend}"
    if args.direction == "backward":
        label = f"grad_{label}"
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the sweep the way Ctrl-C does: report what finished
    if args.budget:  # the budget ends the sweep the same way
        signal.signal(signal.SIGALRM, _interrupt)
        signal.setitimer(signal.ITIMER_REAL, args.budget)
    max_samples = args.max_samples or None
    dtypes = args.dtypes.split(",")
    if args.subset and args.direction == "backward":
        cases, unsupported = [case for case in grad_subset_cases() if case.dtype in dtypes], 0
        if args.max_samples == DEFAULT_MAX_SAMPLES:
            max_samples = GRAD_SAMPLES_PER_CASE
    elif args.subset:
        cases, unsupported = [case for case in subset_cases() if case.dtype in dtypes], 0
        if args.max_samples == DEFAULT_MAX_SAMPLES:
            max_samples = SAMPLES_PER_CASE
    else:
        cases, unsupported = select_cases(args.ops, dtypes, args.direction)
    print(f"sweeping {len(cases)} cases on {args.backend} with {args.jobs} workers "
          f"({unsupported} ops support none of {dtypes} on CPU)", file=sys.stderr)
    started = time.monotonic()
    done = 0

    def progress(record) -> None:
        nonlocal done
        done += 1
        outcomes = {}
        for sample in record.samples:
            outcomes[sample.outcome] = outcomes.get(sample.outcome, 0) + 1
        summary = ", ".join(f"{count} {outcome}" for outcome, count in outcomes.items()) or record.error
        print(f"[{done}/{len(cases)} {time.monotonic() - started:5.0f}s] {record.case}: {summary}", file=sys.stderr)

    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / f"sweep_{label}_{datetime.date.today().isoformat()}.log"
    log_path.write_text("")
    print(f"worker output (C++ warnings, crash dumps) goes to {log_path}", file=sys.stderr)
    records = run_pool(cases, backend=args.backend, jobs=args.jobs, max_samples=max_samples,
                       timeout=args.timeout, on_case_done=progress, log_path=str(log_path))
    signal.setitimer(signal.ITIMER_REAL, 0)
    cut_by_budget = bool(args.budget) and not all(record.finished for record in records)
    command = "python -m tests.ops.sweep " + " ".join(shlex.quote(arg) for arg in (argv if argv is not None else sys.argv[1:]))
    meta = report.sweep_meta(label, dtypes, command, direction=args.direction, jobs=args.jobs,
                             max_samples=max_samples, timeout=args.timeout, budget=args.budget or None,
                             cut_by_budget=cut_by_budget,
                             ops_without_these_dtypes=unsupported,
                             seconds=round(time.monotonic() - started, 1))
    document = report.build_report(records, meta)
    json_path, md_path = report.write_report(document, args.out)
    for name, value in document["totals"].items():
        print(f"{name:45} {value}")
    print(f"wrote {md_path} and {json_path}")
    return 1 if document["totals"]["cases new failure"] else 0


if __name__ == "__main__":
    sys.exit(main())
