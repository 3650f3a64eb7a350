#!/usr/bin/env python3
"""Where a throughput run of the engine spends its wall time on the device (issue 22, workloads 1
and 4): the N requests of engine_bench.py's workload go through nopad.Engine once unrecorded (the
graphs get recorded) and once under CUPTI (torch.profiler: every kernel and copy, the engine's
own included). Each step starts at its embedding kernel (the first kernel of every step); per step:

- `span`: from the step's first device event (the upload of its indices) to the end of its last
  (the ids' download);
- `gap`: from that end to the next step's first event: the device idles while the host takes the
  ids, plans and packs the next step and launches it.

Steps are grouped by their token count (the embedding kernel's grid: a decode step's batch bucket,
or the tokens of a step with prompt chunks). Prints a JSON object: the run's wall time with and
without the profiler, the sums of spans and gaps, and per group the steps, the median span and
gap in µs. CUPTI adds a little to every launch, so the gaps here are an upper bound of the plain
run's.

    python3 bench/engine_profile.py --library build-cuda/libnopad.so --shape 1b --requests 32
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import engine_common as ec  # noqa: E402


def run_once(eng, prompts, outs):
    t0 = time.perf_counter()
    reqs = [eng.submit(p, max_tokens=o, ignore_eos=True) for p, o in zip(prompts, outs)]
    for r in reqs:
        r.result()
    wall = time.perf_counter() - t0
    tokens = sum(len(r.ids) for r in reqs)
    for r in reqs:
        r.close()
    return wall, tokens


def steps_of(events):
    """The device events in time order, cut into steps at each embedding kernel; the copies just
    before an embedding kernel (the step's index upload) open its step."""
    evs = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")),
                 key=lambda e: e["ts"])
    steps, cur = [], []
    for e in evs:
        if e["cat"] == "kernel" and "embed_tokens" in e["name"]:
            lead = []
            while cur and cur[-1]["cat"] == "gpu_memcpy" and "HtoD" in cur[-1]["name"]:
                lead.insert(0, cur.pop())
            if cur:
                steps.append(cur)
            cur = lead
        cur.append(e)
    if cur:
        steps.append(cur)
    return [s for s in steps if any(e["cat"] == "kernel" and "embed_tokens" in e["name"] for e in s)]


def analyse(steps):
    rows = []
    for i, st in enumerate(steps):
        start = st[0]["ts"]
        end = max(e["ts"] + e["dur"] for e in st)
        embed = next(e for e in st if e["cat"] == "kernel" and "embed_tokens" in e["name"])
        tokens = (embed.get("args", {}).get("grid") or [0])[0]
        gap = steps[i + 1][0]["ts"] - end if i + 1 < len(steps) else None
        rows.append({"tokens": tokens, "span_us": end - start, "gap_us": gap,
                     "kernels": sum(1 for e in st if e["cat"] == "kernel")})
    groups = {}
    for r in rows:
        groups.setdefault(r["tokens"], []).append(r)
    out = []
    for t in sorted(groups):
        g = groups[t]
        gaps = [r["gap_us"] for r in g if r["gap_us"] is not None]
        out.append({"tokens": t, "steps": len(g), "span_us_median": round(statistics.median(r["span_us"] for r in g), 1),
                    "gap_us_median": round(statistics.median(gaps), 1) if gaps else None,
                    "span_s_sum": round(sum(r["span_us"] for r in g) / 1e6, 4),
                    "gap_s_sum": round(sum(gaps) / 1e6, 4),
                    "kernels_median": statistics.median(r["kernels"] for r in g)})
    return rows, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--shape", default="1b", choices=["1b", "smollm2", "tiny"])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--out", help="JSON file")
    ap.add_argument("--overlap", default="auto", choices=["auto", "on", "off"],
                    help="step n+1 planned and queued before step n's ids are back (auto: on CUDA)")
    args = ap.parse_args()
    os.environ["NOPAD_LIBRARY"] = os.path.abspath(args.library)
    import torch
    from torch.profiler import ProfilerActivity, profile
    import decode_profile  # its trace reader
    import nopad

    folder, _ = ec.checkpoint(args.shape)
    vocab = ec.SHAPES[args.shape]["vocab_size"]
    prompts, outs = ec.throughput_workload(args.requests, ec.SEED, vocab)
    gen = nopad.Generator(folder, device="cuda", dtype="fp16")
    kv = sum(len(p) + o for p, o in zip(prompts, outs)) + 16 * args.requests
    result = {"shape": args.shape, "requests": args.requests, "overlap": args.overlap,
              "info": ec.env_info("cuda", args.library)}
    overlap = {"auto": None, "on": True, "off": False}[args.overlap]
    with nopad.Engine(gen, kv_cache_tokens=kv, max_running=args.requests, max_queue=args.requests,
                      max_step_tokens=4096, prefix_sharing=False, overlap_steps=overlap) as eng:
        run_once(eng, prompts, outs)  # records the graphs
        plain = [run_once(eng, prompts, outs) for _ in range(2)]
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            wall, tokens = run_once(eng, prompts, outs)
            torch.cuda.synchronize()
    events = decode_profile.trace_events(prof)
    steps = steps_of(events)
    rows, groups = analyse(steps)
    device_s = (max(e["ts"] + e["dur"] for s in steps for e in s) - steps[0][0]["ts"]) / 1e6 if steps else 0
    result.update({
        "wall_s_plain": [round(w, 4) for w, _ in plain], "tokens": tokens,
        "tokens_per_s_plain": [round(t / w) for w, t in plain],
        "wall_s_profiled": round(wall, 4), "steps": len(rows),
        "device_first_to_last_s": round(device_s, 4),
        "span_s_sum": round(sum(r["span_us"] for r in rows) / 1e6, 4),
        "gap_s_sum": round(sum(r["gap_us"] for r in rows if r["gap_us"] is not None) / 1e6, 4),
        "groups": groups})
    print(json.dumps(result, indent=1))
    ec.save_json(args.out, result)


if __name__ == "__main__":
    main()
