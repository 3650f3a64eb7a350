#!/usr/bin/env bash
# End-to-end tests of `nopad tokenize`: ids, --no-special, --tokens and --decode against Hugging
# Face's output kept in the fixtures (tests/data/tokenizer: bpe_cases.jsonl from
# scripts/make_bpe_fixtures.py, small_tokenizer.json), on all-MiniLM-L6-v2 when NOPAD_MINILM_DIR
# holds it, and the errors (exit 1 with a message naming the line, exit 2 for the command line).
set -euo pipefail

: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
DATA="$NOPAD_TEST_DATA/tokenizer"

failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
# same NAME GOT WANT: the two files must be equal.
same() {
    if cmp -s "$2" "$3"; then
        echo "ok   $1"
    else
        fail "$1: output differs from the expected (first difference below)"
        diff "$2" "$3" | head -n 6 >&2 || true
    fi
}
# run OUT ARGS...: `nopad ARGS > OUT`, which must succeed.
run() {
    local out="$1" rc=0
    shift
    "$NOPAD_CLI" "$@" >"$out" 2>"$TMP/err" || rc=$?
    [ "$rc" -eq 0 ] || fail "nopad $*: exit $rc: $(head -c 2000 "$TMP/err")"
}
# expect_fail WANT_RC WORD INPUT -- ARGS...: `nopad ARGS < INPUT` must exit WANT_RC with WORD on
# stderr (case-insensitive).
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
    else
        echo "ok   $word: $(head -n 1 "$TMP/err")"
    fi
}

"$NOPAD_CLI" --help | grep -q '^  tokenize ' || fail "tokenize missing from nopad --help"
"$NOPAD_CLI" tokenize --help | grep -q -- '--decode' || fail "tokenize --help"

# ---- byte-level BPE (RoBERTa-style fixture): HF's ids, tokens and decodes ------------------------
mkdir -p "$TMP/roberta"
cp "$DATA/bpe_roberta.json" "$TMP/roberta/tokenizer.json"
# Every fixture line that is one line of text (no \n or \r in it) with the ids HF gives, the
# token strings (the vocab's spelling, escaped as the CLI escapes) and HF's decodes.
python3 - "$DATA" "$TMP" <<'EOF'
import json, os, sys
data, tmp = sys.argv[1], sys.argv[2]
tok = json.load(open(os.path.join(data, "bpe_roberta.json"), encoding="utf-8"))
token = {i: t for t, i in tok["model"]["vocab"].items()}
token.update({a["id"]: a["content"] for a in tok["added_tokens"]})
def esc(s):
    named = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    out = []
    for c in s:
        o = ord(c)
        if c in named: out.append(named[c])
        elif o <= 0x20 or o == 0x7f: out.append("\\x%02x" % o)
        elif 0x80 <= o <= 0x9f or o in (0x2028, 0x2029): out.append("\\u%04x" % o)
        else: out.append(c)
    return "".join(out)
corpus = [bytes.fromhex(json.loads(l)["hex"]) for l in open(os.path.join(data, "corpus.jsonl"))]
files = {k: open(os.path.join(tmp, k), "wb") for k in
         ("text", "ids", "nospecial", "tokens", "decode", "decode_skip")}
n = 0
for line in open(os.path.join(data, "bpe_cases.jsonl"), encoding="utf-8"):
    r = json.loads(line)
    text = corpus[r["line"]] if r["line"] >= 0 else bytes.fromhex(r["hex"])
    dec, skip = bytes.fromhex(r["decode_roberta"]), bytes.fromhex(r["decode_roberta_skip"])
    if any(b in x for x in (text, dec, skip) for b in (b"\n", b"\r")):
        continue
    files["text"].write(text + b"\n")
    files["ids"].write(" ".join(map(str, r["roberta"])).encode() + b"\n")
    files["nospecial"].write(" ".join(map(str, r["nospecial"])).encode() + b"\n")
    files["tokens"].write(" ".join(esc(token[i]) for i in r["roberta"]).encode() + b"\n")
    files["decode"].write(dec + b"\n")
    files["decode_skip"].write(skip + b"\n")
    n += 1
