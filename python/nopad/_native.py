"""Finding, loading and declaring libnopad.so through ctypes.

The library is looked up, in order:

1. ``$NOPAD_LIBRARY`` (a path to libnopad.so; nothing else is tried when it is set),
2. the copy bundled in the installed package (``nopad/_lib/libnopad.so``, put there by
   ``pip install``),
3. ``build/libnopad.so`` of the repository, when the package is used from a checkout.

It is loaded with ``ctypes.CDLL``, never ``PyDLL``: ctypes releases the GIL for the duration of
every foreign call, so other Python threads run while nopad computes.

Everything here mirrors include/nopad.h; tests/python/test_package.py compiles a C program
(tests/python/capi_helper.c) to check the struct layouts against the header.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import List, Optional, Tuple

from .errors import LibraryNotFoundError, error_for

_PKG_DIR = Path(__file__).resolve().parent
LIB_NAME = "libnopad.so"

# ---- enums (include/nopad.h) --------------------------------------------------------------------

DEVICE_CPU, DEVICE_CUDA = 0, 1
DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2
# nopad_weights: how a GGUF file's quantized weights are held
WEIGHTS_CODES = {"auto": 0, "native": 1, "f32": 2, "f16": 3, "bf16": 4, "fp8": 5}
POOLING_MODEL, POOLING_NONE, POOLING_CLS, POOLING_MEAN, POOLING_MAX = -1, 0, 1, 2, 3

POOLING_NAMES = {POOLING_NONE: "none", POOLING_CLS: "cls", POOLING_MEAN: "mean", POOLING_MAX: "max"}
POOLING_CODES = {name: code for code, name in POOLING_NAMES.items()}

# ---- structs ------------------------------------------------------------------------------------

_enum = ctypes.c_int  # the C enums here are int-sized (all values fit in int)


class TokenizeParams(ctypes.Structure):
    _fields_ = [("add_special_tokens", ctypes.c_int),
                ("truncate", ctypes.c_int),
                ("max_length", ctypes.c_int32)]


class ModelParams(ctypes.Structure):
    _fields_ = [("device", _enum),
                ("device_index", ctypes.c_int32),
                ("dtype", _enum),
                ("n_threads", ctypes.c_int),
                ("max_batch_tokens", ctypes.c_int32),
                ("cuda_stream", ctypes.c_void_p),
                ("cuda_graph_max_tokens", ctypes.c_int32),
                ("kv_cache_tokens", ctypes.c_int32),
                ("kv_block_size", ctypes.c_int32),
                ("tp_size", ctypes.c_int32),
                ("weights", _enum)]


class WeightGroup(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p),
                ("format", ctypes.c_char_p),
                ("stored", ctypes.c_char_p),
                ("n_tensors", ctypes.c_int32),
                ("bytes", ctypes.c_size_t)]


class ModelStats(ctypes.Structure):
    _fields_ = [("forwards", ctypes.c_int64),
                ("graph_replays", ctypes.c_int64),
                ("graphs_recorded", ctypes.c_int64),
                ("graphs_held", ctypes.c_int32)]


class ModelInfo(ctypes.Structure):
    _fields_ = [("model_type", ctypes.c_char_p),
                ("family", ctypes.c_char_p),
                ("activation", ctypes.c_char_p),
                ("weights_dtype", ctypes.c_char_p),
                ("compute_dtype", ctypes.c_char_p),
                ("vocab_size", ctypes.c_int32),
                ("hidden_size", ctypes.c_int32),
                ("embedding_size", ctypes.c_int32),
                ("num_layers", ctypes.c_int32),
                ("num_heads", ctypes.c_int32),
                ("head_size", ctypes.c_int32),
                ("intermediate_size", ctypes.c_int32),
                ("max_position_embeddings", ctypes.c_int32),
                ("max_seq_length", ctypes.c_int32),
                ("type_vocab_size", ctypes.c_int32),
                ("layer_norm_eps", ctypes.c_float),
                ("n_params", ctypes.c_int64),
                ("pooling", _enum),
                ("normalize", ctypes.c_int),
                ("has_tokenizer", ctypes.c_int),
                ("tokenizer_kind", ctypes.c_char_p),
                ("is_decoder", ctypes.c_int),
                ("num_kv_heads", ctypes.c_int32),
                ("bos_token_id", ctypes.c_int32),
                ("eos_token_id", ctypes.c_int32),
                ("tp_size", ctypes.c_int32)]


class EncodeParams(ctypes.Structure):
    _fields_ = [("pooling", _enum),
                ("normalize", ctypes.c_int),
                ("batch_tokens", ctypes.c_int32)]


class ContextParams(ctypes.Structure):
    _fields_ = [("max_batch_tokens", ctypes.c_int32),
                ("cuda_stream", ctypes.c_void_p),
                ("cuda_graph_max_tokens", ctypes.c_int32),
                ("kv_cache_tokens", ctypes.c_int32),
                ("kv_block_size", ctypes.c_int32)]


class LogitBias(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int32),
                ("bias", ctypes.c_float)]


class SamplingParams(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float),
                ("top_k", ctypes.c_int32),
                ("top_p", ctypes.c_float),
                ("min_p", ctypes.c_float),
                ("repetition_penalty", ctypes.c_float),
                ("seed", ctypes.c_uint64),
                ("presence_penalty", ctypes.c_float),
                ("frequency_penalty", ctypes.c_float),
                ("logit_bias", ctypes.c_void_p),
                ("n_logit_bias", ctypes.c_int32)]


class GenerateParams(ctypes.Structure):
    _fields_ = [("max_tokens", ctypes.c_int32),
                ("ignore_eos", ctypes.c_int),
                ("sampling", SamplingParams)]


# nopad_token_fn: int (*)(void *user, int32_t prompt, int32_t token)
TokenFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)


# ---- the engine (nopad_engine_*, nopad_request_*) -------------------------------------------

STATUS_BUFFER_TOO_SMALL = 6


class EngineParams(ctypes.Structure):
    _fields_ = [("max_step_tokens", ctypes.c_int32),
                ("max_running", ctypes.c_int32),
                ("kv_cache_tokens", ctypes.c_int32),
                ("kv_block_size", ctypes.c_int32),
                ("max_queue", ctypes.c_int32),
                ("prefix_sharing", ctypes.c_int),
                ("overlap_steps", ctypes.c_int)]


# nopad_request_fn: void (*)(void *user, uint64_t id, int32_t token, const char *text, int finish)
RequestFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int32, ctypes.c_char_p,
                             ctypes.c_int)


class RequestParams(ctypes.Structure):
    _fields_ = [("prompt_ids", ctypes.c_void_p),
                ("n_prompt_ids", ctypes.c_int32),
                ("prompt_text", ctypes.c_char_p),
                ("max_tokens", ctypes.c_int32),
                ("ignore_eos", ctypes.c_int),
                ("sampling", SamplingParams),
                ("stop_ids", ctypes.c_void_p),
                ("n_stop_ids", ctypes.c_int32),
                ("stop_strings", ctypes.c_void_p),
                ("n_stop_strings", ctypes.c_int32),
                ("on_token", RequestFn),
                ("user", ctypes.c_void_p),
                ("logprobs", ctypes.c_int),
                ("constraint", ctypes.c_void_p),
                ("top_logprobs", ctypes.c_int32)]


class RequestStats(ctypes.Structure):
    _fields_ = [("prompt_tokens", ctypes.c_int32),
                ("prompt_tokens_shared", ctypes.c_int32),
                ("generated_tokens", ctypes.c_int32),
                ("preemptions", ctypes.c_int32),
                ("finish", ctypes.c_int),
                ("admitted_ms", ctypes.c_double),
                ("first_token_ms", ctypes.c_double),
                ("finished_ms", ctypes.c_double)]


class EngineStats(ctypes.Structure):
    _fields_ = [("running", ctypes.c_int32),
                ("waiting", ctypes.c_int32),
                ("kv_blocks_total", ctypes.c_int32),
                ("kv_blocks_used", ctypes.c_int32),
                ("kv_blocks_cached", ctypes.c_int32),
                ("kv_block_size", ctypes.c_int32),
                ("requests_finished", ctypes.c_int64),
                ("steps", ctypes.c_int64),
                ("tokens_generated", ctypes.c_int64),
                ("prompt_tokens_computed", ctypes.c_int64),
                ("prompt_tokens_shared", ctypes.c_int64),
                ("preemptions", ctypes.c_int64),
                ("last_step_ms", ctypes.c_double),
                ("tokens_per_s", ctypes.c_double),
                ("masks_built", ctypes.c_int64),
                ("mask_ms", ctypes.c_double)]


class TrainProgress(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64),
                ("total_steps", ctypes.c_int64),
                ("epoch", ctypes.c_int32),
                ("epochs", ctypes.c_int32),
                ("loss", ctypes.c_double),
                ("lr", ctypes.c_double),
                ("grad_norm", ctypes.c_double),
                ("tokens", ctypes.c_int64),
                ("elapsed_s", ctypes.c_double)]


TrainFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(TrainProgress))

TRAIN_METRIC_AUTO, TRAIN_METRIC_LOSS, TRAIN_METRIC_ACCURACY = 0, 1, 2


class TrainEval(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64),
                ("epoch", ctypes.c_int32),
                ("examples", ctypes.c_int32),
                ("loss", ctypes.c_double),
                ("accuracy", ctypes.c_double),
                ("metric", _enum),
                ("is_best", ctypes.c_int),
                ("best_step", ctypes.c_int64),
                ("best_value", ctypes.c_double),
                ("since_best", ctypes.c_int32),
                ("evaluations", ctypes.c_int32)]


TrainEvalFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(TrainEval))


class TrainParams(ctypes.Structure):
    _fields_ = [("model_dir", ctypes.c_char_p),
                ("data_path", ctypes.c_char_p),
                ("eval_path", ctypes.c_char_p),
                ("output_dir", ctypes.c_char_p),
                ("task", _enum),
                ("num_labels", ctypes.c_int32),
                ("epochs", ctypes.c_int32),
                ("lr", ctypes.c_double),
                ("warmup_ratio", ctypes.c_double),
                ("warmup_steps", ctypes.c_int64),
                ("batch_tokens", ctypes.c_int32),
                ("batch_seqs", ctypes.c_int32),
                ("seed", ctypes.c_uint64),
                ("optimizer", _enum),
                ("weight_decay", ctypes.c_double),
                ("max_grad_norm", ctypes.c_double),
                ("save_every", ctypes.c_int64),
                ("truncate", ctypes.c_int),
                ("n_threads", ctypes.c_int),
                ("on_step", TrainFn),
                ("user", ctypes.c_void_p),
                ("resume_dir", ctypes.c_char_p),
                ("device", _enum),
                ("device_index", ctypes.c_int32),
                ("dtype", _enum),
                ("log_path", ctypes.c_char_p),
                ("log_batches", ctypes.c_int),
                ("dropout", ctypes.c_double),
                ("stream", ctypes.c_int),
                ("stream_buffer", ctypes.c_int64),
                ("eval_every", ctypes.c_int64),
                ("eval_every_epoch", ctypes.c_int),
                ("save_best", ctypes.c_int),
                ("best_metric", _enum),
                ("early_stop", ctypes.c_int32),
                ("on_eval", TrainEvalFn),
                ("whole_word_mask", ctypes.c_int),
                ("pack_lines", ctypes.c_int),
                ("early_stop_min_delta", ctypes.c_double),
                ("attention_dropout", ctypes.c_double), ("dp_exchange", ctypes.c_int)]


class TrainResult(ctypes.Structure):
    _fields_ = [("steps", ctypes.c_int64),
                ("resumed_step", ctypes.c_int64),
                ("first_loss", ctypes.c_double),
                ("last_loss", ctypes.c_double),
                ("num_labels", ctypes.c_int32),
                ("new_head", ctypes.c_int),
                ("n_examples", ctypes.c_int32),
                ("n_truncated", ctypes.c_int32),
                ("eval_examples", ctypes.c_int32),
                ("eval_accuracy", ctypes.c_double),
                ("eval_loss", ctypes.c_double),
                ("evaluations", ctypes.c_int32),
                ("best_metric", _enum),
                ("best_step", ctypes.c_int64),
                ("best_value", ctypes.c_double),
                ("early_stopped", ctypes.c_int), ("dp_ranks", ctypes.c_int32),
                ("dp_steps", ctypes.c_int64), ("dp_tokens", ctypes.c_int64),
                ("dp_max_read", ctypes.c_int64), ("dp_max_computed", ctypes.c_int64),
                ("dp_moved_seqs", ctypes.c_int64), ("dp_moved_tokens", ctypes.c_int64)]


LAYOUT_PACKED, LAYOUT_PADDED = 0, 1


class Batch(ctypes.Structure):
    """nopad_batch: one description of a batch for nopad_encode (pointers as integers)."""
    _fields_ = [("layout", _enum),
                ("on_device", ctypes.c_int),
                ("n_seqs", ctypes.c_int32),
                ("tokens", ctypes.c_void_p),
                ("token_type_ids", ctypes.c_void_p),
                ("cu_seqlens", ctypes.c_void_p),
                ("lengths", ctypes.c_void_p),
                ("max_len", ctypes.c_int32),
                ("n_tokens", ctypes.c_int32),
                ("max_seqlen", ctypes.c_int32)]


_p = ctypes.c_void_p
_i32p = ctypes.POINTER(ctypes.c_int32)
_f32p = ctypes.POINTER(ctypes.c_float)

# name: (restype, argtypes)
_PROTOTYPES = {
    "nopad_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "nopad_last_error": (ctypes.c_char_p, []),
    "nopad_version": (ctypes.c_char_p, []),
    "nopad_build_id": (ctypes.c_char_p, []),
    "nopad_cpu_blas_kernels": (ctypes.c_char_p, []),
    "nopad_tokenizer_load": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_p)]),
    "nopad_tokenizer_free": (None, [_p]),
    "nopad_tokenize_default_params": (TokenizeParams, []),
    "nopad_tokenize": (ctypes.c_int, [_p, ctypes.c_char_p, ctypes.c_size_t,
                                      ctypes.POINTER(TokenizeParams), _p, ctypes.c_int32,
                                      ctypes.POINTER(ctypes.c_int32)]),
    "nopad_tokenize_pair": (ctypes.c_int, [_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                           ctypes.c_size_t, ctypes.POINTER(TokenizeParams), _p, _p,
                                           ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]),
    "nopad_tokenizer_vocab_size": (ctypes.c_int32, [_p]),
    "nopad_tokenizer_token_to_id": (ctypes.c_int32, [_p, ctypes.c_char_p]),
    "nopad_tokenizer_id_to_token": (_p, [_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_size_t)]),
    "nopad_tokenizer_token_bytes": (ctypes.c_int, [_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t,
                                                   ctypes.POINTER(ctypes.c_size_t)]),
    "nopad_tokenizer_get_kind": (ctypes.c_int, [_p]),
    "nopad_tokenizer_kind_name": (ctypes.c_char_p, [ctypes.c_int]),
    "nopad_detokenize": (ctypes.c_int, [_p, _p, ctypes.c_size_t, ctypes.c_int, _p, ctypes.c_size_t,
                                        ctypes.POINTER(ctypes.c_size_t)]),
    "nopad_decode_stream_create": (ctypes.c_int, [_p, ctypes.c_int, ctypes.POINTER(_p)]),
    "nopad_decode_stream_step": (ctypes.c_int, [_p, ctypes.c_int32, ctypes.POINTER(_p),
                                                ctypes.POINTER(ctypes.c_size_t)]),
    "nopad_decode_stream_flush": (ctypes.c_int, [_p, ctypes.POINTER(_p),
                                                 ctypes.POINTER(ctypes.c_size_t)]),
    "nopad_decode_stream_free": (None, [_p]),
    "nopad_model_default_params": (ModelParams, []),
    "nopad_model_load": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ModelParams),
                                        ctypes.POINTER(_p)]),
    "nopad_model_free": (None, [_p]),
    "nopad_world_rank": (ctypes.c_int32, []),
    "nopad_world_size": (ctypes.c_int32, []),
    "nopad_tp_follow": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ModelParams)]),
    "nopad_tp_worker": (ctypes.c_int, []),  # the body of nopad-worker (not called from Python)
    "nopad_model_get_info": (ctypes.c_int, [_p, ctypes.POINTER(ModelInfo)]),
    "nopad_model_tokenizer": (_p, [_p]),
    "nopad_model_tokenizer_error": (ctypes.c_char_p, [_p]),
    "nopad_model_chat_template": (ctypes.c_char_p, [_p]),
    "nopad_model_weight_groups": (ctypes.c_int32, [_p, ctypes.POINTER(WeightGroup), ctypes.c_int32]),
    "nopad_model_memory": (ctypes.c_int, [_p, ctypes.POINTER(ctypes.c_size_t),
                                          ctypes.POINTER(ctypes.c_size_t),
                                          ctypes.POINTER(ctypes.c_size_t)]),
    "nopad_model_get_stats": (ctypes.c_int, [_p, ctypes.POINTER(ModelStats)]),
    "nopad_model_num_labels": (ctypes.c_int32, [_p]),
    "nopad_model_label": (ctypes.c_char_p, [_p, ctypes.c_int32]),
    "nopad_classify": (ctypes.c_int, [_p, ctypes.POINTER(Batch), ctypes.c_int32, _p]),
    "nopad_classify_packed": (ctypes.c_int, [_p, ctypes.c_int32, _p, _p, _p, _p]),
    "nopad_encode_default_params": (EncodeParams, []),
    "nopad_encode_packed": (ctypes.c_int, [_p, ctypes.c_int32, _p, _p, _p,
                                           ctypes.POINTER(EncodeParams), _p, _p]),
    "nopad_encode": (ctypes.c_int, [_p, ctypes.POINTER(Batch), ctypes.POINTER(EncodeParams), _p, _p]),
    "nopad_context_default_params": (ContextParams, []),
    "nopad_context_create": (ctypes.c_int, [_p, ctypes.POINTER(ContextParams), ctypes.POINTER(_p)]),
    "nopad_context_free": (None, [_p]),
    "nopad_model_context": (_p, [_p]),
    "nopad_context_memory": (ctypes.c_int, [_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]),
    "nopad_context_get_stats": (ctypes.c_int, [_p, ctypes.POINTER(ModelStats)]),
    "nopad_attention_varlen": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, _p, _p, _p,
                                              ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                              ctypes.c_int32, ctypes.c_float, ctypes.c_int, _p, _p]),
    "nopad_sampling_default_params": (SamplingParams, []),
    "nopad_sequence_create": (ctypes.c_int, [_p, ctypes.POINTER(_p)]),
    "nopad_sequence_free": (None, [_p]),
    "nopad_sequence_length": (ctypes.c_int32, [_p]),
    "nopad_decode": (ctypes.c_int, [_p, ctypes.c_int32, _p, _p, _p, ctypes.c_int, _p]),
    "nopad_decode_sample": (ctypes.c_int, [_p, ctypes.c_int32, _p, _p, _p, _p, _p, _p, _p]),
    "nopad_generate_default_params": (GenerateParams, []),
    "nopad_generate": (ctypes.c_int, [_p, ctypes.c_int32, _p, _p, ctypes.POINTER(GenerateParams),
                                      _p, _p, TokenFn, _p]),
    "nopad_engine_default_params": (EngineParams, []),
    "nopad_engine_create": (ctypes.c_int, [_p, ctypes.POINTER(EngineParams), ctypes.POINTER(_p)]),
    "nopad_engine_free": (None, [_p]),
    "nopad_engine_get_stats": (ctypes.c_int, [_p, ctypes.POINTER(EngineStats)]),
    "nopad_request_default_params": (RequestParams, []),
    "nopad_engine_submit": (ctypes.c_int, [_p, ctypes.POINTER(RequestParams), ctypes.POINTER(_p)]),
    "nopad_request_read": (ctypes.c_int, [_p, _p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                                          ctypes.POINTER(ctypes.c_int), ctypes.c_int32]),
    "nopad_request_text": (ctypes.c_int, [_p, ctypes.c_char_p, ctypes.c_size_t,
                                          ctypes.POINTER(ctypes.c_size_t)]),
    "nopad_request_id": (ctypes.c_uint64, [_p]),
    "nopad_request_logprobs": (ctypes.c_int, [_p, _p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]),
    "nopad_request_top_logprobs": (ctypes.c_int, [_p, _p, _p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]),
    "nopad_request_logprobs_from": (ctypes.c_int, [_p, ctypes.c_int32, _p, ctypes.c_int32,
                                                   ctypes.POINTER(ctypes.c_int32)]),
    "nopad_request_top_logprobs_from": (ctypes.c_int, [_p, ctypes.c_int32, _p, _p, ctypes.c_int32,
                                                       ctypes.POINTER(ctypes.c_int32)]),
    "nopad_request_cancel": (ctypes.c_int, [_p]),
    "nopad_request_free": (None, [_p]),
    "nopad_constraint_json_schema": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_p)]),
    "nopad_constraint_json_object": (ctypes.c_int, [ctypes.POINTER(_p)]),
    "nopad_constraint_regex": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_p)]),
    "nopad_constraint_choices": (ctypes.c_int, [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int32, ctypes.POINTER(_p)]),
    "nopad_constraint_json_sequence": (ctypes.c_int, [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int32, ctypes.c_char_p,
                                                       ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32,
                                                       ctypes.POINTER(_p)]),
    "nopad_constraint_free": (None, [_p]),
    "nopad_request_get_stats": (ctypes.c_int, [_p, ctypes.POINTER(RequestStats)]),
    "nopad_engine_cancel": (ctypes.c_int, [_p, ctypes.c_uint64]),
    "nopad_finish_reason_name": (ctypes.c_char_p, [ctypes.c_int]),
    "nopad_train_default_params": (TrainParams, []),
    "nopad_train": (ctypes.c_int, [ctypes.POINTER(TrainParams), ctypes.POINTER(TrainResult)]),
}

# Entry points that a library may or may not have (declared when present): for functions newer
# than the oldest library this package should still load.
_OPTIONAL: dict = {}

# ---- loading ------------------------------------------------------------------------------------

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[Path] = None


def _candidates() -> List[Tuple[str, Path]]:
    env = os.environ.get("NOPAD_LIBRARY")
    if env:
        return [("$NOPAD_LIBRARY", Path(env))]
    found = [("bundled with the package", _PKG_DIR / "_lib" / LIB_NAME)]
    repo = _PKG_DIR.parent.parent  # python/nopad/ -> the repository, in a checkout
    if (repo / "include" / "nopad.h").is_file():
        found.append(("the repository's build/", repo / "build" / LIB_NAME))
    return found


def find_library() -> Path:
    """The libnopad.so that :func:`library` loads (see the module docstring for the order)."""
    tried = []
    for what, path in _candidates():
        if path.is_file():
            return path.resolve()
        tried.append("%s (%s)" % (path, what))
    hint = ("set NOPAD_LIBRARY to a libnopad.so, or install the package with "
            "'pip install ./python' from the repository (it builds the library with CMake), or "
            "build it: cmake -S . -B build && cmake --build build --target nopad_shared")
    if os.environ.get("NOPAD_LIBRARY"):
        raise LibraryNotFoundError("NOPAD_LIBRARY=%s: no such file" % os.environ["NOPAD_LIBRARY"])
    raise LibraryNotFoundError("libnopad.so not found; tried %s. %s" % (", ".join(tried), hint))


def _cpu_blas_core() -> Optional[str]:
    """OpenBLAS core type for this CPU's vector units (as the CLI picks it), or None."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    if "avx512f" in flags:
                        return "SkylakeX"
                    if "avx2" in flags:
                        return "Haswell"
                    return None
    except OSError:
        pass
    return None


