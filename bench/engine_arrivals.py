#!/usr/bin/env python3
"""ENGINE benchmark, workloads 2 and 3 of issue 22: requests that arrive over time.

flover    Flover's experiment: N requests with Poisson arrivals (exponential gaps of mean G ms, the
          first at t = 0) for each G of --gaps, prompts U[32, 256] random ids, outputs U[128, 512],
          EOS ignored, greedy, on the random LLaMA-1B-shaped checkpoint (--shape). Four ways to
          serve the same arrivals, one after another on the one loaded model:
            engine     one nopad.Engine, every request submitted at its arrival time
            serial     (a) the same engine one request at a time (max_running = 1, FIFO queue)
            instances  (b) concurrent independent instances, one per request: N nopad.Engine
                       objects with max_running = 1 over the one loaded Generator, request i fed
                       to engine i at its arrival. Each engine owns a context (its own workspace,
                       KV pool, CUDA stream, CUDA graphs and thread; include/nopad.h: contexts of
                       one model run at the same time from different threads), so the N instances
                       share only the weights and race for the GPU as FasterTransformer's
                       instances do in Flover's paper
            window     (c) static batching with a 2 s window: a batch opens at the first arrival
                       not yet served and closes --window-s later (or when the previous batch
                       ends, if later); everything arrived by then is submitted together to the
                       engine, and the next batch waits until every request of this one has
                       ended. A request's latency is its own end (the engine streams it), not
                       its batch's end (kept too, as batch_end_s): the kinder reading for (c)
          The engines are made and warmed up once before the first gap and reused for every gap
          (prefix sharing off, so no gap reuses another's prompt blocks): the fused engine with a
          burst of the first workload, the serial engine with one 256 + 512-token request, every
          instance with one such request (all at once), so CUDA graphs of the widths a request
          passes through are recorded before the clock runs.
          Per mode and gap: total time (first arrival to last end), mean / p50 / p99 request
          latency (arrival to end) and time to first token, tokens/s; per request its arrival,
          submission, admission, first token and end (s from t0); the summed counters of the mode's
          engines every --sample-ms (tokens over time for bench/plot_flover.py). A mode past its
          limit (--mode-limit-s after the last arrival) cancels what is left and says so (partial).
          Request counts per gap: --requests N for all, --requests-per-gap "1000:32,5000:16" to
          shorten the long gaps (the JSON and the table say how many ran).

eviction  Workload 3: 32 requests at fixed 20 ms gaps, outputs U[128, L] for each L of --lengths
          (256 ... 1792): the step time against the live batch size. The engine's counters are
          polled in a tight loop on a thread (nopad_engine_get_stats: steps, tokens_generated,
          prompt_tokens_computed, last_step_ms, published once per step under a lock); between two
          polls whose step counts differ by exactly one, the deltas are that step's ids delivered
          and prompt tokens computed, so a decode-only step (no prompt token computed) had exactly
          `ids delivered` rows and took last_step_ms (plan to delivered ids, host work included).
          Steps that two polls straddle are not attributed (the coverage is reported). Per L: step
          ms median / mean per live batch size, total time, and, with --no-evict, the same arrivals
          with every request generating L tokens (nobody leaves early: what keeping finished
          requests in the batch would cost at most).

    python3 bench/engine_arrivals.py flover --library build-cuda/libnopad.so --out flover.json \\
        [--gaps 5,20,50,200,1000,5000] [--requests 64] [--requests-per-gap 1000:32,5000:16]
    python3 bench/engine_arrivals.py eviction --library build-cuda/libnopad.so --out eviction.json
    python3 bench/engine_arrivals.py flover --library build/libnopad.so --shape tiny --device cpu \\
        --gaps 5,50 --requests 8 --out /tmp/flover.json                  # a check without a GPU
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import engine_common as ec  # noqa: E402

MODES = ("engine", "serial", "instances", "window")
OVERLAP = {"auto": None, "on": True, "off": False}  # nopad.Engine's overlap_steps


def draw(n, gap_ms, seed, vocab, prompt_range, out_range, poisson=True):
    rng = np.random.default_rng([seed, int(gap_ms * 1000), n, 1 if poisson else 0])
    gaps = rng.exponential(gap_ms / 1e3, n - 1) if poisson else np.full(n - 1, gap_ms / 1e3)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps)]).tolist()
    prompts = [rng.integers(0, vocab, int(rng.integers(prompt_range[0], prompt_range[1] + 1))).tolist()
               for _ in range(n)]
    outs = [int(rng.integers(out_range[0], out_range[1] + 1)) for _ in range(n)]
    return arrivals, prompts, outs


def sleep_until(t):
    while True:
        d = t - time.perf_counter()
        if d <= 0:
            return
        time.sleep(min(d, 0.05) if d > 0.002 else 0)


class Run:
    """One mode over one workload: submissions at their times, per-request records, counters."""

    def __init__(self, engines, t0):
        self.engines, self.t0 = engines, t0
        self.reqs = {}  # i -> (Request, submit time from t0)

    def submit(self, i, engine, prompt, out):
        r = engine.submit(prompt, max_tokens=out, ignore_eos=True)
        self.reqs[i] = (r, time.perf_counter() - self.t0)
        return r

    def wait(self, idx, deadline):
        """Waits until the requests idx have ended or the deadline; True when all ended."""
        while True:
            if all(self.reqs[i][0].stats()["finish"] is not None for i in idx):
                return True
            if time.perf_counter() > deadline:
                return False
            time.sleep(0.005)


def records(run, arrivals, prompts, outs, extra=None):
    rows = []
    for i in range(len(arrivals)):
        row = {"i": i, "arrival_s": arrivals[i], "prompt": len(prompts[i]), "max_tokens": outs[i]}
        if i in run.reqs:
            r, sub = run.reqs[i]
            st = r.stats()
            row.update(submit_s=sub, generated=st["generated_tokens"], finish=st["finish"],
                       preemptions=st["preemptions"])
            for k, name in (("admitted_ms", "admitted_s"), ("first_token_ms", "first_token_s"),
                            ("finished_ms", "end_s")):
                row[name] = sub + st[k] / 1e3 if st[k] >= 0 else None
        else:
            row.update(finish="not submitted", generated=0)
        if extra and i in extra:
            row.update(extra[i])
        rows.append(row)
    return rows


def summarize(rows, wall):
    done = [r for r in rows if r.get("finish") == "length"]
    lat = [r["end_s"] - r["arrival_s"] for r in done]
    ttft = [r["first_token_s"] - r["arrival_s"] for r in done if r.get("first_token_s") is not None]
    tokens = sum(r["generated"] for r in rows)
    end = max((r["end_s"] for r in done), default=None)
    s = {"requests": len(rows), "completed": len(done), "tokens": tokens,
         "total_s": end if len(done) == len(rows) else None, "wall_s": wall,
         "latency_mean_s": statistics.mean(lat) if lat else None, "latency_p50_s": ec.pct(lat, 50),
         "latency_p99_s": ec.pct(lat, 99), "ttft_mean_s": statistics.mean(ttft) if ttft else None,
         "ttft_p50_s": ec.pct(ttft, 50), "ttft_p99_s": ec.pct(ttft, 99),
         "tokens_per_s": tokens / end if end else None,
         "wrong_lengths": sum(r["generated"] != r["max_tokens"] for r in done)}
    if len(done) < len(rows):
        s["partial"] = "%d of %d requests ended within the limit; the rest were cancelled" % (len(done), len(rows))
    return s


def decimate(rows, at_most=2000):
    if len(rows) <= at_most:
        return rows
    step = len(rows) / at_most
    return [rows[int(k * step)] for k in range(at_most)] + [rows[-1]]


def run_mode(mode, eng, serial, instances, arrivals, prompts, outs, args):
    n = len(arrivals)
    engines = {"engine": [eng], "window": [eng], "serial": [serial], "instances": instances[:n]}[mode]
    t0 = time.perf_counter() + 0.05
    run = Run(engines, t0)
    sampler = ec.StatsSampler(engines, t0, interval=args.sample_ms / 1e3, keep_every=0)
    sampler.start()
    deadline = t0 + arrivals[-1] + getattr(args, "limit_now", args.mode_limit_s)
    extra = {}
    ok = True
    if mode in ("engine", "serial", "instances"):
        for i in range(n):
            sleep_until(t0 + arrivals[i])
            run.submit(i, engines[0] if mode != "instances" else instances[i], prompts[i], outs[i])
        ok = run.wait(range(n), deadline)
    else:  # window: static batches
        i, prev_end, batch_no = 0, 0.0, 0
        while i < n:
            close = max(arrivals[i] + args.window_s, prev_end)
            sleep_until(t0 + close)
            now = time.perf_counter() - t0
            batch = [j for j in range(i, n) if arrivals[j] <= now]
            for j in batch:
                run.submit(j, eng, prompts[j], outs[j])
            ok = run.wait(batch, deadline)
            prev_end = time.perf_counter() - t0
            for j in batch:
                extra[j] = {"batch": batch_no, "batch_close_s": now, "batch_end_s": prev_end}
            batch_no += 1
            i += len(batch)
            if not ok:
                break
    if not ok:
        for r, _ in run.reqs.values():
            r.cancel()
        run.wait(list(run.reqs), time.perf_counter() + 30)
    wall = time.perf_counter() - t0
    series = sampler.stop()
    rows = records(run, arrivals, prompts, outs, extra)
    for r, _ in run.reqs.values():
        r.close()
    res = {"mode": mode, **summarize(rows, wall), "requests_detail": rows,
           "series": decimate([[round(s["t"], 4), s["tokens_generated"], s["running"], s["waiting"], s["steps"]]
                               for s in series]),
           "series_fields": ["t", "tokens_generated", "running", "waiting", "steps"],
           "sampler_polls": sampler.polls}
    if mode == "window":
        res["batches"] = len({e["batch"] for e in extra.values()})
    return res


def warm(eng, reqs):
    rs = [eng.submit(p, max_tokens=o, ignore_eos=True) for p, o in reqs]
    for r in rs:
        r.result()
        r.close()


def flover(args, gen, out, save):
    import nopad
    V = ec.SHAPES[args.shape]["vocab_size"]
    per_gap = {}
    for part in (args.requests_per_gap or "").split(","):
        if part:
            g, k = part.split(":")
            per_gap[float(g)] = int(k)
    gaps = [float(g) for g in args.gaps.split(",")]
    plan = [(g, per_gap.get(g, args.requests)) for g in gaps]
    n_max = max(k for _, k in plan)
    pr, orng = args.prompt_range, args.out_range
    kv_one = pr[1] + orng[1] + 32
    out["plan"] = [{"gap_ms": g, "requests": k} for g, k in plan]
    modes = args.modes.split(",")
    t = time.perf_counter()
    eng = nopad.Engine(gen, kv_cache_tokens=n_max * kv_one, max_running=n_max, max_queue=n_max,
                       max_step_tokens=args.max_step_tokens, prefix_sharing=False, overlap_steps=OVERLAP[args.overlap])
    serial = (nopad.Engine(gen, kv_cache_tokens=kv_one, max_running=1, max_queue=n_max,
                           max_step_tokens=args.max_step_tokens, prefix_sharing=False, overlap_steps=OVERLAP[args.overlap])
              if "serial" in modes else None)
    instances = ([nopad.Engine(gen, kv_cache_tokens=kv_one, max_running=1, max_queue=2,
                               max_step_tokens=args.instance_step_tokens, prefix_sharing=False, overlap_steps=OVERLAP[args.overlap])
                  for _ in range(n_max)] if "instances" in modes else [])
    out["setup_s"] = {"engines_created": time.perf_counter() - t}
    rng = np.random.default_rng(args.seed)
    longest = (rng.integers(0, V, pr[1]).tolist(), orng[1])
    _, wp, wo = draw(n_max, gaps[0], args.seed, V, pr, orng)
    t = time.perf_counter()
    warm(eng, list(zip(wp, wo)))
    if serial:
        warm(serial, [longest])
    if instances:
        ths = [threading.Thread(target=warm, args=(e, [longest])) for e in instances]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
    out["setup_s"]["warmup"] = time.perf_counter() - t
    print("# engines made in %.1f s, warmed up in %.1f s (%d instances)" % (
        out["setup_s"]["engines_created"], out["setup_s"]["warmup"], len(instances)), flush=True)
    try:
        for g, k in plan:
            arrivals, prompts, outs = draw(k, g, args.seed, V, pr, orng)
            point = {"gap_ms": g, "requests": k, "arrival_span_s": arrivals[-1],
                     "prompt_tokens": sum(map(len, prompts)), "output_tokens": sum(outs), "modes": {}}
            out["points"].append(point)
            for mode in modes:
                left = args.budget_s - (time.time() - args.t_start)
                if left < arrivals[-1] + 20:
                    point["modes"][mode] = {"mode": mode, "skipped": "time budget (%.0f s left, the arrivals "
                                            "alone span %.0f s)" % (left, arrivals[-1])}
                    print("# gap %g ms, %s: skipped (budget)" % (g, mode), flush=True)
                    continue
                args.limit_now = min(args.mode_limit_s, left - arrivals[-1] - 10)
                r = run_mode(mode, eng, serial, instances, arrivals, prompts, outs, args)
                point["modes"][mode] = r
                print("# gap %g ms, %d requests, %s: total %s s, latency mean %s s p99 %s s, %s" % (
                    g, k, mode, fmt(r["total_s"]), fmt(r["latency_mean_s"]), fmt(r["latency_p99_s"]),
                    r.get("partial", "complete")), flush=True)
                save()
    finally:
        for e in [eng, serial] + instances:
            if e is not None:
                e.close()


def fmt(v, f="%.3f"):
    return f % v if isinstance(v, (int, float)) else "–"


def flover_table(out):
    lines = ["\n## ENGINE, Flover's experiment — %s shape (bench/engine_arrivals.py flover)" % out["shape"],
             "\n%s; prompts U%s, outputs U%s, seed %s; (a) serial, (b) instances, (c) %g s window\n" % (
                 out["info"].get("gpu", out["info"]["device"]), out["args"]["prompt_range"],
                 out["args"]["out_range"], out["args"]["seed"], out["args"]["window_s"]),
             "| gap ms | requests | mode | total s | latency mean s | p99 s | TTFT p50 s | tokens/s | "
             "engine × (total) | engine × (mean latency) | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in out["points"]:
        e = p["modes"].get("engine", {})
        for m, r in p["modes"].items():
            if "skipped" in r:
                lines.append("| %g | %d | %s | skipped: %s ||||||||" % (p["gap_ms"], p["requests"], m, r["skipped"]))
                continue
            rt = r["total_s"] / e["total_s"] if m != "engine" and r.get("total_s") and e.get("total_s") else None
            rl = (r["latency_mean_s"] / e["latency_mean_s"]
                  if m != "engine" and r.get("latency_mean_s") and e.get("latency_mean_s") else None)
            lines.append("| %g | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                p["gap_ms"], p["requests"], m, fmt(r["total_s"], "%.2f"), fmt(r["latency_mean_s"]),
                fmt(r["latency_p99_s"]), fmt(r["ttft_p50_s"]), fmt(r["tokens_per_s"], "%.0f"),
                fmt(rt, "%.2f"), fmt(rl, "%.2f"), r.get("partial", "")))
    return "\n".join(lines)


# ---- eviction -------------------------------------------------------------------------------------


def step_trace(rows):
    """Steps seen alone between two polls: [batch rows, ms, decode-only] per attributed step."""
    steps = []
    for a, b in zip(rows, rows[1:]):
        if b["steps"] - a["steps"] == 1:
            gen = b["tokens_generated"] - a["tokens_generated"]
            comp = b["prompt_tokens_computed"] - a["prompt_tokens_computed"]
            steps.append((gen, b["last_step_ms"], comp == 0, round(b["t"], 5)))
    return steps


def eviction(args, gen, out, save):
    import nopad
    V = ec.SHAPES[args.shape]["vocab_size"]
    Ls = [int(x) for x in args.lengths.split(",")]
    n = args.requests
    pr = args.prompt_range
    kv = n * (pr[1] + max(Ls) + 32)
    with nopad.Engine(gen, kv_cache_tokens=kv, max_running=n, max_queue=n, max_step_tokens=args.max_step_tokens,
                      prefix_sharing=False, overlap_steps=OVERLAP[args.overlap]) as eng:
        _, wp, _ = draw(n, args.gap_ms, args.seed, V, pr, (128, max(Ls)), poisson=False)
        t = time.perf_counter()
        warm(eng, [(p, max(Ls) - 8 * i) for i, p in enumerate(wp)])  # every batch size, every width
        out["warmup_s"] = time.perf_counter() - t
        print("# warmed up in %.1f s" % out["warmup_s"], flush=True)
        for L in Ls:
            if time.time() - args.t_start > args.budget_s - 30:
                out["points"].append({"L": L, "runs": {}, "skipped": "time budget"})
                print("# L %d: skipped (budget)" % L, flush=True)
                continue
            arrivals, prompts, outs = draw(n, args.gap_ms, args.seed + L, V, pr, (128, L), poisson=False)
            point = {"L": L, "requests": n, "output_tokens": sum(outs), "runs": {}}
            out["points"].append(point)
            for kind in (["evict", "no_evict"] if args.no_evict else ["evict"]):
                o = outs if kind == "evict" else [L] * n
                t0 = time.perf_counter() + 0.02
                run = Run([eng], t0)
                sampler = ec.StatsSampler([eng], t0, interval=args.poll_s, keep_every=0.05)
                sampler.start()

                def feed():
                    for i in range(n):
                        sleep_until(t0 + arrivals[i])
                        run.submit(i, eng, prompts[i], o[i])

                th = threading.Thread(target=feed)
                th.start()
                th.join()
                ok = run.wait(range(n), t0 + arrivals[-1] + args.mode_limit_s)
                wall = time.perf_counter() - t0
                rows = sampler.stop()
                if not ok:
                    for r, _ in run.reqs.values():
                        r.cancel()
                    run.wait(range(n), time.perf_counter() + 30)
                recs = records(run, arrivals, prompts, o)
                for r, _ in run.reqs.values():
                    r.close()
                summ = summarize(recs, wall)
                steps = step_trace(rows)
                total_steps = rows[-1]["steps"] - rows[0]["steps"] if rows else 0
                by = {}
                for b, ms, dec, _ in steps:
                    if dec:
                        by.setdefault(b, []).append(ms)
                table = [{"batch": b, "steps": len(v), "ms_median": statistics.median(v),
                          "ms_mean": statistics.mean(v), "ms_min": min(v), "ms_p90": ec.pct(v, 90)}
                         for b, v in sorted(by.items())]
                res = {**{k: v for k, v in summ.items()}, "steps_total": total_steps,
                       "steps_attributed": len(steps), "decode_steps_attributed": sum(d for _, _, d, _ in steps),
                       "sampler_polls": sampler.polls, "by_batch": table,
                       "trace": [list(s) for s in steps], "trace_fields": ["rows", "ms", "decode_only", "t"]}
                point["runs"][kind] = res
                print("# L %d %s: total %s s, %d steps (%d attributed, %d decode-only), %d polls; "
                      "step ms by batch: %s" % (
                          L, kind, fmt(summ["total_s"], "%.2f"), total_steps, len(steps),
                          res["decode_steps_attributed"], sampler.polls,
                          ", ".join("%d:%.2f" % (t["batch"], t["ms_median"]) for t in table[::max(1, len(table) // 8)])),
                      flush=True)
                save()


def eviction_table(out):
    lines = ["\n## ENGINE, eviction — %s shape (bench/engine_arrivals.py eviction)" % out["shape"],
             "\n%s; %d requests at %g ms gaps, outputs U[128, L]; decode-only steps seen alone by the "
             "poller\n" % (out["info"].get("gpu", out["info"]["device"]), out["args"]["requests"],
                           out["args"]["gap_ms"]),
             "| L | total s | no-evict total s | no-evict × | steps | attributed | step ms at batch 1 / 8 / 16 / 32 |",
             "|---|---|---|---|---|---|---|"]
    for p in out["points"]:
        if "skipped" in p:
            lines.append("| %d | skipped: %s ||||||" % (p["L"], p["skipped"]))
            continue
        e, ne = p["runs"].get("evict", {}), p["runs"].get("no_evict", {})
        by = {t["batch"]: t["ms_median"] for t in e.get("by_batch", [])}
        ratio = ne["total_s"] / e["total_s"] if ne.get("total_s") and e.get("total_s") else None
        lines.append("| %d | %s | %s | %s | %d | %d | %s |" % (
            p["L"], fmt(e.get("total_s"), "%.2f"), fmt(ne.get("total_s"), "%.2f"), fmt(ratio, "%.2f"),
            e.get("steps_total", 0), e.get("steps_attributed", 0),
            " / ".join(fmt(by.get(b), "%.2f") for b in (1, 8, 16, 32))))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("experiment", choices=["flover", "eviction"])
    ap.add_argument("--library", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="1b", choices=sorted(ec.SHAPES))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype")
    ap.add_argument("--seed", type=int, default=ec.SEED)
    ap.add_argument("--prompt-range", default="32,256")
    ap.add_argument("--out-range", default="128,512", help="flover: output lengths U[a, b]")
    ap.add_argument("--max-step-tokens", type=int, default=4096)
    ap.add_argument("--budget-s", type=float, default=560,
                    help="the whole run's time: a mode (flover) or an L (eviction) that would start too late is "
                         "skipped and says so")
    ap.add_argument("--mode-limit-s", type=float, default=150,
                    help="seconds a mode may run after its last arrival before what is left is cancelled")
    # flover
    ap.add_argument("--gaps", default="5,20,50,200,1000,5000", help="mean Poisson gaps, ms")
    ap.add_argument("--requests", type=int, default=None, help="flover: 64; eviction: 32")
    ap.add_argument("--requests-per-gap", help='e.g. "1000:32,5000:16": fewer requests at those gaps')
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--overlap", default="auto", choices=sorted(OVERLAP),
                    help="every engine: step n+1 planned and queued before step n's ids are back (auto: on CUDA)")
    ap.add_argument("--window-s", type=float, default=2.0)
    ap.add_argument("--instance-step-tokens", type=int, default=512,
                    help="max_step_tokens (workspace) of each independent instance")
    ap.add_argument("--sample-ms", type=float, default=10, help="flover: counter sampling interval")
    # eviction
    ap.add_argument("--lengths", default="256,512,768,1024,1280,1536,1792")
    ap.add_argument("--gap-ms", type=float, default=20)
    ap.add_argument("--poll-s", type=float, default=0.0002, help="eviction: counter polling interval")
    ap.add_argument("--no-evict", type=int, default=1, help="eviction: also run every request to L (1/0)")
    args = ap.parse_args()
    args.prompt_range = tuple(int(x) for x in args.prompt_range.split(","))
    args.out_range = tuple(int(x) for x in args.out_range.split(","))
    args.requests = args.requests or (64 if args.experiment == "flover" else 32)
    args.dtype = args.dtype or ec.DTYPES[args.device]
    os.environ["NOPAD_LIBRARY"] = os.path.abspath(args.library)
    import nopad
    t_start = args.t_start = time.time()
    out = {"experiment": args.experiment, "info": ec.env_info(args.device, args.library), "shape": args.shape,
           "dtype": args.dtype, "args": vars(args), "points": []}
    print(json.dumps(out["info"]), flush=True)
    folder, ck = ec.checkpoint(args.shape)
    out["checkpoint"] = ck

    def save():
        out["total_s"] = round(time.time() - t_start, 1)
        ec.save_json(args.out, out)

    with nopad.Generator(folder, device=args.device, dtype=args.dtype, kv_cache_tokens=16,
                         max_batch_tokens=16) as gen:
        (flover if args.experiment == "flover" else eviction)(args, gen, out, save)
    save()
    print((flover_table if args.experiment == "flover" else eviction_table)(out))
    print("\ntotal %.0f s; JSON %s" % (out["total_s"], args.out))
    bad = [m for p in out["points"] for m in (p.get("modes") or p.get("runs")).values()
           if m.get("wrong_lengths")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
