#!/usr/bin/env python3
"""The small labelled set of the README's fine-tuning example: templated reviews, label 1 for a
positive adjective and 0 for a negative one, 160 training lines and 60 held-out ones (disjoint
sentences), JSONL {"text", "label"}. Deterministic:
    python3 scripts/make_review_data.py tests/data/train/reviews"""
import json
import random
import sys

GOOD = ["superb", "wonderful", "excellent", "delightful", "brilliant", "great", "lovely", "fantastic"]
BAD = ["poor", "terrible", "awful", "dreadful", "boring", "bad", "disappointing", "weak"]
THINGS = ["book", "game", "film", "album", "meal", "hotel", "show", "phone", "course", "play"]
TEMPLATES = ["What a {a} {t}!", "Honestly, a {a} {t}.", "This {t} was {a}.", "A {a} {t}, all in all.",
             "I found the {t} {a}.", "Such a {a} {t}."]

rng = random.Random(20261126)
rows = [(tpl.format(a=a, t=t), label) for label, adjs in ((1, GOOD), (0, BAD))
        for a in adjs for t in THINGS for tpl in TEMPLATES]
rng.shuffle(rows)
prefix = sys.argv[1]
for name, part in (("train", rows[:160]), ("test", rows[160:220])):
    with open(f"{prefix}_{name}.jsonl", "w") as fh:
        for text, label in part:
            fh.write(json.dumps({"text": text, "label": label}) + "\n")
