#!/usr/bin/env python3
"""The decoder's attention alone, decode steps (issue 21's third DEC point): B sequences, one query
row each, over L keys of history; nopad's paged attention (tools/attn_paged_bench: a paged cache
in blocks of 16 over a shuffled pool) against torch scaled_dot_product_attention on padded,
contiguous K and V (q [B, H, 1, D], k and v [B, KV, L, D], enable_gqa) under each SDPA backend
that takes the shape (flash, efficient, cudnn, math), in one run on one GPU.

Useful GB/s = the K and V bytes a step must read (B·L·KV·D·2·2 bytes) / time per step. Both sides:
median over rounds of CUDA-event time per launch, launches rotating over enough copies of K/V that
a round reads >= 256 MB (out of the L2), random data.

    python3 bench/attn_decode_bench.py --bench build-cuda/attn_paged_bench --out attn.json
"""
import argparse
import json
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

BACKENDS = ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]


def time_torch(B, L, H, KV, D, dtype, backend, reps):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    kv_bytes = B * L * KV * D * 2 * 2
    copies = max(1, min(64, -(-(256 << 20) // kv_bytes)))
    launches = max(20, copies)
    q = torch.rand(B, H, 1, D, device="cuda", dtype=dtype) * 2 - 1
    ks = [torch.rand(B, KV, L, D, device="cuda", dtype=dtype) * 2 - 1 for _ in range(copies)]
    vs = [torch.rand(B, KV, L, D, device="cuda", dtype=dtype) * 2 - 1 for _ in range(copies)]
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        for i in range(3 * copies):
            F.scaled_dot_product_attention(q, ks[i % copies], vs[i % copies], enable_gqa=True)
        torch.cuda.synchronize()
        us = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for i in range(launches):
                F.scaled_dot_product_attention(q, ks[i % copies], vs[i % copies], enable_gqa=True)
            e1.record()
            e1.synchronize()
            us.append(e0.elapsed_time(e1) * 1000 / launches)
    med = statistics.median(us)
    return {"impl": f"torch sdpa {backend.lower()}", "batch": B, "context": L, "heads": H, "kv_heads": KV,
            "head_size": D, "us": med, "kv_bytes": kv_bytes, "GBps": kv_bytes / (med * 1e-6) / 1e9,
            "launches": launches, "copies": copies, "rounds": reps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="the attn_paged_bench binary")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--contexts", default="512,1024,2048,4096,8192")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args()
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "shape": f"{args.heads} heads / {args.kv_heads} KV heads, head size {args.head_size}, fp16"}
    rows = []
    proc = subprocess.run([args.bench, "--dtype", "f16", "--heads", str(args.heads), "--kv-heads",
                           str(args.kv_heads), "--head-size", str(args.head_size), "--batches", args.batches,
                           "--contexts", args.contexts, "--reps", str(args.reps)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
    rows += [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for B in map(int, args.batches.split(",")):
        for L in map(int, args.contexts.split(",")):
            for backend in BACKENDS:
                try:
                    rows.append(time_torch(B, L, args.heads, args.kv_heads, args.head_size, torch.float16,
                                           backend, args.reps))
                except Exception as e:  # a backend that does not take the shape
                    rows.append({"impl": f"torch sdpa {backend.lower()}", "batch": B, "context": L,
                                 "skipped": str(e).splitlines()[0][:200]})
                torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)
    print(f"GPU {env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}; {env['shape']}")
    print("| batch × context | " + " | ".join(["nopad"] + [f"sdpa {b.lower()}" for b in BACKENDS]) + " |")
    print("|---|" + "---|" * (1 + len(BACKENDS)))
    for B in map(int, args.batches.split(",")):
        for L in map(int, args.contexts.split(",")):
            cells = []
            for impl in ["nopad"] + [f"torch sdpa {b.lower()}" for b in BACKENDS]:
                r = next((r for r in rows if r["impl"] == impl and r["batch"] == B and r["context"] == L), None)
                cells.append("skipped" if not r or "us" not in r else f"{r['us']:.1f} µs, {r['GBps']:.0f} GB/s")
            print(f"| {B} × {L} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
