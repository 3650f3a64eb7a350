#!/usr/bin/env python3
"""Issue 25's benchmark: the DeBERTa-v3-base encoder forward, nopad against Hugging Face, with
BERT-base at the same points for scale.

What is measured: token ids in -> last hidden states out (embeddings, every layer), fp16 on one
GPU, at 16 x 512 and 128 x 512 (every sequence 512 real tokens, so no padding anywhere) and at
128 x U[128, 512] (random lengths from a fixed seed: nopad runs the packed stream, the peers pad
to the longest with an attention mask). Models: random weights (seeded; fp32 on disk, each
engine converts at load) written once as Hugging Face folders into a temporary directory:
  deberta  DebertaV2Model, DeBERTa-v3-base's shape: 12 layers, hidden 768, 12 heads, FFN 3072,
           vocab 128100, relative attention with position_buckets 256 over
           max_relative_positions -1 (= 512), pos_att_type [p2c, c2p], share_att_key,
           norm_rel_ebd layer_norm, no absolute positions;
  bert     BertModel, BERT-base's shape (12 layers, 768, 12 x 64, FFN 3072, vocab 30522).
Engines, per model:
  nopad          libnopad.so through ctypes: device token ids in, nopad_encode on its own stream;
                 also as a CUDA-graph replay of that forward ("nopad graph");
  hf             HF transformers fp16, attn_implementation "sdpa" where transformers supports
                 it for the family, else "eager" (detected; the JSON says which);
  hf_compile     the same model under torch.compile (default mode, static shapes: each point
                 gets its own compilation, whose first-call time is reported, not timed).
Timing (docs/design.md, "Measuring speed"): warm-up (>= 5 forwards), then the median of >= 20 timed runs,
each N back-to-back forwards between two CUDA events (N so that a run takes >= ~2 ms). Every
engine reads the same lengths and ids from one file. Each (model, engine) runs in a child
process with a time limit, so an OOM, a CUDA fault, a compile failure or a timeout is recorded
for that point and the run goes on; the JSON is rewritten after every child, so a cut run keeps
what it measured. The summary's speedup_vs_best_peer is the best peer's ms over nopad's (the
faster of plain and graph), i.e. nopad's tokens/s over the best peer's; issue 25's target is
>= 2 for DeBERTa. Also recorded: nopad's error against the HF (non-compiled) output on the same
tokens (row-relative, first <= 4096 tokens), GPU memory, the fp16 GEMM rate of the same run (an
8192^3 torch matmul) and each point's ideal time (useful FLOPs / that rate).

    python3 bench/deberta_bench.py --library build-cuda/libnopad.so --out deberta.json
        [--budget-s 570] [--models deberta,bert] [--engines nopad,hf,hf_compile]
        [--points 16x512,128x512,128xU128-512]
    # logic check on a CPU (fp32, perf_counter timing, a small model):
    python3 bench/deberta_bench.py --library build/libnopad.so --device cpu --tiny --out /tmp/d.json

The whole default run is meant to fit one 10-minute device call (scripts/gpu_decoder.sh's
`deberta` step): DeBERTa's engines run first (nopad, hf, hf_compile), then BERT's, each child
capped by JOB_CAP_S and all by --budget-s; points past a cap are recorded as skipped.
"""
import argparse
import ctypes
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEED = 20261126

# Per (model, engine) child: the most seconds it may take (the whole run's budget caps it too).
JOB_CAP_S = {"nopad": 120, "hf": 120, "hf_compile": 270}


# ---------------------------------------------------------------------------------------------
# nopad through ctypes (include/nopad.h)



# the C API's structs, as the Python package declares them (one definition to keep in step with nopad.h)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from nopad._native import Batch, EncodeParams, ModelParams  # noqa: E402


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.nopad_last_error.restype = ctypes.c_char_p
    lib.nopad_model_default_params.restype = ModelParams
    lib.nopad_model_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ModelParams), ctypes.POINTER(ctypes.c_void_p)]
    lib.nopad_model_free.argtypes = [ctypes.c_void_p]
    lib.nopad_model_context.restype = ctypes.c_void_p
    lib.nopad_model_context.argtypes = [ctypes.c_void_p]
    lib.nopad_encode.argtypes = [ctypes.c_void_p, ctypes.POINTER(Batch), ctypes.POINTER(EncodeParams),
                                 ctypes.c_void_p, ctypes.c_void_p]
    return lib


