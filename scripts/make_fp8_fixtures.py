#!/usr/bin/env python3
"""Fixtures of FP8 (E4M3) weights, tests/data/fp8/ (read by tests/test_fp8.c).

    e4m3_codes.txt      the 256 codes: "code float32-bits" as ml_dtypes' float8_e4m3fn decodes them
    e4m3_round.txt      "float32-bits code": random floats, the ties between neighbouring codes,
                        subnormals, NaN, infinities and values past 448, each with the code that
                        round-to-nearest-even gives, saturating (|x| >= 448 -> ±448, as CUDA's
                        cvt.rn.satfinite; ml_dtypes itself overflows to NaN, so values are clipped
                        to ±448 first)
    tiny_f8/            a random LLaMA (2 layers, hidden 64, GQA 4:2, vocabulary 160, untied head)
                        whose linear layers are F8_E4M3 with `weight_scale`: layer 0 per output
                        channel ([N, 1] and [N]), layer 1 per tensor (a scalar and [1])
    tiny_f8_ref/        the same model with those weights dequantised (code · scale in float32),
                        everything F32: the CPU's logits for the two must be equal bit for bit
    bad_e5m2/, bad_block_scale/, bad_scale_shape/, bad_no_scale/
                        1-layer models (vocabulary 16) whose q_proj is F8_E5M2, has a block-wise `weight_scale_inv`
                        [N/128, K/128], a `weight_scale` of [K], or no scale

Run from the repository root: python3 scripts/make_fp8_fixtures.py (numpy, ml_dtypes, safetensors).
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


CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 64, "head_dim": 16,
    "intermediate_size": 128, "max_position_embeddings": 128, "mlp_bias": False,
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": False, "vocab_size": 160, "dtype": "float32",
}
LINEAR = [("self_attn.q_proj", 64, 64), ("self_attn.k_proj", 32, 64), ("self_attn.v_proj", 32, 64),
          ("self_attn.o_proj", 64, 64), ("mlp.gate_proj", 128, 64), ("mlp.up_proj", 128, 64),
          ("mlp.down_proj", 64, 128)]


def random_model(rng, layers, vocab=160):
    """Float32 weights; each linear weight's rows with scales spread over 2^-3 .. 2^3."""
    t = {"model.embed_tokens.weight": rng.standard_normal((vocab, 64)).astype(np.float32),
         "lm_head.weight": (rng.standard_normal((vocab, 64)) * 0.2).astype(np.float32),
         "model.norm.weight": (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)}
    for l in range(layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
        t[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
        for name, n, k in LINEAR:
            rows = np.exp2(rng.uniform(-3, 3, (n, 1)))
            t[p + name + ".weight"] = (rng.standard_normal((n, k)) * rows / np.sqrt(k)).astype(np.float32)
    return t


def quantize(w, per_channel):
    amax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max().reshape(1, 1)
    scale = (amax / MAX).astype(np.float32)
    q = to_e4m3(w / scale)
    deq = q.view(E4M3).astype(np.float32) * scale  # float32 product, as the loader computes it
    return q.view(E4M3), scale, deq


def write_model(folder, tensors, layers, vocab=160):
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
        t[q + "weight_scale"] = np.ones(64, np.float32)[:32]
    def missing(t):
        del t[q + "weight_scale"]
    for folder, edit in [("bad_e5m2", e5m2), ("bad_block_scale", block), ("bad_scale_shape", shape),
                         ("bad_no_scale", missing)]:
        shutil.rmtree(OUT / folder, ignore_errors=True)
        write_model(OUT / folder, one_layer(edit), 1, vocab=16)


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    write_tables()
    write_models()
