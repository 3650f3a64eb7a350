"""Writes a GGUF decoder of a given shape with random weights, for the QUANT table's CPU rows
(issue 43): by default LLaMA-3.2-1B's (hidden 2048, 16 layers, 32 heads of 64, 8 KV heads, FFN
8192, tied embeddings, RoPE base 500000) with a vocabulary of 32000 instead of 128256. Weights are
N(0, 0.02) in f16 (the norms' f32, 1 + N(0, 0.02)); llama.cpp's `llama-quantize` then makes the
file to time (Q4_K_M and so on) from it:

    python3 bench/make_gguf_shape.py --out /tmp/llama1b_f16.gguf
    llama-quantize /tmp/llama1b_f16.gguf /tmp/llama1b_Q4_K_M.gguf Q4_K_M

There is no tokenizer: tokenizer.ggml.model is "none" with llama.vocab_size set, which llama.cpp
reads as a vocabulary of dummy tokens and nopad loads without a tokenizer (token ids work). Both
engines are timed on random ids (bench/quant_cpu.py, llama-bench)."""
import argparse
import sys

import gguf
import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--rope-base", type=float, default=500000.0)
    ap.add_argument("--seed", type=int, default=20261207)
    args = ap.parse_args()
    head = args.hidden // args.heads
    rng = np.random.default_rng(args.seed)

    w = gguf.GGUFWriter(args.out, arch="llama")
    w.add_name("random LLaMA-shaped decoder (bench/make_gguf_shape.py)")
    w.add_context_length(args.context)
    w.add_embedding_length(args.hidden)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(args.ffn)
    w.add_head_count(args.heads)
    w.add_head_count_kv(args.kv_heads)
    w.add_rope_dimension_count(head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(args.rope_base)
    w.add_vocab_size(args.vocab)
    w.add_tokenizer_model("none")

    def matrix(name, rows, cols):  # GGUF's dims are (cols, rows): rows of `cols` values
        w.add_tensor(name, (0.02 * rng.standard_normal((rows, cols), dtype=np.float32)).astype(np.float16))

    def norm(name):
        w.add_tensor(name, (1.0 + 0.02 * rng.standard_normal(args.hidden, dtype=np.float32)).astype(np.float32))

    matrix("token_embd.weight", args.vocab, args.hidden)  # tied: also the LM head
    for layer in range(args.layers):
        b = "blk.%d." % layer
        norm(b + "attn_norm.weight")
        matrix(b + "attn_q.weight", args.heads * head, args.hidden)
        matrix(b + "attn_k.weight", args.kv_heads * head, args.hidden)
        matrix(b + "attn_v.weight", args.kv_heads * head, args.hidden)
        matrix(b + "attn_output.weight", args.hidden, args.heads * head)
        norm(b + "ffn_norm.weight")
        matrix(b + "ffn_gate.weight", args.ffn, args.hidden)
        matrix(b + "ffn_up.weight", args.ffn, args.hidden)
        matrix(b + "ffn_down.weight", args.hidden, args.ffn)
    norm("output_norm.weight")

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
