#!/usr/bin/env python3
"""Seed corpus of fuzz/fuzz_gguf.c: small GGUF files written with the `gguf` package (llama.cpp's
gguf-py), some valid, some broken in one place each.

    pip install gguf numpy
    python3 scripts/make_gguf_seeds.py          # writes fuzz/corpus/gguf/*.gguf
    python3 scripts/make_gguf_seeds.py --decoder-config   # only the decoder-config seeds
"""
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus", "gguf")


def build(path, big_endian=False, alignment=None, tensors=True):
    import gguf
    import numpy as np
    endian = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(path, "llama", endianess=endian)
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_name("seed")
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 700)
    w.add_int16("t.i16", -700)
    w.add_uint32("t.u32", 70000)
    w.add_int32("t.i32", -70000)
    w.add_float32("t.f32", 0.5)
    w.add_bool("t.bool", True)
    w.add_uint64("t.u64", 1 << 40)
    w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 0.25)
    w.add_array("t.nested", [["a", "bc"], [1, 2, 3]])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<s>", "a", "b", "ab", "\u0120a"])
    w.add_token_types([3, 1, 1, 1, 1])
    w.add_token_scores([0.0, -1.0, -2.0, -3.0, -4.0])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(0)
    if tensors:
        w.add_tensor("w.f32", np.arange(6, dtype=np.float32).reshape(2, 3))
        w.add_tensor("w.f16", np.ones(5, dtype=np.float16))
        w.add_tensor("w.q80", np.zeros(34, dtype=np.uint8),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor("w.q4k", np.zeros(144, dtype=np.uint8),
                     raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        w.add_tensor("w.q5k", np.zeros(176, dtype=np.uint8),
                     raw_dtype=gguf.GGMLQuantizationType.Q5_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "rb") as f:
        return f.read()


def build_llama_tokenizer(path):
    """SentencePiece-style metadata: byte tokens, scores, no merges (they are derived)."""
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    pieces = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    pieces += ["\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "<user>"]
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * 6 + [4])
    w.add_token_scores([0.0] * 259 + [-1.0, -2.0, -2.0, -3.0, -4.0, -5.0, 0.0])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_eos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "rb") as f:
        return f.read()


def decoder_config_seeds():
    """Metadata-only llama decoders for gguf_model_config, written byte by byte (no `gguf`
    package): a valid one, and head sizes 3 and 1, an infinite epsilon, a NaN RoPE base."""
    def s(text):
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    def meta(embd, heads, eps, base):
        kvs = [s("general.architecture") + struct.pack("<I", 8) + s("llama")]
        for key, v in [("context_length", 64), ("embedding_length", embd), ("block_count", 1),
                       ("feed_forward_length", 16), ("attention.head_count", heads)]:
            kvs.append(s("llama." + key) + struct.pack("<II", 4, v))
        for key, v in [("attention.layer_norm_rms_epsilon", eps), ("rope.freq_base", base)]:
            kvs.append(s("llama." + key) + struct.pack("<If", 6, v))
        kvs.append(s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + s("a") + s("b"))
        return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)

    return {"decoder_config": meta(32, 4, 1e-5, 10000.0),
            "decoder_head_size_3": meta(12, 4, 1e-5, 10000.0),
            "decoder_head_size_1": meta(4, 4, 1e-5, 10000.0),
            "decoder_eps_inf": meta(32, 4, float("inf"), 10000.0),
            "decoder_base_nan": meta(32, 4, 1e-5, float("nan"))}


def write(seeds):
    for name, data in seeds.items():
        with open(os.path.join(OUT, name + ".gguf"), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds)} seeds to {os.path.normpath(OUT)}")


def main():
    os.makedirs(OUT, exist_ok=True)
    if sys.argv[1:] == ["--decoder-config"]:  # only these: no `gguf` package needed
        write(decoder_config_seeds())
        return
    tmp = os.path.join(OUT, "tmp.gguf")
    seeds = decoder_config_seeds()
    v3 = build(tmp)
    seeds["valid_v3"] = v3
    seeds["valid_v2"] = v3[:4] + struct.pack("<I", 2) + v3[8:]
    seeds["valid_align64"] = build(tmp, alignment=64)
    seeds["valid_no_tensors"] = build(tmp, tensors=False)
    seeds["big_endian"] = build(tmp, big_endian=True)
    seeds["tokenizer_llama"] = build_llama_tokenizer(tmp)
    os.remove(tmp)
    seeds["v1"] = b"GGUF" + struct.pack("<III", 1, 0, 0)
    seeds["truncated_half"] = v3[: len(v3) // 2]
    seeds["truncated_data"] = v3[:-7]
    seeds["huge_kv_count"] = b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 60)
    key = struct.pack("<Q", 1) + b"t"
    seeds["huge_string_array"] = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + key
                                  + struct.pack("<IIQ", 9, 8, 1 << 60) + struct.pack("<Q", 1) + b"a")
    write(seeds)


if __name__ == "__main__":
    main()
