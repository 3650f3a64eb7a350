"""nopad: padding-free inference for encoders (BERT family) and decoders (GPT-2, LLaMA family),
from Python.

>>> import nopad
>>> with nopad.Encoder("path/to/all-MiniLM-L6-v2") as enc:
...     emb = enc.encode(["Hello world", "Padding-free inference"])   # numpy float32 [2, 384]
>>> with nopad.Generator("path/to/SmolLM2-135M-Instruct.Q4_1.gguf") as gen:
...     gen.generate("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
...                  "<|im_start|>assistant\n", max_tokens=16)
['The capital of France is Paris.']

A thin ctypes layer over libnopad (include/nopad.h): no compiler is needed to use it, the GIL is
released while the library computes, and every failure raises a :class:`NopadError` subclass
carrying the library's message and status.

- :class:`Encoder`: ``encode`` (text -> embeddings), ``forward`` (packed ids + cu_seqlens ->
  hidden states), ``info``, ``tokenizer``.
- :class:`Generator`: ``generate`` (prompts -> text), ``generate_ids``, ``stream`` (the text of
  one prompt as it comes), ``decode`` (one step over :class:`Sequence` objects -> logits),
  ``info``, ``tokenizer``.
- :class:`Engine`: ``submit`` from any thread (-> a :class:`Request`: iterate it for the text as
  it comes, ``result``, ``cancel``, ``stats``), ``stats``; every running request fused into one
  packed step per iteration.
- :class:`Trainer`: ``train`` (fine-tuning or masked-LM training of a BERT model on packed
  batches, with a per-step callback, evaluations during the run keeping the best
  (:class:`TrainEval`) and ``resume`` from a checkpoint) -> :class:`TrainMetrics`.
- :class:`Tokenizer`: ``encode``, ``encode_batch`` (-> ids, cu_seqlens), ``decode``,
  ``decode_stream`` (a :class:`DecodeStream`), ``kind``.
- :func:`attention_varlen`, :func:`attention_varlen_packed`: the fused varlen attention on torch
  tensors.
- ``tp_size=N``: a model split over N processes, which nopad starts itself with no launcher;
  :func:`tp_follow`, :func:`world_rank`, :func:`world_size` for ``mpirun -np N`` (rank 0 uses
  the object, the others call ``tp_follow``).

The library is found through ``$NOPAD_LIBRARY``, else the copy installed with the package, else
``build/`` of the repository (see :func:`library_path`).
"""
from ._native import find_library, library_path
from ._version import __version__
from .attention import attention_varlen, attention_varlen_packed
from .encoder import DEFAULT_BATCH_TOKENS, Encoder, ModelInfo
from .errors import (BackendError, BufferTooSmallError, FileError, FormatError, InternalError,
                     InvalidArgumentError, LibraryNotFoundError, NopadError, OutOfMemoryError,
                     QueueFullError, Status, TooLongError, UnsupportedError)
from .engine import Engine, Request
from .generator import Generator, Sequence, TokenStream
from .parallel import tp_follow, world_rank, world_size
from .tokenizer import DecodeStream, Tokenizer
from .trainer import Trainer, TrainEval, TrainMetrics, TrainProgress

__all__ = [
    "Encoder", "Generator", "Sequence", "TokenStream", "Engine", "Request", "ModelInfo",
    "Tokenizer", "DecodeStream", "tp_follow", "world_rank", "world_size", "Trainer", "TrainEval", "TrainMetrics", "TrainProgress", "attention_varlen", "attention_varlen_packed",
    "library_version", "library_build_id", "library_path", "find_library", "DEFAULT_BATCH_TOKENS", "__version__",
    "NopadError", "InvalidArgumentError", "FileError", "FormatError", "UnsupportedError",
    "OutOfMemoryError", "BufferTooSmallError", "TooLongError", "BackendError", "InternalError",
    "QueueFullError", "LibraryNotFoundError", "Status",
]


def library_version() -> str:
    """nopad_version() of the loaded library, "MAJOR.MINOR.PATCH"."""
    from ._native import library

    return library().nopad_version().decode()


def library_build_id() -> str:
    """nopad_build_id() of the loaded library: the checkout it was built from (git describe at
    build time, e.g. "05498cb" or "05498cb-dirty"), "unknown" outside a git checkout."""
    from ._native import library

    return library().nopad_build_id().decode()
