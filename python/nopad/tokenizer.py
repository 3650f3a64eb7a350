"""nopad.Tokenizer: the model folder's tokenizer (Hugging Face-exact ids and decodes)."""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _arrays, _native
from ._handle import Handle
from .errors import InvalidArgumentError, Status, error_for

Text = Union[str, bytes, bytearray, memoryview]
PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["Tokenizer", "DecodeStream"]


def as_utf8(text: Text, where: str = "text") -> bytes:
    """UTF-8 bytes of `text`. str is encoded (lone surrogates pass through and are then rejected
    by the library as invalid UTF-8); bytes-like objects are used as they are. The tokenizer
    takes them with their length, so a NUL character is a character like any other (tokenized
    as Hugging Face does)."""
    if isinstance(text, str):
        return text.encode("utf-8", "surrogatepass")
    if isinstance(text, bytes):
        return text
    if isinstance(text, (bytearray, memoryview)):
        return bytes(text)
    raise TypeError("%s must be str or bytes, not %s" % (where, type(text).__name__))


def prompt_utf8(text: Text, where: str) -> bytes:
    """as_utf8 for prompts and stop strings, refusing a NUL character: the engine reads them as
    C strings, where a NUL would silently cut the text, and the server refuses it too; so every
    prompt path (Generator, Engine, server) refuses it alike."""
    data = as_utf8(text, where)
    nul = data.find(b"\0")
    if nul >= 0:
        raise InvalidArgumentError("%s holds a NUL character (U+0000) at byte %d; prompts and "
                                   "stop strings cannot contain NUL" % (where, nul))
    return data


