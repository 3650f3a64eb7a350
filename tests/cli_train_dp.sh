#!/usr/bin/env bash
# `nopad train` data-parallel (docs/training.md, "Several processes"), on the tiny BERT of
# tests/data/train stripped to a bare BertModel and fine-tuned with --num-labels 2 on
# cls_train.jsonl (64 lines), as cli_train.sh does in one process:
#   - --nproc 2 with batches of 64 tokens and 8 sequences against one process of 128 and 16: every
#     step's loss within 1e-5 relative (the same sums in another order: float32 rounding, ~1e-7
#     observed), the same learning rates, the same eval accuracy and loss printed once, the folder
#     a model `nopad classify` runs; the balance line names both ranks' most loaded share;
#   - the same under `mpirun -np 2` directly: the losses of --nproc 2 bit for bit;
#   - --eval-every 8 --save-best: the evaluation lines of one process (the ranks share the eval
#     batches), printed once, OUTPUT/best written;
#   - a checkpoint written by 2 processes at step 10 (--stop-after), resumed by one process with
#     the global budgets: steps 11-32 within 1e-5 of the one-process run that did not stop;
#   - --log-batches: each global batch logged once, the batch one process logs (ids, types,
#     labels), with the rank that computed each sequence;
#   - --pack-lines (masked LM, dropout 0.1, logged with --log-batches): the batches one process
#     cuts and packs, the losses within 1e-5;
#   - --stream (windows of 1 KiB): the batches one process streams, step by step; a streamed
#     checkpoint of 2 processes at step 6 resumed by one process streaming: the later steps within
#     1e-5 of the straight run;
#   - refusals: --nproc 3 in a world of 2 and a resume at another global budget, each exit 1
#     naming the problem.
# Skipped without mpirun.
set -uo pipefail
source "$(dirname "$0")/mpi_lib.sh"
source "$(dirname "$0")/train_lib.sh"
# Open MPI keeps allocations until exit in components it unloads (tests/CMakeLists.txt, the MPI
# tests): no leaks of ours; the sanitizer's other checks stay on
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export OMP_NUM_THREADS=1
bare_model "$TMP/bare"

RUN=(train --model "$TMP/bare" --task classify --num-labels 2 --data "$D/cls_train.jsonl"
     --eval "$D/cls_eval.jsonl" --epochs 8 --lr 3e-3 --threads 1)
ONE=(--batch-tokens 128 --batch-seqs 16)
TWO=(--batch-tokens 64 --batch-seqs 8)

# compare A B FIRST: B's steps from FIRST on against A's: losses within 1e-5 relative, lrs equal
compare() {
    python3 - "$1" "$2" "$3" <<'PY'
import json, sys
def steps(path):
    return {j["step"]: j for j in map(json.loads, open(path)) if "loss" in j}
a, b, first = steps(sys.argv[1]), steps(sys.argv[2]), int(sys.argv[3])
keys = [k for k in sorted(b) if k >= first]
assert keys and all(k in a for k in keys), "steps %s against %s" % (keys, sorted(a))
worst = max(abs(b[k]["loss"] - a[k]["loss"]) / a[k]["loss"] for k in keys)
lr = max(abs(b[k]["lr"] - a[k]["lr"]) for k in keys)
print("steps %d-%d: losses within %.2e relative, learning rates within %g" % (keys[0], keys[-1], worst, lr))
sys.exit(0 if worst <= 1e-5 and lr == 0 else 1)
PY
}

"$NOPAD_CLI" "${RUN[@]}" "${ONE[@]}" --output "$TMP/one" --log "$TMP/one.log" --quiet \
    >"$TMP/one.out" 2>"$TMP/one.err" || fail "one process: $(cat "$TMP/one.err")"
