"""nopad.Encoder: a BERT-family encoder (BERT, RoBERTa / XLM-R, DistilBERT, ALBERT, DeBERTa-v2/v3),
with its classification or cross-encoder head when the folder has one."""
from __future__ import annotations

import ctypes
import dataclasses
import os
import stat
from typing import Any, Dict, Iterable, List, Optional, Union

import numpy as np

from . import _arrays, _native
from ._handle import Handle
from .errors import FileError, InvalidArgumentError, UnsupportedError
from .tokenizer import Text, Tokenizer, as_utf8

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["Encoder", "ModelInfo", "DEFAULT_BATCH_TOKENS"]

DEFAULT_BATCH_TOKENS = 16384  # as the CLI's --batch-tokens

_DEVICES = {"cpu": _native.DEVICE_CPU, "cuda": _native.DEVICE_CUDA}
_DTYPES = {"fp32": _native.DTYPE_F32, "float32": _native.DTYPE_F32, "f32": _native.DTYPE_F32,
           "fp16": _native.DTYPE_F16, "float16": _native.DTYPE_F16, "f16": _native.DTYPE_F16,
           "half": _native.DTYPE_F16,
           "bf16": _native.DTYPE_BF16, "bfloat16": _native.DTYPE_BF16}



def _check_model_folder(path: Union[str, bytes]) -> None:
    """Raises FileError unless `path` is a folder, in the CLI's words (tools/cli/common.c,
    open_model): "does not exist", "is not a folder", or the system's reason (a symlink loop:
    "Too many levels of symbolic links"), as the library says too; checked here first so that a path
    ctypes cannot pass (an embedded NUL) gets a clear error as well."""
    shown = os.fsdecode(path)
    # a path named .gguf is a GGUF file: missing, it says so; a file, the library says what its
    # first bytes are
    gguf_name = shown.lower().endswith(".gguf")
    what = "GGUF file" if gguf_name else "model folder"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileError("%s '%s' does not exist" % (what, shown)) from None
    except OSError as e:
        raise FileError("%s '%s': %s" % (what, shown, os.strerror(e.errno) if e.errno
                                         else e)) from None
    except ValueError as e:  # an embedded NUL
        raise InvalidArgumentError("%s %r: %s" % (what, shown, e)) from None
    if gguf_name and stat.S_ISREG(st.st_mode):
        return
    if not stat.S_ISDIR(st.st_mode):
        raise FileError("model folder '%s' is not a folder" % shown)

@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a model folder or GGUF file holds (nopad_model_info)."""

    model_type: str          # config.json model_type: "bert", "roberta", ...
    family: str              # "BERT", "RoBERTa", "DistilBERT", "ALBERT", "DeBERTa-v2"
    activation: str          # "gelu", "gelu_new", "relu", ...
    weights_dtype: str       # dtype of the tensors in the file: "F32", "F16", "BF16" or "mixed"
    compute_dtype: str       # "F32", "F16", "BF16"
    device: str              # "cpu" or "cuda"
    vocab_size: int
    hidden_size: int
    embedding_size: int      # != hidden_size for ALBERT's factorised embeddings
    num_layers: int
    num_heads: int
    head_size: int
    intermediate_size: int
    max_position_embeddings: int
    max_seq_length: int      # longest sequence accepted (sentence-transformers or positions)
    type_vocab_size: int     # 0 when the family has no token types
    layer_norm_eps: float
    n_params: int
    pooling: str             # the folder's default pooling: "cls", "mean", "max" (CLS if unset)
    normalize: bool          # whether the folder's pipeline L2-normalises
    has_tokenizer: bool
    tokenizer_kind: str      # "tokenizer.json", "vocab.txt", "gguf", "none" or "unsupported"
    is_decoder: bool = False # a decoder (nopad.Generator) rather than an encoder
    num_kv_heads: int = 0    # key/value heads (grouped-query attention in decoders)
    bos_token_id: Optional[int] = None  # decoders: the beginning-of-sequence id, if any
    eos_token_id: Optional[int] = None  # decoders: the first end-of-sequence id, if any

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _s(b: Optional[bytes]) -> str:
    return b.decode("utf-8", "replace") if b else ""


def _model_info(info: "_native.ModelInfo", device: int) -> ModelInfo:
    """The ModelInfo of a filled nopad_model_info."""
    decoder = bool(info.is_decoder)
    return ModelInfo(
        model_type=_s(info.model_type), family=_s(info.family),
        activation=_s(info.activation), weights_dtype=_s(info.weights_dtype),
        compute_dtype=_s(info.compute_dtype),
        device="cuda" if device == _native.DEVICE_CUDA else "cpu",
        vocab_size=info.vocab_size, hidden_size=info.hidden_size,
        embedding_size=info.embedding_size, num_layers=info.num_layers,
        num_heads=info.num_heads, head_size=info.head_size,
        intermediate_size=info.intermediate_size,
        max_position_embeddings=info.max_position_embeddings,
        max_seq_length=info.max_seq_length, type_vocab_size=info.type_vocab_size,
        layer_norm_eps=float(info.layer_norm_eps), n_params=int(info.n_params),
        pooling=_native.POOLING_NAMES.get(int(info.pooling), "cls"),
        normalize=bool(info.normalize), has_tokenizer=bool(info.has_tokenizer),
        tokenizer_kind=_s(info.tokenizer_kind) or "none", is_decoder=decoder,
        num_kv_heads=int(info.num_kv_heads),
        bos_token_id=int(info.bos_token_id) if decoder and info.bos_token_id >= 0 else None,
        eos_token_id=int(info.eos_token_id) if decoder and info.eos_token_id >= 0 else None)


def _is_gguf_file(path: Union[str, bytes]) -> bool:
    """Whether `path` is a regular file starting with the GGUF magic."""
    try:
        if not os.path.isfile(path):
            return False
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except (OSError, ValueError):
        return False


def _encode(model: Any, batch: "_native.Batch", params: "_native.EncodeParams", hidden: Any,
            pooled: Any) -> int:
    """nopad_encode on the model's default context; hidden and pooled are addresses or None."""
    lib = _native.library()
    return lib.nopad_encode(lib.nopad_model_context(model), ctypes.byref(batch),
                            ctypes.byref(params), hidden, pooled)


