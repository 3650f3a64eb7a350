#!/usr/bin/env bash
# `--tp N` end to end on the CPU (docs/parallel.md): the split model must answer exactly as one
# process does. `nopad generate --tp 2` restarting itself under mpirun and `mpirun -np 4 ... --tp 4`
# (key/value heads replicated) on a tiny LLaMA, greedy, prompt by prompt and through the engine
# (request-file mode); `mpirun -np 3 ... --tp 3` on SmolLM2 (9 heads, 3 key/value heads) and its
# refusal of --tp 2; `nopad embed --tp 2` on a tiny BERT within 1e-5; `nopad serve --tp 2` with a
# greedy /v1/completions and a SIGTERM to rank 0 ending every rank; and the errors: no mpirun, a
# world of another size, a bad --tp. Needs Open MPI's mpirun (skipped without it, after the
# checks that need none); the SmolLM2 part needs NOPAD_SMOLLM2_GGUF.
set -euo pipefail

: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
MODELS="$NOPAD_TEST_DATA/models"
GGUF="${NOPAD_SMOLLM2_GGUF:-}"
# Two threads per rank on CI's two cores would put four busy threads on them.
THREADS=(--threads 1)

failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
ok() { echo "ok   $*"; }
# expect_fail WANT_RC WORD ARGS...: `nopad ARGS`, with the variables of NOPAD_ENV (VAR=VALUE
# words) in its environment, must exit WANT_RC with WORD on stderr and nothing on stdout.
NOPAD_ENV=()
expect_fail() {
    local want="$1" word="$2" rc=0
    shift 2
    env "${NOPAD_ENV[@]}" "$NOPAD_CLI" "$@" </dev/null >"$TMP/out" 2>"$TMP/err" || rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "nopad $*: exit $rc, expected $want; stderr: $(head -c 2000 "$TMP/err")"
    elif ! grep -qF -- "$word" "$TMP/err"; then
        fail "nopad $*: stderr lacks '$word': $(head -c 2000 "$TMP/err")"
    elif [ -s "$TMP/out" ]; then
        fail "nopad $*: wrote to stdout: $(head -c 300 "$TMP/out")"
    else
        ok "$word: $(grep -m1 'error' "$TMP/err")"
    fi
}
# run OUT ARGS...: `nopad ARGS > OUT` (or a launcher's command line when ARGS starts with mpirun),
# which must succeed.
run() {
    local out="$1" rc=0
    shift
    if [ "$1" = mpirun ]; then
        "$@" >"$out" 2>"$TMP/err" </dev/null || rc=$?
    else
        "$NOPAD_CLI" "$@" >"$out" 2>"$TMP/err" </dev/null || rc=$?
    fi
    [ "$rc" -eq 0 ] || fail "$*: exit $rc: $(head -c 2000 "$TMP/err")"
}
# same NAME GOT WANT: the two files must be equal and not empty.
same() {
    if [ ! -s "$3" ]; then
        fail "$1: the reference output is empty"
    elif cmp -s "$2" "$3"; then
        ok "$1"
    else
        fail "$1: output differs (first difference below)"
        diff "$2" "$3" | head -n 6 >&2 || true
    fi
}

# ---- the command line, and the errors that need no mpirun ---------------------------------------
for cmd in generate embed serve; do
    "$NOPAD_CLI" "$cmd" --help >"$TMP/help" 2>&1 || true
    grep -q -- "--tp N .*split the model over N processes" "$TMP/help" || fail "$cmd --help lacks --tp"
done
# a tiny LLaMA (8 query heads, 2 key/value heads, FFN 160, 307 ids) with a byte-level BPE
# tokenizer, of which the prompts below use ids under 307 only
DEC="$TMP/tiny_llama"
mkdir -p "$DEC"
cp "$MODELS"/llama_gqa/{config.json,model.safetensors} "$DEC/"
cp "$NOPAD_TEST_DATA/tokenizer/bpe_gpt2.json" "$DEC/tokenizer.json"
GEN=(generate --model "$DEC" --max-tokens 24 --ignore-eos "${THREADS[@]}")
expect_fail 2 "--tp expects an integer in [1, 1024], got '0'" "${GEN[@]}" --prompt ab --tp 0
expect_fail 2 "--tp expects an integer" embed --model "$MODELS/bert_a" --tp two
NOPAD_ENV=(NOPAD_MPIRUN=/nonexistent PATH=/nonexistent)
expect_fail 1 "--tp 2 needs Open MPI's mpirun (NOPAD_MPIRUN=/nonexistent" "${GEN[@]}" --prompt ab --tp 2
NOPAD_ENV=(PATH=/nonexistent)
expect_fail 1 "--tp 2 needs Open MPI's mpirun (no mpirun on PATH" "${GEN[@]}" --prompt ab --tp 2
grep -qF "mpirun -np 2 nopad generate" "$TMP/err" || fail "the missing mpirun message names no launcher's command"
# a process that mpirun started but that sees no world must not start mpirun again
NOPAD_ENV=(NOPAD_TP_STARTED=2)
expect_fail 1 "sees no launcher's world" "${GEN[@]}" --prompt ab --tp 2
NOPAD_ENV=()
# --tp 1 is one process whatever the environment
run "$TMP/one_nompi.txt" "${GEN[@]}" --prompt ab --tp 1
NOPAD_MPIRUN=/nonexistent run "$TMP/tp1_explicit.txt" "${GEN[@]}" --prompt ab --tp 1
same "--tp 1 needs no mpirun and changes nothing" "$TMP/tp1_explicit.txt" "$TMP/one_nompi.txt"

