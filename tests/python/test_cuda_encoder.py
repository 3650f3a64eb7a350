"""Encoder on device="cuda" (skipped without a GPU and a CUDA build of libnopad): torch CUDA tensors
in and out without copies, equal to the host entry and within the CUDA issue's bounds of Hugging
Face (row-relative 5e-3 fp16, 2e-2 bf16; MiniLM cosine >= 0.9999)."""
import numpy as np
import pytest

import nopad
from conftest import GOLDEN_MODELS, MODELS, load_safetensors, row_rel_err

torch = pytest.importorskip("torch")

DTYPES = {"fp16": (torch.float16, 5e-3), "bf16": (torch.bfloat16, 2e-2)}


def _cuda_build():
    if not torch.cuda.is_available():
        return False
    try:
        nopad.Encoder(MODELS / "bert_a", device="cuda", dtype="fp16").close()
    except nopad.UnsupportedError:  # a CPU build: "no CUDA backend"
        return False
    return True


pytestmark = pytest.mark.skipif(not _cuda_build(),
                                reason="needs a CUDA GPU and libnopad built with NOPAD_CUDA")


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", GOLDEN_MODELS)
def test_device_forward_equals_huggingface_and_host_entry(name, dtype):
    tdtype, bound = DTYPES[dtype]
    g = load_safetensors(MODELS / name / "golden.safetensors")
    with nopad.Encoder(MODELS / name, device="cuda", dtype=dtype) as enc:
        assert enc.info.device == "cuda"
        assert enc.info.compute_dtype == {"fp16": "F16", "bf16": "BF16"}[dtype]
        ids = torch.from_numpy(g["input_ids"]).cuda()
        cu = torch.from_numpy(g["cu_seqlens"]).cuda()
        types = torch.from_numpy(g["token_type_ids"]).cuda()
        lens = np.diff(g["cu_seqlens"])
        hidden = enc.forward(ids, cu, types, max_seqlen=int(lens.max()))
        assert hidden.is_cuda and hidden.dtype == tdtype
        assert tuple(hidden.shape) == g["last_hidden_state"].shape
        got = hidden.float().cpu().numpy()
        assert row_rel_err(got, g["last_hidden_state"]) <= bound, name
        host = enc.forward(g["input_ids"], g["cu_seqlens"], g["token_type_ids"])  # numpy entry
        assert row_rel_err(got, host) <= 1e-6
        if "pooled" in g:
            pooled = enc.forward(ids, cu, types, pooling=None)  # max_seqlen read from cu
            assert row_rel_err(pooled.float().cpu().numpy(), g["pooled"]) <= bound


def test_out_is_written_in_place_and_streams_are_ordered():
    g = load_safetensors(MODELS / "bert_a" / "golden.safetensors")
    with nopad.Encoder(MODELS / "bert_a", device="cuda", dtype="fp16") as enc:
        ids = torch.from_numpy(g["input_ids"]).cuda()
        cu = torch.from_numpy(g["cu_seqlens"]).cuda()
        want = enc.forward(g["input_ids"], g["cu_seqlens"])
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            out = torch.full((ids.numel(), 48), float("nan"), dtype=torch.float16, device="cuda")
            got = enc.forward(ids, cu, out=out, max_seqlen=40)
            copy = got.float() * 1  # work on the caller's stream, after the encoder's
        s.synchronize()
        assert got is out and got.data_ptr() == out.data_ptr()
        assert row_rel_err(copy.cpu().numpy(), want) <= 1e-6
        # int64 ids are converted on the GPU; the result is the same
        got64 = enc.forward(ids.long(), cu.long(), max_seqlen=40)
        torch.cuda.synchronize()
        assert row_rel_err(got64.float().cpu().numpy(), want) <= 1e-6


def test_encoder_on_a_given_stream():
    g = load_safetensors(MODELS / "st_mean_norm" / "golden.safetensors")
    s = torch.cuda.Stream()
    with nopad.Encoder(MODELS / "st_mean_norm", device="cuda", dtype="bf16", cuda_stream=s) as enc:
        pooled = enc.forward(torch.from_numpy(g["input_ids"]).cuda(),
                             torch.from_numpy(g["cu_seqlens"]).cuda(), pooling=None)
        torch.cuda.current_stream().synchronize()
        assert row_rel_err(pooled.float().cpu().numpy(), g["pooled"]) <= 2e-2


