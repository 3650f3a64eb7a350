"""nopad.attention_varlen on torch tensors: the CPU reference (float32) always; the CUDA kernels
(fp16 / bf16) when a GPU is present, against a float32 torch reference computed sequence by
sequence."""
import math

import numpy as np
import pytest

import nopad

torch = pytest.importorskip("torch")

has_cuda = torch.cuda.is_available()
gpu = pytest.mark.skipif(not has_cuda, reason="no CUDA GPU")


def reference(qkv, cu, causal=False, scale=None):
    """[T, heads, d] float32: softmax(q k^T * scale) v for each sequence on its own."""
    qkv = qkv.float().cpu()
    T, _, h, d = qkv.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.empty(T, h, d)
    cu = [int(x) for x in cu]
    for s in range(len(cu) - 1):
        q, k, v = (qkv[cu[s]:cu[s + 1], i].transpose(0, 1) for i in range(3))  # [h, L, d]
        att = q @ k.transpose(1, 2) * scale
        if causal:
            L = q.shape[1]
            att = att.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        out[cu[s]:cu[s + 1]] = (att.softmax(-1) @ v).transpose(0, 1)
    return out


def make(lengths, heads, d, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    qkv = (torch.rand(T, 3, heads, d, generator=g) * 4 - 2).to(device=device, dtype=dtype)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    return qkv, cu


def row_err(a, b):
    a, b = a.float().cpu().reshape(-1, a.shape[-1]), b.float().cpu().reshape(-1, b.shape[-1])
    return float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-6)).max())


# ---- CPU -------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_cpu_views_of_packed_qkv_are_not_copied(causal, monkeypatch):
    qkv, cu = make([5, 1, 17, 8], heads=3, d=16)
    stacks = []
    real_stack = torch.stack
    monkeypatch.setattr(torch, "stack", lambda *a, **k: stacks.append(1) or real_stack(*a, **k))
    q, k, v = qkv.unbind(1)
    assert nopad.attention.packed_view_base(q, k, v) == qkv.data_ptr()
    out = nopad.attention_varlen(q, k, v, cu, max_seqlen=17, causal=causal)
    assert not stacks  # zero copies
    assert out.shape == (31, 3, 16) and out.dtype == torch.float32
    assert row_err(out, reference(qkv, cu, causal)) < 1e-5


def test_cpu_separate_tensors_are_stacked():
    qkv, cu = make([4, 9], heads=2, d=8, seed=1)
    q, k, v = (qkv[:, i].clone() for i in range(3))
    assert nopad.attention.packed_view_base(q, k, v) is None
    out = nopad.attention_varlen(q, k, v, cu.tolist())  # host cu_seqlens as a list
    assert row_err(out, reference(qkv, cu)) < 1e-5
    # k and v swapped: views of one buffer, but not in Q | K | V order
    q, k, v = qkv.unbind(1)
    assert nopad.attention.packed_view_base(q, v, k) is None


def test_cpu_packed_entry_out_and_scale():
    qkv, cu = make([3, 6, 2], heads=4, d=8, seed=2)
    out = torch.full((11, 32), float("nan"))
    got = nopad.attention_varlen_packed(qkv, cu, scale=0.3, out=out)
    assert got is out and got.data_ptr() == out.data_ptr()
    assert row_err(out.view(11, 4, 8), reference(qkv, cu, scale=0.3)) < 1e-5
    strided = torch.cat([qkv, qkv], dim=2)[:, :, :4]  # not contiguous: copied
    assert row_err(nopad.attention_varlen_packed(strided, cu), reference(strided, cu)) < 1e-5


