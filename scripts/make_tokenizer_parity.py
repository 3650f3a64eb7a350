#!/usr/bin/env python3
"""Writes the multi-family tokenizer parity fixtures: tokenizer.json files of every family nopad
reads and Hugging Face `tokenizers`' ids and decodes for every line of the corpus.

    pip install tokenizers transformers sentencepiece protobuf     # no torch needed
    python3 scripts/make_tokenizer_parity.py                       # files in tests/data/tokenizer/
    python3 scripts/make_tokenizer_parity.py --summary             # only print each pipeline
    python3 scripts/make_tokenizer_parity.py --random 10000 --library build/libnopad.so
        # no files: compares a built libnopad.so with HF on N random strings per tokenizer and
        # prints, per tokenizer as it finishes, how many differ (or why nopad cannot load it) and
        # the first few; NOPAD_RANDOM_STRINGS, when set, replaces N (scripts/test.sh --long sets
        # 100000). The strings depend on --seed only, so a smaller N checks a prefix of a larger.

The tokenizers are trained on the texts of tests/data/tokenizer/corpus.jsonl (no model hub): the
byte-level BPE and WordPiece ones with `tokenizers`' trainers, the SentencePiece ones with
`sentencepiece`'s trainer and then converted to tokenizer.json the way transformers does it. Two
converters exist and both are covered, because both kinds of file are in circulation:

  * the slow->fast converters of transformers.convert_slow_tokenizer (LlamaConverter,
    XLMRobertaConverter, AlbertConverter, DebertaV2Converter): what the tokenizer.json files on
    the hub were made with (transformers 4.x shipped a slow SentencePiece class beside each fast
    one). transformers 5 keeps these classes but no slow tokenizer to feed them, so a small stand-in
    (_Slow) gives them the vocab file, the options and the special-token ids they ask for.
  * transformers 5's own import of a SentencePiece .model (`<Class>.from_pretrained(folder holding
    only the .model)`): what transformers 5 writes when it saves such a tokenizer. These carry the
    suffix _v5.

Vocabularies are small (300-1500) so that words split into many pieces and rare characters reach
the unknown token or the byte fallback.

tests/data/tokenizer/parity/<name>.json   the tokenizers, as `tokenizers` saves them
tests/data/tokenizer/parity_cases.jsonl   one JSON object per (tokenizer, corpus line):
    tok            the name (file parity/<tok>.json)
    line           index into corpus.jsonl (texts are its `hex`)
    ids            Tokenizer.encode(text).ids (special tokens added by the post-processor)
    ids_nospecial  Tokenizer.encode(text, add_special_tokens=False).ids
    decode         hex of the UTF-8 of Tokenizer.decode(ids_nospecial, skip_special_tokens=False)
    decode_skip    hex of the UTF-8 of Tokenizer.decode(ids, skip_special_tokens=True)
Every tokenizer has a record for every line (15 x 386, about 4 MB).

All ids come from `tokenizers.Tokenizer.from_file` on the saved file (what the C side reads), not
from transformers' tokenizer classes, which may rebuild the pipeline (see tests/data/README.md).
"""
import argparse
import ctypes
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
import warnings

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
PARITY = os.path.join(DATA, "parity")
CASES = os.path.join(DATA, "parity_cases.jsonl")

# LLaMA-3's and Qwen2's pre-tokenizer patterns, as their tokenizer.json files have them
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus_texts():
    with open(os.path.join(DATA, "corpus.jsonl"), encoding="utf-8") as f:
        return [bytes.fromhex(json.loads(line)["hex"]).decode("utf-8") for line in f]


# ---- tokenizers' own trainers -------------------------------------------------------------------

