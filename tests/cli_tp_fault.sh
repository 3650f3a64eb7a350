#!/usr/bin/env bash
# A split model whose rank 1 dies in the middle of work must not leave rank 0 hanging: `mpirun -np 2
# nopad generate --tp 2` over many prompts, rank 1 killed (SIGKILL) once generation runs; the job
# must end within 60 s with a non-zero status and a message naming the dead rank. (The
# communicator's own fault test, cli_comm_fault.sh, kills a rank inside a bare all-reduce; this one
# kills it between and inside the steps rank 0 announces.) Skipped without mpirun.
set -uo pipefail
source "$(dirname "$0")/mpi_lib.sh"
TMP="$(mktemp -d)"
trap 'kill -KILL ${JOB:-} 2>/dev/null; rm -rf "$TMP"' EXIT
# a tiny LLaMA (8 query heads, 2 key/value heads) with a byte-level BPE tokenizer
DEC="$TMP/tiny_llama"
mkdir -p "$DEC"
cp "$NOPAD_TEST_DATA"/models/llama_gqa/{config.json,model.safetensors} "$DEC/"
cp "$NOPAD_TEST_DATA/tokenizer/bpe_gpt2.json" "$DEC/tokenizer.json"
# enough work that rank 1 dies mid-generation: 400 prompts, 100 tokens each, 4 at a time
for i in $(seq 1 400); do echo "ab"; done >"$TMP/prompts.txt" # ids under 307 only
start=$(date +%s%N)
OMP_NUM_THREADS=1 timeout 90 "${MPI[@]}" -np 2 \
    "$NOPAD_CLI" generate --model "$DEC" --input "$TMP/prompts.txt" --max-tokens 100 --ignore-eos \
    --batch 4 --threads 1 --tp 2 >"$TMP/out.txt" 2>"$TMP/err.txt" &
JOB=$!
# rank 1 (OMPI_COMM_WORLD_RANK=1), killed once rank 0 has written text
if ! kill_rank1 "$JOB" "$NOPAD_CLI generate --model $DEC" "$TMP/out.txt"; then
    echo "FAIL: rank 1 was not found running (or rank 0 wrote nothing): $(tail -5 "$TMP/err.txt")"
    exit 1
fi
wait "$JOB"
status=$?
JOB=""
fail=0
check_job_ended cli_tp_fault "$status" "$start" "$TMP/err.txt" || fail=1
[ "$fail" -eq 0 ] && echo "ok   rank 1 killed mid-generation: the job ended in $ENDED_MS ms, naming rank 1"
exit $fail
