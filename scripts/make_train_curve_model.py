#!/usr/bin/env python3
"""The inputs of the MLM training-curve check (issue 24; docs/training.md, "The training curve"):

  OUT/corpus.txt   the texts of 13 licences that Debian's base-files package ships under
                   /usr/share/common-licenses (an essential package: on every Debian system),
                   concatenated in a fixed order; nopad takes one example a line, blank lines
                   skipped (3,384 examples)
  OUT/model/       a small BERT (hidden 128, 4 layers, 4 heads, FFN 512, 128 positions) with
                   all-MiniLM-L6-v2's WordPiece vocabulary (30,522 ids) and tokenizer files, as
                   BertForMaskedLM weights initialised as transformers' _init_weights does
                   (Linear and Embedding weights normal(0, 0.02), the padding row of the word
                   table 0, biases 0, LayerNorm weights 1), dropout 0, from numpy's PCG64 with a
                   fixed seed: the same file everywhere, made with numpy alone (no torch in CI)

Prints the SHA-256 of the corpus and of model.safetensors (recorded beside the HF curve, so a
machine with other licence files or another numpy stream is told, not compared).

usage: scripts/make_train_curve_model.py MINILM_DIR OUT
"""
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

LICENSES = ["GPL-3", "GPL-2", "GPL-1", "LGPL-3", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "MPL-1.1",
            "GFDL-1.3", "GFDL-1.2", "Artistic", "BSD", "CC0-1.0"]
SEED = 20261126
HIDDEN, LAYERS, HEADS, FFN, POSITIONS, TYPES = 128, 4, 4, 512, 128, 2
INIT_RANGE = 0.02
TOKENIZER_FILES = ["vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_corpus(out: Path) -> Path:
    path = out / "corpus.txt"
    with open(path, "wb") as f:
        for name in LICENSES:
            f.write(Path("/usr/share/common-licenses", name).read_bytes())
    return path


def make_weights(vocab: int) -> dict:
    rng = np.random.default_rng(SEED)
    w = {}

    def normal(name, rows, cols):
        w[name] = (rng.standard_normal((rows, cols)) * INIT_RANGE).astype(np.float32)

    def zeros(name, n):
        w[name] = np.zeros(n, np.float32)

    def layernorm(prefix):
        w[prefix + ".weight"] = np.ones(HIDDEN, np.float32)
        zeros(prefix + ".bias", HIDDEN)

    def linear(prefix, rows, cols):
        normal(prefix + ".weight", rows, cols)
        zeros(prefix + ".bias", rows)

    normal("bert.embeddings.word_embeddings.weight", vocab, HIDDEN)
    w["bert.embeddings.word_embeddings.weight"][0] = 0  # padding_idx = pad_token_id = 0
    normal("bert.embeddings.position_embeddings.weight", POSITIONS, HIDDEN)
    normal("bert.embeddings.token_type_embeddings.weight", TYPES, HIDDEN)
    layernorm("bert.embeddings.LayerNorm")
    for l in range(LAYERS):
        p = f"bert.encoder.layer.{l}."
        for part in ("query", "key", "value"):
            linear(p + "attention.self." + part, HIDDEN, HIDDEN)
        linear(p + "attention.output.dense", HIDDEN, HIDDEN)
        layernorm(p + "attention.output.LayerNorm")
        linear(p + "intermediate.dense", FFN, HIDDEN)
        linear(p + "output.dense", HIDDEN, FFN)
        layernorm(p + "output.LayerNorm")
    linear("cls.predictions.transform.dense", HIDDEN, HIDDEN)
    layernorm("cls.predictions.transform.LayerNorm")
    zeros("cls.predictions.bias", vocab)
    return w


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    minilm, out = Path(sys.argv[1]), Path(sys.argv[2])
    model = out / "model"
    model.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(out)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, model / name)
    vocab = sum(1 for _ in open(minilm / "vocab.txt", encoding="utf-8"))
    config = {
        "architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": vocab,
        "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "intermediate_size": FFN, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0, "max_position_embeddings": POSITIONS,
        "type_vocab_size": TYPES, "initializer_range": INIT_RANGE, "layer_norm_eps": 1e-12,
        "pad_token_id": 0, "position_embedding_type": "absolute", "tie_word_embeddings": True,
    }
    (model / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(make_weights(vocab), str(model / "model.safetensors"), metadata={"format": "pt"})
    print(json.dumps({"corpus_sha256": sha256(corpus),
                      "model_sha256": sha256(model / "model.safetensors")}))


if __name__ == "__main__":
    main()
