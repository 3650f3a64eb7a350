#!/usr/bin/env bash
# `nopad train` end to end on the tiny BERT of tests/data/train (hidden 32, 2 layers) with the
# 64-id vocab.txt and the two-label task of scripts/make_train_cli_data.py:
#   - a plain BertModel folder (the MLM checkpoint with its head and "bert." prefix stripped, as a
#     sentence-transformers folder is) fine-tuned for classification with --num-labels 2: a new
#     head is made, the loss falls (last step below half the first), 'eval accuracy: X' is
#     printed with X >= 0.9 on the held-out file (observed 1.0: the labels follow the word sets),
#     and the output folder is a model that `nopad embed` runs;
#   - the dropout rates (config.json's hidden_dropout_prob and attention_probs_dropout_prob,
#     --dropout, --attention-dropout, the attention's following --dropout when unset) recorded in
#     trainer_state.json; a resume with another rate is an error naming both values;
#   - masked-LM training with LAMB on text lines, with an eval loss; with --whole-word-mask; with
#     --pack-lines (and its refusal to stream);
#   - --resume: a run stopped after step k (--stop-after) and resumed from its checkpoint logs the
#     same per-step losses and learning rates, bit for bit, as one that did not stop, and ends
#     with the same weights; a resume with another optimiser, learning rate, epoch count, seed,
#     dropout rate, task or label count is an error naming both values;
#   - --stream: trains reading the data a window at a time; a streamed run stopped and resumed
#     equals one that did not stop, bit for bit; resuming it in memory or with another buffer is
#     an error naming both values; data over 1 GiB streams unasked, saying so;
#   - --eval-every N|epoch, --save-best, --early-stop: the evaluation lines at the right steps, the
#     same in --log and trainer_state.json, the training unchanged by them; OUTPUT/best holds the
#     weights of the best step (ties to the earlier; the bytes of a run stopped there, classified
#     or evaluated to the metric printed); a resume before or after the best keeps it; early
#     stopping where the history says, and it stays stopped when resumed;
#   - --log-batches: each step's batch in the log, well-formed;
#   - --device cuda: runs where the build has CUDA training, else exit 1 with a clear error;
#   - bad flags and files: exit 2 (command line) or 1 (error) with a message naming the problem.
set -euo pipefail

source "$(dirname "$0")/train_lib.sh"

# The MLM checkpoint with its tokenizer, and a bare BertModel made from it.
mkdir "$TMP/mlm"
cp "$D/bert_mlm/config.json" "$D/bert_mlm/model.safetensors" "$D/vocab.txt" "$TMP/mlm/"
bare_model "$TMP/bare"

"$NOPAD_CLI" train --help >"$TMP/help" && grep -q -- '--num-labels' "$TMP/help" && grep -q -- '--stream-buffer' "$TMP/help" &&
    grep -q -- '--attention-dropout P' "$TMP/help" ||
    fail "train --help"

# ---- classification with a new head -------------------------------------------------------------
OUT="$TMP/out_cls"
if "$NOPAD_CLI" train --model "$TMP/bare" --task classify --num-labels 2 --data "$D/cls_train.jsonl" \
    --eval "$D/cls_eval.jsonl" --output "$OUT" --lr 3e-3 --epochs 8 --batch-tokens 64 \
    --batch-seqs 8 --save-every 20 --threads 2 >"$TMP/stdout" 2>"$TMP/stderr"; then
    cat "$TMP/stderr"
    grep -q '^step 10/' "$TMP/stderr" || fail "classify: no progress line"
    grep -q 'new classification head' "$TMP/stderr" || fail "classify: the new head is not reported"
    python3 -c "import json, sys; s = json.load(open('$OUT/trainer_state.json')); sys.exit(0 if (s['dropout'], s['attention_dropout']) == (0, 0) else 1)" ||
        fail "classify: the dropout rates recorded are not config.json's 0 and 0: $(cat "$OUT/trainer_state.json")"
    acc=$(sed -n 's/^eval accuracy: //p' "$TMP/stdout")
    [ -n "$acc" ] || fail "classify: no 'eval accuracy:' line: $(cat "$TMP/stdout")"
    [ -n "$acc" ] && python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.9 else 1)" ||
        fail "classify: eval accuracy '$acc' below 0.9"
    losses=$(sed -n 's/.*: loss \([0-9.]*\) -> \([0-9.]*\);.*/\1 \2/p' "$TMP/stderr")
    python3 -c "import sys; a, b = map(float, '$losses'.split()); sys.exit(0 if b < a / 2 else 1)" ||
        fail "classify: the loss did not fall by half: $losses"
    for f in config.json model.safetensors optimizer.safetensors trainer_state.json vocab.txt; do
        [ -f "$OUT/$f" ] || fail "classify: $OUT/$f missing"
    done
    grep -q BertForSequenceClassification "$OUT/config.json" || fail "classify: config.json architecture"
    # the saved folder is a model nopad embed runs
    if echo "aa ab ac cd" | "$NOPAD_CLI" embed --model "$OUT" >"$TMP/emb" 2>"$TMP/emb_err"; then
        python3 -c "import json; v = json.load(open('$TMP/emb')); assert len(v) == 32, len(v)" ||
            fail "embed of the trained folder: not one array of 32 floats"
    else
        fail "embed of the trained folder: $(cat "$TMP/emb_err")"
    fi
else
    fail "classify: exit $?: $(cat "$TMP/stderr")"
fi

# ---- dropout rates: config.json's, --dropout, --attention-dropout -------------------------------
# The rates a run trains with are recorded in trainer_state.json ("dropout", "attention_dropout")
# and its config.json keeps the model's: unset, the attention's follows --dropout when given, else
# config.json's attention_probs_dropout_prob (here 0.1, the hidden one 0.05, so a mix-up shows).
mkdir "$TMP/bare_drop"
cp "$TMP/bare/"* "$TMP/bare_drop/"
python3 -c "import json; p='$TMP/bare_drop/config.json'; c=json.load(open(p)); c.update(attention_probs_dropout_prob=0.1, hidden_dropout_prob=0.05); json.dump(c, open(p, 'w'))"
DROP=(--model "$TMP/bare_drop" --task classify --num-labels 2 --data "$D/cls_train.jsonl" --epochs 1
      --batch-tokens 64 --batch-seqs 8 --threads 2)
# flags | dropout, attention_dropout recorded
while IFS='|' read -r flags want; do
    read -r -a extra <<<"$flags"
    out="$TMP/out_drop"
    rm -rf "$out"
    if "$NOPAD_CLI" train "${DROP[@]}" --output "$out" --stop-after 2 "${extra[@]}" </dev/null >/dev/null \
        2>"$TMP/err_drop"; then
        grep -q 'not applied' "$TMP/err_drop" && fail "dropout ($flags): a note that it is not applied: $(cat "$TMP/err_drop")"
        python3 - "$out" "$want" <<'PY' || fail "dropout rates with flags '$flags'"
