"""nopad.Generator: text generation with a decoder (GPT-2, LLaMA, Mistral, Qwen2)."""
from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import threading
import weakref
from typing import Any, Iterator, List, Mapping, Optional, Sequence as SequenceT, Tuple, Union

import numpy as np

from . import _arrays, _native
from ._handle import Handle
from .encoder import (ModelInfo, PathLike, _int_arg, _model_info, _parse_device, _parse_dtype,
                      _tp_size_arg)
from .errors import InvalidArgumentError, error_for
from .tokenizer import DecodeStream, Tokenizer, prompt_utf8

__all__ = ["Generator", "Sequence", "TokenStream"]

_TEXT = (str, bytes, bytearray, memoryview)

Prompt = Union[str, bytes, SequenceT[int], np.ndarray]


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_scalar(x: Any) -> bool:
    """A number (bools and floats included): a list of them is one prompt of ids, whose bad
    entries are then refused by position."""
    return isinstance(x, (int, float, complex, np.generic)) and not isinstance(x, _TEXT)


def _float_arg(value: Any, name: str) -> float:
    """A real number for a float field (its range is the library's to check)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError("%s must be a number, not %s" % (name, type(value).__name__))
    return float(value)


def _set_openai_sampling(s: _native.SamplingParams, presence_penalty: Any, frequency_penalty: Any,
                         logit_bias: Optional[Mapping[int, float]], keep: List[Any]) -> None:
    """OpenAI's presence and frequency penalties and logit_bias ({id: bias}) into s; the pairs'
    array goes into `keep`, which must outlive every call that reads s (ranges: the library's)."""
    s.presence_penalty = _float_arg(presence_penalty, "presence_penalty")
    s.frequency_penalty = _float_arg(frequency_penalty, "frequency_penalty")
    if logit_bias is None:
        return
    if not isinstance(logit_bias, Mapping):
        raise TypeError("logit_bias must be a dict {token id: bias}, not %s" % type(logit_bias).__name__)
    pairs = (_native.LogitBias * max(len(logit_bias), 1))()
    for j, (tid, bias) in enumerate(logit_bias.items()):
        if not _is_int(tid):  # OpenAI's JSON gives ids as strings: a server converts them
            raise TypeError("logit_bias keys must be token ids (int), not %s" % type(tid).__name__)
        if not -2**31 <= int(tid) < 2**31:
            raise InvalidArgumentError("logit_bias id %d is outside the vocabulary" % int(tid))
        pairs[j].id = int(tid)
        pairs[j].bias = _float_arg(bias, "logit_bias[%d]" % int(tid))
    keep.append(pairs)
    s.logit_bias = ctypes.cast(pairs, ctypes.c_void_p)
    s.n_logit_bias = len(logit_bias)


def _parse_weights(weights: Any) -> int:
    name = str(weights).lower()
    if name in _native.WEIGHTS_CODES:
        return _native.WEIGHTS_CODES[name]
    raise InvalidArgumentError("weights %r is not 'auto', 'native', 'f32', 'f16', 'bf16' or 'fp8'"
                               % (weights,))


def _decoder_params(device: str, dtype: Optional[str], threads: int,
                    kv_cache_tokens: Optional[int], max_batch_tokens: Optional[int], tp_size: int,
                    cuda_graph_max_tokens: int = 0, weights: str = "auto") -> Tuple[int, Any]:
    """(device code, nopad_model_params) for loading a decoder, every argument checked: a
    Generator's, and those of tp_follow's ranks, which must cut their shards as rank 0's
    Generator does. `dtype` None: fp16 on CUDA, fp32 on the CPU."""
    dev = _parse_device(device)
    if dtype is None:
        dt = _native.DTYPE_F16 if dev == _native.DEVICE_CUDA else _native.DTYPE_F32
    else:
        dt = _parse_dtype(dtype)
    params = _native.library().nopad_model_default_params()
    params.device = dev
    params.dtype = dt
    params.n_threads = _int_arg(threads, "threads", 0, 4096)
    if kv_cache_tokens is not None:
        params.kv_cache_tokens = _int_arg(kv_cache_tokens, "kv_cache_tokens", 1)
    if max_batch_tokens is not None:
        params.max_batch_tokens = _int_arg(max_batch_tokens, "max_batch_tokens", 1)
    params.cuda_graph_max_tokens = _int_arg(cuda_graph_max_tokens, "cuda_graph_max_tokens", -1)
    params.tp_size = _tp_size_arg(tp_size)
    params.weights = _parse_weights(weights)
    return dev, params


def _model_path_bytes(path: PathLike) -> bytes:
    """The model's path as the library takes it; refused with an embedded null byte, which C
    would silently cut it at."""
    raw = os.fsencode(os.fspath(path))
    if b"\0" in raw:
        raise InvalidArgumentError("model %r: embedded null byte" % os.fsdecode(raw))
    return raw


class Generator:
    """A decoder loaded from a GGUF file or a Hugging Face model folder (gpt2, llama, mistral,
    qwen2), generating text for several prompts at once.

    >>> with nopad.Generator("SmolLM2-135M-Instruct.Q4_1.gguf") as gen:
    ...     gen.generate("<|im_start|>user\\nWhat is the capital of France?<|im_end|>\\n"
    ...                  "<|im_start|>assistant\\n", max_tokens=16)
    ['The capital of France is Paris.']

    Prompts run together: each step computes the next token of every unfinished prompt in one
    packed forward, and a prompt leaves the batch as soon as it ends (an end-of-sequence id, or
    ``max_tokens``). A prompt's tokens depend only on it and its seed, never on its neighbours.

    The GIL is released while the library computes; calls from several threads are safe (they
    share the model's KV pool, ``kv_cache_tokens``). Free the native memory with :meth:`close`
    or a ``with`` block; garbage collection frees it too.
    """

    def __init__(self, model: PathLike, device: str = "cpu", dtype: Optional[str] = None,
                 kv_cache_tokens: Optional[int] = None, max_batch_tokens: Optional[int] = None,
                 threads: int = 0, tp_size: int = 1, weights: str = "auto"):
        """Loads the decoder `model`: a ``.gguf`` file (config, weights and tokenizer all from
        the file) or a Hugging Face folder.

        Args:
            model: the GGUF file or the model folder.
            device: "cpu" or "cuda".
            dtype: compute dtype; None: "fp32" on the CPU, "fp16" on CUDA.
            kv_cache_tokens: the paged KV pool, in tokens over all prompts running at once,
                allocated at load; None: the library's default (8192).
            max_batch_tokens: most tokens in one forward step (longer prompts are fed in
                chunks); None: the library's default (2048).
            threads: CPU threads; 0: OpenMP's default.
            tp_size: split the model over this many processes (tensor parallelism). With no
                launcher, nopad starts tp_size - 1 worker processes on this machine (one GPU
                each on CUDA) and ends them when this object closes. Under ``mpirun -np
                tp_size``, this object (and an :class:`Engine` on it) lives on rank 0 and every
                other rank calls :func:`nopad.tp_follow` with the same model and keywords.
            weights: how a GGUF file's quantized weights are held: "auto" ("native" on the
                CPU, else the compute dtype), "native" (as stored where the backend runs the
                format: Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K on the CPU and
                CUDA; the rest dequantised, said on stderr), "f32" / "f16" / "bf16" (dequantised;
                must be the compute dtype), "fp8" (CUDA, Hopper: the linear layers quantized to
                FP8 E4M3 per output channel at load; an F8_E4M3 checkpoint with its
                ``weight_scale`` stays FP8 on CUDA whatever this says; docs/fp8.md).

        Raises:
            FileError: a missing file or folder.
            FormatError: a malformed file.
            UnsupportedError: an unsupported model_type, tensor type or device.
            InvalidArgumentError: `model` is an encoder (use :class:`nopad.Encoder`);
                tp_size > 1 is not the launcher's world size.
        """
        self._handle: Optional[Handle] = None
        self._streams: "weakref.WeakSet[_StreamState]" = weakref.WeakSet()
        # the handles of this generator's live sequences and engines, freed before the model
        # (held here rather than the Sequence and Engine objects, so they go first in whatever
        # order the collector finalises the objects). An engine's thread reads the weights
        # without a call in flight here, so the model's free closes (stops and joins) them first.
        self._seq_handles: "set[Handle]" = set()
        self._engine_handles: "set[Handle]" = set()
        dev, params = _decoder_params(device, dtype, threads, kv_cache_tokens, max_batch_tokens,
                                      tp_size, weights=weights)
        self.path = os.fspath(model)
        raw = _model_path_bytes(self.path)
        lib = _native.library()
        out = ctypes.c_void_p()
        _native.check(lib.nopad_model_load(raw, ctypes.byref(params), ctypes.byref(out)))
        self._handle = Handle(out.value, _model_free(self._engine_handles, self._seq_handles),
                              "Generator")
        info = _native.ModelInfo()
        _native.check(lib.nopad_model_get_info(out.value, ctypes.byref(info)))
        self.info: ModelInfo = _model_info(info, dev)
        if not self.info.is_decoder:
            self.close()
            raise InvalidArgumentError(
                "'%s' is an encoder (%s, %s); nopad.Generator runs decoders (gpt2, llama, "
                "mistral, qwen2): use nopad.Encoder for it"
                % (os.fsdecode(self.path), self.info.model_type, self.info.family))
        self._tok_ptr: Optional[int] = lib.nopad_model_tokenizer(out.value) or None
        why = lib.nopad_model_tokenizer_error(out.value)
        self._tokenizer_error: Optional[str] = why.decode("utf-8", "replace") if why else None

    # ---- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stops running streams at their next token; once the calls running in other threads
        end, closes the engines running on this generator (their requests end as "cancelled"
        and stay readable), frees its sequences, then the model. Later calls, also on those
        engines and sequences, raise InvalidArgumentError ("closed"). Closing twice is fine."""
        if self._handle is None:
            return
        for state in list(self._streams):
            state.stop = True
        self._handle.close()

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def __enter__(self) -> "Generator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            try:
                for h in list(getattr(self, "_engine_handles", ())) + \
                        list(getattr(self, "_seq_handles", ())):
                    h.close_unlocked()
                handle.close_unlocked()
            except Exception:  # interpreter shutdown: the library may be gone already
                pass

    def __repr__(self) -> str:
        if self._handle is None:
            return "<nopad.Generator (failed to load)>"
        i = self.info
        return "<nopad.Generator %s %s, %d layers, %s %s%s>" % (
            i.family, os.path.basename(os.path.normpath(self.path)), i.num_layers, i.device,
            i.compute_dtype, ", closed" if self.closed else "")

    # ---- properties --------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Optional[Tokenizer]:
        """The model's tokenizer (None when it has none nopad supports: see
        :attr:`tokenizer_error`; prompts are then token ids). Closing the generator closes it."""
        if self._tok_ptr is None:
            return None
        return Tokenizer._from_model(self, self._handle, self._tok_ptr)

    @property
    def tokenizer_error(self) -> Optional[str]:
        """Why the model's tokenizer did not load, when it uses something nopad does not
        implement; else None."""
        return self._tokenizer_error

    @property
    def memory(self) -> dict:
        """Bytes the model holds: ``{"weights", "workspace", "backend"}`` (the workspace holds
        the KV pool)."""
        lib = _native.library()
        sizes = [ctypes.c_size_t() for _ in range(3)]
        with self._use() as ptr:
            _native.check(lib.nopad_model_memory(ptr, *(ctypes.byref(x) for x in sizes)))
        return dict(zip(("weights", "workspace", "backend"), (x.value for x in sizes)))

    # ---- helpers -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _use(self) -> Iterator[int]:
        if self._handle is None:
            raise InvalidArgumentError("Generator is closed")
        with self._handle.use() as ptr:
            yield ptr

    def _need_tokenizer(self) -> Tokenizer:
        tok = self.tokenizer
        if tok is None:
            why = self._tokenizer_error or "the model has no tokenizer"
            raise InvalidArgumentError("text prompts need the model's tokenizer (%s); pass token "
                                       "ids instead" % why)
        return tok

    def _ids(self, ids: Any, where: str) -> np.ndarray:
        arr = _arrays.token_ids(ids, where, self.info.vocab_size)
        if arr.size == 0:
            raise InvalidArgumentError("%s is empty (at least one token)" % where)
        return arr

    def _pack(self, prompts: Any) -> Tuple[np.ndarray, np.ndarray]:
        """(ids int32 [T], cu int32 [n+1]) of prompts given as one text, one id list, or a list
        of texts and id lists. Texts go through the model's tokenizer, special tokens added as
        Hugging Face adds them (the BOS of LLaMA-2-style tokenizers, nothing for most chat
        models)."""
        single = True  # errors name "prompt" rather than "prompts[i]"
        if isinstance(prompts, _TEXT):
            items: List[Any] = [prompts]
        elif isinstance(prompts, np.ndarray) and prompts.ndim == 1:
            items = [prompts]
        else:
            try:
                items = list(prompts)
            except TypeError:
                raise TypeError("prompts must be a str, a list of ids, or a list of those; not %s"
                                % type(prompts).__name__) from None
            if items and all(_is_scalar(x) for x in items):
                items = [items]  # one prompt of ids
            else:
                single = False
        parts: List[np.ndarray] = []
        tok: Optional[Tokenizer] = None
        for i, p in enumerate(items):
            name = "prompt" if single else "prompts[%d]" % i
            if isinstance(p, _TEXT):
                data = prompt_utf8(p, name)
                tok = tok or self._need_tokenizer()
                params = Tokenizer._params(True, False, None)
                ids, _ = tok._tokenize_all([data], params, "prompt %d" % i if len(items) > 1
                                           else "prompt")
                if ids.size == 0:
                    raise InvalidArgumentError("prompt %d is empty (no tokens)" % i)
                parts.append(ids)
            else:
                if _is_scalar(p):
                    raise TypeError("prompts[%d] is a number: give one prompt of ids as a list, "
                                    "several as a list of lists" % i)
                parts.append(self._ids(p, name))
        cu = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=cu[1:])
        if cu[-1] > 2**31 - 1:
            raise InvalidArgumentError("the prompts hold more than 2^31 - 1 tokens")
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return np.ascontiguousarray(ids, dtype=np.int32), cu.astype(np.int32)

    @staticmethod
    def _params(max_tokens: int, temperature: float, top_k: int, top_p: float, min_p: float,
                repetition_penalty: float, seed: int, ignore_eos: bool, presence_penalty: float = 0.0,
                frequency_penalty: float = 0.0,
                logit_bias: Optional[Mapping[int, float]] = None) -> _native.GenerateParams:
        """The params; their logit_bias pairs live as long as the returned object (its .keep)."""
        p = _native.library().nopad_generate_default_params()
        p.max_tokens = _int_arg(max_tokens, "max_tokens", 0)
        p.ignore_eos = 1 if ignore_eos else 0
        s = p.sampling
        s.temperature = _float_arg(temperature, "temperature")
        s.top_k = _int_arg(top_k, "top_k", -2**31)
        s.top_p = _float_arg(top_p, "top_p")
        s.min_p = _float_arg(min_p, "min_p")
        s.repetition_penalty = _float_arg(repetition_penalty, "repetition_penalty")
        if not _is_int(seed):
            raise TypeError("seed must be an int, not %s" % type(seed).__name__)
        if not 0 <= int(seed) <= 2**64 - 1:
            raise InvalidArgumentError("seed must be in [0, 2^64), got %d" % int(seed))
        s.seed = int(seed)
        keep: List[Any] = []
        _set_openai_sampling(s, presence_penalty, frequency_penalty, logit_bias, keep)
        p.sampling = s
        p.keep = keep
        return p

    # ---- generation --------------------------------------------------------------------------

    def generate_ids(self, prompts: Any, max_tokens: int = 128, temperature: float = 0.0,
                     top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                     repetition_penalty: float = 1.0, seed: int = 0,
                     ignore_eos: bool = False, presence_penalty: float = 0.0,
                     frequency_penalty: float = 0.0,
                     logit_bias: Optional[Mapping[int, float]] = None) -> List[List[int]]:
        """The new token ids of each prompt (an end-of-sequence id that ended one included, as
        Hugging Face's ``generate`` keeps it). Arguments as :meth:`generate`."""
        ids, cu = self._pack(prompts)
        n = cu.size - 1
        params = self._params(max_tokens, temperature, top_k, top_p, min_p, repetition_penalty,
                              seed, ignore_eos, presence_penalty, frequency_penalty, logit_bias)
        if n == 0:
            return []
        out = np.zeros((n, max(params.max_tokens, 1)), dtype=np.int32)
        counts = np.zeros(n, dtype=np.int32)
        state = _StreamState()
        _call_in_thread(self, state, ids, cu, params, out, counts, None)
        return [out[i, :counts[i]].tolist() for i in range(n)]

    def generate(self, prompts: Any, max_tokens: int = 128, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, seed: int = 0,
                 ignore_eos: bool = False, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0,
                 logit_bias: Optional[Mapping[int, float]] = None) -> List[str]:
        """Generates text for each prompt; returns one string per prompt (a list also for one).

        Args:
            prompts: a text, or a list of token ids, or a list of texts and id lists. Texts are
                tokenized with the model's tokenizer, its special tokens added as Hugging Face
                adds them (apply the chat template yourself: the text goes in as it is).
            max_tokens: new tokens per prompt at most (0: none).
            temperature: 0: greedy (the most likely id); > 0: sample from softmax(logits / t).
            top_k: keep the k most likely ids (0: all).
            top_p: keep the smallest set of ids whose probability reaches p (1: all).
            min_p: drop ids below min_p times the top probability (0: none).
            repetition_penalty: ids already in the prompt or the output get logit / r when
                positive, logit * r when negative (Hugging Face's rule; 1: off).
            seed: the prompt's random stream; a prompt gives the same tokens alone or batched.
            ignore_eos: keep going past the model's end-of-sequence ids.
            presence_penalty, frequency_penalty: OpenAI's, in [-2, 2] (0: off), over the ids
                generated so far (not the prompt): an id's logit loses frequency_penalty times
                its count, then presence_penalty once if it appeared.
            logit_bias: {token id: bias in [-100, 100]} added to the logits first (OpenAI's).

        Returns:
            The new text of each prompt (special tokens such as the end-of-sequence one left
            out), decoded exactly as Hugging Face's ``decode(..., skip_special_tokens=True)``.

        Raises:
            InvalidArgumentError: a sampling setting out of range (the library's message), an
                id outside the vocabulary, an empty prompt, a text prompt without a tokenizer.
            TooLongError: a prompt plus max_tokens exceeds the model's context.
            OutOfMemoryError: the prompts need more KV blocks than ``kv_cache_tokens`` holds.
        """
        outs = self.generate_ids(prompts, max_tokens, temperature, top_k, top_p, min_p,
                                 repetition_penalty, seed, ignore_eos, presence_penalty,
                                 frequency_penalty, logit_bias)
        if not outs:
            return []
        tok = self._need_tokenizer()
        return [tok.decode(ids, skip_special_tokens=True) for ids in outs]

    def stream(self, prompt: Prompt, max_tokens: int = 128, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
               repetition_penalty: float = 1.0, seed: int = 0,
               ignore_eos: bool = False, presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0,
               logit_bias: Optional[Mapping[int, float]] = None) -> "TokenStream":
        """Generates for one prompt, yielding the text as the tokens come.

        >>> for piece in gen.stream(prompt, max_tokens=64):
        ...     print(piece, end="", flush=True)

        Each piece is whole characters (a character split over several byte-level tokens
        comes out when its last byte does); the pieces joined equal :meth:`generate`'s text.
        The generation runs in a background thread; breaking out of the loop, or
        :meth:`TokenStream.close`, stops it at the next token. Arguments as :meth:`generate`;
        bad arguments raise here, before anything runs.
        """
        if not isinstance(prompt, (_TEXT, np.ndarray)):
            try:
                items = list(prompt)
            except TypeError:
                raise TypeError("prompt must be a str or a list of ids, not %s"
                                % type(prompt).__name__) from None
            if not all(_is_scalar(x) for x in items):
                raise TypeError("stream takes one prompt (a str or a list of ids); use "
                                "generate for several")
            prompt = items
        ids, cu = self._pack(prompt)
        params = self._params(max_tokens, temperature, top_k, top_p, min_p, repetition_penalty,
                              seed, ignore_eos, presence_penalty, frequency_penalty, logit_bias)
        # the library checks the settings and the prompt at once when there is nothing to run
        check = _native.GenerateParams.from_buffer_copy(params)
        check.max_tokens = 0
        lib = _native.library()
        with self._use() as model:
            _native.check(lib.nopad_generate(lib.nopad_model_context(model), 1, _native.ptr(cu),
                                             _native.ptr(ids), ctypes.byref(check), None, None,
                                             _native.TokenFn(), None))
        decoder = DecodeStream(self._need_tokenizer(), skip_special_tokens=True)
        return TokenStream(self, ids, cu, params, decoder)

    # ---- low level: sequences and steps ------------------------------------------------------

    def decode(self, seqs: Any, tokens_per_seq: Any, all_logits: bool = False) -> np.ndarray:
        """One forward step over new tokens of several sequences (nopad_decode): sequence i
        takes ``tokens_per_seq[i]`` (a prompt, a chunk of one, or one token), appended to its
        history in the KV pool. For scoring, and for decoding loops of your own.

        Args:
            seqs: a list of :class:`Sequence` of this generator (each at most once), or one.
            tokens_per_seq: a list of id lists, one per sequence (or one id list for one
                sequence), each at least one id.
            all_logits: return the logits of every new token instead of each sequence's last.

        Returns:
            float32 logits ``[len(seqs), vocab_size]``, or ``[total new tokens, vocab_size]``
            with all_logits (in the order given).

        Raises:
            InvalidArgumentError: an id outside the vocabulary, a sequence twice or of another
                generator, more tokens than ``max_batch_tokens``. Nothing changes on an error.
            TooLongError: a sequence would pass the model's context.
            OutOfMemoryError: the KV pool is exhausted (free finished sequences).
        """
        if isinstance(seqs, Sequence):
            seqs = [seqs]
            tokens_per_seq = [tokens_per_seq]
        seqs = list(seqs)
        tokens_per_seq = list(tokens_per_seq)
        if not seqs:
            raise InvalidArgumentError("decode needs at least one sequence")
        if len(tokens_per_seq) != len(seqs):
            raise InvalidArgumentError("%d sequences but %d token lists"
                                       % (len(seqs), len(tokens_per_seq)))
        for i, s in enumerate(seqs):
            if not isinstance(s, Sequence):
                raise TypeError("seqs[%d] is a %s, not a nopad.Sequence" % (i, type(s).__name__))
            if s._gen is not self:
                raise InvalidArgumentError("seqs[%d] belongs to another Generator" % i)
        parts = [self._ids(t, "tokens_per_seq[%d]" % i) for i, t in enumerate(tokens_per_seq)]
        cu = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=cu[1:])
        if cu[-1] > 2**31 - 1:
            raise InvalidArgumentError("more than 2^31 - 1 tokens in one step")
        cu32 = cu.astype(np.int32)
        ids = np.ascontiguousarray(np.concatenate(parts), dtype=np.int32)
        rows = int(cu[-1]) if all_logits else len(seqs)
        logits = np.empty((rows, self.info.vocab_size), dtype=np.float32)
        lib = _native.library()
        with contextlib.ExitStack() as stack:
            model = stack.enter_context(self._use())
            ptrs = (ctypes.c_void_p * len(seqs))(*[stack.enter_context(s._use()) for s in seqs])
            st = lib.nopad_decode(lib.nopad_model_context(model), len(seqs), ptrs,
                                  _native.ptr(cu32), _native.ptr(ids), 1 if all_logits else 0,
                                  _native.ptr(logits))
            _native.check(st)
        return logits

    def sequence(self) -> "Sequence":
        """A new, empty :class:`Sequence` on this generator (as ``nopad.Sequence(gen)``)."""
        return Sequence(self)