def bpe_trainer(vocab_size, special):
    return trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def wordpiece_bert(texts):
    """bert-base-uncased's pipeline: BertNormalizer (lowercase, strip accents by lowercase, CJK
    spacing, control cleaning), BertPreTokenizer, WordPiece ##, [CLS] $A [SEP].

    tokenizers' WordPieceTrainer gives a different vocab on every run (it adds the ## characters
    in hash order and merges break ties by id), so the vocab is chosen here: the 400 most frequent
    characters (rare ones become [UNK]), the ## forms of the 150 most frequent, then word prefixes
    and ## pieces ranked by count x (length - 1), ties by the string, to 1200 entries."""
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                      strip_accents=None, lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    words, chars = {}, {}
    for text in texts:
        for word, _ in pre.pre_tokenize_str(norm.normalize_str(text)):
            words[word] = words.get(word, 0) + 1
            for c in word:
                chars[c] = chars.get(c, 0) + 1
    by_count = sorted(chars, key=lambda c: (-chars[c], ord(c)))
    alphabet = sorted(by_count[:300], key=ord)
    pieces = {}
    for word, n in words.items():
        for k in range(2, min(len(word), 10) + 1):
            pieces[word[:k]] = pieces.get(word[:k], 0) + n
        for i in range(1, len(word)):
            for k in range(2, min(len(word) - i, 6) + 1):
                p = "##" + word[i:i + k]
                pieces[p] = pieces.get(p, 0) + n
    vocab = special + alphabet + ["##" + c for c in sorted(by_count[:150], key=ord)]
    def score(p):
        return pieces[p] * (len(p) - (3 if p.startswith("##") else 1))

    ranked = sorted(pieces, key=lambda p: (-score(p), p))
    vocab += ranked[:1200 - len(vocab)]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]",
                                     max_input_chars_per_word=100))
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    _specials(tok, special)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    return tok


def bpe_gpt2(texts):
    """GPT-2: ByteLevel (add_prefix_space false, GPT-2 regex), <|endoftext|> the only special
    token (last id), ByteLevel post-processor and decoder."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, bpe_trainer(500, []))
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def bpe_roberta(texts):
    """roberta-base: <s> <pad> </s> <unk> first, <mask> last with lstrip, ByteLevel
    (add_prefix_space false as roberta-base ships it; tests/data/tokenizer/bpe_roberta.json has
    the true case), RobertaProcessing <s> $A </s>."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, bpe_trainer(600, ["<s>", "<pad>", "</s>", "<unk>"]))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0),
                                                      add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def split_bytelevel(texts, pattern, vocab_size, special, ignore_merges, nfc):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.train_from_iterator(texts, bpe_trainer(vocab_size, []))
    tok.add_special_tokens([AddedToken(s, special=True) for s in special])
    tok.decoder = decoders.ByteLevel()
    return tok


def bpe_llama3(texts):
    """Meta-Llama-3: Split(LLaMA-3 regex, isolated) + ByteLevel(use_regex false), BPE with
    ignore_merges true (a pre-token that is a whole vocab entry is taken as is), added specials
    after the vocab, TemplateProcessing <|begin_of_text|> $A."""
    tok = split_bytelevel(texts, LLAMA3_PATTERN, 700,
                          ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], True, False)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def bpe_qwen2(texts):
    """Qwen2: NFC normalizer, Split(Qwen2 regex: single digits) + ByteLevel(use_regex false), BPE
    without ignore_merges, <|endoftext|> <|im_start|> <|im_end|>, ByteLevel post-processor (no
    special tokens added)."""
    tok = split_bytelevel(texts, QWEN2_PATTERN, 700,
                          ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], False, True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                              use_regex=False)
    return tok


