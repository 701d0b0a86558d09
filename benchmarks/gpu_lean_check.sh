#!/usr/bin/env bash
# The end-of-session GPU check in the least device time (2026-12-06: ~300 s of wall left after refused starts),
# in order of priority, each part's output in $OUT as it finishes (a call cut off by the lease keeps what ran):
#   1. correctness, in parallel: gpu_smoke (CUDA graphs in an out = model(x) loop included) and gpu_capture_check
#      (GPT-2 and Llama captured whole);
#   2. the six TARGETS models, eager and kiln, one process per case ($MODELS_BUDGET s, default 190);
#   3. the TARGETS kernels, eager and kiln ($KERNELS_BUDGET s, default 30; 45 s per case: a 65536x4096 bf16
#      case took 30-31 s in its process on an H100 at 0f22607, past the 25 s limit it had);
#   4. BERT's cold first call with kiln's compile worker processes on, then off (config.compile_processes;
#      FIRST_CALL_PROCESSES="1" for the default only).
#   CHECKS=0 skips step 1 (a second call at the same commit, on the same machine).
#   MODELS_BACKENDS=eager,kiln,inductor adds torch.compile to step 2 (default eager,kiln); KERNELS_ONLY and
#   KERNELS_BACKENDS the same for step 3 (default copy,gelu_bias,layer_norm,softmax; eager,kiln).
#   AB_MODELS=bert,resnet18: those models again with kiln's default-mode CUDA graphs off, after step 2
#   (AB_ENV=KILN_CUDA_GRAPH_TAIL_MIN_BYTES=16777216: under that setting instead; it names the files).
#   MODELS_ONLY=bert,resnet18 limits step 2 to those models; MODELS_BUDGET=0 skips step 2 (a separate call measures eager, torch.compile and kiln), KERNELS_BUDGET=0 step 3.
#   WARM_MODELS=llama: after step 4, cold and warm first calls of those models (benchmarks.warm_start, KILN_LOGS=perf:
#   why a warm start traced a graph again, and the diff of the two processes' keys where one found no link).
#   RO_MODELS=bert,resnet18: then those models under mode="reduce-overhead", kiln and torch.compile ($RO_BUDGET s, 90).
#   TRAIN_MODELS=bert,llama,resnet50,vit: then training (forward + backward, dropout on) of those models, eager,
#   torch.compile and kiln ($TRAIN_BACKENDS, default eager,inductor,kiln; $TRAIN_BUDGET s, 240; TRAIN_MODES=train,
#   train-cudagraphs adds mode="reduce-overhead").
#   TRAIN_VARIANT_MODELS=resnet50: then kiln's training of those models under $TRAIN_VARIANT (default
#   KILN_CONV_LAYOUT_TRAINING=1: channels-last training convolutions, last measured at 3786325, slower then).
#   PROFILE_MODELS=bert,llama: then benchmarks.profile of those models, kiln and torch.compile (launches, host ms,
#   GPU kernel ms, wall ms, memory: issue 14's table; $PROFILE_BUDGET s, 200). PROFILE_MODES=train (default infer),
#   PROFILE_BACKENDS=kiln (default kiln,inductor), PROFILE_ENV="KILN_CONV_LAYOUT_TRAINING=1" (a setting, named in the
#   files): ResNet-50 training's profile with channels-last convolutions, issue 16.
#   STAGE_MODELS=resnet50,vit,llama: then each model's cold first call, one process each, with kiln's steps timed
#   (benchmarks.first_call_compiles --stages), once per setting in $STAGE_VARIANTS (default: the defaults, then
#   KILN_COMPILE_OVERLAP=0, then KILN_COMPILE_GC_FREEZE=0): what each compile-time change gives, on one machine.
#   REPEAT_MODELS=resnet50: those models' kiln inference in REPEAT_RUNS (4) new processes each, no accuracy check, their
#   kiln warnings printed, each with empty Triton and kiln caches (ResNet-50 ran eagerly in one process of three at
#   05ad837: a launcher of another signature, read off a module object two compile threads' loads shared).
#   OUTER_PROBE=1: then benchmarks.outer_reduction_probe (GPU kernel us of kiln's channels-last batch-norm statistics
#   per kiln setting in $OUTER_PROBE_SETTINGS (its --settings; default: the defaults, 4096 split programs,
#   uncompensated welford, both), against eager and a copy).
#   DROPOUT_CHECK=1: benchmarks.gpu_dropout_check beside step 1 (correctness only: it shares the GPU with the smoke).
#   LAUNCHER_CHECK=1: benchmarks.gpu_launcher_check beside step 1 (CPU only, seconds: threads loading Triton launchers
#   at once, through Python's loader and kiln's: how many got another launcher).
#   KILN_GIT_COMMIT=<sha> bash benchmarks/gpu_lean_check.sh (exported to every step: the device's .git may be stale)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-benchmarks/results/out}"
mkdir -p "$OUT_DIR"
commit="${KILN_GIT_COMMIT:-unknown}"
export KILN_GIT_COMMIT="$commit"
if [ -n "${DROPOUT_CHECK:-}" ]; then
    { timeout 150 "$PYTHON" -m benchmarks.gpu_dropout_check 2>&1 | grep -v "Warn"; } > "$OUT_DIR/dropout.txt" 2>&1 &