import json, sys
out, want = sys.argv[1], tuple(map(float, sys.argv[2].split()))
s = json.load(open(out + "/trainer_state.json"))
got = (s["dropout"], s["attention_dropout"])
assert got == want, f"recorded dropout, attention_dropout {got}, want {want}"
c = json.load(open(out + "/config.json"))
assert (c["hidden_dropout_prob"], c["attention_probs_dropout_prob"]) == (0.05, 0.1), c
print(f"ok   dropout rates {want}: recorded in trainer_state.json")
PY
    else
        fail "dropout ($flags): $(cat "$TMP/err_drop")"
    fi
done <<'CASES'
|0.05 0.1
--dropout 0|0 0
--dropout 0.2|0.2 0.2
--dropout 0 --attention-dropout 0.2|0 0.2
--attention-dropout 0|0.05 0
--attention-dropout 0.3|0.05 0.3
CASES
# a run with attention dropout resumes with the same rate, and not with another
"$NOPAD_CLI" train "${DROP[@]}" --output "$TMP/out_adrop" --stop-after 2 --dropout 0 --attention-dropout 0.2 \
    --quiet 2>"$TMP/err_drop" || fail "attention dropout, the first steps: $(cat "$TMP/err_drop")"
rc=0
"$NOPAD_CLI" train "${DROP[@]}" --output "$TMP/out_adrop2" --resume "$TMP/out_adrop" --dropout 0 \
    --quiet 2>"$TMP/err_drop" || rc=$?
{ [ "$rc" -eq 1 ] && grep -qF "attention_dropout 0, but the checkpoint's is 0.2;" "$TMP/err_drop"; } ||
    fail "resume with another attention dropout: exit $rc: $(cat "$TMP/err_drop")"
# without a rate, a resumed run keeps its own (not config.json's 0.05 and 0.1)
"$NOPAD_CLI" train "${DROP[@]}" --output "$TMP/out_adrop3" --resume "$TMP/out_adrop" --stop-after 3 \
    --quiet 2>"$TMP/err_drop" || fail "resume without rates: $(cat "$TMP/err_drop")"
python3 -c "import json, sys; s = json.load(open('$TMP/out_adrop3/trainer_state.json')); sys.exit(0 if (s['dropout'], s['attention_dropout'], s['step']) == (0, 0.2, 3) else 1)" ||
    fail "resume without rates: not the run's own: $(cat "$TMP/out_adrop3/trainer_state.json")"
"$NOPAD_CLI" train "${DROP[@]}" --output "$TMP/out_adrop" --resume "$TMP/out_adrop" --dropout 0 \
    --attention-dropout 0.2 --quiet 2>"$TMP/err_drop" || fail "resume with the same attention dropout: $(cat "$TMP/err_drop")"
grep -q '"step":[[:space:]]*8,' "$TMP/out_adrop/trainer_state.json" ||
    fail "resume with the same attention dropout: not at the epoch's end: $(cat "$TMP/out_adrop/trainer_state.json")"

# ---- masked LM, LAMB, on text lines ---------------------------------------------------------------
python3 -c "
import json
for name in ('cls_train', 'cls_eval'):
    with open('$TMP/' + name + '.txt', 'w') as f:
        for line in open('$D/' + name + '.jsonl'):
            f.write(json.loads(line)['text'] + '\n')"
if "$NOPAD_CLI" train --model "$TMP/mlm" --task mlm --data "$TMP/cls_train.txt" \
    --eval "$TMP/cls_eval.txt" --output "$TMP/out_mlm" --optimizer lamb --lr 1e-3 --epochs 2 \
    --batch-tokens 64 --quiet >"$TMP/stdout" 2>"$TMP/stderr"; then
    grep -q '^eval loss: [0-9]' "$TMP/stdout" || fail "mlm: no eval loss: $(cat "$TMP/stdout")"
    grep -q BertForMaskedLM "$TMP/out_mlm/config.json" || fail "mlm: config.json architecture"
    [ -s "$TMP/stderr" ] && fail "mlm --quiet wrote to stderr: $(cat "$TMP/stderr")"
else
    fail "mlm: exit $?: $(cat "$TMP/stderr")"
fi
# whole-word masking: trains, and trainer_state.json records it (the resume check reads it)
if "$NOPAD_CLI" train --model "$TMP/mlm" --task mlm --data "$TMP/cls_train.txt" --output "$TMP/out_wwm" \
    --whole-word-mask --epochs 1 --batch-tokens 64 --quiet >"$TMP/stdout" 2>"$TMP/stderr"; then
    grep -q '"whole_word_mask":\s*true' "$TMP/out_wwm/trainer_state.json" ||
        fail "mlm --whole-word-mask: not in trainer_state.json"
else
    fail "mlm --whole-word-mask: exit $?: $(cat "$TMP/stderr")"
fi
# packed lines: trains on full-length pieces, recorded; it does not stream
if "$NOPAD_CLI" train --model "$TMP/mlm" --task mlm --data "$TMP/cls_train.txt" --output "$TMP/out_pack" \
    --pack-lines --epochs 1 --batch-tokens 512 --quiet >"$TMP/stdout" 2>"$TMP/stderr"; then
    grep -q '"pack_lines":\s*true' "$TMP/out_pack/trainer_state.json" ||
        fail "mlm --pack-lines: not in trainer_state.json"
else
    fail "mlm --pack-lines: exit $?: $(cat "$TMP/stderr")"
fi

# ---- resume: k steps + --resume give the per-step losses of a run that did not stop -------------
# Classification from the bare model (a new head, from the seed), AdamW with its warmup and decay,
# 3 epochs of 8 batches: stopped after step 7 (mid-epoch) or 8 (an epoch's end), then resumed from
# the checkpoint for the rest (crossing epoch boundaries); every step's loss (%.17g in --log) and
# learning rate equal bit for bit, and the end weights too.
B=(--model "$TMP/bare" --task classify --num-labels 2 --data "$D/cls_train.jsonl" --batch-tokens 64
   --batch-seqs 8 --threads 2 --quiet)
R=("${B[@]}" --lr 3e-3 --epochs 3)
"$NOPAD_CLI" train "${R[@]}" --output "$TMP/straight" --log "$TMP/straight.jsonl" 2>"$TMP/err" ||
    fail "resume: the straight run: $(cat "$TMP/err")"
