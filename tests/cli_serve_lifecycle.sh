#!/usr/bin/env bash
# `nopad serve`'s lifecycle with curl, on loopback:
# - SIGTERM during a long engine step (a prompt of several hundred tokens, one CPU thread): a
#   plain request gets its 503 and a stream its error event and [DONE] at once, not when the step
#   ends, and the server exits 0 (libmicrohttpd aborts the process when it is stopped with a
#   connection still suspended), with --shutdown-timeout 0;
# - a large /v1/embeddings request runs in chunks of --embed-batch-tokens between other
#   requests: a small request sent during it is answered first; a large request whose client
#   leaves stops being computed (the encoder's token counter in /metrics stops growing);
# - 405 answers carry an Allow header naming the route's methods, HEAD on a GET route answers as
#   GET without a body;
# - the start's log names the generation defaults a request without them gets.
# The SIGTERM part needs the default decoder (NOPAD_SMOLLM2_GGUF), the abandoned request the
# default encoder (NOPAD_MINILM_DIR: its work must outlast the client); the rest uses the tiny
# encoder tests/data/models/st_mean_norm, so a "large" request is cheap.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/serve_lib.sh"
GGUF="${NOPAD_SMOLLM2_GGUF:-}"
TINY="$NOPAD_TEST_DATA/models/st_mean_norm"
now() { date +%s.%N; }
# less A B: A < B for decimal numbers
less() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# metric NAME: the value of an unlabelled metric.
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | awk -v n="$1" '$1 == n { print $2 }'; }

# ---- 405 with Allow, HEAD on GET routes; the defaults in the log --------------------------------
start small --model "$TINY" --threads 1
code=$(curl -s -o "$TMP/body" -D "$TMP/headers" -w '%{http_code}' -X PUT "http://127.0.0.1:$PORT/v1/embeddings")
allow=$(sed -n 's/^Allow: \(.*\)\r$/\1/Ip' "$TMP/headers")
if [ "$code" = 405 ] && [ "$allow" = "POST" ] && grep -q 'takes POST, not PUT' "$TMP/body"; then
    ok "PUT on a POST route: 405, Allow: POST, the message names POST"
else
    fail "PUT on a POST route: $code, Allow '$allow': $(cat "$TMP/body")"
fi
for m in DELETE PATCH; do
    code=$(curl -s -o "$TMP/body" -D "$TMP/headers" -w '%{http_code}' -X "$m" "http://127.0.0.1:$PORT/embed")
    grep -qi '^Allow: POST' "$TMP/headers" && [ "$code" = 405 ] && grep -q "takes POST, not $m" "$TMP/body" \
        && ok "$m on a POST route: 405 naming POST" || fail "$m /embed: $code: $(cat "$TMP/headers" "$TMP/body")"
done
code=$(curl -s -o "$TMP/body" -D "$TMP/headers" -w '%{http_code}' -X POST "http://127.0.0.1:$PORT/health")
allow=$(sed -n 's/^Allow: \(.*\)\r$/\1/Ip' "$TMP/headers")
[ "$code" = 405 ] && [ "$allow" = "GET, HEAD" ] && grep -q 'takes GET, HEAD, not POST' "$TMP/body" \
    && ok "POST on a GET route: 405, Allow: GET, HEAD" || fail "POST /health: $code, Allow '$allow': $(cat "$TMP/body")"
for path in /health /v1/models /metrics; do
    get_len=$(curl -s -o /dev/null -w '%{size_download}' "http://127.0.0.1:$PORT$path")
    code=$(curl -s -I -o "$TMP/headers" -w '%{http_code} %{size_download}' "http://127.0.0.1:$PORT$path")
    ctype=$(grep -ci '^Content-Type:' "$TMP/headers" || true)
    if [ "$code" = "200 0" ] && [ "$ctype" = 1 ] && [ "$get_len" -gt 0 ]; then
        ok "HEAD $path: 200, headers, no body"
    else
        fail "HEAD $path: '$code' (GET sent $get_len bytes): $(cat "$TMP/headers")"
    fi
done
stop small

# ---- a large embedding request does not hold up a small one ------------------------------------
# 2,048 inputs (the most a request may hold) of 18 ids, one input a batch: 2,048 encoder batches
python3 - "$TMP" <<'EOF'
import json, random, sys
rng = random.Random(7)
big = [[rng.randrange(5, 150) for _ in range(18)] for _ in range(2048)]
json.dump({"input": big, "encoding_format": "base64", "dimensions": 4}, open(sys.argv[1] + "/big.json", "w"))
for i in (0, 1000, 2047):
    json.dump({"input": [big[i]], "encoding_format": "base64", "dimensions": 4}, open(f"{sys.argv[1]}/one{i}.json", "w"))
