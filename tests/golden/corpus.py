"""Build the kernel corpus of one checkout: every text kiln generates for the golden programs and
for the model tests, keyed `<backend>/<program>/graph<n>/<dump file>`, written as one JSON file.

    python -m tests.golden.corpus --out corpus.json [--backends cpp,triton] [--no-models]

tests/golden/kernel_diff.py runs this at two commits and compares the results. It imports only
its own package relatively, so kernel_diff can run a copy of it against another commit's kiln.
The model programs are the test functions of a tests/models/test_models.py (`--models-file`),
run with kiln's default options and their own small sizes, kernels generated but not compiled.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import random
import sys
import traceback

import torch

from .capture import BACKENDS, record_graphs, run_program
from .programs import PROGRAMS

MODEL_TESTS = "tests/models/test_models.py"


def _model_programs(models_file: str) -> list:
    """(name, zero-argument function) for each test function of `models_file`."""
    spec = importlib.util.spec_from_file_location("kiln_corpus_models", models_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [(name, function) for name, function in vars(module).items()
            if name.startswith("test_") and inspect.isfunction(function)
            and not inspect.signature(function).parameters]


def _record(corpus: dict, backend: str, name: str, run) -> None:
    """Run `run()` with every graph it compiles dumped; its texts go into `corpus`, a failure too."""
    import kiln

    kiln.reset()
    random.seed(0)
    torch.manual_seed(0)
    prefix = f"{backend}/{name}"
    try:
        with record_graphs(backend) as graphs:
            run()
    except Exception:  # recorded, so the diff shows a program that fails at one commit only
        corpus[f"{prefix}/error"] = traceback.format_exc(limit=-3)
        return
    for position, graph in enumerate(graphs):
        for filename, text in graph.files.items():
            corpus[f"{prefix}/graph{position}/{filename}"] = text


def build_corpus(backends=BACKENDS, models_file: str | None = MODEL_TESTS, progress=None) -> dict:
    corpus: dict = {}
    programs = [(f"golden.{program.name}", lambda program=program: run_program(program)) for program in PROGRAMS]
    if models_file:
        programs += [(f"models.{name}", function) for name, function in _model_programs(models_file)]
    for backend in backends:
        for name, run in programs:
            if progress:
                progress(f"{backend}/{name}")
            _record(corpus, backend, name, run)
    return corpus


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the corpus JSON file to write")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: cpp, triton")
    parser.add_argument("--models-file", default=MODEL_TESTS, help="the model tests to run ('' for none)")
    parser.add_argument("--no-models", action="store_true", help="the golden programs only")
    args = parser.parse_args(argv)
    models_file = None if args.no_models or not args.models_file else args.models_file
    corpus = build_corpus(args.backends.split(","), models_file,
                          progress=lambda name: print(f"corpus: {name}", file=sys.stderr, flush=True))
    with open(args.out, "w") as handle:
        json.dump(corpus, handle, indent=0, sort_keys=True)
    errors = [key for key in corpus if key.endswith("/error")]
    print(f"corpus: {len(corpus)} texts, {len(errors)} programs failed: {errors}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
