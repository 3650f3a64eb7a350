#!/usr/bin/env python3
"""Issue 42's engine under tensor parallelism, on one machine of several GPUs: nopad split over
tp = 1, 2, 4, 8 GPUs (`tp_size`: nopad starts the workers itself) against Hugging Face's own
tensor-parallel plan (`tp_plan="auto"` under torchrun), on a random LLaMA-3-8B-shaped checkpoint
(bench/decode_bench.py's "8b"; fp16).

    check     greedy ids at tp = N against tp = 1 (8 prompts, 32 new tokens; equal or not, and the
              first place they part), and the last-position logits of the prompts at every tp
              against the CPU in float32 (--cpu-reference: the 8B model takes 32 GB of host memory
              there): each tp's row-relative error, which should stay that of tp = 1.
    run       ENGINE workload 1 (prompts U[32, 256], outputs U[64, 512], EOS ignored, greedy) for
              each --requests, at each tp: useful tokens/s, wall time, each request's latency
              (mean, p50, p99) and time to first token, the engine's steps and mean step.
    arrivals  Flover's arrival experiment at --gap-ms (Poisson, 64 requests, the same lengths):
              total time and latency at each tp.
    hf        Under `torchrun --nproc-per-node N`: HF's static batching (engine_peers.py's
              static_eager: every prompt in one left-padded batch, each row as long as the longest
              output) with the model split by tp_plan="auto". Rank 0 writes the result.

Each nopad tp runs in a child process of its own (MPI starts once a process). Results go to --out
as JSON (a list of records), written after each one. Also a check of the script itself on the CPU
(--device cpu --shape tiny: tp over processes).

    python3 bench/tp_engine.py check --library L --tp 1,2,4,8 --cpu-reference --out check.json
    python3 bench/tp_engine.py run --library L --tp 1,2,4,8 --requests 64,256 --out run.json
    python3 bench/tp_engine.py arrivals --library L --tp 1,2,4,8 --gap-ms 20 --out arrivals.json
    torchrun --nproc-per-node 4 bench/tp_engine.py hf --requests 64 --out hf_tp4.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import engine_common as ec  # noqa: E402

CHECK_LENGTHS = (1, 7, 16, 33, 64, 100, 129, 200)  # the check's prompt lengths: 1 and odd ones


def load_records(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {"records": []}


def child(spec):
    """One measurement in this process: spec["task"] at spec["tp"]; prints one JSON line."""
    os.environ["NOPAD_LIBRARY"] = spec["library"]
    import nopad
    folder, tp, dev = spec["folder"], spec["tp"], spec["device"]
    vocab = ec.SHAPES[spec["shape"]]["vocab_size"]
    rec = {"task": spec["task"], "tp": tp, "device": dev, "dtype": spec["dtype"]}
    t0 = time.perf_counter()
    # the engine has its own KV pool: the generator's own context stays small there
    small = {} if spec["task"] == "check" else {"kv_cache_tokens": 16, "max_batch_tokens": 16}
    gen = nopad.Generator(folder, device=dev, dtype=spec["dtype"], tp_size=tp, **small)
    rec["load_s"] = round(time.perf_counter() - t0, 2)
    rec["memory"] = gen.memory
    try:
        if spec["task"] == "check":
            rng = np.random.default_rng(ec.SEED)
            prompts = [rng.integers(0, vocab, n).tolist() for n in CHECK_LENGTHS]
            rec["ids"] = [np.asarray(x).tolist() for x in
                          gen.generate_ids(prompts, max_tokens=spec["new_tokens"], ignore_eos=True)]
            logits = []
            for p in prompts:
                s = gen.sequence()
                try:
                    logits.append(np.asarray(gen.decode([s], [p]))[-1])
                finally:
                    s.close()
            np.save(spec["logits"], np.stack(logits).astype(np.float32))
        else:
            rec.update(engine_pass(nopad, gen, spec, vocab))
    finally:
        gen.close()
    print("RESULT " + json.dumps(rec), flush=True)


def engine_pass(nopad, gen, spec, vocab):
    """The engine on workload 1 (task run) or on Poisson arrivals (task arrivals), after one
    untimed warm-up pass of the same requests (it records the graphs)."""
    n = spec["requests"]
    prompts, outs = ec.throughput_workload(n, ec.SEED, vocab)
    kv = sum(len(p) + o for p, o in zip(prompts, outs)) + 16 * n
    gaps = None
    if spec["task"] == "arrivals":
        rng = np.random.default_rng(ec.SEED + 1)
        gaps = rng.exponential(spec["gap_ms"] / 1e3, n)
        gaps[0] = 0.0
    with nopad.Engine(gen, kv_cache_tokens=kv, max_running=n, max_queue=n, max_step_tokens=4096) as eng:
        def one_pass():
            s0 = eng.stats()
            t0 = time.perf_counter()
            reqs = []
            at = t0
            for i, (p, o) in enumerate(zip(prompts, outs)):
                if gaps is not None:
                    at += gaps[i]
                    delay = at - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                reqs.append(eng.submit(p, max_tokens=o, ignore_eos=True))
            for r in reqs:
                r.result()
            wall = time.perf_counter() - t0
            s1 = eng.stats()
            tokens = sum(len(r.ids) for r in reqs)
            st = [r.stats() for r in reqs]  # times from each request's own submission
            for r in reqs:
                r.close()
            lat = [x["finished_ms"] / 1e3 for x in st]
            ttft = [x["first_token_ms"] / 1e3 for x in st]
            steps = s1["steps"] - s0["steps"]
            return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "steps": steps,
                    "ms_per_step": 1e3 * wall / steps if steps else None,
                    "latency_mean_s": statistics.mean(lat), "latency_p50_s": ec.pct(lat, 50),
                    "latency_p99_s": ec.pct(lat, 99), "ttft_p50_s": ec.pct(ttft, 50),
                    "ttft_p99_s": ec.pct(ttft, 99)}

        one_pass()  # warm-up
        runs = [one_pass() for _ in range(spec["reps"])]
    best = max(runs, key=lambda r: r["tokens_per_s"])
    return {"requests": n, "gap_ms": spec.get("gap_ms"), "runs": runs,
            "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in runs), "best": best}


def spawn(args, spec):
    """Runs child(spec) in a new process; its record, or one with its error."""
    cmd = [sys.executable, os.path.abspath(__file__), "child", json.dumps(spec)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_limit_s)
    except subprocess.TimeoutExpired:
        return {"task": spec["task"], "tp": spec["tp"], "error": "over %d s" % args.child_limit_s}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"task": spec["task"], "tp": spec["tp"], "error": ("exit %d: %s" % (p.returncode, p.stderr[-1500:]))}


def row_rel(a, b):
    """Largest over rows of max |a - b| / max |b|."""
    return float(np.max(np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)))


def check(args, base, out):
    folder = base["folder"]
    refs = {}
    runs = [("cpu", 1)] if args.cpu_reference else []
    runs += [(args.device, tp) for tp in args.tp]
    for dev, tp in runs:
        logits = os.path.join(args.workdir, "logits_%s_tp%d.npy" % (dev, tp))
        rec = spawn(args, dict(base, task="check", tp=tp, device=dev, dtype="f32" if dev == "cpu" else args.dtype,
                               new_tokens=args.new_tokens, logits=logits))
        if "error" not in rec:
            refs[(dev, tp)] = (rec["ids"], np.load(logits))
        out["records"].append(rec)
        print("# check %s tp %d: %s" % (dev, tp, rec.get("error") or "loaded in %.1f s" % rec["load_s"]), flush=True)
        ec.save_json(args.out, out)
    one = refs.get((args.device, 1))
    cpu = refs.get(("cpu", 1))
    summary = []
    for tp in args.tp:
        got = refs.get((args.device, tp))
        if not got:
            continue
        row = {"tp": tp}
        if one:
            same = [a == b for a, b in zip(got[0], one[0])]
            row["greedy_equal_to_tp1"] = sum(same)
            row["prompts"] = len(same)
            row["first_difference"] = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
                                       for a, b in zip(got[0], one[0])]
            row["logits_row_rel_vs_tp1"] = row_rel(got[1], one[1])
        if cpu:
            row["logits_row_rel_vs_cpu_f32"] = row_rel(got[1], cpu[1])
        summary.append(row)
        print("# tp %d: %s" % (tp, json.dumps(row)), flush=True)
    out["summary"] = summary
    ec.save_json(args.out, out)


def engine_runs(args, base, out, task):
    for n in (args.requests if task == "run" else [args.arrival_requests]):
        for tp in args.tp:
            rec = spawn(args, dict(base, task=task, tp=tp, device=args.device, dtype=args.dtype, requests=n,
                                   reps=args.reps, gap_ms=args.gap_ms))
            out["records"].append(rec)
            if "error" in rec:
                print("# %s tp %d, %d requests: %s" % (task, tp, n, rec["error"]), flush=True)
            else:
                b = rec["best"]
                print("# %s tp %d, %d requests: %.0f tokens/s (median of %d), wall %.2f s, latency mean %.2f "
                      "p99 %.2f s, ttft p50 %.3f s, %.2f ms a step" % (
                          task, tp, n, rec["tokens_per_s_median"], len(rec["runs"]), b["wall_s"],
                          b["latency_mean_s"], b["latency_p99_s"], b["ttft_p50_s"], b["ms_per_step"] or 0),
                      flush=True)
            ec.save_json(args.out, out)


def hf(args, base):
    """Every rank of torchrun loads the model split by tp_plan="auto" and runs the static batch;
    rank 0 records (engine_peers.py's static_eager, the same prompts and lengths)."""
    import torch
    from transformers import LlamaForCausalLM
    import engine_peers
    rank = int(os.environ.get("RANK", "0"))
    t0 = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(base["folder"], dtype=torch.float16, tp_plan="auto",
                                             attn_implementation="sdpa").eval()
    load_s = time.perf_counter() - t0
    vocab = ec.SHAPES[args.shape]["vocab_size"]
    for n in args.requests:
        prompts, outs = ec.throughput_workload(n, ec.SEED, vocab)
        log = args.out + ".rank%d.jsonl" % rank
        spec = {"peer": "static_eager", "device": "cuda", "reps": args.reps, "out": log, "_t_start": time.time()}
        runs = engine_peers._static(spec, model, prompts, outs, time.perf_counter() + args.child_limit_s)
        if rank == 0:
            out = load_records(args.out)
            out.setdefault("info", ec.env_info("cuda"))
            out["records"].append({"task": "hf_static_eager", "tp": int(os.environ.get("WORLD_SIZE", "1")),
                                   "requests": n, "load_s": load_s, "runs": runs,
                                   "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in runs)
                                   if runs else None})
            ec.save_json(args.out, out)
            print("# hf tp %s, %d requests: %s" % (os.environ.get("WORLD_SIZE"), n,
                                                   [round(r["tokens_per_s"]) for r in runs]), flush=True)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        return child(json.loads(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("task", choices=["check", "run", "arrivals", "hf"])
    ap.add_argument("--library", help="libnopad.so (not for hf)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="8b", choices=sorted(ec.SHAPES))
    ap.add_argument("--folder", help="the checkpoint folder (default /tmp/nopad_dec_<shape>)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", help="default fp16 on cuda, f32 on cpu")
    ap.add_argument("--tp", default="1,2,4,8", help="tp sizes (check: 1 is added as the reference)")
    ap.add_argument("--requests", default="64,256", help="run and hf: workload 1's request counts")
    ap.add_argument("--arrival-requests", type=int, default=64)
    ap.add_argument("--gap-ms", type=float, default=20.0, help="arrivals: the mean gap")
    ap.add_argument("--reps", type=int, default=2, help="timed passes after the warm-up")
    ap.add_argument("--new-tokens", type=int, default=32, help="check: greedy ids per prompt")
    ap.add_argument("--cpu-reference", action="store_true", help="check: the logits' float32 reference on the CPU")
    ap.add_argument("--child-limit-s", type=int, default=900)
    ap.add_argument("--workdir", default="/tmp/nopad_tp_engine")
    args = ap.parse_args()
    args.dtype = args.dtype or ec.DTYPES[args.device]
    args.tp = [int(x) for x in args.tp.split(",") if x]
    args.requests = [int(x) for x in args.requests.split(",") if x]
    if args.task == "check" and 1 not in args.tp:
        args.tp = [1] + args.tp
    os.makedirs(args.workdir, exist_ok=True)
    folder = args.folder or "/tmp/nopad_dec_%s" % args.shape
    if args.task == "hf":
        if int(os.environ.get("RANK", "0")) == 0:
            ec.checkpoint(args.shape, folder)
        import torch.distributed as dist
        if "WORLD_SIZE" in os.environ:  # the others wait for rank 0's checkpoint
            dist.init_process_group("nccl")
            dist.barrier()
        return hf(args, {"folder": folder})
    if not args.library:
        ap.error("--library is needed for " + args.task)
    _, made = ec.checkpoint(args.shape, folder)
    base = {"library": os.path.abspath(args.library), "folder": folder, "shape": args.shape}
    out = {"info": ec.env_info(args.device, args.library), "checkpoint": made, "args": vars(args), "records": []}
    ec.save_json(args.out, out)
    if args.task == "check":
        check(args, base, out)
    else:
        engine_runs(args, base, out, args.task)


if __name__ == "__main__":
    main()
