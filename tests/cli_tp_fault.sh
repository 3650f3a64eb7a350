#!/usr/bin/env bash
# A split model whose rank 1 dies in the middle of work must not leave rank 0 hanging: `mpirun -np 2
# nopad generate --tp 2` over many prompts, rank 1 killed (SIGKILL) once generation runs; the job
# must end within 60 s with a non-zero status and a message naming the dead rank. (The
# communicator's own fault test, cli_comm_fault.sh, kills a rank inside a bare all-reduce; this one
# kills it between and inside the steps rank 0 announces.) Skipped without mpirun.
set -uo pipefail
: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
MPIRUN="${NOPAD_MPIRUN:-$(command -v mpirun || true)}"
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun"
    exit 0
fi
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
OMP_NUM_THREADS=1 timeout 90 "$MPIRUN" --allow-run-as-root --oversubscribe --bind-to none -np 2 \
    "$NOPAD_CLI" generate --model "$DEC" --input "$TMP/prompts.txt" --max-tokens 100 --ignore-eos \
    --batch 4 --threads 1 --tp 2 >"$TMP/out.txt" 2>"$TMP/err.txt" &
JOB=$!
# rank 1: the process whose environment says OMPI_COMM_WORLD_RANK=1, once rank 0 has written text
rank1=""
for _ in $(seq 1 300); do
    if [ -s "$TMP/out.txt" ]; then
        for p in $(pgrep -f "$NOPAD_CLI generate --model $DEC"); do
            tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && rank1=$p
        done
        [ -n "$rank1" ] && break
    fi
    kill -0 "$JOB" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$rank1" ]; then
    echo "FAIL: rank 1 was not found running (or rank 0 wrote nothing): $(tail -5 "$TMP/err.txt")"
    exit 1
fi
killed=$(date +%s%N)
kill -KILL "$rank1"
wait "$JOB"
status=$?
JOB=""
ms=$((($(date +%s%N) - killed) / 1000000))
echo "cli_tp_fault: rank 1 killed $(((killed - start) / 1000000)) ms into the run; the job ended $ms ms later with status $status"
fail=0
if [ "$status" -eq 0 ]; then
    echo "FAIL: the job returned 0 although rank 1 died"; fail=1
elif [ "$status" -eq 124 ] || [ "$ms" -ge 60000 ]; then
    echo "FAIL: the job took $ms ms to end after rank 1 died (bound: 60 s; 124: killed by timeout)"; fail=1
fi
# Open MPI: "mpirun noticed that process rank 1 with PID ... exited on signal 9 (Killed)."
if ! tr '\n' ' ' <"$TMP/err.txt" | grep -Eq "rank 1 .*signal 9"; then
    echo "FAIL: the message does not name the dead rank:"; sed 's/^/  | /' "$TMP/err.txt"; fail=1
fi
[ "$fail" -eq 0 ] && echo "ok   rank 1 killed mid-generation: the job ended in $ms ms, naming rank 1"
exit $fail
