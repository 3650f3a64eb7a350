#!/usr/bin/env python3
"""Generate tiny deterministic golden fixtures for the nopad test-suite.

Writes tests/data/models/<name>/ for a set of tiny, random-init Hugging Face
models (BERT, RoBERTa, XLM-R, DistilBERT, ALBERT) plus two
sentence-transformers folders built on a tiny BERT.  Each folder holds the
model as written by save_pretrained (safetensors) and a golden.safetensors
with reference outputs computed by transformers, one sequence at a time
(batch 1, no padding, fp32, eager attention), concatenated in packed order.

golden.safetensors tensors:
  input_ids          int32   [T]
  token_type_ids     int32   [T]   (zeros when the model has no token types)
  cu_seqlens         int32   [B+1] (cu_seqlens[0] = 0, cu_seqlens[B] = T)
  last_hidden_state  float32 [T, H]
  pooled             float32 [B, H]  (st_* folders only)

Everything is seeded, so re-running the script reproduces the same weights and
goldens on the same torch/transformers versions (see tests/data/README.md).

Usage: python3 scripts/make_golden_fixtures.py [--out tests/data/models] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import warnings

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from safetensors import safe_open

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOISE = 0.1


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def add_noise(model: torch.nn.Module, seed: int, skip=()) -> None:
    """p += NOISE * randn for every parameter (so LN weights != 1, biases != 0)."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(s in name for s in skip):
                continue
            p.add_(NOISE * torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype))


def seq_lengths(max_len: int, rng: np.random.Generator) -> list[int]:
    """1, 2, max_len and 5 lengths spread in between, in a shuffled packed order."""
    inner = np.linspace(3, max_len - 1, 5).round().astype(int).tolist()
    inner = [min(max(3, x), max_len - 1) for x in inner]
    lens = [1, 2, max_len] + inner
    order = rng.permutation(len(lens))
    return [int(lens[i]) for i in order]


def make_inputs(lens, vocab, type_vocab, rng, exclude=()):
    ids, tts = [], []
    allowed = np.array([i for i in range(vocab) if i not in exclude], dtype=np.int64)
    for n in lens:
        ids.append(rng.choice(allowed, size=n).astype(np.int64))
        if type_vocab > 1:
            tts.append(rng.integers(0, type_vocab, size=n).astype(np.int64))
        else:
            tts.append(np.zeros(n, dtype=np.int64))
    return ids, tts


def pack(ids, tts, hidden):
    cu = np.zeros(len(ids) + 1, dtype=np.int32)
    cu[1:] = np.cumsum([len(x) for x in ids])
    return {
        "input_ids": np.concatenate(ids).astype(np.int32),
        "token_type_ids": np.concatenate(tts).astype(np.int32),
        "cu_seqlens": cu,
        "last_hidden_state": np.concatenate(hidden, axis=0).astype(np.float32),
    }


@torch.no_grad()
def run_one_by_one(encoder, ids, tts, use_tt=True):
    outs = []
    for i, t in zip(ids, tts):
        kw = dict(input_ids=torch.from_numpy(i)[None], attention_mask=torch.ones(1, len(i), dtype=torch.long))
        if use_tt:
            kw["token_type_ids"] = torch.from_numpy(t)[None]
        o = encoder(**kw).last_hidden_state[0]
        assert torch.isfinite(o).all()
        outs.append(o.float().numpy())
    return outs


def load_fp32(cls, path):
    model, info = cls.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "mismatched_keys")}
    assert not bad, f"{path}: {bad}"
    model.eval()
    return model


def tensor_names(path):
    names = {}
    files = [f for f in sorted(os.listdir(path)) if f.endswith(".safetensors") and f != "golden.safetensors"]
    for f in files:
        with safe_open(os.path.join(path, f), "np") as fh:
            for k in fh.keys():
                names[k] = f
    return names


def dir_size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# --------------------------------------------------------------------------
# model definitions
# --------------------------------------------------------------------------