class Sequence:
    """A sequence's history in a :class:`Generator`'s paged KV pool, for
    :meth:`Generator.decode`. It grows by the tokens each step brings; its KV blocks go back to
    the pool when it is closed (or collected). Closing the generator closes its sequences.

    >>> seq = nopad.Sequence(gen)
    >>> logits = gen.decode([seq], [prompt_ids], all_logits=True)  # [len(prompt_ids), vocab]
    >>> len(seq)
    7
    """

    def __init__(self, generator: Generator):
        if not isinstance(generator, Generator):
            raise TypeError("Sequence needs a nopad.Generator, not %s" % type(generator).__name__)
        self._gen = generator  # the model outlives the sequence
        self._handle: Optional[Handle] = None
        lib = _native.library()
        out = ctypes.c_void_p()
        with generator._use() as model:
            _native.check(lib.nopad_sequence_create(lib.nopad_model_context(model),
                                                    ctypes.byref(out)))
            # registered while the model is in use, so that a close() in another thread,
            # which waits for that, frees the sequence before the model
            self._handle = Handle(out.value, lib.nopad_sequence_free, "Sequence")
            generator._seq_handles.add(self._handle)

    @contextlib.contextmanager
    def _use(self) -> Iterator[int]:
        if self._handle is None:
            raise InvalidArgumentError("Sequence is closed")
        with self._handle.use() as ptr:
            yield ptr

    @property
    def length(self) -> int:
        """Tokens in the history so far."""
        with self._use() as ptr:
            return int(_native.library().nopad_sequence_length(ptr))

    def __len__(self) -> int:
        return self.length

    def close(self) -> None:
        """Gives the sequence's KV blocks back to the pool. Idempotent."""
        if self._handle is not None:
            self._handle.close()
            self._gen._seq_handles.discard(self._handle)

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def __enter__(self) -> "Sequence":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            try:
                handle.close_unlocked()
                self._gen._seq_handles.discard(handle)
            except Exception:  # interpreter shutdown: the library may be gone already
                pass

    def __repr__(self) -> str:
        return "<nopad.Sequence %s>" % ("closed" if self.closed else "of %d tokens" % self.length)