for k in 7 8; do
    "$NOPAD_CLI" train "${R[@]}" --output "$TMP/part$k" --stop-after $k --log "$TMP/part${k}a.jsonl" \
        2>"$TMP/err" || fail "resume: the first $k steps: $(cat "$TMP/err")"
    grep -q "\"step\":[[:space:]]*$k," "$TMP/part$k/trainer_state.json" ||
        fail "resume: the checkpoint is not at step $k: $(cat "$TMP/part$k/trainer_state.json")"
    "$NOPAD_CLI" train "${R[@]}" --output "$TMP/part$k" --resume "$TMP/part$k" \
        --log "$TMP/part${k}b.jsonl" 2>"$TMP/err" || fail "resume: after step $k: $(cat "$TMP/err")"
    python3 - "$TMP" $k <<'PY' || fail "resume after step $k: the curves differ"
import json, sys
tmp, k = sys.argv[1], int(sys.argv[2])
def steps(*names):
    return [(r["step"], repr(r["loss"]), r["lr"]) for n in names
            for r in map(json.loads, open(f"{tmp}/{n}.jsonl"))]
straight, first, parts = steps("straight"), steps(f"part{k}a"), steps(f"part{k}a", f"part{k}b")
assert [s for s, _, _ in straight] == list(range(1, len(straight) + 1)) and len(straight) > k + 8
assert len(first) == k, first
assert len(parts) == len(straight), (len(parts), len(straight))
for a, b in zip(straight, parts):
    assert a == b, f"step {a[0]}: straight {a}, resumed {b}"
weights = [open(f"{tmp}/{d}/model.safetensors", "rb").read() for d in ("straight", f"part{k}")]
assert weights[0] == weights[1], "the end weights differ"
print(f"ok   resume after step {k}: {len(straight)} steps, losses equal bit for bit "
      f"({straight[0][1]} -> {straight[-1][1]})")
PY
done
# ---- an interrupted save: the run above over 16 epochs (128 steps), saving every step, killed
# (SIGKILL) a few steps after each save it is seen to make, then resumed from what is there, 6
# times: the kills land in saves as often as not. A checkpoint is written whole (a staging folder
# renamed into place), so each resume starts from the files of one step, the run resumed to its
# end equals the straight one bit for bit, and no temporary is left. (Files renamed into place
# one by one left a mix of steps; runs resumed from it diverged.) SIGINT instead stops the run
# after its step with the checkpoint saved: exit 130 and a message. A mix assembled by hand is
# refused, naming both steps.
K="$TMP/killed"
steps=""
KR=("${B[@]}" --lr 3e-3 --epochs 16)
"$NOPAD_CLI" train "${KR[@]}" --output "$TMP/kstraight" 2>"$TMP/err" || fail "16 epochs: $(cat "$TMP/err")"
ckpt_step() {
    { grep -o '"step":[[:space:]]*[0-9]*' "$K/trainer_state.json" 2>/dev/null || echo 0; } | head -n 1 | grep -o '[0-9]*$'
}
for k in 1 2 3 4 5 6 7; do
    resume=()
    from=$(ckpt_step)
    [ "$from" -gt 0 ] && resume=(--resume "$K") && steps="$steps $from"
    sig=KILL
    [ "$k" -eq 4 ] && sig=INT
    "$NOPAD_CLI" train "${KR[@]}" --output "$K" --save-every 1 "${resume[@]}" 2>"$TMP/err_killed" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null && [ "$(ckpt_step)" -lt $((from + 2 + k * 3)) ]; do sleep 0.002; done
    kill -s "$sig" "$pid" 2>/dev/null || true
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    grep -q "error" "$TMP/err_killed" && fail "interrupted saves: a resume failed: $(cat "$TMP/err_killed")"
    if [ "$sig" = INT ] && [ "$rc" -ne 0 ]; then
        [ "$rc" -eq 130 ] && grep -q "interrupted (SIGINT) at step [0-9]*: the checkpoint is saved" "$TMP/err_killed" &&
            echo "ok   SIGINT: $(tail -n 1 "$TMP/err_killed")" ||
            fail "SIGINT: exit $rc: $(cat "$TMP/err_killed")"
    fi
done
resume=()
from=$(ckpt_step)
[ "$from" -gt 0 ] && resume=(--resume "$K") && steps="$steps $from"
if "$NOPAD_CLI" train "${KR[@]}" --output "$K" --save-every 1 "${resume[@]}" 2>"$TMP/err"; then
    cmp -s "$TMP/kstraight/model.safetensors" "$K/model.safetensors" &&
        cmp -s "$TMP/kstraight/optimizer.safetensors" "$K/optimizer.safetensors" &&
        echo "ok   killed during saves 6 times, interrupted once, resumed each time (at steps$steps): the end weights and moments equal the straight run's" ||
        fail "interrupted saves: the resumed run's end weights differ from the straight run's"
else
    fail "interrupted saves: the last resume: $(cat "$TMP/err")"
fi
left="$(find "$TMP" -maxdepth 2 -name '*nopad-partial*' -o -maxdepth 2 -name '*nopad-old*' -o -maxdepth 2 -name '*.tmp')"
[ -z "$left" ] || fail "interrupted saves: temporaries left behind: $left"
"$NOPAD_CLI" train "${R[@]}" --output "$TMP/mixed" --stop-after 3 2>"$TMP/err" || fail "3 steps: $(cat "$TMP/err")"
cp "$TMP/straight/model.safetensors" "$TMP/mixed/"
rc=0
"$NOPAD_CLI" train "${R[@]}" --output "$TMP/mixed_out" --resume "$TMP/mixed" 2>"$TMP/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "a mix of saves: trainer_state.json is of step 3, model.safetensors of step" "$TMP/err" &&
    echo "ok   a checkpoint of mixed steps is refused: $(cat "$TMP/err")" ||
    fail "a checkpoint of mixed steps: exit $rc: $(cat "$TMP/err")"

# the same flags but for the optimiser, the learning rate, the epochs: errors naming both values
expect_resume_fail() {
    local word="$1"
    shift
    local rc=0
    "$NOPAD_CLI" train "$@" --output "$TMP/o2" --resume "$TMP/part7" >"$TMP/out" 2>"$TMP/err" || rc=$?
    if [ "$rc" -ne 1 ] || ! grep -qF -- "$word" "$TMP/err"; then
        fail "resume with $*: exit $rc, expected 1 and '$word'; stderr: $(cat "$TMP/err")"
    else
        echo "ok   $word: $(head -n 1 "$TMP/err")"
    fi
}
expect_resume_fail "optimizer lamb, but the checkpoint was trained with adamw" "${R[@]}" --optimizer lamb
expect_resume_fail "learning rate 0.001, but the checkpoint's is 0.003" \
    "${B[@]}" --lr 1e-3 --epochs 3
