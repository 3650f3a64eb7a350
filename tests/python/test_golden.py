"""Encoder.forward on the foundation fixtures (tests/data/models/*/golden.safetensors): equal to
Hugging Face's outputs, to the C API called from C, and to the CLI."""
import os
import subprocess

import numpy as np
import pytest

import nopad
from nopad import _native
from conftest import GOLDEN_MODELS, MODELS, ST_MODELS, load_safetensors, row_rel_err


@pytest.fixture(scope="module", params=GOLDEN_MODELS)
def case(request):
    name = request.param
    g = load_safetensors(MODELS / name / "golden.safetensors")
    with nopad.Encoder(MODELS / name) as enc:
        yield name, enc, g


def test_forward_equals_huggingface(case):
    name, enc, g = case
    hidden = enc.forward(g["input_ids"], g["cu_seqlens"], g["token_type_ids"])
    assert hidden.dtype == np.float32 and hidden.shape == g["last_hidden_state"].shape
    assert row_rel_err(hidden, g["last_hidden_state"]) <= 1e-4, name


@pytest.mark.parametrize("name", ST_MODELS)
def test_pooled_equals_sentence_transformers(name):
    g = load_safetensors(MODELS / name / "golden.safetensors")
    with nopad.Encoder(MODELS / name) as enc:  # the folder's pooling and normalisation
        pooled = enc.forward(g["input_ids"], g["cu_seqlens"], g["token_type_ids"], pooling=None)
    assert pooled.shape == g["pooled"].shape
    assert row_rel_err(pooled, g["pooled"]) <= 1e-4, name


def test_forward_equals_c_api(case, capi_helper, tmp_path):
    name, enc, g = case
    ids, cu = g["input_ids"].astype(np.int32), g["cu_seqlens"].astype(np.int32)
    ids.tofile(tmp_path / "ids.bin")
    cu.tofile(tmp_path / "cu.bin")
    H = enc.info.hidden_size
    # the same OpenBLAS kernels as this process (the package may have picked faster ones)
    env = dict(os.environ, OPENBLAS_CORETYPE=_native._corename(_native.library()) or "")
    for pooling, code in (("none", 0), (None, -1)):
        subprocess.run([str(capi_helper), "encode", str(MODELS / name), str(tmp_path / "ids.bin"),
                        str(tmp_path / "cu.bin"), str(code), str(tmp_path / "out.bin")],
                       check=True, env=env)
        want = np.fromfile(tmp_path / "out.bin", dtype=np.float32).reshape(-1, H)
        got = enc.forward(ids, cu, pooling=pooling)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_forward_equals_cli(case, cli, tmp_path):
    name, enc, g = case
    ids, cu = g["input_ids"], g["cu_seqlens"]
    lines = [" ".join(str(int(i)) for i in ids[cu[b]:cu[b + 1]]) for b in range(len(cu) - 1)]
    (tmp_path / "ids.txt").write_text("\n".join(lines) + "\n")
    for pooling in ("none", "cls", "mean", "max"):
        out = tmp_path / ("%s.npy" % pooling)
        subprocess.run([cli, "embed", "--model", str(MODELS / name), "--ids", "--input",
                        str(tmp_path / "ids.txt"), "--pooling", pooling, "--format", "npy",
                        "--output", str(out)], check=True)
        want = np.load(out)
        got = enc.forward(ids, cu, pooling=pooling)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_input_types_and_out(case):
    """int64, lists, torch tensors and out= give the same result; int32 input is not copied."""
    name, enc, g = case
    ids, cu = g["input_ids"].astype(np.int32), g["cu_seqlens"].astype(np.int32)
    ref = enc.forward(ids, cu)
    np.testing.assert_array_equal(enc.forward(ids.astype(np.int64), cu.astype(np.int64)), ref)
    np.testing.assert_array_equal(enc.forward(ids.tolist(), cu.tolist()), ref)
    out = np.full_like(ref, np.nan)
    assert enc.forward(ids, cu, out=out) is out
    np.testing.assert_array_equal(out, ref)
    torch = pytest.importorskip("torch")
    t = enc.forward(torch.from_numpy(ids), torch.from_numpy(cu))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    np.testing.assert_array_equal(t.numpy(), ref)
    t64 = enc.forward(torch.from_numpy(ids).long(), torch.from_numpy(cu).long())
    np.testing.assert_array_equal(t64.numpy(), ref)


