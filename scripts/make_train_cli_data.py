#!/usr/bin/env python3
"""The data of tests/cli_train.sh: tests/data/train/vocab.txt (the 64 ids the tiny BERTs of
tests/data/train know: [PAD] [UNK] [CLS] [SEP] [MASK] and the words aa .. cg, as the C tests
write it) and a two-label task that a few steps can learn: label 0 sentences are 3-6 words of
aa .. az, label 1 of ba .. bz, each with one word of ca .. cg shared by both; cls_train.jsonl
(64 lines) and cls_eval.jsonl (32 lines). Deterministic (random.Random(24))."""
import json
import pathlib
import random

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "train"
WORDS = [chr(97 + k // 26) + chr(97 + k % 26) for k in range(59)]


def main():
    with open(OUT / "vocab.txt", "w") as f:
        f.write("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
        for w in WORDS:
            f.write(w + "\n")
    rng = random.Random(24)

    def example(label):
        pool = WORDS[:26] if label == 0 else WORDS[26:52]
        ws = [rng.choice(pool) for _ in range(rng.randint(3, 6))] + [rng.choice(WORDS[52:])]
        rng.shuffle(ws)
        return " ".join(ws)

    for name, n in (("cls_train.jsonl", 64), ("cls_eval.jsonl", 32)):
        with open(OUT / name, "w") as f:
            for _ in range(n):
                label = rng.randint(0, 1)
                f.write(json.dumps({"text": example(label), "label": label}) + "\n")


if __name__ == "__main__":
    main()
