#!/usr/bin/env bash
# End-to-end tests of `nopad generate` (and `nopad info` on a decoder): the command line and its
# errors on the tiny fixtures of tests/data/models, then, with the real default decoder
# (SmolLM2-135M-Instruct Q4_1, NOPAD_SMOLLM2_GGUF from scripts/fetch_default_decoder.sh; skipped
# when absent), the greedy answer, --input in groups equal to each prompt alone and in input
# order, the \n escapes, seeded sampling, streaming, --max-tokens 0, the per-line errors and the
# request-file mode (--input requests.jsonl --output results.jsonl, through the engine).
set -euo pipefail

: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
MODELS="$NOPAD_TEST_DATA/models"
GGUF="${NOPAD_SMOLLM2_GGUF:-}"

failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
# expect_fail WANT_RC WORD INPUT -- ARGS...: `nopad ARGS < INPUT` must exit WANT_RC with WORD on
# stderr (case-insensitive), and print nothing on stdout.
expect_fail() {
    local want="$1" word="$2" input="$3" rc=0
    shift 4
    "$NOPAD_CLI" "$@" <"$input" >"$TMP/out" 2>"$TMP/err" || rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "nopad $*: exit $rc, expected $want; stderr: $(head -c 2000 "$TMP/err")"
    elif ! grep -qiF -- "$word" "$TMP/err"; then
        fail "nopad $*: stderr lacks '$word': $(head -c 2000 "$TMP/err")"
    elif [ "$want" -eq 1 ] && ! grep -q '^nopad: error: ' "$TMP/err"; then
        fail "nopad $*: no 'nopad: error:' line: $(head -c 2000 "$TMP/err")"
    elif [ "$want" -eq 2 ] && [ -s "$TMP/out" ]; then
        fail "nopad $*: wrote to stdout on a usage error"
    else
        echo "ok   $word: $(head -n 1 "$TMP/err")"
    fi
}
# run OUT ARGS...: `nopad ARGS > OUT`, which must succeed.
run() {
    local out="$1" rc=0
    shift
    "$NOPAD_CLI" "$@" >"$out" 2>"$TMP/err" </dev/null || rc=$?
    [ "$rc" -eq 0 ] || fail "nopad $*: exit $rc: $(head -c 2000 "$TMP/err")"
}
# same NAME GOT WANT: the two files must be equal.
same() {
    if cmp -s "$2" "$3"; then
        echo "ok   $1"
    else
        fail "$1: output differs (first difference below)"
        diff "$2" "$3" | head -n 6 >&2 || true
    fi
}

# ---- help and the command line (no model needed) -----------------------------------------------
"$NOPAD_CLI" --help | grep -q '^  generate ' || fail "generate missing from nopad --help"
"$NOPAD_CLI" --help | grep -q 'decoders' || fail "nopad --help does not mention decoders"
"$NOPAD_CLI" generate --help >"$TMP/help" || fail "generate --help exits $?"
for opt in --model --prompt --input --max-tokens --temperature --top-k --top-p --min-p \
    --repetition-penalty --seed --ignore-eos --kv-tokens --device --dtype; do
    grep -q -- "$opt" "$TMP/help" || fail "generate --help lacks $opt"
done
grep -q 'stand for a newline' "$TMP/help" || fail "generate --help does not document \\n"