if timeout 120 "$NOPAD_CLI" "${RUN[@]}" "${TWO[@]}" --nproc 2 --output "$TMP/two" --log "$TMP/two.log" \
    >"$TMP/two.out" 2>"$TMP/two.err"; then
    compare "$TMP/one.log" "$TMP/two.log" 1 || fail "--nproc 2 against one process"
    cmp -s "$TMP/one.out" "$TMP/two.out" ||
        fail "--nproc 2 printed $(cat "$TMP/two.out"), one process $(cat "$TMP/one.out")"
    [ "$(grep -c '^eval accuracy: ' "$TMP/two.out")" = 1 ] || fail "eval accuracy not printed once"
    grep -q "^eval accuracy: 0.9" "$TMP/two.out" || fail "--nproc 2: $(cat "$TMP/two.out")"
    grep -q "data-parallel over 2 processes, 32 steps: .* after the exchange" "$TMP/two.err" ||
        fail "no balance line: $(cat "$TMP/two.err")"
    [ "$(grep -c '^trained 32 steps' "$TMP/two.err")" = 1 ] || fail "summary not printed once"
    echo "aa ab ac cd" | "$NOPAD_CLI" classify --model "$TMP/two" >/dev/null 2>"$TMP/err" ||
        fail "nopad classify on the --nproc 2 folder: $(cat "$TMP/err")"
    grep "data-parallel" "$TMP/two.err"
else
    fail "--nproc 2 exit $?: $(cat "$TMP/two.err")"
fi

# --no-exchange: each process trains on what it read; the exchange only permutes the work
if timeout 120 "$NOPAD_CLI" "${RUN[@]}" "${TWO[@]}" --nproc 2 --no-exchange --output "$TMP/noex" \
    --log "$TMP/noex.log" >"$TMP/noex.out" 2>"$TMP/noex.err"; then
    compare "$TMP/one.log" "$TMP/noex.log" 1 || fail "--nproc 2 --no-exchange against one process"
    grep -q "data-parallel over 2 processes, 32 steps: .*(no exchange)" "$TMP/noex.err" ||
        fail "--no-exchange: no balance line saying so: $(cat "$TMP/noex.err")"
else
    fail "--nproc 2 --no-exchange exit $?: $(cat "$TMP/noex.err")"
fi

if timeout 120 "${MPI[@]}" -np 2 "$NOPAD_CLI" "${RUN[@]}" "${TWO[@]}" --output "$TMP/mpi" \
    --log "$TMP/mpi.log" --quiet >"$TMP/mpi.out" 2>"$TMP/mpi.err"; then
    cmp -s <(grep -v '"eval' "$TMP/two.log") <(grep -v '"eval' "$TMP/mpi.log") ||
        fail "mpirun -np 2 logged other steps than --nproc 2"
else
    fail "mpirun -np 2 nopad train: exit $?: $(cat "$TMP/mpi.err")"
fi

# evaluations during the run: the ranks share the eval batches; the lines those of one process,
# printed once, the best weights saved once
"$NOPAD_CLI" "${RUN[@]}" "${ONE[@]}" --eval-every 8 --save-best --output "$TMP/one_ev" --quiet \
    >"$TMP/one_ev.out" 2>"$TMP/err" || fail "one process --eval-every: $(cat "$TMP/err")"
if timeout 120 "$NOPAD_CLI" "${RUN[@]}" "${TWO[@]}" --nproc 2 --eval-every 8 --save-best \
    --output "$TMP/two_ev" --quiet >"$TMP/two_ev.out" 2>"$TMP/err"; then
    cmp -s <(sed "s|$TMP/one_ev|OUT|" "$TMP/one_ev.out") <(sed "s|$TMP/two_ev|OUT|" "$TMP/two_ev.out") ||
        fail "--eval-every with --nproc 2: $(cat "$TMP/two_ev.out"); one process: $(cat "$TMP/one_ev.out")"
    [ "$(grep -c '^eval at step' "$TMP/two_ev.out")" = 4 ] || fail "not 4 evaluations: $(cat "$TMP/two_ev.out")"
    [ -f "$TMP/two_ev/best/model.safetensors" ] || fail "--save-best with --nproc 2: no best/"
else
    fail "--nproc 2 --eval-every: $(cat "$TMP/err")"
fi

