#!/usr/bin/env bash
# End-to-end tests of `nopad embed` and `nopad info` on the golden fixtures of tests/data
# (made by scripts/make_golden_fixtures.py and scripts/make_minilm_fixtures.py), and on
# all-MiniLM-L6-v2 when NOPAD_MINILM_DIR holds it. Numeric checks are in tests/cli_check.py.
#
# The CLI passes no token type ids (all zero), so hidden-state goldens are compared on the
# sequences whose golden token types are all zero; the other sequences still run (pooling
# consistency, shapes, batching).
#
# A Python start (numpy's import) costs about 1 s on a busy machine, and there are over 400
# checks: the checks are queued while the CLI runs and run in one Python process at the end
# (run_checks), and the fixtures' ids and facts are read in one process before (prepare).
# Each model prints a line with the elapsed time, so a long run shows where it is.
set -euo pipefail

: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECK=(python3 "$HERE/cli_check.py")
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
# Runs the CLI; on a non-zero exit shows its stderr and counts a failure.
run() {
    local rc=0
    "$NOPAD_CLI" "$@" 2>"$TMP/stderr" || rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "nopad $* -> exit $rc: $(cat "$TMP/stderr")"
        return 1
    fi
}
CHECKS="$TMP/checks"
: >"$CHECKS"
# check ARGS...: queues `cli_check.py ARGS` (one shell-quoted line), run by run_checks.
check() {
    printf '%q ' "$@" >>"$CHECKS"
    printf '\n' >>"$CHECKS"
}
# note TEXT: a line run_checks prints before the checks queued after it.
note() { printf '# %s\n' "$*" >>"$CHECKS"; }
# Runs every queued check in one Python process; a failed one prints FAIL and its arguments.
run_checks() {
    echo "== running $(grep -vc '^#' "$CHECKS") queued checks"
    python3 - "$HERE" "$CHECKS" <<'EOF' || fail "queued checks"
import shlex, sys
sys.path.insert(0, sys.argv[1])
import cli_check
failed = 0
for line in open(sys.argv[2], encoding="utf-8"):
    if line.startswith("# "):
        print(line[2:], end="", flush=True)
        continue
    args = shlex.split(line)
    try:
        cli_check.COMMANDS[args[0]](*args[1:])
        continue
    except SystemExit as e:
        if not e.code:
            continue
    except Exception as e:  # a missing or malformed output file
        print(f"FAIL: {type(e).__name__}: {e}", file=sys.stderr)
    failed += 1
    print(f"FAIL: check {shlex.join(args)}", file=sys.stderr)
print(f"{failed} queued check(s) failed" if failed else "every queued check passed")
sys.exit(1 if failed else 0)
EOF
}
START=$SECONDS
elapsed() { echo "$((SECONDS - START)) s"; }

# ---- version and help ------------------------------------------------------------------------
"$NOPAD_CLI" --version | grep -Eq '^nopad [0-9]+\.[0-9]+\.[0-9]+ \(build [0-9a-z-]+\)$' || fail "--version"
"$NOPAD_CLI" --help | grep -q 'usage: nopad' || fail "--help"
"$NOPAD_CLI" embed --help | grep -q -- '--batch-tokens' || fail "embed --help"
"$NOPAD_CLI" info --help | grep -q -- '--json' || fail "info --help"

