"""How far PyTorch's own bf16 and fp16 forwards of a model lie from its fp32 forward, on the input
test_cuda_encoder's max-length MiniLM check uses (256 random ids from 1000..20999, the test's
xorshift generator, seed 5), measured as the test measures nopad (largest row-relative error of
the hidden states). It tells what error a half-precision engine shows on that input, so the
test's bound can be judged against it. Runs on the GPU machine:
    python3 scripts/torch_bf16_error.py MODEL_DIR
"""
import sys

import torch
from transformers import AutoModel


def xorshift_ids(n, seed=5):
    x, out = seed, []
    for _ in range(n):
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        out.append(1000 + ((x >> 32) % 20000))
    return out


def max_row_rel_error(got, want):
    return ((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)).max().item()


def main():
    model_dir = sys.argv[1]
    ids = torch.tensor([xorshift_ids(256)], device="cuda")
    ref_model = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        ref = ref_model(input_ids=ids).last_hidden_state[0].double()
        for dtype in (torch.float16, torch.bfloat16):
            m = AutoModel.from_pretrained(model_dir, torch_dtype=dtype).cuda().eval()
            got = m(input_ids=ids).last_hidden_state[0].double()
            print(f"torch {str(dtype).split('.')[-1]:9s} vs torch fp32, 256 random ids: "
                  f"max row rel err {max_row_rel_error(got, ref):.3e}")


if __name__ == "__main__":
    main()