_PROBE = ("import ctypes, sys; l = ctypes.CDLL(sys.argv[1]); f = l.nopad_cpu_blas_kernels; "
          "f.restype = ctypes.c_char_p; print(f().decode())")


def _corename(lib: ctypes.CDLL) -> Optional[str]:
    try:
        f = lib.nopad_cpu_blas_kernels
    except AttributeError:
        return None
    f.restype = ctypes.c_char_p
    f.argtypes = []
    return f().decode()


def _load(path: Path) -> ctypes.CDLL:
    """CDLL(path), with OpenBLAS's fast kernels on CPUs it does not recognise.

    OpenBLAS picks its kernels when it is loaded; on CPUs it does not recognise (some virtual
    machines) it falls back to SSE3 ("Prescott") kernels, about half as fast. The CLI restarts
    itself with OPENBLAS_CORETYPE set; here a child process loads the library once to ask, and
    OPENBLAS_CORETYPE is set for the time of the load only. Set OPENBLAS_CORETYPE yourself to
    choose, or NOPAD_BLAS_PROBE=0 to skip the check. GOMP_SPINCOUNT=1000 is set the same way,
    unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set.
    """
    core = None
    if ("OPENBLAS_CORETYPE" not in os.environ and os.environ.get("NOPAD_BLAS_PROBE", "1") != "0"
            and sys.platform.startswith("linux")):
        core = _cpu_blas_core()
        if core is not None:
            try:
                probe = subprocess.run([sys.executable, "-S", "-c", _PROBE, str(path)],
                                       capture_output=True, timeout=60, check=False)
                if probe.returncode != 0 or probe.stdout.strip() != b"Prescott":
                    core = None
            except (OSError, subprocess.SubprocessError):
                core = None
    # OpenMP's idle threads spin 1,000 turns, then sleep, as the CLI sets it (docs/cpu.md):
    # libgomp's default 300,000 turns hold the cores other processes want. libgomp reads it once,
    # when it is loaded with the library (unless the process has it already).
    added = {}
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        added["GOMP_SPINCOUNT"] = "1000"
    if core is not None:
        added["OPENBLAS_CORETYPE"] = core
    os.environ.update(added)
    try:
        lib = ctypes.CDLL(str(path))
    finally:
        for name in added:
            del os.environ[name]
    if core is None:
        return lib
    if _corename(lib) == "Prescott":  # OpenBLAS was in the process already: too late
        warnings.warn("nopad: OpenBLAS uses its slow SSE3 kernels on this CPU; start Python with "
                      "OPENBLAS_CORETYPE=%s for about twice the CPU speed" % core,
                      RuntimeWarning, stacklevel=3)
    return lib


