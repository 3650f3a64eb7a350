#!/usr/bin/env python3
"""Writes the fixtures of tests/test_gguf_dequant.c: a small GGUF file holding tensors of every
type nopad converts to float32, and what the `gguf` package's dequantize() (gguf/quants.py, a
numpy port of ggml's dequantize_row_*) makes of each.

    pip install gguf safetensors numpy
    python3 scripts/make_gguf_dequant_fixtures.py

Writes into tests/data/gguf/:
    dequant.gguf                   written with gguf.GGUFWriter (architecture "llama"):
        w.f32        F32  [64, 3]   normal floats and ±0, ±inf, NaN, a float32 subnormal
        w.f16        F16  [64, 4]   normal floats through float16
        w.f16_special F16 [64, 1]   ±0, ±inf, quiet NaNs (one with a payload), fp16 subnormals
                                    (smallest, largest), the largest and smallest normals
        w.bf16       BF16 [64, 3]   gguf.quants.quantize(BF16)
        w.q8_0       Q8_0 [128, 4]  gguf.quants.quantize of normal floats
        w.q4_0       Q4_0 [128, 4]  the same
        w.q4_1       Q4_1 [96, 5]   the same
        w.q8_0_3d    Q8_0 [32, 2, 3] a 3-D tensor (6 rows of 32)
        r.q8_0       Q8_0 [64, 3]   random block bytes: any int8, any finite fp16 scale
        r.q4_0       Q4_0 [64, 3]   random nibbles, any finite fp16 d
        r.q4_1       Q4_1 [64, 3]   random nibbles, any finite fp16 d and m
        r.q4_k       Q4_K [512, 3]  random bytes (the package cannot quantize Q4_K): scales and
                                    mins of 6 bits, nibbles, finite fp16 d and dmin
        r.q6_k       Q6_K [512, 3]  random bytes: ql, qh, int8 scales, finite fp16 d
        bad.q5_k     Q5_K [256, 2]  random bytes: a type nopad does not convert
        bad.iq4_xs   IQ4_XS [256, 1] the same
    dequant_expected.safetensors  float32 per tensor but bad.*, shape = the GGUF dims reversed
                                  ([rows, dims[0]], numpy order), from gguf.quants.dequantize of
                                  the bytes read back from dequant.gguf with gguf.GGUFReader

"Any finite fp16" covers subnormal and the largest scales, so the float32 products are checked
over the whole range, not only at the magnitudes real weights have. The seed is fixed; a re-run
with the same numpy and gguf versions writes the same bytes.
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize, dequantize
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "gguf")

rng = np.random.default_rng(20240521)


def finite_f16(n):
    """n random fp16 bit patterns, every finite value equally likely by pattern (exponent < 31)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    bits = np.where((bits >> 10) & 0x1F == 0x1F, bits & ~np.uint32(0x4000), bits)  # exp 31 -> 15
    return bits.astype(np.uint16)


def random_blocks(qtype, rows, cols, f16_at):
    """Random bytes of rows × cols values of `qtype`; the fp16 fields at byte offsets `f16_at`
    of each block get finite values (a NaN or inf scale would only test the NaN rules again)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in f16_at:
        raw[:, off:off + 2] = finite_f16(nb).view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, cols // block * size)


def main():
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "dequant.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("nopad dequant fixtures")

    f32 = rng.standard_normal((3, 64)).astype(np.float32)
    f32[0, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40]
    w.add_tensor("w.f32", f32)

    w.add_tensor("w.f16", quantize(rng.standard_normal((4, 64)).astype(np.float32), T.F16))
    special = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7E01, 0x0001, 0x8001,
                        0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0x3555], dtype=np.uint16)
    specials = np.concatenate([special, rng.integers(0, 1 << 16, 48, dtype=np.uint16)])
    specials = np.where(((specials >> 10) & 0x1F == 0x1F) & (specials & 0x3FF != 0)
                        & (specials & 0x200 == 0), specials | 0x200, specials)  # NaNs quiet
    w.add_tensor("w.f16_special", specials.astype(np.uint16).view(np.float16).reshape(1, 64))

    bf16 = rng.standard_normal((3, 64)).astype(np.float32)
    bf16[0, :5] = [0.0, -0.0, np.inf, -np.inf, np.nan]
    w.add_tensor("w.bf16", quantize(bf16, T.BF16), raw_dtype=T.BF16)

    for name, qtype, shape in [("w.q8_0", T.Q8_0, (4, 128)), ("w.q4_0", T.Q4_0, (4, 128)),
                               ("w.q4_1", T.Q4_1, (5, 96)), ("w.q8_0_3d", T.Q8_0, (3, 2, 32))]:
        x = rng.standard_normal(shape).astype(np.float32)
        w.add_tensor(name, quantize(x, qtype), raw_dtype=qtype)

    w.add_tensor("r.q8_0", random_blocks(T.Q8_0, 3, 64, [0]), raw_dtype=T.Q8_0)
    w.add_tensor("r.q4_0", random_blocks(T.Q4_0, 3, 64, [0]), raw_dtype=T.Q4_0)
    w.add_tensor("r.q4_1", random_blocks(T.Q4_1, 3, 64, [0, 2]), raw_dtype=T.Q4_1)
    w.add_tensor("r.q4_k", random_blocks(T.Q4_K, 3, 512, [0, 2]), raw_dtype=T.Q4_K)
    w.add_tensor("r.q6_k", random_blocks(T.Q6_K, 3, 512, [208]), raw_dtype=T.Q6_K)
    w.add_tensor("bad.q5_k", random_blocks(T.Q5_K, 2, 256, [0, 2]), raw_dtype=T.Q5_K)
    w.add_tensor("bad.iq4_xs", random_blocks(T.IQ4_XS, 1, 256, [0]), raw_dtype=T.IQ4_XS)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # The expected values from the bytes as they lie in the file.
    expected = {}
    for t in gguf.GGUFReader(path).tensors:
        if t.name.startswith("bad."):
            continue
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        values = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32, copy=False)
        expected[t.name] = np.ascontiguousarray(values.reshape(shape))
    save_file(expected, os.path.join(OUT, "dequant_expected.safetensors"))

    size = os.path.getsize(path)
    assert size < 200_000, size
    print(f"wrote {path} ({size} bytes, {len(expected)} tensors with expected values)")


if __name__ == "__main__":
    sys.exit(main())