def test_one_sequence_at_a_time_equals_the_batch(case):
    name, enc, g = case
    ids, cu = g["input_ids"], g["cu_seqlens"]
    batch = enc.forward(ids, cu, pooling="mean")
    for b in range(len(cu) - 1):
        one = enc.forward(ids[cu[b]:cu[b + 1]], [0, cu[b + 1] - cu[b]], pooling="mean")
        np.testing.assert_allclose(one[0], batch[b], rtol=0, atol=2e-5)


def test_padded_entry_equals_packed(case):
    name, enc, g = case
    ids, cu, types = g["input_ids"], g["cu_seqlens"], g["token_type_ids"]
    lens = np.diff(cu)
    B, S = len(lens), int(lens.max())
    padded = np.zeros((B, S), np.int32)
    ptypes = np.zeros((B, S), np.int32)
    mask = np.zeros((B, S), np.int64)
    for b in range(B):
        padded[b, :lens[b]] = ids[cu[b]:cu[b + 1]]
        ptypes[b, :lens[b]] = types[cu[b]:cu[b + 1]]
        mask[b, :lens[b]] = 1
    packed = enc.forward(ids, cu, types)
    out = enc.forward_padded(padded, attention_mask=mask, token_type_ids=ptypes)
    assert out.shape == (B, S, enc.info.hidden_size)
    for b in range(B):
        np.testing.assert_array_equal(out[b, :lens[b]], packed[cu[b]:cu[b + 1]])
        assert not out[b, lens[b]:].any()
    pooled = enc.forward_padded(padded, lengths=lens, token_type_ids=ptypes, pooling="max")
    np.testing.assert_array_equal(pooled, enc.forward(ids, cu, types, pooling="max"))


@pytest.mark.parametrize("name", ST_MODELS)
def test_info_of_sentence_transformers_folders(name):
    want = {"st_mean_norm": ("mean", True, 20), "st_max": ("max", False, 16),
            "st_cls_v6": ("cls", True, 18)}[name]
    with nopad.Encoder(MODELS / name) as enc:
        i = enc.info
        assert (i.pooling, i.normalize, i.max_seq_length) == want
        assert (i.family, i.hidden_size, i.num_layers, i.num_heads) == ("BERT", 48, 2, 4)
        assert i.has_tokenizer and enc.tokenizer is not None
        assert i.as_dict()["hidden_size"] == 48


def test_info_of_every_family():
    want = {"bert_a": ("BERT", 48, 16 * 0 + 48, 2, 4, 12, 72, 211),
            "albert_a": ("ALBERT", 48, 16, 2, 4, 12, 100, 120),
            "distilbert_a": ("DistilBERT", 48, 48, 2, 3, 16, 72, 130),
            "roberta_a": ("RoBERTa", 36, 36, 2, 3, 12, 100, 250)}
    for name, w in want.items():
        with nopad.Encoder(MODELS / name) as enc:
            i = enc.info
            got = (i.family, i.hidden_size, i.embedding_size, i.num_layers, i.num_heads,
                   i.head_size, i.intermediate_size, i.vocab_size)
            assert got == w, name
            assert i.device == "cpu" and i.compute_dtype == "F32" and i.n_params > 0
            assert not i.has_tokenizer and enc.tokenizer is None
    with nopad.Encoder(MODELS / "bert_b") as enc:
        assert enc.info.weights_dtype == "F16"