def bpe_smollm(texts):
    """SmolLM2: Digits(individual) + ByteLevel(use_regex true), specials first
    (<|endoftext|> 0, <|im_start|> 1, <|im_end|> 2), no post-processing of ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.train_from_iterator(texts, bpe_trainer(600, ["<|endoftext|>", "<|im_start|>",
                                                     "<|im_end|>"]))
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False,
                                              use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


# ---- SentencePiece ------------------------------------------------------------------------------

def spm_train(texts, **kw):
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=out, minloglevel=2,
                                   num_threads=1, character_coverage=0.98, hard_vocab_limit=False,
                                   **kw)
    return out.getvalue()


def spm_models(texts):
    """The SentencePiece models, trained like the originals (options from their .model files)."""
    return {
        # LLaMA-2 / Mistral: BPE, byte fallback, identity normalization, digits split,
        # whitespace-only pieces allowed, extra whitespace kept
        "llama2": spm_train(texts, model_type="bpe", vocab_size=1500, byte_fallback=True,
                            normalization_rule_name="identity", split_digits=True,
                            allow_whitespace_only_pieces=True, remove_extra_whitespaces=False),
        # XLM-R: unigram, nmt_nfkc, <unk> 0 <s> 1 </s> 2
        "xlmr": spm_train(texts, model_type="unigram", vocab_size=800,
                          normalization_rule_name="nmt_nfkc"),
        # ALBERT: unigram, nmt_nfkc, <pad> 0 <unk> 1 [CLS] 2 [SEP] 3 [MASK] 4
        "albert": spm_train(texts, model_type="unigram", vocab_size=800,
                            normalization_rule_name="nmt_nfkc", pad_id=0, unk_id=1, bos_id=-1,
                            eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"]),
        # DeBERTa-v3: unigram, nmt_nfkc, [PAD] 0 [CLS] 1 [SEP] 2 [UNK] 3
        "debertav3": spm_train(texts, model_type="unigram", vocab_size=800,
                               normalization_rule_name="nmt_nfkc", pad_id=0, bos_id=1, eos_id=2,
                               unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]",
                               unk_piece="[UNK]"),
        # unigram with byte fallback (as Gemma-style .model files have it), nmt_nfkc
        "unigram_bf": spm_train(texts, model_type="unigram", vocab_size=1100, byte_fallback=True,
                                normalization_rule_name="nmt_nfkc", split_digits=True),
    }


class _Slow:
    """What transformers.convert_slow_tokenizer's converters read from a slow tokenizer: the
    .model path, options, and the fast ids of the special tokens."""

    def __init__(self, model_bytes, ids, **options):
        fd, self.vocab_file = tempfile.mkstemp(suffix=".model")
        with os.fdopen(fd, "wb") as f:
            f.write(model_bytes)
        self._ids = ids
        self.__dict__.update(options)

    def convert_tokens_to_ids(self, token):
        return self._ids[token]

    def convert_ids_to_tokens(self, i):
        return {v: k for k, v in self._ids.items()}[i]

    def close(self):
        os.unlink(self.vocab_file)


def _converted(converter_cls, slow):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return converter_cls(slow).converted()
        finally:
            slow.close()


def _v4_extractor():
    """transformers 4's SentencePieceExtractor.extract(vocab_scores) -> (vocab, merges): BPE merges
    ordered by piece score. transformers 5 changed its signature, which breaks the BPE branch of
    SpmConverter.tokenizer (LlamaConverter); this restores the 4.x behaviour for it."""
    from transformers.convert_slow_tokenizer import SentencePieceExtractor
    from transformers.tokenization_utils_base import generate_merges

    class Extractor(SentencePieceExtractor):
        def extract(self, vocab_scores=None):
            vocab = {p.piece: i for i, p in enumerate(self.proto.pieces)}
            return vocab, generate_merges(vocab, vocab_scores)

    return Extractor


def _specials(tok, tokens):
    """Marks tokens special as the transformers classes do when they save (normalized false)."""
    tok.add_special_tokens([t if isinstance(t, AddedToken) else AddedToken(t, special=True,
                                                                           normalized=False)
                            for t in tokens])


def spbpe_llama2(sp):
    """LLaMA-2 / Mistral as on the hub (LlamaConverter, legacy): normalizer Prepend("▁") +
    Replace(" ", "▁"), no pre-tokenizer, BPE with byte_fallback and fuse_unk, decoder Replace +
    ByteFallback + Fuse + Strip(1 left), TemplateProcessing <s> $A (add_bos_token)."""
    from transformers.convert_slow_tokenizer import LlamaConverter

    class Converter(LlamaConverter):
        SpmExtractor = _v4_extractor()

    tok = _converted(Converter, _Slow(sp, {"<unk>": 0, "<s>": 1, "</s>": 2}, legacy=True,
                                      add_prefix_space=True))
    _specials(tok, ["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)])
    return tok


def _v5_from_model(cls_name, sp, filename, **kwargs):
    import transformers

    cls = getattr(transformers, cls_name)
    d = tempfile.mkdtemp()
    try:
        with open(os.path.join(d, filename), "wb") as f:
            f.write(sp)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = cls.from_pretrained(d, **kwargs)
        return Tokenizer.from_str(t.backend_tokenizer.to_str())
    finally:
        shutil.rmtree(d)


def spbpe_llama2_metaspace_v5(sp):
    """transformers 5's LlamaTokenizer from tokenizer.model (legacy false, add_bos_token true as
    LLaMA-2 folders configure it): no normalizer, Metaspace(prepend_scheme first, split false),
    merges generated from the vocab order, <s> $A. transformers 4 with legacy=false gave the same
    pipeline."""
    return _v5_from_model("LlamaTokenizer", sp, "tokenizer.model", add_bos_token=True)


def _xlmr_converted(sp):
    from transformers.convert_slow_tokenizer import XLMRobertaConverter

    tok = _converted(XLMRobertaConverter, _Slow(sp, {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3},
                                                add_prefix_space=True))
    _specials(tok, ["<s>", "<pad>", "</s>", "<unk>",
                    AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    return tok


def unigram_xlmr(sp):
    """xlm-roberta-base as on the hub (XLMRobertaConverter of transformers before 4.36, when
    SpmConverter.normalizer was Precompiled + Replace(" {2,}", " ")): <s> <pad> </s> <unk> then
    the pieces (fairseq offset 1), <mask> last with lstrip; Metaspace; <s> $A </s>."""
    tok = _xlmr_converted(sp)
    charsmap = _charsmap(sp)
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(charsmap),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    return tok


def unigram_xlmr_conv(sp):
    """XLMRobertaConverter as transformers 4.36+ and 5 have it: normalizer Precompiled +
    Strip(right) + Replace(" {2,}", "▁"); otherwise as unigram_xlmr."""
    return _xlmr_converted(sp)


def _charsmap(sp):
    from transformers.convert_slow_tokenizer import import_protobuf

    proto = import_protobuf().ModelProto()
    proto.ParseFromString(sp)
    return proto.normalizer_spec.precompiled_charsmap


def unigram_xlmr_v5(sp):
    """transformers 5's XLMRobertaTokenizer from sentencepiece.bpe.model: Precompiled only,
    WhitespaceSplit + Metaspace, <mask> without lstrip."""
    return _v5_from_model("XLMRobertaTokenizer", sp, "sentencepiece.bpe.model")


def unigram_albert(sp):
    """albert-base-v2 as on the hub (AlbertConverter, do_lower_case, no keep_accents):
    Replace `` and '' by ", NFKD, StripAccents, Lowercase, Precompiled, Replace(" {2,}", " "),
    Metaspace, [CLS] $A [SEP]; [MASK] with lstrip; scores of "<digit>," pieces lowered by 100."""
    from transformers.convert_slow_tokenizer import AlbertConverter

    ids = {"<pad>": 0, "<unk>": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    tok = _converted(AlbertConverter, _Slow(sp, ids, do_lower_case=True, keep_accents=False,
                                            add_prefix_space=True))
    _specials(tok, ["<pad>", "<unk>", "[CLS]", "[SEP]",
                    AddedToken("[MASK]", lstrip=True, special=True, normalized=False)])
    return tok


def unigram_albert_v5(sp):
    """transformers 5's AlbertTokenizer from spiece.model."""
    return _v5_from_model("AlbertTokenizer", sp, "spiece.model")


