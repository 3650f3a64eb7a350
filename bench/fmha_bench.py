#!/usr/bin/env python3
"""FMHA benchmark (docs/design.md, "FMHA"): nopad's fused varlen attention against
torch.nn.attention.varlen.varlen_attn and padded scaled_dot_product_attention (default backend and
cuDNN), all on the same packed data, in one process, on one GPU.

Timing, the same for every implementation: N back-to-back launches captured in a CUDA graph,
replayed between two CUDA events; the per-launch time is elapsed / N; the median over R replays is
reported, after warm-up. If graph capture fails for a peer, the same N launches run eagerly
between the events (the table says so).

Useful TFLOP/s = 4 * sum(L^2) * d * heads / time (causal: half of that); no credit for padding.

usage: python3 bench/fmha_bench.py --lib build-cuda/libnopad.so [--out DIR] [--quick]
"""
import argparse
import ctypes
import datetime
import inspect
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

DT = {"f16": (torch.float16, 1), "bf16": (torch.bfloat16, 2)}


def make_lengths(batch, max_len, gen, skew=False):
    """ENC length rule: uniform in [0.2*max, max]; skew: one max among batch-1 of 20 tokens."""
    if skew:
        lens = [20] * batch
        lens[batch // 2] = max_len
        return lens
    lo = max(1, int(math.ceil(0.2 * max_len)))
    return torch.randint(lo, max_len + 1, (batch,), generator=gen).tolist()


class Nopad:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        f = self.lib.nopad_attention_varlen
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                      ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                      ctypes.c_float,
                      ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self.lib.nopad_last_error.restype = ctypes.c_char_p
        self.f = f
        # NOPAD_ATTENTION_WORKSPACE_BYTES, zeroed once (the persistent kernels leave it zero)
        self.ws = torch.zeros(4, dtype=torch.int32, device="cuda")

    def __call__(self, dtype_code, out, qkv, cu, n_seqs, max_len, heads, d, scale, causal):
        st = self.f(1, dtype_code, out.data_ptr(), qkv.data_ptr(), cu.data_ptr(), n_seqs, qkv.shape[0], max_len, heads,
                    d, scale, int(causal), ctypes.c_void_p(self.ws.data_ptr()),
                    ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if st != 0:
            raise RuntimeError("nopad: %s" % self.lib.nopad_last_error().decode())


def time_fn(fn, n_inner, reps, warmup=5):
    """Median ms per launch; graph replays if capture works, else eager back-to-back launches."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    mode = "graph"
    g = None
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()  # warm on the side stream too
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n_inner):
                fn()
        g.replay()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a peer that cannot be captured is timed eagerly
        mode = "eager (%s)" % type(e).__name__
        g = None
        torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        a.record()
        if g is not None:
            g.replay()
        else:
            for _ in range(n_inner):
                fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / n_inner)
    return statistics.median(times), mode


def gemm_rate(dtype):
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=dtype)
    y = torch.randn(n, n, device="cuda", dtype=dtype)
    ms, _ = time_fn(lambda: torch.matmul(x, y), 5, 10, warmup=3)
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def run_point(nopad, varlen_attn, batch, max_len, d, heads, dtype_name, causal, skew, gen, args):
    dtype, code = DT[dtype_name]
    lens = make_lengths(batch, max_len, gen, skew)
    T = sum(lens)
    cu_list = [0]
    for L in lens:
        cu_list.append(cu_list[-1] + L)
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    qkv = (torch.rand(T, 3, heads, d, device="cuda", dtype=torch.float32) * 4 - 2).to(dtype)  # [T,3,H,d]
    out = torch.empty(T, heads * d, device="cuda", dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    maxL = max(lens)
    flops = 4.0 * sum(L * L for L in lens) * d * heads * (0.5 if causal else 1.0)
    res = {"batch": batch, "max": max_len, "d": d, "heads": heads, "dtype": dtype_name, "causal": causal,
           "skew": skew, "T": T, "sum_L2": sum(L * L for L in lens), "lengths": lens, "impls": {}}

    def run_nopad():
        nopad(code, out, qkv, cu, batch, maxL, heads, d, scale, causal)

    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # [T, H, d] views, token stride 3*H*d
    sig = inspect.signature(varlen_attn).parameters
    kw = {}
    if causal:
        if "is_causal" in sig:
            kw["is_causal"] = True
        else:
            kw["window_size"] = (-1, 0)
    if "scale" in sig:
        kw["scale"] = scale

    def run_varlen():
        return varlen_attn(q, k, v, cu, cu, maxL, maxL, **kw)

    try:
        ref = run_varlen()
    except Exception:  # strided views refused: give it contiguous copies (made outside the timing)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        ref = run_varlen()

    # padded copies for SDPA: [B, H, S, d] and a key mask [B, 1, 1, S]
    S = maxL
    idx = torch.zeros(batch, S, dtype=torch.long, device="cuda")
    mask = torch.zeros(batch, S, dtype=torch.bool, device="cuda")
    for i, L in enumerate(lens):
        idx[i, :L] = torch.arange(cu_list[i], cu_list[i] + L, device="cuda")
        mask[i, :L] = True
    pad = qkv[idx.view(-1)].view(batch, S, 3, heads, d) * mask.view(batch, S, 1, 1, 1)
    pq, pk, pv = (pad[:, :, i].transpose(1, 2).contiguous() for i in range(3))
    amask = mask.view(batch, 1, 1, S)
    if causal:
        amask = amask & torch.ones(S, S, dtype=torch.bool, device="cuda").tril().view(1, 1, S, S)

    def run_sdpa():
        return F.scaled_dot_product_attention(pq, pk, pv, attn_mask=amask, scale=scale)

    def run_cudnn():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(pq, pk, pv, attn_mask=amask, scale=scale)

    # correctness: nopad vs varlen_attn on the same data (output poisoned first)
    out.fill_(float("nan"))
    run_nopad()
    torch.cuda.synchronize()
    o = out.float().view(T, heads, d)
    r = ref.float().view(T, heads, d)
    res["max_abs_err_vs_varlen"] = float((o - r).abs().max())
    res["max_row_rel_err_vs_varlen"] = float(((o - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(1e-6)).max())
    res["nan_in_nopad"] = bool(torch.isnan(o).any())

    n_inner = args.inner if T * heads * d < (1 << 26) else max(5, args.inner // 4)
    impls = [("nopad", run_nopad), ("varlen_attn", run_varlen), ("sdpa_padded", run_sdpa),
             ("sdpa_cudnn_padded", run_cudnn)]
    for name, fn in impls[:2] if args.only_nopad else impls:
        try:
            ms, mode = time_fn(fn, n_inner, args.reps)
            res["impls"][name] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "timing": mode}
        except Exception as e:  # noqa: BLE001 - a failing peer is recorded, not fatal
            res["impls"][name] = {"error": "%s: %s" % (type(e).__name__, str(e)[:200])}
        torch.cuda.synchronize()
    res["useful_flops"] = flops
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build-cuda/libnopad.so")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="only the issue's five points")
    ap.add_argument("--tag", default="")
    ap.add_argument("--points", default="",
                    help="custom grid: BxM[,BxM...], sBxM for the skewed mix (with --d, --dtype, --causal)")
    ap.add_argument("--d", default="64", help="head sizes for --points, comma-separated")
    ap.add_argument("--dtype", default="f16", help="dtypes for --points, comma-separated")
    ap.add_argument("--causal", action="store_true", help="--points causal")
    ap.add_argument("--only-nopad", action="store_true", help="skip the peers (tile sweeps)")
    args = ap.parse_args()

    from torch.nn.attention.varlen import varlen_attn
    nopad = Nopad(os.path.abspath(args.lib))
    prop = torch.cuda.get_device_properties(0)
    env = {"gpu": torch.cuda.get_device_name(0), "sms": prop.multi_processor_count, "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "seed": args.seed,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "tag": args.tag, "timing": "median over %d CUDA-graph replays of %d launches" % (args.reps, args.inner)}
    try:
        import subprocess
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        env["driver"] = "?"
    env["fp16_gemm_tflops"] = float("nan") if args.only_nopad else gemm_rate(torch.float16)
    env["tiles"] = {k: os.environ.get(k, "") for k in ("NOPAD_FMHA_BLOCK_M", "NOPAD_FMHA_BLOCK_N")}
    print("# %s (%d SMs), driver %s, torch %s, CUDA %s, cuDNN %s, seed %d, fp16 GEMM %.0f TFLOP/s" % (
        env["gpu"], env["sms"], env["driver"], env["torch"], env["cuda"], env["cudnn"], args.seed,
        env["fp16_gemm_tflops"]), flush=True)

    points = []  # (batch, max, d, heads, dtype, causal, skew)
    issue = [(16, 512), (16, 1024), (128, 512), (8, 2048), (128, 1024)]
    if args.points:
        for dt in args.dtype.split(","):
            for d in (int(x) for x in args.d.split(",")):
                for pt in args.points.split(","):
                    skew = pt.lower().startswith("s")  # sBxM: one max-length sequence among 20s
                    b, m = (int(x) for x in pt.lower().lstrip("s").split("x"))
                    points.append((b, m, d, 12, dt, args.causal, skew))
    elif args.quick:
        points = [(b, m, 64, 12, "f16", False, False) for b, m in issue]
    else:
        for b in (16, 64, 128):
            for m in (64, 128, 256, 512, 1024, 2048):
                points.append((b, m, 64, 12, "f16", False, False))
        points.append((8, 2048, 64, 12, "f16", False, False))
        points.append((64, 2048, 64, 12, "f16", False, True))
        for b, m in ((16, 512), (128, 1024), (8, 2048)):
            points.append((b, m, 64, 12, "bf16", False, False))
            points.append((b, m, 128, 12, "f16", False, False))
            points.append((b, m, 32, 12, "f16", False, False))
            points.append((b, m, 64, 12, "f16", True, False))

    gen = torch.Generator().manual_seed(args.seed)
    results = []
    hdr = "| batch x max | d | dtype | causal | nopad ms | TFLOP/s | varlen ms | vs varlen | sdpa ms | vs sdpa | cudnn ms | vs cudnn | err |"
    print(hdr + "\n|" + "---|" * 13, flush=True)
    rows = []
    for p in points:
        r = run_point(nopad, varlen_attn, *p, gen, args)
        results.append(r)
        im = r["impls"]

        def ms(n):
            return im[n]["ms"] if "ms" in im.get(n, {}) else float("nan")
        n = ms("nopad")
        row = "| %s%d x %d | %d | %s | %d | %.4f | %.0f | %.4f | %.2fx | %.4f | %.2fx | %.4f | %.2fx | %.1e |" % (
            "skew " if r["skew"] else "", r["batch"], r["max"], r["d"], r["dtype"], r["causal"], n,
            im["nopad"].get("tflops", float("nan")), ms("varlen_attn"), ms("varlen_attn") / n, ms("sdpa_padded"),
            ms("sdpa_padded") / n, ms("sdpa_cudnn_padded"), ms("sdpa_cudnn_padded") / n,
            r["max_row_rel_err_vs_varlen"])
        rows.append(row)
        print(row, flush=True)
        for k, v in im.items():
            if "error" in v:
                print("   %s failed: %s" % (k, v["error"]), flush=True)
            elif v["timing"] != "graph":
                print("   %s timed %s" % (k, v["timing"]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    gpu = env["gpu"].replace("NVIDIA ", "").replace(" ", "_")
    name = "fmha_%s_%s%s.json" % (stamp, gpu, ("_" + args.tag) if args.tag else "")
    with open(os.path.join(args.out, name), "w") as f:
        json.dump({"env": env, "results": results}, f, indent=1)
    with open(os.path.join(args.out, "fmha_table.md"), "w") as f:
        f.write("%s, driver %s, torch %s, CUDA %s, seed %d\n\n%s\n|%s\n%s\n" % (
            env["gpu"], env["driver"], env["torch"], env["cuda"], args.seed, hdr, "---|" * 13, "\n".join(rows)))
    print("wrote", name)


if __name__ == "__main__":
    sys.exit(main())
