"""The `kiln` command (also `python -m kiln`): check an install, benchmark, look at the caches, report.

    kiln verify                 versions, toolchains, and a few programs compiled and checked on each device
    kiln bench [options]        the benchmark harness (benchmarks/run.py), then plots of its results
    kiln bench --plot FILE      plots from an existing results JSON
    kiln cache info|clear       kiln's on-disk caches (KILN_CACHE_DIR)
    kiln report ...             the HTML compile report (kiln/debug/html_report.py)

Each subcommand lives in its own module here (verify.py, bench.py, plots.py); this one parses
the command line and dispatches. The exit status is 0 on success, 1 when a check or a case
failed, 2 for a usage error or a part that this install lacks.
"""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kiln", description="kiln, a just-in-time compiler for PyTorch: check an install, benchmark, "
                                 "inspect the caches, write a compile report.",
        epilog="'kiln <command> --help' explains each command. Options are also environment variables: "
               "python -c \"import kiln; print(kiln.config.describe())\" lists them.")
    commands = parser.add_subparsers(dest="command", metavar="command")

    verify = commands.add_parser(
        "verify", help="check this install: versions, C++ compiler, OpenMP, Triton, CUDA; compile and check "
                       "a few programs on each available device",
        description="Print the versions of python, torch, triton, transformers and kiln; detect the C++ compiler "
                    "(and OpenMP), Triton and CUDA; compile a pointwise chain, a reduction, a softmax and a small "
                    "MLP with kiln on each available device and backend, checking each against eager "
                    "(kiln.testing.compare) and that kiln compiled it (kernels generated, nothing ran eagerly). "
                    "Says what to install for what is missing. Exit status 0 only when every check that could "
                    "run passed.")
    verify.add_argument("--triton-interpreter", action="store_true",
                        help="also check the Triton kernels on this CPU under Triton's interpreter (slow; on by "
                             "default when TRITON_INTERPRET=1 is set)")

    bench = commands.add_parser(
        "bench", help="run the benchmark harness (eager, torch.compile, kiln) and plot its results",
        description="Run kiln's benchmark harness (benchmarks/run.py, in kiln's source repository) with the "
                    "remaining arguments, then draw plots beside its results JSON: speedup over eager per model "
                    "and backend, and the distribution of per-call times (PNG and SVG; needs matplotlib). "
                    "'kiln bench --harness-help' lists the harness's options "
                    "(e.g. kiln bench --small --only bert --backends eager,kiln).")
    bench.allow_abbrev = False  # the harness's options pass through untouched
    bench.add_argument("--plot", metavar="RESULTS.json",
                       help="draw the plots from this existing results file; run nothing")
    bench.add_argument("--no-plots", action="store_true", help="run the harness only")
    bench.add_argument("--harness-help", action="store_true", help="the harness's own options")

    cache = commands.add_parser("cache", help="where kiln's caches are, how big; clear them",
                                description="kiln's on-disk caches (KILN_CACHE_DIR, default ~/.cache/kiln).")
    cache_commands = cache.add_subparsers(dest="cache_command", metavar="action")
    cache_commands.add_parser("info", help="the cache folders, with entries and bytes per kind",
                              description="Print where kiln's caches are and, per kind (triton, cpp, wrappers), "
                                          "how many entries and bytes they hold.")
    cache_commands.add_parser("clear", help="remove everything in kiln's cache dir (asks nothing)",
                              description="Remove the contents of kiln's cache dir and print what was removed. "
                                          "Kernels are rebuilt as needed. Triton's own cache is left alone.")

    commands.add_parser("report", add_help=False, help="write the browsable HTML compile report ('kiln report --help')",
                        description="The HTML compile report (kiln/debug/html_report.py).")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv[:1] == ["report"]:  # everything after `report` is the report's own (its --help too)
        return _report(argv[1:])
    if argv[:1] == ["bench"]:
        args, rest = parser.parse_known_args(argv)
    else:
        args, rest = parser.parse_args(argv), []
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "verify":
        from kiln.cli import verify
        return verify.run(triton_interpreter=args.triton_interpreter)
    if args.command == "bench":
        from kiln.cli import bench
        return bench.run(rest, plot_file=args.plot, no_plots=args.no_plots, harness_help=args.harness_help)
    if args.command == "cache":
        return _cache(args.cache_command, parser)
    parser.print_help()
    return 2


def _report(argv: list[str]) -> int:
    import importlib
    import importlib.util

    if importlib.util.find_spec("kiln.debug.html_report") is None:
        print("kiln report: the HTML compile report is not available in this version of kiln "
              "(kiln/debug/html_report.py is missing); KILN_DEBUG=1 writes the per-stage dumps instead.",
              file=sys.stderr)
        return 2
    html_report = importlib.import_module("kiln.debug.html_report")
    return html_report.main(argv)


def _cache(action: str | None, parser: argparse.ArgumentParser) -> int:
    from kiln.config import config
    from kiln.runtime import cache

    if action == "info":
        kinds = cache.usage()
        print(f"kiln cache: {config.cache_dir} (KILN_CACHE_DIR)")
        if not kinds:
            print("  empty")
        for kind, (entries, size) in kinds.items():
            print(f"  {kind:10} {entries:6} entries  {_bytes(size):>10}")
        if kinds:
            total_entries = sum(entries for entries, _ in kinds.values())
            print(f"  {'total':10} {total_entries:6} entries  {_bytes(sum(s for _, s in kinds.values())):>10}")
        triton_dir = _triton_cache_dir()
        if triton_dir:
            print(f"Triton's own cache of compiled GPU binaries: {triton_dir} (TRITON_CACHE_DIR; not kiln's)")
        return 0
    if action == "clear":
        removed = cache.clear()
        if not removed:
            print(f"kiln cache: {config.cache_dir} is already empty")
        for kind, (entries, size) in removed.items():
            print(f"removed {kind}: {entries} entries, {_bytes(size)}")
        if removed:
            print(f"kiln cache: {config.cache_dir} cleared")
        return 0
    parser.parse_args(["cache", "--help"])
    return 2


def _triton_cache_dir() -> str | None:
    try:
        from triton import knobs
        return knobs.cache.dir
    except Exception:  # no Triton, or one without knobs: nothing to point at
        return None


def _bytes(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