expect_resume_fail "epochs 4, but the checkpoint's is 3" "${B[@]}" --lr 3e-3 --epochs 4
expect_resume_fail "seed 7, but the checkpoint's is 42" "${R[@]}" --seed 7
expect_resume_fail ": dropout 0.1, but the checkpoint's is 0;" "${R[@]}" --dropout 0.1
expect_resume_fail "attention_dropout 0.1, but the checkpoint's is 0;" "${R[@]}" --attention-dropout 0.1
expect_resume_fail 'of task "classify", not "mlm"' --model "$TMP/bare" --task mlm \
    --data "$TMP/cls_train.txt" --quiet
expect_resume_fail "num_labels 3, but the checkpoint's classifier has 2" --model "$TMP/bare" \
    --task classify --num-labels 3 --data "$D/cls_train.jsonl" --quiet
# a model folder that is not a checkpoint
rc=0
"$NOPAD_CLI" train "${R[@]}" --output "$TMP/o3" --resume "$TMP/bare" 2>"$TMP/err" || rc=$?
{ [ "$rc" -eq 1 ] && grep -q "resuming from $TMP/bare" "$TMP/err" && grep -q trainer_state.json "$TMP/err"; } ||
    fail "resume from a plain model folder: exit $rc: $(cat "$TMP/err")"

# ---- evaluation during training: --eval-every, --save-best, --early-stop -------------------------
# Classification from the bare model, 8 epochs of 8 batches (65 steps), evaluated every 6 steps and
# at the last: lines on stdout and in --log at steps 6, 12, ..., 60 and 65, the same history in
# trainer_state.json; the accuracy reaches 1.0 on the way and stays there, so the best is the
# first step at 1.0 (ties keep the earlier step), not the last. OUTPUT/best holds that step's
# weights: the same bytes as a run stopped there, and `nopad classify` on it gives the accuracy
# printed. The evaluations do not change the training: every step's loss equals a run without.
E=("${B[@]}" --lr 3e-3 --epochs 8 --eval "$D/cls_eval.jsonl")
"$NOPAD_CLI" train "${E[@]}" --output "$TMP/ev" --eval-every 6 --save-best --log "$TMP/ev.jsonl" \
    >"$TMP/ev.out" 2>"$TMP/err" || fail "--eval-every: $(cat "$TMP/err")"
"$NOPAD_CLI" train "${B[@]}" --lr 3e-3 --epochs 8 --output "$TMP/ev_none" --log "$TMP/ev_none.jsonl" \
    2>"$TMP/err" || fail "--eval-every: the run without: $(cat "$TMP/err")"
best=$(python3 - "$TMP" <<'PY'
import json, re, sys
tmp = sys.argv[1]
out = open(f"{tmp}/ev.out").read().splitlines()
lines = [l for l in out if l.startswith("eval at step")]
steps = [int(re.match(r"eval at step (\d+) ", l).group(1)) for l in lines]
assert steps == list(range(6, 61, 6)) + [65], steps
log = [json.loads(l) for l in open(f"{tmp}/ev.jsonl")]
evals = [r for r in log if "eval_loss" in r]
assert [r["step"] for r in evals] == steps
# an evaluation's line follows its step's line
for r in evals:
    i = log.index(r)
    assert log[i - 1]["step"] == r["step"] and "loss" in log[i - 1], (log[i - 1], r)
for l, r in zip(lines, evals):
    m = re.match(r"eval at step \d+ \(epoch (\d+)\): loss ([0-9.]+)  accuracy ([0-9.]+)", l)
    assert int(m.group(1)) == r["epoch"] + 1 and r["eval_examples"] == 32, (l, r)
    assert abs(float(m.group(2)) - r["eval_loss"]) < 1e-6 and float(m.group(3)) == round(r["eval_accuracy"], 4), (l, r)
accs = [r["eval_accuracy"] for r in evals]
want = steps[accs.index(max(accs))]
assert max(accs) == 1.0 and want < 65 and accs.count(1.0) >= 3, accs
assert [r["is_best"] for r in evals] == [a > max(accs[:i], default=-1) for i, a in enumerate(accs)]
assert f"best: step {want} of 11 evaluations, eval accuracy 1.0000 (its weights in {tmp}/ev/best)" in out, out[-3:]
assert "eval accuracy: 1.0000" in out  # the last step's, as without --eval-every
state = json.load(open(f"{tmp}/ev/trainer_state.json"))
assert state["format"] == "nopad-train-5" and state["eval_metric"] == "accuracy"
assert state["evaluations"] == [{k: v for k, v in r.items() if k != "is_best"} for r in evals]
assert state["best"] == {"metric": "accuracy", "step": want, "value": 1}, state["best"]
res = json.load(open(f"{tmp}/ev/best/eval_results.json"))
assert res["step"] == want and res["eval_accuracy"] == 1 and res["metric"] == "accuracy", res
# the training is the same with evaluations as without
plain = [(r["step"], repr(r["loss"])) for r in map(json.loads, open(f"{tmp}/ev_none.jsonl"))]
assert [(r["step"], repr(r["loss"])) for r in log if "loss" in r] == plain
print(want)
PY
) || fail "--eval-every: the evaluations: $(tail -n 3 "$TMP/ev.out")"
if [ -n "$best" ]; then
    echo "ok   --eval-every 6: 11 evaluations, the best at step $best"
    for f in config.json model.safetensors vocab.txt eval_results.json; do
        [ -f "$TMP/ev/best/$f" ] || fail "--save-best: $TMP/ev/best/$f missing"
    done
    [ -f "$TMP/ev/best/optimizer.safetensors" ] && fail "--save-best: best/ holds the optimiser state"
    "$NOPAD_CLI" train "${B[@]}" --lr 3e-3 --epochs 8 --output "$TMP/ev_at_best" --stop-after "$best" \
        2>"$TMP/err" || fail "--save-best: the run stopped at $best: $(cat "$TMP/err")"
    cmp -s "$TMP/ev/best/model.safetensors" "$TMP/ev_at_best/model.safetensors" ||
        fail "--save-best: best/ does not hold step $best's weights"
    cmp -s "$TMP/ev/best/model.safetensors" "$TMP/ev/model.safetensors" &&
        fail "--save-best: best/ holds the last step's weights, not step $best's"
    # the folder classifies the eval data with the accuracy printed
    python3 -c "import json; [print(json.loads(l)['text']) for l in open('$D/cls_eval.jsonl')]" |
        "$NOPAD_CLI" classify --model "$TMP/ev/best" >"$TMP/best_cls" 2>"$TMP/err" ||
        fail "classify with best/: $(cat "$TMP/err")"
    python3 - "$TMP/best_cls" "$D/cls_eval.jsonl" <<'PY' || fail "classify with best/: not the accuracy printed"
