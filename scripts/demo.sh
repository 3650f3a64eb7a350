#!/usr/bin/env bash
# The main job on the default model: builds nopad, fetches all-MiniLM-L6-v2 once, and embeds a
# few sentences (one JSON array of 384 floats per line; first values shown).
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