def test_bad_attention_inputs():
    qkv, cu = make([3, 4], heads=2, d=8)
    q, k, v = qkv.unbind(1)
    with pytest.raises(nopad.UnsupportedError, match="float32"):
        nopad.attention_varlen(q.double(), k.double(), v.double(), cu)
    with pytest.raises(nopad.InvalidArgumentError, match="shapes differ"):
        nopad.attention_varlen(q, k[:, :1], v, cu)
    with pytest.raises(nopad.InvalidArgumentError, match="must equal T"):
        nopad.attention_varlen(q, k, v, [0, 3, 6])
    with pytest.raises(nopad.InvalidArgumentError, match="empty batch"):
        nopad.attention_varlen(q, k, v, [7])
    with pytest.raises(nopad.InvalidArgumentError, match="shorter than the longest"):
        nopad.attention_varlen(q, k, v, cu, max_seqlen=3)
    with pytest.raises(nopad.InvalidArgumentError, match="out must be"):
        nopad.attention_varlen(q, k, v, cu, out=torch.empty(7, 2, 9))
    with pytest.raises(nopad.InvalidArgumentError, match=r"\[T, 3, heads, d\]"):
        nopad.attention_varlen_packed(qkv[:, :2], cu)
    with pytest.raises(TypeError):
        nopad.attention_varlen(q.numpy(), k, v, cu)


def test_cuda_tensors_without_a_cuda_library():
    """A library built without CUDA says so (only testable with a GPU and a CPU build)."""
    if not has_cuda:
        pytest.skip("no CUDA GPU")
    qkv, cu = make([3, 4], heads=2, d=64, dtype=torch.float16, device="cuda")
    try:
        nopad.attention_varlen_packed(qkv, cu.cuda())
    except nopad.UnsupportedError as e:
        assert "no CUDA backend" in str(e)


# ---- CUDA ------------------------------------------------------------------------------------

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_equals_reference(dtype, d, causal):
    lengths = [1, 37, 128, 5, 300, 64]
    qkv, cu = make(lengths, heads=4, d=d, dtype=dtype, device="cuda", seed=d)
    cu_dev = cu.cuda()
    q, k, v = qkv.unbind(1)
    out = nopad.attention_varlen(q, k, v, cu_dev, max(lengths), causal=causal)
    torch.cuda.synchronize()
    assert out.is_cuda and out.dtype == dtype and out.shape == (sum(lengths), 4, d)
    ref = reference(qkv, cu, causal)
    assert row_err(out, ref) < TOL[dtype]
    packed = nopad.attention_varlen_packed(qkv, cu, causal=causal)  # host cu_seqlens
    torch.cuda.synchronize()
    assert row_err(packed, ref) < TOL[dtype]
    stacked = nopad.attention_varlen(q.contiguous(), k.contiguous(), v.contiguous(), cu_dev,
                                     causal=causal)  # not views: stacked
    torch.cuda.synchronize()
    assert row_err(stacked, ref) < TOL[dtype]


@gpu
def test_cuda_out_is_written_in_place_on_the_current_stream():
    lengths = [50, 7, 200]
    qkv, cu = make(lengths, heads=2, d=64, dtype=torch.float16, device="cuda", seed=3)
    out = torch.full((257, 2, 64), float("nan"), dtype=torch.float16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = nopad.attention_varlen(*qkv.unbind(1), cu.cuda(), 200, out=out)
    s.synchronize()
    assert got is out and got.data_ptr() == out.data_ptr()
    assert row_err(out, reference(qkv, cu)) < TOL[torch.float16]
    flat = torch.empty(257, 128, dtype=torch.float16, device="cuda")
    assert nopad.attention_varlen_packed(qkv, cu, out=flat).data_ptr() == flat.data_ptr()
    torch.cuda.synchronize()
    assert row_err(flat.view(257, 2, 64), reference(qkv, cu)) < TOL[torch.float16]


@gpu
def test_cuda_float32_is_refused():
    qkv, cu = make([4], heads=1, d=64, device="cuda")
    with pytest.raises(nopad.UnsupportedError, match="float16 or bfloat16"):
        nopad.attention_varlen_packed(qkv, cu)