import json, sys
got = [json.loads(l)["label"] for l in open(sys.argv[1])]
want = ["LABEL_%d" % json.loads(l)["label"] for l in open(sys.argv[2])]
assert len(got) == len(want) == 32 and got == want, (got, want)
print("ok   nopad classify of best/: accuracy 1.0, as printed")
PY
fi

# --resume keeps the best: stopped before the best (step 20) or after it (40), resumed into the same
# folder, the log (steps and evaluations), the history, best/ and the end weights equal the run
# that did not stop; resumed into another folder, best/ is brought along.
for k in 20 40; do
    "$NOPAD_CLI" train "${E[@]}" --output "$TMP/evp$k" --eval-every 6 --save-best --stop-after $k \
        --log "$TMP/evp${k}a.jsonl" >/dev/null 2>"$TMP/err" || fail "resume --save-best: the first $k steps: $(cat "$TMP/err")"
    "$NOPAD_CLI" train "${E[@]}" --output "$TMP/evp$k" --eval-every 6 --save-best --resume "$TMP/evp$k" \
        --log "$TMP/evp${k}b.jsonl" >"$TMP/evp$k.out" 2>"$TMP/err" || fail "resume --save-best after $k: $(cat "$TMP/err")"
    python3 - "$TMP" $k "$best" <<'PY' || fail "resume --save-best after step $k: not the run that did not stop"
import json, sys
tmp, k, best = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
straight = open(f"{tmp}/ev.jsonl").read()
assert open(f"{tmp}/evp{k}a.jsonl").read() + open(f"{tmp}/evp{k}b.jsonl").read() == straight
a, b = (json.load(open(f"{tmp}/{d}/trainer_state.json")) for d in ("ev", f"evp{k}"))
assert a["evaluations"] == b["evaluations"] and a["best"] == b["best"]
for f in ("best/model.safetensors", "best/eval_results.json", "model.safetensors"):
    assert open(f"{tmp}/ev/{f}", "rb").read() == open(f"{tmp}/evp{k}/{f}", "rb").read(), f
out = open(f"{tmp}/evp{k}.out").read()
assert f"best: step {best} of 11 evaluations" in out, out
print(f"ok   resume after step {k} keeps the best (step {best}): log, history and best/ equal")
PY
done
"$NOPAD_CLI" train "${E[@]}" --output "$TMP/evp40c" --eval-every 6 --save-best --resume "$TMP/evp40" \
    >"$TMP/out" 2>"$TMP/err" || fail "resume --save-best into another folder: $(cat "$TMP/err")"
cmp -s "$TMP/ev/best/model.safetensors" "$TMP/evp40c/best/model.safetensors" ||
    fail "resume --save-best into another folder: best/ is not the best's"
# a checkpoint whose run kept no best/ cannot give one; another metric is another best
"$NOPAD_CLI" train "${E[@]}" --output "$TMP/evq" --eval-every 6 --stop-after 40 >/dev/null 2>"$TMP/err" ||
    fail "--eval-every without --save-best: $(cat "$TMP/err")"
expect_best_resume_fail() {
    local word="$1" from="$2"
    shift 2
    local rc=0
    "$NOPAD_CLI" train "$@" --resume "$from" >"$TMP/out" 2>"$TMP/err" || rc=$?
    if [ "$rc" -ne 1 ] || ! grep -qF -- "$word" "$TMP/err"; then
        fail "resume with $*: exit $rc, expected 1 and '$word'; stderr: $(cat "$TMP/err")"
    else
        echo "ok   $word: $(head -n 1 "$TMP/err")"
    fi
}
expect_best_resume_fail "best evaluation (step $best) has no weights in $TMP/evq/best" "$TMP/evq" \
    "${E[@]}" --output "$TMP/evq2" --eval-every 6 --save-best
expect_best_resume_fail "best metric loss, but the checkpoint's is accuracy" "$TMP/evq" \
    "${E[@]}" --output "$TMP/evq3" --eval-every 6 --best-metric loss
# resumed without --best-metric, a run by the loss stays by the loss
"$NOPAD_CLI" train "${E[@]}" --output "$TMP/evl" --eval-every 6 --best-metric loss --stop-after 40 \
    >/dev/null 2>"$TMP/err" || fail "--best-metric loss: $(cat "$TMP/err")"
"$NOPAD_CLI" train "${E[@]}" --output "$TMP/evl" --eval-every 6 --resume "$TMP/evl" >"$TMP/out" \
    2>"$TMP/err" || fail "--best-metric loss resumed: $(cat "$TMP/err")"
grep -q "^best: step 65 of 11 evaluations, eval loss " "$TMP/out" ||
    fail "--best-metric loss resumed without it: $(tail -n 1 "$TMP/out")"

# --eval-every epoch: at steps 8, 16 and 24; a run stopped on an epoch's last step (8) evaluates
# that epoch's end when resumed, so its log equals the run that did not stop.
"$NOPAD_CLI" train "${R[@]}" --eval "$D/cls_eval.jsonl" --output "$TMP/evep" --eval-every epoch \
    --log "$TMP/evep.jsonl" >/dev/null 2>"$TMP/err" || fail "--eval-every epoch: $(cat "$TMP/err")"
"$NOPAD_CLI" train "${R[@]}" --eval "$D/cls_eval.jsonl" --output "$TMP/evep8" --eval-every epoch \
    --stop-after 8 --log "$TMP/evep8a.jsonl" >/dev/null 2>"$TMP/err" || fail "--eval-every epoch: $(cat "$TMP/err")"
"$NOPAD_CLI" train "${R[@]}" --eval "$D/cls_eval.jsonl" --output "$TMP/evep8" --eval-every epoch \
    --resume "$TMP/evep8" --log "$TMP/evep8b.jsonl" >/dev/null 2>"$TMP/err" ||
    fail "--eval-every epoch resumed: $(cat "$TMP/err")"
python3 - "$TMP" <<'PY' || fail "--eval-every epoch: not at the epochs' ends, or the resumed run differs"
import json, sys
tmp = sys.argv[1]
log = [json.loads(l) for l in open(f"{tmp}/evep.jsonl")]
assert [(r["step"], r["epoch"]) for r in log if "eval_loss" in r] == [(8, 0), (16, 1), (24, 2)]
assert open(f"{tmp}/evep8a.jsonl").read() + open(f"{tmp}/evep8b.jsonl").read() == \
    open(f"{tmp}/evep.jsonl").read()