def _model_free(engines: "set[Handle]", seqs: "set[Handle]"):
    """The model's free function: closes the engines running on it (which stops and joins their
    threads) and frees its sequences first. It holds the sets, not the Generator, so the handle
    makes no reference cycle."""
    lib = _native.library()

    def free(ptr: int) -> None:
        for h in list(engines) + list(seqs):
            h.close()
        engines.clear()
        seqs.clear()
        lib.nopad_model_free(ptr)

    return free


class _StreamState:
    """What a stream's worker thread shares with its consumer (not the TokenStream itself, so
    an abandoned stream is collected and stops the worker)."""

    __slots__ = ("stop", "queue", "ids", "__weakref__")

    def __init__(self) -> None:
        self.stop = False
        self.queue: "queue.Queue[Any]" = queue.Queue()
        self.ids: List[int] = []


_END = object()


class _Raised:
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def _generate(gen: Generator, state: _StreamState, ids: np.ndarray, cu: np.ndarray,
              params: "_native.GenerateParams", out: Optional[np.ndarray],
              counts: Optional[np.ndarray], decoder: Optional[DecodeStream]) -> None:
    """nopad_generate (run by a worker thread). Each token is checked against state.stop (set by
    close() or an interrupt: the prompts stop there) and, with a decoder, decoded into
    state.queue as soon as the library chooses it. Errors go to the queue; _END ends it."""
    q = state.queue

    def on_token(user: Any, prompt: int, token: int) -> int:
        if state.stop:
            return 1
        if decoder is None:
            return 0
        try:
            state.ids.append(int(token))
            piece = decoder.step(int(token))
            if piece:
                q.put(piece)
            return 1 if state.stop else 0
        except BaseException as e:
            q.put(_Raised(e))
            state.stop = True
            return 1

    cb = _native.TokenFn(on_token)
    lib = _native.library()
    try:
        with gen._use() as model:
            st = lib.nopad_generate(lib.nopad_model_context(model), cu.size - 1, _native.ptr(cu),
                                    _native.ptr(ids), ctypes.byref(params), _native.ptr(out),
                                    _native.ptr(counts), cb, None)
            if st != 0:
                # nopad_last_error is per thread: read it here
                msg = _native.last_error() or lib.nopad_status_string(st).decode()
                q.put(_Raised(error_for(st, msg)))
        if decoder is not None and not state.stop:
            tail = decoder.flush()
            if tail:
                q.put(tail)
    except BaseException as e:
        q.put(_Raised(e))
    finally:
        if decoder is not None:
            decoder.close()
        q.put(_END)


