#!/usr/bin/env python3
"""Per-kernel GPU time of one decode step of the DEC benchmark's LLaMA-1B-shaped model, for the
note that explains the distance to the floor (or of the SmolLM2-135M shape: --shape smollm2). Run under Nsight Compute, which times only the
kernels inside the NVTX range "decode_step" (the last of a few steps, replayed from its graph):

    ncu --clock-control none --nvtx --nvtx-include "decode_step/" --metrics gpu__time_duration.sum \
        --csv python3 bench/decode_profile.py --library build-cuda/libnopad.so --batch 1 --context 512
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_bench as db  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--library", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--shape", default="1b", choices=sorted(db.SHAPES))
    args = ap.parse_args()
    shape = db.SHAPES[args.shape]
    folder = "/tmp/nopad_dec_" + args.shape
    if not os.path.exists(os.path.join(folder, "config.json")):
        db.make_checkpoint(shape, folder)
    lib = db.load_lib(args.library)
    m = db.Model(lib, folder, "cuda", args.dtype, 2048, args.batch * (args.context + 64))
    rng = np.random.default_rng(1)
    V = shape["vocab_size"]
    seqs = m.sequences(args.batch)
    m.feed(seqs, args.context, V, rng)
    cu = np.arange(args.batch + 1, dtype=np.int32)
    ids = np.empty(args.batch, np.int32)
    for i in range(6):
        toks = rng.integers(0, V, args.batch, dtype=np.int32)
        if i == 5:
            torch.cuda.nvtx.range_push("decode_step")
        m.step_sample(seqs, cu, toks, ids)
        if i == 5:
            torch.cuda.nvtx.range_pop()
    m.free_sequences(seqs)
    m.close()


if __name__ == "__main__":
    main()