def _parse_device(device: Any) -> int:
    name = str(device).lower()  # also takes torch.device("cuda")
    if name in _DEVICES:
        return _DEVICES[name]
    if name.startswith("cuda:"):
        raise UnsupportedError("device %r: nopad runs on the current CUDA device; pass 'cuda' and "
                               "select the GPU with torch.cuda.set_device or "
                               "CUDA_VISIBLE_DEVICES" % str(device))
    raise InvalidArgumentError("device %r is not 'cpu' or 'cuda'" % (device,))


def _parse_dtype(dtype: Any) -> int:
    name = str(dtype).lower()
    if name.startswith("torch."):
        name = name[len("torch."):]
    if name in _DTYPES:
        return _DTYPES[name]
    raise InvalidArgumentError("dtype %r is not 'fp32', 'fp16' or 'bf16'" % (dtype,))


def _parse_pooling(pooling: Optional[str], default: int) -> int:
    if pooling is None:
        return default
    code = _native.POOLING_CODES.get(str(pooling).lower())
    if code is None:
        raise InvalidArgumentError("pooling %r is not one of 'cls', 'mean', 'max', 'none'"
                                   % (pooling,))
    return code


def _int_arg(value: Any, name: str, lo: int, hi: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError("%s must be an int, not %s" % (name, type(value).__name__))
    if not lo <= value <= hi:
        raise InvalidArgumentError("%s must be in [%d, %d], got %d" % (name, lo, hi, value))
    return int(value)


def _tp_size_arg(tp_size: Any) -> int:
    """tp_size checked against the launcher's world: with no launcher the library starts the
    other tp_size - 1 processes itself; under one, its world must have exactly tp_size."""
    tp = _int_arg(tp_size, "tp_size", 1, 1024)
    world = int(_native.library().nopad_world_size())
    if tp > 1 and world not in (1, tp):
        raise InvalidArgumentError(
            "tp_size=%d splits the model over %d processes and the launcher started %d: run the "
            "script under mpirun -np %d python ... (or srun -n %d), or with no launcher, where "
            "nopad starts the workers itself (docs/parallel.md)" % (tp, tp, world, tp, tp))
    return tp


def _model_stream(cuda_stream: Any):
    """(stream object to keep, cudaStream_t for nopad_model_params, CUDA device index or None)."""
    torch = _arrays.torch_module()
    if cuda_stream is None:
        if torch is None:
            try:
                import torch  # device="cuda" callers nearly always have it: streams to share
            except ImportError:
                return None, None, None
        if not torch.cuda.is_available():
            return None, None, None  # the library reports the missing GPU itself
        stream = torch.cuda.Stream()
        return stream, stream.cuda_stream, stream.device.index
    if isinstance(cuda_stream, (int, np.integer)) and not isinstance(cuda_stream, bool):
        index = torch.cuda.current_device() if torch is not None and torch.cuda.is_available() \
            else None
        return int(cuda_stream), int(cuda_stream) or None, index
    ptr = getattr(cuda_stream, "cuda_stream", None)
    if ptr is None:
        raise TypeError("cuda_stream must be a torch.cuda.Stream or an int cudaStream_t, not %s"
                        % type(cuda_stream).__name__)
    return cuda_stream, int(ptr) or None, getattr(cuda_stream.device, "index", None)


class Encoder:
    """A BERT-family encoder loaded from a Hugging Face model folder.

    The folder holds ``config.json`` and ``model.safetensors`` (or a sharded index), optionally a
    tokenizer (``tokenizer.json`` or ``vocab.txt``) and sentence-transformers files, which set
    the default pooling, normalisation and maximum sequence length.

    >>> with nopad.Encoder("path/to/all-MiniLM-L6-v2") as enc:
    ...     emb = enc.encode(["Hello world", "Padding-free inference"])   # float32 [2, 384]

    The GIL is released while the library computes (ctypes foreign calls), so other Python
    threads run meanwhile; calls on one Encoder from several threads are safe (the library
    serialises its forwards). Free the native memory with :meth:`close` or a ``with`` block;
    garbage collection frees it too.
    """

    def __init__(self, path: PathLike, device: str = "cpu", dtype: str = "fp32",
                 max_batch_tokens: int = 0, threads: int = 0, cuda_stream: Any = None,
                 cuda_graph_max_tokens: int = 0, tp_size: int = 1):
        """Loads the model folder `path`.

        Args:
            path: the model folder.
            device: "cpu" or "cuda" (CUDA needs a library built with -DNOPAD_CUDA=ON; the model
                goes to the current CUDA device).
            dtype: compute dtype: "fp32" on the CPU, "fp16" or "bf16" on CUDA. Checkpoints
                stored in F32, F16 or BF16 are converted at load.
            max_batch_tokens: workspace size in tokens, allocated at load (larger batches are
                then refused); 0: grows on demand.
            threads: CPU threads; 0: OpenMP's default (OMP_NUM_THREADS, else all cores).
            cuda_stream: CUDA only: the stream the model runs on, a ``torch.cuda.Stream`` or a
                raw ``cudaStream_t`` (int). Default: a new torch stream when torch is installed,
                else a stream of the library's own. :meth:`forward` on CUDA tensors orders it
                after the caller's current stream and the current stream after it.
            cuda_graph_max_tokens: CUDA only: batches of at most this many tokens replay the
                layers as a CUDA graph recorded per token-count bucket (T rounded up by at most
                1/16); 0: the library default (2048); -1: never.
            tp_size: split the model over this many processes (tensor parallelism). With no
                launcher, nopad starts tp_size - 1 worker processes on this machine (one GPU
                each on CUDA) and ends them when this object closes. Under ``mpirun -np
                tp_size``, this object lives on rank 0 and every other rank calls
                :func:`nopad.tp_follow` with the same path and keywords.

        Raises:
            FileError: missing folder, config.json or weights.
            FormatError: malformed config.json, safetensors or tokenizer.
            UnsupportedError: unsupported model_type, dtype or device (for example "cuda" with a
                library built without CUDA).
            InvalidArgumentError: `path` holds a decoder, or is a GGUF file (use
                :class:`nopad.Generator`); tp_size > 1 is not the launcher's world size.
        """
        self._handle: Optional[Handle] = None
        dev = _parse_device(device)
        dt = _parse_dtype(dtype)
        max_batch_tokens = _int_arg(max_batch_tokens, "max_batch_tokens", 0)
        threads = _int_arg(threads, "threads", 0, 4096)
        lib = _native.library()
        params = lib.nopad_model_default_params()
        params.device = dev
        params.dtype = dt
        params.n_threads = threads
        params.max_batch_tokens = max_batch_tokens
        params.cuda_graph_max_tokens = _int_arg(cuda_graph_max_tokens, "cuda_graph_max_tokens", -1)
        params.tp_size = _tp_size_arg(tp_size)
        self._stream: Any = None  # torch stream, raw cudaStream_t (int) or None
        self._cuda_index: Optional[int] = None
        if dev == _native.DEVICE_CUDA:
            self._stream, params.cuda_stream, self._cuda_index = _model_stream(cuda_stream)
        elif cuda_stream is not None:
            raise InvalidArgumentError("cuda_stream applies to device='cuda'")
        out = ctypes.c_void_p()
        self.path = os.fspath(path)
        if _is_gguf_file(self.path):
            raise InvalidArgumentError("'%s' is a GGUF file, which holds a decoder; nopad.Encoder "
                                       "runs encoders: use nopad.Generator for it"
                                       % os.fsdecode(self.path))
        _check_model_folder(self.path)
        _native.check(lib.nopad_model_load(os.fsencode(path), ctypes.byref(params),
                                           ctypes.byref(out)))
        self._handle = Handle(out.value, lib.nopad_model_free, "Encoder")
        info = _native.ModelInfo()
        _native.check(lib.nopad_model_get_info(out.value, ctypes.byref(info)))
        self._pooling_code = int(info.pooling)
        self.info = _model_info(info, dev)
        if self.info.is_decoder:
            self.close()
            raise InvalidArgumentError(
                "'%s' is a decoder (%s, %s); nopad.Encoder runs encoders: use nopad.Generator "
                "for it" % (self.path, self.info.model_type, self.info.family))
        self._tok_ptr: Optional[int] = lib.nopad_model_tokenizer(out.value) or None
        why = lib.nopad_model_tokenizer_error(out.value)
        self._tokenizer_error: Optional[str] = why.decode("utf-8", "replace") if why else None

    # ---- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Frees the model now: new calls, also through :attr:`tokenizer`, raise
        InvalidArgumentError ("closed") at once; close() waits only for the calls already running
        in other threads, then frees. Closing twice, or from several threads, is fine."""
        if self._handle is not None:
            self._handle.close()

    @property
    def closed(self) -> bool:
        return self._handle is None or self._handle.closed

    def __enter__(self) -> "Encoder":
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
        if self._handle is None:
            return "<nopad.Encoder (failed to load)>"
        i = self.info
        return "<nopad.Encoder %s %s, H=%d, %d layers, %s %s%s>" % (
            i.family, os.path.basename(os.path.normpath(self.path)), i.hidden_size, i.num_layers,
            i.device, i.compute_dtype, ", closed" if self.closed else "")

    # ---- properties --------------------------------------------------------------------------

    @property
    def tokenizer_error(self) -> Optional[str]:
        """Why the folder's tokenizer did not load, when it uses something nopad does not
        implement (the model then works on token ids only: :meth:`forward`); else None."""
        return self._tokenizer_error

    @property
    def tokenizer(self) -> Optional[Tokenizer]:
        """The folder's tokenizer, or None when the folder has none or one nopad does not
        support (see :attr:`tokenizer_error`). It belongs to this encoder (and keeps it alive):
        closing the encoder closes it."""
        if self._tok_ptr is None:
            return None
        # A new view each time: the encoder holds no reference to it, so no cycle delays freeing.
        return Tokenizer._from_model(self, self._handle, self._tok_ptr)

    @property
    def hidden_size(self) -> int:
        return self.info.hidden_size

    @property
    def memory(self) -> dict:
        """Bytes the model holds on its device: ``{"weights", "workspace", "backend"}`` (the
        workspace grows to the largest batch seen unless max_batch_tokens fixed it)."""
        lib = _native.library()
        sizes = [ctypes.c_size_t() for _ in range(3)]
        with self._handle.use() as ptr:
            _native.check(lib.nopad_model_memory(ptr, *(ctypes.byref(x) for x in sizes)))
        return dict(zip(("weights", "workspace", "backend"), (x.value for x in sizes)))

    @property
    def stats(self) -> dict:
        """Counters since load: ``{"forwards", "graph_replays", "graphs_recorded",
        "graphs_held"}`` (CUDA graph replay of small batches, see ``cuda_graph_max_tokens``)."""
        lib = _native.library()
        out = _native.ModelStats()
        with self._handle.use() as ptr:
            _native.check(lib.nopad_model_get_stats(ptr, ctypes.byref(out)))
        return {name: getattr(out, name) for name, _ in out._fields_}

    # ---- text in, embeddings out -------------------------------------------------------------

    def encode(self, sentences: Union[Text, Iterable[Text]], batch_tokens: Optional[int] = None,
               pooling: Optional[str] = None, normalize: Optional[bool] = None,
               truncate: bool = False) -> Union[np.ndarray, List[np.ndarray]]:
        """Embeds sentences, like sentence-transformers' ``encode``.

        Each sentence is tokenized with the folder's tokenizer (special tokens added, at most
        ``info.max_seq_length`` ids), then sentences are grouped in input order into batches of
        at most `batch_tokens` tokens (a longer sentence runs alone), one forward per batch, with
        no padding.

        Args:
            sentences: a list of str (or UTF-8 bytes), or one str.
            batch_tokens: token budget per forward; default 16384 (as the CLI).
            pooling: "cls", "mean", "max" or "none"; default: the folder's (CLS if unset).
            normalize: L2-normalise the pooled rows; default: the folder's setting.
            truncate: cut sentences longer than ``info.max_seq_length`` (keeping the closing
                special token); by default they raise TooLongError.

        Returns:
            float32 array [B, H] (``[H]`` for a single str); for pooling "none", a list of
            float32 arrays [L_b, H], the last hidden state of every token of each sentence.

        Raises:
            TooLongError: a sentence is too long and truncate is False (the message names it).
            InvalidArgumentError: no sentences, invalid UTF-8, bad options.
            FileError: the folder has no tokenizer.
            UnsupportedError: the folder's tokenizer uses something nopad does not implement
                (the message says what; :meth:`forward` takes token ids).
        """
        single = isinstance(sentences, (str, bytes))
        items = [sentences] if single else list(sentences)  # type: ignore[list-item]
        if not items:
            raise InvalidArgumentError("empty batch: encode() needs at least one sentence")
        pool = _parse_pooling(pooling, self._pooling_code)
        if pool == _native.POOLING_NONE and normalize:
            raise InvalidArgumentError("normalize applies to pooled embeddings, not to "
                                       "pooling='none'")
        budget = DEFAULT_BATCH_TOKENS if batch_tokens is None else \
            _int_arg(batch_tokens, "batch_tokens", 1, 2**30)
        tok = self.tokenizer
        if tok is None and self._tokenizer_error:
            raise UnsupportedError("the tokenizer of model folder %s is not supported (%s); "
                                   "encode() needs one (forward() takes token ids)"
                                   % (self.path, self._tokenizer_error))
        if tok is None:
            raise FileError("model folder %s has no tokenizer.json or vocab.txt; encode() needs "
                            "one (forward() takes token ids)" % self.path)
        datas = [as_utf8(s, "sentences" if single else "sentences[%d]" % i)
                 for i, s in enumerate(items)]
        max_len = self.info.max_seq_length
        params = Tokenizer._params(True, bool(truncate), max_len if max_len > 0 else None)
        ids, cu = tok._tokenize_all(datas, params, "sentence",
                                    "the model's maximum sequence length")

        H = self.info.hidden_size
        B = len(items)
        eparams = self._encode_params(pool, normalize)
        per_token = pool == _native.POOLING_NONE
        pooled = None if per_token else np.empty((B, H), dtype=np.float32)
        hidden = np.empty((int(cu[-1]), H), dtype=np.float32) if per_token else None
        # one call: the library runs forwards of at most `budget` tokens, sentences in order
        eparams.batch_tokens = budget
        self._encode_packed(cu, ids, None, eparams, hidden, pooled)
        if per_token:
            rows = [hidden[cu[b]:cu[b + 1]] for b in range(B)]
            return rows[0] if single else rows
        return pooled[0] if single else pooled

    # ---- classification and reranking ---------------------------------------------------------

    @property
    def labels(self) -> List[str]:
        """The sequence-classification head's labels in id order (config.json's id2label), or
        [] when the folder has no head (architectures[0] is not a *ForSequenceClassification)."""
        lib = _native.library()
        with self._handle.use() as model:  # type: ignore[union-attr]
            n = lib.nopad_model_num_labels(model)
            return [lib.nopad_model_label(model, i).decode("utf-8", "replace") for i in range(n)]

    def _text_tokenizer(self, what: str) -> Tokenizer:
        tok = self.tokenizer
        if tok is None and self._tokenizer_error:
            raise UnsupportedError("the tokenizer of model folder %s is not supported (%s); %s() "
                                   "needs one" % (self.path, self._tokenizer_error, what))
        if tok is None:
            raise FileError("model folder %s has no tokenizer.json or vocab.txt; %s() needs one"
                            % (self.path, what))
        return tok

    def _classify_packed(self, ids: np.ndarray, types: Optional[np.ndarray], cu: np.ndarray,
                         budget: int) -> np.ndarray:
        """logits float32 [B, num_labels] of a packed host batch (nopad_classify)."""
        lib = _native.library()
        with self._handle.use() as model:  # type: ignore[union-attr]
            n_labels = lib.nopad_model_num_labels(model)
            if n_labels == 0:
                raise InvalidArgumentError(
                    "model folder %s has no sequence-classification head (config.json's "
                    "architectures is not a *ForSequenceClassification)" % self.path)
            logits = np.empty((cu.size - 1, n_labels), dtype=np.float32)
            b = _native.Batch(layout=_native.LAYOUT_PACKED, on_device=0, n_seqs=cu.size - 1,
                              tokens=ids.ctypes.data,
                              token_type_ids=types.ctypes.data if types is not None else None,
                              cu_seqlens=cu.ctypes.data)
            st = lib.nopad_classify(lib.nopad_model_context(model), ctypes.byref(b), budget,
                                    logits.ctypes.data)
            _native.check(st)
        return logits

    def classify(self, texts: Union[Text, Iterable[Text]], batch_tokens: Optional[int] = None,
                 truncate: bool = False) -> np.ndarray:
        """Logits of the folder's sequence-classification head (BertForSequenceClassification,
        XLMRobertaForSequenceClassification, DebertaV2ForSequenceClassification, ...), raw: apply
        softmax (or sigmoid for one label) yourself; :attr:`labels` names the columns.

        Args:
            texts: a list of str (or UTF-8 bytes), or one str.
            batch_tokens: token budget per forward; default 16384.
            truncate: cut texts longer than ``info.max_seq_length``; by default they raise
                TooLongError.

        Returns:
            float32 array [B, num_labels] (``[num_labels]`` for a single str).

        Raises:
            InvalidArgumentError: the folder has no classification head, no texts, bad options.
            TooLongError, FileError, UnsupportedError: as :meth:`encode`.
        """
        single = isinstance(texts, (str, bytes))
        items = [texts] if single else list(texts)  # type: ignore[list-item]
        if not items:
            raise InvalidArgumentError("empty batch: classify() needs at least one text")
        budget = DEFAULT_BATCH_TOKENS if batch_tokens is None else \
            _int_arg(batch_tokens, "batch_tokens", 1, 2**30)
        tok = self._text_tokenizer("classify")
        max_len = self.info.max_seq_length
        params = Tokenizer._params(True, bool(truncate), max_len if max_len > 0 else None)
        datas = [as_utf8(t, "texts" if single else "texts[%d]" % i) for i, t in enumerate(items)]
        ids, cu = tok._tokenize_all(datas, params, "text", "the model's maximum sequence length")
        logits = self._classify_packed(ids, None, cu, budget)
        return logits[0] if single else logits

    def rerank(self, query: Text, documents: Iterable[Text], batch_tokens: Optional[int] = None,
               truncate: bool = False, raw_scores: bool = False) -> np.ndarray:
        """Scores of `query` against each document with a cross-encoder (a one-label
        sequence-classification head), as sentence-transformers' ``CrossEncoder.predict`` and
        TEI's ``/rerank``: each (query, document) pair goes through the tokenizer's pair template.

        Args:
            query: str (or UTF-8 bytes).
            documents: a list of str (or UTF-8 bytes).
            batch_tokens: token budget per forward; default 16384.
            truncate: cut pairs longer than ``info.max_seq_length``, the longer text first.
            raw_scores: return the logits instead of sigmoid(logit).

        Returns:
            float32 array [N], in the documents' order (``np.argsort(-scores)`` ranks them).

        Raises:
            InvalidArgumentError: the head has more than one label (use :meth:`classify`), no
                documents, bad options; as :meth:`classify` otherwise.
        """
        if isinstance(documents, (str, bytes)):
            raise TypeError("rerank takes a list of documents")
        docs = list(documents)
        if not docs:
            raise InvalidArgumentError("empty batch: rerank() needs at least one document")
        n_labels = len(self.labels)
        if n_labels != 1:
            raise InvalidArgumentError(
                "model folder %s has %d labels; rerank() needs a one-label head (a cross-encoder); "
                "use classify()" % (self.path, n_labels))
        budget = DEFAULT_BATCH_TOKENS if batch_tokens is None else \
            _int_arg(batch_tokens, "batch_tokens", 1, 2**30)
        tok = self._text_tokenizer("rerank")
        max_len = self.info.max_seq_length
        params = Tokenizer._params(True, bool(truncate), max_len if max_len > 0 else None)
        q = as_utf8(query, "query")
        pairs = [(q, as_utf8(d, "documents[%d]" % i)) for i, d in enumerate(docs)]
        ids, types, cu = tok._pairs(pairs, params, "document", "the model's maximum sequence length")
        use_types = types if self.info.type_vocab_size > 1 else None
        logits = self._classify_packed(ids, use_types, cu, budget)[:, 0]
        if raw_scores:
            return logits
        return (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)

    # ---- ids in, hidden states out -----------------------------------------------------------

    def forward(self, input_ids: Any, cu_seqlens: Any, token_type_ids: Any = None,
                pooling: Optional[str] = "none", normalize: Optional[bool] = None, out: Any = None,
                max_seqlen: Optional[int] = None) -> Any:
        """Runs the encoder on a packed batch of token ids.

        Args:
            input_ids: int [T], the ids of every sequence back to back (no special tokens are
                added: pass them as the model expects).
            cu_seqlens: int [B+1] prefix sums of the sequence lengths: ``cu_seqlens[0] = 0``,
                ``cu_seqlens[B] = T``, every length >= 1.
            token_type_ids: int [T] or None (all zero).
            pooling: "none" (default): the last hidden state of every token, [T, H];
                "cls" / "mean" / "max": pooled embeddings [B, H]; None: the folder's pooling.
            normalize: L2-normalise pooled rows; default: the folder's setting.
            out: optional C-contiguous buffer of the result's shape, written in place (float32
                for host inputs; the compute dtype on CUDA).
            max_seqlen: CUDA tensors only: the longest sequence; None reads it from cu_seqlens
                (one host synchronisation).

        Host inputs (numpy arrays, lists, CPU torch tensors): int32 contiguous inputs are used
        without a copy (other integer dtypes are converted after a range check); the result is
        float32, a torch tensor sharing memory with the numpy result for torch input, else a
        numpy array. Every id is checked.

        CUDA torch tensors (an Encoder on device="cuda"): used in place, no copies (int32
        contiguous ids; others are converted on the GPU); the result is a new CUDA tensor (or
        `out`) in the model's compute dtype (fp16 / bf16). The work runs asynchronously, ordered
        after the caller's current stream, which is made to wait for it. Ids are not checked on
        the GPU: an id outside the vocabulary gives NaN rows instead of an error.

        Raises:
            InvalidArgumentError: ids outside [0, vocab_size), bad cu_seqlens, an empty batch, ...
            TooLongError: a sequence longer than the model's position table.
        """
        if _arrays.is_torch_cuda(input_ids) or _arrays.is_torch_cuda(cu_seqlens):
            return self._forward_device(input_ids, cu_seqlens, token_type_ids, pooling, normalize,
                                        out, max_seqlen)
        torch_in = _arrays.is_torch(input_ids)
        ids = _arrays.as_int32_vector(input_ids, "input_ids")
        cu = _arrays.as_int32_vector(cu_seqlens, "cu_seqlens")
        types = None
        if token_type_ids is not None:
            types = _arrays.as_int32_vector(token_type_ids, "token_type_ids")
            if types.size != ids.size:
                raise InvalidArgumentError("token_type_ids has %d entries, input_ids %d"
                                           % (types.size, ids.size))
        if cu.size < 2:
            raise InvalidArgumentError(
                "empty batch: cu_seqlens has %d entries; it needs B + 1 >= 2 ([0, T] for one "
                "sequence)" % cu.size)
        if int(cu[-1]) != ids.size:
            raise InvalidArgumentError("cu_seqlens[-1] is %d but input_ids has %d tokens (it "
                                       "must equal T)" % (int(cu[-1]), ids.size))
        pool = _parse_pooling(pooling, self._pooling_code)
        if pool == _native.POOLING_NONE and normalize:
            raise InvalidArgumentError("normalize applies to pooled embeddings, not to "
                                       "pooling='none'")
        H = self.info.hidden_size
        shape = (ids.size, H) if pool == _native.POOLING_NONE else (cu.size - 1, H)
        result = _arrays.float32_out(out, shape)
        if result is None:
            result = np.empty(shape, dtype=np.float32)
        per_token = pool == _native.POOLING_NONE
        self._encode_packed(cu, ids, types, self._encode_params(pool, normalize),
                            result if per_token else None, None if per_token else result)
        if out is not None:
            return out
        if torch_in:
            return _arrays.torch_module().from_numpy(result)
        return result

    def forward_padded(self, input_ids: Any, attention_mask: Any = None, lengths: Any = None,
                       token_type_ids: Any = None, pooling: Optional[str] = "none",
                       normalize: Optional[bool] = None) -> Any:
        """Runs the encoder on a right-padded batch, as Hugging Face tokenizers produce it.

        The batch is packed inside the library (padding is never computed on) and unpacked on the
        way out.

        Args:
            input_ids: int [B, S], each row's real tokens first.
            attention_mask: [B, S] of 1 for real tokens then 0 for padding (right padding only),
                or None when `lengths` is given (or every row is full).
            lengths: int [B], the real tokens per row (1 <= length <= S), instead of the mask.
            token_type_ids: int [B, S] or None.
            pooling, normalize: as :meth:`forward`.

        Returns:
            float32 [B, S, H] with zeros past each length (pooling "none"), or [B, H]; a torch
            tensor for torch input, else numpy. Torch CUDA tensors stay on the GPU (Encoder on
            "cuda"): packed and unpacked there, the result in the compute dtype.
        """
        torch_in = _arrays.is_torch(input_ids)
        if torch_in and input_ids.device.type == "cuda":
            return self._forward_padded_device(input_ids, attention_mask, lengths, token_type_ids,
                                               pooling, normalize)
        ids = _arrays.to_numpy(input_ids, "input_ids")
        if ids.ndim != 2:
            raise InvalidArgumentError("input_ids must be [B, S], got shape %s" % (ids.shape,))
        B, S = (int(n) for n in ids.shape)
        if B == 0 or S == 0:
            raise InvalidArgumentError("empty batch: input_ids has shape %s" % ((B, S),))
        _arrays.refuse_bools_in_list(input_ids, ids, "input_ids")
        ids = _arrays.as_int32_vector(ids.reshape(-1), "input_ids")
        if lengths is not None and attention_mask is not None:
            raise InvalidArgumentError("give attention_mask or lengths, not both")
        if attention_mask is not None:
            mask = _arrays.to_numpy(attention_mask, "attention_mask")
            if tuple(mask.shape) != (B, S):
                raise InvalidArgumentError("attention_mask has shape %s, input_ids %s"
                                           % (tuple(mask.shape), (B, S)))
            mask = mask != 0
            lens = mask.sum(axis=1).astype(np.int32)
            prefix = np.arange(S)[None, :] < lens[:, None]
            if not np.array_equal(mask, prefix):
                row = int(np.nonzero((mask != prefix).any(axis=1))[0][0])
                raise InvalidArgumentError(
                    "attention_mask row %d is not right padding (ones, then zeros); left-padded "
                    "or gapped masks are not supported" % row)
        elif lengths is not None:
            lens = _arrays.as_int32_vector(lengths, "lengths")
            if lens.size != B:
                raise InvalidArgumentError("lengths has %d entries for %d rows" % (lens.size, B))
        else:
            lens = np.full(B, S, dtype=np.int32)
        types = None
        if token_type_ids is not None:
            t = _arrays.to_numpy(token_type_ids, "token_type_ids")
            if tuple(t.shape) != (B, S):
                raise InvalidArgumentError("token_type_ids has shape %s, input_ids %s"
                                           % (tuple(t.shape), (B, S)))
            _arrays.refuse_bools_in_list(token_type_ids, t, "token_type_ids")
            types = _arrays.as_int32_vector(t.reshape(-1), "token_type_ids")
        pool = _parse_pooling(pooling, self._pooling_code)
        if pool == _native.POOLING_NONE and normalize:
            raise InvalidArgumentError("normalize applies to pooled embeddings, not to "
                                       "pooling='none'")
        H = self.info.hidden_size
        per_token = pool == _native.POOLING_NONE
        result = np.empty((B, S, H) if per_token else (B, H), dtype=np.float32)
        params = self._encode_params(pool, normalize)
        lib = _native.library()
        with self._handle.use() as model:  # type: ignore[union-attr]
            batch = _native.Batch(layout=_native.LAYOUT_PADDED, on_device=0, n_seqs=B,
                                  tokens=ids.ctypes.data,
                                  token_type_ids=None if types is None else types.ctypes.data,
                                  lengths=lens.ctypes.data, max_len=S)
            st = lib.nopad_encode(lib.nopad_model_context(model), ctypes.byref(batch),
                                  ctypes.byref(params), _native.ptr(result) if per_token else None,
                                  None if per_token else _native.ptr(result))
            _native.check(st)
        return _arrays.torch_module().from_numpy(result) if torch_in else result

    def _forward_device(self, input_ids: Any, cu_seqlens: Any, token_type_ids: Any,
                        pooling: Optional[str], normalize: Optional[bool], out: Any,
                        max_seqlen: Optional[int]) -> Any:
        """Torch CUDA tensors in and out without copies (nopad_encode, a device packed batch)."""
        torch = _arrays.torch_module()
        if self.info.device != "cuda":
            raise InvalidArgumentError("CUDA tensors need an Encoder made with device='cuda' "
                                       "(this one is on the CPU: pass CPU tensors or numpy)")
        dev = input_ids.device
        if dev.type != "cuda" or (self._cuda_index is not None and dev.index != self._cuda_index):
            raise InvalidArgumentError("input_ids is on %s, the model on cuda:%s"
                                       % (dev, self._cuda_index))
        for name, t in (("input_ids", input_ids), ("cu_seqlens", cu_seqlens),
                        ("token_type_ids", token_type_ids)):
            if t is None:
                continue
            if not _arrays.is_torch(t) or t.device != dev or t.dim() != 1:
                raise InvalidArgumentError("%s must be a 1-D torch tensor on %s" % (name, dev))
            if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
                raise InvalidArgumentError("%s must hold integers, got %s" % (name, t.dtype))
        n_tokens = input_ids.numel()
        n_seqs = cu_seqlens.numel() - 1
        if n_seqs < 1:
            raise InvalidArgumentError("empty batch: cu_seqlens has %d entries; it needs B + 1 >= "
                                       "2 ([0, T] for one sequence)" % cu_seqlens.numel())
        if token_type_ids is not None and token_type_ids.numel() != n_tokens:
            raise InvalidArgumentError("token_type_ids has %d entries, input_ids %d"
                                       % (token_type_ids.numel(), n_tokens))
        if n_tokens > 2**31 - 1:
            raise InvalidArgumentError("more than 2^31 - 1 tokens")
        pool = _parse_pooling(pooling, self._pooling_code)
        if pool == _native.POOLING_NONE and normalize:
            raise InvalidArgumentError("normalize applies to pooled embeddings, not to "
                                       "pooling='none'")
        per_token = pool == _native.POOLING_NONE
        H = self.info.hidden_size
        out_dtype = {"F16": torch.float16, "BF16": torch.bfloat16}.get(self.info.compute_dtype,
                                                                       torch.float32)
        shape = (n_tokens, H) if per_token else (n_seqs, H)
        if out is not None and (not _arrays.is_torch(out) or out.device != dev
                                or out.dtype != out_dtype or tuple(out.shape) != shape
                                or not out.is_contiguous()):
            raise InvalidArgumentError("out must be a contiguous %s tensor %s on %s"
                                       % (out_dtype, list(shape), dev))
        with torch.cuda.device(dev):
            cur = torch.cuda.current_stream(dev)
            ids = input_ids.to(torch.int32).contiguous()  # no copy when int32 contiguous
            cu = cu_seqlens.to(torch.int32).contiguous()
            types = None if token_type_ids is None else \
                token_type_ids.to(torch.int32).contiguous()
            if max_seqlen is None:  # one host synchronisation
                max_seqlen = int((cu[1:] - cu[:-1]).max().item())
            max_seqlen = _int_arg(max_seqlen, "max_seqlen", 1)
            if out is None:
                out = torch.empty(shape, dtype=out_dtype, device=dev)
            params = self._encode_params(pool, normalize)
            batch = _native.Batch(layout=_native.LAYOUT_PACKED, on_device=1, n_seqs=n_seqs,
                                  tokens=ids.data_ptr(),
                                  token_type_ids=None if types is None else types.data_ptr(),
                                  cu_seqlens=cu.data_ptr(), n_tokens=n_tokens, max_seqlen=max_seqlen)
            self._on_model_stream(dev, cur, lambda model: _encode(
                model, batch, params, out.data_ptr() if per_token else None,
                None if per_token else out.data_ptr()))
        return out

    def _on_model_stream(self, dev: Any, cur: Any, call: Any) -> None:
        """Runs call(model handle) — one enqueueing C call — ordered after the caller's current
        stream `cur`, and orders `cur` after it."""
        torch = _arrays.torch_module()
        stream = self._stream
        if isinstance(stream, int):
            stream = torch.cuda.ExternalStream(stream, device=dev) if stream else None
        if stream is None:
            raise UnsupportedError(
                "this Encoder runs on a CUDA stream of the library's own, which torch cannot "
                "order against; make it with cuda_stream= (a torch.cuda.Stream)")
        other = stream.cuda_stream != cur.cuda_stream
        if other:
            stream.wait_stream(cur)  # the inputs are ready
        with self._handle.use() as model:  # type: ignore[union-attr]
            _native.check(call(model))
        if other:
            # The caller's later work sees the output; and memory torch allocated on `cur`
            # (the int32 copies, out) is reused only by work ordered after the model's.
            cur.wait_stream(stream)

    def _forward_padded_device(self, input_ids: Any, attention_mask: Any, lengths: Any,
                               token_type_ids: Any, pooling: Optional[str],
                               normalize: Optional[bool]) -> Any:
        """Torch CUDA [B, S] tensors: packed and unpacked on the GPU (nopad_encode, a device padded batch);
        one host synchronisation reads the token count and the longest length."""
        torch = _arrays.torch_module()
        if self.info.device != "cuda":
            raise InvalidArgumentError("CUDA tensors need an Encoder made with device='cuda' "
                                       "(this one is on the CPU: pass CPU tensors or numpy)")
        dev = input_ids.device
        if self._cuda_index is not None and dev.index != self._cuda_index:
            raise InvalidArgumentError("input_ids is on %s, the model on cuda:%s" % (dev, self._cuda_index))
        if input_ids.dim() != 2 or 0 in input_ids.shape:
            raise InvalidArgumentError("input_ids must be a non-empty [B, S] tensor, got shape %s"
                                       % (tuple(input_ids.shape),))
        B, S = (int(n) for n in input_ids.shape)
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is not None and (not _arrays.is_torch(t) or t.device != dev or tuple(t.shape) != (B, S)):
                raise InvalidArgumentError("%s must be a [%d, %d] torch tensor on %s" % (name, B, S, dev))
        if lengths is not None and attention_mask is not None:
            raise InvalidArgumentError("give attention_mask or lengths, not both")
        if lengths is not None and (not _arrays.is_torch(lengths) or lengths.device != dev
                                    or tuple(lengths.shape) != (B,)):
            raise InvalidArgumentError("lengths must be a [%d] torch tensor on %s" % (B, dev))
        pool = _parse_pooling(pooling, self._pooling_code)
        if pool == _native.POOLING_NONE and normalize:
            raise InvalidArgumentError("normalize applies to pooled embeddings, not to "
                                       "pooling='none'")
        with torch.cuda.device(dev):
            cur = torch.cuda.current_stream(dev)
            if attention_mask is not None:
                mask = attention_mask != 0
                lens = mask.sum(dim=1, dtype=torch.int32)
                prefix = torch.arange(S, device=dev)[None, :] < lens[:, None]
                gapped = (mask != prefix).any(dim=1)
            elif lengths is not None:
                lens = lengths.to(torch.int32)
                gapped = torch.zeros(B, dtype=torch.bool, device=dev)
            else:
                lens = torch.full((B,), S, dtype=torch.int32, device=dev)
                gapped = torch.zeros(B, dtype=torch.bool, device=dev)
            lens = lens.contiguous()
            n_tokens, max_seqlen, min_len, n_gapped = torch.stack(
                [lens.sum(dtype=torch.int64), lens.max().long(), lens.min().long(),
                 gapped.sum(dtype=torch.int64)]).tolist()  # the one host synchronisation
            if n_gapped:
                row = int(torch.nonzero(gapped)[0][0])
                raise InvalidArgumentError(
                    "attention_mask row %d is not right padding (ones, then zeros); left-padded "
                    "or gapped masks are not supported" % row)
            if min_len < 1 or max_seqlen > S:
                raise InvalidArgumentError("every length must be in [1, S = %d]; got lengths "
                                           "from %d to %d" % (S, min_len, max_seqlen))
            ids = input_ids.to(torch.int32).contiguous()
            types = None if token_type_ids is None else token_type_ids.to(torch.int32).contiguous()
            H = self.info.hidden_size
            out_dtype = {"F16": torch.float16, "BF16": torch.bfloat16}[self.info.compute_dtype]
            per_token = pool == _native.POOLING_NONE
            out = torch.empty((B, S, H) if per_token else (B, H), dtype=out_dtype, device=dev)
            params = self._encode_params(pool, normalize)
            batch = _native.Batch(layout=_native.LAYOUT_PADDED, on_device=1, n_seqs=B,
                                  tokens=ids.data_ptr(),
                                  token_type_ids=None if types is None else types.data_ptr(),
                                  lengths=lens.data_ptr(), max_len=S, n_tokens=n_tokens,
                                  max_seqlen=max_seqlen)
            self._on_model_stream(dev, cur, lambda model: _encode(
                model, batch, params, out.data_ptr() if per_token else None,
                None if per_token else out.data_ptr()))
        return out

    # ---- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _encode_params(pool: int, normalize: Optional[bool]) -> _native.EncodeParams:
        p = _native.library().nopad_encode_default_params()
        p.pooling = pool
        p.normalize = -1 if normalize is None else (1 if normalize else 0)
        if pool == _native.POOLING_NONE:
            p.normalize = 0
        return p

    def _encode_packed(self, cu: np.ndarray, ids: np.ndarray, types: Optional[np.ndarray],
                       params: _native.EncodeParams, hidden: Optional[np.ndarray],
                       pooled: Optional[np.ndarray], context: str = "") -> None:
        """One nopad_encode_packed call on host arrays (already checked: int32, contiguous,
        cu[-1] == len(ids), outputs float32 C-contiguous of the right shapes)."""
        cu = np.ascontiguousarray(cu, dtype=np.int32)
        lib = _native.library()
        with self._handle.use() as model:  # type: ignore[union-attr]
            st = lib.nopad_encode_packed(model, cu.size - 1, _native.ptr(cu), _native.ptr(ids),
                                         _native.ptr(types), ctypes.byref(params),
                                         _native.ptr(hidden), _native.ptr(pooled))
            _native.check(st, context)
