#!/usr/bin/env bash
# `nopad serve` with curl, on loopback: every route, and every error with its exact status code
# and an OpenAI-style error object: 400 (malformed JSON, wrong types, missing fields, unsupported
# or unknown parameters, prompts over the context), 401 (missing or wrong API key), 404 (route,
# model), 405, 413 (announced and chunked bodies over --max-body-bytes), 429 with Retry-After (a
# full queue), 503 and the SIGTERM drain (in-flight work finished, or cancelled at the deadline;
# exit 0), a client leaving mid-stream (its request cancelled, its KV blocks freed), and the
# startup errors (an unknown --chat-template, a template nopad does not recognise).
# The routes need the default decoder and encoder (NOPAD_SMOLLM2_GGUF, NOPAD_MINILM_DIR); without
# them only the startup errors run.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/serve_lib.sh"
SERVE_ARGS=(--threads 2)
GGUF="${NOPAD_SMOLLM2_GGUF:-}"
MINILM="${NOPAD_MINILM_DIR:-}"
KEY=sk-test-key

# req METHOD PATH BODY [curl args...]: prints the status; the body goes to $TMP/body, headers to $TMP/headers.
req() {
    local method="$1" path="$2" body="$3"
    shift 3
    local args=(-s -o "$TMP/body" -D "$TMP/headers" -w '%{http_code}' -X "$method" "$@")
    [ -n "$body" ] && args+=(-H 'Content-Type: application/json' --data-binary "$body")
    curl "${args[@]}" "http://127.0.0.1:$PORT$path" || true
}
auth=(-H "Authorization: Bearer $KEY")
# expect NAME STATUS METHOD PATH BODY [curl args...]: the status; an error status needs an OpenAI
# error object {"error": {"message", "type", "param", "code"}} with a message.
expect() {
    local name="$1" want="$2"
    shift 2
    local got
    got=$(req "$@")
    if [ "$got" != "$want" ]; then
        fail "$name: status $got, expected $want: $(head -c 600 "$TMP/body")"
        return
    fi
    if [ "$want" -ge 400 ] && ! python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert set(e) == {"message", "type", "param", "code"} and e["message"], e' "$TMP/body" 2>/dev/null; then
        fail "$name: $want without an OpenAI error object: $(head -c 600 "$TMP/body")"
        return
    fi
    ok "$name: $want $( [ "$want" -ge 400 ] && python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["message"][:90])' "$TMP/body")"
}
metric() { # metric NAME: its value from /metrics
    curl -s "http://127.0.0.1:$PORT/metrics" | awk -v n="$1" '$1 == n {print $2}'
}

# ---- startup errors (tiny fixtures, no real model) -------------------------------------------------
rc=0
"$NOPAD_CLI" serve --chat-template nonsense >/dev/null 2>"$TMP/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "chatml" "$TMP/err" && ok "unknown --chat-template: exit 2" ||
    fail "unknown --chat-template: exit $rc: $(cat "$TMP/err")"
rc=0
"$NOPAD_CLI" serve --port 70000 >/dev/null 2>"$TMP/err" || rc=$?
[ "$rc" -eq 2 ] && ok "bad --port: exit 2" || fail "bad --port: exit $rc"
rc=0
"$NOPAD_CLI" serve --model "$TMP/none.gguf" >/dev/null 2>"$TMP/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "does not exist" "$TMP/err" && ok "missing model: exit 1" ||
    fail "missing model: exit $rc: $(cat "$TMP/err")"
DEC="$TMP/tiny_decoder"
mkdir -p "$DEC"
cp "$NOPAD_TEST_DATA"/models/llama_gqa/{config.json,model.safetensors} "$DEC/"
cp "$NOPAD_TEST_DATA/tokenizer/bpe_gpt2.json" "$DEC/tokenizer.json"
echo '{"chat_template": "{% for m in messages %}<<{{ m.content }}>>{% endfor %}"}' >"$DEC/tokenizer_config.json"
rc=0
"$NOPAD_CLI" serve --model "$DEC" --port 0 >/dev/null 2>"$TMP/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "does not recognise" "$TMP/err" && ok "unrecognised chat template: exit 1" ||
    fail "unrecognised chat template: exit $rc: $(cat "$TMP/err")"