def unigram_debertav3(sp):
    """deberta-v3-base as on the hub (DebertaV2Converter, split_by_punct false, cased): Strip,
    Precompiled, Replace(" {2,}", " "); Sequence[Metaspace]; [CLS] $A [SEP]; [MASK] added last."""
    from transformers.convert_slow_tokenizer import DebertaV2Converter

    ids = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[UNK]": 3}
    tok = _converted(DebertaV2Converter, _Slow(sp, ids, do_lower_case=False, split_by_punct=False,
                                                add_prefix_space=True))
    _specials(tok, ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"])
    return tok


def unigram_bytefallback_v5(sp):
    """A unigram .model with byte_fallback through transformers 5's generic SentencePiece import
    (SpmConverter.build_tokenizer_from_spm_proto, what AutoTokenizer does for a .model whose
    model has no tokenizer class): Unigram(byte_fallback), Precompiled, Replace("▁"), Metaspace,
    decoder with ByteFallback."""
    from transformers.convert_slow_tokenizer import SentencePieceExtractor, SpmConverter

    d = tempfile.mkdtemp()
    try:
        path = os.path.join(d, "tokenizer.model")
        with open(path, "wb") as f:
            f.write(sp)
        proto = SentencePieceExtractor(path).proto
    finally:
        shutil.rmtree(d)
    vocab = [(p.piece, p.score) for p in proto.pieces]
    tok = SpmConverter.build_tokenizer_from_spm_proto(proto=proto, vocab=vocab, legacy=True)
    _specials(tok, ["<unk>", "<s>", "</s>"])
    return tok


TRAINED = ["wordpiece_bert", "bpe_gpt2", "bpe_roberta", "bpe_llama3", "bpe_qwen2", "bpe_smollm"]
SPM = [("spbpe_llama2", "llama2"), ("spbpe_llama2_metaspace_v5", "llama2"),
       ("unigram_xlmr", "xlmr"), ("unigram_xlmr_conv", "xlmr"), ("unigram_xlmr_v5", "xlmr"),
       ("unigram_albert", "albert"),
       ("unigram_albert_v5", "albert"), ("unigram_debertav3", "debertav3"),
       ("unigram_bytefallback_v5", "unigram_bf")]
NAMES = TRAINED + [n for n, _ in SPM]


def build_all(texts):
    """name -> tokenizers.Tokenizer, plus the SentencePiece model protos (name -> bytes)."""
    out = {}
    for name in TRAINED:
        out[name] = globals()[name](texts)
    sps = spm_models(texts)
    for name, sp in SPM:
        out[name] = globals()[name](sps[sp])
    return out, sps


def save_compact(tok, path):
    """tokenizers' save, re-written compactly (ensure_ascii false) to keep the files small."""
    j = json.loads(tok.to_str())
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


# ---- summaries ----------------------------------------------------------------------------------

def _brief(node):
    if node is None:
        return "none"
    t = node.get("type")
    if t == "Sequence":
        inner = node.get("normalizers") or node.get("pretokenizers") or node.get("decoders") or \
            node.get("processors") or []
        return "Sequence[" + ", ".join(_brief(n) for n in inner) + "]"
    keep = {k: v for k, v in node.items() if k not in ("type", "precompiled_charsmap", "single",
                                                        "pair", "special_tokens")}
    if t == "TemplateProcessing":
        seq = []
        for piece in node["single"]:
            if "SpecialToken" in piece:
                seq.append(piece["SpecialToken"]["id"])
            else:
                seq.append("$" + piece["Sequence"]["id"])
        return "TemplateProcessing(%s)" % " ".join(seq)
    if t == "Precompiled":
        return "Precompiled(%d bytes)" % (len(node["precompiled_charsmap"] or "") * 3 // 4)
    if keep.get("pattern"):
        keep["pattern"] = list(keep["pattern"].values())[0]
    args = ", ".join("%s=%s" % (k, json.dumps(v, ensure_ascii=False)) for k, v in keep.items())
    return "%s(%s)" % (t, args) if args else t


def summary(name, tok):
    j = json.loads(tok.to_str())
    m = j["model"]
    flags = [k for k in ("byte_fallback", "fuse_unk", "ignore_merges") if m.get(k)]
    added = ["%s%s" % (a["content"], "(lstrip)" if a["lstrip"] else "") for a in j["added_tokens"]]
    lines = ["%s: %s, vocab %d%s" % (name, m["type"], tok.get_vocab_size(),
                                     (" (" + ", ".join(flags) + ")") if flags else ""),
             "    normalizer:     " + _brief(j["normalizer"]),
             "    pre_tokenizer:  " + _brief(j["pre_tokenizer"]),
             "    post_processor: " + _brief(j["post_processor"]),
             "    decoder:        " + _brief(j["decoder"]),
             "    added tokens:   " + " ".join(added)]
    return "\n".join(lines)


# ---- fixtures -----------------------------------------------------------------------------------

def write_fixtures(texts, toks):
    os.makedirs(PARITY, exist_ok=True)
    n = 0
    with open(CASES, "w", encoding="utf-8") as f:
        for name in NAMES:
            path = os.path.join(PARITY, name + ".json")
            save_compact(toks[name], path)
            tok = Tokenizer.from_file(path)  # the ids come from the file as saved
            for i, text in enumerate(texts):
                ids = tok.encode(text).ids
                nospecial = tok.encode(text, add_special_tokens=False).ids
                rec = {"tok": name, "line": i, "ids": ids, "ids_nospecial": nospecial,
                       "decode": tok.decode(nospecial, skip_special_tokens=False)
                       .encode("utf-8").hex(),
                       "decode_skip": tok.decode(ids, skip_special_tokens=True)
                       .encode("utf-8").hex()}
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
                n += 1
    return n


# ---- random strings: a built libnopad.so against HF ---------------------------------------------

POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r\x0b\x0c",
    "'sStTmMdDlLrRvVe", ".,;:!?-_()[]{}<>/\\@#$%^&*+=|~`\"", "éèêëàâäôöûüçñßÀÉÎÕÜ",
    "\u0301\u0308\u0323\u200d\u200b\ufeff", "漢字中文测试かなカナ한국어", "مرحبا العربي",
    "नमस्ते हिन्दी", "😀👍🏽👨‍👩‍👧🇫🇷❤️", "\x85\xa0\u2028\u2029\u3000\u1680\u2007\u202f\u205f",
    "٣٤٥½Ⅻ²³¼", "\x00\x01\x1b\x7f", "ǅǈǋ\u0345\U0001d400\U00010400", "ʰʱˆ\u02b0\u3005\u16ee",
    "ﬁﬂ㎏①ⅫＡＢ１ｶﾞ", "▁Ġ▁▁ĊĠĠ", "``''“”‘’„", "각각한글", "שָׁלוֹם", "ไทยภาษา", "Ωμέγα Ђђ",
]
SPECIAL_STRINGS = ["<s>", "</s>", "<unk>", "<pad>", "<mask>", "[CLS]", "[SEP]", "[MASK]",
                   "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<0x41>"]


def random_text(rng, every):
    parts = []
    for _ in range(rng.randint(0, 40)):
        r = rng.random()
        if r < 0.03:
            parts.append(rng.choice(SPECIAL_STRINGS))
        elif r < 0.73:
            parts.append(rng.choice(POOLS[rng.randrange(len(POOLS))]))
        else:
            parts.append(rng.choice(every))
    return "".join(parts)


class Nopad:
    def __init__(self, library):
        lib = ctypes.CDLL(library)
        lib.nopad_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.nopad_tokenizer_load.restype = ctypes.c_int
        lib.nopad_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                       ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32),
                                       ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]
        lib.nopad_tokenize.restype = ctypes.c_int
        lib.nopad_tokenizer_free.argtypes = [ctypes.c_void_p]
        lib.nopad_tokenize_default_params.restype = _Params
        lib.nopad_last_error.restype = ctypes.c_char_p
        self.lib = lib

    def load(self, tokenizer_json):
        """A nopad tokenizer handle, or the error message when nopad refuses the file."""
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(tokenizer_json, os.path.join(d, "tokenizer.json"))
            tok = ctypes.c_void_p()
            if self.lib.nopad_tokenizer_load(d.encode(), ctypes.byref(tok)) != 0:
                err = (self.lib.nopad_last_error() or b"").decode("utf-8", "replace")
                return None, err.replace(os.path.join(d, "tokenizer.json") + ": ", "")
        return tok, None


