#!/usr/bin/env python3
"""SERVE benchmark (issue 23): `nopad serve` under a load generator on the same machine, against
the in-process engine on the same lengths.

The server runs a random checkpoint of the shape (bench/decode_bench.py's builder; `1b` the
LLaMA-1B shape of issue 22's workload 1, `tiny` a check on the CPU) from a folder beside it that
links the checkpoint's files and adds a synthetic tokenizer.json (the server needs one; the
checkpoint has none): byte-level BPE of exactly vocab_size tokens, every one printable ASCII, so
each generated id becomes text at once and no UTF-8 tail holds a streamed chunk back. Requests
send the prompt as token ids (`prompt: [ids]`), so the tokenizer only detokenizes.

1. Throughput: issue 22's workload 1 (engine_common.throughput_workload: N prompts of U[32, 256]
   random ids, outputs U[64, 512], the same draws as bench/engine_bench.py), N requests at once
   to /v1/completions (max_tokens = the drawn length, ignore_eos, temperature 0), streamed (SSE)
   and plain; useful tokens/s = the completion tokens the responses report / wall time from the
   release of the N client processes (each already connected) to the last response's end. The same
   requests run in this process on nopad.Engine with engine_bench.py's settings (max_running N,
   a KV pool that holds them all, 4096 tokens a step, prefix sharing off), with the server up and
   idle. The systems take turns: one warm-up run each, then --reps rounds; medians reported.
   Every run's prompts are the workload's ids shifted by a run number (mod vocab), the same
   lengths, so that the server's prefix cache (on, as served) never reuses an earlier run's blocks
   (/metrics' shared-prompt counter is recorded to show it).
2. Time to first token: C = 1, 16, 64 concurrent streaming clients (--ttft-streams), each a
   --ttft-prompt-id prompt and --ttft-max-tokens tokens; TTFT measured at the client from
   sending the request to the first SSE chunk that carries text; a warm-up round, then rounds
   until --ttft-samples samples (at least 2 rounds); p50 / p99 over them, tokens/s over the
   rounds' walls, and the in-process engine's own TTFT (its counters, from submission) for the
   same rounds.

The client is the standard library only (http.client, a forked process per request). `transformers
serve` is not run: its presence and dependencies are probed and written to the JSON.

    python3 bench/serve_bench.py --cli /tmp/nopad_dec/build/nopad --out serve.json      # GPU, 1b
    NOPAD_LIBRARY=build/libnopad.so python3 bench/serve_bench.py --cli build/nopad \\
        --shape tiny --device cpu --requests 8 --out /tmp/serve.json                    # CPU check

--budget-s (default 300, the checkpoint's creation included) stops taking new rounds when the
next would not fit; the JSON is rewritten after each phase.
"""
import argparse
import http.client
import itertools
import json
import math
import multiprocessing
import os
import re
import signal
import statistics
import string
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import engine_common as ec  # noqa: E402

