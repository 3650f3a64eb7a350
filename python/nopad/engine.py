"""nopad.Engine: requests from any thread, fused into one packed decoder step per iteration."""
from __future__ import annotations

import ctypes
import json
from typing import Any, Iterator, List, Mapping, Optional, Sequence as SequenceT, Tuple, Union

import numpy as np

from . import _arrays, _native
from ._handle import Handle
from .encoder import PathLike, _int_arg
from .errors import InvalidArgumentError
from .generator import Generator, _float_arg, _is_int, _set_openai_sampling
from .tokenizer import prompt_utf8

__all__ = ["Engine", "Request"]

_TEXT = (str, bytes, bytearray, memoryview)
FINISH_NAMES = {0: None, 1: "length", 2: "stop", 3: "cancelled", 4: "error"}


class Engine:
    """The temporal-fusion engine on a decoder: requests submitted from any thread at any time
    run together, every iteration one packed step over the next token of every running request
    and chunks of new prompts; a request starts without waiting for others and leaves the moment
    it is done. It runs on a thread of its own in the library.

    >>> with nopad.Generator("SmolLM2-135M-Instruct.Q4_1.gguf") as gen, nopad.Engine(gen) as eng:
    ...     reqs = [eng.submit(p, max_tokens=32) for p in prompts]   # from any threads
    ...     answers = [r.result() for r in reqs]

    Each :class:`Request` is a stream: iterate it for the text as it comes, or call
    :meth:`Request.result` for the whole text. A request's tokens depend only on its prompt and
    seed, never on what shares its steps. Prompts that share their first KV blocks share them
    (a common system prompt is computed once).
    """

    def __init__(self, model: Union[Generator, PathLike], device: str = "cpu",
                 dtype: Optional[str] = None, kv_cache_tokens: Optional[int] = None,
                 max_step_tokens: Optional[int] = None, max_running: Optional[int] = None,
                 max_queue: Optional[int] = None, kv_block_size: Optional[int] = None,
                 prefix_sharing: bool = True, threads: int = 0,
                 overlap_steps: Optional[bool] = None, weights: str = "auto"):
        """Starts an engine on `model`: a :class:`Generator` (whose loaded weights it shares;
        it must stay open while the engine runs) or a GGUF file / model folder (loaded here,
        with `device`, `dtype`, `threads` and `weights` (as :class:`Generator` takes them);
        closed with the engine).

        Args:
            kv_cache_tokens: the engine's own KV pool in tokens over all running requests
                (None: the library's default, 8192).
            max_step_tokens: tokens in one step (next tokens + prompt chunks; default 2048).
            max_running: requests admitted at once (default 256).
            max_queue: requests waiting at most; one more is refused with
                :class:`QueueFullError` (default 1024).
            kv_block_size: tokens per KV block, the unit of sharing (default 16).
            prefix_sharing: share the KV blocks of equal prompt prefixes.
            overlap_steps: plan and queue step n+1 before step n's ids are back (None: where
                the device samples, i.e. on CUDA; on the CPU it only holds each id back a step).
        """
        self._handle: Optional[Handle] = None
        self._own_generator = not isinstance(model, Generator)
        self.generator = (Generator(model, device=device, dtype=dtype, kv_cache_tokens=16,
                                    max_batch_tokens=16, threads=threads, weights=weights)
                          if self._own_generator else model)
        lib = _native.library()
        p = lib.nopad_engine_default_params()
        if kv_cache_tokens is not None:
            p.kv_cache_tokens = _int_arg(kv_cache_tokens, "kv_cache_tokens", 1)
        if max_step_tokens is not None:
            p.max_step_tokens = _int_arg(max_step_tokens, "max_step_tokens", 1)
        if max_running is not None:
            p.max_running = _int_arg(max_running, "max_running", 1)
        if max_queue is not None:
            p.max_queue = _int_arg(max_queue, "max_queue", 1)
        if kv_block_size is not None:
            p.kv_block_size = _int_arg(kv_block_size, "kv_block_size", 1)
        p.prefix_sharing = 1 if prefix_sharing else 0
        if overlap_steps is not None:
            p.overlap_steps = 1 if overlap_steps else 0
        out = ctypes.c_void_p()
        try:
            with self.generator._use() as m:
                _native.check(lib.nopad_engine_create(m, ctypes.byref(p), ctypes.byref(out)))
                # registered while the model is in use: Generator.close(), which waits for
                # that, then closes this engine (joining its thread) before freeing the weights
                self._handle = Handle(out.value, lib.nopad_engine_free, "Engine")
                self.generator._engine_handles.add(self._handle)
        except BaseException:
            if self._own_generator:
                self.generator.close()
            raise

    # ---- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Cancels what is still running and stops the engine (requests stay readable)."""
        if self._handle is not None:
            self._handle.close()
            self.generator._engine_handles.discard(self._handle)
        if self._own_generator:
            self.generator.close()

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ---- requests ----------------------------------------------------------------------------

    def submit(self, prompt: Any, max_tokens: int = 128, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
               repetition_penalty: float = 1.0, seed: int = 0, ignore_eos: bool = False,
               stop: Union[None, str, SequenceT[str]] = None,
               stop_ids: Optional[SequenceT[int]] = None, logprobs: bool = False,
               json_schema: Any = None, json_object: bool = False, regex: Optional[str] = None,
               choices: Optional[SequenceT[str]] = None, presence_penalty: float = 0.0,
               frequency_penalty: float = 0.0, logit_bias: Optional[Mapping[int, float]] = None,
               top_logprobs: int = 0) -> "Request":
        """Submits one request (safe from any thread) and returns its :class:`Request`.

        Args:
            prompt: a text (tokenized with the model's tokenizer, special tokens added) or a
                list of token ids.
            max_tokens: new tokens at most (>= 1).
            temperature, top_k, top_p, min_p, repetition_penalty, seed, ignore_eos: as
                :meth:`Generator.generate`.
            stop: a string or strings that end the request (its text stops before them).
            stop_ids: ids that end the request (the id is kept).
            logprobs: keep each generated id's log-probability (:meth:`Request.logprobs`).
            presence_penalty, frequency_penalty, logit_bias, top_logprobs: as
                :meth:`Generator.generate` for the first three; top_logprobs (0 to 20) keeps each
                generated id's step's that many most likely ids (:meth:`Request.top_logprobs`).
            json_schema, json_object, regex, choices: at most one; the output is then a JSON
                document valid under the schema (a dict, its JSON text, or a Pydantic model
                class), any JSON object, a text the regex matches whole, or one of the choices.
                Each step chooses only among the tokens that keep it so (docs/grammar.md); it
                ends once the document is whole, or at max_tokens (finish_reason "length").

        Raises:
            InvalidArgumentError: an empty prompt, bad sampling settings, ids outside the
                vocabulary, text or stop strings without a tokenizer.
            TooLongError: prompt + max_tokens exceed the model's context or the KV pool.
            QueueFullError: max_queue requests are waiting already (retry later).
            UnsupportedError: a schema keyword nopad does not enforce (named with its path).
        """
        lib = _native.library()
        p = lib.nopad_request_default_params()
        constraint = _constraint(json_schema, json_object, regex, choices)
        keep: List[Any] = []  # buffers the call reads
        vocab = self.generator.info.vocab_size
        if isinstance(prompt, _TEXT):
            raw = prompt_utf8(prompt, "prompt")  # the library reads it as a C string: no NUL
            buf = ctypes.create_string_buffer(raw, len(raw) + 1)
            keep.append(buf)
            p.prompt_text = ctypes.cast(buf, ctypes.c_char_p)
        else:
            ids32 = _arrays.token_ids(prompt, "prompt", vocab)
            keep.append(ids32)
            p.prompt_ids = _native.ptr(ids32)
            p.n_prompt_ids = int(ids32.size)
        p.max_tokens = _int_arg(max_tokens, "max_tokens", -2**31)
        p.ignore_eos = 1 if ignore_eos else 0
        p.logprobs = 1 if logprobs else 0
        p.top_logprobs = _int_arg(top_logprobs, "top_logprobs", -2**31)
        s = p.sampling
        s.temperature = _float_arg(temperature, "temperature")
        s.top_k = _int_arg(top_k, "top_k", -2**31)
        s.top_p = _float_arg(top_p, "top_p")
        s.min_p = _float_arg(min_p, "min_p")
        s.repetition_penalty = _float_arg(repetition_penalty, "repetition_penalty")
        if not _is_int(seed) or not 0 <= int(seed) <= 2**64 - 1:
            raise InvalidArgumentError("seed must be an int in [0, 2^64)")
        s.seed = int(seed)
        _set_openai_sampling(s, presence_penalty, frequency_penalty, logit_bias, keep)
        p.sampling = s
        if stop is not None:
            if isinstance(stop, _TEXT):
                stops = [prompt_utf8(stop, "stop")]
            else:
                try:
                    items = list(stop)
                except TypeError:
                    raise TypeError("stop must be a str or a list of str, not %s"
                                    % type(stop).__name__) from None
                stops = [prompt_utf8(x, "stop[%d]" % i) for i, x in enumerate(items)]
            arr = (ctypes.c_char_p * max(len(stops), 1))(*stops)
            keep.append(arr)
            p.stop_strings = ctypes.cast(arr, ctypes.c_void_p)
            p.n_stop_strings = len(stops)
        if stop_ids is not None:
            sid = _arrays.token_ids(stop_ids, "stop_ids", vocab)
            keep.append(sid)
            p.stop_ids = _native.ptr(sid)
            p.n_stop_ids = int(sid.size)
        out = ctypes.c_void_p()
        p.constraint = constraint
        try:
            with self._handle.use() as e:
                _native.check(lib.nopad_engine_submit(e, ctypes.byref(p), ctypes.byref(out)))
        finally:
            if constraint:
                lib.nopad_constraint_free(constraint)  # the request holds its own reference
        return Request(self, out.value, p.top_logprobs)

    def stats(self) -> dict:
        """The engine's counters (running, waiting, KV blocks, steps, tokens, preemptions, ...)."""
        lib = _native.library()
        st = _native.EngineStats()
        with self._handle.use() as e:
            _native.check(lib.nopad_engine_get_stats(e, ctypes.byref(st)))
        return {name: getattr(st, name) for name, _ in _native.EngineStats._fields_}


