#!/usr/bin/env python3
"""ENGINE benchmark, workloads 1 and 4 of issue 22 (throughput), nopad and its HF peers in one run:
N requests submitted at once, prompts of U[32, 256] random ids, outputs of U[64, 512] tokens, EOS
ignored, greedy, on a random checkpoint of the shape (bench/decode_bench.py's builder: `1b` the
LLaMA-1B shape of workload 1, `smollm2` the SmolLM2-135M shape of workload 4, `tiny` a check on
the CPU). The lengths are drawn from the printed seed and written to a workload JSON that every
peer reads, so all run on the same lengths.

nopad: nopad.Engine (max_running = N, a KV pool that holds every request, max_step_tokens 4096,
prefix sharing off so that a repeat never reuses an earlier repeat's prompt blocks; the random
prompts share none anyway). One untimed full run first (it records the CUDA graphs of the batch
sizes it passes through), then --reps timed runs; the median run is reported. Useful output
tokens/s = tokens generated / wall time from the first submit to the last request's end; time to
first token p50 / p99 from the requests' own counters (from their submission).

Peers (bench/engine_peers.py, a child process each, with a time limit): HF static batching eager
and with a static cache + torch.compile, HF continuous batching `generate_batch` (one
max_new_tokens for all: the longest) and its manager with each request's own max_new_tokens.
Useful tokens of a peer = each request's requested count, however many rows it computed.

    python3 bench/engine_bench.py --library build-cuda/libnopad.so --out engine.json [--requests 32,256]
        [--shape 1b|smollm2|tiny] [--peers static_eager,static_compile,generate_batch,cb_manager|none]
    python3 bench/engine_bench.py --library build/libnopad.so --shape tiny --device cpu --requests 8 \\
        --out /tmp/engine.json                                          # a check without a GPU

The run stays within --budget-s: a peer's limit is the smaller of its own (--peer-limit) and what
is left of the budget after a reserve for the peers still to come; a peer that would get under
20 s is skipped and says so.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import engine_common as ec  # noqa: E402
import engine_peers  # noqa: E402

PEER_NAMES = {"nopad": "nopad.Engine", "static_eager": "HF static batching, eager",
              "static_compile": "HF static batching, static cache + torch.compile",
              "generate_batch": "HF generate_batch (every request to the longest)",
              "cb_manager": "HF continuous batching manager (own lengths)"}


def run_nopad(args, gen, n, prompts, outs):
    """Warm-up run + args.reps timed runs of the N requests on one engine; their rows."""
    import nopad
    kv = sum(len(p) + o for p, o in zip(prompts, outs)) + 16 * n
    runs = []
    overlap = {"auto": None, "on": True, "off": False}[args.overlap]
    with nopad.Engine(gen, kv_cache_tokens=kv, max_running=n, max_queue=n, max_step_tokens=4096,
                      prefix_sharing=False, overlap_steps=overlap) as eng:
        for rep in range(args.reps + 1):
            s0 = eng.stats()
            t0 = time.perf_counter()
            reqs = [eng.submit(p, max_tokens=o, ignore_eos=True) for p, o in zip(prompts, outs)]
            for r in reqs:
                r.result()
            wall = time.perf_counter() - t0
            s1 = eng.stats()
            st = [r.stats() for r in reqs]
            ttft = [s["first_token_ms"] for s in st]
            gen_tokens = sum(len(r.ids) for r in reqs)
            bad = [(i, len(r.ids), o) for i, (r, o) in enumerate(zip(reqs, outs)) if len(r.ids) != o]
            row = {"rep": rep - 1 if rep else "warmup", "wall_s": wall, "output_tokens": gen_tokens,
                   "tokens_per_s": gen_tokens / wall, "ttft_p50_ms": statistics.median(ttft),
                   "ttft_p99_ms": ec.pct(ttft, 99), "steps": s1["steps"] - s0["steps"],
                   "preemptions": s1["preemptions"] - s0["preemptions"],
                   "prompt_tokens_shared": s1["prompt_tokens_shared"] - s0["prompt_tokens_shared"],
                   "wrong_lengths": bad[:5]}
            print("# nopad %d requests, %s: %.3f s, %.0f tokens/s, TTFT p50 %.1f ms, %d steps" % (
                n, "warm-up" if rep == 0 else "rep %d" % (rep - 1), wall, row["tokens_per_s"], row["ttft_p50_ms"],
                row["steps"]), flush=True)
            runs.append(row)
            for r in reqs:
                r.close()
    timed = runs[1:]
    med = sorted(timed, key=lambda r: r["wall_s"])[len(timed) // 2]
    res = {"peer": "nopad", "runs": len(timed), "first_run_s": runs[0]["wall_s"], "records": runs}
    for k in ("wall_s", "tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "steps", "preemptions"):
        res[k] = med[k]
    res["useful_tokens"] = med["output_tokens"]
    res["wall_s_all"] = [r["wall_s"] for r in timed]
    if any(r["wrong_lengths"] for r in runs):
        res["error"] = "requests ended with other lengths than asked: %s" % next(
            r["wrong_lengths"] for r in runs if r["wrong_lengths"])
    return res


def _produced(r):
    """Whether a result has numbers to show: a positive tokens/s (a peer whose requests all failed
    ran and timed 0 tokens)."""
    return isinstance(r.get("tokens_per_s"), (int, float)) and r["tokens_per_s"] > 0


def _error(r):
    """A result's error for the table: its own, else the first request error of its runs (results
    written before run_peer collected those), else why it has no numbers."""
    if r.get("error") or r.get("skipped"):
        return r.get("error") or r.get("skipped")
    errs = [e for rec in r.get("records", []) for e in (rec.get("errors") or [])]
    if errs:
        return "requests failed: %s" % errs[0]
    return r.get("note") or ("no token generated" if "tokens_per_s" in r else "no result")


def table(out):
    info = out["info"]
    lines = ["\n## ENGINE throughput — %s shape, %s (bench/engine_bench.py)" % (out["shape"], out["dtype"]),
             "\n%s, torch %s, transformers %s, nopad %s (%s), seed %s; median of %s timed runs after a warm-up "
             "(peers: as many as fit their limit)\n" % (
                 info.get("gpu", info["device"]), info.get("torch"), info.get("transformers"), info.get("nopad"),
                 info.get("build", info.get("git")), info["seed"], out["reps"])]
    for w in out["workloads"]:
        lines += ["\n%d requests, %d prompt tokens, %d output tokens requested (longest %d):\n" % (
            w["requests"], w["prompt_tokens"], w["output_tokens"], w["longest_output"]),
                  "| system | useful tokens/s | wall s | TTFT p50 ms | TTFT p99 ms | rows generated | nopad × | note |",
                  "|---|---|---|---|---|---|---|---|"]
        nop = next((r for r in w["results"] if r["peer"].startswith("nopad") and _produced(r)), None)
        for r in w["results"]:
            name = PEER_NAMES.get(r["peer"], r["peer"])
            if not _produced(r):  # skipped, failed, or ran without a token: its error instead of numbers
                lines.append("| %s | – | – | – | – | – | – | %s |" % (
                    name, _error(r)[:160].replace("|", "/")))
                continue
            f = lambda v, fmt="%.1f": (fmt % v) if isinstance(v, (int, float)) else "–"  # noqa: E731
            ratio = nop["tokens_per_s"] / r["tokens_per_s"] if nop and r is not nop else None
            note = ["error: %s" % _error(r)[:160].replace("|", "/")] if r.get("error") else []
            if r.get("partial"):
                note.append("partial (time limit)")
            if r.get("first_run_s"):
                note.append("first run %.1f s" % r["first_run_s"])
            if r.get("gen_span_s"):
                note.append("span admitted→end %.2f s" % r["gen_span_s"])
            if r.get("note"):
                note.append(r["note"])
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, f(r["tokens_per_s"], "%.0f"), f(r.get("wall_s"), "%.2f"), f(r.get("ttft_p50_ms")),
                f(r.get("ttft_p99_ms")), f(r.get("generated_tokens", r.get("useful_tokens")), "%d"),
                f(ratio, "%.2f"), "; ".join(note)))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--library", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", default="32,256")
    ap.add_argument("--shape", default="1b", choices=sorted(ec.SHAPES))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", help="nopad's dtype (default fp16 on cuda, f32 on cpu); HF runs the same")
    ap.add_argument("--seed", type=int, default=ec.SEED)
    ap.add_argument("--reps", type=int, default=3, help="timed runs after the warm-up (nopad; peers at most)")
    ap.add_argument("--peers", default="static_eager,static_compile,generate_batch,cb_manager",
                    help="comma list of %s, or none" % ",".join(engine_peers.PEERS))
    ap.add_argument("--peer-limit", default="120",
                    help="seconds per peer: N for all, or N,peer:N,... (default %(default)s)")
    ap.add_argument("--peer-reps", type=int, default=2, help="timed runs of a peer at most")
    ap.add_argument("--budget-s", type=float, default=570, help="the whole run's time budget")
    ap.add_argument("--folder", help="the checkpoint folder (default /tmp/nopad_dec_<shape>)")
    ap.add_argument("--weights", default="auto",
                    help="nopad's weights, a comma list of auto, native, f16, bf16, fp8: one nopad row each "
                         "(issue 43: FP8 or a GGUF's blocks against fp16), with its bytes in memory")
    ap.add_argument("--model", help="nopad's model instead of the shape's random checkpoint (a GGUF file or a "
                                    "folder: its weights; the shape still sets the workload's vocabulary)")
    ap.add_argument("--overlap", default="auto", choices=["auto", "on", "off"],
                    help="nopad: step n+1 planned and queued before step n's ids are back (auto: on CUDA)")
    args = ap.parse_args()
    t_start = time.time()
    os.environ["NOPAD_LIBRARY"] = os.path.abspath(args.library)
    import nopad
    args.dtype = args.dtype or ec.DTYPES[args.device]
    peers = [] if args.peers in ("", "none") else args.peers.split(",")
    for p in peers:
        if p not in engine_peers.PEERS:
            ap.error("unknown peer %s" % p)
    limits = {}
    for part in args.peer_limit.split(","):
        if ":" in part:
            k, v = part.split(":")
            limits[k] = float(v)
        else:
            limits["*"] = float(part)
    logdir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(logdir, exist_ok=True)

    out = {"info": ec.env_info(args.device, args.library), "shape": args.shape, "shape_config": ec.SHAPES[args.shape],
           "dtype": args.dtype, "reps": args.reps, "peers": peers, "workloads": []}
    out["info"]["args"] = vars(args)
    print(json.dumps(out["info"]), flush=True)
    t0 = time.time()
    folder, ck = ec.checkpoint(args.shape, args.folder)
    out["checkpoint"] = dict(ck, seconds=round(time.time() - t0, 1))
    print("# checkpoint %s" % json.dumps(out["checkpoint"]), flush=True)
    V = ec.SHAPES[args.shape]["vocab_size"]
    ns = [int(x) for x in args.requests.split(",")]
    for n in ns:
        prompts, outs = ec.throughput_workload(n, args.seed, V)
        path = os.path.join(logdir, "workload_%s_%d.json" % (args.shape, n))
        with open(path, "w") as fh:
            json.dump({"seed": args.seed + n, "prompts": prompts, "outs": outs}, fh)
        out["workloads"].append({"requests": n, "workload": path, "prompt_tokens": sum(map(len, prompts)),
                                 "output_tokens": sum(outs), "longest_output": max(outs),
                                 "longest_prompt": max(map(len, prompts)), "results": []})

    # nopad first, in this process, once per --weights; its memory goes back before the peers start
    weights_list = args.weights.split(",")
    for weights in weights_list:
        peer = "nopad" if len(weights_list) == 1 else "nopad weights %s" % weights
        try:
            gen = nopad.Generator(args.model or folder, device=args.device, dtype=args.dtype, kv_cache_tokens=16,
                                  max_batch_tokens=16, weights=weights)
        except Exception as e:  # noqa: BLE001
            for w in out["workloads"]:
                w["results"].append({"peer": peer, "error": "load: %s: %s" % (type(e).__name__, e)})
            print("# %s: load failed: %s" % (peer, e), flush=True)
            continue
        with gen:
            mem = gen.memory
            for w in out["workloads"]:
                wl = json.load(open(w["workload"]))
                try:
                    r = run_nopad(args, gen, w["requests"], wl["prompts"], wl["outs"])
                except Exception as e:  # noqa: BLE001
                    r = {"error": "%s: %s" % (type(e).__name__, e)}
                    print("# %s %d requests: error %s" % (peer, w["requests"], e), flush=True)
                r.update(peer=peer, weights=weights, memory=mem)
                if "error" not in r:
                    r["note"] = "weights %.0f MB" % (mem["weights"] / 1e6)
                w["results"].append(r)
                ec.save_json(args.out, out)

    todo = [(w, p) for w in out["workloads"] for p in peers]
    for i, (w, p) in enumerate(todo):
        left = args.budget_s - (time.time() - t_start)
        reserve = 40 * (len(todo) - i - 1)  # at least 40 s for each peer still to come
        limit = min(limits.get(p, limits.get("*", 120)), left - reserve - 35)
        if limit < 20:
            w["results"].append({"peer": p, "skipped": "time budget (%.0f s left)" % left})
            print("# %s %d requests: skipped, %.0f s left" % (p, w["requests"], left), flush=True)
            continue
        print("# %s %d requests: limit %.0f s" % (p, w["requests"], limit), flush=True)
        r = engine_peers.run_peer(p, folder, args.device, args.dtype, w["workload"], limit, args.peer_reps, logdir)
        w["results"].append(r)
        print("# %s %d requests: %s" % (p, w["requests"], json.dumps(
            {k: v for k, v in r.items() if k not in ("records", "log_tail")})), flush=True)
        ec.save_json(args.out, out)
    out["total_s"] = round(time.time() - t_start, 1)
    ec.save_json(args.out, out)
    print(table(out))
    failed = [r for w in out["workloads"] for r in w["results"] if "error" in r]
    print("\ntotal %.0f s; JSON %s%s" % (out["total_s"], args.out, "; %d failed" % len(failed) if failed else ""))
    return 1 if any(r["peer"].startswith("nopad") for r in failed) else 0


if __name__ == "__main__":
    sys.exit(main())
