#!/usr/bin/env bash
# One device call that re-verifies kiln on a GPU after CPU-only changes, inside 10 minutes:
#   1. benchmarks/gpu_smoke.py   (fused kernels vs eager, fp32 and bf16), with kiln's fast launcher
#      off (the default) and on, then benchmarks/launch_overhead.py (its speed effect)
#   2. the six models, inference: eager, torch.compile, kiln (benchmarks/gpu_run.sh, 400 s budget)
# Everything lands in $OUT as few files (the device tool returns a limited number): smoke.txt,
# and gpu_run.sh's gpu.txt + <stem>.md/.json/.log. Pass KILN_GIT_COMMIT=<sha> when the checkout has no .git.
#
#   bash benchmarks/gpu_check_all.sh [extra arguments for benchmarks.run, e.g. --label models-run6]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT_DIR="${OUT:-benchmarks/results/out}"
mkdir -p "$OUT_DIR"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install -e . --no-deps -q >/dev/null 2>&1 || true
for fast in 0 1; do
    echo "== KILN_FAST_LAUNCH=$fast" >> "$OUT_DIR/smoke.txt"
    KILN_FAST_LAUNCH=$fast timeout 180 "$PYTHON" -m benchmarks.gpu_smoke >> "$OUT_DIR/smoke.txt" 2>&1
    echo "gpu_smoke.py (KILN_FAST_LAUNCH=$fast) exit $?" | tee -a "$OUT_DIR/smoke.txt"
done
timeout 60 "$PYTHON" -m benchmarks.launch_overhead >> "$OUT_DIR/smoke.txt" 2>&1
tail -1 "$OUT_DIR/smoke.txt"
bash benchmarks/gpu_run.sh --modes infer --budget 400 --timeout 120 "$@"
