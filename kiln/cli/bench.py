"""`kiln bench`: run the one benchmark harness (benchmarks/run.py), then plot its results.

The harness lives in kiln's source repository (benchmarks/), not in the installed package:
`kiln bench` imports it from the working directory or from the checkout an editable install
points at, and says where to get it otherwise. `kiln bench --plot FILE` only draws the plots
(kiln/cli/plots.py), which needs no harness.
"""
from __future__ import annotations

import glob
import importlib
import os
import sys
import time

NO_HARNESS = ("kiln bench: the benchmark harness (benchmarks/run.py) is not importable: it is part of kiln's source "
              "repository, not of an installed kiln. Run `kiln bench` from the root of a kiln checkout "
              "(git clone <kiln's repository>; pip install -e .), or `python -m benchmarks.run` there. "
              "`kiln bench --plot RESULTS.json` draws plots without it.")


def _harness():
    """benchmarks.run, or None when it cannot be found."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for folder in (None, os.getcwd(), checkout):
        if folder is not None:
            if not os.path.isfile(os.path.join(folder, "benchmarks", "run.py")):
                continue
            if folder not in sys.path:
                sys.path.insert(0, folder)
        try:
            return importlib.import_module("benchmarks.run")
        except ImportError as error:
            if error.name not in ("benchmarks", "benchmarks.run"):
                raise  # the harness is there but something it needs is not: say that, not "missing"
    return None


def plot(json_path: str) -> int:
    from kiln.cli.plots import MissingMatplotlib, plot_results

    if not os.path.isfile(json_path):
        print(f"kiln bench --plot: {json_path} does not exist (results are benchmarks/results/*.json)",
              file=sys.stderr)
        return 2
    try:
        written = plot_results(json_path)
    except MissingMatplotlib as error:
        print(f"kiln bench: {error}")
        return 0
    if not written:
        print(f"kiln bench: {json_path} has no case that ran: nothing to plot")
    for path in written:
        print(f"plot: {path}")
    return 0


def run(harness_args: list[str], plot_file: str | None = None, no_plots: bool = False,
        harness_help: bool = False) -> int:
    if plot_file is not None:
        if harness_args:
            print(f"kiln bench --plot draws from a results file and runs nothing; unexpected: {' '.join(harness_args)}",
                  file=sys.stderr)
            return 2
        return plot(plot_file)
    harness = _harness()
    if harness is None:
        print(NO_HARNESS, file=sys.stderr)
        return 2
    if harness_help:
        harness_args = ["--help"]
    results_dir = harness.parse_args(harness_args).results_dir
    started = time.time()
    status = harness.main(harness_args)
    if no_plots:
        return status
    written = [path for path in glob.glob(os.path.join(results_dir, "*.json")) if os.path.getmtime(path) >= started]
    for path in sorted(written, key=os.path.getmtime)[-1:]:  # the file this run wrote
        plot(path)
    return status
