"""nopad.attention_varlen: nopad's fused variable-length attention on torch tensors.

The C entry point (nopad_attention_varlen) reads one packed QKV buffer [T, 3, heads, d], the
layout a fused QKV projection writes. q, k, v that are views of such a buffer (for example
``qkv[:, 0], qkv[:, 1], qkv[:, 2]``, or ``qkv.unbind(1)``) are passed without a copy; other q, k, v
are stacked into a new [T, 3, heads, d] buffer first (one copy of the inputs, on the current
stream). The output is a new tensor [T, heads, d], or `out`.

CUDA tensors (fp16 / bf16) run on the GPU, asynchronously on torch's current stream of the
tensors' device; CPU tensors (float32) run the CPU reference. A library built without CUDA raises
UnsupportedError for CUDA tensors. The package keeps one 16-byte zeroed workspace per (device,
stream) for the persistent attention kernel's work counter (nopad.h, nopad_attention_varlen);
calls on one stream share it, which is safe because they run one after another.
"""
from __future__ import annotations

import ctypes
import math
from contextlib import nullcontext
from typing import Any, Optional, Tuple

import numpy as np

from . import _arrays, _native
from .errors import InvalidArgumentError, UnsupportedError

__all__ = ["attention_varlen", "attention_varlen_packed"]


def _torch():
    torch = _arrays.torch_module()
    if torch is None:
        try:
            import torch  # noqa: F401  (only imported when asked for torch tensors)
        except ImportError:
            raise UnsupportedError("attention_varlen works on torch tensors; install torch") \
                from None
    return torch


def _dtype_code(torch, t) -> int:
    if t.device.type == "cuda":
        if t.dtype == torch.float16:
            return _native.DTYPE_F16
        if t.dtype == torch.bfloat16:
            return _native.DTYPE_BF16
        raise UnsupportedError("attention_varlen on CUDA takes float16 or bfloat16 tensors, got %s"
                               % t.dtype)
    if t.device.type == "cpu":
        if t.dtype == torch.float32:
            return _native.DTYPE_F32
        raise UnsupportedError("attention_varlen on the CPU takes float32 tensors, got %s"
                               % t.dtype)
    raise UnsupportedError("attention_varlen: tensors on %s are not supported (cpu or cuda)"
                           % t.device)


# NOPAD_ATTENTION_WORKSPACE_BYTES of nopad.h
_WORKSPACE_BYTES = 16
# one zeroed workspace per (device, stream): calls on one stream run one after another, which is
# what a shared workspace needs (nopad.h, nopad_attention_varlen)
_workspaces: dict = {}