DEC="$MODELS/gpt2_dec"  # a tiny decoder without a tokenizer
N=/dev/null
expect_fail 2 "missing --model" $N -- generate --prompt hi
expect_fail 2 "missing --prompt" $N -- generate --model "$DEC"
expect_fail 2 "not both" $N -- generate --model "$DEC" --prompt hi --input "$TMP/x"
expect_fail 2 "unknown option '--frobnicate'" $N -- generate --model "$DEC" --prompt hi --frobnicate
expect_fail 2 "option --prompt needs a value" $N -- generate --model "$DEC" --prompt
expect_fail 2 "--max-tokens expects an integer" $N -- generate --model "$DEC" --prompt hi --max-tokens -1
expect_fail 2 "--max-tokens expects an integer" $N -- generate --model "$DEC" --prompt hi --max-tokens 1e3
expect_fail 2 "--temperature expects a finite number" $N -- generate --model "$DEC" --prompt hi --temperature hot
expect_fail 2 "--temperature expects a finite number" $N -- generate --model "$DEC" --prompt hi --temperature nan
expect_fail 2 "--temperature must be 0 (greedy) or a number > 0" $N -- generate --model "$DEC" --prompt hi --temperature -0.5
expect_fail 2 "--top-k expects an integer" $N -- generate --model "$DEC" --prompt hi --top-k -1
expect_fail 2 "--top-p must be in (0, 1]" $N -- generate --model "$DEC" --prompt hi --top-p 0
expect_fail 2 "--top-p must be in (0, 1]" $N -- generate --model "$DEC" --prompt hi --top-p 1.5
expect_fail 2 "--min-p must be in [0, 1)" $N -- generate --model "$DEC" --prompt hi --min-p 1
expect_fail 2 "--repetition-penalty must be a number > 0" $N -- generate --model "$DEC" --prompt hi --repetition-penalty 0
expect_fail 2 "--seed expects an integer" $N -- generate --model "$DEC" --prompt hi --seed -3
expect_fail 2 "--seed expects an integer" $N -- generate --model "$DEC" --prompt hi --seed 18446744073709551616
expect_fail 2 "--kv-tokens expects an integer" $N -- generate --model "$DEC" --prompt hi --kv-tokens 0
expect_fail 2 "--batch expects an integer" $N -- generate --model "$DEC" --prompt hi --batch 0
expect_fail 2 "unknown device" $N -- generate --model "$DEC" --prompt hi --device tpu
# models that cannot generate text
expect_fail 1 "does not exist" $N -- generate --model "$TMP/nope.gguf" --prompt hi
expect_fail 1 "is not a folder" $N -- generate --model "$MODELS/bert_a/config.json" --prompt hi
expect_fail 1 "is an encoder (BERT); nopad generate runs decoders" $N -- generate --model "$MODELS/bert_a" --prompt hi
expect_fail 1 "has no tokenizer" $N -- generate --model "$DEC" --prompt hi
expect_fail 1 "cannot open input" $N -- generate --model "$DEC" --input "$TMP/no_such_file"
# request-file mode writes nothing before the model is loaded, never over its own input, and
# always whole: an existing output survives a bad model path; an output that is the input (by
# device and inode, so a hard link too) is refused with the input intact
printf '{"prompt": "hi"}\n' >"$TMP/req.jsonl"
echo "an earlier result" >"$TMP/kept.jsonl"
cp "$TMP/kept.jsonl" "$TMP/kept.want"
expect_fail 1 "does not exist" $N -- generate --model "$TMP/nope.gguf" --input "$TMP/req.jsonl" --output "$TMP/kept.jsonl"
same "an existing --output survives a bad model path" "$TMP/kept.jsonl" "$TMP/kept.want"
cp "$TMP/req.jsonl" "$TMP/req.want"
ln "$TMP/req.jsonl" "$TMP/req_link.jsonl"
expect_fail 2 "is the input file" $N -- generate --model "$DEC" --input "$TMP/req.jsonl" --output "$TMP/req.jsonl"
expect_fail 2 "is the input file" $N -- generate --model "$DEC" --input "$TMP/req.jsonl" --output "$TMP/req_link.jsonl"
expect_fail 2 "is the input file" "$TMP/req.jsonl" -- generate --model "$DEC" --input - --output "$TMP/req.jsonl"
same "--output naming the --input leaves the input whole" "$TMP/req.jsonl" "$TMP/req.want"
expect_fail 2 "--output '': expected a file name" $N -- generate --model "$DEC" --input "$TMP/req.jsonl" --output ''
[ -z "$(find "$TMP" -name '*.nopad-*.tmp')" ] || fail "a temporary output file was left behind"
# a NUL in a request line, escaped (\u0000, which would cut a prompt or stop string there) or raw,
# is refused on that line, naming the field; an escaped backslash before u0000 is plain text
printf '%s\n' '{"prompt": "Par\u0000xyz"}' '{"prompt": "a", "stop": ["b", "Par\u0000xyz"]}' \
    '{"prompt": "a", "id": "x\\u0000"}' >"$TMP/nul.jsonl"
