#!/usr/bin/env python3
"""all-MiniLM-L6-v2 with fp16 weights, for the GPU machine: the fp32 file (91 MB) is larger than a
device call carries, and the fp16 and bf16 backends round the weights to their dtype anyway.

    scripts/make_minilm_f16.py DEST     (the model from scripts/fetch_default_model.sh)
"""
import os
import shutil
import subprocess
import sys

from safetensors.numpy import load_file, save_file

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
dst = sys.argv[1]
src = subprocess.check_output([os.path.join(root, "scripts/fetch_default_model.sh")]).decode().strip()
os.makedirs(os.path.join(dst, "1_Pooling"), exist_ok=True)
weights = load_file(os.path.join(src, "model.safetensors"))
save_file({k: v.astype("float16") for k, v in weights.items()}, os.path.join(dst, "model.safetensors"))
for f in ["config.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json",
          "tokenizer.json", "tokenizer_config.json", "vocab.txt"]:
    if os.path.exists(os.path.join(src, f)):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