def check(lib, status, what):
    if status != 0:
        raise RuntimeError(f"nopad {what}: status {status}: {lib.nopad_last_error().decode(errors='replace')}")


# ---------------------------------------------------------------------------------------------
# models, points, FLOPs

def model_configs(args):
    """The two shapes as transformers config kwargs (the tiny one only checks the logic)."""
    if args.tiny:
        common = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)
        deb_vocab, bert_vocab = 1000, 1000
    else:
        common = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        deb_vocab, bert_vocab = 128100, 30522
    if args.layers:
        common["num_hidden_layers"] = args.layers
    deberta = dict(common, vocab_size=deb_vocab, hidden_act="gelu", max_position_embeddings=512,
                   relative_attention=True, position_buckets=256, max_relative_positions=-1,
                   pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
                   position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7, pad_token_id=0,
                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    bert = dict(common, vocab_size=bert_vocab, max_position_embeddings=512,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return {"deberta": deberta, "bert": bert}


def build_models(args, folder):
    """Random seeded checkpoints, fp32 safetensors, one folder per model."""
    import torch
    from transformers import BertConfig, BertModel, DebertaV2Config, DebertaV2Model
    cfgs = model_configs(args)
    out = {}
    for name in args.models:
        torch.manual_seed(SEED + (1 if name == "bert" else 0))
        if name == "deberta":
            model = DebertaV2Model(DebertaV2Config(**cfgs[name]))
        else:
            model = BertModel(BertConfig(**cfgs[name]), add_pooling_layer=False)
        with torch.no_grad():  # HF initialises biases and LayerNorms to 0 / 1: make them random too
            for p in model.parameters():
                if p.dim() == 1:
                    p.add_(0.02 * torch.randn_like(p))
        path = os.path.join(folder, name)
        model.eval().save_pretrained(path, safe_serialization=True)
        with open(os.path.join(path, "config.json")) as fh:
            saved = json.load(fh)
        out[name] = {"folder": path, "params": sum(p.numel() for p in model.parameters()),
                     "hidden": saved["hidden_size"], "layers": saved["num_hidden_layers"],
                     "config": {k: saved.get(k) for k in cfgs[name]}}
        del model
    return out


def parse_points(text):
    """'16x512' (every sequence 512 tokens) or '128xU128-512' (lengths uniform in [128, 512])."""
    pts = []
    for item in text.split(","):
        b, _, m = item.strip().partition("x")
        if m.upper().startswith("U"):
            lo, _, hi = m[1:].partition("-")
            pts.append({"name": item.strip(), "batch": int(b), "min": int(lo), "max": int(hi)})
        else:
            pts.append({"name": item.strip(), "batch": int(b), "min": int(m), "max": int(m)})
    return pts


def make_point_data(points, vocab, path):
    """Lengths and ids of every point, from one seed, in one file every engine reads."""
    import torch
    gen = torch.Generator().manual_seed(SEED)
    data = []
    for p in points:
        lens = torch.randint(p["min"], p["max"] + 1, (p["batch"],), generator=gen, dtype=torch.int32)
        ids = torch.randint(100, vocab, (int(lens.sum()),), generator=gen, dtype=torch.int32)
        data.append({"lens": lens, "ids": ids})
        p["tokens"] = int(lens.sum())
        p["max_seqlen"] = int(lens.max())
        p["sum_len_sq"] = int((lens.long() ** 2).sum())
    torch.save(data, path)


def useful_flops(model, m, p):
    """FLOPs of the unpadded work: GEMMs 24·T·H² per layer, attention 4·H·ΣL², and for DeBERTa
    the two relative projections (q·pos_keyᵀ, k·pos_queryᵀ) over the table rows each sequence
    reaches, 4·H·Σ L·min(2L-1, 2k), k = 256 buckets."""
    H, L, T = m["hidden"], m["layers"], p["tokens"]
    f = 24 * T * H * H + 4 * H * p["sum_len_sq"]
    if model == "deberta":
        lens = range(p["min"], p["max"] + 1)  # the mean over U[min, max] stands in for the draw
        mean_rel = statistics.mean(l * min(2 * l - 1, 2 * 256) for l in lens)
        f += 4 * H * p["batch"] * mean_rel
    return L * f


# ---------------------------------------------------------------------------------------------
# timing

def make_timer(device, warmup, runs):
    import torch

    def time_cuda(fn, stream=None):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(stream)
        fn()
        e.record(stream)
        e.synchronize()
        iters = max(1, min(50, math.ceil(2.0 / max(s.elapsed_time(e), 1e-3))))
        times = []
        for _ in range(runs):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(stream)
            for _ in range(iters):
                fn()
            e.record(stream)
            e.synchronize()
            times.append(s.elapsed_time(e) / iters)
        return statistics.median(times), iters

    def time_cpu(fn, stream=None):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), 1

    return time_cuda if device == "cuda" else time_cpu


# ---------------------------------------------------------------------------------------------
# the child: one (model, engine) over some points, one JSON line per event

def emit(fh, rec):
    fh.write(json.dumps(rec) + "\n")
    fh.flush()


def row_sample(x, n):
    return x[:n].float().cpu()


def worker(job):
    import torch
    torch.manual_seed(SEED)
    data = torch.load(job["points_file"])
    cuda = job["device"] == "cuda"
    dev = "cuda" if cuda else "cpu"
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[job["dtype"]] if cuda else torch.float32
    timer = make_timer(job["device"], job["warmup"], job["runs"])
    H = job["hidden"]
    out = open(job["results"], "a")
    engine = job["engine"]
    if not cuda:
        torch.set_num_threads(job["threads"])

    if engine == "nopad":
        lib = load_lib(job["library"])
        params = lib.nopad_model_default_params()
        params.device, params.dtype = (1, {"fp16": 1, "bf16": 2}[job["dtype"]]) if cuda else (0, 0)
        params.n_threads = job["threads"]
        params.max_batch_tokens = max(int(data[i]["lens"].sum()) for i in job["points"])
        stream = None
        if cuda:
            stream = torch.cuda.Stream()
            params.cuda_stream = stream.cuda_stream
            torch.cuda.synchronize()
            free0 = torch.cuda.mem_get_info()[0]
        handle = ctypes.c_void_p()
        t0 = time.time()
        check(lib, lib.nopad_model_load(job["folder"].encode(), ctypes.byref(params), ctypes.byref(handle)), "load")
        rec = {"event": "loaded", "load_s": time.time() - t0}
        if cuda:
            torch.cuda.synchronize()
            rec["load_bytes"] = free0 - torch.cuda.mem_get_info()[0]
        emit(out, rec)
        context = lib.nopad_model_context(handle)
        enc = EncodeParams(0, 0, 0)
    else:
        from transformers import BertModel, DebertaV2Model
        impl, impl_note = job["attn"], None
        if job["model"] == "bert":
            cls, kw = BertModel, {"dtype": dtype, "add_pooling_layer": False}
        else:
            cls, kw = DebertaV2Model, {"dtype": dtype}
        if impl == "auto":
            try:
                model = cls.from_pretrained(job["folder"], attn_implementation="sdpa", **kw)
                impl = "sdpa"
            except Exception as e:  # noqa: BLE001 - transformers refuses sdpa for the family
                impl, impl_note = "eager", f"sdpa refused: {str(e).splitlines()[0][:200]}"
                model = cls.from_pretrained(job["folder"], attn_implementation="eager", **kw)
        else:
            model = cls.from_pretrained(job["folder"], attn_implementation=impl, **kw)
        model = model.to(dev).eval()
        got = getattr(model.config, "_attn_implementation", impl)
        emit(out, {"event": "loaded", "attn_implementation": got, "attn_note": impl_note})
        if engine == "hf_compile":
            import torch._dynamo as dynamo
            dynamo.config.automatic_dynamic_shapes = False  # one static compilation per point
            for knob in ("cache_size_limit", "recompile_limit"):
                if hasattr(dynamo.config, knob):
                    setattr(dynamo.config, knob, 64)
            fwd_model = torch.compile(model)
        else:
            fwd_model = model

    for i in job["points"]:
        emit(out, {"event": "start", "point": i})
        lens, ids = data[i]["lens"], data[i]["ids"]
        B, T, maxlen = len(lens), int(lens.sum()), int(lens.max())
        cu = torch.zeros(B + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(lens, 0)
        rec = {"event": "done", "point": i}
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        if engine == "nopad":
            if cuda:
                d_ids, d_cu = ids.to(dev), cu.to(dev)
                hidden = torch.empty(T, H, device=dev, dtype=dtype)
                torch.cuda.synchronize()  # the copies ran on torch's stream, nopad reads on its own
                batch = Batch(layout=0, on_device=1, n_seqs=B, tokens=d_ids.data_ptr(), cu_seqlens=d_cu.data_ptr(),
                              n_tokens=T, max_seqlen=maxlen)
            else:
                d_ids, d_cu = ids.contiguous(), cu.contiguous()
                hidden = torch.empty(T, H, dtype=torch.float32)
                batch = Batch(layout=0, on_device=0, n_seqs=B, tokens=d_ids.data_ptr(), cu_seqlens=d_cu.data_ptr(),
                              n_tokens=T, max_seqlen=maxlen)

            def fwd():
                check(lib, lib.nopad_encode(context, ctypes.byref(batch), ctypes.byref(enc), hidden.data_ptr(), None),
                      "encode")

            if cuda:
                torch.cuda.set_stream(stream)
                free0 = torch.cuda.mem_get_info()[0]
            t0 = time.time()
            fwd()
            if cuda:
                torch.cuda.synchronize()
                rec["first_forward_extra_bytes"] = free0 - torch.cuda.mem_get_info()[0]
            rec["first_call_s"] = time.time() - t0
            rec["finite"] = bool(torch.isfinite(hidden).all())
            torch.save(row_sample(hidden, job["err_tokens"]), job["sample"].format(point=i))
            rec["ms"], rec["iters"] = timer(fwd, stream)
            if cuda:
                graph = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(graph, stream=stream):
                        fwd()
                    rec["graph_ms"], _ = timer(graph.replay, stream)
                except Exception as e:  # noqa: BLE001 - recorded, the plain timing stands
                    rec["graph_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    # a failed capture can leave the stream unusable: the next point gets a fresh
                    # process rather than an error that is not its own
                    rec["tokens_per_s"] = T / (rec["ms"] / 1e3)
                    emit(out, rec)
                    emit(out, {"event": "restart"})
                    out.close()
                    os._exit(0)
                del graph
                torch.cuda.set_stream(torch.cuda.default_stream())
                torch.cuda.synchronize()
            del hidden
        else:
            padded = torch.zeros(B, maxlen, dtype=torch.long)
            mask = torch.zeros(B, maxlen, dtype=torch.long)
            for b in range(B):
                padded[b, :lens[b]] = ids[cu[b]:cu[b + 1]].long()
                mask[b, :lens[b]] = 1
            padded, mask = padded.to(dev), mask.to(dev)
            with torch.inference_mode():
                fwd = lambda: fwd_model(input_ids=padded, attention_mask=mask)  # noqa: E731
                t0 = time.time()
                res = fwd().last_hidden_state
                if cuda:
                    torch.cuda.synchronize()
                rec["first_call_s"] = time.time() - t0  # hf_compile: the compilation of this shape
                if engine == "hf":
                    packed = torch.cat([res[b, :lens[b]] for b in range(B)])
                    torch.save(row_sample(packed, job["err_tokens"]), job["sample"].format(point=i))
                    del packed
                del res
                rec["ms"], rec["iters"] = timer(fwd)
            if cuda:
                rec["peak_alloc_bytes"] = torch.cuda.max_memory_allocated()
            del padded, mask
        rec["tokens_per_s"] = T / (min(x for x in (rec["ms"], rec.get("graph_ms")) if x) / 1e3)
        emit(out, rec)
        if cuda:
            torch.cuda.empty_cache()
    if engine == "nopad":
        lib.nopad_model_free(handle)
    out.close()
    return 0


# ---------------------------------------------------------------------------------------------
# the parent: environment, checkpoints, children, JSON and table

def environment(args):
    import torch
    import transformers
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()) + " UTC", "device": args.device,
            "dtype": args.dtype if args.device == "cuda" else "fp32", "torch": torch.__version__,
            "transformers": transformers.__version__, "python": sys.version.split()[0], "seed": SEED}
    # the build measured: the id the library was built with (the tree's git log may have moved on)
    try:
        lib = ctypes.CDLL(os.path.abspath(args.library))
        lib.nopad_build_id.restype = ctypes.c_char_p
        info["nopad_build"] = lib.nopad_build_id().decode()
    except Exception as e:  # noqa: BLE001
        info["nopad_build"] = "? (%s)" % e
    if args.device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sms=p.multi_processor_count, gpu_memory_bytes=p.total_memory,
                    cuda_torch=torch.version.cuda)
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:  # noqa: BLE001
            pass
        dt = torch.float16 if args.dtype == "fp16" else torch.bfloat16
        a = torch.randn(8192, 8192, device="cuda", dtype=dt)
        b = torch.randn(8192, 8192, device="cuda", dtype=dt)
        ms, _ = make_timer("cuda", 5, 20)(lambda: a @ b)
        info["matmul_tflops"] = 2 * 8192 ** 3 / ms / 1e9
        del a, b
        torch.cuda.empty_cache()
    else:
        info["cpu_threads"] = args.threads
    return info