# 2 processes stop at step 10; one process resumes with the global budgets
timeout 120 "$NOPAD_CLI" "${RUN[@]}" "${TWO[@]}" --nproc 2 --output "$TMP/stopped" --stop-after 10 \
    --quiet >/dev/null 2>"$TMP/err" || fail "--nproc 2 --stop-after 10: $(cat "$TMP/err")"
if "$NOPAD_CLI" "${RUN[@]}" "${ONE[@]}" --resume "$TMP/stopped" --output "$TMP/resumed" \
    --log "$TMP/resumed.log" --quiet >"$TMP/resumed.out" 2>"$TMP/err"; then
    compare "$TMP/one.log" "$TMP/resumed.log" 11 || fail "resumed at one process"
    cmp -s "$TMP/one.out" "$TMP/resumed.out" || fail "resumed: $(cat "$TMP/resumed.out")"
else
    fail "resuming 2 processes' checkpoint in one: $(cat "$TMP/err")"
fi
# at another global budget (one process of 64 tokens) it is another run
if "$NOPAD_CLI" "${RUN[@]}" "${TWO[@]}" --resume "$TMP/stopped" --output "$TMP/x" --quiet \
    >/dev/null 2>"$TMP/err"; then
    fail "a resume at another global budget was accepted"
else
    grep -q "batch_tokens 64, but the checkpoint's is 128" "$TMP/err" || fail "budget: $(cat "$TMP/err")"
fi

# same_batches A B: every step of B's log (--nproc 2 --log-batches) holds the batch of A's (one
# process): the same sequences, ids, types, masked positions and labels, each sequence's rank
# (sequence_ranks) 0 or 1, and both ranks computing some; losses within 1e-5 relative
same_batches() {
    python3 - "$1" "$2" <<'PY'
import json, sys
def steps(path):
    return {j["step"]: j for j in map(json.loads, open(path)) if "loss" in j}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert sorted(a) == sorted(b) and a, "steps %s against %s" % (sorted(b), sorted(a))
fields = [k for k in ("cu_seqlens", "input_ids", "token_type_ids", "mlm_positions", "mlm_labels", "labels")
          if k in a[1]]
assert "cu_seqlens" in fields and "input_ids" in fields, fields
ranks = set()
for k in a:
    for f in fields:
        assert a[k][f] == b[k][f], "step %d: %s differs" % (k, f)
    assert "sequence_ranks" not in a[k]
    r = b[k]["sequence_ranks"]
    assert len(r) == len(b[k]["cu_seqlens"]) - 1 and set(r) <= {0, 1}, "step %d: sequence_ranks %s" % (k, r)
    ranks |= set(r)
    assert abs(b[k]["loss"] - a[k]["loss"]) <= 1e-5 * a[k]["loss"], "step %d: loss" % k
assert ranks == {0, 1}, ranks
print("%d steps: the same batches (%s), both ranks computing" % (len(a), ", ".join(fields)))
PY
}

# --log-batches: the global batch logged once, as one process logs it, with each sequence's rank
"$NOPAD_CLI" "${RUN[@]}" "${ONE[@]}" --epochs 1 --output "$TMP/one_lb" --log "$TMP/one_lb.log" --log-batches \
    --quiet >/dev/null 2>"$TMP/err" || fail "one process --log-batches: $(cat "$TMP/err")"
if timeout 120 "$NOPAD_CLI" "${RUN[@]}" "${TWO[@]}" --epochs 1 --nproc 2 --output "$TMP/two_lb" \
    --log "$TMP/two_lb.log" --log-batches --quiet >/dev/null 2>"$TMP/err"; then
    same_batches "$TMP/one_lb.log" "$TMP/two_lb.log" || fail "--nproc 2 --log-batches against one process"
else
    fail "--nproc 2 --log-batches: $(cat "$TMP/err")"
fi

# --pack-lines (masked LM on the lines of cls_train.jsonl): the pieces one process cuts from the
# whole file, a piece crossing from one process's share into the other's; logged with
# --log-batches, the batches are one process's
python3 -c "
import json
with open('$TMP/lines.txt', 'w') as f:
    for line in open('$D/cls_train.jsonl'):
        f.write(json.loads(line)['text'] + '\n')"
