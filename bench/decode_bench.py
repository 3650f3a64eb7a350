#!/usr/bin/env python3
"""DEC benchmark (docs/design.md "DEC", issue 21): the decoder step, prefill and generation,
nopad against Hugging Face transformers, in one run on one GPU.

Sections, each in its own try/except (an error is printed, recorded and the run goes on):
  env       GPU, driver, torch / transformers / nopad versions; the device-to-device copy
            bandwidth (a 1 GiB torch copy, median of 10) and the 8192^3 GEMM rate per dtype
  model     a random LLaMA-1B-shaped folder in /tmp (config.json + fp16 model.safetensors written
            with numpy + safetensors; normal * 0.02, norms 1), reused when already there
  decode    per dtype (fp16, bf16): B sequences with C tokens of history each take one new token
            per nopad_decode_sample (greedy); ms per step = median wall time of N steps after W
            warm-up steps (a step returns the B chosen ids to the host, so it includes the one
            sync and the host's side of the step). The sequences are prefilled to C - W - N/2 tokens in chunks, so the timed
            steps attend to C keys on average (the exact mean is in the JSON, kv_tokens_mean).
            floor = (weight bytes read + KV bytes read) / copy bandwidth, where the weights read
            are every layer matrix and norm, the final norm, the LM head and B embedding rows,
            and KV = B * kv_tokens_mean * layers * 2 * kv_heads * head_dim * dtype bytes.
            Target: step / floor <= 1.2 at B <= 64. Points whose KV does not fit the pool are
            skipped and say so
  prefill   1 x 2048 and 16 x 512 prompt tokens in one nopad_decode each (fresh sequences, last
            logits to the host): ms and useful TFLOP/s = (2 * layer-matrix params * tokens
            + 2 * vocab * hidden per sequence (the LM head on last tokens) + causal attention
            4 * head_dim * heads * layers * sum L(L+1)/2) / time; the same for HF
            LlamaForCausalLM (sdpa, logits_to_keep=1, same ids, the last logits to the host),
            and the row-relative error of nopad's last logits against HF's
  hf_decode HF LlamaForCausalLM fp16, per-token latency (forward of one token per sequence + the
            last logits to the host, as nopad's step) at batch 1 and 32 with 512 tokens of
            context: eager with DynamicCache, then a StaticCache with the forward under
            torch.compile(mode="reduce-overhead"), each in a child process with a time limit (a
            timeout or error reads "skipped: ...", never a hang)
  smollm2   SmolLM2-135M-Instruct GGUF (--smollm2, else $NOPAD_SMOLLM2_GGUF, else
            ~/.cache/nopad): nopad_generate of one ~30-token prompt, 128 new tokens (greedy, EOS
            ignored) on CUDA fp16 and on the CPU: time to first token and tokens/s

Writes one JSON (--out), rewritten after every section, and prints markdown tables.

    python3 bench/decode_bench.py --library build-cuda/libnopad.so --out dec.json [--smollm2 GGUF]
    python3 bench/decode_bench.py --shape tiny --device cpu      # a check without a GPU

The whole run stays within --budget-s (default 480 s): points and sections that would start too
late are skipped and say so.
"""
import argparse
import ctypes
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SHAPES = {
    # LLaMA-1B shape of the DEC workload (docs/design.md)
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=4096),
    # a check of the script on the CPU
    "tiny": dict(vocab_size=1000, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
    # LLaMA-3-8B shape (issue 42's engine under tensor parallelism)
    "8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
               rope_theta=500000.0),
    # SmolLM2-135M shape (the default decoder; random weights; the LM head is the embedding matrix)
    "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                    rope_theta=100000.0, tie_word_embeddings=True),
}
DTYPE_CODE = {"f32": 0, "fp16": 1, "bf16": 2}
DTYPE_BYTES = {"f32": 4, "fp16": 2, "bf16": 2}
SEED = 20261125

# ---- the C API (include/nopad.h) ----------------------------------------------------------------


class ModelParams(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int), ("device_index", ctypes.c_int32), ("dtype", ctypes.c_int),
                ("n_threads", ctypes.c_int), ("max_batch_tokens", ctypes.c_int32),
                ("cuda_stream", ctypes.c_void_p), ("cuda_graph_max_tokens", ctypes.c_int32),
                ("kv_cache_tokens", ctypes.c_int32), ("kv_block_size", ctypes.c_int32),
                ("tp_size", ctypes.c_int32), ("weights", ctypes.c_int)]  # as python/nopad/_native.py


class ModelStats(ctypes.Structure):
    _fields_ = [("forwards", ctypes.c_int64), ("graph_replays", ctypes.c_int64),
                ("graphs_recorded", ctypes.c_int64), ("graphs_held", ctypes.c_int32)]


class TokenizeParams(ctypes.Structure):
    _fields_ = [("add_special_tokens", ctypes.c_int), ("truncate", ctypes.c_int), ("max_length", ctypes.c_int32)]


class SamplingParams(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_float), ("top_k", ctypes.c_int32), ("top_p", ctypes.c_float),
                ("min_p", ctypes.c_float), ("repetition_penalty", ctypes.c_float), ("seed", ctypes.c_uint64),
                ("presence_penalty", ctypes.c_float), ("frequency_penalty", ctypes.c_float),
                ("logit_bias", ctypes.c_void_p), ("n_logit_bias", ctypes.c_int32)]


class GenerateParams(ctypes.Structure):
    _fields_ = [("max_tokens", ctypes.c_int32), ("ignore_eos", ctypes.c_int), ("sampling", SamplingParams)]


TokenFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)
_p, _i32, _sz = ctypes.c_void_p, ctypes.c_int32, ctypes.c_size_t


