#!/usr/bin/env bash
# The CPU thread policy, before and after: the same five workloads timed with two builds, on an
# idle machine and with busy loops competing for the same cores.
#
#   bench/cpu_threads.sh BUILD_A BUILD_B        # e.g. build-threads-base build-threads
#
# BUILD_A and BUILD_B are build folders holding `nopad` and `libnopad.so` (A: the baseline).
# Each run is a whole process timed by /usr/bin/time (start-up and model load included). A and B
# run in turn, A B then B A, so a drift of the machine's speed lands on both; the summary is
# the median wall time of each and the median of the paired ratios B/A.
#
# Environment:
#   NOPAD_SMOLLM2_GGUF, NOPAD_MINILM_DIR   the models (scripts/fetch_default_decoder.sh and
#                                          scripts/fetch_default_model.sh print them)
#   RUNS=5                                 pairs per workload and condition
#   BUSY=$(nproc)                          busy loops (`while :; do :; done`) in "contended"
#   CONDITIONS="idle contended"            which conditions to run
#   WORKLOADS="generate_prompt generate_engine python_generate embed train"
#   OUT=bench/results/cpu_threads_<date>_<host>.json   raw runs and summary
# Anything else in the environment (OMP_NUM_THREADS, OMP_WAIT_POLICY, ...) reaches both builds.
set -euo pipefail

if [[ $# -ne 2 || ! -x $1/nopad || ! -x $2/nopad || ! -f $1/libnopad.so || ! -f $2/libnopad.so ]]; then
    echo "usage: $0 BUILD_A BUILD_B   (build folders with nopad and libnopad.so)" >&2
    exit 2
fi
: "${NOPAD_SMOLLM2_GGUF:?set it to the SmolLM2 .gguf (scripts/fetch_default_decoder.sh)}"
: "${NOPAD_MINILM_DIR:?set it to the MiniLM folder (scripts/fetch_default_model.sh)}"
A=$(cd "$1" && pwd)
B=$(cd "$2" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-5}
BUSY=${BUSY:-$(nproc)}
CONDITIONS=${CONDITIONS:-idle contended}
WORKLOADS=${WORKLOADS:-generate_prompt generate_engine python_generate embed train}
OUT=${OUT:-$REPO/bench/results/cpu_threads_$(date -u +%Y-%m-%d)_$(hostname -s).json}

WORK=$(mktemp -d)
busy_pids=()
stop_busy() {
    for pid in "${busy_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    busy_pids=()
}
trap 'stop_busy; rm -rf "$WORK"' EXIT

PROMPT="The capital of France is"
printf '{"prompt": "%s", "max_tokens": 48, "ignore_eos": true}\n' "$PROMPT" >"$WORK/requests.jsonl"
# A few hundred lines of text for embed: the test sentences, repeated.
awk '{ line[NR] = $0 } END { for (i = 0; i < 400; i++) print line[i % NR + 1] }' "$REPO/tests/data/minilm/sentences.txt" >"$WORK/lines.txt"
cat >"$WORK/generate.py" <<EOF
import nopad
g = nopad.Generator("$NOPAD_SMOLLM2_GGUF")
g.generate("$PROMPT", max_tokens=48, ignore_eos=True)
EOF

# The source tree build folder $1 was configured from: its Python package goes with its library.
source_of() {
    local src
    src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$1/CMakeCache.txt" 2>/dev/null)
    echo "${src:-$REPO}"
}

# Prints the command line of a workload for build folder $1.
workload() {
    local b=$1
    case $2 in
        generate_prompt) echo "$b/nopad generate --model $NOPAD_SMOLLM2_GGUF --prompt '$PROMPT' --max-tokens 48 --ignore-eos" ;;
        generate_engine) echo "$b/nopad generate --model $NOPAD_SMOLLM2_GGUF --input $WORK/requests.jsonl --output $WORK/results.jsonl" ;;
        python_generate) echo "NOPAD_LIBRARY=$b/libnopad.so PYTHONPATH=$(source_of "$b")/python python3 $WORK/generate.py" ;;
        embed) echo "$b/nopad embed --model $NOPAD_MINILM_DIR --input $WORK/lines.txt --output $WORK/embeddings.jsonl" ;;
        train) echo "$b/nopad train --model $NOPAD_MINILM_DIR --task classify --num-labels 2 --epochs 2 --data $REPO/tests/data/train/reviews_train.jsonl --eval $REPO/tests/data/train/reviews_test.jsonl --output $WORK/tuned" ;;
        *) echo "unknown workload '$2' (expected generate_prompt, generate_engine, python_generate, embed, train)" >&2; return 2 ;;
    esac
}

