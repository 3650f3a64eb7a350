#!/usr/bin/env bash
# `nopad bench`: runs a point on a tiny fixture model, reports sane numbers, and refuses bad input.
set -euo pipefail
: "${NOPAD_CLI:?}" "${NOPAD_TEST_DATA:?}"
M="$NOPAD_TEST_DATA/models/albert_b"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$NOPAD_CLI" bench --model "$M" --batch 5 --max 30 --iters 3 --warmup 1 --json)
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines()]
point, memory = rows[0], rows[-1]
assert point["batch"] == 5 and point["max"] == 30, point
assert 5 * 6 <= point["tokens"] <= 5 * 30, point          # lengths in [ceil(0.2*30), 30]
assert point["ms"] > 0 and point["tokens_per_s"] > 0 and point["tflops"] > 0, point
assert memory["weights_bytes"] > 0 and memory["workspace_bytes"] > 0, memory
print("bench json ok:", point)
PY
table=$("$NOPAD_CLI" bench --model "$M" --batch 2 --max 8 --iters 2)
[[ "$table" == *"| 2 x 8 |"* ]] || fail "table has no 2 x 8 row: $table"

# expect_error CODE PATTERN ARGS...: the command exits with CODE and stderr mentions PATTERN
expect_error() {
    local want=$1 pattern=$2 rc=0
    shift 2
    "$NOPAD_CLI" "$@" >/dev/null 2>"$TMP/err" || rc=$?
    [ "$rc" = "$want" ] || fail "nopad $* exited $rc, expected $want: $(cat "$TMP/err")"
    grep -q -- "$pattern" "$TMP/err" || fail "nopad $*: stderr lacks '$pattern': $(cat "$TMP/err")"
}
expect_error 1 "no point of the grid fits" bench --model "$M" --iters 1  # 40 positions
expect_error 2 "go together" bench --model "$M" --batch 2
expect_error 1 "at most" bench --model "$M" --batch 2 --max 100
expect_error 2 "model is required" bench
expect_error 2 "unknown option" bench --model "$M" --fast
expect_error 1 "does not exist" bench --model /nonexistent --batch 1 --max 4
echo "cli_bench: ok"