def load_lib(path):
    lib = ctypes.CDLL(path)
    decl = {
        "nopad_last_error": (ctypes.c_char_p, []),
        "nopad_version": (ctypes.c_char_p, []),
        "nopad_model_default_params": (ModelParams, []),
        "nopad_model_load": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ModelParams), ctypes.POINTER(_p)]),
        "nopad_model_free": (None, [_p]),
        "nopad_model_context": (_p, [_p]),
        "nopad_model_memory": (ctypes.c_int, [_p, ctypes.POINTER(_sz), ctypes.POINTER(_sz), ctypes.POINTER(_sz)]),
        "nopad_model_get_stats": (ctypes.c_int, [_p, ctypes.POINTER(ModelStats)]),
        "nopad_model_tokenizer": (_p, [_p]),
        "nopad_tokenize": (ctypes.c_int, [_p, ctypes.c_char_p, _sz, ctypes.POINTER(TokenizeParams), _p, _i32,
                                          ctypes.POINTER(_i32)]),
        "nopad_detokenize": (ctypes.c_int, [_p, _p, _sz, ctypes.c_int, ctypes.c_char_p, _sz, ctypes.POINTER(_sz)]),
        "nopad_sequence_create": (ctypes.c_int, [_p, ctypes.POINTER(_p)]),
        "nopad_sequence_free": (None, [_p]),
        "nopad_sequence_length": (_i32, [_p]),
        "nopad_decode": (ctypes.c_int, [_p, _i32, _p, _p, _p, ctypes.c_int, _p]),
        "nopad_decode_sample": (ctypes.c_int, [_p, _i32, _p, _p, _p, _p, _p, _p, _p]),
        "nopad_generate_default_params": (GenerateParams, []),
        "nopad_generate": (ctypes.c_int, [_p, _i32, _p, _p, ctypes.POINTER(GenerateParams), _p, _p, TokenFn, _p]),
    }
    for name, (res, args) in decl.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


def check(lib, status, what):
    if status != 0:
        raise RuntimeError(f"nopad {what}: status {status}: {lib.nopad_last_error().decode()}")


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


class Model:
    """A loaded nopad model, its default context and the sequences made on it."""

    def __init__(self, lib, path, device, dtype, max_batch_tokens, kv_cache_tokens, tp_size=1):
        self.lib = lib
        p = lib.nopad_model_default_params()
        p.device = 1 if device == "cuda" else 0
        p.dtype = DTYPE_CODE[dtype]
        p.tp_size = tp_size  # > 1: nopad starts tp_size - 1 workers, one GPU each
        p.max_batch_tokens = max_batch_tokens
        p.kv_cache_tokens = kv_cache_tokens
        self.max_batch_tokens = max_batch_tokens
        self.handle = ctypes.c_void_p()
        check(lib, lib.nopad_model_load(path.encode(), ctypes.byref(p), ctypes.byref(self.handle)), "load")
        self.ctx = lib.nopad_model_context(self.handle)

    def memory(self):
        w, ws, be = _sz(), _sz(), _sz()
        check(self.lib, self.lib.nopad_model_memory(self.handle, ctypes.byref(w), ctypes.byref(ws), ctypes.byref(be)),
              "memory")
        return {"weights_bytes": w.value, "workspace_bytes": ws.value, "backend_bytes": be.value}

    def stats(self):
        s = ModelStats()
        check(self.lib, self.lib.nopad_model_get_stats(self.handle, ctypes.byref(s)), "stats")
        return {"forwards": s.forwards, "graph_replays": s.graph_replays, "graphs_recorded": s.graphs_recorded}

    def sequences(self, n):
        out = []
        for _ in range(n):
            s = ctypes.c_void_p()
            check(self.lib, self.lib.nopad_sequence_create(self.ctx, ctypes.byref(s)), "sequence_create")
            out.append(s.value)
        return out

    def free_sequences(self, seqs):
        for s in seqs:
            self.lib.nopad_sequence_free(s)

    def step(self, seqs, cu, tokens, logits):
        """One nopad_decode over len(seqs) sequences; cu and tokens int32 arrays, logits a float32
        [len(seqs), vocab] array (C-contiguous)."""
        arr = (ctypes.c_void_p * len(seqs))(*seqs)
        check(self.lib, self.lib.nopad_decode(self.ctx, len(seqs), arr, ptr(cu), ptr(tokens), 0, ptr(logits)),
              "decode")

    def step_sample(self, seqs, cu, tokens, ids):
        """One nopad_decode_sample over len(seqs) sequences, greedy: ids (int32 [len(seqs)]) receive
        the next ids, chosen on the device."""
        arr = (ctypes.c_void_p * len(seqs))(*seqs)
        check(self.lib, self.lib.nopad_decode_sample(self.ctx, len(seqs), arr, ptr(cu), ptr(tokens), None, None,
                                                     ptr(ids), None), "decode_sample")

    def feed(self, seqs, n_tokens, vocab, rng):
        """Gives every sequence of seqs n_tokens more tokens (random ids), in packed steps of at
        most max_batch_tokens tokens: several sequences per step, a long one in chunks."""
        if n_tokens <= 0:
            return
        left = [n_tokens] * len(seqs)
        logits = np.empty((min(len(seqs), self.max_batch_tokens), vocab), np.float32)
        i = 0
        while i < len(seqs):
            batch, cu = [], [0]
            j = i
            while j < len(seqs) and cu[-1] < self.max_batch_tokens:
                take = min(left[j], self.max_batch_tokens - cu[-1])
                batch.append(seqs[j])
                cu.append(cu[-1] + take)
                left[j] -= take
                j += 1
            toks = rng.integers(0, vocab, cu[-1], dtype=np.int32)
            self.step(batch, np.array(cu, np.int32), toks, logits[:len(batch)])
            while i < len(seqs) and left[i] == 0:
                i += 1

    def close(self):
        if self.handle:
            self.lib.nopad_model_free(self.handle)
            self.handle = None


# ---- arithmetic of the model ------------------------------------------------------------------


def counts(shape):
    H, F, L = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    nh, kvh, V = shape["num_attention_heads"], shape["num_key_value_heads"], shape["vocab_size"]
    D = H // nh
    layer_matrix = H * nh * D + 2 * H * kvh * D + nh * D * H + 3 * H * F
    c = {"head_dim": D, "layer_matrix_params": L * layer_matrix, "layer_norm_params": L * 2 * H,
         "embed_params": V * H, "lm_head_params": V * H, "final_norm_params": H}
    c["params"] = sum(v for k, v in c.items() if k.endswith("_params"))
    c["kv_values_per_token"] = L * 2 * kvh * D  # K and V elements per token of history
    return c


def decode_bytes(shape, B, kv_tokens_mean, es):
    """Bytes a decode step of B sequences must read: all layer weights, the final norm, the LM head,
    B embedding rows, and the KV history (kv_tokens_mean keys per sequence, the new one included)."""
    c = counts(shape)
    w = es * (c["layer_matrix_params"] + c["layer_norm_params"] + c["final_norm_params"] + c["lm_head_params"]
              + B * shape["hidden_size"])
    kv = es * B * kv_tokens_mean * c["kv_values_per_token"]
    return w, kv


