#!/usr/bin/env python3
"""Fixtures of FP8 (E4M3) weights, tests/data/fp8/ (read by tests/test_fp8.c).

    e4m3_codes.txt      the 256 codes: "code float32-bits" as ml_dtypes' float8_e4m3fn decodes them
    e4m3_round.txt      "float32-bits code": random floats, the ties between neighbouring codes,
                        subnormals, NaN, infinities and values past 448, each with the code that
                        round-to-nearest-even gives, saturating (|x| >= 448 -> ±448, as CUDA's
                        cvt.rn.satfinite; ml_dtypes itself overflows to NaN, so values are clipped
                        to ±448 first)
    tiny_f8/            a random LLaMA (2 layers, hidden 32, 4 heads of 32 over 2 KV heads, vocabulary
                        96, untied head; head size 32: CUDA's paged attention takes 32, 48, 64, 80,
                        96 and 128)
                        whose linear layers are F8_E4M3 with `weight_scale`: layer 0 per output
                        channel ([N, 1] and [N]), layer 1 per tensor (a scalar and [1])
    tiny_f8_ref/        the same model with those weights dequantised (code · scale in float32),
                        everything F32: the CPU's logits for the two must be equal bit for bit
    tiny_f8_requant/    tiny_f8_ref's linear weights quantized again per output channel (as
                        `--weights fp8` does at load) and dequantised, F32: tests/test_cuda_fp8.c's
                        reference for tiny_f8_ref with weights fp8
    bad_e5m2/, bad_block_scale/, bad_scale_shape/, bad_no_scale/
                        1-layer models (vocabulary 16) whose q_proj is F8_E5M2, has a block-wise `weight_scale_inv`
                        [N/128, K/128], a `weight_scale` of [K], or no scale

Run from the repository root: python3 scripts/make_fp8_fixtures.py (numpy, ml_dtypes, safetensors).
With --measure: what FP8 activations and weights move tiny_f8_ref's logits by (float64 forward),
where tests/test_cuda_fp8.c's decoder bounds come from.
"""
import json
import pathlib
import shutil

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "fp8"
E4M3 = ml_dtypes.float8_e4m3fn
MAX = np.float32(448.0)


def to_e4m3(x):
    """float32 -> E4M3 codes, nearest-even, saturating (NaN stays NaN)."""
    x = np.asarray(x, np.float32)
    return np.clip(x, -MAX, MAX).astype(E4M3).view(np.uint8)


def write_tables():
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(E4M3).astype(np.float32)
    with open(OUT / "e4m3_codes.txt", "w") as f:
        for c, v in zip(codes, values.view(np.uint32)):
            f.write(f"{c} {v:08x}\n")
    rng = np.random.default_rng(43)
    finite = values[np.isfinite(values)]
    pos = np.unique(finite[finite >= 0])  # 0 .. 448 ascending
    mids = (pos[:-1].astype(np.float64) + pos[1:]) / 2  # ties, exact in float32
    ties = mids.astype(np.float32)
    assert np.all(ties.astype(np.float64) == mids)
    samples = [
        ties, -ties,
        np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf)),
        (rng.standard_normal(2000) * np.exp(rng.uniform(-12, 7, 2000))).astype(np.float32),
        rng.uniform(-2.0**-6, 2.0**-6, 300).astype(np.float32),  # subnormal range
        np.array([0.0, -0.0, 448.0, -448.0, 449.0, 463.99, 464.0, 465.0, 480.0, 1e6, -1e6, 3e38,
                  np.inf, -np.inf, np.nan, 2.0**-10, 2.0**-9 * 0.5, 2.0**-9 * 0.50001, 1e-45],
                 np.float32),
    ]
    x = np.concatenate(samples).astype(np.float32)
    q = to_e4m3(x)
    with open(OUT / "e4m3_round.txt", "w") as f:
        for b, c in zip(x.view(np.uint32), q):
            f.write(f"{b:08x} {c}\n")


