#!/usr/bin/env python3
"""ENGINE benchmark, workload 1 of issue 22 (throughput): N requests submitted at once to
nopad.Engine on a random LLaMA-1B-shaped model (bench/decode_bench.py's checkpoint), prompts of
U[32, 256] random ids, outputs of U[64, 512] tokens, EOS ignored, greedy; useful output tokens/s
= generated tokens / wall time from the first submit to the last request's end. Also time to
first token p50 / p99 and the engine's counters. nopad alone for now: the HF peers of the issue
(static batching eager and compiled, generate_batch) are still to come.

    python3 bench/engine_bench.py --library build-cuda/libnopad.so --out engine.json [--requests 32,256]
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
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", default="32,256")
    ap.add_argument("--shape", default="1b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--seed", type=int, default=20261125)
    args = ap.parse_args()
    os.environ["NOPAD_LIBRARY"] = os.path.abspath(args.library)
    import decode_bench as db
    import nopad
    shape = db.SHAPES[args.shape]
    folder = "/tmp/nopad_dec_%s" % args.shape
    if not os.path.exists(os.path.join(folder, "config.json")):
        db.make_checkpoint(shape, folder)
    V = shape["vocab_size"]
    rows = []
    with nopad.Generator(folder, device=args.device, dtype=args.dtype, kv_cache_tokens=16,
                         max_batch_tokens=16) as gen:
        for n in map(int, args.requests.split(",")):
            rng = np.random.default_rng(args.seed + n)
            prompts = [rng.integers(0, V, int(rng.integers(32, 257))).tolist() for _ in range(n)]
            outs = [int(rng.integers(64, 513)) for _ in range(n)]
            kv = sum(len(p) + o for p, o in zip(prompts, outs)) + 16 * n
            with nopad.Engine(gen, kv_cache_tokens=kv, max_running=n, max_queue=n,
                              max_step_tokens=4096) as eng:
                # warm-up: the graphs and GEMM plans of small batches
                eng.submit(prompts[0][:8], max_tokens=8, ignore_eos=True).result()
                t0 = time.perf_counter()
                reqs = [eng.submit(p, max_tokens=o, ignore_eos=True) for p, o in zip(prompts, outs)]
                for r in reqs:
                    r.result()
                wall = time.perf_counter() - t0
                st = eng.stats()
                ttft = [r.stats()["first_token_ms"] for r in reqs]
                gen_tokens = sum(len(r.ids) for r in reqs)
                assert gen_tokens == sum(outs), (gen_tokens, sum(outs))
                row = dict(requests=n, prompt_tokens=sum(map(len, prompts)), output_tokens=gen_tokens,
                           wall_s=wall, tokens_per_s=gen_tokens / wall,
                           ttft_p50_ms=statistics.median(ttft), ttft_p99_ms=float(np.percentile(ttft, 99)),
                           steps=st["steps"], preemptions=st["preemptions"],
                           prompt_tokens_shared=st["prompt_tokens_shared"])
                rows.append(row)
                print(json.dumps(row), flush=True)
    smi = os.popen("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null")
    out = {"gpu": smi.read().strip(), "shape": args.shape, "dtype": args.dtype,
           "device": args.device, "library": args.library, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print("| requests | output tokens | wall s | useful tokens/s | TTFT p50 ms | TTFT p99 ms | steps |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %d | %d | %.2f | %.0f | %.1f | %.1f | %d |" % (r["requests"], r["output_tokens"], r["wall_s"],
                                                            r["tokens_per_s"], r["ttft_p50_ms"],
                                                            r["ttft_p99_ms"], r["steps"]))


if __name__ == "__main__":
    main()