fi
if [ -n "${LAUNCHER_CHECK:-}" ]; then
    { timeout 200 "$PYTHON" -m benchmarks.gpu_launcher_check 2>&1; echo "gpu_launcher_check exit $?"; } \
        > "$OUT_DIR/launcher.txt" 2>&1 &
fi
if [ "${CHECKS:-1}" != 0 ]; then
    { timeout 200 "$PYTHON" -m benchmarks.gpu_smoke 2>&1 | grep -v "Warn\|runners = "
      echo "gpu_smoke exit ${PIPESTATUS[0]}"; } > "$OUT_DIR/smoke.txt" 2>&1 &
    { timeout 200 "$PYTHON" -m benchmarks.gpu_capture_check 2>&1 | grep -v "Warning"
      echo "gpu_capture_check exit ${PIPESTATUS[0]}"; } > "$OUT_DIR/capture.txt" 2>&1 &
    wait
    [ -z "${LAUNCHER_CHECK:-}" ] || cat "$OUT_DIR/launcher.txt"
    tail -4 "$OUT_DIR/smoke.txt"; grep "FAILED\|ERROR\|MISMATCH" "$OUT_DIR/smoke.txt" | cut -c1-300 | head -14
    tail -8 "$OUT_DIR/capture.txt"
fi
[ "${MODELS_BUDGET:-190}" = 0 ] || \
"$PYTHON" -m benchmarks.run --suite models ${MODELS_ONLY:+--only "$MODELS_ONLY"} --modes infer \
    --backends "${MODELS_BACKENDS:-eager,kiln}" \
    --budget "${MODELS_BUDGET:-190}" \
    --timeout 60 --label "models-$commit" --copy-to "$OUT_DIR" 2>&1 | grep --line-buffered "^\[\|^| " \
    | tee "$OUT_DIR/models.txt"
if [ -n "${AB_MODELS:-}" ]; then  # the default mode's CUDA graphs off, beside the run above (same machine)
    ab_env="${AB_ENV:-KILN_DEFAULT_CUDA_GRAPHS=0}"
    env "$ab_env" "$PYTHON" -m benchmarks.run --suite models --only "$AB_MODELS" --modes infer \
        --backends kiln --budget "${AB_BUDGET:-90}" --timeout 60 \
        --label "models-$(echo "$ab_env" | tr 'A-Z=_' 'a-z--')-$commit" \
        --copy-to "$OUT_DIR" 2>&1 | grep --line-buffered "^\[\|^| " | tee "$OUT_DIR/models_ab.txt"
fi
[ "${KERNELS_BUDGET:-30}" = 0 ] || \
"$PYTHON" -m benchmarks.run --suite kernels --modes infer --backends "${KERNELS_BACKENDS:-eager,kiln}" \
    --only "${KERNELS_ONLY:-copy,gelu_bias,layer_norm,softmax}" \
    --budget "${KERNELS_BUDGET:-30}" --timeout 45 --label "kernels-$commit" 2>&1 | grep --line-buffered "^| " \
    | tee "$OUT_DIR/kernels.txt"
for processes in ${FIRST_CALL_PROCESSES:-1 0}; do
    echo "== BERT cold first call, KILN_COMPILE_PROCESSES=$processes"
    KILN_COMPILE_PROCESSES=$processes timeout 60 "$PYTHON" -m benchmarks.first_call_compiles --only bert --profile 0 \
        2>&1 | grep -v "Warn" | cut -c1-160 | head -8
done | tee "$OUT_DIR/first_call.txt"
if [ -n "${WARM_MODELS:-}" ]; then
    timeout 120 "$PYTHON" -m benchmarks.warm_start --only "$WARM_MODELS" --timeout 50 --label "warm-start-$commit" \
        --out "$OUT_DIR" 2>&1 | grep "^| \|^- [a-z0-9]*, kiln" | cut -c1-300
fi
if [ -n "${RO_MODELS:-}" ]; then
    "$PYTHON" -m benchmarks.run --suite models --only "$RO_MODELS" --modes cudagraphs --backends kiln,inductor \
        --budget "${RO_BUDGET:-90}" --timeout 60 --label "ro-$commit" --copy-to "$OUT_DIR" 2>&1 | grep "^\[\|^| "
fi
if [ -n "${TRAIN_MODELS:-}" ]; then
    "$PYTHON" -m benchmarks.run --suite models --only "$TRAIN_MODELS" --modes "${TRAIN_MODES:-train}" \
        --backends "${TRAIN_BACKENDS:-eager,inductor,kiln}" --budget "${TRAIN_BUDGET:-240}" --timeout 90 \
        --label "train-$commit" --copy-to "$OUT_DIR" 2>&1 | grep "^\[\|^| "
