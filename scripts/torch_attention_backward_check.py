#!/usr/bin/env python3
"""nopad's CUDA attention forward + backward against torch autograd on padded SDPA.

tests/test_cuda_attention_backward, run with NOPAD_ATTN_BWD_DUMP=DIR, writes a few cases of its
"chain" (GPU attention_lse, then GPU attention_backward on its out and lse) as DIR/case_NN.json
(dtype, head_size, heads, causal, scale, cu_seqlens) and DIR/case_NN_<name>.f32 (little-endian
float32): the inputs qkv [T, 3, heads, D] and dout [T, heads*D], already rounded to the dtype, and
nopad's out [T, heads*D], lse [T, heads] and dqkv [T, 3, heads, D].

For each case this script unpacks the packed stream into a padded [B, heads, S, D] batch,
runs torch.nn.functional.scaled_dot_product_attention in float32 (math backend, TF32 off) with a
key-padding mask (and the causal triangle), backpropagates the padded dout (zeros on padding
rows, so padding adds nothing to any gradient), and compares on the real tokens only:
  out, dq, dk, dv: max over (token, head) rows of ||nopad - torch|| / max(||torch||, floor),
                   floor = 5% of the tensor's RMS row norm (rows whose exact gradient is ~0, such
                   as dq of a length-1 sequence);
  lse:             max |nopad - torch|, bound 2e-5 (torch's logsumexp of the masked scores).
Bound of out, dq, dk, dv: fp16 2e-3, bf16 2e-2 (the C test's, which says why), or twice the error
of torch's own SDPA forward + backward in the case's dtype on the same inputs against the same
float32 reference, whichever is larger. The second term is there because the backward computes
D = rowsum(dout ⊙ out) from `out` as stored in the dtype (as FlashAttention and torch's fused
kernels do): the output's rounding (2^-11 / 2^-8) enters dS = P ⊙ (dP - D) and reaches dq and dk
rows whose own norm is small (early causal queries) as errors of ~1e-2 row-relative in fp16; the
float32 reference has no such rounding. FlashAttention's tests use the same 2x rule.
Prints one line per case; exits 1 if a case is over a bound or no case is found.

Usage: torch_attention_backward_check.py DIR [--device cuda|cpu]
"""
import argparse
import glob
import json
import math
import os
import sys

import torch

BOUNDS = {"f16": 2e-3, "bf16": 2e-2}
LSE_BOUND = 2e-5


def read_f32(path, shape):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    n = math.prod(shape)
    if len(data) != 4 * n:
        raise ValueError(f"{path}: {len(data)} bytes, expected {4 * n} for shape {shape}")
    return torch.frombuffer(data, dtype=torch.float32).reshape(shape).clone()


def row_rel_error(got, want):
    """got, want [rows, D]: max row ||got - want|| / max(||want||, 5% of the RMS row norm)."""
    got, want = got.double(), want.double()
    norms = want.norm(dim=1)
    floor = 0.05 * norms.pow(2).mean().sqrt() + 1e-30
    err = (got - want).norm(dim=1) / torch.clamp(norms, min=floor)
    return err.max().item()


def pad(x, cu, S):
    """packed [T, ...] -> padded [B, S, ...] (zeros past each sequence's end)."""
    B = len(cu) - 1
    out = x.new_zeros((B, S) + tuple(x.shape[1:]))
    for b in range(B):
        out[b, : cu[b + 1] - cu[b]] = x[cu[b] : cu[b + 1]]
    return out


def unpad(x, cu):
    """padded [B, S, ...] -> packed [T, ...]"""
    return torch.cat([x[b, : cu[b + 1] - cu[b]] for b in range(len(cu) - 1)], dim=0)


