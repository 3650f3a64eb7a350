#!/usr/bin/env python3
"""The Hugging Face peers of issue 22's throughput workloads (1: LLaMA-1B shape, 4: SmolLM2-135M
shape), each in a child process with a time limit, on the same prompts and output lengths as
nopad (a workload JSON written by bench/engine_bench.py). The same random checkpoint folder, fp16
on CUDA (f32 on the CPU), sdpa attention, greedy, EOS ignored.

Peers (--peers, comma list):
  static_eager    static batching: all prompts left-padded into one batch, `generate` with
                  min_new_tokens = max_new_tokens = the longest requested output (every row runs
                  that long; useful tokens = each request's own requested count), DynamicCache,
                  eager. Warm-up: the same batch with 4 new tokens.
  static_compile  the same with cache_implementation="static" (generate compiles the decode
                  forward itself: transformers' auto-compile, on CUDA). Warm-up: one identical full
                  run (the compilation; its wall time is kept as first_run_s), then the timed runs.
  generate_batch  HF continuous batching, `model.generate_batch(inputs=..., generation_config=...)`
                  with max_new_tokens = the longest requested output for every request (its one
                  setting; useful tokens as above), eos_token_id -1, record_timestamps for TTFT.
                  Warm-up: one small generate_batch call; the timed call includes the manager's own
                  set-up and CUDA-graph warm-up, as a user calling it pays (its span from the first
                  request's admission to the last end is kept too, as gen_span_s).
  cb_manager      HF continuous batching with each request's own max_new_tokens: the manager of
                  `init_continuous_batching` (warmed up and started before the clock), every request
                  added with `add_request(ids, max_new_tokens=o_i, eos_token_id=-1)` at t0, results
                  read until all ended.

A peer that errs records its error; one past its limit stops itself at the next step where it can
(static: a stopping criterion; cb_manager: the result loop) and reports what it finished, marked
partial; a child past limit + 30 s is killed and reported as a timeout. TTFT: the first token of a
static batch comes for all rows at once after the batch's prefill (p50 = p99); for the continuous
peers from the per-token timestamps.

    python3 bench/engine_peers.py --worker SPEC.json      # one peer (engine_bench.py starts these)
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = ("static_eager", "static_compile", "generate_batch", "cb_manager")


def _torch_dtype(name):
    import torch
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[name]


def _load(spec):
    import torch
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    m = LlamaForCausalLM.from_pretrained(spec["folder"], dtype=_torch_dtype(spec["dtype"]), attn_implementation="sdpa")
    return m.to(spec["device"]).eval()


def _emit(spec, rec):
    rec = dict(rec, peer=spec["peer"], t=round(time.time() - spec["_t_start"], 2))
    with open(spec["out"], "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    print(json.dumps(rec), flush=True)


def _static(spec, model, prompts, outs, deadline):
    import torch
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
    dev = spec["device"]
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    n, P, M = len(prompts), max(map(len, prompts)), max(outs)
    ids = torch.zeros((n, P), dtype=torch.long)
    mask = torch.zeros((n, P), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding
        ids[i, P - len(p):] = torch.tensor(p)
        mask[i, P - len(p):] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    compiled = spec["peer"] == "static_compile"

    class Clock(StoppingCriteria):
        """Called once per generated token: stamps the first (after a sync) and stops past the
        deadline."""

        def __init__(self):
            self.first, self.steps, self.cut = None, 0, False

        def __call__(self, input_ids, scores, **kw):
            if self.first is None:
                sync()
                self.first = time.perf_counter()
            self.steps += 1
            stop = time.perf_counter() > deadline
            self.cut |= stop
            return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    def config(new):
        gc = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                              eos_token_id=model.config.eos_token_id)
        if compiled:
            gc.cache_implementation = "static"
            if dev != "cuda":  # transformers compiles on its own only on CUDA-like devices
                from transformers import CompileConfig
                gc.compile_config = CompileConfig()
                gc.compile_config._compile_all_devices = True
        return gc

    def run(new):
        clock = Clock()
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config(new),
                                 stopping_criteria=StoppingCriteriaList([clock]))
        sync()
        wall = time.perf_counter() - t0
        made = int(out.shape[1] - P)
        want = sum(min(o, new) for o in outs)
        useful = sum(min(o, made) for o in outs)
        return {"wall_s": wall, "new_tokens_per_row": made, "useful_tokens": useful, "requested_tokens": want,
                "generated_tokens": n * made, "tokens_per_s": useful / wall,
                "ttft_s": (clock.first - t0) if clock.first else None, "partial": made < new or clock.cut}

    if compiled:
        first = run(M)  # the compilation happens here
        _emit(spec, {"kind": "warmup", **first})
        if first["partial"]:
            return [dict(first, note="only the first (compiling) run fit the time limit")]
    else:
        _emit(spec, {"kind": "warmup", **run(4)})
    runs = []
    for r in range(spec["reps"]):
        if runs and time.perf_counter() + 1.2 * runs[-1]["wall_s"] > deadline:
            break
        res = run(M)
        _emit(spec, {"kind": "run", "rep": r, **res})
        runs.append(res)
        if res["partial"]:
            break
    return runs


def _gen_config(model, max_new):
    from transformers import GenerationConfig
    return GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=-1, pad_token_id=0)


def _cb_output_times(res, t0):
    """(ttft_s, end_s) of one GenerationOutput from t0 (perf_counter), from its timestamps."""
    ts = getattr(res, "timestamps", None) or []
    life = getattr(res, "lifespan", None) or (-1, -1)
    ttft = ts[0] - t0 if ts else None
    end = life[1] - t0 if life and life[1] and life[1] > 0 else (ts[-1] - t0 if ts else None)
    return ttft, end


def _generate_batch(spec, model, prompts, outs, deadline):
    import inspect
    import torch
    sync = torch.cuda.synchronize if spec["device"] == "cuda" else (lambda: None)
    M = max(outs)
    sig = inspect.signature(model.generate_batch).parameters
    extra = {k: v for k, v in (("record_timestamps", True), ("progress_bar", False)) if k in sig}
    # Not under torch.inference_mode(): generate_batch runs under its own no_grad, and its warm-up
    # creates the batch processor's static tensors in this thread; made under inference_mode they are
    # inference tensors, which its generation thread (inference_mode is thread-local: outside it there)
    # then zeroes in place -> "Inplace update to inference tensor outside InferenceMode" (transformers
    # 5.17), and every request fails with no token.
    t0 = time.perf_counter()
    warm = model.generate_batch(inputs=[p[:16] for p in prompts[:4]], generation_config=_gen_config(model, 8),
                                **extra)
    warm_errors = [g.error for g in warm.values() if getattr(g, "error", None)]
    _emit(spec, {"kind": "warmup", "wall_s": time.perf_counter() - t0, "results": len(warm),
                 "errors": warm_errors[:3]})
    runs = []
    for r in range(spec["reps"]):
        if runs and time.perf_counter() + 1.2 * runs[-1]["wall_s"] > deadline:
            break
        sync()
        t0 = time.perf_counter()
        res = model.generate_batch(inputs=prompts, generation_config=_gen_config(model, M), **extra)
        sync()
        wall = time.perf_counter() - t0
        got = list(res.values())
        lens = [len(g.generated_tokens) for g in got]
        errors = [g.error for g in got if getattr(g, "error", None)]
        useful = sum(min(o, L) for o, L in zip(outs, lens)) if len(got) == len(outs) else sum(lens)
        times = [_cb_output_times(g, t0) for g in got]
        ttft = [t for t, _ in times if t is not None]
        starts = [g.lifespan[0] - t0 for g in got if getattr(g, "lifespan", None) and g.lifespan[0] > 0]
        ends = [e for _, e in times if e is not None]
        rec = {"wall_s": wall, "results": len(got), "failed": len(errors), "errors": errors[:3],
               "useful_tokens": useful,
               "generated_tokens": sum(lens), "requested_tokens": sum(outs), "tokens_per_s": useful / wall,
               "ttft_p50_ms": 1e3 * statistics.median(ttft) if ttft else None,
               "ttft_p99_ms": 1e3 * _pct(ttft, 99) if ttft else None,
               "gen_span_s": (max(ends) - min(starts)) if ends and starts else None,
               "partial": len(got) < len(outs) or any(L < M for L in lens) or bool(errors)}
        _emit(spec, {"kind": "run", "rep": r, **rec})
        runs.append(rec)
    return runs


def _cb_manager(spec, model, prompts, outs, deadline):
    import torch
    M = max(outs)
    gc = _gen_config(model, M)
    kw = {}
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
        kw["workload_hints"] = WorkloadHints(max_prompt_length=max(map(len, prompts)), max_generated_length=M,
                                             num_requests=len(prompts))
    except Exception:  # noqa: BLE001 - an older layout: no hints
        pass
    t0 = time.perf_counter()
    manager = model.init_continuous_batching(generation_config=gc, **kw)
    if hasattr(manager, "warmup") and not getattr(manager, "warmed_up", False):
        manager.warmup()
    manager.start()
    runs = []
    try:
        with torch.inference_mode():
            def collect(ids, until):
                done = {}
                while len(done) < len(ids) and time.perf_counter() < until:
                    r = manager.get_result(timeout=0.2)
                    if r is not None and r.is_finished():
                        done[r.request_id] = r
                    elif r is None and not manager.is_running():
                        raise RuntimeError("the continuous batching thread stopped")
                return done

            wid = manager.add_request(prompts[0][:16], max_new_tokens=8, eos_token_id=-1)
            collect([wid], deadline)
            _emit(spec, {"kind": "warmup", "wall_s": time.perf_counter() - t0})
            for r in range(spec["reps"]):
                if runs and time.perf_counter() + 1.2 * runs[-1]["wall_s"] > deadline:
                    break
                t0 = time.perf_counter()
                ids = [manager.add_request(p, max_new_tokens=o, eos_token_id=-1, record_timestamps=True)
                       for p, o in zip(prompts, outs)]
                done = collect(ids, deadline)
                wall = time.perf_counter() - t0
                lens = {k: len(v.generated_tokens) for k, v in done.items()}
                want = dict(zip(ids, outs))
                useful = sum(min(want[k], L) for k, L in lens.items())
                times = [_cb_output_times(v, t0) for v in done.values()]
                ttft = [t for t, _ in times if t is not None]
                errors = [v.error for v in done.values() if getattr(v, "error", None)]
                rec = {"wall_s": wall, "results": len(done), "failed": len(errors), "errors": errors[:3],
                       "useful_tokens": useful,
                       "generated_tokens": sum(lens.values()), "requested_tokens": sum(outs),
                       "tokens_per_s": useful / wall,
                       "ttft_p50_ms": 1e3 * statistics.median(ttft) if ttft else None,
                       "ttft_p99_ms": 1e3 * _pct(ttft, 99) if ttft else None,
                       "partial": len(done) < len(ids) or bool(errors),
                       "wrong_lengths": sum(lens[k] != want[k] for k in lens)}
                _emit(spec, {"kind": "run", "rep": r, **rec})
                runs.append(rec)
                if rec["partial"]:
                    break
    finally:
        try:
            manager.stop(block=True, timeout=10)
        except Exception:  # noqa: BLE001
            pass
    return runs


def _pct(xs, q):
    import numpy as np
    return float(np.percentile(xs, q))


def worker(spec_path):
    spec = json.load(open(spec_path))
    spec["_t_start"] = time.time()
    deadline = time.perf_counter() + spec["limit_s"]
    wl = json.load(open(spec["workload"]))
    prompts, outs = wl["prompts"], wl["outs"]
    try:
        t0 = time.perf_counter()
        model = _load(spec)
        _emit(spec, {"kind": "loaded", "load_s": time.perf_counter() - t0})
        fn = {"static_eager": _static, "static_compile": _static, "generate_batch": _generate_batch,
              "cb_manager": _cb_manager}[spec["peer"]]
        fn(spec, model, prompts, outs, deadline)
    except Exception as e:  # noqa: BLE001 - recorded, not raised
        traceback.print_exc()
        _emit(spec, {"kind": "error", "error": ("%s: %s" % (type(e).__name__, e))[:600]})
        return 1
    return 0


def run_peer(peer, folder, device, dtype, workload_path, limit_s, reps, logdir):
    """Runs one peer in a child process (its own process group) with limit_s for its work and 30 s
    more before it is killed; returns its summary (median of its timed runs) and every record."""
    tag = "%s_%d" % (peer, os.getpid())
    out = os.path.join(logdir, "peer_%s.jsonl" % peer)
    log = os.path.join(logdir, "peer_%s.log" % peer)
    spec_path = os.path.join(logdir, "peer_%s_spec.json" % tag)
    for p in (out,):
        if os.path.exists(p):
            os.remove(p)
    spec = {"peer": peer, "folder": folder, "device": device, "dtype": dtype, "workload": workload_path,
            "limit_s": limit_s, "reps": reps, "out": out}
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    t0 = time.time()
    note = None
    with open(log, "w") as lf:
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", spec_path], stdout=lf,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=limit_s + 30)
            if rc != 0:
                note = "exit status %d" % rc
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            note = "killed: timeout after %.0f s" % (time.time() - t0)
    os.remove(spec_path)
    recs = [json.loads(line) for line in open(out)] if os.path.exists(out) else []
    runs = [r for r in recs if r["kind"] == "run"]
    errs = [r["error"] for r in recs if r["kind"] == "error"]
    # the continuous peers' requests can fail inside a run that itself returns (each result carries
    # its error): those count as the peer's error too
    errs += ["%s of %d requests failed: %s" % (r.get("failed", "some"), r["results"], r["errors"][0])
             for r in runs if r.get("errors")][:1]
    summary = {"peer": peer, "seconds": round(time.time() - t0, 1), "limit_s": limit_s, "records": recs}
    warm = [r for r in recs if r["kind"] == "warmup"]
    if peer == "static_compile" and warm:
        summary["first_run_s"] = warm[0].get("wall_s")
    if runs:
        full = [r for r in runs if not r.get("partial")] or runs
        summary.update(runs=len(runs), partial=all(r.get("partial") for r in runs))
        for k in ("wall_s", "tokens_per_s", "useful_tokens", "generated_tokens", "ttft_s", "ttft_p50_ms",
                  "ttft_p99_ms", "gen_span_s"):
            vals = [r[k] for r in full if r.get(k) is not None]
            if vals:
                summary[k] = statistics.median(vals)
        if "ttft_s" in summary:  # a static batch: every row's first token at once
            summary["ttft_p50_ms"] = summary["ttft_p99_ms"] = 1e3 * summary.pop("ttft_s")
    elif warm and peer == "static_compile" and warm[0].get("partial"):
        summary.update(partial=True, note="the compiling first run did not finish within the limit",
                       **{k: warm[0][k] for k in ("wall_s", "tokens_per_s", "useful_tokens") if k in warm[0]})
    if errs:
        summary["error"] = errs[0]
    if note:
        summary["note"] = note
    if not runs and "error" not in summary:
        summary["error"] = note or "no timed run"
    if runs and "error" not in summary and not summary.get("useful_tokens"):
        summary["error"] = "no token generated"
    tail = open(log).read()[-2000:] if os.path.exists(log) else ""
    if "error" in summary:
        summary["log_tail"] = tail[-800:]
    return summary


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", required=True, help="a spec JSON (written by run_peer)")
    sys.exit(worker(ap.parse_args().worker))