fi
if [ -n "${TRAIN_VARIANT_MODELS:-}" ]; then  # kiln's training again under a setting, e.g. channels-last convs
    env ${TRAIN_VARIANT:-KILN_CONV_LAYOUT_TRAINING=1} "$PYTHON" -m benchmarks.run --suite models \
        --only "$TRAIN_VARIANT_MODELS" --modes train --backends kiln --budget "${TRAIN_VARIANT_BUDGET:-120}" \
        --timeout 90 --label "train-variant-$commit" --copy-to "$OUT_DIR" 2>&1 | grep "^\[\|^| "
fi
if [ -n "${STAGE_MODELS:-}" ]; then
    for model in ${STAGE_MODELS//,/ }; do
        for variant in ${STAGE_VARIANTS:-STAGE_DEFAULTS=1 KILN_COMPILE_OVERLAP=0 KILN_COMPILE_GC_FREEZE=0}; do
            echo "-- $model $variant"
            env "$variant" KILN_LOGS=perf timeout 60 "$PYTHON" -m benchmarks.first_call_compiles --only "$model" \
                --profile 0 --stages 2>&1 | grep "^==\|^   \|AOTAutograd traces" | cut -c1-700
        done
    done | tee "$OUT_DIR/stages.txt"
fi
if [ -n "${REPEAT_MODELS:-}" ]; then  # an intermittent failure: each model's kiln case in $REPEAT_RUNS new processes
    for run in $(seq "${REPEAT_RUNS:-4}"); do  # cold each time, as when it failed
        cold=$(mktemp -d)
        TRITON_CACHE_DIR="$cold/triton" KILN_CACHE_DIR="$cold/kiln" "$PYTHON" -m benchmarks.run --suite models --only "$REPEAT_MODELS" --modes infer --backends kiln --no-check \
            --budget 300 --timeout 60 --label "repeat-$run-$commit" 2>&1 | grep "^\[\|kiln warning\|runs eagerly" \
            | cut -c1-900
        rm -rf "$cold"
    done | tee "$OUT_DIR/repeat.txt"
fi
if [ -n "${OUTER_PROBE:-}" ]; then  # kiln's channels-last batch-norm statistics per split_outer_target_programs
    timeout "${OUTER_PROBE_BUDGET:-150}" "$PYTHON" -m benchmarks.outer_reduction_probe \
        ${OUTER_PROBE_SETTINGS:+--settings "$OUTER_PROBE_SETTINGS"} --out "$OUT_DIR" 2>&1 | grep -v "Warn" | tail -14
fi
if [ -n "${PROFILE_MODELS:-}" ]; then
    tag="${PROFILE_ENV:+-$(echo "$PROFILE_ENV" | tr -c 'A-Za-z0-9\n' _)}"  # the setting, in the files' names
    env ${PROFILE_ENV:-} timeout "${PROFILE_BUDGET:-200}" "$PYTHON" -m benchmarks.profile \
        --only "$PROFILE_MODELS" --backends "${PROFILE_BACKENDS:-kiln,inductor}" --modes "${PROFILE_MODES:-infer}" \
        ${tag:+--tag="$tag"} --out "$OUT_DIR/profile" 2>&1 | tail -4
    for summary in "$OUT_DIR"/profile/profile_summary*.md; do
        [ -f "$summary" ] && cp "$summary" "$OUT_DIR/profile-$commit$(basename "$summary" .md | sed 's/^profile_summary//').md"
    done
    cat "$OUT_DIR"/profile/profile_*_*.txt > "$OUT_DIR/profile-cases-$commit$tag.txt" 2>/dev/null  # top kernels per case
    rm -rf "$OUT_DIR/profile"
fi
[ -f "$OUT_DIR/dropout.txt" ] && cat "$OUT_DIR/dropout.txt"
grep -q "first call" "$OUT_DIR/first_call.txt" 2>/dev/null || rm -f "$OUT_DIR/first_call.txt"
for json in "$OUT_DIR"/*ro-"$commit"*.json "$OUT_DIR"/*train-"$commit"*.json; do  # CUDA graphs' counts per case
    [ -f "$json" ] && "$PYTHON" -c "import json, sys
data = json.load(open(sys.argv[1]))
for case in data['cases']:
    if 'cuda_graph_replays' in case:
        print('CUDA graphs:', case.get('workload'), case.get('backend'), case.get('mode'), 'replays',
              case['cuda_graph_replays'], 'plain calls', case.get('cuda_graph_plain_calls'), 'off',
              case.get('cuda_graphs_off'))" "$json"
done
rm -f "$OUT_DIR"/*ro-"$commit"*.json "$OUT_DIR"/*train-"$commit"*.json  # tables in the .md: 8 files come back
rm -f "$OUT_DIR"/*.log "$OUT_DIR/models.txt" "$OUT_DIR/models_ab.txt"  # the tables are in the .md files (8 files come back)