def build_hf(name: str):
    """Returns (model_to_save, save_kwargs, load_cls, encoder_getter, meta)."""
    from transformers import (
        AlbertConfig, AlbertModel, BertConfig, BertForSequenceClassification, BertModel,
        DistilBertConfig, DistilBertModel, RobertaConfig, RobertaModel, XLMRobertaConfig,
        XLMRobertaModel,
    )

    seed = {"bert_a": 11, "bert_b": 12, "roberta_a": 21, "xlmr_b": 22,
            "distilbert_a": 31, "distilbert_b": 32, "albert_a": 41, "albert_b": 42}[name]
    torch.manual_seed(seed)
    common = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    save_kw = {}
    dtype = "float32"
    skip = ()

    if name == "bert_a":
        cfg = BertConfig(vocab_size=211, hidden_size=48, num_attention_heads=4, num_hidden_layers=2,
                         intermediate_size=72, max_position_embeddings=40, type_vocab_size=3,
                         layer_norm_eps=1e-7, hidden_act="gelu_new", pad_token_id=0, **common)
        model = BertModel(cfg)
        load_cls, enc = BertModel, (lambda m: m)
        max_len, exclude, type_vocab = 40, (), 3
    elif name == "bert_b":
        cfg = BertConfig(vocab_size=157, hidden_size=40, num_attention_heads=5, num_hidden_layers=3,
                         intermediate_size=100, max_position_embeddings=24, type_vocab_size=2,
                         layer_norm_eps=3e-6, hidden_act="relu", pad_token_id=0, num_labels=3, **common)
        model = BertForSequenceClassification(cfg)
        load_cls, enc = BertForSequenceClassification, (lambda m: m.bert)
        max_len, exclude, type_vocab = 24, (), 2
        dtype = "float16"
    elif name == "roberta_a":
        cfg = RobertaConfig(vocab_size=250, hidden_size=36, num_attention_heads=3, num_hidden_layers=2,
                            intermediate_size=100, max_position_embeddings=34, type_vocab_size=2,
                            layer_norm_eps=1e-5, hidden_act="gelu", pad_token_id=1, bos_token_id=0,
                            eos_token_id=2, **common)
        model = RobertaModel(cfg)
        load_cls, enc = RobertaModel, (lambda m: m)
        max_len, exclude, type_vocab = 34 - (1 + 1), (1,), 2
    elif name == "xlmr_b":
        cfg = XLMRobertaConfig(vocab_size=120, hidden_size=48, num_attention_heads=6, num_hidden_layers=3,
                               intermediate_size=72, max_position_embeddings=30, type_vocab_size=1,
                               layer_norm_eps=2e-6, hidden_act="gelu_pytorch_tanh", pad_token_id=3,
                               bos_token_id=0, eos_token_id=2, **common)
        model = XLMRobertaModel(cfg)
        load_cls, enc = XLMRobertaModel, (lambda m: m)
        max_len, exclude, type_vocab = 30 - (3 + 1), (3,), 1
        save_kw["max_shard_size"] = "50KB"
    elif name == "distilbert_a":
        cfg = DistilBertConfig(vocab_size=130, dim=48, n_heads=3, n_layers=2, hidden_dim=72,
                               max_position_embeddings=48, activation="gelu", dropout=0.0,
                               attention_dropout=0.0, pad_token_id=0)
        model = DistilBertModel(cfg)
        load_cls, enc = DistilBertModel, (lambda m: m)
        max_len, exclude, type_vocab = 48, (), 0
    elif name == "distilbert_b":
        cfg = DistilBertConfig(vocab_size=170, dim=40, n_heads=2, n_layers=3, hidden_dim=100,
                               max_position_embeddings=28, activation="relu", sinusoidal_pos_embds=True,
                               dropout=0.0, attention_dropout=0.0, pad_token_id=0)
        model = DistilBertModel(cfg)
        load_cls, enc = DistilBertModel, (lambda m: m)
        max_len, exclude, type_vocab = 28, (), 0
        dtype = "bfloat16"
        skip = ("position_embeddings",)  # keep the sinusoidal table exact (pre-rounding)
    elif name == "albert_a":
        cfg = AlbertConfig(vocab_size=120, embedding_size=16, hidden_size=48, num_attention_heads=4,
                           num_hidden_layers=2, num_hidden_groups=1, inner_group_num=1,
                           intermediate_size=100, max_position_embeddings=32, type_vocab_size=2,
                           layer_norm_eps=4e-6, hidden_act="gelu", pad_token_id=0,
                           classifier_dropout_prob=0.0, **common)
        model = AlbertModel(cfg)
        load_cls, enc = AlbertModel, (lambda m: m)
        max_len, exclude, type_vocab = 32, (), 2
    elif name == "albert_b":
        cfg = AlbertConfig(vocab_size=140, embedding_size=24, hidden_size=40, num_attention_heads=5,
                           num_hidden_layers=4, num_hidden_groups=2, inner_group_num=1,
                           intermediate_size=72, max_position_embeddings=40, type_vocab_size=3,
                           layer_norm_eps=1e-6, hidden_act="gelu_new", pad_token_id=0,
                           classifier_dropout_prob=0.0, **common)
        model = AlbertModel(cfg)
        load_cls, enc = AlbertModel, (lambda m: m)
        max_len, exclude, type_vocab = 40, (), 3
    else:
        raise KeyError(name)

    add_noise(model, seed, skip=skip)
    if dtype == "float16":
        model = model.half()
    elif dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    model.eval()
    meta = dict(seed=seed, max_len=max_len, exclude=exclude, type_vocab=type_vocab, dtype=dtype)
    return model, save_kw, load_cls, enc, meta


