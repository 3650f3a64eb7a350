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


def refuse_bools_in_list(x: Any, a: np.ndarray, name: str) -> None:
    """np.asarray([1, True]) is int64 [1, 1]: a bool among ints in a Python list would pass as
    an id, so lists are checked element by element."""
    if isinstance(x, np.ndarray) or is_torch(x) or a.dtype.kind not in "iu":
        return
    for k, v in enumerate(np.asarray(x, dtype=object).flat):
        if isinstance(v, (bool, np.bool_)):
            raise InvalidArgumentError("%s[%d] is %r, a bool; expected an int" % (name, k, v))


def as_int32_vector(x: Any, name: str) -> np.ndarray:
    """1-D C-contiguous int32 array; no copy when `x` already is one (or a CPU torch int32
    tensor). Other integer dtypes are converted after a range check; bools and floats are
    refused (never truncated)."""
    a = to_numpy(x, name)
    refuse_bools_in_list(x, a, name)
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


class IdTypeError(InvalidArgumentError, TypeError):
    """A token id that is not an int (a float, a bool, a str, ...): an InvalidArgumentError
    that ``except TypeError`` catches as well, as it did before ids were checked this closely."""


def _is_id(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _outside(name: str, value: int, pos: Optional[int], vocab_size: int) -> InvalidArgumentError:
    at = "" if pos is None else " at position %d" % pos
    return InvalidArgumentError("%s: id %d%s is outside the vocabulary (%d ids, 0 to %d)"
                                % (name, value, at, vocab_size, vocab_size - 1))


def token_id(x: Any, name: str, vocab_size: int) -> int:
    """One token id: an int (not a bool, not a float) in [0, vocab_size)."""
    if not _is_id(x):
        raise IdTypeError("%s is %r (a %s), not an int token id" % (name, x, type(x).__name__))
    if not 0 <= int(x) < vocab_size:
        raise _outside(name, int(x), None, vocab_size)
    return int(x)


def token_ids(x: Any, name: str, vocab_size: int) -> np.ndarray:
    """Token ids as a C-contiguous int32 vector: a list (or tuple) of ints, or a 1-D integer
    numpy array or CPU torch tensor. Floats (never truncated), bools, values outside
    [0, vocab_size) and nested lists are refused with InvalidArgumentError naming `name`, the
    position and the value."""
    if isinstance(x, (str, bytes, bytearray, memoryview)) or _is_id(x):
        raise IdTypeError("%s must be a sequence of int token ids, not %s"
                          % (name, type(x).__name__))
    if isinstance(x, np.ndarray) or is_torch(x):
        a = to_numpy(x, name)
        if a.ndim != 1:
            raise InvalidArgumentError("%s must be 1-D, got shape %s" % (name, tuple(a.shape)))
        if a.dtype.kind not in "iu" and a.size:
            raise IdTypeError("%s must hold int token ids, got dtype %s" % (name, a.dtype))
    else:
        try:
            items = list(x)
        except TypeError:
            raise IdTypeError("%s must be a sequence of int token ids, not %s"
                              % (name, type(x).__name__)) from None
        kinds = set(map(type, items))  # fast: nearly always just int
        for k, v in enumerate(items if kinds - {int} else ()):
            if not _is_id(v):
                raise IdTypeError("%s: position %d holds %r (a %s), not an int token id"
                                  % (name, k, v, type(v).__name__))
        try:
            a = np.array(items, dtype=np.int64)
        except OverflowError:  # beyond int64: compared exactly as Python ints
            a = np.array(items, dtype=object)
    if a.size:
        bad = (a < 0) | (a >= vocab_size)
        if bad.any():
            k = int(np.argmax(bad))
            raise _outside(name, int(a[k]), k, vocab_size)
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
