#!/usr/bin/env bash
# Every encoder family embeds from text on both backends (issue 25's "done means"): for each text
# fixture (a tiny model with its parity tokenizer: tests/data/models/*_text and the classifier
# folders of scripts/make_deberta_fixtures.py), `nopad embed --pooling none` on the CPU (fp32) and
# on CUDA (fp16), the same sentences; prints the max row-relative difference of the token states
# (bound 5e-3, fp16's, as the CUDA encoder tests) and `nopad classify` on CUDA beside the CPU's for
# the classifier folders. Usage (GPU machine): scripts/gpu_text_families.sh NOPAD_BINARY OUT_DIR
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NOPAD=${1:?nopad binary}
OUT=${2:?out dir}
M="$ROOT/tests/data/models"
T="$ROOT/tests/data/tokenizer/parity"
W=$(mktemp -d)
mkdir -p "$OUT"
status=0
printf 'The quick brown fox jumps over the lazy dog.\nnopad packs tokens, no padding!\nA\n' > "$W/lines.txt"
for spec in bert_cls:wordpiece_bert.json deberta_v3_a:unigram_debertav3.json xlmr_rerank:unigram_xlmr.json \
            albert_text: roberta_text: xlmr_text:; do
    name=${spec%%:*} tok=${spec#*:}
    dir="$W/$name"
    mkdir -p "$dir"
    cp "$M/$name"/* "$dir/"
    [ -n "$tok" ] && cp "$T/$tok" "$dir/tokenizer.json"
    for dev in cpu cuda; do
        "$NOPAD" embed --model "$dir" --device "$dev" --pooling none --input "$W/lines.txt" \
            --output "$W/$name.$dev.npy" 2> "$W/$name.$dev.err" || { echo "$name $dev: $(cat "$W/$name.$dev.err")"; status=1; }
    done
    python3 - "$W/$name.cpu.npy" "$W/$name.cuda.npy" "$name" <<'PY' || status=1
import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
err = float(np.max(np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1)))
print(f"{sys.argv[3]:<14} {a.shape[0]:4d} tokens x {a.shape[1]}: cuda fp16 against cpu fp32, max row-relative {err:.2e} (bound 5e-3)")
sys.exit(0 if err <= 5e-3 else 1)
PY
    if grep -q ForSequenceClassification "$dir/config.json"; then
        for dev in cpu cuda; do
            "$NOPAD" classify --model "$dir" --device "$dev" --input "$W/lines.txt" > "$OUT/${name}_classify_$dev.jsonl" 2>&1 || status=1
        done
        echo "  classify cpu:  $(head -1 "$OUT/${name}_classify_cpu.jsonl")"
        echo "  classify cuda: $(head -1 "$OUT/${name}_classify_cuda.jsonl")"
    fi
done
rm -rf "$W"
exit $status
