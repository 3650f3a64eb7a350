#!/usr/bin/env python3
"""A checkpoint `nopad train` saved, read back by Hugging Face transformers (issue 24: "the saved
weights + config.json load in HF transformers (BertForMaskedLM, BertForSequenceClassification)
and in nopad for inference"). For each task it trains the given BERT folder for a few steps with
`nopad train` (CPU), loads the output with `from_pretrained` (no missing or unexpected key
allowed), and compares on held-out texts, float32, HF in eval mode:
  classify: HF's logits against `nopad classify`'s, within 1e-4 of the largest |logit|;
  mlm:      HF's BertModel last hidden states against nopad's (`Encoder.encode`, no pooling),
            within 1e-4 row-relative.
The bounds are float32 rounding through 6 layers computed in different orders (observed ~1e-6).

    python3 scripts/check_hf_roundtrip.py --nopad build/nopad --library build/libnopad.so \
        --model ~/.cache/nopad/all-MiniLM-L6-v2 --data tests/data/train/reviews_train.jsonl \
        --eval tests/data/train/reviews_test.jsonl
Exits 1 when a bound is missed."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoTokenizer, BertForMaskedLM, BertForSequenceClassification

ap = argparse.ArgumentParser()
ap.add_argument("--nopad", default="build/nopad")
ap.add_argument("--library", default="build/libnopad.so")
ap.add_argument("--model", required=True)
ap.add_argument("--data", required=True)
ap.add_argument("--eval", required=True)
a = ap.parse_args()
os.environ["NOPAD_LIBRARY"] = os.path.abspath(a.library)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import nopad  # noqa: E402

texts = [json.loads(l)["text"] for l in open(a.eval) if l.strip()]
tmp = tempfile.mkdtemp()
ok = True


def train(task, out, extra):
    cmd = [a.nopad, "train", "--model", a.model, "--task", task, "--data", a.data, "--output", out,
           "--epochs", "1", "--quiet"] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def load(cls, folder):
    model, info = cls.from_pretrained(folder, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    return model.eval(), bad


# classification
cls_dir = os.path.join(tmp, "cls")
train("classify", cls_dir, ["--num-labels", "2"])
model, bad = load(BertForSequenceClassification, cls_dir)
tok = AutoTokenizer.from_pretrained(cls_dir)
with torch.no_grad():
    enc = tok(texts, padding=True, return_tensors="pt")
    hf = model(**enc).logits.numpy()
p = subprocess.run([a.nopad, "classify", "--model", cls_dir], input="\n".join(texts) + "\n",
                   capture_output=True, text=True, check=True)
ours = np.array([json.loads(l)["logits"] for l in p.stdout.splitlines()])
err = np.abs(ours - hf).max() / np.abs(hf).max()
print(f"classify: {len(texts)} texts, HF keys {bad or 'all matched'}, max |logit - HF| / max |logit| = {err:.2e} (bound 1e-4)")
ok &= err <= 1e-4 and not bad

# masked LM
mlm_dir = os.path.join(tmp, "mlm")
train("mlm", mlm_dir, [])
model, bad = load(BertForMaskedLM, mlm_dir)
tok = AutoTokenizer.from_pretrained(mlm_dir)
enc_model = nopad.Encoder(mlm_dir)
worst = 0.0
with torch.no_grad():
    for t in texts:
        ids = tok(t, return_tensors="pt")
        hf = model.bert(**ids).last_hidden_state[0].numpy()
        ours = np.asarray(enc_model.encode(t, pooling="none", normalize=False))
        rel = np.linalg.norm(ours - hf, axis=1) / np.linalg.norm(hf, axis=1)
        worst = max(worst, float(rel.max()))
print(f"mlm: {len(texts)} texts, HF keys {bad or 'all matched'}, hidden states max row-relative error {worst:.2e} (bound 1e-4)")
ok &= worst <= 1e-4 and not bad
sys.exit(0 if ok else 1)