# ---- every fixture model -----------------------------------------------------------------------
models=()
for dir in "$NOPAD_TEST_DATA"/models/*/; do
    dir="${dir%/}"
    name="$(basename "$dir")"
    [ -f "$dir/config.json" ] && [ -f "$dir/golden.safetensors" ] || continue
    mkdir -p "$TMP/$name"
    # info: text and JSON
    if run info --model "$dir" >"$TMP/$name/info.txt"; then
        grep -Eq '^family: +[A-Za-z]+' "$TMP/$name/info.txt" || fail "$name: info has no family line"
    fi
    run info --model "$dir" --json >"$TMP/$name/info.json" && models+=("$dir")
done
[ "${#models[@]}" -gt 0 ] || fail "no fixture models under $NOPAD_TEST_DATA/models"

# prepare: per model, meta (kind, hidden size, family, whether the golden has pooled outputs) and,
# for an encoder, the golden ids as --ids lines (ids.txt) with KEEP, the sequences whose token
# types are all zero (keep.json).
python3 - "$HERE" "$TMP" "${models[@]}" <<'EOF'
import contextlib, json, os, sys
sys.path.insert(0, sys.argv[1])
import cli_check
tmp = sys.argv[2]
for d in sys.argv[3:]:
    w = os.path.join(tmp, os.path.basename(d))
    info = json.load(open(os.path.join(w, "info.json")))
    golden = os.path.join(d, "golden.safetensors")
    pooled = 0
    if info["kind"] != "decoder":  # decoders: cli_generate.sh tests them
        with open(os.path.join(w, "ids_note.txt"), "w") as f, contextlib.redirect_stdout(f):
            cli_check.cmd_golden_ids(golden, os.path.join(w, "ids.txt"), os.path.join(w, "keep.json"))
        pooled = int("pooled" in cli_check.load_safetensors(golden))
    with open(os.path.join(w, "meta.txt"), "w") as f:
        f.write(f"{info['kind']} {info.get('hidden_size', 0)} {info.get('family', '?')} {pooled}\n")
EOF

n=0
for dir in "${models[@]}"; do
    name="$(basename "$dir")"
    golden="$dir/golden.safetensors"
    W="$TMP/$name"
    n=$((n + 1))
    read -r kind H family pooled <"$W/meta.txt"
    echo "== $name ($n of ${#models[@]}, $(elapsed))"
    note "== $name"
    if [ "$kind" = decoder ]; then
        echo "   a decoder: cli_generate.sh tests it"  # the goldens of make_decoder_fixtures.py
        continue
    fi
    echo "   family $family, hidden $H"
    sed 's/^/   ids: /' "$W/ids_note.txt"
    B="$(wc -l <"$W/ids.txt")"

    # Last hidden states, npy and jsonl, against the golden.
    if run embed --model "$dir" --ids --pooling none --format npy --input "$W/ids.txt" \
        --output "$W/hidden.npy"; then
        check hidden "$W/hidden.npy" "$golden" "$W/keep.json" 1e-4
    fi
    if run embed --model "$dir" --ids --pooling none --input "$W/ids.txt" >"$W/hidden.jsonl"; then
        check hidden "$W/hidden.jsonl" "$golden" "$W/keep.json" 1e-4
        check same "$W/hidden.jsonl" "$W/hidden.npy" 0 # both formats hold the same floats
    fi
    # npy to a pipe (not seekable: held in memory, header written at the end).
    if "$NOPAD_CLI" embed --model "$dir" --ids --pooling none --format npy <"$W/ids.txt" |
        cat >"$W/hidden_pipe.npy"; then
        check same "$W/hidden_pipe.npy" "$W/hidden.npy" 0
    else
        fail "$name: npy to a pipe"
    fi
    # Batching does not change results: one token per batch budget (each sequence alone).
    if run embed --model "$dir" --ids --pooling none --batch-tokens 1 --input "$W/ids.txt" \
        --output "$W/hidden_b1.npy"; then
        check same "$W/hidden_b1.npy" "$W/hidden.npy" 1e-6
    fi

    # Pooling: shapes, and agreement with pooling the hidden states here.
    for mode in cls mean max; do
        if run embed --model "$dir" --ids --pooling "$mode" --no-normalize --input "$W/ids.txt" \
            --output "$W/$mode.npy"; then
            check shape "$W/$mode.npy" "$B" "$H"
            check pooling "$W/$mode.npy" "$W/hidden.npy" "$golden" "$mode" 1e-5
        fi
        if run embed --model "$dir" --ids --pooling "$mode" --normalize --input "$W/ids.txt" \
            >"$W/$mode.jsonl"; then
            check shape "$W/$mode.jsonl" "$B" "$H"
            check unit-norm "$W/$mode.jsonl"
        fi
    done

    # sentence-transformers folders: the folder's own pooling and normalisation by default.
    if [ "$pooled" = 1 ]; then
        if run embed --model "$dir" --ids --input "$W/ids.txt" --output "$W/default.npy"; then
            check cosine "$W/default.npy" "$golden" pooled 0.9999 "$W/keep.json"
        fi
        # The same sentences as text, through the folder's tokenizer.
        if [ -f "$dir/golden_texts.txt" ]; then
            grep -vn '^<ids only' "$dir/golden_texts.txt" >"$W/texts_numbered.txt" || true
            cut -d: -f2- "$W/texts_numbered.txt" >"$W/texts.txt"
            # the 0-based indices of the lines kept, as a JSON list
            cut -d: -f1 "$W/texts_numbered.txt" | awk '{ printf "%s%d", (NR > 1 ? ", " : "["), $1 - 1 }
                END { print NR ? "]" : "[]" }' >"$W/text_keep.json"
            if run embed --model "$dir" --input "$W/texts.txt" --output "$W/text.npy"; then
                check cosine "$W/text.npy" "$golden" pooled 0.9999 "$W/text_keep.json"
            fi
        fi
    fi
done

# ---- all-MiniLM-L6-v2 --------------------------------------------------------------------------
MINILM="${NOPAD_MINILM_DIR:-}"
EXPECTED="$NOPAD_TEST_DATA/minilm/expected.safetensors"
if [ -z "$MINILM" ] || [ ! -f "$MINILM/config.json" ]; then
    echo "******************************************************************************"
    echo "SKIP: MiniLM CLI tests: NOPAD_MINILM_DIR='${MINILM}' does not hold the model"
    echo "      (scripts/fetch_default_model.sh downloads it)"
    echo "******************************************************************************"
else
    echo "== all-MiniLM-L6-v2 ($MINILM, $(elapsed))"
    note "== all-MiniLM-L6-v2"
    W="$TMP/minilm"
    mkdir -p "$W"
    sentences="$NOPAD_TEST_DATA/minilm/sentences.txt"
    read -r B T <<<"$("${CHECK[@]}" count "$EXPECTED")"
    if run embed --model "$MINILM" --input "$sentences" --output "$W/emb.npy"; then
        check shape "$W/emb.npy" "$B" 384
        check cosine "$W/emb.npy" "$EXPECTED" embeddings 0.9999
        check unit-norm "$W/emb.npy"
    fi
    # jsonl from stdin gives the same embeddings.
    if run embed --model "$MINILM" <"$sentences" >"$W/emb.jsonl"; then
        check same "$W/emb.jsonl" "$W/emb.npy" 0
    fi
    # Per-token states: the tokenizer must give the same T, the states the golden's.
    if run embed --model "$MINILM" --pooling none --input "$sentences" --output "$W/hidden.npy"; then
        check shape "$W/hidden.npy" "$T" 384
        check hidden "$W/hidden.npy" "$EXPECTED" all 1e-3
    fi
    # Batching does not change results: ~10 batches of a few sentences (the tiny models above
    # run one sequence per batch; here that would cost 46 forwards).
    if run embed --model "$MINILM" --batch-tokens 100 --input "$sentences" --output "$W/emb_b100.npy"; then
        check same "$W/emb_b100.npy" "$W/emb.npy" 1e-6
    fi
    # Long texts: an error without --truncate, the sentence-transformers result with it.
    long="$NOPAD_TEST_DATA/minilm/long.txt"
    long_expected="$NOPAD_TEST_DATA/minilm/long_expected.safetensors"
    if [ -f "$long" ] && [ -f "$long_expected" ]; then
        rc=0
        "$NOPAD_CLI" embed --model "$MINILM" --input "$long" >/dev/null 2>"$W/long.err" || rc=$?
        [ "$rc" -eq 1 ] && grep -q 'line 1:.*longer' "$W/long.err" ||
            fail "MiniLM long text without --truncate: exit $rc, $(cat "$W/long.err")"
        if run embed --model "$MINILM" --truncate --input "$long" --output "$W/long.npy"; then
            check cosine "$W/long.npy" "$long_expected" embeddings 0.9999
        fi
    fi
fi

run_checks
echo "done in $(elapsed)"
if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)" >&2
    exit 1
fi
echo "all CLI embed tests passed"
