#!/usr/bin/env bash
# kiln's frontend on another Python (the GPU machine's 3.12): its tests, then the models through it.
#
#   bash scripts/frontend_py312_check.sh            # results in $OUT (or /tmp/frontend_check)
#   PYTHON=python3.12 bash scripts/frontend_py312_check.sh
#
# Runs, with $PYTHON (default python3) and no network:
#   1. versions: python, torch, transformers, triton;
#   2. pytest tests/frontend (bytecode round trip over the stdlib and transformers, the
#      150+ program corpus, dispatcher, models captured with aot_eager);
#   3. pytest tests/models with KILN_FRONTEND=kiln (the full kiln backend, strict mode, Triton
#      kernels under the interpreter on CPU tensors, as CI runs them);
#   4. for each model test: captures / graphs / eager frames / recompiles of kiln's frontend.
# Writes versions.txt, frontend_tests.log, models.log, captures.log and summary.txt to $OUT.
# pytest missing? Carry its wheels in .whl (see /work/.library/device/README.md); they are
# installed into /tmp/site when .whl exists. Exit status: non-zero if any step failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-/tmp/frontend_check}"
mkdir -p "$OUT_DIR"

if [ -d .whl ] && ! "$PYTHON" -c "import pytest" >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

"$PYTHON" - <<'PY' 2>&1 | tee "$OUT_DIR/versions.txt"
import importlib.metadata as md, platform, sys
print("python", sys.version.replace("\n", " "))
for name in ("torch", "transformers", "triton", "pytest"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "MISSING")
print("machine", platform.platform(), platform.processor())
PY

"$PYTHON" -m pytest -q -p no:cacheprovider tests/frontend 2>&1 | tee "$OUT_DIR/frontend_tests.log"
frontend_status=${PIPESTATUS[0]}

KILN_FRONTEND=kiln "$PYTHON" -m pytest -q -p no:cacheprovider tests/models 2>&1 | tee "$OUT_DIR/models.log"
models_status=${PIPESTATUS[0]}

KILN_FRONTEND=kiln "$PYTHON" - <<'PY' 2>&1 | tee "$OUT_DIR/captures.log"
# Each model test once more, counting what kiln's frontend did: a passing test that ran
# eagerly would prove nothing, so every test must show one capture, one graph, no eager frame.
import random
import sys
import traceback

import torch

import kiln
import tests.models.test_models as model_tests
from kiln.frontend import stats

failed = 0
for name in sorted(n for n in dir(model_tests) if n.startswith("test_")):
    kiln.reset()
    random.seed(0)
    torch.manual_seed(0)  # the same random state as under pytest (tests/conftest.py)
    before = (stats.captures, stats.graphs, stats.eager_frames, stats.recompiles)
    try:
        with kiln.config.patch(strict=True):
            getattr(model_tests, name)()
        outcome = "passed"
    except Exception:
        outcome = "FAILED\n" + traceback.format_exc(limit=3)
    captures, graphs, eager, recompiles = (a - b for a, b in zip(
        (stats.captures, stats.graphs, stats.eager_frames, stats.recompiles), before))
    ok = outcome == "passed" and graphs == 1 and eager == 0
    failed += not ok
    print(f"{name}: captures={captures} graphs={graphs} eager_frames={eager} recompiles={recompiles} {outcome}")
sys.exit(1 if failed else 0)
PY
captures_status=${PIPESTATUS[0]}

{
    echo "tests/frontend: exit $frontend_status ($(tail -n 1 "$OUT_DIR/frontend_tests.log"))"
    echo "tests/models with KILN_FRONTEND=kiln: exit $models_status ($(tail -n 1 "$OUT_DIR/models.log"))"
    echo "captures check: exit $captures_status"
} | tee "$OUT_DIR/summary.txt"
[ "$frontend_status" -eq 0 ] && [ "$models_status" -eq 0 ] && [ "$captures_status" -eq 0 ]