MPIRUN="${NOPAD_MPIRUN:-$(command -v mpirun || true)}"
if [ -z "$MPIRUN" ]; then
    echo "SKIP: the --tp runs need Open MPI's mpirun (apt-get install openmpi-bin libopenmpi-dev)"
    [ "$failures" -eq 0 ] || exit 1
    exit 0
fi
LAUNCH=(mpirun --bind-to none --oversubscribe)
[ "$(id -u)" -eq 0 ] && LAUNCH+=(--allow-run-as-root)

# ---- generate on the tiny LLaMA: greedy ids equal to one process -------------------------------
printf 'ab\nx y z\nkq jv\n{}[]\n' >"$TMP/prompts.txt"
run "$TMP/one.txt" "${GEN[@]}" --input "$TMP/prompts.txt"
[ "$(wc -l <"$TMP/one.txt")" -ge 4 ] || fail "generate: fewer answers than prompts: $(cat "$TMP/one.txt")"
run "$TMP/tp2.txt" "${GEN[@]}" --input "$TMP/prompts.txt" --tp 2
same "generate --tp 2 (mpirun started by nopad) = one process" "$TMP/tp2.txt" "$TMP/one.txt"
run "$TMP/tp4.txt" "${LAUNCH[@]}" -np 4 "$NOPAD_CLI" "${GEN[@]}" --input "$TMP/prompts.txt" --tp 4
same "mpirun -np 4 generate --tp 4 (key/value heads replicated) = one process" "$TMP/tp4.txt" "$TMP/one.txt"
# the engine (request-file mode): JSON lines in completion order, compared by id
printf '{"id": 1, "prompt": "ab", "max_tokens": 20}\n{"id": 2, "prompt": "kq jv", "max_tokens": 9}\n{"id": 3, "prompt": "x y z", "max_tokens": 30}\n' >"$TMP/requests.jsonl"
REQ=(generate --model "$DEC" --input "$TMP/requests.jsonl" --ignore-eos "${THREADS[@]}")
run /dev/null "${REQ[@]}" --output "$TMP/req_one.jsonl"
run /dev/null "${REQ[@]}" --output "$TMP/req_tp2.jsonl" --tp 2
sort "$TMP/req_one.jsonl" >"$TMP/req_one.sorted"
[ "$(grep -c '"text"' "$TMP/req_one.sorted")" -eq 3 ] || fail "generate --output: $(cat "$TMP/req_one.sorted")"
sort "$TMP/req_tp2.jsonl" >"$TMP/req_tp2.sorted"
same "generate --output (the engine) --tp 2 = one process" "$TMP/req_tp2.sorted" "$TMP/req_one.sorted"

# ---- the world's size ---------------------------------------------------------------------------
rc=0
"${LAUNCH[@]}" -np 2 "$NOPAD_CLI" "${GEN[@]}" --prompt ab --tp 3 >"$TMP/out" 2>"$TMP/err" </dev/null || rc=$?
if [ "$rc" -ne 0 ] && grep -qF -- "--tp 3 needs a world of 3 processes, and the launcher started 2" "$TMP/err" &&
    [ ! -s "$TMP/out" ]; then
    ok "mpirun -np 2 generate --tp 3: exit $rc, the world-size error"
else
    fail "mpirun -np 2 generate --tp 3: exit $rc: $(head -c 2000 "$TMP/err")"
fi
[ "$(grep -c 'needs a world' "$TMP/err")" -eq 1 ] || fail "the world-size error is printed more than once"