def check_case(meta_path, device):
    with open(meta_path) as f:
        meta = json.load(f)
    stem = meta_path[: -len(".json")]
    cu = meta["cu_seqlens"]
    T, H, D = cu[-1], meta["heads"], meta["head_size"]
    causal, scale = bool(meta["causal"]), float(meta["scale"])
    B, S = len(cu) - 1, max(cu[b + 1] - cu[b] for b in range(len(cu) - 1))
    qkv = read_f32(stem + "_qkv.f32", (T, 3, H, D))
    dout = read_f32(stem + "_dout.f32", (T, H, D))
    got_out = read_f32(stem + "_out.f32", (T, H, D))
    got_lse = read_f32(stem + "_lse.f32", (T, H))
    got_dqkv = read_f32(stem + "_dqkv.f32", (T, 3, H, D))

    # padded [B, H, S, D] leaves
    q, k, v = (pad(qkv[:, i], cu, S).to(device).transpose(1, 2).contiguous().requires_grad_(True) for i in range(3))
    do = pad(dout, cu, S).to(device).transpose(1, 2)
    lengths = torch.tensor([cu[b + 1] - cu[b] for b in range(B)], device=device)
    pos = torch.arange(S, device=device)
    mask = (pos[None, None, :] < lengths[:, None, None]).expand(B, S, S)  # [B, S queries, S keys]
    if causal:
        mask = mask & (pos[None, :, None] >= pos[None, None, :])
    mask = mask[:, None]  # [B, 1, S, S]; a padding query row still sees key 0, so no row is empty

    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    out.backward(do)
    scores = (q.detach() @ k.detach().transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), dim=-1)  # [B, H, S]
    want_out = unpad(out.detach().transpose(1, 2), cu).cpu()  # [T, H, D]
    want_lse = unpad(lse.transpose(1, 2), cu).cpu()  # [T, H]
    want = [unpad(t.grad.transpose(1, 2), cu).cpu() for t in (q, k, v)]

    # torch's own SDPA in the dtype (its fused kernel where it takes the mask), same inputs
    lp = {"f16": torch.float16, "bf16": torch.bfloat16}[meta["dtype"]]
    ql, kl, vl = (t.detach().to(lp).requires_grad_(True) for t in (q, k, v))
    out_lp = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl, attn_mask=mask, scale=scale)
    out_lp.backward(do.to(lp))
    lp_out = unpad(out_lp.detach().float().transpose(1, 2), cu).cpu()
    lp_grads = [unpad(t.grad.float().transpose(1, 2), cu).cpu() for t in (ql, kl, vl)]

    errs = {"out": row_rel_error(got_out.reshape(-1, D), want_out.reshape(-1, D))}
    torch_errs = {"out": row_rel_error(lp_out.reshape(-1, D), want_out.reshape(-1, D))}
    for i, name in enumerate(("dq", "dk", "dv")):
        errs[name] = row_rel_error(got_dqkv[:, i].reshape(-1, D), want[i].reshape(-1, D))
        torch_errs[name] = row_rel_error(lp_grads[i].reshape(-1, D), want[i].reshape(-1, D))
    lse_err = (got_lse.double() - want_lse.double()).abs().max().item()
    bounds = {n: max(BOUNDS[meta["dtype"]], 2 * torch_errs[n]) for n in errs}
    over = [n for n in errs if not errs[n] <= bounds[n]] + (["lse"] if not lse_err <= LSE_BOUND else [])
    print(
        f"{os.path.basename(stem)} {meta['dtype']:4s} d={D:3d} heads={H} B={B} T={T} max={S} causal={int(causal)}: "
        + "  ".join(f"{n} {e:.2e} (torch {torch_errs[n]:.2e})" for n, e in errs.items())
        + f"  lse {lse_err:.2e}  "
        + ("ok" if not over else "FAIL: " + ", ".join(
            f"{n} over {bounds[n]:.1e}" if n != "lse" else f"lse over {LSE_BOUND:.0e}" for n in over))
    )
    return not over


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="the NOPAD_ATTN_BWD_DUMP folder of tests/test_cuda_attention_backward")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cases = sorted(glob.glob(os.path.join(args.dir, "case_*.json")))
    if not cases:
        print(f"no case_*.json in {args.dir}")
        return 1
    print(f"torch {torch.__version__} on {args.device}, float32 reference, {len(cases)} cases")
    failed = [c for c in cases if not check_case(c, args.device)]
    print(f"{len(cases) - len(failed)}/{len(cases)} cases within bounds")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