print("ok   --eval-every epoch: steps 8, 16, 24; stopped at 8 and resumed, the same log")
PY

# Masked LM by the eval loss (lower is better), at a learning rate high enough that it rises
# again: evaluations every 5 steps and at the last (64); the best is neither the first nor the
# last, best/ holds its weights (a run stopped there prints the same eval loss); --early-stop 3
# stops at the third evaluation in a row without a new best, saying so, and a resume of that
# checkpoint stays stopped.
M=(--model "$TMP/mlm" --task mlm --data "$TMP/cls_train.txt" --eval "$TMP/cls_eval.txt" --epochs 8
   --batch-tokens 64 --lr 2e-2 --warmup 0 --threads 2 --quiet)
"$NOPAD_CLI" train "${M[@]}" --output "$TMP/evm" --eval-every 5 --save-best >"$TMP/evm.out" \
    2>"$TMP/err" || fail "mlm --eval-every: $(cat "$TMP/err")"
mbest=$(python3 - "$TMP/evm.out" <<'PY'
import re, sys
out = open(sys.argv[1]).read().splitlines()
evals = [(int(m.group(1)), float(m.group(2))) for m in
         (re.match(r"eval at step (\d+) \(epoch \d+\): loss ([0-9.]+)", l) for l in out) if m]
assert [s for s, _ in evals] == list(range(5, 61, 5)) + [64], evals
losses = [x for _, x in evals]
i = losses.index(min(losses))
assert 0 < i < len(evals) - 1, evals  # neither the first nor the last
assert any(losses[j] > losses[j - 1] for j in range(1, i)), evals  # it rose on the way
assert f"best: step {evals[i][0]} of 13 evaluations, eval loss {losses[i]:.6f}" in out[-1], out[-1]
# where --early-stop 3 stops: the third evaluation in a row not below the best before it
run = 0
for j in range(1, len(losses)):
    run = 0 if losses[j] < min(losses[:j]) else run + 1
    if run == 3:
        break
assert run == 3, losses
print(evals[i][0], "%.4f" % losses[i], evals[j][0], evals[losses[:j].index(min(losses[:j]))][0])
PY
) || fail "mlm --eval-every: $(cat "$TMP/evm.out")"
if [ -n "$mbest" ]; then
    read -r mstep mloss stopped sbest <<<"$mbest"
    echo "ok   mlm --eval-every 5: the best eval loss $mloss at step $mstep"
    "$NOPAD_CLI" train "${M[@]}" --output "$TMP/evm_at" --stop-after "$mstep" >"$TMP/out" 2>"$TMP/err" ||
        fail "mlm: the run stopped at $mstep: $(cat "$TMP/err")"
    grep -qx "eval loss: $mloss" "$TMP/out" || fail "mlm: stopped at $mstep: $(cat "$TMP/out"), expected $mloss"
    cmp -s "$TMP/evm/best/model.safetensors" "$TMP/evm_at/model.safetensors" ||
        fail "mlm --save-best: best/ does not hold step $mstep's weights"
    grep -q BertForMaskedLM "$TMP/evm/best/config.json" || fail "mlm --save-best: best/config.json"
    "$NOPAD_CLI" train "${M[@]}" --output "$TMP/eve" --eval-every 5 --early-stop 3 >"$TMP/eve.out" \
        2>"$TMP/err" || fail "--early-stop: $(cat "$TMP/err")"
    grep -qx "stopped early at step $stopped: 3 evaluations without improving on step $sbest's" \
        "$TMP/eve.out" || fail "--early-stop 3: $(cat "$TMP/eve.out"), expected a stop at $stopped"
    grep -q "\"step\":[[:space:]]*$stopped," "$TMP/eve/trainer_state.json" ||
        fail "--early-stop: the checkpoint is not at step $stopped"
    "$NOPAD_CLI" train "${M[@]}" --output "$TMP/eve" --resume "$TMP/eve" --eval-every 5 --early-stop 3 \
        >"$TMP/eve2.out" 2>"$TMP/err" || fail "--early-stop resumed: $(cat "$TMP/err")"
    { grep -q "stopped early at step $stopped" "$TMP/eve2.out" &&
        grep -q "\"step\":[[:space:]]*$stopped," "$TMP/eve/trainer_state.json"; } ||
        fail "--early-stop resumed: it trained on: $(cat "$TMP/eve2.out")"
    echo "ok   --early-stop 3: stopped at step $stopped, 3 evaluations after the best (step $sbest)"
fi

# ---- --stream: the data read a window at a time, resumed as a run that did not stop ------------
# cls_train.jsonl (2.6 KB) in windows of 1 KiB (16 blocks of 64 bytes, cut mid-line): 3 windows
# an epoch; stopped after step 5 (inside a window) and 12, resumed, every step equal bit for bit.
S=("${R[@]}" --stream --stream-buffer 1k)
"$NOPAD_CLI" train "${S[@]}" --output "$TMP/sstraight" --log "$TMP/sstraight.jsonl" 2>"$TMP/err" ||
    fail "--stream: the straight run: $(cat "$TMP/err")"
grep -q '"stream_buffer":[[:space:]]*1024' "$TMP/sstraight/trainer_state.json" ||
    fail "--stream: the checkpoint does not record the stream buffer"
for k in 5 12; do
    "$NOPAD_CLI" train "${S[@]}" --output "$TMP/spart$k" --stop-after $k --log "$TMP/spart${k}a.jsonl" \
        2>"$TMP/err" || fail "--stream: the first $k steps: $(cat "$TMP/err")"
    "$NOPAD_CLI" train "${S[@]}" --output "$TMP/spart$k" --resume "$TMP/spart$k" \
        --log "$TMP/spart${k}b.jsonl" 2>"$TMP/err" || fail "--stream: resumed after step $k: $(cat "$TMP/err")"
    python3 - "$TMP" $k <<'PY' || fail "--stream: resumed after step $k: the curves differ"
import json, sys
tmp, k = sys.argv[1], int(sys.argv[2])
def steps(*names):
    return [(r["step"], repr(r["loss"]), r["lr"], r["tokens"]) for n in names
            for r in map(json.loads, open(f"{tmp}/{n}.jsonl"))]
