#!/usr/bin/env python3
"""A random BertForMaskedLM checkpoint (seeded; dropout off) for the GPU training tests:
    python3 scripts/make_random_bert.py DIR --hidden 256 --heads 4 --layers 2 [--ffn 4H]
        [--vocab 30522] [--positions 512] [--seed 0]
Writes config.json and model.safetensors (float32) with transformers' save_pretrained."""
import argparse
import os

import torch
from transformers import BertConfig, BertForMaskedLM

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--hidden", type=int, default=256)
ap.add_argument("--heads", type=int, default=4)
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--ffn", type=int, default=0)
ap.add_argument("--vocab", type=int, default=30522)
ap.add_argument("--positions", type=int, default=512)
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()
if not os.path.exists(os.path.join(a.dir, "config.json")):
    torch.manual_seed(a.seed)
    cfg = BertConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                     num_attention_heads=a.heads, intermediate_size=a.ffn or 4 * a.hidden,
                     max_position_embeddings=a.positions, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    BertForMaskedLM(cfg).save_pretrained(a.dir, safe_serialization=True)
print(a.dir)