def _constraint(json_schema: Any, json_object: bool, regex: Optional[str],
                choices: Optional[SequenceT[str]]) -> Optional[int]:
    """The nopad_constraint that submit's arguments ask for, or None."""
    given = [x for x in (json_schema is not None, bool(json_object), regex is not None,
                         choices is not None) if x]
    if len(given) > 1:
        raise InvalidArgumentError("give at most one of json_schema, json_object, regex and choices")
    if not given:
        return None
    lib = _native.library()
    out = ctypes.c_void_p()
    if json_schema is not None:
        if hasattr(json_schema, "model_json_schema"):  # a Pydantic model class
            json_schema = json_schema.model_json_schema()
        text = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
        raw = text.encode("utf-8")
        _native.check(lib.nopad_constraint_json_schema(raw, len(raw), ctypes.byref(out)))
    elif json_object:
        _native.check(lib.nopad_constraint_json_object(ctypes.byref(out)))
    elif regex is not None:
        raw = prompt_utf8(regex, "regex")
        _native.check(lib.nopad_constraint_regex(raw, len(raw), ctypes.byref(out)))
    else:
        if isinstance(choices, _TEXT):
            raise TypeError("choices must be a list of str, not a str")
        items = [prompt_utf8(x, "choices[%d]" % i) for i, x in enumerate(choices)]
        arr = (ctypes.c_char_p * max(len(items), 1))(*items)
        _native.check(lib.nopad_constraint_choices(arr, len(items), ctypes.byref(out)))
    return out.value