class _Params(ctypes.Structure):
    _fields_ = [("add_special_tokens", ctypes.c_int), ("truncate", ctypes.c_int),
                ("max_length", ctypes.c_int32)]


def random_check(n, library, seed, only):
    nopad = Nopad(library)
    every = "".join(POOLS)
    cap = 1 << 16
    ids, got = (ctypes.c_int32 * cap)(), ctypes.c_int32()
    nospecial = nopad.lib.nopad_tokenize_default_params()
    nospecial.add_special_tokens = 0
    total_bad = 0
    start = time.monotonic()
    # one line per tokenizer as it finishes (flushed: a long run shows it is moving)
    for name in only or NAMES:
        path = os.path.join(PARITY, name + ".json")
        tok, err = nopad.load(path)
        if tok is None:
            print("%-28s unsupported: %s" % (name, err.splitlines()[0] if err else "?"), flush=True)
            continue
        hf = Tokenizer.from_file(path)
        rng = random.Random(seed)
        bad = shown = 0
        for _ in range(n):
            text = random_text(rng, every)
            raw = text.encode("utf-8")
            diff = []
            for params, want in ((None, hf.encode(text).ids),
                                 (ctypes.byref(nospecial),
                                  hf.encode(text, add_special_tokens=False).ids)):
                st = nopad.lib.nopad_tokenize(tok, raw, len(raw), params, ids, cap,
                                              ctypes.byref(got))
                mine = list(ids[:got.value]) if st == 0 else None
                if mine != want:
                    diff.append((params is not None, st, mine, want))
            if diff:
                bad += 1
                if shown < 3:
                    shown += 1
                    nospec, st, mine, want = diff[0]
                    print("%s%s: %r\n    nopad %s (status %d)\n    HF    %s" % (
                        name, " (no specials)" if nospec else "", text, mine, st, want))
        nopad.lib.nopad_tokenizer_free(tok)
        print("%-28s %d random strings, %d differ from HF (%.0f s)" % (
            name, n, bad, time.monotonic() - start), flush=True)
        total_bad += bad
    return total_bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--random", type=int, default=0, metavar="N",
                    help="compare libnopad.so with HF on N random strings per tokenizer "
                         "($NOPAD_RANDOM_STRINGS, when set, replaces N)")
    ap.add_argument("--library", default="build/libnopad.so")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", nargs="*", help="tokenizer names (default: all)")
    ap.add_argument("--summary", action="store_true", help="build and print, write nothing")
    args = ap.parse_args()
    if args.random:
        n = int(os.environ.get("NOPAD_RANDOM_STRINGS") or args.random)
        raise SystemExit(1 if random_check(n, args.library, args.seed, args.only) else 0)
    texts = corpus_texts()
    toks, _ = build_all(texts)
    for name in NAMES:
        print(summary(name, toks[name]))
    if args.summary:
        return
    n = write_fixtures(texts, toks)
    size = os.path.getsize(CASES)
    print("wrote %d tokenizers to %s and %d cases (%.1f MB) to %s" % (
        len(NAMES), os.path.relpath(PARITY, ROOT), n, size / 1e6, os.path.relpath(CASES, ROOT)))


if __name__ == "__main__":
    main()
