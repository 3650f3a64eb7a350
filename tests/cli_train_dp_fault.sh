#!/usr/bin/env bash
# Data-parallel training whose rank 1 dies mid-run must not leave rank 0 hanging in a collective,
# nor break the checkpoint: `mpirun -np 2 nopad train --save-every 50` on the tiny BERT, rank 1
# killed (SIGKILL) while steps run, after rank 0 has saved a checkpoint. The job must end within
# 60 s with a non-zero status and a message naming the dead rank, and the folder must hold a
# whole checkpoint of a step the saves make (a multiple of 50) that one process resumes from.
# (cli_tp_fault.sh is the same for a split model.) Skipped without mpirun.
set -uo pipefail
source "$(dirname "$0")/mpi_lib.sh"
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
timeout 120 "${MPI[@]}" -np 2 \
    "$NOPAD_CLI" "${RUN[@]}" --output "$OUT" >"$TMP/out.txt" 2>"$TMP/err.txt" &
JOB=$!
# rank 1 (OMPI_COMM_WORLD_RANK=1), killed once a checkpoint is saved and the steps after it run
if ! KILL_DELAY=0.3 kill_rank1 "$JOB" "$NOPAD_CLI train --model $MODEL" "$OUT/trainer_state.json" 600; then
    echo "FAIL: rank 1 was not found running after a checkpoint: $(tail -5 "$TMP/err.txt")"
    exit 1
fi
wait "$JOB"
status=$?
JOB=""
fail=0
check_job_ended cli_train_dp_fault "$status" "$start" "$TMP/err.txt" || fail=1
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
[ "$fail" -eq 0 ] && echo "ok   rank 1 killed mid-run: the job ended in $ENDED_MS ms, naming rank 1; the checkpoint is intact"
exit $fail