def _workspace(torch, device, stream: int):
    """The attention workspace of this stream, or None while the stream is being captured into a
    CUDA graph and has none yet (its zero fill would only be recorded, not run; without a workspace
    the persistent kernels are not used)."""
    key = (device.index, stream)
    ws = _workspaces.get(key)
    if ws is None:
        if torch.cuda.is_current_stream_capturing():
            return None
        ws = torch.zeros(_WORKSPACE_BYTES // 4, dtype=torch.int32, device=device)
        _workspaces[key] = ws
    return ws


def _strides_are(t, expected: Tuple[int, ...]) -> bool:
    """t has these strides, ignoring dimensions of size 1 (their stride never matters)."""
    return all(n == 1 or s == e for n, s, e in zip(t.shape, t.stride(), expected))


def packed_view_base(q, k, v) -> Optional[int]:
    """Data pointer of the [T, 3, heads, d] buffer that q, k, v [T, heads, d] are views of, or None
    when they are not such views (then they must be stacked)."""
    T, h, d = q.shape
    e = q.element_size()
    row = (3 * h * d, d, 1)
    if not (_strides_are(q, row) and _strides_are(k, row) and _strides_are(v, row)):
        return None
    base = q.data_ptr()
    if k.data_ptr() != base + h * d * e or v.data_ptr() != base + 2 * h * d * e:
        return None
    storage = q.untyped_storage().data_ptr()
    if k.untyped_storage().data_ptr() != storage or v.untyped_storage().data_ptr() != storage:
        return None
    return base


def _cu_seqlens(torch, cu_seqlens: Any, n_tokens: int, device) -> Tuple[Any, Optional[int]]:
    """(int32 contiguous cu_seqlens on `device`, longest sequence if known without a sync).

    Host input (list, numpy, CPU tensor) is checked against T, then copied to the device; a
    tensor already on the GPU is used as it is (converted to int32 if needed) and not checked,
    which would need a host synchronisation."""
    if _arrays.is_torch(cu_seqlens) and cu_seqlens.device.type != "cpu":
        if cu_seqlens.device != device:
            raise InvalidArgumentError("cu_seqlens is on %s, the tensors on %s"
                                       % (cu_seqlens.device, device))
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            raise InvalidArgumentError("cu_seqlens must be 1-D with B + 1 >= 2 entries, got shape "
                                       "%s" % tuple(cu_seqlens.shape))
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
            raise InvalidArgumentError("cu_seqlens must hold integers, got %s" % cu_seqlens.dtype)
        return cu_seqlens.to(torch.int32).contiguous(), None
    host = _arrays.as_int32_vector(cu_seqlens, "cu_seqlens")
    longest = _arrays.check_cu_seqlens(host, n_tokens)
    t = torch.from_numpy(host)
    if device.type != "cpu":
        t = t.to(device)
    return t, longest


def _run(torch, qkv_ptr: int, ref, T: int, h: int, d: int, cu_seqlens: Any,
         max_seqlen: Optional[int], causal: bool, scale: Optional[float], out: Any, keep):
    device = ref.device
    code = _dtype_code(torch, ref)
    if T < 1:
        raise InvalidArgumentError("attention_varlen: no tokens (T = 0)")
    cu, longest = _cu_seqlens(torch, cu_seqlens, T, device)
    if max_seqlen is None:
        if longest is None:  # device cu_seqlens: one host synchronisation
            longest = int((cu[1:] - cu[:-1]).max().item())
        max_seqlen = longest
    elif isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (int, np.integer)):
        raise TypeError("max_seqlen must be an int, not %s" % type(max_seqlen).__name__)
    elif longest is not None and max_seqlen < longest:
        raise InvalidArgumentError("max_seqlen %d is shorter than the longest sequence (%d)"
                                   % (max_seqlen, longest))
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    if out is None:
        out = torch.empty((T, h, d), dtype=ref.dtype, device=device)
    else:
        if not _arrays.is_torch(out):
            raise TypeError("out must be a torch tensor, not %s" % type(out).__name__)
        if out.dtype != ref.dtype or out.device != device or not out.is_contiguous() \
                or tuple(out.shape) not in ((T, h, d), (T, h * d)):
            raise InvalidArgumentError(
                "out must be a contiguous %s tensor [%d, %d, %d] or [%d, %d] on %s; got %s %s on "
                "%s" % (ref.dtype, T, h, d, T, h * d, device, out.dtype, tuple(out.shape),
                        out.device))
    lib = _native.library()
    n_seqs = cu.numel() - 1
    if device.type == "cuda":
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream(device).cuda_stream
            ws = _workspace(torch, device, stream)
            st = lib.nopad_attention_varlen(_native.DEVICE_CUDA, code, out.data_ptr(), qkv_ptr,
                                            cu.data_ptr(), n_seqs, T, int(max_seqlen), h, d,
                                            float(scale), 1 if causal else 0,
                                            None if ws is None else ctypes.c_void_p(ws.data_ptr()),
                                            ctypes.c_void_p(stream))
    else:
        st = lib.nopad_attention_varlen(_native.DEVICE_CPU, code, out.data_ptr(), qkv_ptr,
                                        cu.data_ptr(), n_seqs, T, int(max_seqlen), h, d,
                                        float(scale), 1 if causal else 0, None, None)
    del keep  # inputs (and any stacked copy) stay referenced until the call has been made
    _native.check(st)
    return out