# ---- embed on a tiny BERT (4 heads, FFN 72): within 1e-5 of one process --------------------------
# Each rank sums its heads' and FFN columns' share, one all-reduce adds them: the float32 sums
# differ in their last bits only, about 1e-7 relative per layer; 1e-5 leaves a wide margin and
# still catches a wrong shard (an error of order 1).
ENC="$MODELS/st_mean_norm"
printf 'hello world\nthe quick brown fox jumps over the lazy dog\na\n\nnopad splits the model\n' >"$TMP/lines.txt"
for pooling in mean none; do
    EMB=(embed --model "$ENC" --input "$TMP/lines.txt" --pooling "$pooling" "${THREADS[@]}")
    run "$TMP/emb_one_$pooling.npy" "${EMB[@]}" --format npy
    run /dev/null "${EMB[@]}" --tp 2 --output "$TMP/emb_tp2_$pooling.npy"
    if [ -s "$TMP/emb_tp2_$pooling.npy" ] &&
        python3 "$HERE/cli_check.py" same "$TMP/emb_tp2_$pooling.npy" "$TMP/emb_one_$pooling.npy" 1e-5; then
        ok "embed --tp 2 --pooling $pooling (rank 0 writes --output) = one process within 1e-5"
    else
        fail "embed --tp 2 --pooling $pooling differs from one process"
    fi
done

# ---- SmolLM2-135M: tp 3 splits its 9 heads and 3 key/value heads; tp 2 does not ---------------------
if [ -f "$GGUF" ]; then
    PROMPT=$'<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n'
    SG=(generate --model "$GGUF" --prompt "$PROMPT" --max-tokens 24 "${THREADS[@]}")
    run "$TMP/smol_one.txt" "${SG[@]}"
    run "$TMP/smol_tp3.txt" "${LAUNCH[@]}" -np 3 "$NOPAD_CLI" "${SG[@]}" --tp 3
    same "SmolLM2: mpirun -np 3 generate --tp 3 = one process" "$TMP/smol_tp3.txt" "$TMP/smol_one.txt"
    rc=0
    "$NOPAD_CLI" "${SG[@]}" --tp 2 >"$TMP/out" 2>"$TMP/err" </dev/null || rc=$?
    if [ "$rc" -ne 0 ] && grep -q "tp 2 does not split this model" "$TMP/err" &&
        grep -q "tp that work: 1, 3" "$TMP/err" && [ ! -s "$TMP/out" ]; then
        ok "SmolLM2 --tp 2: refused, naming tp 1 and 3"
    else
        fail "SmolLM2 --tp 2: exit $rc: $(head -c 2000 "$TMP/err")"
    fi
else
    echo "SKIP: the SmolLM2 part needs NOPAD_SMOLLM2_GGUF (scripts/fetch_default_decoder.sh)"
fi

# ---- serve --tp 2: HTTP on rank 0, greedy answers equal to one process ------------------------------
# In a subshell that sources serve_lib.sh for its start and stop: the subshell's own temporary
# folder, servers killed at its exit, failure count, and SKIP without libmicrohttpd end this part
# only; its failures are listed as they happen and counted here as one.
(
    source "$HERE/serve_lib.sh"
    SERVE_ARGS=(--model "$DEC" --chat-template chatml "${THREADS[@]}")
    # complete OUT: the text of a greedy completion of a text prompt and of an ids prompt
    complete() {
        : >"$1"
        for prompt in '"x y z"' '[1, 2, 3, 4]'; do
            curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
                --data-binary "{\"prompt\": $prompt, \"max_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true}" |
                python3 -c 'import json, sys; c = json.load(sys.stdin)["choices"][0]; print(json.dumps(c["text"]))' \
                    >>"$1" || fail "completion of $prompt: no text"
        done
    }
    start one
    complete "$TMP/serve_one.txt"
    stop one
    start tp2 --tp 2
    complete "$TMP/serve_tp2.txt"
    same "serve --tp 2: greedy /v1/completions = one process" "$TMP/serve_tp2.txt" "$TMP/serve_one.txt"
    # A SIGTERM to rank 0 drains it as with one process; freeing its model ends rank 1, and mpirun
    # then exits 0. (A signal to mpirun instead makes mpirun end every rank itself.)
    RANK0=""
    for child in $(pgrep -P "$PID"); do
        tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=0' && RANK0=$child
    done
    if [ -z "$RANK0" ]; then
        fail "serve --tp 2: no rank 0 among mpirun's children"
    else
        kill -TERM "$RANK0"
        rc=0
        timeout 60 tail --pid="$PID" -f /dev/null || rc=$?
        wait "$PID" || rc=$?
        if [ "$rc" -eq 0 ] && grep -q "nopad serve: stopped" "$TMP/tp2.log"; then
            ok "serve --tp 2: SIGTERM to rank 0 stops every rank, exit 0"
        else
            fail "serve --tp 2: SIGTERM to rank 0: exit $rc: $(tail -5 "$TMP/tp2.log")"
        fi
    fi
    [ "$failures" -eq 0 ]
) || fail "serve --tp 2: the failures above"

[ "$failures" -eq 0 ] || {
    echo "$failures failure(s)" >&2
    exit 1
}
echo "all --tp checks passed"
