"""nopad.Trainer: fine-tune (classification, regression) or train with masked LM a BERT model on
packed batches with no padding, over the C library's nopad_train (what ``nopad train`` runs).

>>> trainer = nopad.Trainer("all-MiniLM-L6-v2", "train.jsonl", "tuned", task="classify",
...                         num_labels=2, eval_data="test.jsonl")
>>> metrics = trainer.train(on_step=lambda p: print(p.step, p.loss))
>>> metrics.eval_accuracy
0.9

With ``eval_every=N`` (or ``"epoch"``) the eval data is evaluated during the run too, each
evaluation passed to ``train(on_eval=...)``; ``save_best=True`` keeps the best one's weights in
``output/best``, ``early_stop=K`` stops after K evaluations without a new best.

The output folder is an HF model folder (config.json, model.safetensors, the tokenizer files) that
nopad and transformers load, plus the optimiser state that ``resume=`` continues from.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
from typing import Any, Callable, Optional, Tuple, Union

import numpy as np

from . import _native
from .encoder import _parse_device, _parse_dtype
from .errors import InvalidArgumentError

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["Trainer", "TrainProgress", "TrainEval", "TrainMetrics"]

_TASKS = {"mlm": 0, "classify": 1}
_OPTIMIZERS = {"adamw": 0, "lamb": 1}
_METRICS = {"loss": _native.TRAIN_METRIC_LOSS, "accuracy": _native.TRAIN_METRIC_ACCURACY}
_METRIC_NAMES = {code: name for name, code in _METRICS.items()}


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
class TrainEval:
    """One evaluation during a run (nopad_train_eval), after the step it follows."""

    step: int                  # steps taken when it ran
    epoch: int                 # 0-based epoch of that step
    examples: int              # of the eval data
    loss: float                # the mean eval loss
    accuracy: Optional[float]  # classification with >= 2 labels
    metric: str                # "loss" (lower is better) or "accuracy" (higher): what best is by
    is_best: bool              # better than every evaluation before it (saved with save_best)
    best_step: int             # the best evaluation so far (this one when is_best)
    best_value: float          # its metric
    since_best: int            # evaluations since the best (0 when is_best)
    evaluations: int           # of the run so far, a resumed run's earlier ones included


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
    evaluations: int = 0            # recorded during the run (eval_every), resumed ones included
    best_step: Optional[int] = None     # the best of them (the earliest of equals)
    best_metric: Optional[str] = None   # "loss" or "accuracy"
    best_value: Optional[float] = None
    early_stopped: bool = False     # early_stop ended the run
    evals: Tuple[TrainEval, ...] = ()  # the evaluations of this call, in order
    # data-parallel runs (mpirun -np N): the most loaded process's tokens over the mean, as read
    # and as computed after the exchange (None with one process)
    dp_balance_read: Optional[float] = None
    dp_balance_computed: Optional[float] = None


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


def _whole(value: Any, name: str, bits: int = 32) -> int:
    """An int for a C integer field of `bits` bits: a float is refused rather than truncated, a
    bool rather than taken as 0 or 1, a value the field cannot hold rather than wrapped (the
    ranges that make sense are the library's to check, in its words)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError("%s must be an int, not %s" % (name, type(value).__name__))
    lo, hi = -2**(bits - 1), 2**(bits - 1) - 1
    if not lo <= value <= hi:
        raise InvalidArgumentError("%s %d: outside the int%d range" % (name, value, bits))
    return int(value)


def _number(value: Any, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise TypeError("%s must be a number, not %s" % (name, type(value).__name__))
    return float(value)


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
    attention_dropout: the rate of the attention probabilities; None: ``dropout`` when that is
    given, else config.json's attention_probs_dropout_prob (BERT's 0.1); 0: off. Resuming, a rate
    left None (either) is the checkpoint's.
    dp_exchange: under ``mpirun -np N`` (data-parallel training), move the sequences that must
    move before each step so that every process holds equal work (the same result either way;
    docs/training.md); False trains each process on what it read.
    stream: read the training data a window of ``stream_buffer`` bytes of text at a time instead
    of tokenizing it whole into memory (memory bounded whatever the corpus size; the blocks of the
    file shuffled per epoch, the examples of a window together; docs/training.md). ``nopad
    train`` streams data over 1 GiB by default; here it is asked for.
    eval_every: evaluate ``eval_data`` after every N steps, or ``"epoch"`` at each epoch's end,
    and at the last step (0: only at the end, into the metrics); each evaluation goes to
    ``train(on_eval=...)``, a line of ``log`` and trainer_state.json's history. save_best: keep the
    best evaluation's weights in ``output/best`` (a model folder; eval_results.json names the
    step); best_metric: ``"accuracy"`` (the default for classification) or ``"loss"`` (for MLM and
    regression); a tie keeps the earlier step; a resumed run keeps its checkpoint's best.
    early_stop: stop after K evaluations in a row without a new best. early_stop_min_delta: only
    an improvement by more than this counts for early_stop (Keras' min_delta; default 0).
    whole_word_mask: MLM with a WordPiece tokenizer: mask whole words (a piece and the ``##``
    pieces after it together), each word with probability 0.15, instead of single pieces.
    pack_lines: MLM: concatenate the lines (each with its [CLS] ... [SEP]) and cut them into
    examples of the model maximum (HF's run_mlm.py without ``--line_by_line``); not with stream.
    """

    def __init__(self, model: PathLike, data: PathLike, output: PathLike, *, task: str = "mlm",
                 num_labels: int = 0, eval_data: Optional[PathLike] = None, epochs: int = 3,
                 lr: float = 5e-5, warmup: float = 0.1, batch_tokens: int = 4096,
                 batch_seqs: int = 32, seed: int = 42, optimizer: str = "adamw",
                 weight_decay: float = 0.01, max_grad_norm: float = 1.0, save_every: int = 0,
                 resume: Optional[PathLike] = None, truncate: bool = False, threads: int = 0,
                 device: str = "cpu", dtype: Optional[str] = None,
                 log: Optional[PathLike] = None, dropout: Optional[float] = None,
                 stream: bool = False, stream_buffer: int = 64 << 20,
                 eval_every: Union[int, str] = 0, save_best: bool = False,
                 best_metric: Optional[str] = None, early_stop: int = 0,
                 whole_word_mask: bool = False, pack_lines: bool = False,
                 early_stop_min_delta: float = 0.0,
                 attention_dropout: Optional[float] = None, dp_exchange: bool = True) -> None:
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
        p.num_labels = _whole(num_labels, "num_labels")
        p.epochs = _whole(epochs, "epochs")
        p.lr = _number(lr, "lr")
        warmup = _number(warmup, "warmup")
        if warmup < 0 or (warmup >= 1 and warmup != int(warmup)):
            raise InvalidArgumentError("warmup %r: expected a fraction of the steps in [0, 1) or a "
                                       "whole number of steps" % (warmup,))
        if warmup < 1:
            p.warmup_ratio, p.warmup_steps = warmup, -1
        else:
            p.warmup_steps = int(warmup)
        p.batch_tokens = _whole(batch_tokens, "batch_tokens")
        p.batch_seqs = _whole(batch_seqs, "batch_seqs")
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
            raise TypeError("seed must be an int, not %s" % type(seed).__name__)
        if not 0 <= int(seed) < 2**64:
            raise InvalidArgumentError("seed %r: expected an integer in [0, 2^64)" % (seed,))
        p.seed = int(seed)
        p.weight_decay = _number(weight_decay, "weight_decay")
        p.max_grad_norm = _number(max_grad_norm, "max_grad_norm")
        if dropout is not None:
            if not 0 <= float(dropout) < 1:
                raise InvalidArgumentError("dropout %r: expected a rate in [0, 1)" % (dropout,))
            p.dropout = float(dropout)
        if attention_dropout is not None:
            if not 0 <= float(attention_dropout) < 1:
                raise InvalidArgumentError("attention_dropout %r: expected a rate in [0, 1)"
                                           % (attention_dropout,))
            p.attention_dropout = float(attention_dropout)
        p.dp_exchange = int(bool(dp_exchange))
        p.stream = int(bool(stream))
        if _whole(stream_buffer, "stream_buffer", 64) < 1024:
            raise InvalidArgumentError("stream_buffer %r: expected at least 1024 bytes"
                                       % (stream_buffer,))
        p.stream_buffer = int(stream_buffer)
        if isinstance(eval_every, str):
            if eval_every != "epoch":
                raise InvalidArgumentError("eval_every %r: expected a number of steps or 'epoch'"
                                           % (eval_every,))
            p.eval_every_epoch = 1
        elif _whole(eval_every, "eval_every", 64) < 0:
            raise InvalidArgumentError("eval_every %r: expected a number of steps >= 1, or 'epoch' "
                                       "(0: evaluate only at the end)" % (eval_every,))
        else:
            p.eval_every = int(eval_every)
        periodic = p.eval_every > 0 or p.eval_every_epoch
        if best_metric is not None:
            p.best_metric = _choice(best_metric, _METRICS, "best_metric")
            if p.task == _TASKS["mlm"] and p.best_metric == _native.TRAIN_METRIC_ACCURACY:
                raise InvalidArgumentError("best_metric 'accuracy' is for task='classify' (MLM has "
                                           "an eval loss)")
        if _whole(early_stop, "early_stop") < 0:
            raise InvalidArgumentError("early_stop %r: expected >= 1 (0: off)" % (early_stop,))
        p.early_stop = int(early_stop)
        if not float(early_stop_min_delta) >= 0:
            raise InvalidArgumentError("early_stop_min_delta %r: expected a number >= 0"
                                       % (early_stop_min_delta,))
        if early_stop_min_delta and not early_stop:
            raise InvalidArgumentError("early_stop_min_delta needs early_stop")
        p.early_stop_min_delta = float(early_stop_min_delta)
        p.save_best = int(bool(save_best))
        needs = ("eval_every" if periodic else "save_best" if save_best else
                 "early_stop" if early_stop else "best_metric" if best_metric is not None else None)
        if needs and eval_data is None:
            raise InvalidArgumentError("%s needs eval_data (the data to evaluate on)" % needs)
        if needs and not periodic:
            raise InvalidArgumentError("%s needs eval_every=N or 'epoch' (the evaluations it picks "
                                       "from)" % needs)
        p.save_every = _whole(save_every, "save_every", 64)
        p.truncate = int(bool(truncate))
        if whole_word_mask and p.task != _TASKS["mlm"]:
            raise InvalidArgumentError("whole_word_mask is for task='mlm'")
        p.whole_word_mask = int(bool(whole_word_mask))
        if pack_lines and p.task != _TASKS["mlm"]:
            raise InvalidArgumentError("pack_lines is for task='mlm'")
        if pack_lines and stream:
            raise InvalidArgumentError("pack_lines packs the data held in memory; it does not "
                                       "stream yet (stream=False)")
        p.pack_lines = int(bool(pack_lines))
        p.n_threads = _whole(threads, "threads")
        p.device = _parse_device(device)
        if dtype is None:
            p.dtype = _native.DTYPE_BF16 if p.device == _native.DEVICE_CUDA else _native.DTYPE_F32
        else:
            p.dtype = _parse_dtype(dtype)
        self._params = p

    def train(self, on_step: Optional[Callable[[TrainProgress], Any]] = None,
              on_eval: Optional[Callable[[TrainEval], Any]] = None) -> TrainMetrics:
        """Runs the training and returns its metrics. ``on_step(progress)`` is called after every
        optimiser step, ``on_eval(evaluation)`` after every evaluation (``eval_every``); a true
        return value from either stops the run (the checkpoint is still saved, and ``resume``
        continues it). An exception raised by them stops the run and is raised here."""
        lib = _native.library()
        p = self._params
        raised = []
        evals = []

        def eval_callback(_user, eval_ptr) -> int:
            try:
                e = eval_ptr.contents
                ev = TrainEval(e.step, e.epoch, e.examples, e.loss,
                               e.accuracy if e.accuracy >= 0 else None,
                               _METRIC_NAMES.get(e.metric, "loss"), bool(e.is_best), e.best_step,
                               e.best_value, e.since_best, e.evaluations)
                evals.append(ev)
                return 1 if on_eval is not None and on_eval(ev) else 0
            except BaseException as exc:  # noqa: B902 (re-raised below, as on_step's)
                raised.append(exc)
                return 1

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
        c_eval = _native.TrainEvalFn(eval_callback)
        p.on_step, p.on_eval = c_callback, c_eval
        out = _native.TrainResult()
        try:
            status = lib.nopad_train(ctypes.byref(p), ctypes.byref(out))
        finally:
            p.on_step, p.on_eval = _native.TrainFn(), _native.TrainEvalFn()
        if raised:
            raise raised[0]
        _native.check(status)
        return TrainMetrics(
            steps=out.steps, resumed_step=out.resumed_step, first_loss=out.first_loss,
            last_loss=out.last_loss, num_labels=out.num_labels, new_head=bool(out.new_head),
            n_examples=out.n_examples, n_truncated=out.n_truncated,
            eval_examples=out.eval_examples,
            eval_accuracy=out.eval_accuracy if out.eval_accuracy >= 0 else None,
            eval_loss=out.eval_loss if out.eval_loss >= 0 else None,
            evaluations=out.evaluations,
            best_step=out.best_step if out.best_step > 0 else None,
            best_metric=_METRIC_NAMES.get(out.best_metric) if out.best_step > 0 else None,
            best_value=out.best_value if out.best_step > 0 else None,
            early_stopped=bool(out.early_stopped), evals=tuple(evals),
            dp_balance_read=out.dp_max_read * out.dp_ranks / out.dp_tokens if out.dp_tokens else None,
            dp_balance_computed=(out.dp_max_computed * out.dp_ranks / out.dp_tokens
                                 if out.dp_tokens else None))
