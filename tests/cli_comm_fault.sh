#!/usr/bin/env bash
# A rank that dies in the middle of a collective must never leave the others hanging: under
# mpirun, the job ends with a non-zero status and a message naming the dead rank, within 60 s.
# Two deaths: SIGKILL (nothing runs after it), and a plain exit(3) while the others wait in an
# all-reduce (the library aborts MPI's world at a failing exit instead of finalising, which would
# wait for the others forever). tests/mpi_comm.c's fault mode
# (NOPAD_TEST_KILL_RANK / NOPAD_TEST_EXIT_RANK) runs all-reduces until then. The bound is checked on
# the exit status and the clock, with `timeout 90` so that a hang fails instead of stalling ctest.
# Needs the MPI build: NOPAD_MPI_COMM (the mpi_comm binary) and MPIEXEC come from tests/CMakeLists.txt;
# without them the test is skipped (77).
set -uo pipefail
if [ -z "${NOPAD_MPI_COMM:-}" ] || [ -z "${MPIEXEC:-}" ]; then
    echo "cli_comm_fault: no MPI in this build, skipped"
    exit 77
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail=0

# run_fault <label> <env var> <pattern the message must match>
run_fault() {
    local label=$1 var=$2 pattern=$3
    local start status ms
    start=$(date +%s%N)
    env "$var=1" OMP_NUM_THREADS=1 timeout 90 "$MPIEXEC" --allow-run-as-root --oversubscribe --bind-to none \
        -np 3 "$NOPAD_MPI_COMM" >"$log" 2>&1
    status=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    echo "cli_comm_fault: $label: mpirun exited with $status after $ms ms"
    if [ "$status" -eq 0 ]; then
        echo "FAIL: $label: mpirun returned 0 although rank 1 died"; fail=1
    elif [ "$status" -eq 124 ] || [ "$ms" -ge 60000 ]; then
        echo "FAIL: $label: the job took $ms ms to end (bound: 60 s; status 124: killed by timeout)"; fail=1
    fi
    if ! tr "\n" " " <"$log" | grep -Eq "$pattern"; then  # Open MPI wraps its lines
        echo "FAIL: $label: the message does not name the dead rank (expected /$pattern/):"; fail=1
        sed 's/^/  | /' "$log"
    fi
}

# Open MPI: "mpirun noticed that process rank 1 with PID ... exited on signal 9 (Killed)."
run_fault "rank 1 killed (SIGKILL)" NOPAD_TEST_KILL_RANK "process rank 1 .*signal 9"
# the library, at the failing exit: "nopad: rank 1 of 3 exits with status 3: aborting the MPI job"
run_fault "rank 1 exits with status 3" NOPAD_TEST_EXIT_RANK "rank 1 of 3 exits with status 3"
exit $fail
