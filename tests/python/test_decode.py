"""Tokenizer.decode, Tokenizer.decode_stream and Tokenizer.kind against Hugging Face's decode (the
decode fields of the fixtures: scripts/make_bpe_fixtures.py, scripts/make_decode_fixtures.py and
the parity fixtures of every tokenizer family)."""
import json
import os
import shutil

import numpy as np
import pytest

import nopad
from conftest import REPO

DATA = os.path.join(REPO, "tests", "data", "tokenizer")


def folder(tmp_path, src, name="tokenizer.json"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, tmp_path / name)
    return tmp_path


def streamed(tok, ids, skip=False):
    """The chunks of a decode stream over ids, and the flush."""
    with tok.decode_stream(skip_special_tokens=skip) as stream:
        chunks = [stream.step(i) for i in ids]
        chunks.append(stream.flush())
    assert all(isinstance(c, str) for c in chunks)
    return chunks


def test_byte_level_bpe_decodes_equal_hf(tmp_path):
    roberta = nopad.Tokenizer(folder(tmp_path / "r", os.path.join(DATA, "bpe_roberta.json")))
    gpt2 = nopad.Tokenizer(folder(tmp_path / "g", os.path.join(DATA, "bpe_gpt2.json")))
    with roberta, gpt2:
        assert roberta.kind == gpt2.kind == "bpe-byte-level"
        with open(os.path.join(DATA, "bpe_cases.jsonl"), encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                want = bytes.fromhex(rec["decode_roberta"]).decode("utf-8")
                assert roberta.decode(rec["roberta"]) == want
                assert "".join(streamed(roberta, rec["roberta"])) == want
                want_skip = bytes.fromhex(rec["decode_roberta_skip"]).decode("utf-8")
                assert roberta.decode(np.array(rec["roberta"]), skip_special_tokens=True) == want_skip
                assert "".join(streamed(roberta, rec["roberta"], skip=True)) == want_skip
                assert gpt2.decode(rec["gpt2"]) == bytes.fromhex(rec["decode_gpt2"]).decode("utf-8")


def test_every_decoder_type_equals_hf(tmp_path):
    with open(os.path.join(DATA, "decode_cases.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    for k, rec in enumerate(records):
        d = tmp_path / str(k)
        d.mkdir()
        (d / "tokenizer.json").write_text(rec["tokenizer"], encoding="utf-8")
        with nopad.Tokenizer(d) as tok:
            for ids, want, want_skip in rec["cases"]:
                assert tok.decode(ids) == bytes.fromhex(want).decode("utf-8"), (rec["name"], ids)
                assert tok.decode(ids, True) == bytes.fromhex(want_skip).decode("utf-8"), rec["name"]


def test_parity_fixtures_decode_equal_hf(tmp_path):
    path = os.path.join(DATA, "parity_cases.jsonl")
    if not os.path.exists(path):
        pytest.skip("no tokenizer/parity_cases.jsonl")
    toks = {}
    checked = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            name = rec["tok"]
            if name not in toks:
                try:
                    toks[name] = nopad.Tokenizer(folder(tmp_path / name,
                                                        os.path.join(DATA, "parity", name + ".json")))
                except nopad.UnsupportedError:
                    toks[name] = None
            tok = toks[name]
            if tok is None:
                continue
            want = bytes.fromhex(rec["decode"]).decode("utf-8")
            assert tok.decode(rec["ids_nospecial"]) == want, (name, rec["line"])
            assert "".join(streamed(tok, rec["ids_nospecial"])) == want, (name, rec["line"])
            want_skip = bytes.fromhex(rec["decode_skip"]).decode("utf-8")
            assert tok.decode(rec["ids"], skip_special_tokens=True) == want_skip
            checked += 1
    kinds = {name: tok.kind for name, tok in toks.items() if tok is not None}
    for name, tok in toks.items():
        if tok is not None:
            tok.close()
    assert checked > 0
    for name, kind in kinds.items():
        family = name.split("_")[0]
        assert kind == {"wordpiece": "wordpiece", "bpe": "bpe-byte-level",
                        "spbpe": "bpe-sentencepiece", "unigram": "unigram"}[family], name


def test_stream_holds_back_a_split_emoji(tmp_path):
    with nopad.Tokenizer(folder(tmp_path, os.path.join(DATA, "bpe_gpt2.json"))) as tok:
        # GPT-2's byte characters of F0 9F 98 80 (U+1F600)
        parts = [tok.token_to_id(c) for c in ("ð", "Ł", "ĺ", "Ģ")]
        a = tok.token_to_id("a")
        stream = tok.decode_stream()
        assert [stream.step(i) for i in [a] + parts + [a]] == ["a", "", "", "", "😀", "a"]
        assert stream.step(parts[0]) == ""
        assert stream.flush() == "\ufffd"  # unfinished at the end, as decode gives it
        assert tok.decode(parts[:1]) == "\ufffd"
        assert stream.step(a) == "a"  # afresh after the flush
        stream.close()
        stream.close()
        assert stream.closed
        with pytest.raises(nopad.InvalidArgumentError, match="closed"):
            stream.step(a)


def test_bad_ids(tmp_path):
    with nopad.Tokenizer(folder(tmp_path, os.path.join(DATA, "bpe_roberta.json"))) as tok:
        V = tok.vocab_size
        with pytest.raises(nopad.InvalidArgumentError, match="id %d at position 1 is outside the "
                                                             "vocabulary" % V):
            tok.decode([0, V])
        with pytest.raises(nopad.InvalidArgumentError, match="id -1"):
            tok.decode([-1])
        with pytest.raises(nopad.InvalidArgumentError, match="id 1099511627776 at position 0"):
            tok.decode([2**40])
        with pytest.raises(TypeError):
            tok.decode("abc")
        with pytest.raises(TypeError):
            tok.decode([1.5])
        assert tok.decode([]) == ""
        stream = tok.decode_stream()
        assert stream.step(tok.token_to_id("h")) == "h"
        with pytest.raises(nopad.InvalidArgumentError, match="outside the vocabulary"):
            stream.step(V)
        with pytest.raises(nopad.InvalidArgumentError, match="outside the vocabulary"):
            stream.step(2**40)
        with pytest.raises(TypeError):
            stream.step("1")
        assert stream.step(tok.token_to_id("i")) == "i"  # the stream carries on
    with pytest.raises(nopad.InvalidArgumentError, match="closed"):
        stream.step(1)  # its tokenizer is closed


def test_unsupported_decoder_still_encodes(tmp_path):
    j = json.load(open(os.path.join(DATA, "small_tokenizer.json"), encoding="utf-8"))
    j["decoder"] = {"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "NoSuchDecoder"}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(j), encoding="utf-8")
    with nopad.Tokenizer(tmp_path) as tok:
        ids = tok.encode("hello world")
        assert tok.kind == "wordpiece"
        with pytest.raises(nopad.UnsupportedError, match="NoSuchDecoder"):
            tok.decode(ids)
        with pytest.raises(nopad.UnsupportedError, match="NoSuchDecoder"):
            tok.decode_stream()


def test_minilm_round_trip(minilm):
    tok = minilm.tokenizer
    assert tok.kind == "wordpiece"
    ids = tok.encode("Hello, World! Padding-free inference isn't slow.")
    # HF tokenizers 0.23.3 on the folder's tokenizer.json (cleanup looks inside one token only)
    assert tok.decode(ids) == "[CLS] hello, world! padding - free inference isn ' t slow. [SEP]"
    assert tok.decode(ids, skip_special_tokens=True) == \
        "hello, world! padding - free inference isn ' t slow."
    assert "".join(streamed(tok, ids, skip=True)) == tok.decode(ids, skip_special_tokens=True)


def test_token_bytes(tmp_path):
    """Tokenizer.token_bytes: a text's ids give back its bytes, characters split across ids
    included; a special token has none; WordPiece refuses (its spacing depends on neighbours)."""
    text = "Caf\u00e9 \u20ac5 \U0001F600 na\u00efve"
    with nopad.Tokenizer(folder(tmp_path, os.path.join(DATA, "bpe_gpt2.json"))) as tok:
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
        assert any(len(tok.token_bytes(i)) == 1 and tok.token_bytes(i)[0] >= 0x80 for i in ids)  # a split character
        with pytest.raises(nopad.InvalidArgumentError):
            tok.token_bytes(tok.vocab_size)
    with nopad.Tokenizer(folder(tmp_path / "r", os.path.join(DATA, "bpe_roberta.json"))) as tok:
        assert tok.token_bytes(tok.token_to_id("<s>")) == b""
        assert tok.token_bytes(tok.token_to_id("\u0120th")) == b" th"
    with nopad.Tokenizer(folder(tmp_path / "w", os.path.join(DATA, "small_tokenizer.json"))) as tok:
        with pytest.raises(nopad.UnsupportedError):
            tok.token_bytes(tok.token_to_id("un"))


def test_id_to_token(tmp_path):
    with nopad.Tokenizer(folder(tmp_path, os.path.join(DATA, "bpe_roberta.json"))) as tok:
        for token in ("<s>", "<mask>", "Ġth", "a"):
            assert tok.id_to_token(tok.token_to_id(token)) == token
        assert tok.id_to_token(-1) is None
        assert tok.id_to_token(tok.vocab_size) is None
        with pytest.raises(TypeError):
            tok.id_to_token("1")