printf '{"prompt": "a\000b"}\n' >>"$TMP/nul.jsonl"
"$NOPAD_CLI" generate --model "$DEC" --input "$TMP/nul.jsonl" --output "$TMP/nul_out.jsonl" 2>"$TMP/err" || true
python3 - "$TMP/nul_out.jsonl" <<'EOF' || fail "NUL characters in request lines"
import json, sys
by = {r["id"]: r for r in map(json.loads, open(sys.argv[1]))}
assert by[1]["error"].startswith('line 1: "prompt" holds a NUL character'), by[1]
assert by[2]["error"].startswith('line 2: "stop" holds a NUL character'), by[2]
assert "NUL" not in by["x\\u0000"]["error"], by["x\\u0000"]  # refused later: no tokenizer
assert by[4]["error"].startswith("line 4: a NUL byte at column 14"), by[4]
print("ok   NUL characters in request lines refused, naming the line and field")
EOF
# and the other way round
echo hi >"$TMP/hi"
expect_fail 1 "is a decoder (GPT-2); nopad embed runs encoders" "$TMP/hi" -- embed --model "$DEC" --ids
# nopad info on a decoder folder
run "$TMP/info" info --model "$DEC"
grep -Eq '^kind: +decoder$' "$TMP/info" || fail "info: no 'kind: decoder' line"
grep -Eq '^kv heads: +2$' "$TMP/info" || fail "info: no kv heads line"
grep -Eq '^context length: +128$' "$TMP/info" || fail "info: no context length line"
run "$TMP/info" info --model "$MODELS/bert_a"
grep -Eq '^kind: +encoder$' "$TMP/info" || fail "info: no 'kind: encoder' line for bert_a"

# ---- the real decoder -------------------------------------------------------------------------
if [ -z "$GGUF" ] || [ ! -f "$GGUF" ]; then
    echo "SKIP: SmolLM2 tests: NOPAD_SMOLLM2_GGUF='${GGUF}' is not a file (scripts/fetch_default_decoder.sh)"