EOF
start embed --model "$TINY" --threads 1 --embed-batch-tokens 18
curl -s -o "$TMP/big.out" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/embeddings" \
    -H 'Content-Type: application/json' --data-binary @"$TMP/big.json" >"$TMP/big.code" &
big=$!
for _ in $(seq 1 200); do # until it has begun (before chunking it ran as one batch: not seen)
    less "$(metric nopad_embedding_batches_total)" 5 || break
    kill -0 "$big" 2>/dev/null || break
    sleep 0.02
done
code=$(curl -s -o "$TMP/small.out" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/embeddings" \
    -H 'Content-Type: application/json' -d '{"input": "one word"}')
big_running=0
kill -0 "$big" 2>/dev/null && big_running=1
wait "$big" || true
if [ "$code" = 200 ] && [ "$big_running" = 1 ] && [ "$(cat "$TMP/big.code")" = 200 ]; then
    ok "a small embedding request sent during a large one is answered first (both 200)"
else
    fail "small request: $code, the large one still running: $big_running, its status $(cat "$TMP/big.code")"
fi
for i in 0 1000 2047; do
    curl -s -o "$TMP/one$i.out" "http://127.0.0.1:$PORT/v1/embeddings" -H 'Content-Type: application/json' \
        --data-binary @"$TMP/one$i.json"
done
if python3 - "$TMP" <<'EOF'; then
import base64, json, struct, sys
r = json.load(open(sys.argv[1] + "/big.out"))
assert len(r["data"]) == 2048 and [d["index"] for d in r["data"]] == list(range(2048)), "rows"
assert r["usage"]["prompt_tokens"] == 2048 * 18, r["usage"]
vec = lambda s: struct.unpack("<4f", base64.b64decode(s))
for i in (0, 1000, 2047):
    alone = vec(json.load(open(f"{sys.argv[1]}/one{i}.out"))["data"][0]["embedding"])
    got = vec(r["data"][i]["embedding"])
    assert max(abs(a - b) for a, b in zip(alone, got)) < 1e-5, (i, alone, got)
EOF
    ok "the large request's rows in order, each equal to its input's alone"
else
    fail "the large request's answer"
fi
stop embed

# ---- a large embedding request stops when its client leaves ---------------------------------------
# MiniLM, 2,048 inputs of 60 ids in batches of 256 tokens: tens of seconds of work; the client
# leaves after 1 s, and the batcher drops the request at its next batch
MINILM="${NOPAD_MINILM_DIR:-}"
if [ -n "$MINILM" ] && [ -d "$MINILM" ]; then
    python3 - "$TMP" <<'EOF'
import json, random, sys
rng = random.Random(8)
big = [[rng.randrange(1000, 29000) for _ in range(60)] for _ in range(2048)]
json.dump({"input": big, "encoding_format": "base64"}, open(sys.argv[1] + "/minilm.json", "w"))
EOF
    start leave --model "$MINILM" --threads 1 --embed-batch-tokens 256 --shutdown-timeout 0
    curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$PORT/v1/embeddings" \
        -H 'Content-Type: application/json' --data-binary @"$TMP/minilm.json" || true
    sleep 1
    tokens1=$(metric nopad_embedding_tokens_total)
    sleep 1
    tokens2=$(metric nopad_embedding_tokens_total)
    cancelled=$(metric nopad_requests_cancelled_total)
    gone=$(curl -s "http://127.0.0.1:$PORT/metrics" | grep -c 'route="/v1/embeddings",status="499"} 1' || true)
    if [ "$tokens2" = "$tokens1" ] && [ "$tokens2" -lt $((2048 * 60)) ] && [ "$cancelled" = 1 ] && [ "$gone" = 1 ]; then
        ok "a large embedding request whose client left stops ($tokens2 of $((2048 * 60)) tokens computed; counted cancelled, 499)"
    else
        fail "the abandoned request: tokens $tokens1 -> $tokens2 of $((2048 * 60)), cancelled $cancelled, 499 seen $gone"
    fi
    # SIGTERM while it computes: the request gets its 503 at once (before, the encoder's batch ran
    # on and libmicrohttpd aborted the process at the end of the shutdown)
    curl -s -o "$TMP/emb_term.out" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/embeddings" \
        -H 'Content-Type: application/json' --data-binary @"$TMP/minilm.json" >"$TMP/emb_term.code" &
    emb=$!
    for _ in $(seq 1 300); do
        [ "$(metric nopad_embedding_tokens_total)" -gt "$tokens2" ] && break
        sleep 0.05
    done
    kill -TERM "$PID"
    wait "$emb" || true
    rc=0
    wait "$PID" || rc=$?
    if [ "$rc" = 0 ] && [ "$(cat "$TMP/emb_term.code")" = 503 ] && grep -q '"code":"cancelled"' "$TMP/emb_term.out"; then
        ok "SIGTERM during an embedding request: 503 cancelled, exit 0"
    else
        fail "SIGTERM during an embedding request: $(cat "$TMP/emb_term.code") $(cat "$TMP/emb_term.out"), exit $rc: $(tail -2 "$TMP/leave.log")"
    fi
else
    echo "SKIP: the abandoned embedding request needs NOPAD_MINILM_DIR"
fi

# ---- SIGTERM during a long engine step: answered at once, exit 0 --------------------------------
if [ -n "$GGUF" ] && [ -f "$GGUF" ]; then
    start gen --model "$GGUF" --threads 1 --shutdown-timeout 0
    if grep -q 'defaults: temperature 1 top_p 1 top_k off min_p 0 repetition_penalty 1 max_tokens 16 (chat: what the context leaves)' "$TMP/gen.log"; then
        ok "the start's log names the generation defaults"
    else
        fail "no generation defaults in the log: $(cat "$TMP/gen.log")"
    fi
    python3 - "$TMP" <<'EOF'
import json, sys
prompt = "The quick brown fox jumps over the lazy dog. " * 60  # about 600 tokens
for name, stream in (("plain", False), ("stream", True)):
    json.dump({"prompt": prompt, "max_tokens": 4, "stream": stream}, open(f"{sys.argv[1]}/{name}.json", "w"))
EOF
    for name in plain stream; do
        curl -s -N -o "$TMP/$name.out" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/completions" \
            -H 'Content-Type: application/json' --data-binary @"$TMP/$name.json" >"$TMP/$name.code" &
        eval "${name}_pid=\$!"
    done
    for _ in $(seq 1 600); do # both submitted, one at least in the engine's step
        running=$(metric nopad_requests_running)
        waiting=$(metric nopad_requests_waiting)
        [ "${running:-0}" -ge 1 ] && [ $((running + waiting)) -ge 2 ] && break
        sleep 0.1
    done
    [ "${running:-0}" -ge 1 ] || fail "the requests did not start"
    t0=$(now)
    kill -TERM "$PID"
    wait "$plain_pid" "$stream_pid" || true
    t1=$(now)
    alive=0
    kill -0 "$PID" 2>/dev/null && alive=1
    rc=0
    wait "$PID" || rc=$?
    t2=$(now)
    [ "$rc" = 0 ] && ok "SIGTERM during a step: exit 0" || fail "SIGTERM during a step: exit $rc: $(tail -3 "$TMP/gen.log")"
    grep -q 'suspended connections' "$TMP/gen.log" && fail "libmicrohttpd: $(grep suspended "$TMP/gen.log")"
    if [ "$(cat "$TMP/plain.code")" = 503 ] && grep -q '"code":"cancelled"' "$TMP/plain.out"; then
        ok "SIGTERM during a step: the plain request gets 503 cancelled"
    else
        fail "the plain request: $(cat "$TMP/plain.code") $(cat "$TMP/plain.out")"
    fi
    if [ "$(cat "$TMP/stream.code")" = 200 ] && grep -q '^data: {"error"' "$TMP/stream.out" &&
        [ "$(tail -n 2 "$TMP/stream.out" | head -n 1)" = "data: [DONE]" ]; then
        ok "SIGTERM during a step: the stream ends with an error event and [DONE]"
    else
        fail "the stream: $(cat "$TMP/stream.code") $(cat "$TMP/stream.out")"
    fi
    # answered at once, not when the step ends: the step goes on after the answers (the exit waits
    # for it), and the answers came within 3 s of the signal
    waited=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    step_left=$(awk -v a="$t1" -v b="$t2" 'BEGIN { printf "%.2f", b - a }')
    if less "$waited" 3; then
        ok "SIGTERM during a step: answered in $waited s (the step went on $step_left s more, alive $alive)"
    else
        fail "SIGTERM during a step: the answers took $waited s (then $step_left s to exit)"
    fi
else
    echo "SKIP: the SIGTERM-during-a-step checks need NOPAD_SMOLLM2_GGUF"
fi

if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
echo "all checks passed"
