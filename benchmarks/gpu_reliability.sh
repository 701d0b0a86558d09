#!/usr/bin/env bash
# One device call for issue 11 (reliability) on a GPU: kiln's fused kernels against eager
# (benchmarks/gpu_smoke.py), the gather bounds rule on CUDA (benchmarks/gpu_index_check.py),
# then the differential fuzzer on CUDA tensors through Triton for what is left of the budget.
#
#   bash benchmarks/gpu_reliability.sh [FUZZ_SEED] [FUZZ_BUDGET_S] [FUZZ_JOBS]
#
# Files in $OUT (at most 8 come back): versions.txt, smoke.txt, index.txt, fuzz_cuda.{json,md,log.gz}.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-benchmarks/results/out}"
SEED="${1:-101}"
BUDGET="${2:-300}"
JOBS="${3:-12}"
mkdir -p "$OUT_DIR"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; git rev-parse HEAD 2>/dev/null || echo "${KILN_GIT_COMMIT:-unknown}";
  "$PYTHON" -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"; } > "$OUT_DIR/versions.txt" 2>&1
timeout 200 "$PYTHON" -m benchmarks.gpu_smoke > "$OUT_DIR/smoke.txt" 2>&1; echo "gpu_smoke exit $?" | tee -a "$OUT_DIR/smoke.txt"
timeout 120 "$PYTHON" -m benchmarks.gpu_index_check > "$OUT_DIR/index.txt" 2>&1; echo "gpu_index_check exit $?" | tee -a "$OUT_DIR/index.txt"
tail -3 "$OUT_DIR/smoke.txt" "$OUT_DIR/index.txt"
timeout $((BUDGET + 150)) "$PYTHON" -m tests.fuzz --device cuda --programs 5000 --seed "$SEED" --jobs "$JOBS" \
    --budget "$BUDGET" --out "$OUT_DIR/fuzz_cuda.json" 2>&1 | grep -v "^\[" | tail -40
gzip -f "$OUT_DIR/fuzz_cuda.log" 2>/dev/null
ls -la "$OUT_DIR"