def _call_in_thread(gen: Generator, state: _StreamState, ids: np.ndarray, cu: np.ndarray,
                    params: "_native.GenerateParams", out: np.ndarray, counts: np.ndarray,
                    decoder: Optional[DecodeStream]) -> None:
    """Runs _generate in a worker thread and waits for it. The wait is interruptible: Ctrl-C
    (KeyboardInterrupt) stops the prompts at their next token, then is raised again."""
    gen._streams.add(state)
    worker = threading.Thread(target=_generate, name="nopad-generate", daemon=True,
                              args=(gen, state, ids, cu, params, out, counts, decoder))
    worker.start()
    try:
        worker.join()
    except BaseException:
        state.stop = True
        worker.join()
        raise
    while True:
        item = state.queue.get()
        if item is _END:
            return
        if isinstance(item, _Raised):
            raise item.error


class TokenStream:
    """The text of one prompt as it is generated (from :meth:`Generator.stream`): iterate for
    the pieces. :attr:`token_ids` holds the ids produced so far. Closing it (or leaving a
    ``with`` block, or breaking out of a ``for`` loop and dropping it) stops the generation at
    the next token."""

    def __init__(self, gen: Generator, ids: np.ndarray, cu: np.ndarray,
                 params: "_native.GenerateParams", decoder: DecodeStream):
        self._state = _StreamState()
        self._done = False
        gen._streams.add(self._state)
        self._thread = threading.Thread(target=_generate, name="nopad-stream", daemon=True,
                                        args=(gen, self._state, ids, cu, params, None, None,
                                              decoder))
        self._thread.start()

    @property
    def token_ids(self) -> List[int]:
        """The ids generated so far (the end-of-sequence id that ended it included)."""
        return list(self._state.ids)

    def __iter__(self) -> "TokenStream":
        return self

    def __next__(self) -> str:
        if self._done:
            raise StopIteration
        item = self._state.queue.get()
        if item is _END:
            self._done = True
            self._thread.join()
            raise StopIteration
        if isinstance(item, _Raised):
            self.close()
            raise item.error
        return item

    def close(self) -> None:
        """Stops the generation at the next token and waits for the worker. Idempotent."""
        self._state.stop = True
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self._done = True

    def __enter__(self) -> "TokenStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        state = getattr(self, "_state", None)
        if state is not None:
            state.stop = True