def run_job(args, job, deadline, log):
    """Runs one (model, engine) in children until its points are done, failed or out of time.
    Returns {point: record} and the job's notes (load, attention implementation, errors)."""
    results, notes = {}, {}
    todo = list(job["points"])
    job_end = min(deadline, time.time() + JOB_CAP_S[job["engine"]])
    while todo:
        left = job_end - time.time()
        if left < 5:
            for i in todo:
                results[i] = {"error": "skipped: out of time (the job's or the run's budget)"}
            break
        sub = dict(job, points=todo)
        with open(job["job_file"], "w") as fh:
            json.dump(sub, fh)
        open(job["results"], "w").close()
        t0 = time.time()
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", job["job_file"]],
                                  capture_output=True, text=True, timeout=left)
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)
            timed_out = False
        except subprocess.TimeoutExpired as e:
            rc, timed_out = None, True
            tail = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")) + \
                   ((e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""))
        log.write(f"==== {job['model']} {job['engine']} points {todo} rc {rc} "
                  f"{'timeout ' if timed_out else ''}{time.time() - t0:.1f} s\n{tail}\n")
        log.flush()
        started, done_now = None, 0
        with open(job["results"]) as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                ev = rec.pop("event")
                if ev == "loaded":
                    notes.update(rec)
                elif ev == "start":
                    started = rec["point"]
                elif ev == "done":
                    results[rec.pop("point")] = rec
                    started, done_now = None, done_now + 1
        todo = [i for i in todo if i not in results]
        if not todo:
            break
        lines = [l.strip() for l in tail.splitlines() if l.strip()]
        if timed_out:
            msg = f"timeout after {time.time() - t0:.0f} s"
        else:  # a Python exception: its last line; else (a signal, a C abort) the output's end
            last = lines[-1:] if any(l.startswith("Traceback") for l in lines) else lines[-3:]
            msg = f"exit {rc}" + (f": {' | '.join(last)[-600:]}" if last else "")
        if started is None:
            if done_now and not timed_out:  # the child asked for a fresh process
                continue
            for i in todo:  # loading failed (or time ran out between points): nothing else will run
                results[i] = {"error": f"{'not started' if done_now else 'load/setup failed'}: {msg}"}
            break
        results[started] = {"error": msg}
        todo = [i for i in todo if i != started]
        if timed_out:
            for i in todo:
                results[i] = {"error": "skipped: an earlier point of this engine ran out of time"}
            break
        # a crash (CUDA fault, OOM, Python error): a fresh process for the points left
    return results, notes


