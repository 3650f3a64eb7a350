"""Turning caller arrays (numpy, torch, lists) into what the C API takes, copying only when the
input is not already a C-contiguous array of the right dtype."""
from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

from .errors import InvalidArgumentError

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def torch_module():
    """The torch module if it is imported already (nopad never imports it for you)."""
    return sys.modules.get("torch")


def is_torch(x: Any) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def is_torch_cuda(x: Any) -> bool:
    return is_torch(x) and x.device.type != "cpu"


def to_numpy(x: Any, name: str) -> np.ndarray:
    """A numpy view of a CPU torch tensor (no copy), or np.asarray(x)."""
    if is_torch(x):
        if x.device.type != "cpu":
            raise InvalidArgumentError("%s is on %s; expected a CPU tensor here" % (name, x.device))
        return x.detach().resolve_conj().resolve_neg().numpy()
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as e:
        raise InvalidArgumentError("%s is not an array: %s" % (name, e)) from None


def as_int32_vector(x: Any, name: str) -> np.ndarray:
    """1-D C-contiguous int32 array; no copy when `x` already is one (or a CPU torch int32
    tensor). Other integer dtypes are converted after a range check."""
    a = to_numpy(x, name)
    if a.ndim != 1:
        raise InvalidArgumentError("%s must be 1-D, got shape %s" % (name, tuple(a.shape)))
    if a.dtype == np.int32:
        return np.ascontiguousarray(a)
    if a.dtype.kind not in "iu":
        if a.size == 0 and a.dtype.kind == "f":  # np.asarray([]) is float64
            return np.zeros(0, dtype=np.int32)
        raise InvalidArgumentError("%s must hold integers, got dtype %s" % (name, a.dtype))
    if a.size:
        lo, hi = int(a.min()), int(a.max())
        if lo < INT32_MIN or hi > INT32_MAX:
            bad = lo if lo < INT32_MIN else hi
            raise InvalidArgumentError("%s holds %d, outside the int32 range" % (name, bad))
    return np.ascontiguousarray(a, dtype=np.int32)


def check_cu_seqlens(cu: np.ndarray, n_tokens: int, name: str = "cu_seqlens") -> int:
    """Validates host cu_seqlens against the token count; returns the longest sequence."""
    if cu.size < 2:
        raise InvalidArgumentError(
            "empty batch: %s has %d entries; it needs B + 1 >= 2 ([0, T] for one sequence)"
            % (name, cu.size))
    if cu[0] != 0:
        raise InvalidArgumentError("%s[0] is %d, must be 0" % (name, int(cu[0])))
    if int(cu[-1]) != n_tokens:
        raise InvalidArgumentError("%s[-1] is %d but there are %d tokens (it must equal T)"
                                   % (name, int(cu[-1]), n_tokens))
    lengths = np.diff(cu.astype(np.int64))
    if lengths.min() < 1:
        s = int(np.argmin(lengths))
        raise InvalidArgumentError(
            "sequence %d is empty or %s decreases (%s[%d] = %d, %s[%d] = %d); every sequence "
            "needs >= 1 token" % (s, name, name, s, int(cu[s]), name, s + 1, int(cu[s + 1])))
    return int(lengths.max())


def float32_out(out: Any, shape: tuple, name: str = "out") -> Optional[np.ndarray]:
    """The numpy view of a caller's output buffer after checking it, or None."""
    if out is None:
        return None
    a = to_numpy(out, name)
    if a.dtype != np.float32 or tuple(a.shape) != tuple(shape) or not a.flags.c_contiguous \
            or not a.flags.writeable:
        raise InvalidArgumentError(
            "%s must be a writable C-contiguous float32 array of shape %s, got %s %s%s"
            % (name, tuple(shape), a.dtype, tuple(a.shape),
               "" if a.flags.c_contiguous else " (not contiguous)"))
    return a