else
    FRANCE=$'<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n'
    COLOURS=$'<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n'
    STORY='Once upon a time'
    run "$TMP/got" generate --model "$GGUF" --prompt "$FRANCE"
    printf 'The capital of France is Paris.\n' >"$TMP/want"
    same "greedy: the capital of France" "$TMP/got" "$TMP/want"

    run "$TMP/info" info --model "$GGUF"
    for line in 'kind: +decoder' 'family: +LLaMA' 'heads: +9' 'kv heads: +3' \
        'context length: +8192' 'vocab size: +49152' 'weights dtype: +Q4_1' \
        'tokenizer: +bpe-byte-level \(gguf\)' 'eos token: +2 \(<\|im_end\|>\)'; do
        grep -Eq "^$line\$" "$TMP/info" || fail "info on the GGUF lacks /$line/"
    done
    [ "$("$NOPAD_CLI" info --model "$GGUF" --json |
        python3 -c 'import sys, json; j = json.load(sys.stdin); print(j["kind"], j["num_kv_heads"], j["eos_token_id"])')" = "decoder 3 2" ] ||
        fail "info --json on the GGUF"

    # the weights as held: SmolLM2's Q4_1 layers and Q8_0 embeddings kept as stored (the CPU's
    # default), or dequantised with --weights f32; fp8 is not there yet
    for line in '  token_embd: +Q8_0, 1 tensors, 30.08 MB' '  attn_qkv: +Q4_1, 90 tensors, 10.37 MB' \
        '  ffn_down: +Q4_1, 30 tensors, 16.59 MB'; do
        grep -Eq "^$line\$" "$TMP/info" || fail "info on the GGUF lacks /$line/"
    done
    "$NOPAD_CLI" info --model "$GGUF" --weights f32 >"$TMP/info_f32" || fail "info --weights f32"
    grep -Eq '^  attn_qkv: +F32 \(stored Q4_1\), 90 tensors, ' "$TMP/info_f32" || fail "info --weights f32 groups"
    expect_fail 2 "unknown weights 'int3'" $N -- generate --model "$GGUF" --prompt hi --weights int3
    expect_fail 1 "fp8 is not supported yet" $N -- generate --model "$GGUF" --prompt hi --weights fp8

    # --input: the longest answer first, so the later ones are held and written in order;
    # the same bytes in groups of 3 and of 1, and as each prompt alone. With the weights kept
    # quantized, a row's activations are rounded to int8 and a float difference of 1e-7 between
    # batchings can round one value the other way; dequantised (f32), batching changes the
    # logits by float rounding only, and these greedy answers compare byte for byte.
    W=(--weights f32)
    esc() { printf '%s' "$1" | python3 -c 'import sys; sys.stdout.write(sys.stdin.read().replace("\\", "\\\\").replace("\n", "\\n") + "\n")'; }
    { esc "$STORY"; esc "$FRANCE"; esc "$COLOURS"; esc 'Say \n literally'; } >"$TMP/prompts"
    grep -c '' "$TMP/prompts" | grep -qx 4 || fail "the prompts file has not 4 lines"
    : >"$TMP/alone"
    for p in "$STORY" "$FRANCE" "$COLOURS" 'Say \n literally'; do
        "$NOPAD_CLI" generate --model "$GGUF" --prompt "$p" --max-tokens 24 "${W[@]}" >>"$TMP/alone" ||
            fail "generate --prompt '$p'"
    done
    run "$TMP/grouped" generate --model "$GGUF" --input "$TMP/prompts" --max-tokens 24 --batch 3 "${W[@]}"
    same "--input in groups of 3 == each prompt alone, in order" "$TMP/grouped" "$TMP/alone"
    run "$TMP/single" generate --model "$GGUF" --input "$TMP/prompts" --max-tokens 24 --batch 1 "${W[@]}"
    same "--input one at a time == each prompt alone" "$TMP/single" "$TMP/alone"
    # a KV pool of 64 tokens holds one prompt at a time here: groups of one
    run "$TMP/small_kv" generate --model "$GGUF" --input "$TMP/prompts" --max-tokens 24 --kv-tokens 64 "${W[@]}"
    same "--input with a small KV pool" "$TMP/small_kv" "$TMP/alone"
    "$NOPAD_CLI" generate --model "$GGUF" --input - --max-tokens 24 "${W[@]}" <"$TMP/prompts" >"$TMP/stdin" ||
        fail "generate --input -"
    same "--input - reads stdin" "$TMP/stdin" "$TMP/alone"
    grep -q 'Paris' "$TMP/alone" || fail "the France answer lacks Paris"

    # seeded sampling: reproducible, and the same alone or beside other prompts
    S=(--temperature 0.9 --top-p 0.95 --top-k 40 --seed 11 --max-tokens 16 --ignore-eos "${W[@]}")
    run "$TMP/s1" generate --model "$GGUF" --prompt "$STORY" "${S[@]}"
    run "$TMP/s2" generate --model "$GGUF" --prompt "$STORY" "${S[@]}"
    same "sampling with a seed is reproducible" "$TMP/s1" "$TMP/s2"
    { esc "$FRANCE"; esc "$STORY"; } >"$TMP/two"
    run "$TMP/s3" generate --model "$GGUF" --input "$TMP/two" "${S[@]}"
    tail -n 1 "$TMP/s3" >"$TMP/s3_story"
    same "a sampled answer beside another prompt" "$TMP/s3_story" "$TMP/s1"
    run "$TMP/s4" generate --model "$GGUF" --prompt "$STORY" --temperature 0.9 --seed 12 \
        --max-tokens 16 --ignore-eos
    cmp -s "$TMP/s1" "$TMP/s4" && fail "seeds 11 and 12 gave the same 16 sampled tokens"

    # --max-tokens 0 checks the prompts and prints nothing
    run "$TMP/none" generate --model "$GGUF" --prompt "$FRANCE" --max-tokens 0
    [ ! -s "$TMP/none" ] || fail "--max-tokens 0 printed something"
    run "$TMP/none" generate --model "$GGUF" --input "$TMP/prompts" --max-tokens 0
    [ ! -s "$TMP/none" ] || fail "--max-tokens 0 --input printed something"

    # the text comes out while the model still runs (written and flushed per token)
    python3 - "$NOPAD_CLI" "$GGUF" <<'EOF' || fail "generate does not stream"
import os, subprocess, sys
cli, gguf = sys.argv[1:3]
p = subprocess.Popen([cli, "generate", "--model", gguf, "--prompt", "Once upon a time",
                      "--max-tokens", "300", "--ignore-eos"], stdout=subprocess.PIPE)
