#!/usr/bin/env python3
"""Issue 24's TRAIN workload: a masked-LM training step, lengths U[102, 512], 15% of the tokens
masked, bf16 compute with float32 master weights, AdamW — nopad's packed step against Hugging
Face BertForMaskedLM on the padded batch, eager and under torch.compile, in one run on one GPU.

For each shape (BERT-base batch 64, BERT-large batch 32 by default) the script builds a random
BertForMaskedLM with transformers (seeded) and saves it; nopad trains that folder through
`train_bench` (tools/train_bench.c, timed with CUDA events by part) and each HF peer runs the
same recipe in PyTorch:
  hf_eager    float32 parameters, torch.autocast(bfloat16), torch.optim.AdamW(fused=True),
              the batch padded to its longest sequence with an attention mask, labels -100 on the
              unmasked positions (HF computes the LM head on every position, as its model does)
  hf_compile  the same model under torch.compile (default mode); compilation is in the warm-up,
              which runs every distinct batch once (each padded shape compiled before timing)
Each peer runs in a child process (a crash or an out-of-memory is recorded, not fatal). Per part
(forward + loss, backward, optimiser) the median over the timed steps of CUDA-event times; useful
tokens per second = real tokens of the batch / median step time (padding is not useful);
peak memory = torch.cuda.max_memory_allocated for HF, the device memory nopad's model, optimiser
state and workspace take (cudaMemGetInfo) for nopad — both without the CUDA context.
"Ideal" = the step's FLOPs on the real tokens only (6 x parameters touched per token for the
GEMMs, the attention's 4·S·H per layer at the batch's mean key count, and the MLM head on the
masked rows only) at the bf16 GEMM rate measured in the same run (a 8192^3 torch.matmul).

    python3 bench/train_bench.py --train-bench build/train_bench --out DIR [--shapes base,large]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

SHAPES = {  # name: (layers, hidden, heads, ffn, batch)
    "base": (12, 768, 12, 3072, 64),
    "large": (24, 1024, 16, 4096, 32),
}


def lengths_and_masks(batch, min_len, max_len, mask, n_batches, seed):
    """The same kind of batches train_bench draws: lengths U[min, max], ceil-round 15% masked."""
    import random
    rng = random.Random(seed)
    out = []
    for _ in range(n_batches):
        lens = [rng.randint(min_len, max_len) for _ in range(batch)]
        masked = [max(1, int(mask * n + 0.5)) for n in lens]
        out.append((lens, masked))
    return out


def make_model(folder, shape, seed):
    import torch
    from transformers import BertConfig, BertForMaskedLM
    layers, hidden, heads, ffn, _ = SHAPES[shape]
    if os.path.exists(os.path.join(folder, "config.json")):
        return
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=512,
                     hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertForMaskedLM(cfg).save_pretrained(folder, safe_serialization=True)


def hf_worker(spec):
    import torch
    from transformers import BertForMaskedLM
    torch.manual_seed(0)
    dev = "cuda"
    model = BertForMaskedLM.from_pretrained(spec["folder"], attn_implementation="sdpa").to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    fwd = torch.compile(model) if spec["peer"] == "hf_compile" else model
    batches = []
    g = torch.Generator().manual_seed(1)
    for lens, masked in spec["batches"]:
        B, S = len(lens), max(lens)
        ids = torch.randint(1000, 30522, (B, S), generator=g)
        att = torch.zeros((B, S), dtype=torch.long)
        labels = torch.full((B, S), -100, dtype=torch.long)
        for i, (n, k) in enumerate(zip(lens, masked)):
            att[i, :n] = 1
            pos = torch.randperm(n, generator=g)[:k]
            labels[i, pos] = torch.randint(1000, 30522, (k,), generator=g)
        batches.append((ids.to(dev), att.to(dev), labels.to(dev), sum(lens)))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = {"forward_ms": [], "backward_ms": [], "optimizer_ms": [], "step_ms": []}
    losses = []
    n_warm, n_steps = spec["warmup"], spec["steps"]
    if spec["peer"] == "hf_compile":  # every batch shape compiled before the clock starts
        n_warm = max(n_warm, len(batches))
    t_compile = time.time()
    for s in range(n_warm + n_steps):
        ids, att, labels, _ = batches[s % len(batches)]
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        ev[0].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, attention_mask=att, labels=labels).loss
        ev[1].record()
        loss.backward()
        ev[2].record()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ev[3].record()
        torch.cuda.synchronize()
        losses.append(float(loss))
        if s == n_warm - 1:
            warm_s = time.time() - t_compile
        if s >= n_warm:
            times["forward_ms"].append(ev[0].elapsed_time(ev[1]))
            times["backward_ms"].append(ev[1].elapsed_time(ev[2]))
            times["optimizer_ms"].append(ev[2].elapsed_time(ev[3]))
            times["step_ms"].append(ev[0].elapsed_time(ev[3]))
    med = {k: statistics.median(v) for k, v in times.items()}
    mean_tokens = statistics.mean(b[3] for b in batches)
    rec = dict(engine=spec["peer"], **{k: round(v, 3) for k, v in med.items()},
               useful_tok_s=round(mean_tokens / (med["step_ms"] * 1e-3)),
               memory_gb=round(torch.cuda.max_memory_allocated() / 1e9, 3),
               mean_tokens=mean_tokens, warmup_s=round(warm_s, 1),
               first_loss=round(losses[0], 4), last_loss=round(losses[-1], 4))
    return rec


def run_peer(spec, out_path, limit_s):
    spec_path = out_path + ".spec.json"
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    try:
        p = subprocess.run([sys.executable, __file__, "--worker", spec_path], capture_output=True,
                           text=True, timeout=limit_s)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if p.returncode == 0 and lines:
            return json.loads(lines[-1])
        return {"engine": spec["peer"], "error": (p.stderr or p.stdout)[-2000:]}
    except subprocess.TimeoutExpired:
        return {"engine": spec["peer"], "error": f"timeout after {limit_s} s"}


def gemm_rate_tflops():
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    ts = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        a @ b
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    return 2 * 8192 ** 3 / (statistics.median(ts) * 1e-3) / 1e12


def ideal_tok_s(shape, batches, rate_tflops, vocab=30522):
    """FLOPs of one training step per real token, on the real tokens only, at the GEMM rate."""
    layers, H, _, I, _ = SHAPES[shape]
    lens = [n for lens, _ in batches for n in lens]
    masked = sum(k for _, m in batches for k in m) / len(lens)  # masked rows per sequence
    mean_len = statistics.mean(lens)
    keys = sum(n * n for n in lens) / sum(lens)  # mean keys a query sees
    per_token_fwd = layers * (2 * (4 * H * H + 2 * H * I) + 4 * keys * H)
    head_fwd = (masked / mean_len) * 2 * (H * H + H * vocab)
    flops = 3 * (per_token_fwd + head_fwd)  # backward = 2 x forward
    return rate_tflops * 1e12 / flops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--train-bench", default="build-cuda/train_bench")
    ap.add_argument("--out", default="train_bench_out")
    ap.add_argument("--shapes", default="base,large")
    ap.add_argument("--peers", default="hf_eager,hf_compile")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="/tmp/nopad_train_models")
    ap.add_argument("--peer-limit-s", type=int, default=480)
    args = ap.parse_args()
    if args.worker:
        with open(args.worker) as fh:
            spec = json.load(fh)
        try:
            print(json.dumps(hf_worker(spec)), flush=True)
        except Exception:
            traceback.print_exc()
            sys.exit(1)
        return
    import torch
    import transformers
    os.makedirs(args.out, exist_ok=True)
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "transformers": transformers.__version__, "cuda": torch.version.cuda}
    rate = gemm_rate_tflops()
    env["bf16_gemm_tflops"] = round(rate, 1)
    print(json.dumps(env), flush=True)
    results = {"env": env, "workloads": []}
    out_json = os.path.join(args.out, "train_bench.json")
    for shape in args.shapes.split(","):
        layers, hidden, heads, ffn, batch = SHAPES[shape]
        folder = os.path.join(args.models, shape)
        make_model(folder, shape, seed=0)
        batches = lengths_and_masks(batch, 102, 512, 0.15, 8, seed=1)
        w = {"shape": shape, "layers": layers, "hidden": hidden, "batch": batch,
             "ideal_tok_s": round(ideal_tok_s(shape, batches, rate)), "runs": []}
        results["workloads"].append(w)
        lengths_path = os.path.join(args.out, f"{shape}_lengths.txt")
        with open(lengths_path, "w") as fh:  # the same batches for nopad and the peers
            for lens, _ in batches:
                fh.write(" ".join(map(str, lens)) + "\n")
        cmd = [args.train_bench, "--model", folder, "--lengths", lengths_path, "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--dtype", "bf16", "--optimizer", "adamw"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        rec = json.loads(lines[-1]) if p.returncode == 0 and lines else \
            {"engine": "nopad", "error": (p.stderr or p.stdout)[-2000:]}
        print(json.dumps(rec), flush=True)
        w["runs"].append(rec)
        for peer in args.peers.split(","):
            if not peer:
                continue
            spec = {"peer": peer, "folder": folder, "batches": batches, "steps": args.steps,
                    "warmup": args.warmup}
            rec = run_peer(spec, os.path.join(args.out, f"{shape}_{peer}"), args.peer_limit_s)
            print(json.dumps(rec), flush=True)
            w["runs"].append(rec)
        with open(out_json, "w") as fh:
            json.dump(results, fh, indent=1)
    # the table
    for w in results["workloads"]:
        print(f"\n{w['shape']} batch {w['batch']}: ideal {w['ideal_tok_s']:,} tok/s")
        best = max((r.get("useful_tok_s", 0) for r in w["runs"] if r["engine"] != "nopad"), default=0)
        for r in w["runs"]:
            if "error" in r:
                print(f"  {r['engine']:<11} error: {r['error'][-200:]}")
                continue
            ratio = f"{r['useful_tok_s'] / best:.2f}x best peer" if best and r["engine"] == "nopad" else ""
            print(f"  {r['engine']:<11} {r['useful_tok_s']:>9,} tok/s  step {r['step_ms']:.1f} ms "
                  f"(fwd {r['forward_ms']:.1f} bwd {r['backward_ms']:.1f} opt {r['optimizer_ms']:.1f})"
                  f"  mem {r['memory_gb']:.1f} GB  {r['useful_tok_s'] / w['ideal_tok_s']:.0%} of ideal {ratio}")


if __name__ == "__main__":
    main()
