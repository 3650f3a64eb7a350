"""nopad.Trainer: fine-tune (classification, regression) or train with masked LM a BERT model on
packed batches with no padding, over the C library's nopad_train (what ``nopad train`` runs).

>>> trainer = nopad.Trainer("all-MiniLM-L6-v2", "train.jsonl", "tuned", task="classify",
...                         num_labels=2, eval_data="test.jsonl")
>>> metrics = trainer.train(on_step=lambda p: print(p.step, p.loss))
>>> metrics.eval_accuracy
0.9

The output folder is an HF model folder (config.json, model.safetensors, the tokenizer files) that
nopad and transformers load, plus the optimiser state that ``resume=`` continues from.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
from typing import Any, Callable, Optional, Union

from . import _native
from .encoder import _parse_device, _parse_dtype
from .errors import InvalidArgumentError

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["Trainer", "TrainProgress", "TrainMetrics"]

_TASKS = {"mlm": 0, "classify": 1}
_OPTIMIZERS = {"adamw": 0, "lamb": 1}


@dataclasses.dataclass(frozen=True)
class TrainProgress:
    """Where a run stands after an optimiser step (nopad_train_progress)."""

    step: int            # steps taken (>= 1; a resumed run counts on from its checkpoint)
    total_steps: int     # of the whole run
    epoch: int           # 0-based epoch of this step
    epochs: int
    loss: float          # this step's mean loss
    lr: float            # the learning rate this step used
    grad_norm: float     # the global gradient norm before clipping
    tokens: int          # real tokens trained on so far in this call
    elapsed_s: float     # since this call's first step began


@dataclasses.dataclass(frozen=True)
class TrainMetrics:
    """What a run ends with (nopad_train_result)."""

    steps: int                     # the model's step count at the end (resumed ones included)
    resumed_step: int              # the checkpoint's step count when resuming, else 0
    first_loss: float              # of this call's first and last steps
    last_loss: float
    num_labels: int                # classification: the head's
    new_head: bool                 # the head was created (not in the checkpoint)
    n_examples: int                # of the training data
    n_truncated: int
    eval_examples: int             # 0 without eval_data
    eval_accuracy: Optional[float]  # classification with eval_data and >= 2 labels
    eval_loss: Optional[float]      # with eval_data


def _path(value: Optional[PathLike], name: str, required: bool = False) -> Optional[bytes]:
    if value is None:
        if required:
            raise InvalidArgumentError("%s is required" % name)
        return None
    try:
        encoded = os.fsencode(value)
    except TypeError:
        raise TypeError("%s must be a path, not %s" % (name, type(value).__name__)) from None
    if b"\0" in encoded:
        raise InvalidArgumentError("%s %r contains a NUL byte" % (name, os.fsdecode(encoded)))
    return encoded


def _choice(value: str, table: dict, name: str) -> int:
    code = table.get(str(value).lower())
    if code is None:
        raise InvalidArgumentError("%s %r is not one of %s" % (name, value,
                                                                ", ".join(repr(k) for k in table)))
    return code


class Trainer:
    """A training run: the options of ``nopad train`` (``nopad train --help``), run by
    :meth:`train`. Defaults fine-tune a small model such as all-MiniLM-L6-v2 without tuning: AdamW,
    lr 5e-5 with a linear warmup over 10% of the steps and a linear decay to 0, gradients clipped
    to norm 1, 3 epochs, batches of at most 4096 tokens and 32 sequences.

    model: an HF BERT folder with its tokenizer. data: JSONL ``{"text", "label"[, "text_pair"]}``
    for ``task="classify"`` (``num_labels=1``: regression), text lines (or JSONL ``{"text"}`` when
    the name ends in .jsonl) for ``task="mlm"``. output: the checkpoint folder (its parent must
    exist). num_labels: a new pooler and classifier with that many outputs when the model has none
    (HF's initialisation from ``seed``). warmup: a fraction of the steps below 1, else a number of
    steps. resume: a checkpoint folder (``save_every`` or the end save) to continue, with the
    settings it was started with (others are an error naming both values); it may be ``output``.
    device "cpu" or "cuda"; dtype "fp32" (the CPU's), "bf16" (CUDA's default) or "fp16".
    log: a JSONL file with a line a step (step, epoch, loss, lr, grad_norm, tokens).
    dropout: the rate after the embeddings and each sub-layer; None: config.json's
    hidden_dropout_prob (BERT's 0.1), as HF's Trainer runs; 0: off.
    stream: read the training data a window of ``stream_buffer`` bytes of text at a time instead
    of tokenizing it whole into memory (memory bounded whatever the corpus size; the blocks of the
    file shuffled per epoch, the examples of a window together; docs/training.md). ``nopad
    train`` streams data over 1 GiB by default; here it is asked for.
    """

    def __init__(self, model: PathLike, data: PathLike, output: PathLike, *, task: str = "mlm",
                 num_labels: int = 0, eval_data: Optional[PathLike] = None, epochs: int = 3,
                 lr: float = 5e-5, warmup: float = 0.1, batch_tokens: int = 4096,
                 batch_seqs: int = 32, seed: int = 42, optimizer: str = "adamw",
                 weight_decay: float = 0.01, max_grad_norm: float = 1.0, save_every: int = 0,
                 resume: Optional[PathLike] = None, truncate: bool = False, threads: int = 0,
                 device: str = "cpu", dtype: Optional[str] = None,
                 log: Optional[PathLike] = None, dropout: Optional[float] = None,
                 stream: bool = False, stream_buffer: int = 64 << 20) -> None:
        self._strings = [_path(model, "model", True), _path(data, "data", True),
                         _path(eval_data, "eval_data"), _path(output, "output", True),
                         _path(resume, "resume"), _path(log, "log")]
        p = _native.library().nopad_train_default_params()
        (p.model_dir, p.data_path, p.eval_path, p.output_dir, p.resume_dir,
         p.log_path) = self._strings
        p.task = _choice(task, _TASKS, "task")
        p.optimizer = _choice(optimizer, _OPTIMIZERS, "optimizer")
        if p.task == _TASKS["mlm"] and num_labels:
            raise InvalidArgumentError("num_labels is for task='classify'")
        p.num_labels = int(num_labels)
        p.epochs = int(epochs)
        p.lr = float(lr)
        warmup = float(warmup)
        if warmup < 0 or (warmup >= 1 and warmup != int(warmup)):
            raise InvalidArgumentError("warmup %r: expected a fraction of the steps in [0, 1) or a "
                                       "whole number of steps" % (warmup,))
        if warmup < 1:
            p.warmup_ratio, p.warmup_steps = warmup, -1
        else:
            p.warmup_steps = int(warmup)
        p.batch_tokens, p.batch_seqs = int(batch_tokens), int(batch_seqs)
        if not 0 <= int(seed) < 2**64:
            raise InvalidArgumentError("seed %r: expected an integer in [0, 2^64)" % (seed,))
        p.seed = int(seed)
        p.weight_decay, p.max_grad_norm = float(weight_decay), float(max_grad_norm)
        if dropout is not None:
            if not 0 <= float(dropout) < 1:
                raise InvalidArgumentError("dropout %r: expected a rate in [0, 1)" % (dropout,))
            p.dropout = float(dropout)
        p.stream = int(bool(stream))
        if int(stream_buffer) < 1024:
            raise InvalidArgumentError("stream_buffer %r: expected at least 1024 bytes"
                                       % (stream_buffer,))
        p.stream_buffer = int(stream_buffer)
        p.save_every = int(save_every)
        p.truncate = int(bool(truncate))
        p.n_threads = int(threads)
        p.device = _parse_device(device)
        if dtype is None:
            p.dtype = _native.DTYPE_BF16 if p.device == _native.DEVICE_CUDA else _native.DTYPE_F32
        else:
            p.dtype = _parse_dtype(dtype)
        self._params = p

    def train(self, on_step: Optional[Callable[[TrainProgress], Any]] = None) -> TrainMetrics:
        """Runs the training and returns its metrics. ``on_step(progress)`` is called after every
        optimiser step; a true return value stops the run (the checkpoint is still saved, and
        ``resume`` continues it). An exception raised by it stops the run and is raised here."""
        lib = _native.library()
        p = self._params
        raised = []

        def callback(_user, progress_ptr) -> int:
            try:
                pr = progress_ptr.contents
                return 1 if on_step(TrainProgress(
                    pr.step, pr.total_steps, pr.epoch, pr.epochs, pr.loss, pr.lr, pr.grad_norm,
                    pr.tokens, pr.elapsed_s)) else 0
            except BaseException as e:  # noqa: B902 (cannot cross the C frames: re-raised below)
                raised.append(e)
                return 1

        c_callback = _native.TrainFn(callback) if on_step is not None else _native.TrainFn()
        p.on_step = c_callback
        out = _native.TrainResult()
        try:
            status = lib.nopad_train(ctypes.byref(p), ctypes.byref(out))
        finally:
            p.on_step = _native.TrainFn()
        if raised:
            raise raised[0]
        _native.check(status)
        return TrainMetrics(
            steps=out.steps, resumed_step=out.resumed_step, first_loss=out.first_loss,
            last_loss=out.last_loss, num_labels=out.num_labels, new_head=bool(out.new_head),
            n_examples=out.n_examples, n_truncated=out.n_truncated,
            eval_examples=out.eval_examples,
            eval_accuracy=out.eval_accuracy if out.eval_accuracy >= 0 else None,
            eval_loss=out.eval_loss if out.eval_loss >= 0 else None)