def prefill_flops(shape, lengths):
    c = counts(shape)
    T = sum(lengths)
    attn = 4 * c["head_dim"] * shape["num_attention_heads"] * shape["num_hidden_layers"] * sum(
        L * (L + 1) // 2 for L in lengths)
    return 2 * c["layer_matrix_params"] * T + 2 * c["lm_head_params"] * len(lengths) + attn


# ---- the checkpoint ----------------------------------------------------------------------------


def make_checkpoint(shape, folder):
    """A random LLaMA folder: config.json and one fp16 model.safetensors (normal * 0.02, norms 1;
    no lm_head.weight when the shape ties it to the embeddings). Reused when the folder holds the
    same config and a complete file."""
    from safetensors.numpy import save_file
    c = counts(shape)
    tied = bool(shape.get("tie_word_embeddings"))
    file_bytes = 2 * (c["params"] - (c["lm_head_params"] if tied else 0))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "attention_bias": False, "mlp_bias": False, "head_dim": c["head_dim"],
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02, "torch_dtype": "float16",
           "use_cache": True, **shape}
    path = os.path.join(folder, "model.safetensors")
    stamp = os.path.join(folder, "complete.json")
    want = {"config": cfg, "seed": SEED, "bytes": file_bytes}
    try:
        with open(stamp) as fh:
            if json.load(fh) == want and os.path.getsize(path) >= file_bytes:
                return {"folder": folder, "reused": True, "seconds": 0.0}
    except (OSError, ValueError):
        pass
    t0 = time.time()
    os.makedirs(folder, exist_ok=True)
    if os.path.exists(stamp):
        os.remove(stamp)
    H, F, V = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    nh, kvh, D = shape["num_attention_heads"], shape["num_key_value_heads"], c["head_dim"]
    specs = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not tied:
        specs["lm_head.weight"] = (V, H)
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                      p + "self_attn.q_proj.weight": (nh * D, H), p + "self_attn.k_proj.weight": (kvh * D, H),
                      p + "self_attn.v_proj.weight": (kvh * D, H), p + "self_attn.o_proj.weight": (H, nh * D),
                      p + "mlp.gate_proj.weight": (F, H), p + "mlp.up_proj.weight": (F, H),
                      p + "mlp.down_proj.weight": (H, F)})
    names = sorted(specs)
    gens = np.random.default_rng(SEED).spawn(len(names))

    def one(k):
        name, shp = names[k], specs[names[k]]
        if len(shp) == 1:
            return name, np.ones(shp, np.float16)
        x = gens[k].standard_normal(shp, dtype=np.float32)
        x *= 0.02
        return name, x.astype(np.float16)

    # numpy's generators fill arrays without the GIL: one generator per tensor, in threads
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as ex:
        tensors = dict(ex.map(one, range(len(names))))
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    save_file(tensors, path)
    del tensors
    with open(stamp, "w") as fh:
        json.dump(want, fh)
    return {"folder": folder, "reused": False, "seconds": time.time() - t0}


# ---- measurements of the machine ---------------------------------------------------------------


def copy_bandwidth(device):
    """Bytes read + written per second by a device-to-device copy of 1 GiB (CUDA, torch; median of
    10) or a 256 MiB memory copy (CPU, numpy; median of 10)."""
    if device == "cuda":
        import torch
        n = 1 << 30
        a = torch.empty(n, dtype=torch.uint8, device="cuda")
        a.random_()
        b = torch.empty_like(a)
        for _ in range(3):
            b.copy_(a)
        times = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            b.copy_(a)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        del a, b
        torch.cuda.empty_cache()
    else:
        n = 256 << 20
        a = np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
        b = np.empty_like(a)
        times = []
        for i in range(13):
            t0 = time.perf_counter()
            np.copyto(b, a)
            if i >= 3:
                times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    return {"copy_bytes": n, "copy_ms": t * 1e3, "read_plus_write_GBps": 2 * n / t / 1e9,
            "read_only_GBps": n / t / 1e9}


def d2h_bandwidth():
    """Pageable device-to-host copy rate (a nopad step's logits go to a numpy array), 64 MiB."""
    import torch
    n = 64 << 20
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    h = torch.empty(n, dtype=torch.uint8)
    for _ in range(2):
        h.copy_(a)
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        h.copy_(a)
        times.append(time.perf_counter() - t0)
    del a
    torch.cuda.empty_cache()
    return n / statistics.median(times) / 1e9


def matmul_tflops(dtype):
    import torch
    dt = torch.float16 if dtype == "fp16" else torch.bfloat16
    a = torch.randn(8192, 8192, device="cuda", dtype=dt)
    b = torch.randn(8192, 8192, device="cuda", dtype=dt)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 10)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 8192 ** 3 / statistics.median(times) / 1e9


def env_info(args, lib):
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": args.device, "shape": args.shape,
            "seed": SEED, "library": os.path.abspath(args.library), "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "numpy": np.__version__}
    try:
        info["nopad"] = lib.nopad_version().decode()
    except Exception as e:  # noqa: BLE001
        info["nopad"] = f"? ({e})"
    try:  # the build measured, from the library itself
        lib.nopad_build_id.restype = ctypes.c_char_p
        info["build"] = lib.nopad_build_id().decode()
    except Exception as e:  # noqa: BLE001
        info["build"] = "? (%s)" % e
    for mod in ("torch", "transformers", "safetensors"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            info[mod] = f"missing ({type(e).__name__})"
    if args.device == "cuda":
        try:
            import torch
            p = torch.cuda.get_device_properties(0)
            info.update(gpu=p.name, sms=p.multi_processor_count, gpu_memory_GiB=round(p.total_memory / 2 ** 30, 1),
                        cuda=torch.version.cuda)
        except Exception as e:  # noqa: BLE001
            info["gpu"] = f"? ({type(e).__name__}: {e})"[:200]
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=30).stdout.strip().split("\n")[0]
        except Exception:  # noqa: BLE001
            info["driver"] = "?"
    return info


# ---- nopad: the decode grid and prefill --------------------------------------------------------


