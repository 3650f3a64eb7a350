#!/usr/bin/env bash
# Data-parallel scaling of `nopad train` (issue 41): BERT-large masked LM (24 layers, hidden 1024,
# 16 heads, FFN 4096, 512 positions, random weights, dropout 0), lengths uniform in [102, 512]
# tokens, 32 sequences a GPU a step (weak scaling: the global batch grows with the GPUs), bf16
# compute, AdamW, on 1, 2, 4 and 8 GPUs of one machine, with the length-balancing exchange on and
# off, and on one GPU also through the data-parallel path with its collectives (NOPAD_COMM_FORCE=1:
# a world of one whose all-reduces run through NCCL, the path's own cost; the issue's bound is 1%
# slower than the plain run). For each run: useful tokens per second (real tokens; there is no padding) over the steps
# after a warm-up, the scaling efficiency against one GPU, and the exchange's balance line (the
# most loaded GPU's tokens over the mean, as read and as computed).
#
#   bench/train_scaling.sh NOPAD [OUT]     NOPAD: a CUDA + MPI build's nopad (cmake -DNOPAD_CUDA=ON)
#
# Needs python3 with torch and transformers (the random checkpoint: scripts/make_random_bert.py),
# all-MiniLM-L6-v2's tokenizer ($NOPAD_MINILM_DIR; BERT's uncased WordPiece, 30522 ids) and
# mpirun. GPUS="1 2 4 8" (default: those up to nvidia-smi's count), STEPS (timed, default 50),
# WARMUP (default 10), ROUNDS (one GPU's plain and forced runs alternated, default 1). Writes
# OUT/train_scaling.jsonl (a line a run) and prints a table.
#
# The time of a step: two runs of the same command stopped after WARMUP and after WARMUP + STEPS
# steps (--stop-after), the difference of their wall times over STEPS, so that start-up (MPI, the
# model load, tokenizing, counting the steps, the final save) cancels; the tokens of those steps
# from the longer run's --log.
set -euo pipefail
NOPAD=$(readlink -f "${1:?usage: bench/train_scaling.sh NOPAD [OUT]}")
OUT=$(mkdir -p "${2:-train_scaling_out}" && cd "${2:-train_scaling_out}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOK=${NOPAD_MINILM_DIR:-$HOME/.cache/nopad/all-MiniLM-L6-v2}
STEPS=${STEPS:-50}
WARMUP=${WARMUP:-10}
if [ -z "${GPUS:-}" ]; then
    have=$(nvidia-smi -L | wc -l)
    GPUS=""
    for n in 1 2 4 8; do [ "$n" -le "$have" ] && GPUS="$GPUS $n"; done
fi
max_gpus=1
for n in $GPUS; do [ "$n" -gt "$max_gpus" ] && max_gpus=$n; done

# the model, the data and the checkpoints in a scratch folder (OUT keeps the logs and JSON alone:
# BERT-large's 1.3 GB would not come back from a device call)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# the model: BERT-large, random, with MiniLM's tokenizer files
MODEL="$WORK/bert_large"
python3 "$ROOT/scripts/make_random_bert.py" "$MODEL" --hidden 1024 --heads 16 --layers 24 \
    --ffn 4096 --vocab 30522 --positions 512 --seed 0 >/dev/null
for f in tokenizer.json vocab.txt tokenizer_config.json special_tokens_map.json; do
    [ -f "$TOK/$f" ] && cp "$TOK/$f" "$MODEL/"
done

# the data: lines of L - 2 words that are one WordPiece token each ([CLS] and [SEP] make L),
# L uniform in [102, 512] from a fixed seed; enough lines for the longest run on the most GPUs
DATA="$WORK/lines_102_512.txt"
LINES=$((32 * max_gpus * (WARMUP + STEPS + 5)))
python3 - "$MODEL/vocab.txt" "$DATA" "$LINES" <<'PY'
import random, sys
vocab, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
words = [w for w in (l.rstrip("\n") for l in open(vocab, encoding="utf-8"))
         if w.isalpha() and w.isascii() and w.islower() and len(w) >= 3]
rng = random.Random(102512)
with open(out, "w") as f:
    for _ in range(n):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(102, 512) - 2)) + "\n")
PY

has_no_exchange=0
"$NOPAD" train --help | grep -q -- "--no-exchange" && has_no_exchange=1
[ "$has_no_exchange" = 1 ] || echo "note: this nopad has no --no-exchange; only the exchange-on runs are timed" >&2

# run N MODE STOP LOG: prints the wall seconds of `nopad train --nproc N` stopped after STOP;
# MODE on / off (the exchange), plain or forced (one GPU, NOPAD_COMM_FORCE=1)
run() {
    local n=$1 mode=$2 stop=$3 log=$4 flags=() force=0
    [ "$mode" = off ] && flags+=(--no-exchange)
    [ "$mode" = forced ] && force=1
    rm -rf "$WORK/ckpt"
    local t0 t1
    t0=$(date +%s.%N)
    NOPAD_COMM_FORCE=$force "$NOPAD" train --model "$MODEL" --task mlm --data "$DATA" --output "$WORK/ckpt" --device cuda \
        --dtype bf16 --epochs 1 --lr 1e-4 --warmup 0 --batch-tokens $((32 * 512)) --batch-seqs 32 \
        --dropout 0 --seed 1 --nproc "$n" --stop-after "$stop" --log "$log" "${flags[@]}" \
        2>"$log.err" >/dev/null
    t1=$(date +%s.%N)
    python3 -c "print($t1 - $t0)"
}

