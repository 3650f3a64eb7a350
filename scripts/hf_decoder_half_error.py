"""How far Hugging Face's own fp16 and bf16 forwards of a decoder lie from its fp32 forward, on the
inputs test_cuda_decoder uses (each fixture's golden prompts; for SmolLM2 the four texts of
test_smollm2), measured as the test measures nopad: the largest row-relative error of the logits
over every position, and the top-1 agreement. It tells what error any half-precision engine shows
on those inputs, so nopad's numbers (and the issue's targets) can be judged against it. Runs on the
GPU machine:
    python3 scripts/hf_decoder_half_error.py tests/data [--gguf SmolLM2.gguf]
"""
import argparse
import json
import os

import torch
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

FIXTURES = ["gpt2_dec", "llama_gqa", "llama_mqa", "llama_linear", "qwen2_bias"]
TEXTS = [
    "The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the "
    "clocks were striking thirteen.",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\nWaves "
    "fold into foam,\nsalt wind carries gull voices,\nthe tide keeps its time.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n",
    "Paris is the capital and most populous city of France. With an estimated population of "
    "more than two million residents, it is the centre of the Ile-de-France region.",
]


def logits_of(model, prompts, dtype):
    m = model.to(dtype)  # model.to, not .float(): transformers refuses .float() on a GGUF model
    out = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids], device="cuda")
            out.append(m(x).logits[0].float())
    return torch.cat(out)


def measure(label, model, prompts):
    want = logits_of(model, prompts, torch.float32)
    row = {"model": label, "rows": int(want.shape[0])}
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        got = logits_of(model, prompts, dt)
        err = ((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)).max().item()
        top1 = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
        row[name] = {"max_row_rel_err": err, "top1": top1}
    print(json.dumps(row), flush=True)
    return row


def cases(data, gguf=None):
    """(label, fp32 model on the CPU, prompts) of every input test_cuda_decoder uses: each fixture
    under data/models with its golden prompts, then SmolLM2 from gguf (when given) on TEXTS."""
    for name in FIXTURES:
        folder = os.path.join(data, "models", name)
        g = load_file(os.path.join(folder, "golden.safetensors"))
        ids, cu = g["input_ids"].tolist(), g["cu_seqlens"].tolist()
        prompts = [ids[cu[i]:cu[i + 1]] for i in range(len(cu) - 1)]
        yield name, AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval(), prompts
    if gguf:
        folder, file = os.path.split(os.path.abspath(gguf))
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, torch_dtype=torch.float32).eval()
        yield ("SmolLM2-135M Q4_1 on text", model,
               [tok(t, add_special_tokens=True)["input_ids"] for t in TEXTS])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--gguf")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = [measure(label, model.cuda(), prompts) for label, model, prompts in cases(args.data, args.gguf)]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
