#!/usr/bin/env bash
# The two jobs on the default models: builds nopad, then
#   1. fetches all-MiniLM-L6-v2 once and embeds a few sentences (one JSON array of 384 floats per
#      line; first values shown);
#   2. fetches SmolLM2-135M-Instruct (Q4_1 GGUF) once and answers a question, the answer streamed
#      as it is generated (greedy, on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target nopad_cli >/dev/null

MODEL=$(scripts/fetch_default_model.sh)
build/nopad info --model "$MODEL"
printf '%s\n' \
    "nopad runs BERT-family encoders without padding." \
    "A batch is one packed stream of tokens." \
    "Le modèle comprend aussi le français." \
    "埋め込みベクトルを計算します。" \
  | build/nopad embed --model "$MODEL" --output build/demo_embeddings.jsonl
echo "wrote build/demo_embeddings.jsonl:"
cut -c1-100 build/demo_embeddings.jsonl | sed 's/$/ .../'

GGUF=$(scripts/fetch_default_decoder.sh)
QUESTION="What is the capital of France?"
echo
echo "SmolLM2-135M-Instruct ($GGUF)"
echo "Q: $QUESTION"
printf 'A: '
# SmolLM2's chat template, written out: nopad generate takes the prompt as it is
build/nopad generate --model "$GGUF" --max-tokens 64 \
    --prompt "<|im_start|>user"$'\n'"$QUESTION<|im_end|>"$'\n'"<|im_start|>assistant"$'\n'