RESULTS="$OUT/train_scaling.jsonl"
: >"$RESULTS"
for n in $GPUS; do
    modes="on off"
    # nothing to exchange on one GPU: the plain and the forced path, alternated ROUNDS times
    [ "$n" = 1 ] && modes=$(for r in $(seq "${ROUNDS:-1}"); do printf 'plain:%d forced:%d ' "$r" "$r"; done)
    for mode in $modes; do
        exchange=${mode%:*} round=${mode#*:}
        [ "$round" = "$mode" ] && round=1
        [ "$exchange" = off ] && [ "$has_no_exchange" = 0 ] && continue
        log="$OUT/long_${n}_${exchange}_r$round.log"
        short=$(run "$n" "$exchange" "$WARMUP" "$OUT/short.log")
        long=$(run "$n" "$exchange" $((WARMUP + STEPS)) "$log")
        balance=$(grep -h "data-parallel over" "$log.err" || true)
        python3 - "$RESULTS" "$n" "$exchange" "$short" "$long" "$WARMUP" "$STEPS" "$log" "$balance" "$round" <<'PY'
import json, re, sys
out, n, exchange, short, long_, warmup, steps, log, balance, round_ = sys.argv[1:]
lines = [json.loads(l) for l in open(log) if '"loss"' in l]
timed = [l for l in lines if l["step"] > int(warmup)]
assert len(timed) == int(steps), "the log has %d timed steps" % len(timed)
tokens = sum(l["tokens"] for l in timed)
seconds = float(long_) - float(short)
# the trainer's own rate over the whole run (warm-up steps included, start-up not): a check on the
# wall-time difference, which a start-up that varies by more than the timed steps take can upset
rates = re.findall(r"([0-9.]+) tokens/s", open(log + ".err").read())
rec = {"gpus": int(n), "exchange": exchange, "round": int(round_), "steps": int(steps), "tokens": tokens,
       "seconds": seconds, "tokens_per_s": tokens / seconds, "step_ms": 1000 * seconds / int(steps),
       "trainer_tokens_per_s": float(rates[-1]) if rates else None, "balance": balance}
if timed and "rank_tokens_max_before" in timed[0]:
    total = sum(l["tokens"] for l in timed)
    rec["max_over_mean_before"] = sum(l["rank_tokens_max_before"] for l in timed) * int(n) / total
    rec["max_over_mean_after"] = sum(l["rank_tokens_max"] for l in timed) * int(n) / total
open(out, "a").write(json.dumps(rec) + "\n")
PY
    done
done

# one GPU: the forced run computes what the plain run computes (a world of one sums nothing), but
# CUDA's backward adds some gradients with float atomics (attention's dQ, the LayerNorm parameters,
# the embedding rows), so no two runs are equal bit for bit after the first update: the first
# step's loss must be equal, and the later differences are printed beside two plain runs' own
if [ -f "$OUT/long_1_plain_r1.log" ] && [ -f "$OUT/long_1_forced_r1.log" ]; then
    python3 - "$OUT"/long_1_plain_r1.log "$OUT"/long_1_forced_r1.log "$OUT"/long_1_plain_r2.log <<'PY'
import json, os, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l] if os.path.exists(p) else None
a, b, c = (losses(p) for p in sys.argv[1:4])
def apart(x, y):
    return max(abs(u - v) / abs(u) for u, v in zip(x, y))
print("one GPU: first step's loss %s; plain against forced at most %.2e relative over %d steps%s" % (
      "equal" if a[0] == b[0] else "DIFFERS", apart(a, b), len(a),
      "; two plain runs %.2e" % apart(a, c) if c else ""))
sys.exit(0 if a[0] == b[0] else 1)
PY
fi

python3 - "$RESULTS" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
one = next((r["tokens_per_s"] for r in runs if r["gpus"] == 1 and r["exchange"] == "plain"), None)
print("%-5s %-8s %12s %9s %11s %14s %16s" % ("GPUs", "mode", "tokens/s", "step ms", "efficiency",
                                              "max/mean b->a", "trainer tokens/s"))
for r in runs:
    eff = r["tokens_per_s"] / (one * r["gpus"]) if one else float("nan")
    bal = "%.3f -> %.3f" % (r["max_over_mean_before"], r["max_over_mean_after"]) \
        if "max_over_mean_before" in r else "-"
    print("%-5d %-8s %12.0f %9.1f %10.1f%% %14s %16.0f" % (r["gpus"], r["exchange"], r["tokens_per_s"],
                                                          r["step_ms"], 100 * eff, bal,
                                                          r["trainer_tokens_per_s"] or float("nan")))
PY
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
echo "results: $RESULTS"
