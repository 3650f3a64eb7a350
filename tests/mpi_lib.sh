# Shared by the CLI tests that run nopad under mpirun (sourced, not a test itself): mpirun found
# (the test SKIPs without it), the launch line these 2-core machines need, and the fault tests'
# two halves: killing rank 1 of a running job once it has got somewhere, and checking that the
# job then ended within 60 s, naming the dead rank.
: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
MPIRUN="${NOPAD_MPIRUN:-$(command -v mpirun || true)}"
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun"
    exit 0
fi
MPI=("$MPIRUN" --allow-run-as-root --oversubscribe --bind-to none)

# kill_rank1 JOB PATTERN READY [TRIES]: once the file READY is not empty, SIGKILLs the process
# matching PATTERN (pgrep -f) whose environment says OMPI_COMM_WORLD_RANK=1, while JOB (mpirun's
# pid) runs. Sets KILLED_AT (ns); returns 1 when no such process was found.
kill_rank1() {
    local job=$1 pattern=$2 ready=$3 tries=${4:-300} rank1="" p
    for _ in $(seq 1 "$tries"); do
        if [ -s "$ready" ]; then
            for p in $(pgrep -f "$pattern"); do
                tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && rank1=$p
            done
            [ -n "$rank1" ] && break
        fi
        kill -0 "$job" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$rank1" ] || return 1
    [ -n "${KILL_DELAY:-}" ] && sleep "$KILL_DELAY"
    KILLED_AT=$(date +%s%N)
    kill -KILL "$rank1"
}

# check_job_ended NAME STATUS STARTED ERR: the job (exit STATUS, started at STARTED ns) ended with a
# non-zero status within 60 s of KILLED_AT, and its stderr (ERR) names rank 1's death (Open MPI:
# "mpirun noticed that process rank 1 with PID ... exited on signal 9 (Killed)"). Prints what
# happened; returns 1 on a failure.
check_job_ended() {
    local name=$1 status=$2 started=$3 err=$4 fail=0
    ENDED_MS=$((($(date +%s%N) - KILLED_AT) / 1000000))
    echo "$name: rank 1 killed $(((KILLED_AT - started) / 1000000)) ms into the run; the job ended $ENDED_MS ms later with status $status"
    if [ "$status" -eq 0 ]; then
        echo "FAIL: the job returned 0 although rank 1 died"; fail=1
    elif [ "$status" -eq 124 ] || [ "$ENDED_MS" -ge 60000 ]; then
        echo "FAIL: the job took $ENDED_MS ms to end after rank 1 died (bound: 60 s; 124: killed by timeout)"; fail=1
    fi
    if ! tr '\n' ' ' <"$err" | grep -Eq "rank 1 .*signal 9"; then
        echo "FAIL: the message does not name the dead rank:"; sed 's/^/  | /' "$err"; fail=1
    fi
    return $fail
}