SERVE_DTYPE = {"f32": "fp32", "fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}


# ---- the model folder the server reads -----------------------------------------------------------


def write_tokenizer(path, vocab_size):
    """A byte-level BPE tokenizer.json of exactly vocab_size tokens: the 94 printable ASCII
    characters and the byte-level space, then merges of alphanumeric pairs and triples."""
    base = [chr(c) for c in range(33, 127)] + ["\u0120"]
    alnum = string.ascii_letters + string.digits
    vocab = {t: i for i, t in enumerate(base)}
    merges = []
    pairs = ((a, b) for a in alnum for b in alnum)
    triples = ((a + b, c) for a, b in itertools.product(alnum, alnum) for c in alnum)
    for a, b in itertools.chain(pairs, triples):
        if len(vocab) >= vocab_size:
            break
        vocab[a + b] = len(vocab)
        merges.append([a, b])
    assert len(vocab) == vocab_size, (len(vocab), vocab_size)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": byte_level, "post_processor": None, "decoder": dict(byte_level, add_prefix_space=True),
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": False, "vocab": vocab, "merges": merges}}
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(tok, fh)
    os.replace(tmp, path)


def serve_folder(folder, vocab_size):
    """folder + '_serve': links to the checkpoint's config.json and model.safetensors, and the
    synthetic tokenizer."""
    sf = folder.rstrip("/") + "_serve"
    os.makedirs(sf, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        link = os.path.join(sf, name)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.abspath(os.path.join(folder, name)), link)
    write_tokenizer(os.path.join(sf, "tokenizer.json"), vocab_size)
    return sf


# ---- the server ----------------------------------------------------------------------------------


class Server:
    def __init__(self, cmd, log_path):
        self.cmd, self.log_path = cmd, log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None

    def wait_ready(self, timeout):
        t_end = time.time() + timeout
        while time.time() < t_end:
            if self.proc.poll() is not None:
                raise RuntimeError("nopad serve exited %d: %s" % (self.proc.returncode, self.log_text()[-2000:]))
            if self.port is None:
                m = re.search(r"listening on http://[^ ]*:(\d+)/", self.log_text())
                if m:
                    self.port = int(m.group(1))
            if self.port is not None:
                try:
                    status, _ = http_get(self.port, "/health")
                    if status == 200:
                        return
                except OSError:
                    pass
            time.sleep(0.2)
        raise RuntimeError("nopad serve not ready after %.0f s: %s" % (timeout, self.log_text()[-2000:]))

    def log_text(self):
        self.log.flush()
        with open(self.log_path, errors="replace") as fh:
            return fh.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def http_get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def metric(port, name):
    try:
        _, body = http_get(port, "/metrics")
    except OSError:
        return None
    m = re.search(r"^%s(?:\{[^}]*\})? ([0-9.eE+-]+)$" % re.escape(name), body.decode(), re.M)
    return float(m.group(1)) if m else None


# ---- the load generator --------------------------------------------------------------------------


def _one(port, body, stream, start, rec):
    """One request on its own connection (connected before `start` is released)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.connect()
        data = json.dumps(body).encode()
        start.wait()
        rec["t_send"] = time.perf_counter()
        conn.request("POST", "/v1/completions", body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            rec["error"] = "HTTP %d: %s" % (r.status, r.read()[:300].decode(errors="replace"))
            return
        if not stream:
            obj = json.loads(r.read())
            rec["t_end"] = time.perf_counter()
            rec["tokens"] = obj["usage"]["completion_tokens"]
            return
        chunks = 0
        while True:
            line = r.readline()
            if not line:
                rec.setdefault("error", "stream ended without [DONE]")
                break
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            if payload.startswith(b'{"error"'):
                rec["error"] = payload[:300].decode(errors="replace")
                continue
            chunks += 1
            if "t_first" not in rec:
                obj = json.loads(payload)
                if obj.get("choices") and obj["choices"][0].get("text"):
                    rec["t_first"] = time.perf_counter()
            if b'"usage"' in payload and b'"choices":[]' in payload:
                rec["tokens"] = json.loads(payload)["usage"]["completion_tokens"]
        rec["t_end"] = time.perf_counter()
        rec["chunks"] = chunks
    except Exception as e:  # noqa: BLE001
        rec["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass


def _client(port, body, stream, start, results, index):
    """A client process: one request, its record back through the queue."""
    rec = {}
    _one(port, body, stream, start, rec)
    results.put((index, rec))


def http_round(port, prompts, outs, stream):
    """All requests at once, each from its own process (connected first), and the wall time from
    the release to the last end. Processes, not threads: a thread per stream parsing an SSE event
    per token under one interpreter lock kept up with 12,000 events/s only just (perf_counter is
    CLOCK_MONOTONIC, one clock for every process). Forked: the children never touch CUDA."""
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    procs = []
    for i, (p, o) in enumerate(zip(prompts, outs)):
        body = {"prompt": p, "max_tokens": o, "ignore_eos": True, "temperature": 0}
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        procs.append(ctx.Process(target=_client, args=(port, body, stream, start, results, i), daemon=True))
    for pr in procs:
        pr.start()
    time.sleep(0.2 + 0.005 * len(procs))  # every client connected and waiting
    t0 = time.perf_counter()
    start.set()
    recs = [{} for _ in procs]
    for _ in procs:
        try:
            i, rec = results.get(timeout=600)
        except Exception:  # noqa: BLE001
            break
        recs[i] = rec
    for pr in procs:
        pr.join(timeout=10)
    for i, rec in enumerate(recs):
        if not rec:
            rec["error"] = "client process %d gave no record" % i
    ends = [r["t_end"] for r in recs if "t_end" in r]
    wall = (max(ends) if ends else time.perf_counter()) - t0
    return recs, wall


def engine_round(eng, prompts, outs):
    t0 = time.perf_counter()
    reqs = [eng.submit(p, max_tokens=o, ignore_eos=True) for p, o in zip(prompts, outs)]
    for r in reqs:
        r.result()
    wall = time.perf_counter() - t0
    tokens = [len(r.ids) for r in reqs]
    ttft = [r.stats()["first_token_ms"] for r in reqs]
    for r in reqs:
        r.close()
    return tokens, ttft, wall


def shifted(prompts, k, vocab):
    """The prompts with every id moved by k (mod vocab): same lengths, other content."""
    return [[(x + 7919 * k) % vocab for x in p] for p in prompts]


def f(v, fmt="%.1f"):
    return (fmt % v) if isinstance(v, (int, float)) else "–"


def median_of(rows, key):
    xs = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(xs) if xs else None


def probe_transformers_serve():
    from importlib import util
    missing = [m for m in ("transformers", "fastapi", "uvicorn", "openai") if util.find_spec(m) is None]
    if missing:
        return "not run: %s not installed here (transformers serve needs them; no network for pip)" % ", ".join(missing)
    return "not run: its dependencies are installed, but this script does not drive it (no token-id prompts)"


# ---- main ----------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", required=True, help="the nopad executable")
    ap.add_argument("--library", help="libnopad for the in-process engine (default $NOPAD_LIBRARY, else beside --cli)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="1b", choices=sorted(ec.SHAPES))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", help="default fp16 on cuda, f32 on cpu")
    ap.add_argument("--requests", type=int, default=32, help="throughput: requests at once")
    ap.add_argument("--reps", type=int, default=3, help="throughput: timed rounds after the warm-up")
    ap.add_argument("--modes", default="stream,plain", help="throughput over HTTP: stream, plain or both")
    ap.add_argument("--ttft-streams", default="1,16,64")
    ap.add_argument("--ttft-prompt", type=int, default=128)
    ap.add_argument("--ttft-max-tokens", type=int, default=64)
    ap.add_argument("--ttft-samples", type=int, default=64, help="TTFT samples per concurrency at least")
    ap.add_argument("--http-threads", type=int, default=8)
    ap.add_argument("--seed", type=int, default=ec.SEED)
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--folder", help="the checkpoint folder (default /tmp/nopad_dec_<shape>)")
    args = ap.parse_args()
    t_start = time.time()
    left = lambda: args.budget_s - (time.time() - t_start)  # noqa: E731
    args.dtype = args.dtype or ec.DTYPES[args.device]
    lib = args.library or os.environ.get("NOPAD_LIBRARY") or os.path.join(os.path.dirname(os.path.abspath(args.cli)),
                                                                           "libnopad.so")
    os.environ["NOPAD_LIBRARY"] = os.path.abspath(lib)
    import nopad
    modes = [m for m in args.modes.split(",") if m]
    streams = [int(x) for x in args.ttft_streams.split(",") if x]
    outdir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(outdir, exist_ok=True)

    out = {"info": ec.env_info(args.device, lib), "shape": args.shape, "shape_config": ec.SHAPES[args.shape],
           "dtype": args.dtype, "requests": args.requests, "reps": args.reps,
           "transformers_serve": probe_transformers_serve()}
    out["info"]["args"] = vars(args)
    out["info"]["cli"] = os.path.abspath(args.cli)
    print(json.dumps(out["info"]), flush=True)
    t0 = time.time()
    folder, ck = ec.checkpoint(args.shape, args.folder)
    V = ec.SHAPES[args.shape]["vocab_size"]
    sfolder = serve_folder(folder, V)
    out["checkpoint"] = dict(ck, serve_folder=sfolder, seconds=round(time.time() - t0, 1))
    print("# checkpoint %s" % json.dumps(out["checkpoint"]), flush=True)

    n = args.requests
    prompts, outs = ec.throughput_workload(n, args.seed, V)
    kv_thr = sum(len(p) + o for p, o in zip(prompts, outs)) + 16 * n
    cmax = max(streams) if streams else 1
    kv_ttft = cmax * (args.ttft_prompt + args.ttft_max_tokens + 16)
    kv_serve = max(kv_thr, kv_ttft)
    out["workload"] = {"requests": n, "seed": args.seed + n, "prompt_tokens": sum(map(len, prompts)),
                       "output_tokens": sum(outs), "longest_output": max(outs), "kv_tokens_engine": kv_thr,
                       "kv_tokens_server": kv_serve}
    cmd = [args.cli, "serve", "--model", sfolder, "--port", "0", "--host", "127.0.0.1", "--device", args.device,
           "--dtype", SERVE_DTYPE[args.dtype], "--kv-tokens", str(kv_serve), "--max-running", str(max(n, cmax)),
           "--step-tokens", "4096", "--max-queue", str(4 * max(n, cmax)), "--http-threads", str(args.http_threads)]
    out["server_command"] = " ".join(cmd)
    print("# %s" % out["server_command"], flush=True)
    server = None
    rc_fail = 0
    try:
        server = Server(cmd, os.path.join(outdir, "serve_server.log"))
        t0 = time.time()
        server.wait_ready(min(180, max(30, left())))
        out["server_start_s"] = round(time.time() - t0, 1)
        print("# server on port %d after %.1f s" % (server.port, out["server_start_s"]), flush=True)
        port = server.port

        with nopad.Generator(folder, device=args.device, dtype=args.dtype, kv_cache_tokens=16,
                             max_batch_tokens=16) as gen, \
                nopad.Engine(gen, kv_cache_tokens=max(kv_thr, kv_ttft), max_running=max(n, cmax),
                             max_queue=4 * max(n, cmax), max_step_tokens=4096, prefix_sharing=False) as eng:
            # 1. throughput
            systems = ["engine"] + ["http_" + m for m in modes]
            thr = {s: [] for s in systems}
            run_no = 0
            longest_round = 0.0
            for rep in range(args.reps + 1):
                if rep > 1 and left() < longest_round * len(systems) * 1.3 + 60:
                    print("# throughput: stopping after %d timed rounds (%.0f s left)" % (rep - 1, left()), flush=True)
                    break
                for s in systems:
                    run_no += 1
                    ps = shifted(prompts, run_no, V)
                    row = {"rep": rep - 1 if rep else "warmup"}
                    shared0 = metric(port, "nopad_engine_prompt_tokens_shared_total")
                    if s == "engine":
                        toks, ttft, wall = engine_round(eng, ps, outs)
                        row.update(tokens=sum(toks), wall_s=wall, ttft_p50_ms=ec.pct(ttft, 50),
                                   ttft_p99_ms=ec.pct(ttft, 99),
                                   wrong_lengths=[(i, t, o) for i, (t, o) in enumerate(zip(toks, outs)) if t != o][:5])
                    else:
                        recs, wall = http_round(port, ps, outs, s == "http_stream")
                        toks = [r.get("tokens", 0) for r in recs]
                        errs = [r["error"] for r in recs if "error" in r]
                        ttft = [(r["t_first"] - r["t_send"]) * 1e3 for r in recs if "t_first" in r]
                        row.update(tokens=sum(toks), wall_s=wall, errors=errs[:5], n_errors=len(errs),
                                   wrong_lengths=[(i, t, o) for i, (t, o) in enumerate(zip(toks, outs)) if t != o][:5])
                        if ttft:
                            row.update(ttft_p50_ms=ec.pct(ttft, 50), ttft_p99_ms=ec.pct(ttft, 99))
                        shared1 = metric(port, "nopad_engine_prompt_tokens_shared_total")
                        if shared0 is not None and shared1 is not None:
                            row["prompt_tokens_shared"] = shared1 - shared0
                    row["tokens_per_s"] = row["tokens"] / wall if wall > 0 else None
                    longest_round = max(longest_round, wall)
                    thr[s].append(row)
                    print("# %-12s %-7s %6.3f s %8.0f tok/s  TTFT p50 %s ms%s" % (
                        s, row["rep"], wall, row["tokens_per_s"] or 0, f(row.get("ttft_p50_ms")),
                        "  ERRORS %d: %s" % (row["n_errors"], row["errors"][0]) if row.get("n_errors") else
                        ("  wrong lengths %s" % row["wrong_lengths"] if row["wrong_lengths"] else "")), flush=True)
            out["throughput"] = {}
            for s in systems:
                timed = [r for r in thr[s] if r["rep"] != "warmup"]
                out["throughput"][s] = {"runs": thr[s], "timed_runs": len(timed),
                                        "tokens_per_s": median_of(timed, "tokens_per_s"),
                                        "wall_s": median_of(timed, "wall_s"),
                                        "ttft_p50_ms": median_of(timed, "ttft_p50_ms"),
                                        "ttft_p99_ms": median_of(timed, "ttft_p99_ms"),
                                        "errors": sum(r.get("n_errors", 0) for r in thr[s]),
                                        "wrong_lengths": any(r["wrong_lengths"] for r in thr[s])}
                if out["throughput"][s]["errors"] or out["throughput"][s]["wrong_lengths"]:
                    rc_fail = 1
            base = out["throughput"]["engine"]["tokens_per_s"]
            for s in systems[1:]:
                v = out["throughput"][s]["tokens_per_s"]
                out["throughput"][s]["ratio_to_engine"] = v / base if v and base else None
            ec.save_json(args.out, out)

            # 2. TTFT at C concurrent streams
            rng = np.random.default_rng(args.seed + 23)
            out["ttft"] = []
            for c in streams:
                rounds = max(2, math.ceil(args.ttft_samples / c))
                res = {"streams": c, "prompt_tokens": args.ttft_prompt, "max_tokens": args.ttft_max_tokens,
                       "rounds": []}
                t_c = time.time()
                for rd in range(rounds + 1):
                    if rd > 1 and left() < 2 * (time.time() - t_c) / rd + 30:
                        res["note"] = "stopped after %d rounds (budget)" % (rd - 1)
                        break
                    ps = [rng.integers(0, V, args.ttft_prompt).tolist() for _ in range(c)]
                    os_ = [args.ttft_max_tokens] * c
                    recs, wall = http_round(port, ps, os_, True)
                    errs = [r["error"] for r in recs if "error" in r]
                    ttft = [(r["t_first"] - r["t_send"]) * 1e3 for r in recs if "t_first" in r]
                    tpot = [(r["t_end"] - r["t_first"]) * 1e3 / (r["tokens"] - 1) for r in recs
                            if "t_first" in r and r.get("tokens", 0) > 1]
                    row = {"round": rd - 1 if rd else "warmup", "wall_s": wall, "tokens": sum(r.get("tokens", 0) for r in recs),
                           "ttft_ms": ttft, "tpot_ms_median": statistics.median(tpot) if tpot else None,
                           "n_errors": len(errs), "errors": errs[:3]}
                    # the engine in this process on other prompts of the same lengths
                    ps2 = [rng.integers(0, V, args.ttft_prompt).tolist() for _ in range(c)]
                    toks, ettft, ewall = engine_round(eng, ps2, os_)
                    row.update(engine_ttft_ms=ettft, engine_wall_s=ewall, engine_tokens=sum(toks))
                    res["rounds"].append(row)
                    if errs:
                        rc_fail = 1
                timed = [r for r in res["rounds"] if r["round"] != "warmup"]
                tt = [x for r in timed for x in r["ttft_ms"]]
                et = [x for r in timed for x in r["engine_ttft_ms"]]
                wall = sum(r["wall_s"] for r in timed)
                ewall = sum(r["engine_wall_s"] for r in timed)
                res.update(samples=len(tt), ttft_p50_ms=ec.pct(tt, 50), ttft_p99_ms=ec.pct(tt, 99),
                           tokens_per_s=sum(r["tokens"] for r in timed) / wall if wall else None,
                           tpot_ms=median_of(timed, "tpot_ms_median"),
                           engine_ttft_p50_ms=ec.pct(et, 50), engine_ttft_p99_ms=ec.pct(et, 99),
                           engine_tokens_per_s=sum(r["engine_tokens"] for r in timed) / ewall if ewall else None,
                           errors=sum(r["n_errors"] for r in res["rounds"]))
                out["ttft"].append(res)
                print("# TTFT %3d streams: %d samples, p50 %s ms, p99 %s ms, %s tok/s (engine in-process: p50 %s, "
                      "p99 %s ms, %s tok/s)%s" % (
                          c, len(tt), f(res["ttft_p50_ms"]), f(res["ttft_p99_ms"]), f(res["tokens_per_s"], "%.0f"),
                          f(res["engine_ttft_p50_ms"]), f(res["engine_ttft_p99_ms"]),
                          f(res["engine_tokens_per_s"], "%.0f"), "  ERRORS %d" % res["errors"] if res["errors"] else ""),
                      flush=True)
                ec.save_json(args.out, out)
    except Exception as e:  # noqa: BLE001
        out["error"] = "%s: %s" % (type(e).__name__, e)
        print("# error: %s" % out["error"], flush=True)
        rc_fail = 1
    finally:
        if server:
            out["server_exit"] = server.stop()
            with open(server.log_path, errors="replace") as fh:
                out["server_log_tail"] = fh.read()[-1500:]
    out["total_s"] = round(time.time() - t_start, 1)
    ec.save_json(args.out, out)
    print(table(out))
    print("\ntotal %.0f s; JSON %s%s" % (out["total_s"], args.out, "; FAILED" if rc_fail else ""))
    return rc_fail


def table(out):
    info = out["info"]
    lines = ["\n## SERVE — %s shape, %s (bench/serve_bench.py)" % (out["shape"], out["dtype"]),
             "\n%s, torch %s, nopad %s (%s), seed %s\n" % (
                 info.get("gpu", info["device"]), info.get("torch"), info.get("nopad"),
                 info.get("build", info.get("git")), info["seed"])]
    w = out.get("workload")
    if w and out.get("throughput"):
        lines += ["Throughput: %d requests at once, %d prompt tokens, %d output tokens (EOS ignored); median of "
                  "the timed runs after a warm-up\n" % (w["requests"], w["prompt_tokens"], w["output_tokens"]),
                  "| system | runs | useful tokens/s | wall s | × engine | TTFT p50 ms | TTFT p99 ms | note |",
                  "|---|---|---|---|---|---|---|---|"]
        names = {"engine": "nopad.Engine in-process", "http_stream": "nopad serve, stream (SSE)",
                 "http_plain": "nopad serve, plain JSON"}
        for s, r in out["throughput"].items():
            note = []
            if r.get("errors"):
                note.append("%d request errors" % r["errors"])
            if r.get("wrong_lengths"):
                note.append("wrong lengths")
            shared = [x.get("prompt_tokens_shared") for x in r["runs"] if x.get("prompt_tokens_shared")]
            if shared:
                note.append("prompt tokens shared %s" % shared)
            lines.append("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
                names.get(s, s), r["timed_runs"], f(r["tokens_per_s"], "%.0f"), f(r["wall_s"], "%.3f"),
                f(r.get("ratio_to_engine"), "%.3f"), f(r["ttft_p50_ms"]), f(r["ttft_p99_ms"]), "; ".join(note)))
    if out.get("ttft"):
        t = out["ttft"][0]
        lines += ["\nTime to first token at the client: C concurrent streams of %d prompt ids and %d tokens each "
                  "(rounds of C at once after a warm-up round); engine = nopad.Engine in this process, same "
                  "lengths\n" % (t["prompt_tokens"], t["max_tokens"]),
                  "| streams | samples | TTFT p50 ms | TTFT p99 ms | tokens/s | ms/token (median) | "
                  "engine TTFT p50 ms | engine TTFT p99 ms | engine tokens/s | note |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in out["ttft"]:
            lines.append("| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["streams"], r["samples"], f(r["ttft_p50_ms"]), f(r["ttft_p99_ms"]), f(r["tokens_per_s"], "%.0f"),
                f(r["tpot_ms"], "%.2f"), f(r["engine_ttft_p50_ms"]), f(r["engine_ttft_p99_ms"]),
                f(r["engine_tokens_per_s"], "%.0f"),
                "; ".join(x for x in (r.get("note"), "%d errors" % r["errors"] if r["errors"] else None) if x)))
    lines.append("\n`transformers serve`: %s" % out.get("transformers_serve"))
    if out.get("error"):
        lines.append("\nERROR: %s" % out["error"])
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