def summarise(report):
    import torch
    rows = []
    for model in report["models"]:
        for i, p in enumerate(report["points"]):
            eng = report["results"].get(model, {})
            row = {"model": model, "point": p["name"], "batch": p["batch"], "tokens": p["tokens"]}
            nop = eng.get("nopad", {}).get(str(i), {})
            row["nopad_ms"], row["nopad_graph_ms"] = nop.get("ms"), nop.get("graph_ms")
            if nop.get("error"):
                row["nopad_error"] = nop["error"]
            timed = [x for x in (row["nopad_ms"], row["nopad_graph_ms"]) if x]
            best_nopad = min(timed) if timed else None
            peers = {e: eng.get(e, {}).get(str(i), {}).get("ms") for e in ("hf", "hf_compile")}
            for e, v in peers.items():
                row[f"{e}_ms"] = v
            valid = {e: v for e, v in peers.items() if v}
            if valid:
                row["best_peer"] = min(valid, key=valid.get)
                row["best_peer_ms"] = valid[row["best_peer"]]
            row["hf_attn_implementation"] = report["notes"].get(model, {}).get("hf", {}).get("attn_implementation")
            if best_nopad:
                row["nopad_tokens_per_s"] = p["tokens"] / best_nopad * 1e3
            if valid:
                row["best_peer_tokens_per_s"] = p["tokens"] / row["best_peer_ms"] * 1e3
            if best_nopad and valid:
                row["speedup_vs_best_peer"] = row["best_peer_ms"] / best_nopad
            ideal = report["points"][i].get(f"ideal_ms_{model}")
            if ideal and best_nopad:
                row["nopad_x_ideal"] = best_nopad / ideal
            a, b = report["samples"].format(model=model, engine="nopad", point=i), \
                report["samples"].format(model=model, engine="hf", point=i)
            if os.path.exists(a) and os.path.exists(b):
                x, y = torch.load(a), torch.load(b)
                n = min(len(x), len(y))
                x, y = x[:n], y[:n]
                row["nopad_err_vs_hf"] = float(((x - y).norm(dim=1) / y.norm(dim=1).clamp_min(1e-30)).max())
            rows.append(row)
    report["summary"] = rows