class Tokenizer:
    """A tokenizer loaded from a model folder: WordPiece, BPE (byte-level or SentencePiece-style)
    or Unigram (see :attr:`kind`).

    Loads ``tokenizer.json`` from the folder, else ``vocab.txt`` (+ ``tokenizer_config.json`` for
    ``do_lower_case``); the ids and the decoded text equal Hugging Face ``tokenizers``'.

    >>> tok = nopad.Tokenizer("path/to/all-MiniLM-L6-v2")
    >>> tok.encode("Hello world")
    [101, 7592, 2088, 102]
    >>> ids, cu_seqlens = tok.encode_batch(["Hello world", "Hi"])   # ready for Encoder.forward
    >>> tok.decode([101, 7592, 2088, 102], skip_special_tokens=True)
    'hello world'

    Thread-safe: several threads may tokenize with one Tokenizer at once (the GIL is released
    during each call). Free the native memory with :meth:`close` or a ``with`` block; garbage
    collection frees it too. A tokenizer obtained from :attr:`Encoder.tokenizer` belongs to the
    encoder: it stays usable until the encoder is closed, and its own close() does nothing.
    """

    def __init__(self, path: PathLike):
        """Loads the tokenizer of the folder `path`.

        Raises:
            FileError: the folder, or both tokenizer.json and vocab.txt, are missing.
            FormatError: the tokenizer file is malformed.
            UnsupportedError: the tokenizer uses a part nopad does not implement (named in the
                message).
        """
        self._handle: Optional[Handle] = None
        self._borrowed: Optional[int] = None
        self._owner = None
        lib = _native.library()
        out = ctypes.c_void_p()
        raw = os.fsencode(path)
        if b"\0" in raw:  # ctypes would pass the path cut at the NUL
            raise InvalidArgumentError("tokenizer folder %r holds a NUL character" % (path,))
        _native.check(lib.nopad_tokenizer_load(raw, ctypes.byref(out)))
        self._handle = Handle(out.value, lib.nopad_tokenizer_free, "Tokenizer")
        self._vocab_size = int(lib.nopad_tokenizer_vocab_size(out.value))

    @classmethod
    def _from_model(cls, owner, model_handle: Handle, tok_ptr: int) -> "Tokenizer":
        self = cls.__new__(cls)
        self._handle = model_handle  # the model's handle: usable while the model is open
        self._borrowed = tok_ptr
        self._owner = owner  # keeps the Encoder alive
        # inside the model's protection: a close() in another thread frees tok_ptr with the model
        with model_handle.use():
            self._vocab_size = int(_native.library().nopad_tokenizer_vocab_size(tok_ptr))
        return self

    # ---- lifetime ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _use(self) -> Iterator[int]:
        if self._handle is None:
            raise InvalidArgumentError("Tokenizer is closed")
        with self._handle.use() as ptr:
            yield self._borrowed if self._borrowed is not None else ptr

    def close(self) -> None:
        """Frees the native tokenizer now: new calls raise InvalidArgumentError ("closed") at once;
        close() waits only for the calls already running in other threads, then frees. A no-op
        for an encoder's tokenizer, and when closed."""
        if self._handle is not None and self._borrowed is None:
            self._handle.close()

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def __enter__(self) -> "Tokenizer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and getattr(self, "_borrowed", None) is None:
            try:
                handle.close_unlocked()
            except Exception:  # interpreter shutdown: the library may be gone already
                pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else "vocab_size=%d" % self._vocab_size
        return "<nopad.Tokenizer %s>" % state

    # ---- queries -----------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids (the largest id + 1)."""
        return self._vocab_size

    def __len__(self) -> int:
        return self._vocab_size

    def id_to_token(self, id: int) -> Optional[str]:
        """The token string of an id as Hugging Face's ``id_to_token`` gives it (``"Ġhello"``,
        ``"##ing"``, ``"▁the"``), or None for an id without one."""
        if isinstance(id, bool) or not isinstance(id, (int, np.integer)):
            raise TypeError("id must be an int, not %s" % type(id).__name__)
        if not 0 <= int(id) < self._vocab_size:
            return None
        n = ctypes.c_size_t(0)
        with self._use() as ptr:
            p = _native.library().nopad_tokenizer_id_to_token(ptr, int(id), ctypes.byref(n))
            return None if not p else ctypes.string_at(p, n.value).decode("utf-8")

    def token_bytes(self, id: int) -> bytes:
        """The raw bytes the id adds to a text, whole UTF-8 characters or not (OpenAI's logprobs
        ``bytes``): b"" for a special token. Byte-level and SentencePiece BPE only.

        Raises:
            InvalidArgumentError: an id outside the vocabulary.
            UnsupportedError: a WordPiece, Unigram or plain BPE tokenizer (a token's spacing
                depends on its neighbours).
        """
        if isinstance(id, bool) or not isinstance(id, (int, np.integer)):
            raise TypeError("id must be an int, not %s" % type(id).__name__)
        if not -2**31 <= int(id) < 2**31:
            raise InvalidArgumentError("id %d is outside the vocabulary (0 to %d)" % (id, self._vocab_size - 1))
        lib = _native.library()
        buf = ctypes.create_string_buffer(256)
        n = ctypes.c_size_t(0)
        with self._use() as ptr:
            st = lib.nopad_tokenizer_token_bytes(ptr, int(id), buf, len(buf), ctypes.byref(n))
            if st == _native.STATUS_BUFFER_TOO_SMALL:
                buf = ctypes.create_string_buffer(n.value)
                st = lib.nopad_tokenizer_token_bytes(ptr, int(id), buf, len(buf), ctypes.byref(n))
            _native.check(st)
        return buf.raw[:n.value]

    @property
    def kind(self) -> str:
        """What the tokenizer is: ``"wordpiece"``, ``"bpe-byte-level"`` (GPT-2, RoBERTa, LLaMA-3),
        ``"bpe-sentencepiece"`` (LLaMA-2, Mistral), ``"unigram"`` (XLM-R, ALBERT) or ``"bpe"``."""
        lib = _native.library()
        with self._use() as ptr:
            kind = lib.nopad_tokenizer_get_kind(ptr)
        return lib.nopad_tokenizer_kind_name(kind).decode()

    def token_to_id(self, token: str) -> Optional[int]:
        """Id of a token string such as ``"[CLS]"`` or ``"##ing"``, or None when absent."""
        data = as_utf8(token, "token")
        if b"\0" in data:
            return None
        with self._use() as ptr:
            i = _native.library().nopad_tokenizer_token_to_id(ptr, data)
        return None if i < 0 else int(i)

    # ---- tokenizing --------------------------------------------------------------------------

    @staticmethod
    def _params(add_special_tokens: bool, truncate: bool,
                max_length: Optional[int]) -> _native.TokenizeParams:
        p = _native.library().nopad_tokenize_default_params()
        p.add_special_tokens = 1 if add_special_tokens else 0
        p.truncate = 1 if truncate else 0
        if max_length is None:
            if truncate:
                raise InvalidArgumentError("truncate=True needs max_length")
            p.max_length = 0
        else:
            if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)):
                raise TypeError("max_length must be an int, not %s" % type(max_length).__name__)
            if not 1 <= max_length <= 2**31 - 1:
                raise InvalidArgumentError("max_length must be in [1, 2^31), got %d" % max_length)
            p.max_length = int(max_length)
        return p

    @staticmethod
    def _call(ptr: int, data: bytes, params: _native.TokenizeParams, dest: int, capacity: int
              ) -> Tuple[int, int]:
        """(status, n_ids) of one nopad_tokenize call writing to address `dest`."""
        n = ctypes.c_int32(0)
        st = _native.library().nopad_tokenize(ptr, data, len(data), ctypes.byref(params), dest,
                                              min(capacity, 2**31 - 1), ctypes.byref(n))
        return st, n.value

    def _tokenize_all(self, datas: Sequence[bytes], params: _native.TokenizeParams,
                      label: str, limit_name: str = "max_length"
                      ) -> Tuple[np.ndarray, np.ndarray]:
        """Packs the ids of every text: (ids int32 [T], cu_seqlens int32 [B+1]). Errors name the
        text by `label` and index, and the length limit by `limit_name`."""
        # A piece of text gives at most one id per byte, plus the special tokens: this capacity
        # nearly always suffices; a BUFFER_TOO_SMALL answer grows it.
        cap = sum(len(d) for d in datas) + 8 * len(datas) + 16
        if params.truncate and params.max_length > 0:
            cap = min(cap, params.max_length * len(datas) + 16)
        ids = np.empty(cap, dtype=np.int32)
        cu = np.zeros(len(datas) + 1, dtype=np.int32)
        off = 0
        lib = _native.library()
        with self._use() as ptr:
            for i, data in enumerate(datas):
                while True:
                    st, n = self._call(ptr, data, params, ids.ctypes.data + 4 * off, cap - off)
                    if st != Status.BUFFER_TOO_SMALL:
                        break
                    cap = max(2 * cap, off + n + 16)
                    grown = np.empty(cap, dtype=np.int32)
                    grown[:off] = ids[:off]
                    ids = grown
                if st != Status.OK:
                    msg = _native.last_error() or lib.nopad_status_string(st).decode()
                    where = "%s %d: " % (label, i) if label else ""
                    if st == Status.TOO_LONG and params.max_length > 0:
                        msg = ("%d tokens, more than %s %d (truncate=True cuts it)"
                               % (n, limit_name, params.max_length))
                    raise error_for(st, where + msg)
                if off + n > 2**31 - 1:
                    raise InvalidArgumentError("the batch has more than 2^31 - 1 ids")
                off += n
                cu[i + 1] = off
        return ids[:off].copy(), cu

    def encode(self, text: Text, add_special_tokens: bool = True, truncate: bool = False,
               max_length: Optional[int] = None) -> List[int]:
        """Token ids of one text.

        Args:
            text: str, or UTF-8 bytes (invalid UTF-8 raises InvalidArgumentError).
            add_special_tokens: wrap in the template, e.g. ``[CLS] ... [SEP]``.
            truncate: cut to `max_length` ids, keeping the closing special token.
            max_length: most ids allowed, special tokens included; None: no limit.

        Raises:
            TooLongError: more than `max_length` ids and truncate is False.
            InvalidArgumentError: invalid UTF-8, truncate without max_length, a closed tokenizer.
        """
        params = self._params(add_special_tokens, truncate, max_length)
        ids, _ = self._tokenize_all([as_utf8(text, "text")], params, "")
        return ids.tolist()

    def encode_pair(self, text: Text, text_pair: Text, add_special_tokens: bool = True,
                    truncate: bool = False, max_length: Optional[int] = None
                    ) -> Tuple[List[int], List[int]]:
        """Ids and token type ids of two texts as one sequence in the tokenizer's pair template,
        as HF tokenizers' ``encode(text, text_pair)``: ``[CLS] a [SEP] b [SEP]`` (BERT,
        DeBERTa), ``<s> a </s></s> b </s>`` (RoBERTa, XLM-R). Truncation to `max_length` cuts
        the longer text first (HF's longest_first).

        Raises:
            as :meth:`encode`.
        """
        ids, types = self._pairs([(as_utf8(text, "text"), as_utf8(text_pair, "text_pair"))],
                                 self._params(add_special_tokens, truncate, max_length), "")[:2]
        return ids.tolist(), types.tolist()

    def _pairs(self, pairs: Sequence[Tuple[bytes, bytes]], params: _native.TokenizeParams,
               label: str, limit_name: str = "max_length"
               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Packs the pair template of every (a, b): (ids int32 [T], types int32 [T], cu_seqlens
        int32 [B+1]); errors as _tokenize_all's."""
        lib = _native.library()
        ids_all, types_all, cu = [], [], np.zeros(len(pairs) + 1, dtype=np.int32)
        with self._use() as ptr:
            for i, (a, b) in enumerate(pairs):
                cap = len(a) + len(b) + 16
                while True:
                    ids = np.empty(cap, dtype=np.int32)
                    types = np.empty(cap, dtype=np.int32)
                    n = ctypes.c_int32(0)
                    st = lib.nopad_tokenize_pair(ptr, a, len(a), b, len(b), ctypes.byref(params),
                                                 ids.ctypes.data, types.ctypes.data, cap,
                                                 ctypes.byref(n))
                    if st != Status.BUFFER_TOO_SMALL:
                        break
                    cap = n.value + 16
                if st != Status.OK:
                    msg = _native.last_error() or lib.nopad_status_string(st).decode()
                    if st == Status.TOO_LONG and params.max_length > 0:
                        msg = ("the pair gives %d tokens, more than %s %d (truncate=True cuts it)"
                               % (n.value, limit_name, params.max_length))
                    raise error_for(st, ("%s %d: " % (label, i) if label else "") + msg)
                ids_all.append(ids[:n.value])
                types_all.append(types[:n.value])
                cu[i + 1] = cu[i] + n.value
        return (np.concatenate(ids_all).astype(np.int32), np.concatenate(types_all).astype(np.int32),
                cu)

    def encode_batch(self, texts: Iterable[Text], add_special_tokens: bool = True,
                     truncate: bool = False, max_length: Optional[int] = None
                     ) -> Tuple[np.ndarray, np.ndarray]:
        """Token ids of several texts, packed back to back.

        Returns:
            (ids, cu_seqlens): int32 arrays [T] and [B+1]; text ``b`` has the ids
            ``ids[cu_seqlens[b]:cu_seqlens[b+1]]``. No texts give ``([], [0])``.

        Raises:
            as :meth:`encode`, with the index of the failing text in the message.
        """
        if isinstance(texts, (str, bytes)):
            raise TypeError("encode_batch takes a list of texts; use encode() for one text")
        params = self._params(add_special_tokens, truncate, max_length)
        datas = [as_utf8(t, "texts[%d]" % i) for i, t in enumerate(texts)]
        return self._tokenize_all(datas, params, "text")

    # ---- decoding ----------------------------------------------------------------------------

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of token ids, exactly as Hugging Face ``tokenizers``' ``decode``: each id's
        token, then the tokenizer's decoder (byte-level, Metaspace, byte fallback, WordPiece
        ``##`` joins, ...). Bytes that are not valid UTF-8 come out as U+FFFD.

        Args:
            ids: a sequence (or 1-D numpy array) of ints.
            skip_special_tokens: drop special tokens such as ``[CLS]`` or ``<s>``.

        Raises:
            InvalidArgumentError: an id outside the vocabulary (named, with its position).
            UnsupportedError: the tokenizer's decoder is a type nopad does not implement.
        """
        arr = _arrays.token_ids(ids, "ids", self._vocab_size)
        lib = _native.library()
        n = ctypes.c_size_t(0)
        cap = 8 * len(arr) + 64
        with self._use() as ptr:
            while True:
                buf = ctypes.create_string_buffer(cap)
                st = lib.nopad_detokenize(ptr, arr.ctypes.data if len(arr) else None, len(arr),
                                          1 if skip_special_tokens else 0, buf, cap,
                                          ctypes.byref(n))
                if st != Status.BUFFER_TOO_SMALL or n.value + 1 <= cap:
                    break
                cap = n.value + 1
        _native.check(st)
        return buf.raw[:n.value].decode("utf-8")

    def decode_stream(self, skip_special_tokens: bool = False) -> "DecodeStream":
        """A decoder for ids that arrive one at a time (generation): ``step(id)`` returns the
        new text, ``flush()`` what is held back at the end.

        >>> stream = tok.decode_stream()
        >>> "".join(stream.step(i) for i in ids) + stream.flush() == tok.decode(ids)
        True

        Raises:
            UnsupportedError: the decoder is a type nopad does not implement, or one whose text
                for earlier ids depends on later ones (nopad names it).
        """
        return DecodeStream(self, skip_special_tokens)


class DecodeStream:
    """Decodes ids one at a time, as Hugging Face ``tokenizers``' ``DecodeStream``: each
    :meth:`step` returns the text its id completes, spaced as the whole decode spaces it. Text a
    later id may still change waits: the bytes of an unfinished UTF-8 character (an emoji split
    over byte-level tokens) and a run of ``<0xNN>`` byte-fallback tokens; bytes that can no
    longer form a character come out as U+FFFD. So every returned string is whole characters,
    and the steps plus :meth:`flush` give exactly :meth:`Tokenizer.decode` of all the ids.

    Made by :meth:`Tokenizer.decode_stream`. Calls are serialised (one stream is one sequence);
    it needs its tokenizer open. Free it with :meth:`close` or a ``with`` block (garbage
    collection frees it too).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tok = tokenizer  # keeps the tokenizer (and an encoder owning it) alive
        self._lock = threading.Lock()
        self._handle: Optional[Handle] = None
        lib = _native.library()
        out = ctypes.c_void_p()
        with tokenizer._use() as ptr:
            _native.check(lib.nopad_decode_stream_create(ptr, 1 if skip_special_tokens else 0,
                                                         ctypes.byref(out)))
        self._handle = Handle(out.value, lib.nopad_decode_stream_free, "DecodeStream")

    def _call(self, fn, *args) -> str:
        text, n = ctypes.c_void_p(), ctypes.c_size_t(0)
        if self._handle is None:
            raise InvalidArgumentError("DecodeStream is closed")
        with self._lock, self._tok._use(), self._handle.use() as ptr:
            st = fn(ptr, *args, ctypes.byref(text), ctypes.byref(n))
            _native.check(st)
            return ctypes.string_at(text.value, n.value).decode("utf-8") if n.value else ""

    def step(self, id: int) -> str:
        """Adds one id; returns the new text ("" while a character or byte run is unfinished).

        Raises:
            InvalidArgumentError: an id outside the vocabulary; the stream is left as it was.
        """
        token = _arrays.token_id(id, "id", self._tok.vocab_size)
        return self._call(_native.library().nopad_decode_stream_step, token)

    def flush(self) -> str:
        """Ends the sequence: returns the text held back (U+FFFD for an unfinished character);
        the stream then starts afresh."""
        return self._call(_native.library().nopad_decode_stream_flush)

    def close(self) -> None:
        """Frees the native stream (later calls raise InvalidArgumentError). Idempotent."""
        if self._handle is not None:
            self._handle.close()

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def __enter__(self) -> "DecodeStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            try:
                handle.close_unlocked()
            except Exception:  # interpreter shutdown: the library may be gone already
                pass

    def __repr__(self) -> str:
        return "<nopad.DecodeStream %s>" % ("closed" if self.closed else "open")
