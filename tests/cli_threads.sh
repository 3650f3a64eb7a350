#!/usr/bin/env bash
# The CLI's OpenMP wait policy: idle workers spin 1,000 turns before they sleep (libgomp's default,
# 300,000, stalls every parallel region when other processes want the cores; docs/cpu.md), a
# policy the user chose is kept, and the restart that applies it keeps the
# command's arguments and exit status. libgomp prints the policy it runs with under
# OMP_DISPLAY_ENV=verbose, once per process start: the last block is the one the command ran with.
set -euo pipefail

: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
# spincount ENV...: the GOMP_SPINCOUNT libgomp ran `nopad --version` with, under ENV (the
# test environment's OMP_WAIT_POLICY and GOMP_SPINCOUNT removed first).
spincount() {
    env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$@" OMP_DISPLAY_ENV=verbose "$NOPAD_CLI" --version \
        >"$TMP/out" 2>"$TMP/err"
    grep -o "GOMP_SPINCOUNT = '[0-9]*'" "$TMP/err" | tail -n 1 | tr -dc '0-9'
}
# expect NAME GOT WANT
expect() {
    if [[ "$2" == "$3" ]]; then echo "ok   $1"; else fail "$1: got '$2', expected '$3'"; fi
}

expect "default: 1000 turns of spinning" "$(spincount)" 1000
grep -q '^nopad ' "$TMP/out" || fail "default: --version printed nothing after the restart"
expect "OMP_WAIT_POLICY=active is kept" "$(spincount OMP_WAIT_POLICY=active)" 30000000000
expect "OMP_WAIT_POLICY=passive is kept" "$(spincount OMP_WAIT_POLICY=passive)" 0
expect "GOMP_SPINCOUNT=5000 is kept" "$(spincount GOMP_SPINCOUNT=5000)" 5000

# The restart keeps the arguments and the exit status (2: bad command line).
rc=0
env -u OMP_WAIT_POLICY "$NOPAD_CLI" no-such-command >"$TMP/out" 2>"$TMP/err" || rc=$?
expect "restart keeps the exit status" "$rc" 2
grep -q "unknown command 'no-such-command'" "$TMP/err" || fail "restart lost the arguments: $(head -c 200 "$TMP/err")"

# The restart keeps the process's name in ps and top ("nopad", not "exe"): a tokenize waiting
# for its stdin (a FIFO this test holds open) is looked at once its environment shows the restart.
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
mkfifo "$TMP/stdin"
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$NOPAD_CLI" tokenize --model "$NOPAD_TEST_DATA/models/st_max" \
    <"$TMP/stdin" >"$TMP/tok" 2>&1 &
pid=$!
exec 3>"$TMP/stdin"
for _ in $(seq 100); do # up to 20 s on a busy machine
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'GOMP_SPINCOUNT=1000' && break
    sleep 0.2
done
expect "restart keeps the process name" "$(cat "/proc/$pid/comm" 2>/dev/null)" nopad
echo "hello" >&3
exec 3>&-
wait "$pid" || fail "tokenize after the restart failed: $(head -c 200 "$TMP/tok")"

if [[ $failures -gt 0 ]]; then
    echo "$failures failure(s)" >&2
    exit 1
fi
echo "all passed"
