"""`python -m tests.fuzz`: run a seeded fuzz sweep, show one program, or minimize a failure.

    python -m tests.fuzz --programs 500 --seed 1 --backend cpp --jobs 2
    python -m tests.fuzz --programs 500 --seed 1 --backend triton --jobs 2
    python -m tests.fuzz --programs 10000 --seed 7 --device cuda --jobs 4      # on a GPU machine
    python -m tests.fuzz --show --seed 1 --index 37                           # the repro script
    python -m tests.fuzz --minimize --seed 1 --index 37 --backend cpp          # the smallest failing program
    python -m tests.fuzz --regressions --backend triton                       # tests/fuzz/regressions.py

A sweep prints progress and a final summary and writes a JSON and a short .md summary
(default: tests/fuzz/results/fuzz_<backend>_<device>_seed<S>_<date>.json). The exit
status is 1 when a program gave a wrong answer, crashed or timed out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=100, help="how many programs (indices first..first+N-1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="index of the first program")
    parser.add_argument("--backend", choices=("cpp", "triton"), default="cpp",
                        help="kiln's CPU backend (CUDA tensors always run Triton)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per program")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: start no program once they are spent (the summary counts what ran)")
    parser.add_argument("--out", help="the JSON summary's path (a .md is written beside it)")
    parser.add_argument("--show", action="store_true", help="print program --index of --seed as a repro script")
    parser.add_argument("--minimize", action="store_true", help="shrink program --index of --seed while it fails")
    parser.add_argument("--index", type=int, help="the program for --show and --minimize")
    parser.add_argument("--regressions", action="store_true", help="run the programs of tests/fuzz/regressions.py")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    arguments = parse_arguments(argv)
    from tests.fuzz.workers import set_triton_mode

    set_triton_mode(arguments.device)  # before anything imports triton
    from tests.fuzz.generator import generate

    if arguments.show or arguments.minimize:
        if arguments.index is None:
            sys.exit("--show and --minimize need --index")
        program = generate(arguments.seed, arguments.index)
        if arguments.show:
            print(program.repro_source(arguments.backend, arguments.device))
            return 0
        from tests.fuzz.minimize import minimize_program

        minimal = minimize_program(program, backend=arguments.backend, device=arguments.device,
                                   timeout=arguments.timeout, log=print)
        return 0 if minimal is None else 1
    if arguments.regressions:
        return run_regressions(arguments)
    return run_sweep(arguments, [generate(arguments.seed, index)
                                 for index in range(arguments.first, arguments.first + arguments.programs)])


def run_sweep(arguments, programs: list) -> int:
    from tests.fuzz.report import markdown, summarize, summary_lines
    from tests.fuzz.runner import Outcome
    from tests.fuzz.workers import Task, run_pool

    out = arguments.out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results",
        f"fuzz_{arguments.backend}_{arguments.device}_seed{arguments.seed}_"
        f"{datetime.datetime.now(datetime.timezone.utc):%Y%m%d_%H%M}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    log_path = os.path.splitext(out)[0] + ".log"
    started = time.monotonic()
    counts: dict = {}

    def on_result(task_id: int, result) -> None:
        counts[result.outcome] = counts.get(result.outcome, 0) + 1
        done = sum(counts.values())
        if result.outcome != Outcome.PASS:
            print(f"  {result.name}: {result.outcome}: {(result.message or result.stride_message)[:300]}", flush=True)
        if done % 10 == 0 or done == len(programs):
            tally = ", ".join(f"{outcome} {count}" for outcome, count in sorted(counts.items()))
            print(f"[{done:5}/{len(programs)}] {time.monotonic() - started:6.0f} s  {tally}", flush=True)

    tasks = [Task(program, arguments.backend, arguments.device) for program in programs]
    results = run_pool(tasks, jobs=arguments.jobs, timeout=arguments.timeout, log_path=log_path,
                       on_result=on_result, budget=arguments.budget)
    seconds = time.monotonic() - started
    command_line = " ".join(sys.argv[1:]) if sys.argv[0].endswith("__main__.py") else ""
    summary = summarize(results, seed=arguments.seed, backend=arguments.backend, device=arguments.device,
                        seconds=seconds, arguments={**vars(arguments), "command_line": command_line})
    with open(out, "w") as handle:
        json.dump(summary, handle, indent=1)
    with open(os.path.splitext(out)[0] + ".md", "w") as handle:
        handle.write(markdown(summary))
    print("\n".join(summary_lines(summary)))
    print(f"wrote {out} (and .md; worker output in {log_path})")
    return 1 if any(summary["outcomes"][outcome] for outcome in Outcome.FAILURES) else 0


def run_regressions(arguments) -> int:
    """Every program of tests/fuzz/regressions.py on one backend, against its recorded status."""
    from tests.fuzz.regressions import check_result, regression_programs
    from tests.fuzz.workers import Task, run_pool

    entries = regression_programs(arguments.backend, arguments.device)
    tasks = [Task(entry.program, arguments.backend, arguments.device) for entry in entries]
    where = "cuda" if arguments.device == "cuda" else arguments.backend  # the key of `known`
    problems = 0
    for entry, result in zip(entries, run_pool(tasks, jobs=arguments.jobs, timeout=arguments.timeout)):
        problem = check_result(entry, result, where)
        problems += bool(problem)
        known = entry.known_failure(where)
        status = problem or ("known: " + known if known else "ok")
        print(f"{entry.name:40} {result.outcome:9} {status[:200]}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