straight, parts = steps("sstraight"), steps(f"spart{k}a", f"spart{k}b")
plain = steps("straight")
assert len(straight) > k + 8 and [s[0] for s in straight] == list(range(1, len(straight) + 1))
assert parts == straight, f"resumed {parts[k:k + 2]}, straight {straight[k:k + 2]}"
# the same examples in another order: the tokens of the run equal the in-memory run's
assert sum(s[3] for s in straight) == sum(s[3] for s in plain), "the streamed epochs miss tokens"
weights = [open(f"{tmp}/{d}/model.safetensors", "rb").read() for d in ("sstraight", f"spart{k}")]
assert weights[0] == weights[1], "the end weights differ"
print(f"ok   --stream resume after step {k}: {len(straight)} steps equal bit for bit")
PY
done
# a streamed checkpoint resumed in memory, or with another buffer: errors naming both values
expect_stream_resume_fail() {
    local word="$1"
    shift
    local rc=0
    "$NOPAD_CLI" train "$@" --output "$TMP/o6" --resume "$TMP/spart5" >"$TMP/out" 2>"$TMP/err" || rc=$?
    if [ "$rc" -ne 1 ] || ! grep -qF -- "$word" "$TMP/err"; then
        fail "resume with $*: exit $rc, expected 1 and '$word'; stderr: $(cat "$TMP/err")"
    else
        echo "ok   $word: $(head -n 1 "$TMP/err")"
    fi
}
expect_stream_resume_fail "stream buffer (0: the data held in memory) 0, but the checkpoint's is 1024" "${R[@]}"
expect_stream_resume_fail "stream buffer (0: the data held in memory) 2048, but the checkpoint's is 1024" \
    "${R[@]}" --stream --stream-buffer 2k
# MLM streamed, with an eval file held in memory
"$NOPAD_CLI" train --model "$TMP/mlm" --task mlm --data "$TMP/cls_train.txt" --eval "$TMP/cls_eval.txt" \
    --output "$TMP/o7" --epochs 2 --batch-tokens 64 --stream --stream-buffer 1k >"$TMP/stdout" \
    2>"$TMP/err" || fail "--stream mlm: $(cat "$TMP/err")"
grep -q '^eval loss: [0-9]' "$TMP/stdout" || fail "--stream mlm: no eval loss: $(cat "$TMP/stdout")"
grep -q 'on 64 examples (0 truncated, streamed)' "$TMP/err" || fail "--stream mlm: $(tail -n 1 "$TMP/err")"

# data over 1 GiB streams by default and says so: a sparse file of 1.1 GiB of NUL bytes, one line
# longer than the 64 MiB window, refused after reading 65 MiB of it
truncate -s 1100M "$TMP/huge.txt"
rc=0
"$NOPAD_CLI" train --model "$TMP/mlm" --task mlm --data "$TMP/huge.txt" --output "$TMP/o8" \
    2>"$TMP/err" || rc=$?
{ [ "$rc" -eq 1 ] && grep -q "huge.txt is 1.1 GiB: streaming it in windows of 64 MiB" "$TMP/err" &&
    grep -q "line 1 is longer than the stream's window of 67108864 bytes" "$TMP/err"; } ||
    fail "data over 1 GiB: exit $rc: $(cat "$TMP/err")"
rm -f "$TMP/huge.txt"

# ---- --log-batches: each step's batch, as the HF replay (scripts/train_curve_hf.py) reads it ----
"$NOPAD_CLI" train --model "$TMP/mlm" --task mlm --data "$TMP/cls_train.txt" --output "$TMP/o4" \
    --epochs 1 --batch-tokens 64 --quiet --log "$TMP/batches.jsonl" --log-batches 2>"$TMP/err" ||
    fail "--log-batches: $(cat "$TMP/err")"
python3 - "$TMP/batches.jsonl" <<'PY' || fail "--log-batches: malformed lines"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert rows and all(r["step"] == i + 1 for i, r in enumerate(rows))
for r in rows:
    cu, ids = r["cu_seqlens"], r["input_ids"]
    assert cu[0] == 0 and cu[-1] == len(ids) == r["tokens"] and len(r["token_type_ids"]) == len(ids)
    assert len(r["mlm_positions"]) == len(r["mlm_labels"]) >= 1
    assert all(0 <= p < len(ids) for p in r["mlm_positions"])
print(f"--log-batches: {len(rows)} steps, {sum(r['tokens'] for r in rows)} tokens")
PY

# ---- --device cuda: runs where the build has CUDA training, else a clear error ------------------
rc=0
"$NOPAD_CLI" train "${R[@]}" --output "$TMP/o5" --device cuda --epochs 1 2>"$TMP/err" || rc=$?
if [ "$rc" -ne 0 ]; then
    { [ "$rc" -eq 1 ] && grep -qE "no CUDA backend|the cuda backend has no [a-z_0-9]+ op" "$TMP/err"; } ||
        fail "--device cuda: exit $rc without a clear error: $(cat "$TMP/err")"
    echo "ok   --device cuda: $(head -n 1 "$TMP/err")"
fi

# ---- bad input ------------------------------------------------------------------------------------
# expect_fail WANT_RC WORD ARGS...: `nopad train ARGS` exits WANT_RC with WORD on stderr.
expect_fail() {
    local want="$1" word="$2"
    shift 2
    local rc=0
    "$NOPAD_CLI" train "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "nopad train $*: exit $rc, expected $want; stderr: $(head -c 2000 "$TMP/err")"
    elif ! grep -qiF -- "$word" "$TMP/err"; then
        fail "nopad train $*: stderr lacks '$word': $(head -c 2000 "$TMP/err")"
    else
        echo "ok   $word: $(head -n 1 "$TMP/err")"
    fi
}
printf '{"text": "aa ab", "label": 0}\n{"text": "ba bb", "label": 5}\n' >"$TMP/bad_label.jsonl"
printf '{"text": "aa ab", "label": 0}\nnot json\n' >"$TMP/bad_json.jsonl"
: >"$TMP/empty.jsonl"
C=(--model "$TMP/bare" --task classify --num-labels 2 --output "$TMP/o")
expect_fail 1 "whole_word_mask 1; it is 0 or 1, and 1 is for masked-LM" "${C[@]}" --data "$D/cls_train.jsonl" \
    --whole-word-mask
expect_fail 1 "pack_lines packs the data held in memory; it does not stream yet" --model "$TMP/mlm" --task mlm \
    --data "$TMP/cls_train.txt" --output "$TMP/o" --pack-lines --stream
expect_fail 2 "missing --task" --model "$TMP/bare" --data "$D/cls_train.jsonl" --output "$TMP/o"
expect_fail 2 "missing --data" --model "$TMP/bare" --task mlm --output "$TMP/o"
expect_fail 2 "unknown task 'ner'" --model "$TMP/bare" --task ner --data "$D/cls_train.jsonl" --output "$TMP/o"
expect_fail 2 "--num-labels is for --task classify" --model "$TMP/mlm" --task mlm --num-labels 2 \
    --data "$TMP/cls_train.txt" --output "$TMP/o"
