#!/usr/bin/env bash
# kiln's benchmarks on a GPU machine, results copied to "$OUT" (the folder sent back).
#
# Run from the repository root; every argument goes on to `python -m benchmarks.run`
# and overrides the defaults below (argparse keeps the last value given):
#
#   bash benchmarks/gpu_run.sh                                   # models x {eager, inductor, kiln} x {infer, cudagraphs}
#   bash benchmarks/gpu_run.sh --only bert,gpt2,llama            # a subset of the models
#   bash benchmarks/gpu_run.sh --modes train --label models-train
#   bash benchmarks/gpu_run.sh --suite kernels --modes infer,cudagraphs --label kernels
#   bash benchmarks/gpu_run.sh --kiln-backend aot_eager          # bisect: kiln's capture without its codegen
#
# Defaults: suite models, modes infer,cudagraphs, a 530 s budget for the whole run (cases that
# would start later are recorded as skipped, so the command ends inside a 10-minute limit),
# 240 s per case. Each case runs in its own process with cold compile caches.
# $OUT receives 4 files: gpu.txt (nvidia-smi), <stem>.md, <stem>.json, <stem>.log(.gz); they are
# also kept under benchmarks/results/. Without $OUT they go to benchmarks/results/out/.
# Set KILN_GIT_COMMIT to the commit being measured when the checkout has no .git folder.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-benchmarks/results/out}"
mkdir -p "$OUT_DIR"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv \
    > "$OUT_DIR/gpu.txt" 2>&1 || echo "nvidia-smi failed" >> "$OUT_DIR/gpu.txt"
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_run.sh: $PYTHON's torch sees no CUDA device; set PYTHON to an interpreter with a CUDA torch" >&2
    exit 1
fi
if [ -z "${KILN_GIT_COMMIT:-}" ] && ! git rev-parse HEAD >/dev/null 2>&1; then
    echo "gpu_run.sh: no git checkout here and KILN_GIT_COMMIT unset: results will say 'kiln commit: unknown'" >&2
fi
"$PYTHON" - <<'PY'
import importlib.metadata as md, platform, torch
names = ("triton", "transformers", "timm", "torchvision")
found = ", ".join(f"{n} {md.version(n)}" for n in names if __import__("importlib").util.find_spec(n))
print(f"gpu_run.sh: python {platform.python_version()}, torch {torch.__version__}, {found}; "
      f"{torch.cuda.get_device_name(0)}", flush=True)
PY

"$PYTHON" -m benchmarks.run --suite models --modes infer,cudagraphs --budget 530 --timeout 240 \
    --copy-to "$OUT_DIR" "$@"
status=$?

for log in "$OUT_DIR"/*.log; do
    [ -f "$log" ] && [ "$(stat -c %s "$log")" -gt 4000000 ] && gzip -f "$log"
done
ls -la "$OUT_DIR"
exit "$status"
