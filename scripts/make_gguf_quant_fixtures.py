#!/usr/bin/env python3
"""Writes tests/data/gguf/quant_tiny.gguf, the tiny LLaMA-shaped decoder of tests/test_quant_decoder.c:
random weights in the block formats that nopad's CPU backend keeps as stored (docs/decoder.md,
"Quantized weights on the CPU").

    pip install gguf numpy
    python3 scripts/make_gguf_quant_fixtures.py

Architecture "llama", a byte-level BPE tokenizer ("gpt2": the 256 byte symbols, then 256 merges
of two letters a..p, so that text runs through the CLI too): hidden 256, 4 heads of
64, 2 KV heads, FFN 256, 2 layers, vocabulary 512, context 256; every row length a multiple of
256, so every format runs.
    token_embd  Q6_K  (tied: also the LM head)
    attn_q, attn_k, attn_v  Q4_K  (layer 1's attn_v: Q6_K, so that layer's fused Q|K|V mixes
                                   formats and is dequantised, with a notice)
    attn_output  Q8_0 (gguf.quants.quantize of normal floats)
    ffn_gate, ffn_up  Q4_K
    ffn_down  Q6_K
    attn_norm, ffn_norm, output_norm  F32, 1 + 0.1·N(0, 1)

The package cannot quantize the k-quants, so their blocks are random bytes with scales chosen so
that the weights are about 0.05 in size (as a trained model's are): Q4_K's d in 1e-4..3e-4 and
dmin 7.5 times that (its mins then centre the weights), Q6_K's d in 2.5e-5..7.5e-5. The seed is
fixed; a re-run with the same numpy and gguf versions writes the same bytes.
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "gguf")

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, VOCAB, CONTEXT = 256, 4, 2, 256, 2, 512, 256
HEAD = HIDDEN // HEADS

rng = np.random.default_rng(20261207)


def f16_bytes(values):
    return values.astype(np.float16).view(np.uint8).reshape(len(values), 2)


def k_blocks(qtype, rows, cols):
    """rows × cols values of Q4_K or Q6_K: random quants and scales, fp16 d (and dmin) set."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    if qtype == T.Q4_K:
        d = rng.uniform(1e-4, 3e-4, nb)
        raw[:, 0:2] = f16_bytes(d)
        raw[:, 2:4] = f16_bytes(7.5 * d)
    else:  # Q6_K: ql[128] qh[64] scales[16] (int8) d
        raw[:, 192:208] = rng.integers(-64, 65, size=(nb, 16)).astype(np.int8).view(np.uint8)
        raw[:, 208:210] = f16_bytes(rng.uniform(2.5e-5, 7.5e-5, nb))
    return raw.reshape(rows, cols // block * size)


def add(w, name, qtype, rows, cols):
    if qtype == T.Q8_0:
        w.add_tensor(name, quantize((0.05 * rng.standard_normal((rows, cols))).astype(np.float32), T.Q8_0),
                     raw_dtype=T.Q8_0)
    else:
        w.add_tensor(name, k_blocks(qtype, rows, cols), raw_dtype=qtype)


def bytes_to_unicode():
    """GPT-2's printable stand-ins for the 256 bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def main():
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "quant_tiny.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("nopad quantized decoder fixture")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)

    letters = "abcdefghijklmnop"
    pairs = [a + b for a in letters for b in letters]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(bytes_to_unicode() + pairs)
    w.add_token_merges([a + " " + b for a, b in pairs])
    assert len(bytes_to_unicode()) + len(pairs) == VOCAB

    def norm(name):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))

    add(w, "token_embd.weight", T.Q6_K, VOCAB, HIDDEN)
    for l in range(LAYERS):
        b = "blk.%d." % l
        norm(b + "attn_norm.weight")
        add(w, b + "attn_q.weight", T.Q4_K, HEADS * HEAD, HIDDEN)
        add(w, b + "attn_k.weight", T.Q4_K, KV_HEADS * HEAD, HIDDEN)
        add(w, b + "attn_v.weight", T.Q6_K if l == 1 else T.Q4_K, KV_HEADS * HEAD, HIDDEN)
        add(w, b + "attn_output.weight", T.Q8_0, HIDDEN, HEADS * HEAD)
        norm(b + "ffn_norm.weight")
        add(w, b + "ffn_gate.weight", T.Q4_K, FFN, HIDDEN)
        add(w, b + "ffn_up.weight", T.Q4_K, FFN, HIDDEN)
        add(w, b + "ffn_down.weight", T.Q6_K, HIDDEN, FFN)
    norm("output_norm.weight")

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = os.path.getsize(path)
    assert size < 800_000, size
    print(f"wrote {path} ({size} bytes)")


if __name__ == "__main__":
    sys.exit(main())