def print_table(report, out=sys.stdout):
    info = report["env"]
    f = lambda v, d=2: "–" if v is None else f"{v:.{d}f}"  # noqa: E731
    head = (f"{info.get('gpu', 'CPU')}, torch {info['torch']}, transformers {info['transformers']}, "
            f"CUDA {info.get('cuda_torch', '-')}, driver {info.get('driver', '-')}, {info['dtype']}")
    if "matmul_tflops" in info:
        head += f", matmul {info['matmul_tflops']:.0f} TFLOP/s"
    print("\n" + head + "; ms per forward (median)", file=out)
    for m in report["models"]:
        attn = report["notes"].get(m, {}).get("hf", {}).get("attn_implementation")
        print(f"  {m}: HF attn_implementation {attn}", file=out)
    print("| model | point | tokens | nopad | nopad graph | HF | HF compile | best peer | speedup vs best peer | "
          "nopad tok/s | x ideal | err vs HF |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", file=out)
    for r in report["summary"]:
        best = min([x for x in (r["nopad_ms"], r["nopad_graph_ms"]) if x] or [0])
        sp = r.get("speedup_vs_best_peer")
        print(f"| {r['model']} | {r['point']} | {r['tokens']} | {f(r['nopad_ms'], 3)} | {f(r['nopad_graph_ms'], 3)} | "
              f"{f(r['hf_ms'], 3)} | {f(r['hf_compile_ms'], 3)} | {r.get('best_peer', '–')} | "
              f"{'–' if sp is None else f'{sp:.2f}x'} | {f(r['tokens'] / best * 1e3 if best else None, 0)} | "
              f"{f(r.get('nopad_x_ideal'), 2)} | "
              f"{'–' if r.get('nopad_err_vs_hf') is None else format(r['nopad_err_vs_hf'], '.1e')} |", file=out)
    for m, engs in report["results"].items():
        for e, pts in engs.items():
            for i, rec in pts.items():
                if rec.get("error") or rec.get("graph_error") or rec.get("finite") is False:
                    what = rec.get("error") or rec.get("graph_error") or "non-finite output"
                    print(f"  {m} {e} {report['points'][int(i)]['name']}: {what}", file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--library", help="libnopad.so")
    ap.add_argument("--out", default=None, help="the JSON (rewritten after every child); the children's "
                    "output goes to OUT.children.log")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"], help="CUDA compute dtype (CPU: fp32)")
    ap.add_argument("--models", default="deberta,bert")
    ap.add_argument("--engines", default="nopad,hf,hf_compile")
    ap.add_argument("--points", default=None, help="default 16x512,128x512,128xU128-512 (--tiny: 2x64,4x64,4xU16-64)")
    ap.add_argument("--tiny", action="store_true", help="hidden 128, 2 layers, vocab 1000: a logic check")
    ap.add_argument("--layers", type=int, default=0, help="override the layer count")
    ap.add_argument("--budget-s", type=float, default=570, help="the whole run, checkpoints and compiles included")
    ap.add_argument("--warmup", type=int, default=None, help="default 5 (CPU 1)")
    ap.add_argument("--runs", type=int, default=None, help="timed runs, default 20 (CPU 3)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (--device cpu)")
    ap.add_argument("--keep", default=None, help="keep the checkpoints, samples and logs in this folder")
    args = ap.parse_args()
    if args.worker:
        with open(args.worker) as fh:
            return worker(json.load(fh))
    if not args.library:
        ap.error("--library is required")
    t_start = time.time()
    deadline = t_start + args.budget_s
    args.models = [m for m in args.models.split(",") if m]
    engines = [e for e in args.engines.split(",") if e]
    for e in engines:
        if e not in JOB_CAP_S:
            ap.error(f"unknown engine {e}")
    cpu = args.device == "cpu"
    warmup = args.warmup if args.warmup is not None else (1 if cpu else 5)
    runs = args.runs if args.runs is not None else (3 if cpu else 20)
    points = parse_points(args.points or ("2x64,4x64,4xU16-64" if args.tiny else "16x512,128x512,128xU128-512"))

    work = args.keep or tempfile.mkdtemp(prefix="nopad_deberta_bench_")
    os.makedirs(work, exist_ok=True)
    report = {"env": environment(args), "models": args.models, "engines": engines, "points": points,
              "timing": {"warmup": warmup, "runs": runs}, "results": {}, "notes": {}, "summary": [],
              "samples": os.path.join(work, "sample_{model}_{engine}_{point}.pt")}
    print(json.dumps(report["env"]), flush=True)

    def save():
        summarise(report)
        if args.out:
            d = {k: v for k, v in report.items() if k != "samples"}
            d["elapsed_s"] = time.time() - t_start
            with open(args.out, "w") as fh:
                json.dump(d, fh, indent=1)

    log = open(args.out + ".children.log" if args.out else os.path.join(work, "children.log"), "w")
    try:
        t0 = time.time()
        models = build_models(args, work)
        report["checkpoints_s"] = time.time() - t0
        report["model_info"] = models
        vocab = min(model_configs(args)[m]["vocab_size"] for m in args.models)
        make_point_data(points, vocab, os.path.join(work, "points.pt"))
        for m in args.models:
            for p in points:
                if "matmul_tflops" in report["env"]:
                    p[f"ideal_ms_{m}"] = useful_flops(m, models[m], p) / (report["env"]["matmul_tflops"] * 1e9)
        print(f"checkpoints and points in {time.time() - t0:.1f} s: {work}", flush=True)
        save()
        # The comparison first (DeBERTa: nopad, HF, HF compiled), BERT for scale after.
        for m in args.models:
            report["results"][m], report["notes"][m] = {}, {}
            for e in engines:
                job = {"model": m, "engine": e, "folder": models[m]["folder"], "hidden": models[m]["hidden"],
                       "library": os.path.abspath(args.library), "device": args.device, "dtype": args.dtype,
                       "threads": args.threads, "warmup": warmup, "runs": runs, "attn": "auto",
                       "points": list(range(len(points))), "points_file": os.path.join(work, "points.pt"),
                       "err_tokens": 4096, "job_file": os.path.join(work, f"job_{m}_{e}.json"),
                       "results": os.path.join(work, f"results_{m}_{e}.jsonl"),
                       "sample": report["samples"].format(model=m, engine=e, point="{point}")}
                t0 = time.time()
                res, notes = run_job(args, job, deadline, log)
                notes["job_s"] = time.time() - t0
                report["results"][m][e] = {str(k): v for k, v in sorted(res.items())}
                report["notes"][m][e] = notes
                for k, v in sorted(res.items()):
                    show = {kk: (round(vv, 4) if isinstance(vv, float) else vv) for kk, vv in v.items()}
                    print(f"{m} {e} {points[k]['name']}: {json.dumps(show)}", flush=True)
                print(f"{m} {e}: {notes}", flush=True)
                save()
    finally:
        log.close()
        save()
        print_table(report)
        print(f"elapsed {time.time() - t_start:.0f} s", flush=True)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
