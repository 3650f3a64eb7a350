#!/usr/bin/env bash
# Bad input to the `nopad` CLI: each case must fail with exit status 1 (error) or 2 (bad command
# line) -- never a crash (>= 128, a signal) or a sanitizer exit -- and with a message that names
# the problem. Uses the tiny fixture models of tests/data/models.
set -euo pipefail

: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

MODEL="$NOPAD_TEST_DATA/models/distilbert_a"       # no tokenizer: --ids only
TEXT_MODEL="$NOPAD_TEST_DATA/models/st_mean_norm"  # has a tokenizer
for m in "$MODEL" "$TEXT_MODEL"; do
    [ -f "$m/config.json" ] || { echo "FAIL: fixture $m is missing" >&2; exit 1; }
done

failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# expect_fail WANT_RC WORD INPUT -- ARGS...: runs `nopad ARGS < INPUT`, which must exit with
# WANT_RC and print WORD (case-insensitive) on stderr.
expect_fail() {
    local want="$1" word="$2" input="$3"
    shift 4
    local rc=0
    "$NOPAD_CLI" "$@" <"$input" >"$TMP/out" 2>"$TMP/err" || rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "nopad $*: exit $rc, expected $want; stderr: $(head -c 2000 "$TMP/err")"
    elif ! grep -qiF -- "$word" "$TMP/err"; then
        fail "nopad $*: stderr lacks '$word': $(head -c 2000 "$TMP/err")"
    elif [ "$want" -eq 1 ] && ! grep -q '^nopad: error: ' "$TMP/err"; then
        fail "nopad $*: no 'nopad: error:' line: $(head -c 2000 "$TMP/err")"
    else
        echo "ok   $word: $(head -n 1 "$TMP/err")"
    fi
}
expect_ok() {
    local input="$1"
    shift 2
    local rc=0
    "$NOPAD_CLI" "$@" <"$input" >"$TMP/out" 2>"$TMP/err" || rc=$?
    [ "$rc" -eq 0 ] || fail "nopad $*: exit $rc: $(head -c 2000 "$TMP/err")"
}
json_get() { "$NOPAD_CLI" info --model "$1" --json | python3 -c "import sys, json; print(json.load(sys.stdin)['$2'])"; }

VOCAB="$(json_get "$MODEL" vocab_size)"
MAX_LEN="$(json_get "$MODEL" max_seq_length)"
TEXT_MAX_LEN="$(json_get "$TEXT_MODEL" max_seq_length)"
H="$(json_get "$MODEL" hidden_size)"
EMPTY="$TMP/empty.txt"
: >"$EMPTY"
printf '1 2 3\n' >"$TMP/ok_ids.txt"

# ---- command line ------------------------------------------------------------------------------
expect_fail 2 "usage" /dev/null -- 
expect_fail 2 "unknown command" /dev/null -- frobnicate
expect_fail 2 "unknown option" /dev/null -- --frobnicate
expect_fail 2 "unknown option" "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids --frobnicate
expect_fail 2 "missing --model" "$TMP/ok_ids.txt" -- embed --ids
expect_fail 2 "needs a value" "$TMP/ok_ids.txt" -- embed --ids --model
expect_fail 2 "pooling" "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids --pooling average
expect_fail 2 "format" "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids --format csv
expect_fail 2 "device" "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids --device tpu
expect_fail 2 "dtype" "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids --dtype fp8
expect_fail 2 "--batch-tokens" "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids --batch-tokens 0
expect_fail 2 "--batch-tokens" "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids --batch-tokens 12x
expect_fail 2 "takes no value" "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids=1
expect_fail 2 "unknown option" /dev/null -- info --model "$MODEL" --frobnicate