expect_fail 2 "--lr" "${C[@]}" --data "$D/cls_train.jsonl" --lr 0
expect_fail 2 "--warmup" "${C[@]}" --data "$D/cls_train.jsonl" --warmup 1.5
expect_fail 2 "--dropout 1: expected a rate in [0, 1)" "${C[@]}" --data "$D/cls_train.jsonl" --dropout 1
expect_fail 2 "--attention-dropout 1: expected a rate in [0, 1) (0: off)" "${C[@]}" --data "$D/cls_train.jsonl" \
    --attention-dropout 1
expect_fail 2 "--attention-dropout -0.1: expected a rate in [0, 1)" "${C[@]}" --data "$D/cls_train.jsonl" \
    --attention-dropout -0.1
expect_fail 2 "--epochs" "${C[@]}" --data "$D/cls_train.jsonl" --epochs 0
expect_fail 2 "unknown optimizer 'sgd'" "${C[@]}" --data "$D/cls_train.jsonl" --optimizer sgd
expect_fail 2 "--bogus" "${C[@]}" --data "$D/cls_train.jsonl" --bogus
expect_fail 1 "$TMP/missing.jsonl" "${C[@]}" --data "$TMP/missing.jsonl"
expect_fail 1 "--eval" "${C[@]}" --data "$D/cls_train.jsonl" --eval "$TMP/missing.jsonl"
expect_fail 1 "--num-labels" --model "$TMP/bare" --task classify --data "$D/cls_train.jsonl" --output "$TMP/o"
expect_fail 1 "line 2" "${C[@]}" --data "$TMP/bad_label.jsonl"
expect_fail 1 "line 2" "${C[@]}" --data "$TMP/bad_json.jsonl"
expect_fail 1 "$TMP/empty.jsonl" "${C[@]}" --data "$TMP/empty.jsonl"
expect_fail 1 "$TMP/nope" --model "$TMP/nope" --task mlm --data "$TMP/cls_train.txt" --output "$TMP/o"
expect_fail 1 "/nonexistent/a/b" --model "$TMP/mlm" --task mlm --data "$TMP/cls_train.txt" \
    --output /nonexistent/a/b --epochs 1 --quiet
expect_fail 2 "unknown device 'tpu'" "${C[@]}" --data "$D/cls_train.jsonl" --device tpu
expect_fail 2 "--dtype bf16: the CPU trains in fp32" "${C[@]}" --data "$D/cls_train.jsonl" --dtype bf16
expect_fail 2 "--log-batches needs --log" "${C[@]}" --data "$D/cls_train.jsonl" --log-batches
expect_fail 2 "--stop-after" "${C[@]}" --data "$D/cls_train.jsonl" --stop-after 0
expect_fail 2 "--stream-buffer 100: expected a size of at least 1024" "${C[@]}" --data "$D/cls_train.jsonl" \
    --stream --stream-buffer 100
expect_fail 2 "--stream-buffer 4X" "${C[@]}" --data "$D/cls_train.jsonl" --stream-buffer 4X
expect_fail 1 "bad_label.jsonl: line 2: label 5 out of range" "${C[@]}" --data "$TMP/bad_label.jsonl" --stream
expect_fail 1 "empty.jsonl: no training example" "${C[@]}" --data "$TMP/empty.jsonl" --stream
EV=("${C[@]}" --data "$D/cls_train.jsonl" --eval "$D/cls_eval.jsonl")
expect_fail 2 "--eval-every 0: expected a number of steps >= 1, or 'epoch'" "${EV[@]}" --eval-every 0
expect_fail 2 "--eval-every 2x: expected a number of steps" "${EV[@]}" --eval-every 2x
expect_fail 2 "--eval-every needs --eval FILE" "${C[@]}" --data "$D/cls_train.jsonl" --eval-every 5
expect_fail 2 "--save-best needs --eval FILE" "${C[@]}" --data "$D/cls_train.jsonl" --save-best
expect_fail 2 "--save-best needs --eval-every N|epoch" "${EV[@]}" --save-best
expect_fail 2 "--early-stop needs --eval-every N|epoch" "${EV[@]}" --early-stop 2
expect_fail 2 "--early-stop expects an integer in [1," "${EV[@]}" --eval-every 5 --early-stop 0
expect_fail 2 "--early-stop-min-delta needs --early-stop K" "${EV[@]}" --eval-every 5 --early-stop-min-delta 0.1
expect_fail 2 "--early-stop-min-delta -1: expected a number >= 0" "${EV[@]}" --eval-every 5 --early-stop 2 \
    --early-stop-min-delta -1
expect_fail 2 "unknown --best-metric 'f1' (expected loss or accuracy)" "${EV[@]}" --eval-every 5 --best-metric f1
expect_fail 2 "--best-metric accuracy is for --task classify" --model "$TMP/mlm" --task mlm \
    --data "$TMP/cls_train.txt" --eval "$TMP/cls_eval.txt" --output "$TMP/o" --eval-every 5 --best-metric accuracy
expect_fail 1 "best_metric accuracy, but a one-label head (regression) has only an eval loss" \
    --model "$TMP/bare" --task classify --num-labels 1 --data "$D/cls_train.jsonl" \
    --eval "$D/cls_eval.jsonl" --output "$TMP/o" --eval-every 5 --best-metric accuracy
expect_fail 1 "$TMP/nodir/log.jsonl" "${C[@]}" --data "$D/cls_train.jsonl" --log "$TMP/nodir/log.jsonl"
expect_fail 2 "--output '': expected a folder's path" --model "$TMP/bare" --task mlm --data "$TMP/cls_train.txt" --output ''
expect_fail 2 "--resume '': expected a folder's path" "${C[@]}" --data "$D/cls_train.jsonl" --resume ''
expect_fail 1 "output_dir $D/cls_train.jsonl is a file, not a folder" --model "$TMP/bare" --task classify \
    --num-labels 2 --data "$D/cls_train.jsonl" --output "$D/cls_train.jsonl"
cd "$TMP"  # an --output the run stands in would be removed from under it by the first save
expect_fail 1 "holds the current folder" "${C[@]}" --data "$D/cls_train.jsonl" --output "$TMP"
expect_fail 1 "'.': expected a folder's name" "${C[@]}" --data "$D/cls_train.jsonl" --output .
cd - >/dev/null
cp "$D/cls_train.jsonl" "$TMP/data_copy.jsonl"
expect_fail 2 "is the --data file" "${C[@]}" --data "$TMP/data_copy.jsonl" --log "$TMP/data_copy.jsonl"
cmp -s "$TMP/data_copy.jsonl" "$D/cls_train.jsonl" || fail "--log naming --data changed the data"

finish cli_train
