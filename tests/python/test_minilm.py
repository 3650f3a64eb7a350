"""The real all-MiniLM-L6-v2 (NOPAD_MINILM_DIR) against sentence-transformers' outputs
(tests/data/minilm) and the CLI."""
import subprocess
import threading

import numpy as np
import pytest

import nopad
from conftest import DATA, load_safetensors, read_lines, row_rel_err

MINI = DATA / "minilm"


@pytest.fixture(scope="module")
def sentences():
    return [l.decode("utf-8") for l in read_lines(MINI / "sentences.txt")]


@pytest.fixture(scope="module")
def expected():
    return load_safetensors(MINI / "expected.safetensors")


def cosines(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_info(minilm):
    i = minilm.info
    assert (i.family, i.hidden_size, i.num_layers, i.num_heads, i.vocab_size) == \
        ("BERT", 384, 6, 12, 30522)
    assert (i.pooling, i.normalize, i.max_seq_length) == ("mean", True, 256)
    assert i.tokenizer_kind == "tokenizer.json"


def test_tokenizer_ids_equal_huggingface(minilm, minilm_dir, sentences, expected):
    for tok in (minilm.tokenizer, nopad.Tokenizer(minilm_dir)):
        ids, cu = tok.encode_batch(sentences)
        assert ids.dtype == np.int32 and cu.dtype == np.int32
        np.testing.assert_array_equal(ids, expected["input_ids"])
        np.testing.assert_array_equal(cu, expected["cu_seqlens"])
        for b in (0, 7, 45):
            assert tok.encode(sentences[b]) == \
                expected["input_ids"][cu[b]:cu[b + 1]].tolist()
    tok = minilm.tokenizer
    assert tok.vocab_size == 30522 == len(tok)
    assert tok.token_to_id("[CLS]") == 101 and tok.token_to_id("no such token") is None
    assert tok.encode("Hello world", add_special_tokens=False) == [7592, 2088]
    assert tok.encode("Hello world".encode()) == [101, 7592, 2088, 102]


def test_encode_equals_sentence_transformers(minilm, sentences, expected):
    emb = minilm.encode(sentences)
    assert emb.shape == (46, 384) and emb.dtype == np.float32
    assert cosines(emb, expected["embeddings"]).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    one = minilm.encode(sentences[3])
    assert one.shape == (384,)
    np.testing.assert_allclose(one, emb[3], atol=2e-6)


def test_forward_equals_huggingface(minilm, expected):
    hidden = minilm.forward(expected["input_ids"], expected["cu_seqlens"])
    assert row_rel_err(hidden, expected["last_hidden_state"]) <= 1e-4


def test_batching_by_token_budget(minilm, sentences):
    ref = minilm.encode(sentences)
    for budget in (1, 100, 977):
        np.testing.assert_allclose(minilm.encode(sentences, batch_tokens=budget), ref,
                                   rtol=0, atol=2e-6)


def test_pooling_and_normalize_options(minilm, sentences, expected):
    ids, cu = expected["input_ids"], expected["cu_seqlens"]
    hidden = minilm.forward(ids, cu)
    mean = np.stack([hidden[cu[b]:cu[b + 1]].mean(0) for b in range(len(cu) - 1)])
    np.testing.assert_allclose(minilm.encode(sentences, normalize=False), mean, atol=2e-6)
    cls = minilm.encode(sentences, pooling="cls")
    np.testing.assert_allclose(cls, hidden[cu[:-1]] / np.linalg.norm(hidden[cu[:-1]], axis=1,
                                                                     keepdims=True), atol=2e-6)
    rows = minilm.encode(sentences[:3], pooling="none")
    assert [r.shape for r in rows] == [(cu[b + 1] - cu[b], 384) for b in range(3)]
    # the same rows from batches of 3 and of 12 sentences: OpenBLAS blocks the GEMMs by the token
    # count, so fp32 sums run in another order (seen: 2.4e-6 on values of order 1)
    np.testing.assert_allclose(np.concatenate(rows), hidden[:cu[3]], atol=5e-6)


def test_too_long_texts(minilm, minilm_dir):
    long_lines = [l.decode("utf-8") for l in read_lines(MINI / "long.txt")]
    want = load_safetensors(MINI / "long_expected.safetensors")
    with pytest.raises(nopad.TooLongError) as e:
        minilm.encode(long_lines)
    assert "sentence 0" in str(e.value) and "286 tokens" in str(e.value) and "256" in str(e.value)
    assert "truncate=True" in str(e.value) and e.value.status == nopad.Status.TOO_LONG
    emb = minilm.encode(long_lines, truncate=True)
    assert cosines(emb, want["embeddings"]).min() >= 0.9999
    tok = minilm.tokenizer
    ids, cu = tok.encode_batch(long_lines, truncate=True, max_length=256)
    np.testing.assert_array_equal(ids, want["input_ids"])
    np.testing.assert_array_equal(cu, want["cu_seqlens"])
    ids, cu = tok.encode_batch(long_lines)
    np.testing.assert_array_equal(ids, want["untruncated_input_ids"])
    np.testing.assert_array_equal(cu, want["untruncated_cu_seqlens"])
    with pytest.raises(nopad.TooLongError, match="text 1: 842 tokens, more than max_length 300"):
        tok.encode_batch(long_lines, max_length=300)


def test_encode_equals_cli(minilm, minilm_dir, cli, tmp_path):
    src = MINI / "sentences.txt"
    out = tmp_path / "emb.npy"
    subprocess.run([cli, "embed", "--model", str(minilm_dir), "--input", str(src), "--output",
                    str(out)], check=True)
    want = np.load(out)
    got = minilm.encode(read_lines(src))  # the same bytes
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_threads_share_an_encoder(minilm, sentences):
    """The GIL is released during forwards; concurrent calls give the same answers."""
    ref = minilm.encode(sentences)
    results, errors = [None] * 4, []

    def work(k):
        try:
            results[k] = minilm.encode(sentences)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for r in results:
        np.testing.assert_allclose(r, ref, rtol=0, atol=1e-6)