mkdir "$TMP/mlm"
cp "$D/bert_mlm/config.json" "$D/bert_mlm/model.safetensors" "$D/vocab.txt" "$TMP/mlm/"
MLM=(train --model "$TMP/mlm" --task mlm --data "$TMP/lines.txt" --pack-lines --epochs 2 --lr 1e-3
     --threads 1 --dropout 0.1 --log-batches)
"$NOPAD_CLI" "${MLM[@]}" --batch-tokens 128 --batch-seqs 16 --output "$TMP/one_pk" --log "$TMP/one_pk.log" \
    --quiet >/dev/null 2>"$TMP/err" || fail "one process --pack-lines: $(cat "$TMP/err")"
if timeout 120 "$NOPAD_CLI" "${MLM[@]}" --batch-tokens 64 --batch-seqs 8 --nproc 2 --output "$TMP/two_pk" \
    --log "$TMP/two_pk.log" --quiet >/dev/null 2>"$TMP/err"; then
    same_batches "$TMP/one_pk.log" "$TMP/two_pk.log" || fail "--nproc 2 --pack-lines against one process"
else
    fail "--nproc 2 --pack-lines: $(cat "$TMP/err")"
fi

# --stream (a 1 KiB buffer: blocks of 64 bytes, 16 a window, about 4 windows an epoch): each
# process reads its blocks of each window; the batches and steps one process streams; stopped at
# step 6 (inside the epoch's windows) and resumed by one process streaming, the later steps those
# of the straight run
STREAM=(--stream --stream-buffer 1k --log-batches)
"$NOPAD_CLI" "${RUN[@]}" "${ONE[@]}" "${STREAM[@]}" --output "$TMP/one_st" --log "$TMP/one_st.log" --quiet \
    >/dev/null 2>"$TMP/err" || fail "one process --stream: $(cat "$TMP/err")"
if timeout 120 "$NOPAD_CLI" "${RUN[@]}" "${TWO[@]}" "${STREAM[@]}" --nproc 2 --output "$TMP/two_st" \
    --log "$TMP/two_st.log" --quiet >/dev/null 2>"$TMP/err"; then
    same_batches "$TMP/one_st.log" "$TMP/two_st.log" || fail "--nproc 2 --stream against one process"
else
    fail "--nproc 2 --stream: $(cat "$TMP/err")"
fi
timeout 120 "$NOPAD_CLI" "${RUN[@]}" "${TWO[@]}" "${STREAM[@]}" --nproc 2 --output "$TMP/st_stopped" \
    --log "$TMP/st_stopped.log" --stop-after 6 --quiet >/dev/null 2>"$TMP/err" || fail "--nproc 2 --stream --stop-after 6: $(cat "$TMP/err")"
if "$NOPAD_CLI" "${RUN[@]}" "${ONE[@]}" "${STREAM[@]}" --resume "$TMP/st_stopped" --output "$TMP/st_resumed" \
    --log "$TMP/st_resumed.log" --quiet >/dev/null 2>"$TMP/err"; then
    compare "$TMP/one_st.log" "$TMP/st_resumed.log" 7 || fail "a streamed run of 2 processes resumed in one"
else
    fail "resuming 2 streaming processes' checkpoint in one: $(cat "$TMP/err")"
fi

# refusals
expect_error() { # WHAT PATTERN COMMAND...
    local what="$1" pattern="$2"
    shift 2
    if timeout 120 "$@" >/dev/null 2>"$TMP/err"; then
        fail "$what was accepted"
    elif ! grep -q -- "$pattern" "$TMP/err"; then
        fail "$what: $(cat "$TMP/err")"
    fi
}
expect_error "--nproc 3 in a world of 2" "--nproc 3 needs a world of 3 processes, and the launcher started 2" \
    "${MPI[@]}" -np 2 "$NOPAD_CLI" "${RUN[@]}" --output "$TMP/x" --nproc 3
expect_error "--nproc 0" "--nproc" "$NOPAD_CLI" "${RUN[@]}" --output "$TMP/x" --nproc 0

finish cli_train_dp
