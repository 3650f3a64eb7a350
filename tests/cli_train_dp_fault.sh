#!/usr/bin/env bash
# Data-parallel training whose rank 1 dies mid-run must not leave rank 0 hanging in a collective,
# nor break the checkpoint: `mpirun -np 2 nopad train --save-every 50` on the tiny BERT, rank 1
# killed (SIGKILL) while steps run, after rank 0 has saved a checkpoint. The job must end within
# 60 s with a non-zero status and a message naming the dead rank, and the folder must hold a
# whole checkpoint of a step the saves make (a multiple of 50) that one process resumes from.
# (cli_tp_fault.sh is the same for a split model.) Skipped without mpirun.
set -uo pipefail
: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
MPIRUN="${NOPAD_MPIRUN:-$(command -v mpirun || true)}"
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun"
    exit 0
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" # see cli_train_dp.sh
export OMP_NUM_THREADS=1
TMP="$(mktemp -d)"
trap 'kill -KILL ${JOB:-} 2>/dev/null; rm -rf "$TMP"' EXIT
D="$NOPAD_TEST_DATA/train"
MODEL="$TMP/mlm"
mkdir "$MODEL"
cp "$D/bert_mlm/config.json" "$D/bert_mlm/model.safetensors" "$D/vocab.txt" "$MODEL/"
OUT="$TMP/out"
# enough steps that rank 1 dies mid-run: 2000 epochs of 8 steps, a checkpoint every 50
RUN=(train --model "$MODEL" --task mlm --data "$D/cls_train.jsonl" --epochs 2000 --lr 1e-4
     --batch-tokens 64 --batch-seqs 4 --save-every 50 --threads 1)
start=$(date +%s%N)
timeout 120 "$MPIRUN" --allow-run-as-root --oversubscribe --bind-to none -np 2 \
    "$NOPAD_CLI" "${RUN[@]}" --output "$OUT" >"$TMP/out.txt" 2>"$TMP/err.txt" &
JOB=$!
# rank 1: the process whose environment says OMPI_COMM_WORLD_RANK=1, once a checkpoint is saved
rank1=""
for _ in $(seq 1 600); do
    if [ -s "$OUT/trainer_state.json" ]; then
        for p in $(pgrep -f "$NOPAD_CLI train --model $MODEL"); do
            tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && rank1=$p
        done
        [ -n "$rank1" ] && break
    fi
    kill -0 "$JOB" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$rank1" ]; then
    echo "FAIL: rank 1 was not found running after a checkpoint: $(tail -5 "$TMP/err.txt")"
    exit 1
fi
sleep 0.3 # into the steps after the save
killed=$(date +%s%N)
kill -KILL "$rank1"
wait "$JOB"
status=$?
JOB=""
ms=$((($(date +%s%N) - killed) / 1000000))
echo "cli_train_dp_fault: rank 1 killed $(((killed - start) / 1000000)) ms into the run; the job ended $ms ms later with status $status"
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
# the checkpoint: whole, of a saved step, and one process resumes it (global budget 128 / 8)
step=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["step"])' "$OUT/trainer_state.json" 2>/dev/null)
if [ -z "$step" ] || [ $((step % 50)) -ne 0 ]; then
    echo "FAIL: trainer_state.json holds step '$step', not a saved one"; fail=1
elif ! "$NOPAD_CLI" train --model "$MODEL" --task mlm --data "$D/cls_train.jsonl" --epochs 2000 \
    --lr 1e-4 --batch-tokens 128 --batch-seqs 8 --threads 1 --resume "$OUT" --output "$TMP/resumed" \
    --stop-after $((step + 2)) --quiet >/dev/null 2>"$TMP/resume.txt"; then
    echo "FAIL: resuming the checkpoint of step $step: $(cat "$TMP/resume.txt")"; fail=1
else
    echo "the checkpoint of step $step is whole: one process resumed it"
fi
sed "s/^/  | /" "$TMP/err.txt" | grep -v "^  | step " | head -8
[ "$fail" -eq 0 ] && echo "ok   rank 1 killed mid-run: the job ended in $ms ms, naming rank 1; the checkpoint is intact"
exit $fail