# ... which --chat-template overrides
start tiny --model "$DEC" --chat-template chatml
expect "tiny decoder, chat with --chat-template, ids prompt" 200 POST /v1/completions \
    '{"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0}'
expect "prompt over the context (128)" 400 POST /v1/completions \
    "{\"prompt\": [$(seq -s, 1 130)], \"max_tokens\": 1}"
grep -q context_length_exceeded "$TMP/body" || fail "prompt over the context: code"
stop

if [ ! -f "$GGUF" ] || [ ! -d "$MINILM" ]; then
    echo "SKIP: the routes need NOPAD_SMOLLM2_GGUF and NOPAD_MINILM_DIR (scripts/fetch_default_*.sh)"
    [ "$failures" -eq 0 ] || exit 1
    exit 0
fi

# ---- every route ---------------------------------------------------------------------------------
start main --model "$GGUF" --embedding-model "$MINILM" --api-key "$KEY" --max-body-bytes 100000
DEC_NAME=$(basename "$GGUF" .gguf)
expect "GET /health (no key needed)" 200 GET /health ""
expect "GET /metrics (no key needed)" 200 GET /metrics ""
grep -q '^nopad_kv_blocks_used 0' "$TMP/body" || fail "/metrics: no nopad_kv_blocks_used"
expect "GET /v1/models" 200 GET /v1/models "" "${auth[@]}"
grep -q "\"$DEC_NAME\"" "$TMP/body" && grep -q '"all-MiniLM-L6-v2"' "$TMP/body" || fail "/v1/models: $(cat "$TMP/body")"
expect "POST /v1/completions" 200 POST /v1/completions \
    "{\"model\": \"$DEC_NAME\", \"prompt\": \"Hello\", \"max_tokens\": 4, \"ignore_eos\": true}" "${auth[@]}"
grep -q '"completion_tokens":4' "$TMP/body" || fail "completion usage: $(cat "$TMP/body")"
expect "POST /v1/completions stream" 200 POST /v1/completions \
    '{"prompt": "Hello", "max_tokens": 4, "stream": true}' "${auth[@]}"
tail -c 20 "$TMP/body" | grep -q 'data: \[DONE\]' || fail "stream end: $(tail -c 300 "$TMP/body")"
grep -qi '^content-type: text/event-stream' "$TMP/headers" || fail "stream content type"
expect "POST /v1/chat/completions" 200 POST /v1/chat/completions \
    '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}' "${auth[@]}"
grep -q '"role":"assistant"' "$TMP/body" || fail "chat message: $(cat "$TMP/body")"
expect "POST /v1/chat/completions stream" 200 POST /v1/chat/completions \
    '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": true}' "${auth[@]}"
grep -q 'chat.completion.chunk' "$TMP/body" && tail -c 20 "$TMP/body" | grep -q 'data: \[DONE\]' ||
    fail "chat stream: $(tail -c 300 "$TMP/body")"
expect "POST /v1/embeddings" 200 POST /v1/embeddings '{"input": ["hello", "world"]}' "${auth[@]}"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["data"])==2 and len(d["data"][1]["embedding"])==384' \
    "$TMP/body" || fail "embeddings: $(head -c 300 "$TMP/body")"
expect "POST /embed (TEI)" 200 POST /embed '{"inputs": "hello"}' "${auth[@]}"