HF_MODELS = ["bert_a", "bert_b", "roberta_a", "xlmr_b", "distilbert_a", "distilbert_b", "albert_a", "albert_b"]


def make_hf_fixture(out_root: str, name: str) -> dict:
    model, save_kw, load_cls, enc, meta = build_hf(name)
    path = os.path.join(out_root, name)
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path, safe_serialization=True, **save_kw)

    # Reference in-memory model, upcast to fp32 (exact for fp16/bf16 -> fp32).
    ref = model.float()
    ref.config._attn_implementation = "eager"
    ref.eval()
    # Model as loaded back from disk (this is what the C engine sees).
    loaded = load_fp32(load_cls, path)
    cfg = loaded.config

    rng = np.random.default_rng(meta["seed"])
    lens = seq_lengths(meta["max_len"], rng)
    vocab = cfg.vocab_size
    ids, tts = make_inputs(lens, vocab, meta["type_vocab"], rng, exclude=meta["exclude"])
    use_tt = meta["type_vocab"] > 0
    hidden = run_one_by_one(enc(loaded), ids, tts, use_tt)
    hidden_ref = run_one_by_one(enc(ref), ids, tts, use_tt)
    for a, b in zip(hidden, hidden_ref):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)

    # Cross-check: batched+padded run (right padding with attention mask) gives
    # the same per-token outputs -- sanity of the "packed == per-sequence" claim.
    # (RoBERTa-likes: pad id is excluded from ids, so positions are unaffected.)
    if name in ("bert_a", "roberta_a", "albert_b", "distilbert_a"):
        e = enc(loaded)
        L = max(lens)
        pad = cfg.pad_token_id
        bi = torch.full((len(ids), L), pad, dtype=torch.long)
        bt = torch.zeros((len(ids), L), dtype=torch.long)
        bm = torch.zeros((len(ids), L), dtype=torch.long)
        for r, (i, t) in enumerate(zip(ids, tts)):
            bi[r, : len(i)] = torch.from_numpy(i)
            bt[r, : len(i)] = torch.from_numpy(t)
            bm[r, : len(i)] = 1
        kw = dict(input_ids=bi, attention_mask=bm)
        if use_tt:
            kw["token_type_ids"] = bt
        with torch.no_grad():
            bo = e(**kw).last_hidden_state
        for r, h in enumerate(hidden):
            np.testing.assert_allclose(bo[r, : len(h)].numpy(), h, rtol=0, atol=1e-4)

    golden = pack(ids, tts, hidden)
    save_file(golden, os.path.join(path, "golden.safetensors"),
              metadata={"generator": "scripts/make_golden_fixtures.py", "model": name})

    names = tensor_names(path)
    info = dict(
        name=name, cls=type(model).__name__, dtype=meta["dtype"],
        sharded=os.path.exists(os.path.join(path, "model.safetensors.index.json")),
        files=sorted(set(names.values())), n_tensors=len(names),
        lens=lens, T=int(golden["cu_seqlens"][-1]), size=dir_size(path),
        tensor_names=sorted(names),
        config={k: getattr(cfg, k) for k in (
            "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "hidden_dim",
            "embedding_size", "num_hidden_groups", "inner_group_num", "hidden_act", "activation",
            "layer_norm_eps", "max_position_embeddings", "vocab_size", "type_vocab_size", "pad_token_id",
            "sinusoidal_pos_embds") if k in cfg.to_dict() or hasattr(type(cfg), k)},
    )
    return info


