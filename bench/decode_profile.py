#!/usr/bin/env python3
"""Per-kernel GPU time of one decode step of the DEC benchmark's LLaMA-1B-shaped model, for the
note that explains the distance to the floor (or of the SmolLM2-135M shape: --shape smollm2). Run under Nsight Compute, which times only the
kernels inside the NVTX range "decode_step" (the last of a few steps, replayed from its graph):

    ncu --clock-control none --nvtx --nvtx-include "decode_step/" --metrics gpu__time_duration.sum \
        --csv python3 bench/decode_profile.py --library build-cuda/libnopad.so --batch 1 --context 512

With --timeline (no ncu), the steps are replayed as in the benchmark and their kernels recorded by
CUPTI through torch.profiler instead: each kernel's start and end inside the replayed graph. Kernels
launched with programmatic dependent launch start while the one before still runs and wait in
griddepcontrol.wait, so a kernel's own duration overstates it; what it adds to the step is its end
minus the end of the kernel before it (its "marginal"). The marginals of a step add up to its span
on the device. The gap between one step's last kernel and the next step's first (ids down, the
next step's indices up, graph launch) is printed too, but here it holds this script's Python and
the profiler's own work, so it overstates what a C caller pays. Prints a JSON object: per kernel kind
(name and grid) the launches a step and the median step's marginal and own time in µs.
"""
import argparse
import json
import os
import re
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_bench as db  # noqa: E402


def kernel_kind(name, grid):
    """A short label: the kernel's function name without namespaces, templates and arguments,
    and its grid (which tells the linear layers apart)."""
    name = name.replace("(anonymous namespace)::", "")
    base = re.sub(r"[<(].*", "", name.split(" ", 1)[-1] if name.startswith("void ") else name)
    base = base.split("::")[-1].strip()
    return f"{base}[{'x'.join(str(g) for g in grid)}]"


def trace_events(prof):
    """The chrome-trace events a torch.profiler run recorded (kernels, copies, ...)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    os.unlink(path)
    return events


def timeline(m, seqs, cu, ids, rng, vocab, n_steps):
    """Records n_steps greedy decode steps; returns per-kind marginals (see the module's doc)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n_steps):
            m.step_sample(seqs, cu, rng.integers(0, vocab, len(seqs), dtype=np.int32), ids)
        torch.cuda.synchronize()
    events = trace_events(prof)
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"), key=lambda e: e["ts"])
    if not kernels:
        return {"error": "no kernels recorded (CUPTI unavailable?)"}
    # a step starts at its embedding kernel, the first of every step
    steps, cur = [], []
    for e in kernels:
        if "embed" in e["name"] and cur:
            steps.append(cur)
            cur = []
        cur.append(e)
    steps.append(cur)
    steps = steps[1:-1] if len(steps) > 3 else steps  # the first and last may be cut
    per_step = []
    host_gaps = []
    for si, st in enumerate(steps):
        kinds = {}
        prev_end = st[0]["ts"]
        for e in st:
            end = e["ts"] + e["dur"]
            kind = kernel_kind(e["name"], e.get("args", {}).get("grid", []))
            k = kinds.setdefault(kind, [0, 0.0, 0.0])
            k[0] += 1
            k[1] += max(0.0, end - prev_end)
            k[2] += e["dur"]
            prev_end = max(prev_end, end)
        span = prev_end - st[0]["ts"]
        per_step.append((span, kinds))
        if si + 1 < len(steps):
            host_gaps.append(steps[si + 1][0]["ts"] - prev_end)
    per_step.sort(key=lambda x: x[0])
    span, kinds = per_step[len(per_step) // 2]
    rows = sorted(({"kind": k, "launches": v[0], "marginal_us": round(v[1], 2), "own_us": round(v[2], 2)}
                   for k, v in kinds.items()), key=lambda r: -r["marginal_us"])
    return {"steps": len(steps), "span_us": [round(s[0], 1) for s in per_step],
            "median_span_us": round(span, 1), "host_gap_us_median": round(float(np.median(host_gaps)), 1) if host_gaps else None,
            "kernels_per_step": sum(r["launches"] for r in rows), "kinds": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--shape", default="1b", choices=sorted(db.SHAPES))
    ap.add_argument("--timeline", action="store_true", help="CUPTI kernel timeline of replayed steps (no ncu)")
    ap.add_argument("--steps", type=int, default=20, help="--timeline: steps recorded")
    args = ap.parse_args()
    shape = db.SHAPES[args.shape]
    folder = "/tmp/nopad_dec_" + args.shape
    if not os.path.exists(os.path.join(folder, "config.json")):
        db.make_checkpoint(shape, folder)
    lib = db.load_lib(args.library)
    m = db.Model(lib, folder, "cuda", args.dtype, 2048, args.batch * (args.context + 64))
    rng = np.random.default_rng(1)
    V = shape["vocab_size"]
    seqs = m.sequences(args.batch)
    m.feed(seqs, args.context, V, rng)
    cu = np.arange(args.batch + 1, dtype=np.int32)
    ids = np.empty(args.batch, np.int32)
    if args.timeline:
        for _ in range(6):
            m.step_sample(seqs, cu, rng.integers(0, V, args.batch, dtype=np.int32), ids)
        result = timeline(m, seqs, cu, ids, rng, V, args.steps)
        result.update({"shape": args.shape, "batch": args.batch, "context": args.context, "dtype": args.dtype,
                       "device": torch.cuda.get_device_name(0)})
        print(json.dumps(result, indent=1))
    else:
        for i in range(6):
            toks = rng.integers(0, V, args.batch, dtype=np.int32)
            if i == 5:
                torch.cuda.nvtx.range_push("decode_step")
            m.step_sample(seqs, cu, toks, ids)
            if i == 5:
                torch.cuda.nvtx.range_pop()
    m.free_sequences(seqs)
    m.close()


if __name__ == "__main__":
    main()