# ---- errors --------------------------------------------------------------------------------------
expect "no API key" 401 GET /v1/models ""
expect "wrong API key" 401 POST /v1/completions '{"prompt": "Hi"}' -H "Authorization: Bearer nope"
expect "unknown route" 404 GET /v2/nothing "" "${auth[@]}"
expect "wrong method" 405 GET /v1/completions "" "${auth[@]}"
expect "unknown model" 404 POST /v1/completions '{"model": "gpt-4", "prompt": "Hi"}' "${auth[@]}"
expect "unknown embedding model" 404 POST /v1/embeddings '{"model": "ada", "input": "Hi"}' "${auth[@]}"
expect "malformed JSON" 400 POST /v1/completions '{"prompt": "Hi",' "${auth[@]}"
expect "not an object" 400 POST /v1/chat/completions '[1, 2]' "${auth[@]}"
expect "empty body" 400 POST /v1/completions '' "${auth[@]}" -H 'Content-Type: application/json'
expect "missing prompt" 400 POST /v1/completions '{"max_tokens": 3}' "${auth[@]}"
expect "missing messages" 400 POST /v1/chat/completions '{"max_tokens": 3}' "${auth[@]}"
expect "missing content" 400 POST /v1/chat/completions '{"messages": [{"role": "user"}]}' "${auth[@]}"
expect "bad role" 400 POST /v1/chat/completions '{"messages": [{"role": "robot", "content": "x"}]}' "${auth[@]}"
expect "max_tokens of the wrong type" 400 POST /v1/completions '{"prompt": "Hi", "max_tokens": "3"}' "${auth[@]}"
expect "messages of the wrong type" 400 POST /v1/chat/completions '{"messages": "Hi"}' "${auth[@]}"
expect "temperature out of range" 400 POST /v1/completions '{"prompt": "Hi", "temperature": -0.5}' "${auth[@]}"
expect "top_p 0" 400 POST /v1/completions '{"prompt": "Hi", "top_p": 0}' "${auth[@]}"
expect "n = 17 (at most 16)" 400 POST /v1/completions '{"prompt": "Hi", "n": 17}' "${auth[@]}"
expect "top_logprobs 21 (at most 20)" 400 POST /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}' "${auth[@]}"
expect "logprobs 21 (completions, at most 20)" 400 POST /v1/completions '{"prompt": "x", "logprobs": 21}' "${auth[@]}"
expect "logit_bias key not a token id" 400 POST /v1/completions '{"prompt": "x", "logit_bias": {"x1": 5}}' "${auth[@]}"
grep -q "'x1'" "$TMP/body" || fail "logit_bias: the key named"
expect "tools" 400 POST /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}' "${auth[@]}"
expect "unknown parameter" 400 POST /v1/completions '{"prompt": "Hi", "mirostat_tau": 5}' "${auth[@]}"
grep -q '"param":"mirostat_tau"' "$TMP/body" || fail "unknown parameter: param"
expect "two prompts" 400 POST /v1/completions '{"prompt": ["a", "b"]}' "${auth[@]}"
expect "invalid UTF-8 prompt" 400 POST /v1/completions $'{"prompt": "\xff\xfe"}' "${auth[@]}"
expect "max_tokens over the context" 400 POST /v1/completions '{"prompt": "Hi", "max_tokens": 9000}' "${auth[@]}"
grep -q context_length_exceeded "$TMP/body" || fail "max_tokens over the context: code"
long=$(python3 -c 'print(" ".join(["hello"] * 9000))')
expect "prompt over the context" 400 POST /v1/completions "{\"prompt\": \"$long\"}" "${auth[@]}"
expect "embedding input over the model's 256 tokens" 400 POST /v1/embeddings \
    "{\"input\": \"$(python3 -c 'print(" ".join(["word"] * 300))')\"}" "${auth[@]}"
expect "embedding input truncated on /embed" 200 POST /embed \
    "{\"inputs\": \"$(python3 -c 'print(" ".join(["word"] * 300))')\", \"truncate\": true}" "${auth[@]}"
expect "embedding input empty" 400 POST /v1/embeddings '{"input": []}' "${auth[@]}"
expect "embedding input of the wrong type" 400 POST /v1/embeddings '{"input": 5}' "${auth[@]}"
big=$(python3 -c 'print("{\"prompt\": \"" + "a" * 200000 + "\"}")')
echo "$big" >"$TMP/big.json"
expect "body over --max-body-bytes" 413 POST /v1/completions "" "${auth[@]}" \
    -H 'Content-Type: application/json' --data-binary "@$TMP/big.json"
expect "chunked body over --max-body-bytes" 413 POST /v1/completions "" "${auth[@]}" \
    -H 'Content-Type: application/json' -H 'Transfer-Encoding: chunked' --data-binary "@$TMP/big.json"
expect "the server still answers" 200 GET /health ""

# a client leaving mid-stream: its request is cancelled and its KV blocks come back
curl -s -N --max-time 2 "${auth[@]}" -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": true, "stream": true}' \
    "http://127.0.0.1:$PORT/v1/completions" >"$TMP/stream" || true
