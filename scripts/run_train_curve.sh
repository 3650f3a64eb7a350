#!/usr/bin/env bash
# The MLM training curve of nopad against Hugging Face (issue 24; docs/training.md): a small BERT
# with all-MiniLM-L6-v2's vocabulary (scripts/make_train_curve_model.py) trained 300 steps on the
# licence texts of Debian's base-files, by nopad on the CPU, then by HF BertForMaskedLM on the very
# batches nopad logged (scripts/train_curve_hf.py). Needs torch and transformers; about 5 minutes
# of nopad and 5 of HF on 2 free cores.
#
#   scripts/run_train_curve.sh [STEPS] [WORK_DIR]      (defaults 300, /tmp/nopad_train_curve)
#
# Writes bench/results/train_curve_<date>.json (both curves, every step) and, for 300 steps,
# tests/data/train/curve_hf.json (HF's curve, the flags and the inputs' SHA-256: what
# tests/cli_train_curve.sh checks the first steps of nopad's curve against in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-300}
WORK=${2:-/tmp/nopad_train_curve}
NOPAD=${NOPAD_CLI:-build/nopad}
MINILM=${NOPAD_MINILM_DIR:-$(scripts/fetch_default_model.sh)}
export OMP_WAIT_POLICY=PASSIVE
# The run's flags (also recorded in the fixture, which the CI test reads them from): AdamW at
# 1e-3 with 30 warmup steps and a linear decay over the 3 epochs' 318 steps, batches of at most
# 32 lines and 1024 tokens, 15% masking from seed 42, clipping at 1.
FLAGS=(--task mlm --epochs 3 --lr 1e-3 --warmup 30 --batch-tokens 1024 --batch-seqs 32 --seed 42
       --max-grad-norm 1 --weight-decay 0.01 --threads 2)
mkdir -p "$WORK"
python3 scripts/make_train_curve_model.py "$MINILM" "$WORK" >"$WORK/inputs.json"
"$NOPAD" train --model "$WORK/model" --data "$WORK/corpus.txt" --output "$WORK/nopad" "${FLAGS[@]}" \
    --stop-after "$STEPS" --log "$WORK/nopad.jsonl" --log-batches
FIXTURE=()
[ "$STEPS" = 300 ] && FIXTURE=(--fixture tests/data/train/curve_hf.json)
python3 scripts/train_curve_hf.py --model "$WORK/model" --log "$WORK/nopad.jsonl" \
    --state "$WORK/nopad/trainer_state.json" --inputs "$WORK/inputs.json" --flags "${FLAGS[*]}" \
    --out "bench/results/train_curve_$(date -u +%F).json" "${FIXTURE[@]}"