def library() -> ctypes.CDLL:
    """The loaded libnopad (loaded on first use), with every prototype declared."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = find_library()
        try:
            lib = _load(path)
        except OSError as e:
            raise LibraryNotFoundError("cannot load %s: %s" % (path, e)) from None
        for name, (restype, argtypes) in _PROTOTYPES.items():
            try:
                f = getattr(lib, name)
            except AttributeError:
                raise LibraryNotFoundError("%s lacks %s: it is not a libnopad.so of this version"
                                           % (path, name)) from None
            f.restype = restype
            f.argtypes = argtypes
        for name, (restype, argtypes) in _OPTIONAL.items():
            f = getattr(lib, name, None)
            if f is not None:
                f.restype = restype
                f.argtypes = argtypes
        _lib_path = path
        _lib = lib
        return lib


def library_path() -> Path:
    """Path of the loaded libnopad.so (loading it if needed)."""
    library()
    assert _lib_path is not None
    return _lib_path


def has_function(name: str) -> bool:
    """Whether the loaded library exports `name` (for entry points newer than this package)."""
    return getattr(library(), name, None) is not None


def last_error() -> str:
    msg = library().nopad_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(status: int, context: str = "") -> None:
    """Raises the NopadError subclass of `status` with nopad_last_error() unless it is OK."""
    if status != 0:
        msg = last_error() or library().nopad_status_string(status).decode()
        raise error_for(status, context + msg if context else msg)


def ptr(array) -> ctypes.c_void_p:
    """Data pointer of a numpy array (None for None)."""
    if array is None:
        return None
    return ctypes.c_void_p(array.ctypes.data)