# --------------------------------------------------------------------------
# sentence-transformers folders
# --------------------------------------------------------------------------

ST_WORDS = (
    "the a an of to and in is it that was for on are as with his they at be this have from or one "
    "had by word but not what all were we when your can said there use each which she do how their "
    "if will up other about out many then them these so some her would make like him into time has "
    "look two more write go see number no way could people my than first water been call who oil its "
    "now find long down day did get come made may part over new sound take only little work know place "
    "year live me back give most very after thing our just name good sentence man think say great where "
    "help through much before line right too mean old any same tell boy follow came want show also"
).split()


def build_st_vocab(path):
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    pieces = ["##s", "##ed", "##ing", "##er", "##ly", "!", ",", ".", "?"]
    vocab = specials + sorted(set(ST_WORDS)) + pieces
    with open(path, "w") as f:
        f.write("\n".join(vocab) + "\n")
    return vocab


LEGACY_POOLING_KEYS = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                       "weightedmean_tokens", "lasttoken")


def write_classic_st_layout(path: str, vocab_src: str, hidden: int, pooling: str, normalize: bool,
                            max_seq_length: int) -> None:
    """Rewrite the module configs into the classic (sentence-transformers 2.x-5.x) layout that
    nearly every model on the hub uses (e.g. all-MiniLM-L6-v2):
      modules.json types "sentence_transformers.models.X", sentence_bert_config.json with
      max_seq_length/do_lower_case, 1_Pooling/config.json with word_embedding_dimension and
      pooling_mode_* booleans, no 2_Normalize folder, vocab.txt next to tokenizer.json."""
    mods = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        mods.append({"idx": 2, "name": "2", "path": "2_Normalize",
                     "type": "sentence_transformers.models.Normalize"})
    with open(os.path.join(path, "modules.json"), "w") as f:
        json.dump(mods, f, indent=2)
    with open(os.path.join(path, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": max_seq_length, "do_lower_case": False}, f, indent=2)
    mode = {"mean": "mean_tokens", "max": "max_tokens", "cls": "cls_token"}[pooling]
    pool = {"word_embedding_dimension": hidden}
    pool.update({f"pooling_mode_{k}": k == mode for k in LEGACY_POOLING_KEYS})
    pool["include_prompt"] = True
    with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
        json.dump(pool, f, indent=4)
    shutil.rmtree(os.path.join(path, "2_Normalize"), ignore_errors=True)
    shutil.copy(vocab_src, os.path.join(path, "vocab.txt"))


def make_st_fixture(out_root: str, name: str, pooling: str, normalize: bool, seed: int,
                    max_seq_length: int, act: str, eps: float, layout: str) -> dict:
    from transformers import BertConfig, BertModel, BertTokenizerFast
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer

    path = os.path.join(out_root, name)
    shutil.rmtree(path, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = os.path.join(tmp, "vocab.txt")
        vocab = build_st_vocab(vocab_file)
        # Positional on purpose: the first parameter is `vocab_file` in transformers 4 and `vocab`
        # (a path or a dict) in transformers 5, which silently swallows `vocab_file=` into **kwargs
        # and builds a WordPiece holding only the 5 special tokens (every word -> [UNK]).
        tok = BertTokenizerFast(vocab_file, do_lower_case=True)
        assert tok.get_vocab() == {t: i for i, t in enumerate(vocab)}, "tokenizer lost the vocab"
        torch.manual_seed(seed)
        cfg = BertConfig(vocab_size=len(vocab), hidden_size=48, num_attention_heads=4, num_hidden_layers=2,
                         intermediate_size=72, max_position_embeddings=32, type_vocab_size=2,
                         layer_norm_eps=eps, hidden_act=act, pad_token_id=0,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        bert = BertModel(cfg)
        add_noise(bert, seed)
        base = os.path.join(tmp, "base")
        bert.save_pretrained(base, safe_serialization=True)
        tok.save_pretrained(base)

        tr = Transformer(base, max_seq_length=max_seq_length,
                         model_kwargs={"attn_implementation": "eager"})
        pool = Pooling(tr.get_word_embedding_dimension(), pooling_mode=pooling)
        mods = [tr, pool] + ([Normalize()] if normalize else [])
        st = SentenceTransformer(modules=mods, device="cpu")
        st.save(path, create_model_card=False)
        if layout == "classic":
            write_classic_st_layout(path, vocab_file, 48, pooling, normalize, max_seq_length)
        else:
            assert layout == "v6"
    for junk in ("README.md",):
        if os.path.exists(os.path.join(path, junk)):
            os.remove(os.path.join(path, junk))

    # The saved tokenizer.json must carry the whole vocab (not just the special tokens).
    with open(os.path.join(path, "tokenizer.json")) as f:
        saved_vocab = json.load(f)["model"]["vocab"]
    assert saved_vocab == {t: i for i, t in enumerate(vocab)}, (name, len(saved_vocab), len(vocab))

    st = SentenceTransformer(path, device="cpu", model_kwargs={"attn_implementation": "eager"})
    st.eval()
    assert st.max_seq_length == max_seq_length, (st.max_seq_length, max_seq_length)
    assert len(st) == (3 if normalize else 2)
    hf = load_fp32(BertModel, path)

    rng = np.random.default_rng(seed)
    # Sequences are real tokenizer outputs of random word strings ([CLS] w.. [SEP]),
    # lengths 2..max_seq_length, plus one length-1 sequence ([CLS] only) that
    # cannot come from the tokenizer.
    words = list(ST_WORDS)
    n_words = [0, 1, 3, 7, 11, max_seq_length - 2, max_seq_length - 5, 5]
    texts, ids = [], []
    for n in n_words:
        t = " ".join(rng.choice(words, size=n).tolist())
        e = tok(t)["input_ids"]
        assert len(e) == n + 2 and len(e) <= max_seq_length
        texts.append(t)
        ids.append(np.array(e, dtype=np.int64))
    # The ids must be real words, not [UNK]: fewer than 10% unk ids overall (in practice none).
    all_ids = np.concatenate(ids)
    unk_frac = float(np.mean(all_ids == tok.unk_token_id))
    assert unk_frac < 0.10, (name, unk_frac)
    # ... and the folder's own tokenizer, as sentence-transformers loads it, gives the same ids.
    tokenize = st.preprocess if hasattr(st, "preprocess") else st.tokenize
    for t, e in zip(texts, ids):
        tf = tokenize([t])
        assert tf["input_ids"][0].tolist() == e.tolist(), (name, t, tf["input_ids"][0].tolist(), e.tolist())
    ids.insert(3, np.array([tok.cls_token_id], dtype=np.int64))
    texts.insert(3, None)
    tts = [np.zeros(len(i), dtype=np.int64) for i in ids]

    # truncation sanity: ST truncates to max_seq_length (keeping [SEP] last)
    long_text = " ".join(rng.choice(words, size=max_seq_length + 7).tolist())
    tf = tokenize([long_text])
    assert tf["input_ids"].shape[1] == max_seq_length and int(tf["input_ids"][0, -1]) == tok.sep_token_id

    hidden = run_one_by_one(hf, ids, tts, True)
    pooled = []
    with torch.no_grad():
        for i, h, text in zip(ids, hidden, texts):
            feats = {"input_ids": torch.from_numpy(i)[None],
                     "attention_mask": torch.ones(1, len(i), dtype=torch.long),
                     "token_type_ids": torch.zeros(1, len(i), dtype=torch.long)}
            out = st(feats)
            np.testing.assert_allclose(out["token_embeddings"][0].numpy(), h, rtol=0, atol=1e-5)
            p = out["sentence_embedding"][0].numpy()
            # independent recomputation from last_hidden_state
            q = {"mean": lambda: h.mean(axis=0), "max": lambda: h.max(axis=0), "cls": lambda: h[0]}[pooling]()
            if normalize:
                q = q / max(np.linalg.norm(q), 1e-12)
            np.testing.assert_allclose(p, q, rtol=0, atol=1e-5)
            if text is not None:
                enc = st.encode([text], convert_to_numpy=True)[0]
                np.testing.assert_allclose(enc, p, rtol=0, atol=1e-5)
            pooled.append(p.astype(np.float32))

    golden = pack(ids, tts, hidden)
    golden["pooled"] = np.stack(pooled).astype(np.float32)
    save_file(golden, os.path.join(path, "golden.safetensors"),
              metadata={"generator": "scripts/make_golden_fixtures.py", "model": name})
    with open(os.path.join(path, "golden_texts.txt"), "w") as f:
        for t in texts:
            f.write(("<ids only: [CLS]>" if t is None else t) + "\n")

    names = tensor_names(path)
    return dict(name=name, cls=f"SentenceTransformer(BertModel), {layout} layout", dtype="float32",
                sharded=False, files=sorted(set(names.values())), n_tensors=len(names),
                lens=[len(i) for i in ids], T=int(golden["cu_seqlens"][-1]), size=dir_size(path),
                unk_frac=unk_frac,
                tensor_names=sorted(names),
                config=dict(hidden_size=48, num_attention_heads=4, num_hidden_layers=2,
                            intermediate_size=72, hidden_act=act, layer_norm_eps=eps,
                            max_position_embeddings=32, vocab_size=len(vocab), type_vocab_size=2,
                            max_seq_length=max_seq_length, pooling=pooling, normalize=normalize))


ST_MODELS = [
    # name, pooling, normalize, seed, max_seq_length, act, eps, layout
    ("st_mean_norm", "mean", True, 51, 20, "gelu", 1e-6, "classic"),
    ("st_max", "max", False, 52, 16, "relu", 5e-6, "classic"),
    ("st_cls_v6", "cls", True, 53, 18, "gelu_new", 2e-7, "v6"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "models"))
    ap.add_argument("--summary", default=None, help="write a JSON summary here")
    ap.add_argument("--only", nargs="+", metavar="NAME", default=None,
                    help="regenerate only these folders (default: all)")
    args = ap.parse_args()
    known = HF_MODELS + [a[0] for a in ST_MODELS]
    if args.only:
        unknown = sorted(set(args.only) - set(known))
        if unknown:
            ap.error(f"unknown fixture(s): {', '.join(unknown)}; known: {', '.join(known)}")
    wanted = lambda n: args.only is None or n in args.only
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)

    infos = []
    for n in HF_MODELS:
        if not wanted(n):
            continue
        infos.append(make_hf_fixture(args.out, n))
        print(f"{n}: {infos[-1]['size']} bytes, T={infos[-1]['T']}, lens={infos[-1]['lens']}", file=sys.stderr)
    for st_args in ST_MODELS:
        if not wanted(st_args[0]):
            continue
        infos.append(make_st_fixture(args.out, *st_args))
        i = infos[-1]
        print(f"{i['name']}: {i['size']} bytes, T={i['T']}, lens={i['lens']}, unk={i['unk_frac']:.3f}",
              file=sys.stderr)

    total = dir_size(args.out)
    print(f"total: {total} bytes", file=sys.stderr)
    assert total < 3 * 1024 * 1024, total
    for i in infos:
        assert i["size"] < 300 * 1024, (i["name"], i["size"])
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(dict(infos=infos, total=total, versions=dict(
                torch=torch.__version__, transformers=transformers.__version__,
                sentence_transformers=__import__("sentence_transformers").__version__)), f, indent=1,
                default=str)


if __name__ == "__main__":
    main()