# ---- model folder --------------------------------------------------------------------------------
mkdir -p "$TMP/empty_model"
expect_fail 1 "does not exist" "$TMP/ok_ids.txt" -- embed --model "$TMP/no_such_folder" --ids
expect_fail 1 "does not exist" /dev/null -- info --model "$TMP/no_such_folder"
expect_fail 1 "config.json" "$TMP/ok_ids.txt" -- embed --model "$TMP/empty_model" --ids
expect_fail 1 "config.json" /dev/null -- info --model "$TMP/empty_model"
expect_fail 1 "not a folder" /dev/null -- info --model "$MODEL/config.json"
# a .gguf path is a GGUF file, missing or with a bad magic, never a "model folder"
expect_fail 1 "GGUF file '$TMP/no_such.gguf' does not exist" /dev/null -- info --model "$TMP/no_such.gguf"
printf 'PK\003\004 not a gguf' >"$TMP/zip.gguf"
expect_fail 1 "is not a GGUF file (magic \"PK\\x03\\x04\", expected \"GGUF\")" /dev/null -- info --model "$TMP/zip.gguf"
expect_fail 1 "use --ids" "$TMP/ok_ids.txt" -- embed --model "$MODEL"
expect_fail 1 "cuda" "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids --device cuda
expect_fail 1 "cannot open input" /dev/null -- embed --model "$MODEL" --ids --input "$TMP/no_such_file"
expect_fail 1 "cannot open output" "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids --output "$TMP/no/such/dir.npy"
# An output file is written whole or not at all: a run that fails on line 2 leaves an existing
# --output as it was (it used to hold line 1's embedding), with no temporary beside it; an
# --output that is the --input file (the same inode, whatever the name) is refused before
# anything is written; an empty --output is named.
printf '1 2 3\n4 five 6\n' >"$TMP/bad_line2.txt"
for f in jsonl npy; do
    echo "an earlier result" >"$TMP/kept.$f"
    expect_fail 1 "line 2" "$TMP/bad_line2.txt" -- embed --model "$MODEL" --ids --output "$TMP/kept.$f"
    [ "$(cat "$TMP/kept.$f")" = "an earlier result" ] || fail "embed --output $f: a failed run changed the file"
done
expect_ok "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids --output "$TMP/kept.jsonl"
[ "$(wc -l <"$TMP/kept.jsonl")" -eq 1 ] && grep -q '^\[' "$TMP/kept.jsonl" || fail "embed --output: not replaced by a good run"
[ -z "$(find "$TMP" -name '*.nopad-*.tmp')" ] || fail "embed --output: a temporary file was left behind"
cp "$TMP/ok_ids.txt" "$TMP/in_out.txt"
ln "$TMP/in_out.txt" "$TMP/in_out_link.txt"
expect_fail 2 "is the input file" /dev/null -- embed --model "$MODEL" --ids --input "$TMP/in_out.txt" --output "$TMP/in_out.txt"
expect_fail 2 "is the input file" /dev/null -- embed --model "$MODEL" --ids --input "$TMP/in_out.txt" --output "$TMP/in_out_link.txt"
expect_fail 2 "is the input file" "$TMP/in_out.txt" -- embed --model "$MODEL" --ids --output "$TMP/in_out.txt"
expect_fail 2 "is the input file" /dev/null -- classify --model "$MODEL" --input "$TMP/in_out.txt" --output "$TMP/in_out_link.txt"
cmp -s "$TMP/in_out.txt" "$TMP/ok_ids.txt" || fail "an --output naming the --input changed the input"
expect_fail 2 "--output '': expected a file name" /dev/null -- embed --model "$MODEL" --ids --output ''
expect_fail 2 "--output '': expected a file name" /dev/null -- classify --model "$MODEL" --output ''

# ---- --ids lines ---------------------------------------------------------------------------------
printf '1 2 3\n4 five 6\n' >"$TMP/nonnumeric.txt"
expect_fail 1 "line 2, token 2" "$TMP/nonnumeric.txt" -- embed --model "$MODEL" --ids
expect_fail 1 "not a number" "$TMP/nonnumeric.txt" -- embed --model "$MODEL" --ids
printf '1 2 3\n4 -5 6\n' >"$TMP/negative.txt"
expect_fail 1 "negative" "$TMP/negative.txt" -- embed --model "$MODEL" --ids
printf '1 %s\n' "$VOCAB" >"$TMP/vocab.txt"
expect_fail 1 "out of range" "$TMP/vocab.txt" -- embed --model "$MODEL" --ids
expect_fail 1 "vocabulary has $VOCAB ids" "$TMP/vocab.txt" -- embed --model "$MODEL" --ids
printf '1 99999999999999999999999999\n' >"$TMP/overflow.txt"
expect_fail 1 "out of range" "$TMP/overflow.txt" -- embed --model "$MODEL" --ids
# A NUL, another control byte or a byte that is not UTF-8 is named by its value and column (a NUL
# used to read "'6' is not a number": printed as text, the message stopped at the NUL).
printf '1 2\n3 4\n5 6\0007\n' >"$TMP/nul.txt"
expect_fail 1 "line 3, token 2: byte 0x00 at column 4 is not part of a number" "$TMP/nul.txt" \
    -- embed --model "$MODEL" --ids
printf '1 2\x1b[31m\n' >"$TMP/escape.txt"
expect_fail 1 "line 1, token 2: byte 0x1b at column 4 is not part of a number" "$TMP/escape.txt" \
    -- embed --model "$MODEL" --ids
printf '1 2\xff\n' >"$TMP/not_utf8_ids.txt"
expect_fail 1 "line 1, token 2: byte 0xff at column 4 is not part of a number" "$TMP/not_utf8_ids.txt" \
    -- embed --model "$MODEL" --ids