first = os.read(p.stdout.fileno(), 4096)
running = p.poll() is None
rest = p.stdout.read()
p.wait()
assert first and running, "the first text came only when the process ended"
assert p.returncode == 0 and len(rest) > len(first)
print("ok   streamed: first %d bytes while running, %d after" % (len(first), len(rest)))
EOF

    # errors naming the line; earlier answers are out
    { esc "$FRANCE"; printf 'bad \xff utf-8\n'; } >"$TMP/bad_utf8"
    expect_fail 1 "line 2" "$TMP/bad_utf8" -- generate --model "$GGUF" --input - --batch 1 --max-tokens 16
    same "the answer before a bad line" "$TMP/out" "$TMP/want"
    printf '%s\n\n' "$(esc "$STORY")" >"$TMP/empty_line"
    expect_fail 1 "line 2 gives no tokens" "$TMP/empty_line" -- generate --model "$GGUF" --input - --max-tokens 4
    expect_fail 1 "context of 8192" $N -- generate --model "$GGUF" --prompt "$FRANCE" --max-tokens 9000
    expect_fail 1 "(--kv-tokens)" $N -- generate --model "$GGUF" --prompt "$FRANCE" --kv-tokens 16

    # request-file mode: JSON lines through the engine; every line answered once, a greedy answer
    # equal to --prompt's, a stop string, a bad line reported in place (exit status 1)
    run "$TMP/france12" generate --model "$GGUF" --prompt "$FRANCE" --max-tokens 12 --ignore-eos
    python3 - "$TMP/requests.jsonl" "$FRANCE" "$STORY" <<'EOF'
import json, sys
path, france, story = sys.argv[1:4]
lines = [{"id": "france", "prompt": france, "max_tokens": 12, "ignore_eos": True},
         {"id": 2, "prompt": story, "max_tokens": 16, "temperature": 0.9, "seed": 11},
         "this line is not JSON",
         {"prompt": "Count: one, two, three,", "max_tokens": 30, "stop": " six"}]
lines += [{"id": "more%d" % i, "prompt": story, "max_tokens": 4 + i} for i in range(6)]
with open(path, "w") as f:
    for l in lines:
        f.write((l if isinstance(l, str) else json.dumps(l)) + "\n")
EOF
    rc=0
    "$NOPAD_CLI" generate --model "$GGUF" --input "$TMP/requests.jsonl" --output "$TMP/results.jsonl" \
        --max-running 4 2>"$TMP/err" || rc=$?
    [ "$rc" -eq 1 ] || fail "request file with a bad line: exit $rc, expected 1"
    python3 - "$TMP/results.jsonl" "$TMP/france12" <<'EOF' || fail "request-file results"
import json, sys
res = [json.loads(l) for l in open(sys.argv[1])]
want = open(sys.argv[2]).read()[:-1]  # --prompt's answer without its newline
by = {str(r["id"]): r for r in res}
assert len(res) == 10 and len(by) == 10, "every line answered once: %r" % [r["id"] for r in res]
assert by["france"]["text"] == want and by["france"]["tokens"] == 12, (by["france"], want)
assert by["france"]["finish_reason"] == "length"
assert "not a JSON object" in by["3"]["error"]
stop = by["4"]
assert stop["finish_reason"] == "stop" and " six" not in stop["text"], stop
for i in range(6):
    r = by["more%d" % i]
    assert r["finish_reason"] in ("length", "stop") and 1 <= r["tokens"] <= 4 + i, r
print("ok   request file: 10 lines answered, greedy == --prompt, stop string, bad line reported")
EOF
    # the results replace an existing file whole (a new file: a hard link to the old one keeps
    # the old text) and no temporary is left; an empty request file gives an empty result file
    echo "old results" >"$TMP/results.jsonl"
    ln -f "$TMP/results.jsonl" "$TMP/results_old.jsonl"
    "$NOPAD_CLI" generate --model "$GGUF" --input "$TMP/requests.jsonl" --output "$TMP/results.jsonl" \
        --max-running 4 2>"$TMP/err" || true
    [ "$(wc -l <"$TMP/results.jsonl")" -eq 10 ] && [ "$(cat "$TMP/results_old.jsonl")" = "old results" ] ||
        fail "request file: the results did not replace the old file as a new file"
    [ -z "$(find "$TMP" -name '*.nopad-*.tmp')" ] || fail "request file: a temporary was left behind"
    : >"$TMP/no_requests.jsonl"
    run "$TMP/out" generate --model "$GGUF" --input "$TMP/no_requests.jsonl" --output "$TMP/no_results.jsonl"
    [ -f "$TMP/no_results.jsonl" ] && [ ! -s "$TMP/no_results.jsonl" ] || fail "an empty request file: no empty result file"
    expect_fail 2 "--output is the request-file mode" $N -- generate --model "$GGUF" --prompt "$FRANCE" --output -
fi

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)" >&2
    exit 1
fi
echo "all passed"