RAW=$WORK/raw.jsonl
: >"$RAW"
# time_one CONDITION WORKLOAD BUILD_LABEL BUILD_DIR PAIR: one timed run, one JSON line in $RAW.
time_one() {
    local cmd rc=0 load
    cmd=$(workload "$4" "$2")
    read -r load _ </proc/loadavg
    rm -rf "$WORK/tuned"
    /usr/bin/time -f '%e %U %S' -o "$WORK/time" sh -c "$cmd" >"$WORK/stdout" 2>"$WORK/stderr" || rc=$?
    if [[ $rc -ne 0 ]]; then
        echo "$2 with $4 failed (exit $rc):" >&2
        tail -n 5 "$WORK/stderr" >&2
        exit 1
    fi
    read -r wall user sys < <(tail -n 1 "$WORK/time")
    printf '{"condition": "%s", "workload": "%s", "build": "%s", "pair": %d, "wall_s": %s, "user_s": %s, "sys_s": %s, "load_1min_before": %s}\n' \
        "$1" "$2" "$3" "$5" "$wall" "$user" "$sys" "$load" >>"$RAW"
    printf '  %-10s %-16s %s pair %d: %6.2f s wall, %6.2f s user\n' "$1" "$2" "$3" "$5" "$wall" "$user" >&2
}

for condition in $CONDITIONS; do
    case $condition in
        idle) ;;
        contended)
            for _ in $(seq "$BUSY"); do
                sh -c 'while :; do :; done' &
                busy_pids+=($!)
            done ;;
        *) echo "unknown condition '$condition' (expected idle or contended)" >&2; exit 2 ;;
    esac
    for w in $WORKLOADS; do
        workload "$A" "$w" >/dev/null
        time_one "$condition" "$w" warmup "$A" 0   # page cache and CPU frequency, not counted
        for i in $(seq "$RUNS"); do
            if (( i % 2 )); then
                time_one "$condition" "$w" A "$A" "$i"; time_one "$condition" "$w" B "$B" "$i"
            else
                time_one "$condition" "$w" B "$B" "$i"; time_one "$condition" "$w" A "$A" "$i"
            fi
        done
    done
    stop_busy
done

mkdir -p "$(dirname "$OUT")"
python3 - "$RAW" "$OUT" "$A" "$B" "$BUSY" <<'EOF'
import json, os, platform, statistics, subprocess, sys, time
raw, out, a, b, busy = sys.argv[1:]
runs = [json.loads(line) for line in open(raw)]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
def build_id(build):  # the checkout the binary was built from, as `nopad --version` prints it
    return subprocess.run([f"{build}/nopad", "--version"], capture_output=True, text=True).stdout.strip()
summary = []
for cond in dict.fromkeys(r["condition"] for r in runs):
    for work in dict.fromkeys(r["workload"] for r in runs if r["condition"] == cond):
        sel = [r for r in runs if r["condition"] == cond and r["workload"] == work and r["build"] != "warmup"]
        wall = {k: {r["pair"]: r["wall_s"] for r in sel if r["build"] == k} for k in "AB"}
        ratios = [wall["B"][p] / wall["A"][p] for p in wall["A"] if p in wall["B"] and wall["A"][p] > 0]
        summary.append({"condition": cond, "workload": work,
                        "A_median_wall_s": statistics.median(wall["A"].values()),
                        "B_median_wall_s": statistics.median(wall["B"].values()),
                        "median_ratio_B_over_A": round(statistics.median(ratios), 3)})
doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu, "cores": os.cpu_count(),
       "busy_loops_when_contended": int(busy), "load_average_at_end": os.getloadavg(),
       "A": {"build": a, "version": build_id(a)}, "B": {"build": b, "version": build_id(b)},
       "summary": summary, "runs": runs}
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
os.replace(tmp, out)
print(f"{cpu}, {os.cpu_count()} cores; contended = {busy} busy loops; wall seconds, medians")
print(f"{'condition':<10} {'workload':<16} {'A':>8} {'B':>8} {'B/A':>6}")
for s in summary:
    print(f"{s['condition']:<10} {s['workload']:<16} {s['A_median_wall_s']:>8.2f} {s['B_median_wall_s']:>8.2f} "
          f"{s['median_ratio_B_over_A']:>6.3f}")
print(f"raw runs: {out}")
EOF