def kv_pool_tokens(args, shape, es, points, block):
    """KV tokens the largest point needs, and what fits the GPU's free memory next to the weights
    and workspace (CUDA) or 8 GiB (CPU)."""
    c = counts(shape)
    # a point's sequences end at C + steps // 2 (run_decode centres the timed steps on C)
    need = max((B * math.ceil((C + args.steps // 2) / block) * block for B, C in points), default=block)
    need = max(need, 8192 + 16 * block)  # the prefill points
    # with tensor parallelism every GPU holds 1 / tp of the weights and of each token's KV
    per_token = c["kv_values_per_token"] * es / args.tp
    if args.device == "cuda":
        import torch
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info()[0]
        T, H, V = args.max_batch_tokens, shape["hidden_size"], shape["vocab_size"]
        work = T * (12 * H + 3 * shape["intermediate_size"] + V) * es + (256 << 20)
        room = free - c["params"] * es / args.tp - work - (3 << 30)
    else:
        room = 8 << 30
    fit = max(0, int(room // per_token) // block * block)
    return need, fit, per_token


def run_decode(args, lib, folder, shape, dtype, bw, out, deadline, reserve_s):
    es = DTYPE_BYTES[dtype]
    block = 16
    W, N = args.warmup, args.steps
    points = [(B, C) for C in args.contexts for B in args.batches]
    need, fit, per_token = kv_pool_tokens(args, shape, es, points, block)
    pool = min(need, fit)
    rows, prefill_rows = [], []
    t0 = time.time()
    for attempt in range(4):  # a pool the device refuses: half of it, the points that need more skipped
        try:
            m = Model(lib, folder, args.device, dtype, args.max_batch_tokens, pool, args.tp)
            break
        except RuntimeError as e:
            if attempt == 3 or "status 5" not in str(e) or pool <= 16384:
                raise
            print(f"# nopad {dtype}: a KV pool of {pool} tokens did not fit ({e}); trying {pool // 2}", flush=True)
            pool //= 2
    load_s = time.time() - t0
    mem = m.memory()
    print(f"# nopad {args.device} {dtype}: loaded in {load_s:.1f} s, {json.dumps(mem)}, KV pool {pool} tokens "
          f"({pool * per_token / 2 ** 30:.2f} GiB; the largest point needs {need})", flush=True)
    out.setdefault("nopad_load", {})[dtype] = {"seconds": load_s, "kv_pool_tokens": pool, "kv_pool_needed": need,
                                               **mem}
    rng = np.random.default_rng(SEED)
    V = shape["vocab_size"]
    rate = {}  # prefill tokens/s seen at each context
    try:
        for B, C in points:
            row = {"dtype": dtype, "batch": B, "context": C}
            prefill = C - W - (N + 1) // 2
            seq_tokens = prefill + W + N
            if B * (math.ceil(seq_tokens / block)) * block > pool:
                row["skipped"] = (f"needs {B * seq_tokens} KV tokens "
                                  f"({B * seq_tokens * per_token / 2 ** 30:.1f} GiB), the pool holds {pool}")
            elif deadline.left() < reserve_s:
                row["skipped"] = "time budget"
            elif C in rate and B * prefill / rate[C] > deadline.left() - reserve_s:
                row["skipped"] = f"time budget (its prefill would take ~{B * prefill / rate[C]:.0f} s)"
            if "skipped" in row:
                print(f"# decode {dtype} {B} x {C}: skipped: {row['skipped']}", flush=True)
                rows.append(row)
                out["decode"].append(row)
                continue
            try:
                seqs = m.sequences(B)
                try:
                    tp = time.time()
                    m.feed(seqs, prefill, V, rng)
                    row["prefill_s"] = time.time() - tp
                    rate[C] = B * prefill / max(row["prefill_s"], 1e-6)  # tokens/s, for the next points
                    cu = np.arange(B + 1, dtype=np.int32)
                    ids = np.empty(B, np.int32)
                    times = []
                    s0 = m.stats()
                    for i in range(W + N):
                        toks = rng.integers(0, V, B, dtype=np.int32)
                        t1 = time.perf_counter()
                        m.step_sample(seqs, cu, toks, ids)
                        t2 = time.perf_counter()
                        if i >= W:
                            times.append(t2 - t1)
                    s1 = m.stats()
                    lens = {lib.nopad_sequence_length(s) for s in seqs}
                    assert lens == {seq_tokens}, f"sequence lengths {sorted(lens)}, expected {seq_tokens}"
                    if not ((ids >= 0) & (ids < V)).all():
                        row["warning"] = "ids outside the vocabulary"
                finally:
                    m.free_sequences(seqs)
                ms = statistics.median(times) * 1e3
                kv_mean = prefill + W + (N + 1) / 2  # keys attended per timed step, the new one included
                wb, kvb = decode_bytes(shape, B, kv_mean, es)
                # the floor of one GPU's share (tp > 1: each reads 1 / tp of the bytes)
                floor_ms = (wb + kvb) / args.tp / (bw["read_plus_write_GBps"] * 1e9) * 1e3
                row.update(ms=ms, ms_min=min(times) * 1e3, ms_max=max(times) * 1e3, tokens_per_s=B / ms * 1e3,
                           kv_tokens_mean=kv_mean, weight_bytes=wb, kv_bytes=kvb, floor_ms=floor_ms,
                           x_floor=ms / floor_ms, ids_bytes=B * 4, steps=N, warmup=W, tp=args.tp,
                           graph_replays=s1["graph_replays"] - s0["graph_replays"])
                print(f"# decode {dtype} {B} x {C}: {ms:.3f} ms/step, {row['tokens_per_s']:.0f} tok/s, "
                      f"floor {floor_ms:.3f} ms, x{row['x_floor']:.2f} (prefill {row['prefill_s']:.1f} s, "
                      f"t={deadline.elapsed():.0f} s)", flush=True)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:400]
                print(f"# decode {dtype} {B} x {C}: error: {row['error']}", flush=True)
            rows.append(row)
            out["decode"].append(row)

        # prefill: 1 x 2048 and 16 x 512 prompt tokens in one step each
        for n_seqs, L in args.prefill:
            row = {"dtype": dtype, "seqs": n_seqs, "length": L, "tokens": n_seqs * L}
            if n_seqs * L > args.max_batch_tokens:
                row["skipped"] = f"{n_seqs * L} tokens > max_batch_tokens {args.max_batch_tokens}"
            elif deadline.left() < reserve_s:
                row["skipped"] = "time budget"
            if "skipped" in row:
                prefill_rows.append(row)
                out["prefill"].append(row)
                continue
            try:
                ids = np.random.default_rng(SEED + L).integers(0, V, n_seqs * L, dtype=np.int32)
                cu = np.arange(0, n_seqs * L + 1, L, dtype=np.int32)
                logits = np.empty((n_seqs, V), np.float32)
                times = []
                for i in range(args.prefill_warmup + args.prefill_reps):
                    seqs = m.sequences(n_seqs)
                    try:
                        t1 = time.perf_counter()
                        m.step(seqs, cu, ids, logits)
                        t2 = time.perf_counter()
                    finally:
                        m.free_sequences(seqs)
                    if i >= args.prefill_warmup:
                        times.append(t2 - t1)
                ms = statistics.median(times) * 1e3
                flops = prefill_flops(shape, [L] * n_seqs)
                row.update(ms=ms, flops=flops, tflops=flops / ms / 1e9, reps=args.prefill_reps)
                row["_ids"], row["_logits"] = ids, logits.copy()  # for the comparison with HF (not in the JSON)
                print(f"# prefill {dtype} {n_seqs} x {L}: {ms:.3f} ms, {row['tflops']:.1f} TFLOP/s", flush=True)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"[:400]
                print(f"# prefill {dtype} {n_seqs} x {L}: error: {row['error']}", flush=True)
            prefill_rows.append(row)
            out["prefill"].append(row)
    finally:
        m.close()
    return rows, prefill_rows


# ---- Hugging Face peers ------------------------------------------------------------------------


def torch_dtype(name):
    import torch
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[name]


def hf_load(folder, device, dtype):
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch_dtype(dtype), attn_implementation="sdpa")
    return model.to(device).eval()


def run_hf_prefill(args, folder, shape, dtype, prefill_rows):
    """HF sdpa forward on the ids nopad prefilled, logits_to_keep=1, last logits to the host."""
    import torch
    model = hf_load(folder, args.device, dtype)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    try:
        for row in prefill_rows:
            if row.get("dtype") != dtype or "_ids" not in row:
                continue
            try:
                n, L = row["seqs"], row["length"]
                ids = torch.from_numpy(row["_ids"].astype(np.int64)).view(n, L).to(args.device)
                times = []
                with torch.inference_mode():
                    for i in range(args.prefill_warmup + args.prefill_reps):
                        sync()
                        t1 = time.perf_counter()
                        out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
                        last = out.logits[:, -1].float().cpu()
                        t2 = time.perf_counter()
                        if i >= args.prefill_warmup:
                            times.append(t2 - t1)
                ms = statistics.median(times) * 1e3
                ref = last.numpy()
                err = float((np.linalg.norm(row["_logits"] - ref, axis=1) / np.linalg.norm(ref, axis=1)).max())
                row.update(hf_sdpa_ms=ms, hf_sdpa_tflops=row["flops"] / ms / 1e9, speedup_vs_hf=ms / row["ms"],
                           err_vs_hf=err)
                print(f"# HF prefill {dtype} {n} x {L}: {ms:.3f} ms; nopad x{row['speedup_vs_hf']:.2f}, "
                      f"err {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001
                row["hf_error"] = f"{type(e).__name__}: {e}"[:400]
                print(f"# HF prefill {dtype}: error: {row['hf_error']}", flush=True)
    finally:
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()


def hf_decode_worker(spec):
    """Child process: HF per-token latency, one result line per batch appended to spec['out']."""
    import torch
    from transformers import DynamicCache, StaticCache
    dev, mode = spec["device"], spec["mode"]
    model = hf_load(spec["folder"], dev, spec["dtype"])
    vocab = model.config.vocab_size
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    compiled = None
    for B in spec["batches"]:
        C, W, N = spec["context"], spec["warmup"], spec["steps"]
        res = {"mode": mode, "batch": B, "context": C}
        t0 = time.time()
        try:
            g = torch.Generator().manual_seed(SEED + B)
            ids = torch.randint(0, vocab, (B, C), generator=g).to(dev)
            toks = torch.randint(0, vocab, (W + N, B, 1), generator=g).to(dev)
            with torch.inference_mode():
                if mode == "eager":
                    out = model(input_ids=ids, use_cache=True, past_key_values=DynamicCache(config=model.config),
                                logits_to_keep=1)
                    cache, fwd = out.past_key_values, model
                else:
                    cache = StaticCache(config=model.config, max_cache_len=C + W + N + 8)
                    model(input_ids=ids, use_cache=True, past_key_values=cache, logits_to_keep=1)  # eager prefill
                    if compiled is None:
                        compiled = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
                    fwd = compiled
                sync()
                times = []
                for i in range(W + N):
                    t1 = time.perf_counter()
                    out = fwd(input_ids=toks[i], use_cache=True, past_key_values=cache)
                    last = out.logits[:, -1].float().cpu()
                    t2 = time.perf_counter()
                    if i == 0:
                        res["first_step_s"] = t2 - t1  # compilation, for the compiled peer
                    if i >= W:
                        times.append(t2 - t1)
            ms = statistics.median(times) * 1e3
            res.update(ms=ms, tokens_per_s=B / ms * 1e3, steps=N, warmup=W, seconds=time.time() - t0,
                       finite=bool(torch.isfinite(last).all()))
        except Exception as e:  # noqa: BLE001
            res["error"] = f"{type(e).__name__}: {e}"[:400]
            traceback.print_exc()
        with open(spec["out"], "a") as fh:
            fh.write(json.dumps(res) + "\n")
        print(json.dumps(res), flush=True)


def run_hf_decode(args, folder, mode, limit_s, logdir):
    """Runs hf_decode_worker in a child process (its own process group) for at most limit_s."""
    res_path = os.path.join(logdir, f"hf_decode_{mode}.jsonl")
    log_path = os.path.join(logdir, f"hf_decode_{mode}.log")
    if os.path.exists(res_path):
        os.remove(res_path)
    spec = {"folder": folder, "device": args.device, "dtype": "fp16" if args.device == "cuda" else "f32",
            "mode": mode, "batches": args.peer_batches, "context": args.peer_context, "warmup": args.warmup,
            "steps": args.steps, "out": res_path}
    t0 = time.time()
    note = None
    with open(log_path, "w") as log:
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--hf-worker", json.dumps(spec)],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=max(1, limit_s))
            if rc != 0:
                note = f"exit status {rc}"
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            note = f"timeout after {limit_s:.0f} s"
    results = {}
    if os.path.exists(res_path):
        for line in open(res_path):
            r = json.loads(line)
            results[r["batch"]] = r
    rows = []
    for B in args.peer_batches:
        r = results.get(B, {"mode": mode, "batch": B, "context": args.peer_context})
        if "ms" not in r and "error" not in r:
            r["skipped"] = note or "no result"
        elif "error" in r:
            r["skipped"] = r["error"]
        rows.append(r)
    tail = open(log_path).read()[-1500:]
    if note or any("ms" not in r for r in rows):
        print(f"# HF decode {mode}: {note or 'errors'}; log tail:\n{tail}", flush=True)
    return rows, time.time() - t0


# ---- SmolLM2 -----------------------------------------------------------------------------------

PROMPT = ("<|im_start|>user\nWhat is the capital of France? Answer in one sentence, then say in two "
          "more why it became the capital.<|im_end|>\n<|im_start|>assistant\n")


def find_smollm2(path):
    for p in (path, os.environ.get("NOPAD_SMOLLM2_GGUF"),
              os.path.expanduser("~/.cache/nopad/SmolLM2-135M-Instruct.Q4_1.gguf")):
        if p and os.path.exists(p):
            return p
    return None


def run_smollm2(args, lib, path, device, dtype, new_tokens, reps, limit_s):
    """reps timed runs after a 4-token warm-up, all within limit_s: a run past it stops at its next
    token (the callback returns 1) and says so, and no further run starts."""
    t_end = time.perf_counter() + limit_s
    m = Model(lib, path, device, dtype, 512, 1024)
    try:
        tok = lib.nopad_model_tokenizer(m.handle)
        if not tok:
            raise RuntimeError("the GGUF file has no tokenizer nopad loads")
        ids = np.empty(256, np.int32)
        n = _i32()
        tp = TokenizeParams(1, 0, 0)
        text = PROMPT.encode()
        check(lib, lib.nopad_tokenize(tok, text, len(text), ctypes.byref(tp), ptr(ids), 256, ctypes.byref(n)),
              "tokenize")
        ids = ids[:n.value].copy()
        cu = np.array([0, len(ids)], np.int32)
        gp = lib.nopad_generate_default_params()
        gp.ignore_eos = 1
        out_tokens = np.empty(new_tokens, np.int32)
        counts_ = np.zeros(1, np.int32)
        stamps = []

        def on_token(user, prompt, token):
            stamps.append(time.perf_counter())
            return 1 if stamps[-1] > t_end else 0

        cb = TokenFn(on_token)
        runs = []
        for r in range(reps + 1):
            if r > 1 and time.perf_counter() > t_end:
                break
            gp.max_tokens = 4 if r == 0 else new_tokens  # a short warm-up first
            stamps.clear()
            t0 = time.perf_counter()
            check(lib, lib.nopad_generate(m.ctx, 1, ptr(cu), ptr(ids), ctypes.byref(gp), ptr(out_tokens),
                                          ptr(counts_), cb, None), "generate")
            t1 = time.perf_counter()
            if r == 0:
                continue
            k = len(stamps)
            runs.append({"ttft_ms": (stamps[0] - t0) * 1e3, "total_s": t1 - t0, "new_tokens": k,
                         "decode_tokens_per_s": (k - 1) / (stamps[-1] - stamps[0]) if k > 1 else None,
                         "tokens_per_s": k / (t1 - t0), "stopped_at_time_limit": k < new_tokens})
        text_out = ctypes.create_string_buffer(1 << 16)
        tlen = _sz()
        st = lib.nopad_detokenize(tok, ptr(out_tokens), int(counts_[0]), 1, text_out, 1 << 16, ctypes.byref(tlen))
        res = {"device": device, "dtype": dtype, "prompt_tokens": int(len(ids)), "runs": runs,
               "text": text_out.value.decode(errors="replace")[:200] if st == 0 else None}
        for k in ("ttft_ms", "decode_tokens_per_s", "tokens_per_s", "total_s"):
            res[k] = statistics.median(x[k] for x in runs)
        res["new_tokens"] = runs[-1]["new_tokens"]
        res["stopped_at_time_limit"] = any(x["stopped_at_time_limit"] for x in runs)
        return res
    finally:
        m.close()


# ---- driver ------------------------------------------------------------------------------------


class Deadline:
    def __init__(self, budget_s):
        self.t0, self.budget = time.time(), budget_s

    def elapsed(self):
        return time.time() - self.t0

    def left(self):
        return self.budget - self.elapsed()


def clean(obj):
    """The JSON-able part of the results (drops the arrays kept for comparisons)."""
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items() if not k.startswith("_")}
    if isinstance(obj, list):
        return [clean(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return obj


def f(v, fmt="{:.3f}"):
    return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else "–"


def tables(out):
    info = out.get("info", {})
    bw = out.get("bandwidth") or {}
    lines = ["\n## DEC — decoder step, prefill and generation (bench/decode_bench.py)",
             f"\n{info.get('gpu', info.get('device'))}, driver {info.get('driver', '–')}, torch {info.get('torch')}, "
             f"transformers {info.get('transformers')}, CUDA {info.get('cuda', '–')}, nopad {info.get('nopad')} "
             f"({info.get('build', '?')}), seed {info.get('seed')}, shape {info.get('shape')}",
             f"copy bandwidth {f(bw.get('read_plus_write_GBps'), '{:.0f}')} GB/s read + written "
             f"({f(bw.get('read_only_GBps'), '{:.0f}')} GB/s of reads alone); GEMM "
             + ", ".join(f"{k} {v:.0f} TFLOP/s" for k, v in (out.get("matmul_tflops") or {}).items())]
    for dtype in out.get("dtypes", []):
        rows = [r for r in out["decode"] if r["dtype"] == dtype]
        if not rows:
            continue
        lines += [f"\nDecode step, nopad {dtype} (median of {rows[0].get('steps', '?')} steps; floor = (weights + KV "
                  "read) / copy bandwidth; target <= 1.2x at batch <= 64):\n",
                  "| batch × context | ms per step | tokens/s | floor ms | × floor | weights + KV GB | graph replays |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            if "ms" not in r:
                lines.append(f"| {r['batch']} × {r['context']} | {r.get('skipped') or r.get('error')} ||||||")
                continue
            lines.append(f"| {r['batch']} × {r['context']} | {r['ms']:.3f} | {r['tokens_per_s']:.0f} | "
                         f"{r['floor_ms']:.3f} | {r['x_floor']:.2f} | "
                         f"{(r['weight_bytes'] + r['kv_bytes']) / 1e9:.2f} | {r['graph_replays']} |")
    if out.get("prefill"):
        lines += ["\nPrefill, one step (ms; useful TFLOP/s; HF = LlamaForCausalLM sdpa, logits_to_keep=1):\n",
                  "| dtype | seqs × length | nopad ms | TFLOP/s | of GEMM rate | HF sdpa ms | HF TFLOP/s | nopad vs HF |"
                  " err vs HF |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in out["prefill"]:
            gemm = (out.get("matmul_tflops") or {}).get(r["dtype"])
            frac = r["tflops"] / gemm if "tflops" in r and gemm else None
            lines.append(f"| {r['dtype']} | {r['seqs']} × {r['length']} | "
                         f"{f(r.get('ms')) if 'ms' in r else r.get('skipped') or r.get('error')} | "
                         f"{f(r.get('tflops'), '{:.1f}')} | {f(frac, '{:.2f}')} | "
                         f"{f(r.get('hf_sdpa_ms')) if 'hf_sdpa_ms' in r else r.get('hf_error', '–')} | "
                         f"{f(r.get('hf_sdpa_tflops'), '{:.1f}')} | {f(r.get('speedup_vs_hf'), '{:.2f}x')} | "
                         f"{f(r.get('err_vs_hf'), '{:.1e}')} |")
    if out.get("hf_decode"):
        lines += [f"\nDecode peer: HF LlamaForCausalLM {'fp16' if info.get('device') == 'cuda' else 'f32'}, one token "
                  "per sequence + last logits to the host, against nopad's step at the same batch and context:\n",
                  "| peer | batch × context | ms per token | tokens/s | nopad ms | nopad vs peer |",
                  "|---|---|---|---|---|---|"]
        nop = {(r["batch"], r["context"]): r for r in out["decode"]
               if r["dtype"] == (out.get("dtypes") or ["?"])[0] and "ms" in r}
        for r in out["hf_decode"]:
            name = {"eager": "HF eager, DynamicCache", "compile": "HF StaticCache + torch.compile"}[r["mode"]]
            n = nop.get((r["batch"], r["context"]), {}).get("ms")
            if "ms" not in r:
                lines.append(f"| {name} | {r['batch']} × {r['context']} | skipped: {r.get('skipped')} ||||")
                continue
            lines.append(f"| {name} | {r['batch']} × {r['context']} | {r['ms']:.3f} | {r['tokens_per_s']:.0f} | "
                         f"{f(n)} | {f(r['ms'] / n if n else None, '{:.2f}x')} |")
    if out.get("smollm2"):
        lines += ["\nSmolLM2-135M-Instruct Q4_1 (GGUF), nopad_generate, one prompt, greedy, EOS ignored:\n",
                  "| device | dtype | prompt tokens | new tokens | time to first token ms | tokens/s after the first |"
                  " tokens/s overall |",
                  "|---|---|---|---|---|---|---|"]
        for r in out["smollm2"]:
            if "ttft_ms" not in r:
                lines.append(f"| {r.get('device')} | {r.get('dtype')} | skipped: {r.get('skipped') or r.get('error')}"
                             " |||||")
                continue
            stop = " (stopped: time limit)" if r.get("stopped_at_time_limit") else ""
            lines.append(f"| {r['device']} | {r['dtype']} | {r['prompt_tokens']} | {r['new_tokens']}{stop} | "
                         f"{r['ttft_ms']:.1f} | {r['decode_tokens_per_s']:.0f} | {r['tokens_per_s']:.0f} |")
    if out.get("errors"):
        lines += ["\nErrors:"] + [f"- {e}" for e in out["errors"]]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_lib = next((p for p in (os.path.join(ROOT, "build-cuda", "libnopad.so"),
                                    os.path.join(ROOT, "build", "libnopad.so")) if os.path.exists(p)),
                       os.path.join(ROOT, "build", "libnopad.so"))
    ap.add_argument("--library", "--lib", default=default_lib, help="libnopad.so (default %(default)s)")
    ap.add_argument("--out", help="the JSON of every number (rewritten after each section)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor parallelism: the decode section on this many GPUs (nopad starts the "
                         "workers; the floor is one GPU's share of the bytes); the HF sections need 1")
    ap.add_argument("--dtypes", help="comma list (default fp16,bf16 on cuda, f32 on cpu)")
    ap.add_argument("--batches", help="decode batches (default 1,8,32,64,128,256; tiny: 1,8,32)")
    ap.add_argument("--contexts", help="decode contexts (default 512,2048; tiny: 64,256)")
    ap.add_argument("--steps", type=int, default=20, help="timed decode steps per point")
    ap.add_argument("--warmup", type=int, default=5, help="decode steps before the timed ones")
    ap.add_argument("--prefill", default=None, help="prefill points SEQSxLEN (default 1x2048,16x512; tiny: 1x256,4x64)")
    ap.add_argument("--prefill-reps", type=int, default=5)
    ap.add_argument("--prefill-warmup", type=int, default=2)
    ap.add_argument("--max-batch-tokens", type=int, default=8192)
    ap.add_argument("--sections", default="decode,prefill_hf,hf_decode,smollm2",
                    help="comma list of decode (nopad decode grid + prefill), prefill_hf, hf_decode, smollm2")
    ap.add_argument("--peer-batches", default="1,32")
    ap.add_argument("--peer-context", type=int, default=None, help="default 512 (tiny: 64)")
    ap.add_argument("--peer-timeout", type=float, default=300, help="seconds for the compiled HF peer at most")
    ap.add_argument("--smollm2", help="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--smollm2-tokens", type=int, default=128)
    ap.add_argument("--budget-s", type=float, default=480, help="the whole run's time budget")
    ap.add_argument("--folder", help="where the random checkpoint goes (default /tmp/nopad_dec_<shape>)")
    ap.add_argument("--hf-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_worker:
        return hf_decode_worker(json.loads(args.hf_worker))

    tiny = args.shape == "tiny"
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    args.dtypes = args.dtypes.split(",") if args.dtypes else (["fp16", "bf16"] if args.device == "cuda" else ["f32"])
    args.batches = ints(args.batches or ("1,8,32" if tiny else "1,8,32,64,128,256"))
    args.contexts = ints(args.contexts or ("64,256" if tiny else "512,2048"))
    args.prefill = [tuple(int(v) for v in p.split("x")) for p in
                    (args.prefill or ("1x256,4x64" if tiny else "1x2048,16x512")).split(",")]
    args.peer_batches = ints(args.peer_batches)
    args.peer_context = args.peer_context or (64 if tiny else 512)
    sections = set(args.sections.split(","))
    if args.tp > 1 and sections - {"decode"}:
        ap.error("--tp %d runs the decode section only (--sections decode)" % args.tp)
    shape = SHAPES[args.shape]
    folder = args.folder or f"/tmp/nopad_dec_{args.shape}"
    deadline = Deadline(args.budget_s)

    out = {"dtypes": args.dtypes, "decode": [], "prefill": [], "hf_decode": [], "smollm2": [], "errors": [],
           "sections_s": {}}

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as fh:
                json.dump(clean(out), fh, indent=1)

    def section(name, fn):
        t0 = time.time()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - print, record, go on
            msg = f"{name}: {type(e).__name__}: {e}"[:600]
            out["errors"].append(msg)
            print(f"# ERROR in {msg}", flush=True)
            traceback.print_exc()
        out["sections_s"][name] = round(time.time() - t0, 1)
        print(f"# section {name}: {time.time() - t0:.1f} s (t={deadline.elapsed():.0f} s)", flush=True)
        save()

    lib = load_lib(args.library)
    out["info"] = env_info(args, lib)
    out["info"]["args"] = {k: v for k, v in vars(args).items() if k != "hf_worker"}
    print(json.dumps(out["info"]), flush=True)

    def measure():
        out["bandwidth"] = copy_bandwidth(args.device)
        if args.device == "cuda":
            out["bandwidth"]["d2h_pageable_GBps"] = d2h_bandwidth()
            out["matmul_tflops"] = {d: matmul_tflops(d) for d in args.dtypes if d in ("fp16", "bf16")}
        print(f"# bandwidth {json.dumps(out['bandwidth'])}, GEMM {json.dumps(out.get('matmul_tflops'))}", flush=True)

    section("env", measure)
    bw = out.get("bandwidth") or {"read_plus_write_GBps": float("nan")}

    def model():
        out["checkpoint"] = make_checkpoint(shape, folder)
        out["checkpoint"].update(counts(shape))
        print(f"# checkpoint {json.dumps(out['checkpoint'])}", flush=True)

    section("checkpoint", model)

    # reserves: what the later sections need at least when a point of this one would start
    if "decode" in sections:
        for i, dtype in enumerate(args.dtypes):
            reserve = 150 if i == 0 else 120
            section(f"decode_{dtype}", lambda d=dtype, r=reserve: run_decode(args, lib, folder, shape, d, bw, out,
                                                                             deadline, r))
    if "prefill_hf" in sections:
        for dtype in args.dtypes:
            if deadline.left() < 100:
                out["errors"].append(f"prefill_hf {dtype}: skipped: time budget")
                continue
            section(f"prefill_hf_{dtype}", lambda d=dtype: run_hf_prefill(args, folder, shape, d, out["prefill"]))
    if "smollm2" in sections:
        def smol():
            path = find_smollm2(args.smollm2)
            targets = ([("cuda", "fp16")] if args.device == "cuda" else []) + [("cpu", "f32")]
            for dev, dt in targets:
                if not path:
                    out["smollm2"].append({"device": dev, "dtype": dt, "skipped": "no GGUF (--smollm2 PATH, "
                                           "$NOPAD_SMOLLM2_GGUF or ~/.cache/nopad)"})
                    continue
                # CUDA first, then the CPU with what is left of the section's share of the budget
                limit = min(40 if dev == "cuda" else 90, deadline.left() - (130 if "hf_decode" in sections else 5))
                if limit < 10:
                    out["smollm2"].append({"device": dev, "dtype": dt, "skipped": "time budget"})
                    continue
                try:
                    r = run_smollm2(args, lib, path, dev, dt, args.smollm2_tokens, 3 if dev == "cuda" else 2, limit)
                    r["gguf"] = path
                    out["smollm2"].append(r)
                    print(f"# SmolLM2 {dev} {dt}: ttft {r['ttft_ms']:.1f} ms, {r['decode_tokens_per_s']:.0f} tok/s "
                          f"after the first; {r['text']!r}", flush=True)
                except Exception as e:  # noqa: BLE001
                    out["smollm2"].append({"device": dev, "dtype": dt, "error": f"{type(e).__name__}: {e}"[:400]})
                    print(f"# SmolLM2 {dev} {dt}: error: {e}", flush=True)
        section("smollm2", smol)
    if "hf_decode" in sections:
        def peer():
            if args.device == "cuda":
                import torch
                torch.cuda.empty_cache()
            logdir = os.path.dirname(os.path.abspath(args.out)) if args.out else tempfile.gettempdir()
            for mode, cap in (("eager", 90), ("compile", args.peer_timeout)):
                limit = min(cap, deadline.left() - 5)
                if limit < 30:
                    out["hf_decode"] += [{"mode": mode, "batch": B, "context": args.peer_context,
                                          "skipped": "time budget"} for B in args.peer_batches]
                    continue
                rows, secs = run_hf_decode(args, folder, mode, limit, logdir)
                out["hf_decode"] += rows
                out["sections_s"][f"hf_decode_{mode}"] = round(secs, 1)
                for r in rows:
                    print(f"# HF decode {mode} {r['batch']} x {r['context']}: "
                          f"{f(r.get('ms')) + ' ms/token' if 'ms' in r else 'skipped: ' + str(r.get('skipped'))}",
                          flush=True)
        section("hf_decode", peer)

    out["total_s"] = round(deadline.elapsed(), 1)
    save()
    print(tables(out))
    # a section that failed or a nopad point that failed is a failed run (skips are not)
    failed = len(out["errors"]) + sum("error" in r for r in out["decode"] + out["prefill"] + out["smollm2"])
    print(f"\ntotal {out['total_s']} s" + (f"; JSON: {args.out}" if args.out else "")
          + (f"; {failed} failure(s)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