printf '1 2\n\n3\n' >"$TMP/empty_line.txt"
expect_fail 1 "line 2: empty line" "$TMP/empty_line.txt" -- embed --model "$MODEL" --ids
printf '1 2\n \t \n' >"$TMP/blank_line.txt"
expect_fail 1 "line 2: empty line" "$TMP/blank_line.txt" -- embed --model "$MODEL" --ids

# A sequence one id longer than the model allows: an error, or cut with --truncate.
python3 -c "print(' '.join(['5'] * ($MAX_LEN + 1)))" >"$TMP/long_ids.txt"
expect_fail 1 "$((MAX_LEN + 1)) tokens is longer" "$TMP/long_ids.txt" -- embed --model "$MODEL" --ids
expect_ok "$TMP/long_ids.txt" -- embed --model "$MODEL" --ids --truncate --pooling none --format npy \
    --output "$TMP/long_ids.npy"
python3 "$HERE/cli_check.py" shape "$TMP/long_ids.npy" "$MAX_LEN" "$H" || fail "--ids --truncate shape"

# ---- text lines ----------------------------------------------------------------------------------
expect_fail 1 "no input lines" "$EMPTY" -- embed --model "$TEXT_MODEL"
expect_fail 1 "no input lines" "$EMPTY" -- embed --model "$MODEL" --ids
printf 'fine\n\xff\xfe\n' >"$TMP/bad_utf8.txt"
expect_fail 1 "line 2" "$TMP/bad_utf8.txt" -- embed --model "$TEXT_MODEL"
expect_fail 1 "utf" "$TMP/bad_utf8.txt" -- embed --model "$TEXT_MODEL"
python3 -c "print(' '.join(['the'] * ($TEXT_MAX_LEN * 2)))" >"$TMP/long_text.txt"
expect_fail 1 "longer than the model's maximum sequence length $TEXT_MAX_LEN" "$TMP/long_text.txt" \
    -- embed --model "$TEXT_MODEL"
expect_ok "$TMP/long_text.txt" -- embed --model "$TEXT_MODEL" --truncate --pooling none \
    --output "$TMP/long_text.npy"
python3 "$HERE/cli_check.py" shape "$TMP/long_text.npy" "$TEXT_MAX_LEN" \
    "$(json_get "$TEXT_MODEL" hidden_size)" || fail "text --truncate shape"
# Empty lines are inputs (the special tokens alone), as is a last line without '\n'.
printf '\n\r\nlast' >"$TMP/edge_lines.txt"
expect_ok "$TMP/edge_lines.txt" -- embed --model "$TEXT_MODEL" --output "$TMP/edge.jsonl"
n_out="$(cat "$TMP/edge.jsonl" 2>/dev/null | wc -l)"
[ "$n_out" -eq 3 ] || fail "empty and unterminated lines: $n_out outputs, expected 3"

# ---- a tokenizer nopad does not support: a warning, ids work, text names why ---------------------
UNSUP="$TMP/unsupported_tokenizer"
mkdir -p "$UNSUP"
cp "$MODEL/config.json" "$MODEL/model.safetensors" "$UNSUP/"
printf '{"model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"}}' \
    >"$UNSUP/tokenizer.json"
expect_ok "$TMP/ok_ids.txt" -- embed --model "$UNSUP" --ids --output "$TMP/unsup.jsonl"
grep -q '^nopad: warning: .*WordLevel.*token ids work' "$TMP/err" ||
    fail "no warning naming WordLevel on stderr: $(cat "$TMP/err")"
[ "$(wc -l <"$TMP/unsup.jsonl")" -eq 1 ] || fail "--ids with an unsupported tokenizer: no output"
printf 'some text\n' >"$TMP/some_text.txt"
expect_fail 1 'model type "WordLevel" is not supported' "$TMP/some_text.txt" -- \
    embed --model "$UNSUP"
expect_fail 1 "use --ids" "$TMP/some_text.txt" -- embed --model "$UNSUP"
"$NOPAD_CLI" info --model "$UNSUP" 2>/dev/null | grep -q '^tokenizer: *unsupported$' ||
    fail "nopad info does not say the tokenizer is unsupported"
printf '{"model": ' >"$UNSUP/tokenizer.json" # broken, not unsupported: the load fails
expect_fail 1 "not valid JSON" "$TMP/ok_ids.txt" -- embed --model "$UNSUP" --ids

# ---- success paths print nothing on stderr when it is not a terminal (no progress) --------------
expect_ok "$TMP/ok_ids.txt" -- embed --model "$MODEL" --ids
[ ! -s "$TMP/err" ] || fail "stderr not empty on success: $(cat "$TMP/err")"

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)" >&2
    exit 1
fi
echo "all CLI error tests passed"