def test_device_errors():
    with nopad.Encoder(MODELS / "bert_a", device="cuda", dtype="fp16") as enc:
        ids = torch.arange(1, 6, dtype=torch.int32, device="cuda")
        with pytest.raises(nopad.InvalidArgumentError, match="empty batch"):
            enc.forward(ids, torch.zeros(1, dtype=torch.int32, device="cuda"))
        with pytest.raises(nopad.InvalidArgumentError, match="1-D torch tensor"):
            enc.forward(ids, torch.tensor([0, 5], dtype=torch.int32))  # cu on the host
        with pytest.raises(nopad.TooLongError):
            enc.forward(ids, torch.tensor([0, 5], dtype=torch.int32, device="cuda"),
                        max_seqlen=1000)
        with pytest.raises(nopad.InvalidArgumentError, match="out must be"):
            enc.forward(ids, torch.tensor([0, 5], dtype=torch.int32, device="cuda"),
                        out=torch.empty(5, 48, device="cuda"))  # float32, not fp16


def test_minilm_on_cuda(minilm_dir):
    from conftest import DATA, read_lines
    want = load_safetensors(DATA / "minilm" / "expected.safetensors")
    sentences = read_lines(DATA / "minilm" / "sentences.txt")
    for dtype in DTYPES:
        with nopad.Encoder(minilm_dir, device="cuda", dtype=dtype) as enc:
            emb = enc.encode(sentences).astype(np.float64)
            e = want["embeddings"].astype(np.float64)
            cos = (emb * e).sum(1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(e, axis=1)
            assert cos.min() >= 0.9999, dtype


def test_small_batches_replay_graphs_with_the_same_result():
    g = load_safetensors(MODELS / "bert_a" / "golden.safetensors")
    ids, cu = g["input_ids"], g["cu_seqlens"]
    with nopad.Encoder(MODELS / "bert_a", device="cuda", dtype="fp16") as enc, \
            nopad.Encoder(MODELS / "bert_a", device="cuda", dtype="fp16", cuda_graph_max_tokens=-1) as direct:
        want = direct.forward(ids, cu)
        for _ in range(4):  # recorded at the second call, replayed from then on
            assert row_rel_err(enc.forward(ids, cu), want) <= 5e-3
        stats = enc.stats
        assert stats["forwards"] == 4 and stats["graphs_recorded"] == 1 and stats["graph_replays"] == 3
        assert direct.stats["graph_replays"] == 0


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_forward_padded_on_cuda_tensors_stays_on_the_gpu(dtype):
    tdtype, bound = DTYPES[dtype]
    g = load_safetensors(MODELS / "bert_a" / "golden.safetensors")
    ids, cu = g["input_ids"], g["cu_seqlens"]
    lens = np.diff(cu)
    B, S = len(lens), int(lens.max()) + 3
    padded = np.zeros((B, S), dtype=np.int64)
    mask = np.zeros((B, S), dtype=np.int64)
    for i in range(B):
        padded[i, :lens[i]] = ids[cu[i]:cu[i + 1]]
        mask[i, :lens[i]] = 1
    with nopad.Encoder(MODELS / "bert_a", device="cuda", dtype=dtype) as enc:
        want = enc.forward_padded(padded, attention_mask=mask)  # numpy: packed on the host
        for _ in range(3):
            got = enc.forward_padded(torch.from_numpy(padded).cuda(),
                                     attention_mask=torch.from_numpy(mask).cuda())
            assert got.is_cuda and got.dtype == tdtype and tuple(got.shape) == (B, S, enc.hidden_size)
            got = got.float().cpu().numpy()
            for i in range(B):
                assert row_rel_err(got[i, :lens[i]], want[i, :lens[i]]) <= 1e-6
                assert not got[i, lens[i]:].any()
        by_len = enc.forward_padded(torch.from_numpy(padded).cuda(),
                                    lengths=torch.from_numpy(lens.astype(np.int32)).cuda(), pooling="cls")
        want_cls = enc.forward_padded(padded, attention_mask=mask, pooling="cls")
        assert row_rel_err(by_len.float().cpu().numpy(), want_cls) <= 1e-6
        left = mask[:, ::-1].copy()
        with pytest.raises(nopad.InvalidArgumentError, match="right padding"):
            enc.forward_padded(torch.from_numpy(padded).cuda(), attention_mask=torch.from_numpy(left).cuda())
