#!/usr/bin/env bash
# A diagnosis call on the GPU machine (issue 14's per-model table, issue 13's generate() and issue
# 17's fresh-install verify), one device call of under 10 minutes:
#
#   KILN_GIT_COMMIT=<sha> bash benchmarks/gpu_diagnose.sh [models] [modes]
#
# 1. benchmarks.profile, one process per model x backend x mode (default bert,gpt2,llama x
#    kiln,inductor x infer,cudagraphs): device ms, host ms, launches, peak allocated and reserved
#    GiB, first call, top kernels. BERT's kiln kernels and wrappers are kept (KILN_DEBUG).
# 2. greedy generate() tokens/s, eager / torch.compile / kiln (GENERATE=0 leaves it out).
# 3. `pip install .` (non-editable, no network) into a fresh venv, then `kiln verify` from /tmp.
# Everything lands in $OUT as at most 8 files.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-benchmarks/results/out}"
mkdir -p "$OUT_DIR/profiles"
commit="${KILN_GIT_COMMIT:-unknown}"
models="${1:-bert,gpt2,llama}"
modes="${2:-infer,cudagraphs}"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$PYTHON" -c "import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__)"
    echo "kiln $commit, $(date -u +%F)"
} > "$OUT_DIR/diagnose.txt" 2>&1
for model in ${models//,/ }; do
    for mode in ${modes//,/ }; do
        for backend in kiln inductor; do
            debug=()
            if [ "$model" = bert ] && [ "$backend" = kiln ] && [ "$mode" = infer ]; then
                debug=(env KILN_DEBUG=1 KILN_DEBUG_DIR=/tmp/kiln_debug_bert)
            fi
            "${debug[@]}" timeout 150 "$PYTHON" -m benchmarks.profile --only "$model" --backends "$backend" \
                --modes "$mode" --out "$OUT_DIR/profiles" 2>&1 | grep "^| $model" >> "$OUT_DIR/diagnose.txt"
        done
    done
done
tar czf "$OUT_DIR/profiles.tgz" -C "$OUT_DIR" profiles && rm -rf "$OUT_DIR/profiles"
[ -d /tmp/kiln_debug_bert ] && tar czf "$OUT_DIR/kiln_debug_bert.tgz" -C /tmp kiln_debug_bert
if [ "${GENERATE:-1}" != 0 ]; then
    timeout 300 "$PYTHON" -m benchmarks.generate --repeats 3 --out "$OUT_DIR" --label "generate-$commit" 2>&1 \
        | tail -12 >> "$OUT_DIR/diagnose.txt"
fi
{
    echo "## fresh non-editable install, then kiln verify"
    "$PYTHON" -m venv --system-site-packages /tmp/fresh && \
        /tmp/fresh/bin/pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3 && \
        (cd /tmp && /tmp/fresh/bin/kiln verify; echo "kiln verify exit $?")
} >> "$OUT_DIR/diagnose.txt" 2>&1
cat "$OUT_DIR/diagnose.txt"