assert n > 150, n
EOF
R="$TMP/roberta"
run "$TMP/got_ids" tokenize --model "$R" --input "$TMP/text"
same "roberta: ids of $(wc -l <"$TMP/text") lines equal HF's" "$TMP/got_ids" "$TMP/ids"
run "$TMP/got_nospecial" tokenize --model "$R" --no-special <"$TMP/text"
same "roberta: --no-special" "$TMP/got_nospecial" "$TMP/nospecial"
run "$TMP/got_tokens" tokenize --model "$R" --tokens --input "$TMP/text"
same "roberta: --tokens" "$TMP/got_tokens" "$TMP/tokens"
run "$TMP/got_decode" tokenize --model "$R" --decode --input "$TMP/got_ids"
same "roberta: --decode of the ids (round trip)" "$TMP/got_decode" "$TMP/decode"
run "$TMP/got_decode_skip" tokenize --model "$R" --decode --no-special --input "$TMP/got_ids"
same "roberta: --decode --no-special skips special tokens" "$TMP/got_decode_skip" "$TMP/decode_skip"
printf 'Hello world\n' >"$TMP/hello"
# a file that is neither a folder nor a GGUF file
expect_fail 1 "tokenizer.json" "$TMP/hello" -- tokenize --model "$R/tokenizer.json"

# ---- escapes in --tokens: a space, a tab and a backslash inside added tokens ----------------------
mkdir -p "$TMP/small"
python3 - "$DATA/small_tokenizer.json" "$TMP/small/tokenizer.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
n = max(a["id"] for a in j["added_tokens"]) + 1
for k, content in enumerate(["a\\b", "x\ty", "\u2028"]):
    j["added_tokens"].append({"id": n + k, "content": content, "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": False,
                              "special": False})
