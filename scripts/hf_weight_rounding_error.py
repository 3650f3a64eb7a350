"""How much of a half-precision decoder's logit error is its weights' own rounding: HF's fp32 forward
of each decoder fixture (and of SmolLM2 from its GGUF) with its weights rounded to fp16 or bf16 and
everything else in fp32, against the plain fp32 forward, on the inputs test_cuda_decoder uses (the
fixtures' golden prompts; SmolLM2 on the four texts of scripts/hf_decoder_half_error.py), measured
as the test measures nopad: the largest row-relative error of the logits over every position.
An engine that holds the weights in the compute dtype cannot be closer to the fp32 model than
this. Runs on the CPU (torch, transformers; accelerate for the GGUF):
    python3 scripts/hf_weight_rounding_error.py tests/data [--gguf SmolLM2.gguf]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_decoder_half_error import cases  # noqa: E402


def logits(model, prompts):
    with torch.no_grad():
        return torch.cat([model(torch.tensor([p])).logits[0].double() for p in prompts])


def max_row_rel_error(got, want):
    return ((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)).max().item()


def measure(label, model, prompts):
    want = logits(model, prompts)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    row = {"model": label}
    for name, dtype in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        model.load_state_dict({k: v.to(dtype).float() for k, v in saved.items()})
        row[name] = max_row_rel_error(logits(model, prompts), want)
    model.load_state_dict(saved)
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--gguf")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    rows = [measure(label, model, prompts) for label, model, prompts in cases(args.data, args.gguf)]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
