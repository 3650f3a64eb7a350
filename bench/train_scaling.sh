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
# WARMUP (default 10). Writes OUT/train_scaling.jsonl (a line a run) and prints a table.
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

# the model: BERT-large, random, with MiniLM's tokenizer files
MODEL="$OUT/bert_large"
python3 "$ROOT/scripts/make_random_bert.py" "$MODEL" --hidden 1024 --heads 16 --layers 24 \
    --ffn 4096 --vocab 30522 --positions 512 --seed 0 >/dev/null
for f in tokenizer.json vocab.txt tokenizer_config.json special_tokens_map.json; do
    [ -f "$TOK/$f" ] && cp "$TOK/$f" "$MODEL/"
done

# the data: lines of L - 2 words that are one WordPiece token each ([CLS] and [SEP] make L),
# L uniform in [102, 512] from a fixed seed; enough lines for the longest run on the most GPUs
DATA="$OUT/lines_102_512.txt"
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
    rm -rf "$OUT/ckpt"
    local t0 t1
    t0=$(date +%s.%N)
    NOPAD_COMM_FORCE=$force "$NOPAD" train --model "$MODEL" --task mlm --data "$DATA" --output "$OUT/ckpt" --device cuda \
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
    [ "$n" = 1 ] && modes="plain forced" # nothing to exchange on one GPU
    for exchange in $modes; do
        [ "$exchange" = off ] && [ "$has_no_exchange" = 0 ] && continue
        short=$(run "$n" "$exchange" "$WARMUP" "$OUT/short.log")
        long=$(run "$n" "$exchange" $((WARMUP + STEPS)) "$OUT/long_${n}_$exchange.log")
        balance=$(grep -h "data-parallel over" "$OUT/long_${n}_$exchange.log.err" || true)
        python3 - "$RESULTS" "$n" "$exchange" "$short" "$long" "$WARMUP" "$STEPS" "$OUT/long_${n}_$exchange.log" "$balance" <<'PY'
import json, sys
out, n, exchange, short, long_, warmup, steps, log, balance = sys.argv[1:]
lines = [json.loads(l) for l in open(log) if '"loss"' in l]
timed = [l for l in lines if l["step"] > int(warmup)]
assert len(timed) == int(steps), "the log has %d timed steps" % len(timed)
tokens = sum(l["tokens"] for l in timed)
seconds = float(long_) - float(short)
rec = {"gpus": int(n), "exchange": exchange, "steps": int(steps), "tokens": tokens,
       "seconds": seconds, "tokens_per_s": tokens / seconds, "step_ms": 1000 * seconds / int(steps),
       "balance": balance}
if timed and "rank_tokens_max_before" in timed[0]:
    total = sum(l["tokens"] for l in timed)
    rec["max_over_mean_before"] = sum(l["rank_tokens_max_before"] for l in timed) * int(n) / total
    rec["max_over_mean_after"] = sum(l["rank_tokens_max"] for l in timed) * int(n) / total
open(out, "a").write(json.dumps(rec) + "\n")
PY
    done
done

# one GPU: the forced run is the plain run's arithmetic (a world of one sums nothing): equal losses
if [ -f "$OUT/long_1_plain.log" ] && [ -f "$OUT/long_1_forced.log" ]; then
    python3 - "$OUT/long_1_plain.log" "$OUT/long_1_forced.log" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
same = a == b
print("one GPU, plain against forced: %d and %d steps, losses %s" % (len(a), len(b),
      "identical" if same else "differ (max %.3g)" % max(abs(x - y) for x, y in zip(a, b))))
sys.exit(0 if same else 1)
PY
fi

python3 - "$RESULTS" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
one = next((r["tokens_per_s"] for r in runs if r["gpus"] == 1 and r["exchange"] == "plain"), None)
print("%-5s %-8s %12s %9s %11s %14s" % ("GPUs", "mode", "tokens/s", "step ms", "efficiency",
                                         "max/mean b->a"))
for r in runs:
    eff = r["tokens_per_s"] / (one * r["gpus"]) if one else float("nan")
    bal = "%.3f -> %.3f" % (r["max_over_mean_before"], r["max_over_mean_after"]) \
        if "max_over_mean_before" in r else "-"
    print("%-5d %-8s %12.0f %9.1f %10.1f%% %14s" % (r["gpus"], r["exchange"], r["tokens_per_s"],
                                                   r["step_ms"], 100 * eff, bal))
PY
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
echo "results: $RESULTS"