class Request:
    """One submitted request: iterate it for its text as it comes (whole characters), or call
    :meth:`result`. Thread-safe to cancel; one reader at a time."""

    def __init__(self, engine: Engine, handle: int, top_logprobs: int = 0):
        self.engine = engine
        self._handle = Handle(handle, _native.library().nopad_request_free, "Request")
        self.ids: List[int] = []
        self.finish_reason: Optional[str] = None
        self._top_logprobs = top_logprobs
        self._text_seen = 0
        self.id = int(_native.library().nopad_request_id(handle))

    def close(self) -> None:
        """Releases the request (cancels it if it is still running)."""
        self._handle.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def cancel(self) -> None:
        """Asks the request to stop; it ends as "cancelled" at the engine's next iteration."""
        with self._handle.use() as r:
            _native.check(_native.library().nopad_request_cancel(r))

    def read(self, timeout: Optional[float] = None) -> List[int]:
        """The next new ids (at least one unless the request has ended or `timeout` seconds
        passed; None: wait). Sets :attr:`finish_reason` at the end."""
        lib = _native.library()
        buf = np.zeros(256, dtype=np.int32)
        n = ctypes.c_int32()
        fin = ctypes.c_int()
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        with self._handle.use() as r:
            _native.check(lib.nopad_request_read(r, _native.ptr(buf), buf.size, ctypes.byref(n),
                                                 ctypes.byref(fin), ms))
        got = buf[:n.value].tolist()
        self.ids += got
        if fin.value != 0:
            self.finish_reason = FINISH_NAMES.get(fin.value, "error")
        return got

    def text(self) -> str:
        """The text so far (complete once the request has ended)."""
        lib = _native.library()
        size = ctypes.c_size_t()
        with self._handle.use() as r:
            st = lib.nopad_request_text(r, None, 0, ctypes.byref(size))
            if st not in (0, int(_native.STATUS_BUFFER_TOO_SMALL)):
                _native.check(st)
            buf = ctypes.create_string_buffer(size.value + 1)
            _native.check(lib.nopad_request_text(r, buf, size.value + 1, ctypes.byref(size)))
        return buf.raw[:size.value].decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        while self.finish_reason is None:
            self.read()
            text = self.text()
            if len(text) > self._text_seen:
                piece, self._text_seen = text[self._text_seen:], len(text)
                yield piece
        text = self.text()
        if len(text) > self._text_seen:
            piece, self._text_seen = text[self._text_seen:], len(text)
            yield piece

    def result(self, timeout: Optional[float] = None) -> str:
        """Waits for the end and returns the whole text (`timeout` seconds at most per read;
        TimeoutError past it)."""
        while self.finish_reason is None:
            if not self.read(timeout) and self.finish_reason is None and timeout is not None:
                raise TimeoutError("request %d: no token within %s s" % (self.id, timeout))
        return self.text()

    def logprobs(self) -> List[float]:
        """The log-probabilities of the ids delivered so far (submitted with logprobs=True): under
        the distribution each id was drawn from; for greedy, the model's at temperature 1."""
        lib = _native.library()
        n = ctypes.c_int32()
        with self._handle.use() as r:
            _native.check(lib.nopad_request_logprobs(r, None, 0, ctypes.byref(n)))
            buf = np.empty(max(n.value, 1), np.float32)
            _native.check(lib.nopad_request_logprobs(r, _native.ptr(buf), buf.size, ctypes.byref(n)))
        return buf[:min(n.value, buf.size)].tolist()

    def top_logprobs(self) -> List[List[Tuple[int, float]]]:
        """For each id delivered so far (submitted with top_logprobs=k): its step's k most likely
        ids with their log-probabilities, most likely first (ties: the lower id first), in the
        distribution :meth:`logprobs` uses; -inf for an id the sampling's filters dropped."""
        lib = _native.library()
        n = ctypes.c_int32()
        with self._handle.use() as r:
            _native.check(lib.nopad_request_top_logprobs(r, None, None, 0, ctypes.byref(n)))
            k = self._top_logprobs
            ids = np.empty(max(n.value * k, 1), np.int32)
            lps = np.empty(max(n.value * k, 1), np.float32)
            _native.check(lib.nopad_request_top_logprobs(r, _native.ptr(ids), _native.ptr(lps), n.value,
                                                         ctypes.byref(n)))
        return [[(int(ids[i * k + j]), float(lps[i * k + j])) for j in range(k)] for i in range(n.value)]

    def stats(self) -> dict:
        lib = _native.library()
        st = _native.RequestStats()
        with self._handle.use() as r:
            _native.check(lib.nopad_request_get_stats(r, ctypes.byref(st)))
        d = {name: getattr(st, name) for name, _ in _native.RequestStats._fields_}
        d["finish"] = FINISH_NAMES.get(d["finish"], "error")
        return d

    def __repr__(self) -> str:
        return "<nopad.Request %d: %d ids, %s>" % (self.id, len(self.ids),
                                                   self.finish_reason or "running")
