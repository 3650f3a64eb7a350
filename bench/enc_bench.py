#!/usr/bin/env python3
"""ENC benchmark (docs/design.md "ENC"): the whole encoder forward, nopad vs PyTorch peers.

Random BERT-shaped weights are written once as a Hugging Face folder; nopad loads that folder and
the peers use the same weights. Per point: lengths uniform in [0.2·max, max], the same token ids for
everyone; region = token ids in -> last hidden states out. Every implementation is timed the same
way: N back-to-back forwards between two CUDA events, median of R repetitions after warm-up.
nopad is also timed as CUDA-graph replays of its forward (what its own graph cache will do).

    python3 bench/enc_bench.py --lib build-cuda/libnopad.so --out results.json [--quick]
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))




# the C API's structs, as the Python package declares them (one definition to keep in step with nopad.h)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from nopad._native import Batch, EncodeParams, ModelParams  # noqa: E402


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.nopad_last_error.restype = ctypes.c_char_p
    lib.nopad_model_default_params.restype = ModelParams
    lib.nopad_model_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ModelParams), ctypes.POINTER(ctypes.c_void_p)]
    lib.nopad_model_free.argtypes = [ctypes.c_void_p]
    lib.nopad_model_context.restype = ctypes.c_void_p
    lib.nopad_model_context.argtypes = [ctypes.c_void_p]
    lib.nopad_encode.argtypes = [ctypes.c_void_p, ctypes.POINTER(Batch), ctypes.POINTER(EncodeParams),
                                 ctypes.c_void_p, ctypes.c_void_p]
    return lib


def check(lib, status, what):
    if status != 0:
        raise RuntimeError(f"nopad {what}: status {status}: {lib.nopad_last_error().decode()}")


def time_fn(fn, iters, reps, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def matmul_tflops(dtype):
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    b = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    ms = time_fn(lambda: a @ b, 10, 5)
    return 2 * 8192**3 / ms / 1e9


def set_attn(model, impl):
    try:
        model.set_attn_implementation(impl)
    except AttributeError:
        model.config._attn_implementation = impl


def make_model(shape, dtype, folder):
    from transformers import BertConfig, BertModel
    if shape == "base":
        cfg = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                         max_position_embeddings=1024)
    else:
        cfg = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                         max_position_embeddings=1024)
    torch.manual_seed(0)
    model = BertModel(cfg, add_pooling_layer=False).eval()
    model.save_pretrained(folder, safe_serialization=True)  # fp32 on disk; nopad converts at load
    return cfg, model.to("cuda", dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="the issue's target points only")
    ap.add_argument("--shape", default="base", choices=["base", "large"])
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--peers", default="sdpa,eager,nested",
                    help="comma list of sdpa, eager, nested, compile (HF sdpa + torch.compile)")
    ap.add_argument("--package", action="store_true",
                    help="also time nopad through the Python package (python/, nopad.Encoder)")
    args = ap.parse_args()
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    lib = load_lib(args.lib)
    dev = torch.cuda.get_device_properties(0)
    info = {"gpu": dev.name, "sms": dev.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d"), "shape": args.shape,
            "dtype": args.dtype}
    info["matmul_tflops"] = matmul_tflops(dtype)
    print(json.dumps(info), flush=True)

    folder = f"/tmp/nopad_enc_{args.shape}"
    cfg, hf = make_model(args.shape, dtype, folder)
    H, L = cfg.hidden_size, cfg.num_hidden_layers
    points = ([(1, 128), (16, 256), (16, 512), (16, 1024), (128, 512)] if args.quick else
              [(b, m) for b in (1, 16, 64, 128) for m in (64, 128, 256, 512, 1024)])
    max_tokens = max(b * m for b, m in points)

    stream = torch.cuda.Stream()
    params = lib.nopad_model_default_params()
    params.device, params.dtype = 1, (1 if args.dtype == "fp16" else 2)
    params.max_batch_tokens = max_tokens
    params.cuda_stream = stream.cuda_stream
    free0 = torch.cuda.mem_get_info()[0]
    handle = ctypes.c_void_p()
    check(lib, lib.nopad_model_load(folder.encode(), ctypes.byref(params), ctypes.byref(handle)), "load")
    torch.cuda.synchronize()
    nopad_load_bytes = free0 - torch.cuda.mem_get_info()[0]
    none = EncodeParams(0, 0)
    enc = None
    if args.package:
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        os.environ.setdefault("NOPAD_LIBRARY", os.path.abspath(args.lib))
        import nopad
        enc = nopad.Encoder(folder, device="cuda", dtype=args.dtype, max_batch_tokens=max_tokens)

    peers = {}
    if "nested" in args.peers:
        layer = torch.nn.TransformerEncoderLayer(H, cfg.num_attention_heads, cfg.intermediate_size,
                                                 activation="gelu", batch_first=True,
                                                 layer_norm_eps=cfg.layer_norm_eps)
        peers["nested"] = torch.nn.TransformerEncoder(layer, L, enable_nested_tensor=True).to("cuda", dtype).eval()

    rows = []
    gen = torch.Generator().manual_seed(20261121)
    for B, M in points:
        lo = max(1, math.ceil(0.2 * M))
        lens = torch.randint(lo, M + 1, (B,), generator=gen)
        T = int(lens.sum())
        cu = torch.zeros(B + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(lens, 0)
        ids = torch.randint(1000, 30000, (T,), generator=gen, dtype=torch.int32)
        d_ids, d_cu = ids.cuda(), cu.cuda()
        hidden = torch.empty(T, H, device="cuda", dtype=dtype)
        maxlen = int(lens.max())
        useful = L * (24 * T * H * H + 4 * H * int((lens.long() ** 2).sum()))
        ideal_ms = useful / (info["matmul_tflops"] * 1e9)

        batch = Batch(layout=0, on_device=1, n_seqs=B, tokens=d_ids.data_ptr(), cu_seqlens=d_cu.data_ptr(),
                      n_tokens=T, max_seqlen=maxlen)
        context = lib.nopad_model_context(handle)

        def nopad_fwd():
            check(lib, lib.nopad_encode(context, ctypes.byref(batch), ctypes.byref(none), hidden.data_ptr(), None),
                  "encode")

        torch.cuda.set_stream(stream)
        nopad_fwd()
        torch.cuda.synchronize()
        iters = max(3, min(50, int(200 / max(ideal_ms, 0.02) / 10)))
        # activations of one forward: hidden, qkv, context, attn (T x 6H) + FFN (T x I), 2 bytes each
        row = {"batch": B, "max": M, "tokens": T, "ideal_ms": ideal_ms,
               "nopad_workspace_bytes": T * (6 * H + cfg.intermediate_size) * 2,
               "nopad_weights_and_context_bytes": nopad_load_bytes}
        row["nopad_ms"] = time_fn(nopad_fwd, iters, 5)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=stream):
                nopad_fwd()
            row["nopad_graph_ms"] = time_fn(graph.replay, iters, 5)
        except Exception as e:  # noqa: BLE001 - report, don't hide
            row["nopad_graph_ms"] = None
            row["nopad_graph_error"] = str(e)[:200]
        torch.cuda.set_stream(torch.cuda.default_stream())
        if enc is not None:
            pkg_out = torch.empty_like(hidden)
            row["nopad_package_ms"] = time_fn(
                lambda: enc.forward(d_ids, d_cu, max_seqlen=maxlen, out=pkg_out), iters, 5)
            torch.cuda.synchronize()
            row["package_vs_ctypes_max_abs_diff"] = (pkg_out.float() - hidden.float()).abs().max().item()

        # padded inputs for the peers
        padded = torch.zeros(B, maxlen, dtype=torch.long)
        mask = torch.zeros(B, maxlen, dtype=torch.long)
        for i in range(B):
            padded[i, :lens[i]] = ids[cu[i]:cu[i + 1]].long()
            mask[i, :lens[i]] = 1
        padded, mask = padded.cuda(), mask.cuda()
        with torch.inference_mode():
            set_attn(hf, "sdpa")
            ref = hf(input_ids=padded, attention_mask=mask).last_hidden_state
            ref_packed = torch.cat([ref[i, :lens[i]] for i in range(B)]).float()
            err = ((hidden.float() - ref_packed).norm(dim=1) / ref_packed.norm(dim=1)).max().item()
            row["err_vs_hf"] = err
            for impl in ("sdpa", "eager"):
                if impl not in args.peers:
                    continue
                set_attn(hf, impl)
                row[f"hf_{impl}_ms"] = time_fn(lambda: hf(input_ids=padded, attention_mask=mask), iters, 5)
            if "compile" in args.peers:
                # HF sdpa under torch.compile, dynamic shapes: one compilation serves every point
                # (per-shape compilation is minutes per point); compile time is not timed
                set_attn(hf, "sdpa")
                if "compiled" not in peers:
                    peers["compiled"] = torch.compile(hf, dynamic=True)
                cfn = lambda: peers["compiled"](input_ids=padded, attention_mask=mask)
                t0 = time.time()
                cfn()
                torch.cuda.synchronize()
                row["hf_sdpa_compile_first_call_s"] = time.time() - t0
                row["hf_sdpa_compile_ms"] = time_fn(cfn, iters, 5)
            if "nested" in peers:
                x = torch.randn(B, maxlen, H, device="cuda", dtype=dtype)
                pad_mask = mask == 0
                row["nested_ms"] = time_fn(lambda: peers["nested"](x, src_key_padding_mask=pad_mask), iters, 5)
        peer_ms = [row[k] for k in row if k.endswith("_ms") and not k.startswith("nopad")
                   and k != "ideal_ms" and row[k]]
        best = min(peer_ms) if peer_ms else None
        nop = min(x for x in (row["nopad_ms"], row.get("nopad_graph_ms")) if x)
        row["best_peer_ms"] = best
        row["speedup_vs_best_peer"] = best / nop if best else None
        row["x_ideal"] = nop / ideal_ms
        rows.append(row)
        print(json.dumps(row), flush=True)
        del hidden, padded, mask
    lib.nopad_model_free(handle)
    if enc is not None:
        enc.close()
        print("| batch x max | nopad via ctypes ms | via nopad.Encoder ms | max abs diff |")
        print("|---|---|---|---|")
        for r in rows:
            print(f"| {r['batch']} x {r['max']} | {r['nopad_ms']:.3f} | {r['nopad_package_ms']:.3f} | "
                  f"{r['package_vs_ctypes_max_abs_diff']:.1e} |")

    print(f"\n{info['gpu']}, torch {info['torch']}, CUDA {info['cuda']}, {args.shape} {args.dtype}, "
          f"matmul {info['matmul_tflops']:.0f} TFLOP/s; ms per forward (median of 5 x N)")
    print("| batch x max | T | ideal | nopad | nopad graph | x ideal | HF sdpa | HF eager | HF sdpa+compile | nested | vs best peer | err vs HF |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    f = lambda v: f"{v:.3f}" if isinstance(v, float) else "–"
    for r in rows:
        print(f"| {r['batch']} x {r['max']} | {r['tokens']} | {f(r['ideal_ms'])} | {f(r['nopad_ms'])} | "
              f"{f(r.get('nopad_graph_ms'))} | {r['x_ideal']:.2f} | {f(r.get('hf_sdpa_ms'))} | "
              f"{f(r.get('hf_eager_ms'))} | {f(r.get('hf_sdpa_compile_ms'))} | {f(r.get('nested_ms'))} | "
              f"{(r['speedup_vs_best_peer'] or 0):.2f}x | {r['err_vs_hf']:.1e} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"info": info, "load_bytes": nopad_load_bytes, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