grep -q '^data: {' "$TMP/stream" || fail "disconnect: no event before leaving"
for _ in $(seq 1 100); do
    [ "$(metric nopad_requests_running)" = 0 ] && [ "$(metric nopad_kv_blocks_used)" = 0 ] &&
        [ "$(metric nopad_requests_cancelled_total)" = 1 ] && break
    sleep 0.1
done
[ "$(metric nopad_requests_running)" = 0 ] && [ "$(metric nopad_kv_blocks_used)" = 0 ] &&
    [ "$(metric nopad_requests_cancelled_total)" = 1 ] &&
    ok "client left mid-stream: cancelled, KV blocks freed" ||
    fail "client left mid-stream: running $(metric nopad_requests_running), blocks $(metric nopad_kv_blocks_used), cancelled $(metric nopad_requests_cancelled_total)"
# (the text is read whole first: grep -q leaving early would break curl's pipe under pipefail)
curl -s "http://127.0.0.1:$PORT/metrics" >"$TMP/metrics"
grep -q 'nopad_requests_total{route="/v1/completions",status="499"} 1' "$TMP/metrics" ||
    fail "metrics: the abandoned stream is not counted as 499: $(grep '^nopad_requests_total' "$TMP/metrics" | tr '\n' ' ')"
stop

# ---- a full queue: 429 with Retry-After ------------------------------------------------------------
start queue --model "$GGUF" --max-queue 1 --max-running 1
for i in $(seq 1 8); do
    curl -s -o /dev/null -D "$TMP/h$i" -w '%{http_code}\n' -H 'Content-Type: application/json' \
        -d '{"prompt": "Count to ten:", "max_tokens": 24, "ignore_eos": true}' \
        "http://127.0.0.1:$PORT/v1/completions" >"$TMP/code$i" &
done
wait $(jobs -p | grep -v "^$PID\$") 2>/dev/null || true
sleep 0.2
codes=$(cat "$TMP"/code* | sort | uniq -c | tr -s ' ' | tr '\n' ';')
n429=$(cat "$TMP"/code* | grep -c '^429$' || true)
nok=$(cat "$TMP"/code* | grep -c '^200$' || true)
if [ "$n429" -ge 1 ] && [ $((n429 + nok)) -eq 8 ] && grep -qi '^retry-after: 1' $(grep -l '429' "$TMP"/h*); then
    ok "full queue: $codes Retry-After sent"
else
    fail "full queue: $codes"
fi
stop

# ---- SIGTERM: in-flight work finishes; past the deadline it is cancelled -----------------------------
# (a deadline far above the answer's time: under ASan, beside another test on 2 cores, 24 tokens of
# SmolLM2 took over the default 10 s)
start drain --model "$GGUF" --shutdown-timeout 120
curl -s -o "$TMP/drain.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": true}' \
    "http://127.0.0.1:$PORT/v1/completions" >"$TMP/drain.code" &
CURL=$!
sleep 0.3
stop
wait "$CURL" || true
[ "$(cat "$TMP/drain.code")" = 200 ] && grep -q '"completion_tokens":24' "$TMP/drain.json" &&
    ok "SIGTERM: the request in flight finished" || fail "SIGTERM drain: $(cat "$TMP/drain.code") $(cat "$TMP/drain.json")"
curl -s --max-time 2 "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && fail "SIGTERM: still listening" || ok "SIGTERM: no longer listening"

start deadline --model "$GGUF" --shutdown-timeout 1
curl -s -o "$TMP/dl.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": true}' \
    "http://127.0.0.1:$PORT/v1/completions" >"$TMP/dl.code" &
CURL=$!
sleep 0.3
t0=$(date +%s)
stop
wait "$CURL" || true
[ "$(cat "$TMP/dl.code")" = 503 ] && [ $(($(date +%s) - t0)) -le 8 ] &&
    ok "SIGTERM past --shutdown-timeout: cancelled with 503" ||
    fail "SIGTERM deadline: $(cat "$TMP/dl.code") $(cat "$TMP/dl.json")"

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)" >&2
    exit 1
fi
echo "all nopad serve checks passed"
