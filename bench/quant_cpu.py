"""Issue 43's CPU rows of the QUANT table: a GGUF decoder's decode rate at batch 1 (tg: 128 new
tokens after a 16-token prompt) and prompt rate (pp: one 512-token prompt), at 1 and 2 threads,
nopad (weights kept quantized, and dequantised to f32 for reference) against llama.cpp's
llama-bench on the same file, in the same minutes, alternated. Also each run's time to load the
model and its peak resident memory (a child process per point, so RSS is the point's own).

    python3 bench/quant_cpu.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \\
        --llama-bench /path/to/llama-bench --out bench/results/quant_cpu_DATE.json

The rates are medians over --reps timed repetitions after one untimed warm-up; the prompts are
random ids (seeded). With --rounds N the alternation (nopad, then llama.cpp, per thread count) runs
N times, each row marked with its round: on a machine shared with other work, the best round of
each is the least disturbed. The machine, its load and the versions go into the JSON."""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, resource, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import nopad
gguf, threads, weights, reps, pp, tg = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
t0 = time.perf_counter()
gen = nopad.Generator(gguf, threads=threads, weights=weights, kv_cache_tokens=1024)
load_s = time.perf_counter() - t0
rng = np.random.default_rng(20261207)
V = gen.info.vocab_size
def timed(prompt, n):
    t = time.perf_counter()
    gen.generate_ids([prompt], max_tokens=n, ignore_eos=True)
    return time.perf_counter() - t
first = timed(rng.integers(100, V, 16).tolist(), 1)  # time to the first token, cold
pp_s, tg_s = [], []
for r in range(reps + 1):
    p = timed(rng.integers(100, V, pp).tolist(), 1)
    short = rng.integers(100, V, 16).tolist()
    t = timed(short, tg + 1) - timed(short, 1)  # the tg decode steps alone
    if r > 0:
        pp_s.append(p)
        tg_s.append(t)
pp_med, tg_med = sorted(pp_s)[len(pp_s) // 2], sorted(tg_s)[len(tg_s) // 2]
print(json.dumps({"load_s": load_s, "first_token_s": first, "pp_tokens_per_s": pp / pp_med,
                  "tg_tokens_per_s": tg / tg_med, "pp_s": pp_s, "tg_s": tg_s,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_nopad(lib_python: str, gguf: str, threads: int, weights: str, reps: int, pp: int, tg: int, env) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, lib_python, gguf, str(threads), weights, str(reps),
                          str(pp), str(tg)], env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit("nopad run failed:\n" + out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_llama(bench: str, gguf: str, threads: int, reps: int, pp: int, tg: int) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([bench, "-m", gguf, "-t", str(threads), "-p", str(pp), "-n", str(tg), "-r", str(reps),
                          "-o", "json"], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit("llama-bench failed:\n" + out.stderr[-3000:])
    rows = json.loads(out.stdout)
    res = {"seconds": time.perf_counter() - t0,
           "build": rows[0].get("build_commit"), "cpu": rows[0].get("cpu_info")}
    for row in rows:
        key = "pp_tokens_per_s" if row["n_prompt"] > 0 else "tg_tokens_per_s"
        res[key] = row["avg_ts"]
        res[key.replace("per_s", "per_s_stddev")] = row["stddev_ts"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench (its rows are left out without it)")
    ap.add_argument("--library", default=str(REPO / "build" / "libnopad.so"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--weights", default="native,f32", help="nopad's --weights choices to time")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1, help="times to repeat the whole alternation")
    ap.add_argument("--out")
    args = ap.parse_args()
    env = dict(os.environ, NOPAD_LIBRARY=str(Path(args.library).resolve()))
    env.pop("OMP_WAIT_POLICY", None)  # OpenMP's own default (threads spin a while between regions)
    load = os.getloadavg()
    rows = []
    for rnd in range(args.rounds):
        for threads in [int(t) for t in args.threads.split(",")]:
            for weights in args.weights.split(","):
                r = run_nopad(str(REPO / "python"), args.gguf, threads, weights, args.reps, args.pp, args.tg, env)
                rows.append(dict(engine="nopad", weights=weights, threads=threads, round=rnd,
                                 load_avg=os.getloadavg()[0], **r))
                print("round %d nopad %-6s t%d: tg %.1f tok/s, pp %.1f tok/s, load %.2f s, first token %.3f s, "
                      "RSS %.0f MB" % (rnd, weights, threads, r["tg_tokens_per_s"], r["pp_tokens_per_s"], r["load_s"],
                                       r["first_token_s"], r["peak_rss_mb"]), flush=True)
            if args.llama_bench:
                r = run_llama(args.llama_bench, args.gguf, threads, args.reps, args.pp, args.tg)
                rows.append(dict(engine="llama.cpp", threads=threads, round=rnd, load_avg=os.getloadavg()[0], **r))
                print("round %d llama.cpp    t%d: tg %.1f tok/s, pp %.1f tok/s" % (rnd, threads, r["tg_tokens_per_s"],
                                                                                  r["pp_tokens_per_s"]), flush=True)
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or
            platform.machine(), "cpus": os.cpu_count(), "load_before": load, "load_after": os.getloadavg(),
            "gguf": Path(args.gguf).name, "gguf_bytes": Path(args.gguf).stat().st_size,
            "nopad_commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip(),
            "library": str(Path(args.library).resolve()),  # the tree's HEAD above need not be its build's
            "pp": args.pp, "tg": args.tg, "reps": args.reps, "rounds": args.rounds}
    if args.out:
        Path(args.out).write_text(json.dumps({"info": info, "rows": rows}, indent=1) + "\n")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