def attention_varlen(q, k, v, cu_seqlens, max_seqlen: Optional[int] = None, causal: bool = False,
                     scale: Optional[float] = None, out=None):
    """Variable-length multi-head attention, every sequence attending only to its own tokens.

    Args:
        q, k, v: torch tensors [T, heads, d] of the packed sequences (float16 / bfloat16 on
            CUDA, float32 on the CPU). Views of one [T, 3, heads, d] buffer are used in place;
            otherwise they are stacked into one (a copy).
        cu_seqlens: int [B+1] prefix sums of the lengths (cu_seqlens[0] = 0, cu_seqlens[B] = T):
            a tensor on the device (used as is, unchecked, no synchronisation), or host data
            (list, numpy, CPU tensor: checked, then copied to the device).
        max_seqlen: the longest sequence; None computes it (a host sync if cu_seqlens is on the
            GPU).
        causal: each token attends to itself and earlier tokens of its sequence only.
        scale: softmax scale; default 1 / sqrt(d).
        out: optional contiguous tensor [T, heads, d] (or [T, heads * d]) to write into.

    Returns:
        `out`, or a new tensor [T, heads, d] of the inputs' dtype and device. On CUDA the work is
        enqueued on torch's current stream and has not necessarily finished.

    Raises:
        UnsupportedError: a dtype or head size without a kernel, or a library without CUDA.
        InvalidArgumentError: inconsistent shapes, devices or cu_seqlens.
    """
    torch = _torch()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s must be a torch tensor, not %s" % (name, type(t).__name__))
        if t.dim() != 3:
            raise InvalidArgumentError("%s must be [T, heads, d], got shape %s"
                                       % (name, tuple(t.shape)))
    if not (q.shape == k.shape == v.shape):
        raise InvalidArgumentError("q, k, v shapes differ: %s, %s, %s"
                                   % (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise InvalidArgumentError("q, k, v must share dtype and device, got %s/%s, %s/%s, %s/%s"
                                   % (q.dtype, q.device, k.dtype, k.device, v.dtype, v.device))
    _dtype_code(torch, q)
    T, h, d = (int(x) for x in q.shape)
    base = packed_view_base(q, k, v) if T > 0 else None
    if base is not None:
        return _run(torch, base, q, T, h, d, cu_seqlens, max_seqlen, causal, scale, out,
                    (q, k, v))
    if q.device.type == "cuda":
        with torch.cuda.device(q.device):
            qkv = torch.stack((q, k, v), dim=1)  # [T, 3, heads, d], one copy
    else:
        qkv = torch.stack((q, k, v), dim=1)
    return _run(torch, qkv.data_ptr(), qkv, T, h, d, cu_seqlens, max_seqlen, causal, scale, out,
                (q, k, v, qkv))


def attention_varlen_packed(qkv, cu_seqlens, max_seqlen: Optional[int] = None,
                            causal: bool = False, scale: Optional[float] = None, out=None):
    """As :func:`attention_varlen` on one packed tensor qkv [T, 3, heads, d] (Q | K | V per
    token, as a fused QKV projection writes it). A contiguous qkv is used without a copy; a
    non-contiguous one is made contiguous first (a copy)."""
    torch = _torch()
    if not isinstance(qkv, torch.Tensor):
        raise TypeError("qkv must be a torch tensor, not %s" % type(qkv).__name__)
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise InvalidArgumentError("qkv must be [T, 3, heads, d], got shape %s"
                                   % (tuple(qkv.shape),))
    _dtype_code(torch, qkv)
    T, _, h, d = (int(x) for x in qkv.shape)
    if not _strides_are(qkv, (3 * h * d, h * d, d, 1)):
        with torch.cuda.device(qkv.device) if qkv.device.type == "cuda" else nullcontext():
            qkv = qkv.contiguous()
    return _run(torch, qkv.data_ptr(), qkv, T, h, d, cu_seqlens, max_seqlen, causal, scale, out,
                qkv)