# hidden 32 with heads of 32 (q 128 wide) keeps the three F32 models and the rest under 1 MB
HIDDEN, HEAD, VOCAB = 32, 32, 96
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": HIDDEN, "head_dim": HEAD,
    "intermediate_size": 96, "max_position_embeddings": 128, "mlp_bias": False,
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": False, "vocab_size": VOCAB, "dtype": "float32",
}
# rows of 32, 96 and 128 values: multiples of 16, as CUDA's FP8 kernels want them
LINEAR = [("self_attn.q_proj", 4 * HEAD, HIDDEN), ("self_attn.k_proj", 2 * HEAD, HIDDEN),
          ("self_attn.v_proj", 2 * HEAD, HIDDEN), ("self_attn.o_proj", HIDDEN, 4 * HEAD),
          ("mlp.gate_proj", 96, HIDDEN), ("mlp.up_proj", 96, HIDDEN),
          ("mlp.down_proj", HIDDEN, 96)]


def random_model(rng, layers, vocab=VOCAB):
    """Float32 weights; each linear weight's rows with scales spread over 2^-1 .. 2^1 (wider makes the
    random model chaotic: per-token FP8 activations then move its logits by up to 100%)."""
    t = {"model.embed_tokens.weight": rng.standard_normal((vocab, HIDDEN)).astype(np.float32),
         "lm_head.weight": (rng.standard_normal((vocab, HIDDEN)) * 0.2).astype(np.float32),
         "model.norm.weight": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)}
    for l in range(layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
        t[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
        for name, n, k in LINEAR:
            rows = np.exp2(rng.uniform(-1, 1, (n, 1)))
            t[p + name + ".weight"] = (rng.standard_normal((n, k)) * rows / np.sqrt(k)).astype(np.float32)
    return t


def quantize(w, per_channel):
    amax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max().reshape(1, 1)
    scale = (amax / MAX).astype(np.float32)
    q = to_e4m3(w / scale)
    deq = q.view(E4M3).astype(np.float32) * scale  # float32 product, as the loader computes it
    return q.view(E4M3), scale, deq


def write_model(folder, tensors, layers, vocab=VOCAB):
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(CONFIG, num_hidden_layers=layers, vocab_size=vocab)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(tensors, str(folder / "model.safetensors"))


def write_models():
    rng = np.random.default_rng(4343)
    floats = random_model(rng, 2)
    f8, ref = {}, {}
    # layer 0 per channel ([N, 1], and [N] for k_proj and down_proj); layer 1 per tensor (a
    # scalar [], and [1] for v_proj and up_proj)
    for name, w in floats.items():
        if not any(name.endswith(l[0] + ".weight") for l in LINEAR):
            f8[name] = ref[name] = w
            continue
        per_channel = ".layers.0." in name
        q, scale, deq = quantize(w, per_channel)
        f8[name], ref[name] = q, deq
        base = name[: -len(".weight")]
        if per_channel:
            f8[base + ".weight_scale"] = scale.reshape(-1) if ("k_proj" in name or "down_proj" in name) else scale
        else:
            one = "v_proj" in name or "up_proj" in name
            f8[base + ".weight_scale"] = scale.reshape(1) if one else scale.reshape(())
    cfg_q = {"quant_method": "compressed-tensors", "format": "float-quantized"}
    write_model(OUT / "tiny_f8", f8, 2)
    cfg = json.loads((OUT / "tiny_f8" / "config.json").read_text())
    cfg["quantization_config"] = cfg_q
    (OUT / "tiny_f8" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_model(OUT / "tiny_f8_ref", ref, 2)
    # tiny_f8_ref quantized again per output channel, as `--weights fp8` does at load (io/fp8.c:
    # scale = amax / 448 in float32, codes of w / scale), dequantised: what CUDA's FP8 kernels
    # compute with when tiny_f8_ref is loaded with weights fp8
    requant = {}
    for name, w in ref.items():
        if any(name.endswith(l[0] + ".weight") for l in LINEAR):
            requant[name] = quantize(w, True)[2]
        else:
            requant[name] = w
    write_model(OUT / "tiny_f8_requant", requant, 2)

    # the bad ones: one layer, q_proj broken in one way each
    small = random_model(np.random.default_rng(7), 1, vocab=16)
    def one_layer(edit):
        t = {}
        for name, w in small.items():
            if any(name.endswith(l[0] + ".weight") for l in LINEAR):
                q, scale, _ = quantize(w, True)
                t[name], t[name[: -len(".weight")] + ".weight_scale"] = q, scale
            else:
                t[name] = w
        edit(t)
        return t
    q = "model.layers.0.self_attn.q_proj."
    def e5m2(t):
        t[q + "weight"] = small[q + "weight"].astype(ml_dtypes.float8_e5m2)
    def block(t):
        del t[q + "weight_scale"]
        t[q + "weight_scale_inv"] = np.ones((1, 1), np.float32)
    def shape(t):
        t[q + "weight_scale"] = np.ones(HIDDEN, np.float32)  # [K]
    def missing(t):
        del t[q + "weight_scale"]
    for folder, edit in [("bad_e5m2", e5m2), ("bad_block_scale", block), ("bad_scale_shape", shape),
                         ("bad_no_scale", missing)]:
        shutil.rmtree(OUT / folder, ignore_errors=True)
        write_model(OUT / folder, one_layer(edit), 1, vocab=16)


def forward(folder, ids, quantize_activations):
    """The logits [T, V] of a fixture LLaMA for one prompt in float64 (numpy), each linear layer's
    input quantized per token to E4M3 first (as the CUDA prompts' FP8 GEMM) when asked."""
    cfg = json.loads((folder / "config.json").read_text())
    from safetensors.numpy import load_file
    t = {k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}
    nh, kvh, D, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    T = len(ids)
    h = t["model.embed_tokens.weight"][ids]
    angles = np.arange(T)[:, None] * (1.0 / 10000.0 ** (np.arange(0, D, 2) / D))[None]
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]

    def rope(x):
        a, b = x[..., : D // 2], x[..., D // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    def norm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def linear(x, w):
        if quantize_activations:
            x = x.astype(np.float32)
            scale = (np.abs(x).max(-1, keepdims=True) / MAX).astype(np.float32)
            scale[scale == 0] = 1
            x = to_e4m3(x / scale).view(E4M3).astype(np.float32).astype(np.float64) * scale
        return x @ w.T

    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        xn = norm(h, t[p + "input_layernorm.weight"])
        q = rope(linear(xn, t[p + "self_attn.q_proj.weight"]).reshape(T, nh, D))
        k = np.repeat(rope(linear(xn, t[p + "self_attn.k_proj.weight"]).reshape(T, kvh, D)), nh // kvh, 1)
        v = np.repeat(linear(xn, t[p + "self_attn.v_proj.weight"]).reshape(T, kvh, D), nh // kvh, 1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D) + np.triu(np.full((T, T), -np.inf), 1)[None]
        prob = np.exp(s - s.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        h = h + linear(np.einsum("hts,shd->thd", prob, v).reshape(T, nh * D), t[p + "self_attn.o_proj.weight"])
        xn = norm(h, t[p + "post_attention_layernorm.weight"])
        g, u = linear(xn, t[p + "mlp.gate_proj.weight"]), linear(xn, t[p + "mlp.up_proj.weight"])
        h = h + linear(g / (1 + np.exp(-g)) * u, t[p + "mlp.down_proj.weight"])
    return norm(h, t["model.norm.weight"]) @ t["lm_head.weight"].T


def measure():
    """What FP8 moves tiny_f8_ref's logits by (max row relative error over 100 random prompts of 31
    tokens): its activations quantized per token, and its weights quantized per channel too
    (tiny_f8_requant). tests/test_cuda_fp8.c's bounds come from these."""
    def row_err(a, b):
        return (np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)).max()
    rng = np.random.default_rng(1)
    acts, both, weights = [], 0.0, 0.0
    for _ in range(100):
        ids = rng.integers(0, VOCAB, 31)
        ref = forward(OUT / "tiny_f8_ref", ids, False)
        acts.append(row_err(forward(OUT / "tiny_f8_ref", ids, True), ref))
        weights = max(weights, row_err(forward(OUT / "tiny_f8_requant", ids, False), ref))
        both = max(both, row_err(forward(OUT / "tiny_f8_requant", ids, True), ref))
    print(f"tiny_f8_ref's logits, max row relative error: activations FP8 {max(acts):.4f} (median over the "
          f"prompts {np.median(acts):.4f}), weights FP8 {weights:.4f}, both {both:.4f}")


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["--measure"]:
        measure()
    else:
        OUT.mkdir(parents=True, exist_ok=True)
        write_tables()
        write_models()
