#!/usr/bin/env bash
# End-to-end tests of `nopad classify` and `nopad rerank` on the tiny classifiers of
# scripts/make_deberta_fixtures.py (BERT 3 labels, XLM-R one-label reranker, DeBERTa-v3 2 labels):
# each folder gets its parity tokenizer.json copied in, and the logits of the texts alone and of
# the (query, text) pairs must be HF's (golden_text.json) within 1e-4, the bound of
# tests/test_heads.c (observed ~2e-7); then the refusals.
set -euo pipefail

: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
ROOT="$(cd "$NOPAD_TEST_DATA/../.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# compare OUT GOLDEN_TEXT_JSON MODE: MODE classify (logits of each text) or rerank (pair logits)
compare() {
    python3 - "$@" <<'EOF' || fail "compare $*"
import json, math, sys
out, golden, mode = sys.argv[1:4]
g = json.load(open(golden))
rows = [json.loads(line) for line in open(out)]
want = g["pair_logits" if mode == "rerank" else "logits"]
assert len(rows) == len(want), (len(rows), len(want))
worst = 0.0
for i, (row, w) in enumerate(zip(rows, want)):
    if mode == "rerank" or len(w) == 1:
        got = [row["logit"]]
        assert abs(row["score"] - 1 / (1 + math.exp(-w[0]))) <= 1e-4, (i, row)
        if mode == "rerank":
            assert row["index"] == i, (i, row)
    else:
        got = row["logits"]
        best = max(range(len(w)), key=lambda k: w[k])
        assert row["label"] == g["labels"][best], (i, row, g["labels"][best])
        p = 1 / sum(math.exp(x - w[best]) for x in w)
        assert abs(row["score"] - p) <= 1e-4, (i, row, p)
    worst = max(worst, max(abs(a - b) for a, b in zip(got, w)))
assert worst <= 1e-4, worst
print("   %s: %d lines, max |logit - HF| %.2e" % (mode, len(rows), worst))
EOF
}

for name in bert_cls xlmr_rerank deberta_v3_a; do
    echo "== $name"
    src="$NOPAD_TEST_DATA/models/$name"
    dir="$TMP/$name"
    mkdir -p "$dir"
    cp "$src/config.json" "$src/model.safetensors" "$dir/"
    cp "$ROOT/$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokenizer"])' "$src/golden_text.json")" \
        "$dir/tokenizer.json"
    python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["texts"]))' "$src/golden_text.json" \
        >"$dir/texts.txt"
    query="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["query"])' "$src/golden_text.json")"
    "$NOPAD_CLI" classify --model "$dir" --input "$dir/texts.txt" >"$dir/classify.jsonl" || fail "$name classify"
    compare "$dir/classify.jsonl" "$src/golden_text.json" classify
    # batches of a few tokens: the same results, lines in order
    "$NOPAD_CLI" classify --model "$dir" --batch-tokens 8 <"$dir/texts.txt" >"$dir/small.jsonl" || fail "$name small"
    compare "$dir/small.jsonl" "$src/golden_text.json" classify
    if [ "$name" = xlmr_rerank ]; then
        "$NOPAD_CLI" rerank --model "$dir" --query "$query" --input "$dir/texts.txt" --output "$dir/rerank.jsonl" ||
            fail "$name rerank"
        compare "$dir/rerank.jsonl" "$src/golden_text.json" rerank
        # --truncate: every pair fits 12 ids; without it the long ones are refused
        printf '%s' "a long document that goes on and on about cats and mats " >"$dir/long.txt"
        for _ in 1 2 3 4; do cat "$dir/long.txt" "$dir/long.txt" >"$dir/l2" && mv "$dir/l2" "$dir/long.txt"; done
        echo >>"$dir/long.txt"
        if "$NOPAD_CLI" rerank --model "$dir" --query "$query" --input "$dir/long.txt" >/dev/null 2>"$dir/err"; then
            fail "a pair past the maximum ran without --truncate"
        fi
        grep -q "line 1: the pair of [0-9]* tokens is longer than the model's maximum sequence length 96" "$dir/err" ||
            fail "long pair message: $(cat "$dir/err")"
        "$NOPAD_CLI" rerank --model "$dir" --query "$query" --input "$dir/long.txt" --truncate >"$dir/t.jsonl" ||
            fail "--truncate"
        [ "$(wc -l <"$dir/t.jsonl")" = 1 ] || fail "--truncate output"
    fi
done

# ---- refusals ------------------------------------------------------------------------------------
expect_error() { # expected-exit-status message-fragment args...
    local want="$1" msg="$2" rc=0
    shift 2
    echo "hello" | "$NOPAD_CLI" "$@" >/dev/null 2>"$TMP/err" || rc=$?
    [ "$rc" = "$want" ] || fail "nopad $* -> exit $rc, want $want"
    grep -qF -- "$msg" "$TMP/err" || fail "nopad $*: message '$(cat "$TMP/err")' lacks '$msg'"
}
expect_error 1 "nopad rerank needs a one-label head" rerank --model "$TMP/bert_cls" --query q
expect_error 1 "has no sequence-classification head" classify --model "$NOPAD_TEST_DATA/models/bert_a"
expect_error 1 "no tokenizer.json or vocab.txt" classify --model "$NOPAD_TEST_DATA/models/deberta_v2_b"
expect_error 2 "missing --query TEXT" rerank --model "$TMP/xlmr_rerank"
expect_error 2 "--query belongs to nopad rerank" classify --model "$TMP/xlmr_rerank" --query q
expect_error 2 "missing --model DIR" classify
: >"$TMP/empty.txt"
rc=0
"$NOPAD_CLI" classify --model "$TMP/bert_cls" --input "$TMP/empty.txt" 2>"$TMP/err" || rc=$?
[ "$rc" = 1 ] && grep -q "no input lines" "$TMP/err" || fail "empty input: exit $rc, $(cat "$TMP/err")"
"$NOPAD_CLI" info --model "$NOPAD_TEST_DATA/models/deberta_v2_b" | grep -q '^labels: *3 (contradiction, neutral, entailment)$' ||
    fail "info labels"
[ "$("$NOPAD_CLI" info --json --model "$TMP/bert_cls" | python3 -c 'import json,sys; print(json.load(sys.stdin)["labels"])')" = \
    "['sports', 'politics', 'science']" ] || fail "info --json labels"
"$NOPAD_CLI" classify --help | grep -q -- '--batch-tokens' || fail "classify --help"
"$NOPAD_CLI" rerank --help | grep -q -- '--query' || fail "rerank --help"

if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)" >&2
    exit 1
fi
echo "cli_classify: all passed"