json.dump(j, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
EOF
printf '<ent> New York a\\b x\ty \xe2\x80\xa8\n' >"$TMP/esc_in"
printf '[CLS] <ent> new\\x20york a\\\\b x\\ty \\u2028 [SEP]\n' >"$TMP/esc_want"
run "$TMP/esc_got" tokenize --model "$TMP/small" --tokens --input "$TMP/esc_in"
same "--tokens escapes a space, a backslash, a tab and U+2028" "$TMP/esc_got" "$TMP/esc_want"
printf '2 5 21 6 23 3\n\n5 7 8 9\n' >"$TMP/small_ids"
printf '[CLS] hello, world! [SEP]\n\nhello unaffable\n' >"$TMP/small_want"
run "$TMP/small_got" tokenize --model "$TMP/small" --decode --input "$TMP/small_ids"
same "WordPiece --decode (an empty line stays empty)" "$TMP/small_got" "$TMP/small_want"

# ---- a GGUF file's tokenizer (scripts/make_gguf_tokenizer_fixtures.py): ids and decodes ----------
for g in tiny_llama tiny_gpt2_qwen2; do
    [ -f "$DATA/gguf/$g.gguf" ] || { echo "skip $g.gguf (not there)"; continue; }
    python3 - "$DATA" "$TMP" "$g" <<'EOF'
import json, os, sys
data, tmp, g = sys.argv[1:]
out = {k: open(os.path.join(tmp, "%s_%s" % (g, k)), "wb")
       for k in ("text", "ids", "nospecial", "decode", "decode_skip")}
n = 0
for line in open(os.path.join(data, "gguf_cases.jsonl"), encoding="utf-8"):
    r = json.loads(line)
    text = bytes.fromhex(r["hex"])
    dec = bytes.fromhex(r[g + "/decode"])
    skip = bytes.fromhex(r[g + "/decode_skip"])
    if any(b in x for x in (text, dec, skip) for b in (b"\n", b"\r")):
        continue
    out["text"].write(text + b"\n")
    out["ids"].write(" ".join(map(str, r[g])).encode() + b"\n")
    out["nospecial"].write(" ".join(map(str, r[g + "/nospecial"])).encode() + b"\n")
    out["decode"].write(dec + b"\n")
    out["decode_skip"].write(skip + b"\n")
    n += 1
assert n > 150, n
EOF
    G="$DATA/gguf/$g.gguf"
    run "$TMP/got" tokenize --model "$G" --input "$TMP/${g}_text"
    same "$g.gguf: ids equal HF's" "$TMP/got" "$TMP/${g}_ids"
    run "$TMP/got" tokenize --model "$G" --no-special --input "$TMP/${g}_text"
    same "$g.gguf: --no-special" "$TMP/got" "$TMP/${g}_nospecial"
    run "$TMP/got" tokenize --model "$G" --decode --input "$TMP/${g}_ids"
    same "$g.gguf: --decode" "$TMP/got" "$TMP/${g}_decode"
    run "$TMP/got" tokenize --model "$G" --decode --no-special --input "$TMP/${g}_ids"
    same "$g.gguf: --decode --no-special" "$TMP/got" "$TMP/${g}_decode_skip"
done

# ---- all-MiniLM-L6-v2 (vocab of bert-base-uncased) -----------------------------------------------
if [ -n "${NOPAD_MINILM_DIR:-}" ] && [ -f "$NOPAD_MINILM_DIR/config.json" ]; then
    M="$NOPAD_MINILM_DIR"
    printf "Hello, world!\nI'm here\tnow\n\n" >"$TMP/m_in"
    printf '101 7592 1010 2088 999 102\n101 1045 1005 1049 2182 2085 102\n101 102\n' >"$TMP/m_want"
    run "$TMP/m_got" tokenize --model "$M" --input "$TMP/m_in"
    same "MiniLM: ids" "$TMP/m_got" "$TMP/m_want"
    printf "[CLS] hello , world ! [SEP]\n[CLS] i ' m here now [SEP]\n[CLS] [SEP]\n" >"$TMP/m_want"
    run "$TMP/m_got" tokenize --model "$M" --tokens --input "$TMP/m_in"
    same "MiniLM: --tokens" "$TMP/m_got" "$TMP/m_want"
    run "$TMP/m_ids" tokenize --model "$M" --input "$TMP/m_in"
    printf "hello, world!\ni ' m here now\n\n" >"$TMP/m_want"
    run "$TMP/m_got" tokenize --model "$M" --decode --no-special --input "$TMP/m_ids"
    same "MiniLM: --decode --no-special round trip" "$TMP/m_got" "$TMP/m_want"
else
    echo "skip all-MiniLM-L6-v2 (set NOPAD_MINILM_DIR; scripts/fetch_default_model.sh)"
fi

# ---- errors --------------------------------------------------------------------------------------
expect_fail 2 "missing --model" "$TMP/hello" -- tokenize
expect_fail 2 "unknown option" "$TMP/hello" -- tokenize --model "$R" --frobnicate
expect_fail 2 "do not go together" "$TMP/hello" -- tokenize --model "$R" --tokens --decode
expect_fail 2 "unexpected argument" "$TMP/hello" -- tokenize --model "$R" extra
expect_fail 1 "cannot open input" /dev/null -- tokenize --model "$R" --input "$TMP/no_such_file"
expect_fail 1 "does not exist" "$TMP/hello" -- tokenize --model "$TMP/no_such_model"
mkdir -p "$TMP/empty_model"
expect_fail 1 "no tokenizer.json or vocab.txt" "$TMP/hello" -- tokenize --model "$TMP/empty_model"
printf 'fine\nbad \xff byte\n' >"$TMP/bad_utf8"
expect_fail 1 "line 2" "$TMP/bad_utf8" -- tokenize --model "$R"
expect_fail 1 "not valid UTF-8" "$TMP/bad_utf8" -- tokenize --model "$R"
printf '1 2\n3 four 5\n' >"$TMP/bad_ids"
expect_fail 1 "line 2, token 2 (column 3): 'four' is not a number" "$TMP/bad_ids" -- \
    tokenize --model "$R" --decode
printf '1 2\x01\n' >"$TMP/ctrl_ids"
expect_fail 1 "byte 0x01 at column 4" "$TMP/ctrl_ids" -- tokenize --model "$R" --decode
printf '1 99999999999999999999\n' >"$TMP/big_ids"
expect_fail 1 "outside the vocabulary" "$TMP/big_ids" -- tokenize --model "$R" --decode
printf '1 -3\n' >"$TMP/neg_ids"
expect_fail 1 "token id -3 is outside the vocabulary" "$TMP/neg_ids" -- \
    tokenize --model "$R" --decode
# a decoder nopad lacks: text still tokenizes, --decode names the decoder
python3 - "$DATA/small_tokenizer.json" "$TMP/undec" <<'EOF'
import json, os, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
j["decoder"] = {"type": "NoSuchDecoder"}
os.makedirs(sys.argv[2], exist_ok=True)
json.dump(j, open(os.path.join(sys.argv[2], "tokenizer.json"), "w"))
EOF
run "$TMP/got" tokenize --model "$TMP/undec" --input "$TMP/hello"
printf '5 6\n' >"$TMP/two_ids"
expect_fail 1 "NoSuchDecoder" "$TMP/two_ids" -- tokenize --model "$TMP/undec" --decode

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)" >&2
    exit 1
fi
echo "all passed"
