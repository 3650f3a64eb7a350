"""Issue 43's QUANT GPU rows: the decode step of a model on CUDA in several weight formats, e.g.
a GGUF file with its blocks kept (weights native: the quantized GEMV) against the same file
dequantised to fp16 (weights f16), or a float checkpoint quantized to FP8 at load (weights fp8)
against its fp16 weights. --weights lists the formats; the table compares each to the last.

For each batch B (context 512: a prompt of 512 - warm-up - steps/2 random ids, then timed greedy
steps through nopad_decode_sample), the median step time after the warm-up, against the step's
floor: (the weights' bytes in memory, as nopad_model_memory reports them + the KV history's fp16
bytes) / the device-to-device copy rate measured in the same run. The LM head of a tied model is
the embedding, so the weights' bytes are what a step reads (plus B embedding rows, left out).
The two runs alternate --rounds times; each row is the best round's median.

    python3 bench/quant_gpu.py --library build-cuda/libnopad.so --model SmolLM2.gguf --out q.json
    python3 bench/quant_gpu.py --library build-cuda/libnopad.so --shape 1b --weights fp8,f16 --out q.json
        (no --model: decode_bench's random fp16 checkpoint of the shape, in /tmp/nopad_dec_<shape>)
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import decode_bench as db  # noqa: E402

WEIGHTS = {"native": 1, "f16": 3, "fp8": 5}  # nopad_weights (include/nopad.h)


def load(lib, path, weights, kv_tokens):
    p = lib.nopad_model_default_params()
    p.device, p.dtype = 1, db.DTYPE_CODE["fp16"]
    p.max_batch_tokens, p.kv_cache_tokens = 2048, kv_tokens
    p.weights = WEIGHTS[weights]
    m = db.Model.__new__(db.Model)
    m.lib, m.max_batch_tokens, m.handle = lib, 2048, ctypes.c_void_p()
    t0 = time.time()
    db.check(lib, lib.nopad_model_load(path.encode(), ctypes.byref(p), ctypes.byref(m.handle)), "load " + weights)
    m.ctx = lib.nopad_model_context(m.handle)
    return m, time.time() - t0


def run(args, lib, shape, weights, bw, rng):
    C, W, N = args.context, args.warmup, args.steps
    prefill = C - W - (N + 1) // 2
    # each sequence ends at C + N / 2 tokens (a prompt of C - W - N/2, then W + N steps), in blocks of 16
    m, load_s = load(lib, args.model, weights, max(args.batches) * (C + N + 16))
    mem = m.memory()
    rows = []
    try:
        for B in args.batches:
            seqs = m.sequences(B)
            try:
                m.feed(seqs, prefill, shape["vocab_size"], rng)
                cu = np.arange(B + 1, dtype=np.int32)
                ids = np.empty(B, np.int32)
                times = []
                for i in range(W + N):
                    toks = rng.integers(0, shape["vocab_size"], B, dtype=np.int32)
                    t1 = time.perf_counter()
                    m.step_sample(seqs, cu, toks, ids)
                    if i >= W:
                        times.append(time.perf_counter() - t1)
            finally:
                m.free_sequences(seqs)
            ms = statistics.median(times) * 1e3
            kv_mean = prefill + W + (N + 1) / 2
            _, kv_bytes = db.decode_bytes(shape, B, kv_mean, 2)
            floor_ms = (mem["weights_bytes"] + kv_bytes) / (bw["read_plus_write_GBps"] * 1e9) * 1e3
            rows.append({"weights": weights, "batch": B, "context": C, "ms": ms, "tokens_per_s": B / ms * 1e3,
                         "weights_bytes": mem["weights_bytes"], "kv_bytes": kv_bytes, "floor_ms": floor_ms,
                         "x_floor": ms / floor_ms})
            print("# %-6s B=%-3d %.3f ms/step  %6.0f tokens/s  floor %.3f ms  x%.2f" % (
                weights, B, ms, B / ms * 1e3, floor_ms, ms / floor_ms), flush=True)
    finally:
        m.close()
    return {"weights": weights, "load_s": load_s, "memory": mem, "rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--library", required=True)
    ap.add_argument("--model", "--gguf", help="a GGUF file or a checkpoint folder (default: the shape's random "
                    "fp16 checkpoint)")
    ap.add_argument("--weights", default="native,f16", help="comma list of %s; each is compared to the last" %
                    ",".join(WEIGHTS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="smollm2", choices=sorted(db.SHAPES), help="the file's shape (for the KV bytes)")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.weights = args.weights.split(",")
    for w in args.weights:
        if w not in WEIGHTS:
            ap.error("--weights: %r is not one of %s" % (w, ", ".join(WEIGHTS)))
    lib = db.load_lib(args.library)
    shape = db.SHAPES[args.shape]
    if not args.model:
        args.model = "/tmp/nopad_dec_" + args.shape
        db.make_checkpoint(shape, args.model)
    model_bytes = (os.path.getsize(args.model) if os.path.isfile(args.model) else
                   sum(os.path.getsize(os.path.join(args.model, f)) for f in os.listdir(args.model)))
    bw = db.copy_bandwidth("cuda")
    out = {"info": {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "library": args.library,
                    "nopad": lib.nopad_version().decode(), "model": os.path.basename(args.model),
                    "model_bytes": model_bytes, "args": vars(args)},
           "copy": bw, "runs": []}
    print(json.dumps(out["info"]), "\n# copy %.0f GB/s read+write" % bw["read_plus_write_GBps"], flush=True)
    rng = np.random.default_rng(db.SEED)
    for r in range(args.rounds):
        for weights in args.weights:
            res = run(args, lib, shape, weights, bw, rng)
            res["round"] = r
            out["runs"].append(res)
            print("# round %d %s: loaded in %.2f s, weights %.1f MB" % (
                r, weights, res["load_s"], res["memory"]["weights_bytes"] / 1e6), flush=True)
            with open(args.out, "w") as fh:
                json.dump(out, fh, indent=1)
    best = {}
    for res in out["runs"]:
        for row in res["rows"]:
            k = (row["weights"], row["batch"])
            if k not in best or row["ms"] < best[k]["ms"]:
                best[k] = row
    out["best"] = list(best.values())
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    ref = args.weights[-1]
    print("| batch | " + " | ".join("%s ms (x floor)" % w for w in args.weights) + " | " +
          " | ".join("%s / %s" % (w, ref) for w in args.weights[:-1]) + " |")
    for B in args.batches:
        cells = ["%.3f (%.2f)" % (best[(w, B)]["ms"], best[(w, B)]["x_floor"]) for w in args.weights]
        ratios = ["%.2f" % (best[(w, B)]["ms"] / best[(ref, B)]["ms"]) for w in args.weights[:-1]]
        print("| %d | %s | %s |" % (B, " | ".join(cells), " | ".join(ratios)))


if __name__ == "__main__":
    main()
