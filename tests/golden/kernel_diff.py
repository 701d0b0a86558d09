"""Kernel diff ("process replay"): every kernel kiln generates, compared between two commits.

    python -m tests.golden.kernel_diff A B [--backends cpp,triton] [--stages kernel] [--no-models]

A and B are git revisions, or `.` for this checkout as it is (uncommitted changes included). Each
revision is checked out in a temporary `git worktree`; there this checkout's corpus builder
(tests/golden/corpus.py, copied, so both sides build the same programs the same way) generates,
with default options and without compiling anything, the texts of the golden programs and of the
model tests (this checkout's tests/models/test_models.py, their small sizes). Every text that
differs is printed once as a unified diff with the places it occurs (a model's repeated layers
share one), followed by counts per stage. Exit status: 0 when nothing differs, 1 otherwise.

Stages: kernel (each generated kernel), loopir (before and after fusion), wrapper, memory (the
memory plan, kiln/schedule/memory.py), aten (the ATen graph from kiln/aot). tinygrad's process
replay is the model. It runs outside CI: a side takes about a minute per backend.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
BUILDER_FILES = ("__init__.py", "capture.py", "programs.py", "corpus.py")
BUILDER_PACKAGE = "kiln_golden_corpus"
STAGES = ("kernel", "loopir", "wrapper", "memory", "aten")


def stage_of(key: str) -> str:
    filename = key.rsplit("/", 1)[-1]
    if filename.startswith("kernel_"):
        return "kernel"
    if filename.startswith("loopir_"):
        return "loopir"
    if filename == "wrapper.py":
        return "wrapper"
    if filename == "memory_plan.txt":
        return "memory"
    if filename == "error":
        return "error"
    return "aten"


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", REPO_ROOT, *args], check=True, capture_output=True, text=True).stdout.strip()


def _checkout(revision: str, scratch: str) -> tuple[str, str]:
    """(the folder to build `revision` in, its description); a detached worktree for a commit."""
    if revision == ".":
        return REPO_ROOT, f". ({_git('rev-parse', '--short', 'HEAD')} and the working tree)"
    commit = _git("rev-parse", "--verify", f"{revision}^{{commit}}")
    folder = os.path.join(scratch, f"tree-{commit[:12]}")
    if not os.path.isdir(folder):
        _git("worktree", "add", "--detach", folder, commit)
    return folder, f"{revision} ({commit[:12]})"


def build_corpus_at(folder: str, scratch: str, args) -> dict:
    """The corpus of the kiln in `folder`, built by a copy of this checkout's builder in a subprocess."""
    builder_root = os.path.join(scratch, "builder")
    package = os.path.join(builder_root, BUILDER_PACKAGE)
    if not os.path.isdir(package):
        os.makedirs(package)
        for name in BUILDER_FILES:
            shutil.copy(os.path.join(HERE, name), package)
    out = os.path.join(scratch, f"corpus-{len(os.listdir(scratch))}.json")
    command = [args.python, "-m", f"{BUILDER_PACKAGE}.corpus", "--out", out, "--backends", args.backends]
    models_file = os.path.join(REPO_ROOT, "tests", "models", "test_models.py")
    command += ["--no-models"] if args.no_models else ["--models-file", models_file]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([folder, builder_root]), TRITON_INTERPRET="1",
               KILN_CACHE_DIR=os.path.join(scratch, "kiln-cache"))
    subprocess.run(command, cwd=folder, env=env, check=True,
                   stderr=None if args.verbose else subprocess.DEVNULL)
    with open(out) as handle:
        return json.load(handle)


def compare(old: dict, new: dict, stages, context: int, write=print) -> dict:
    """Print every text of `stages` that differs (each distinct change once) and return counts
    per stage: compared, changed, added, removed, distinct (changes told apart by their texts)."""
    counts = {stage: defaultdict(int) for stage in (*STAGES, "error")}
    changes: dict = defaultdict(list)  # (old text, new text) -> keys where it happens
    distinct: dict = defaultdict(set)  # stage -> its distinct (old text, new text) changes
    for key in sorted(set(old) | set(new)):
        stage = stage_of(key)
        before, after = old.get(key), new.get(key)
        if before is not None and after is not None:
            counts[stage]["compared"] += 1
        if before == after:
            continue
        counts[stage]["changed" if before is not None and after is not None else
                      "added" if before is None else "removed"] += 1
        distinct[stage].add((before, after))
        if stage in stages or stage == "error":
            changes[(before, after)].append(key)
    for (before, after), keys in changes.items():
        places = keys[0] + (f"  (and {len(keys) - 1} more: {', '.join(keys[1:6])}{', ...' if len(keys) > 6 else ''})"
                            if len(keys) > 1 else "")
        write(f"=== {stage_of(keys[0])} differs: {places}")
        diff = difflib.unified_diff((before or "").splitlines(), (after or "").splitlines(),
                                    "A/" + keys[0], "B/" + keys[0], n=context, lineterm="")
        write("\n".join(diff))
        write("")
    for stage, pairs in distinct.items():
        counts[stage]["distinct"] = len(pairs)
    return counts


def _summary(counts: dict, described: list) -> str:
    lines = [f"A = {described[0]}", f"B = {described[1]}"]
    for stage, numbers in counts.items():
        if any(numbers.values()):
            lines.append(f"{stage:8} {numbers['compared']:5} compared, {numbers['changed']} changed, "
                         f"{numbers['added']} only in B, {numbers['removed']} only in A "
                         f"({numbers['distinct']} distinct changes)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="the old revision (a commit, a branch, or . for this checkout)")
    parser.add_argument("b", help="the new revision")
    parser.add_argument("--backends", default="cpp,triton", help="comma-separated CPU backends: cpp, triton")
    parser.add_argument("--stages", default="kernel", help=f"what to print diffs of: {','.join(STAGES)} or all "
                                                           "(counts are printed for every stage)")
    parser.add_argument("--no-models", action="store_true", help="the golden programs only, no model tests")
    parser.add_argument("--context", type=int, default=3, help="lines of context in each diff")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that builds each corpus")
    parser.add_argument("--keep", action="store_true", help="keep the worktrees and corpora (printed path)")
    parser.add_argument("--verbose", action="store_true", help="show the corpus builds' progress")
    args = parser.parse_args(argv)
    stages = STAGES if args.stages == "all" else tuple(args.stages.split(","))
    scratch = tempfile.mkdtemp(prefix="kiln-kernel-diff-")
    worktrees = []
    try:
        corpora, described = [], []
        for revision in (args.a, args.b):
            folder, description = _checkout(revision, scratch)
            if folder != REPO_ROOT:
                worktrees.append(folder)
            print(f"building the corpus of {description} ...", file=sys.stderr, flush=True)
            corpora.append(build_corpus_at(folder, scratch, args))
            described.append(description)
        counts = compare(corpora[0], corpora[1], stages, args.context)
        print(_summary(counts, described))
        return 0 if not any(numbers["changed"] + numbers["added"] + numbers["removed"]
                            for numbers in counts.values()) else 1
    finally:
        if args.keep:
            print(f"kept: {scratch}", file=sys.stderr)
        else:
            for folder in worktrees:
                _git("worktree", "remove", "--force", folder)
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
