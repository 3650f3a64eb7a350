# Shared by the `nopad serve` CLI tests (sourced, not a test itself): a temporary folder, servers
# killed at exit, fail/ok counting, and starting and stopping a server on a free port.
# Needs NOPAD_CLI; exits 0 with SKIP when nopad was built without libmicrohttpd.
: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
TMP="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
ok() { echo "ok   $*"; }

if ! "$NOPAD_CLI" serve --help >/dev/null 2>"$TMP/err"; then
    echo "SKIP: nopad was built without libmicrohttpd: $(cat "$TMP/err")"
    exit 0
fi

# start NAME ARGS...: nopad serve --port 0 "${SERVE_ARGS[@]}" ARGS in the background, its log in
# $TMP/NAME.log; sets PID and PORT.
SERVE_ARGS=()
start() {
    local name="$1"
    shift
    # the log exists before the loop reads it: the background shell may not have opened it yet
    # (sed on a missing file would end the script under set -e)
    : >"$TMP/$name.log"
    "$NOPAD_CLI" serve --port 0 "${SERVE_ARGS[@]}" "$@" 2>"$TMP/$name.log" &
    PID=$!
    PIDS+=("$PID")
    PORT=""
    for _ in $(seq 1 600); do
        PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$TMP/$name.log")
        [ -n "$PORT" ] && return 0
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    fail "$name: the server did not start: $(cat "$TMP/$name.log")"
    exit 1
}

# stop [NAME]: SIGTERM, which must end the server with exit status 0 (NAME: the start's, whose
# log's end a failure shows).
stop() {
    local rc=0
    kill -TERM "$PID"
    wait "$PID" || rc=$?
    if [ "$rc" -eq 0 ]; then
        ok "${1:+$1: }SIGTERM: exit 0"
    else
        fail "${1:+$1: }SIGTERM: exit $rc${1:+: $(tail -3 "$TMP/$1.log")}"
    fi
}
