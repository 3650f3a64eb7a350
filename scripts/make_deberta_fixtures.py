#!/usr/bin/env python3
"""Tiny random DeBERTa-v2/v3 encoders and classification / reranking heads, with HF goldens.

    python3 scripts/make_deberta_fixtures.py               # every folder (about 10 s on CPU)
    python3 scripts/make_deberta_fixtures.py --only NAME   # some folders only

Writes tests/data/models/<name>/ (config.json + model.safetensors by save_pretrained, and
golden.safetensors) for

    deberta_v3_a   DebertaV2ForSequenceClassification (2 labels), v3-style: share_att_key,
                   pos_att_type "p2c|c2p", log buckets (8) over max_relative_positions -1 (= 96),
                   norm_rel_ebd layer_norm, no absolute positions, no token types; vocabulary of
                   tests/data/tokenizer/parity/unigram_debertav3.json
    deberta_v2_b   DebertaV2ForSequenceClassification (3 labels), v2-style: separate
                   pos_key_proj / pos_query_proj, pos_att_type ["c2p", "p2c"], no buckets,
                   max_relative_positions 12 (distances clamped), absolute positions, 2 token types
    deberta_c2p    DebertaV2Model, c2p only, share_att_key, buckets 16 over 40, gelu_pytorch_tanh
    deberta_p2c    DebertaV2Model, p2c only, separate projections, buckets 32 over 256 (past the
                   longest sequence), silu
    bert_cls       BertForSequenceClassification (3 labels); vocabulary of parity/wordpiece_bert.json
    xlmr_rerank    XLMRobertaForSequenceClassification (1 label: a cross-encoder reranker);
                   vocabulary of parity/unigram_xlmr.json
    distilbert_cls DistilBertForSequenceClassification (2 labels: pre_classifier + ReLU)
    albert_cls     AlbertForSequenceClassification (3 labels: albert.pooler + tanh)

golden.safetensors (HF one sequence at a time, fp32, eager, eval; packed order):
    input_ids int32 [T], token_type_ids int32 [T] (zeros without token types), cu_seqlens int32
    [B+1], last_hidden_state float32 [T, H], class_logits float32 [B, num_labels] (classifiers only; not "logits", which
    marks a decoder's golden to the test suites)
Checks (fails loudly): the reloaded model equals the in-memory one; a right-padded batch with an
attention mask gives the same per-token outputs (atol 1e-4).

tests/data/models/deberta_buckets.safetensors: HF's make_log_bucket_position on distances
-2047 .. 2047 for each (position_buckets, max_relative_positions) of BUCKETS, as int32 [4095]
tensors named "buckets_<b>_<max>", so the float32 ceil of every backend's bucket function is
checked against torch's where the goldens' short sequences never reach.

The classifiers also get golden_text.json: texts, a query, and HF's logits for each text alone
and for (query, text) pairs (also truncated to 12 ids), tokenized by `tokenizers` from the
parity tokenizer.json (the
folders hold no tokenizer: tests/cli_classify.sh copies the parity file next to the weights, so
the 340 KB Unigram files are not duplicated).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import warnings

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "tests", "data", "models")
PARITY = os.path.join(ROOT, "tests", "data", "tokenizer", "parity")
NOISE = 0.1

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

SPECS = {
    "deberta_v3_a": dict(
        cls="DebertaV2ForSequenceClassification", seed=71, tok="unigram_debertav3",
        labels=["negative", "positive"],
        config=dict(model_type="deberta-v2", vocab_size=801, max_position_embeddings=96,
                    relative_attention=True, position_buckets=8, max_relative_positions=-1,
                    pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm",
                    position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7,
                    hidden_act="gelu", pooler_hidden_act="gelu", pooler_dropout=0.0,
                    pad_token_id=0, **TINY)),
    "deberta_v2_b": dict(
        cls="DebertaV2ForSequenceClassification", seed=72, tok=None,
        labels=["contradiction", "neutral", "entailment"],
        config=dict(model_type="deberta-v2", vocab_size=97, max_position_embeddings=40,
                    relative_attention=True, max_relative_positions=12,
                    pos_att_type=["c2p", "p2c"], share_att_key=False, norm_rel_ebd="none",
                    position_biased_input=True, type_vocab_size=2, layer_norm_eps=1e-7,
                    hidden_act="relu", pooler_hidden_act="tanh", pooler_dropout=0.0,
                    pad_token_id=0, hidden_size=40, num_hidden_layers=2, num_attention_heads=5,
                    intermediate_size=72, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)),
    "deberta_c2p": dict(
        cls="DebertaV2Model", seed=73, tok=None,
        config=dict(model_type="deberta-v2", vocab_size=89, max_position_embeddings=48,
                    relative_attention=True, position_buckets=16, max_relative_positions=40,
                    pos_att_type=["c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
                    position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7,
                    hidden_act="gelu_pytorch_tanh", pad_token_id=0, **TINY)),
    "deberta_p2c": dict(
        cls="DebertaV2Model", seed=74, tok=None,
        config=dict(model_type="deberta-v2", vocab_size=83, max_position_embeddings=96,
                    relative_attention=True, position_buckets=32, max_relative_positions=256,
                    pos_att_type="p2c", share_att_key=False, norm_rel_ebd="layer_norm",
                    position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7,
                    hidden_act="silu", pad_token_id=0, **TINY)),
    "bert_cls": dict(
        cls="BertForSequenceClassification", seed=75, tok="wordpiece_bert",
        labels=["sports", "politics", "science"],
        config=dict(model_type="bert", vocab_size=1200, max_position_embeddings=64,
                    type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0,
                    classifier_dropout=0.0, **TINY)),
    "xlmr_rerank": dict(
        cls="XLMRobertaForSequenceClassification", seed=76, tok="unigram_xlmr",
        labels=["LABEL_0"],
        config=dict(model_type="xlm-roberta", vocab_size=802, max_position_embeddings=98,
                    type_vocab_size=1, layer_norm_eps=1e-5, hidden_act="gelu", pad_token_id=1,
                    bos_token_id=0, eos_token_id=2, classifier_dropout=0.0, **TINY)),
    "distilbert_cls": dict(
        cls="DistilBertForSequenceClassification", seed=77, tok=None, labels=["no", "yes"],
        config=dict(model_type="distilbert", vocab_size=91, dim=32, n_layers=2, n_heads=4,
                    hidden_dim=64, max_position_embeddings=24, dropout=0.0, attention_dropout=0.0,
                    seq_classif_dropout=0.0, activation="gelu", pad_token_id=0)),
    "albert_cls": dict(
        cls="AlbertForSequenceClassification", seed=78, tok=None, labels=["a", "b", "c"],
        config=dict(model_type="albert", vocab_size=91, embedding_size=16, max_position_embeddings=24,
                    type_vocab_size=2, num_hidden_groups=1, inner_group_num=1, layer_norm_eps=1e-12,
                    hidden_act="gelu_new", classifier_dropout_prob=0.0, pad_token_id=0, **TINY)),
}

TEXTS = ["the cat sat on the mat", "Stocks fell sharply today.", "a", "Über naïve café prices",
         "Quantum entanglement links distant particles in surprising ways", "hello world"]
QUERY = "where did the cat sit?"
TRUNCATE = 12  # max_length of the truncated pairs: cuts the query, the text or both


def config_for(spec):
    c = dict(spec["config"])
    model_type = c.pop("model_type")
    if "labels" in spec:
        c["id2label"] = {i: l for i, l in enumerate(spec["labels"])}
        c["label2id"] = {l: i for i, l in enumerate(spec["labels"])}
    return transformers.AutoConfig.for_model(model_type, **c)


def build(name):
    spec = SPECS[name]
    torch.manual_seed(spec["seed"])
    model = getattr(transformers, spec["cls"])(config_for(spec))
    g = torch.Generator().manual_seed(spec["seed"] + 1000)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(NOISE * torch.randn(p.shape, generator=g))
    return model.eval()


def base(model):
    return getattr(model, model.base_model_prefix, model)


def run(model, ids, types):
    """(last_hidden_state [S, H], logits [L] or None) of one sequence."""
    kw = dict(input_ids=torch.tensor([ids]))
    if types is not None:
        kw["token_type_ids"] = torch.tensor([types])
    with torch.no_grad():
        hidden = base(model)(**kw).last_hidden_state[0]
        logits = model(**kw).logits[0] if hasattr(model, "classifier") else None
    return hidden, logits


def lengths(max_len, rng):
    mids = sorted(set(int(x) for x in np.linspace(3, max_len - 1, 5)))
    lens = [1, 2, max_len] + mids
    rng.shuffle(lens)
    return lens


def make(name):
    spec = SPECS[name]
    path = os.path.join(MODELS, name)
    shutil.rmtree(path, ignore_errors=True)
    model = build(name)
    cfg = model.config
    rng = np.random.default_rng(spec["seed"])
    offset = cfg.pad_token_id + 1 if cfg.model_type == "xlm-roberta" else 0
    max_len = cfg.max_position_embeddings - offset
    types_vocab = getattr(cfg, "type_vocab_size", 0)
    ids, types, cu, hidden, logits = [], [], [0], [], []
    for n in lengths(max_len, rng):
        s_ids = [int(x) for x in rng.integers(0, cfg.vocab_size, n)]
        if offset:  # RoBERTa-likes: the pad id would move positions
            s_ids = [x if x != cfg.pad_token_id else x + 1 for x in s_ids]
        s_types = [int(x) for x in rng.integers(0, types_vocab, n)] if types_vocab > 1 else [0] * n
        h, lg = run(model, s_ids, s_types if types_vocab > 0 else None)
        ids += s_ids
        types += s_types
        cu.append(cu[-1] + n)
        hidden.append(h.numpy())
        if lg is not None:
            logits.append(lg.numpy())

    # padded batch with a mask: the same per-token outputs
    B, S = len(cu) - 1, max(cu[i + 1] - cu[i] for i in range(len(cu) - 1))
    pad_ids = torch.full((B, S), cfg.pad_token_id)
    pad_types = torch.zeros((B, S), dtype=torch.long)
    mask = torch.zeros((B, S), dtype=torch.long)
    for b in range(B):
        n = cu[b + 1] - cu[b]
        pad_ids[b, :n] = torch.tensor(ids[cu[b]:cu[b + 1]])
        pad_types[b, :n] = torch.tensor(types[cu[b]:cu[b + 1]])
        mask[b, :n] = 1
    kw = dict(input_ids=pad_ids, attention_mask=mask)
    if types_vocab > 0:
        kw["token_type_ids"] = pad_types
    with torch.no_grad():
        padded = base(model)(**kw).last_hidden_state
    for b in range(B):
        n = cu[b + 1] - cu[b]
        assert np.allclose(padded[b, :n].numpy(), hidden[b], atol=1e-4), (name, "padded", b)

    model.save_pretrained(path, safe_serialization=True)
    reloaded = getattr(transformers, spec["cls"]).from_pretrained(path, attn_implementation="eager").eval()
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), reloaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), (name, n1)

    golden = {"input_ids": np.array(ids, np.int32), "token_type_ids": np.array(types, np.int32),
              "cu_seqlens": np.array(cu, np.int32),
              "last_hidden_state": np.concatenate(hidden).astype(np.float32)}
    if logits:
        golden["class_logits"] = np.stack(logits).astype(np.float32)
    save_file(golden, os.path.join(path, "golden.safetensors"),
              metadata={"generator": "scripts/make_deberta_fixtures.py", "model": name})

    if spec.get("tok"):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(os.path.join(PARITY, spec["tok"] + ".json"))
        out = {"tokenizer": "tests/data/tokenizer/parity/%s.json" % spec["tok"],
               "labels": spec["labels"], "query": QUERY, "texts": TEXTS,
               "ids": [], "logits": [], "pair_ids": [], "pair_types": [], "pair_logits": []}
        for t in TEXTS:
            for pair in (False, True):
                enc = tok.encode(QUERY, t) if pair else tok.encode(t)
                _, lg = run(model, enc.ids, enc.type_ids if types_vocab > 0 else None)
                out["pair_ids" if pair else "ids"].append(enc.ids)
                if pair:
                    out["pair_types"].append(enc.type_ids)
                out["pair_logits" if pair else "logits"].append([float(x) for x in lg])
        tok.enable_truncation(TRUNCATE)  # longest_first, HF's default strategy
        out["truncate"] = TRUNCATE
        out["pair_ids_truncated"] = [tok.encode(QUERY, t).ids for t in TEXTS]
        with open(os.path.join(path, "golden_text.json"), "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print("%-13s %-36s T=%-4d %6.1f KB" % (name, spec["cls"], cu[-1], size / 1024))


BUCKETS = [(8, 64), (16, 40), (32, 256), (256, 512), (256, 2048), (64, 100), (3, 10)]


def make_buckets():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    rel = torch.arange(-2047, 2048, dtype=torch.long)
    out = {"buckets_%d_%d" % bm: make_log_bucket_position(rel, *bm).to(torch.int32).numpy()
           for bm in BUCKETS}
    save_file(out, os.path.join(MODELS, "deberta_buckets.safetensors"),
              metadata={"generator": "scripts/make_deberta_fixtures.py"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    for name in args.only or SPECS:
        make(name)
    if not args.only:
        make_buckets()


if __name__ == "__main__":
    main()
