#!/usr/bin/env python3
"""The rules of cuda_flux_pick and cuda_flux_wins (src/backend/cuda/flux/flux.cu), derived from a
flux_bench JSON (bench/results/flux_*/): this script restates both rules in Python and prints how
well they fit the measurements, so the next run's JSON re-checks (or re-derives) them.

  tools/flux_rules.py bench/results/flux_2026-12-07b_H100/*_f16.json [more JSON]
  tools/flux_rules.py --merge A.json B.json   (one set of points: B's replace A's at the same
                                              model, GEMM, tokens and tp; e.g. a full run, then a
                                              re-run of some of its points)

- pick: against each shape's fastest configuration of those flux.cu still has (matched by name,
  so a JSON from a build with more configurations works): the geometric mean and the worst of
  pick / fastest, and at how many points the pick is the fastest.
- wins: whether the rule's answer matches the sign of "hidden" (the fused kernel, its peers'
  chunks arriving as over the emulated link, against the collective then cuBLASLt), the losses it
  takes and the gains it leaves, and the time it saves over the points (the sum of plain + comm -
  delayed where it takes the fused kernel) against the most any rule could (every gain taken); and
  the same for other bounds, to show the choice. Each JSON's delayed runs say on how many CTAs the
  persistent grid ran (delayed_ctas, or max_ctas before it existed; 0: every SM, the emulation whose
  arrivals CTA waited for an SM: docs/parallel.md).
Keep both functions here in step with flux.cu.
"""
import json
import math
import sys

SMS = 132  # the H100's and the H200's; cuda_flux_pick reads the device's
# flux.cu's configurations, in its order (CONFIG_NAMES)
CONFIGS = ["wgmma 64x128x64 4 stages 2 CTAs/SM",
           "tma warp-specialized persistent 128x256x64 4 stages",
           "tma warp-specialized persistent 128x128x64 6 stages"]


def tiles(rows, n_out, bm, bn):
    return sum(-(-r // bm) * -(-n_out // bn) for r in rows)


def pick(rows, world, n_in, n_out, sms=SMS):
    """cuda_flux_pick (n_in: no longer a rule: since the ReduceScatter's partials come through the
    TMA ring, 128 x 128 tiles at two CTAs a SM no longer win at K < 2048)"""
    t128, t256 = tiles(rows, n_out, 128, 128), tiles(rows, n_out, 128, 256)
    if t128 < sms // 2:
        return 0
    # the share of the last wave's SMs busy, 128 x 128 against 128 x 256 tiles (one CTA a SM)
    busy128 = t128 / (sms * math.ceil(t128 / sms))
    busy256 = t256 / (sms * math.ceil(t256 / sms))
    return 2 if busy128 > 1.1 * busy256 else 1


AG_SIDE, RS_SIDE, AG_MIN_TOKENS, RS_MIN_TOKENS, RS_MAX_TOKENS = 20480, 12288, 4096, 1024, None


def wins(all_gather, n_tokens, n_in, n_out, world, ag_side=AG_SIDE, rs_side=RS_SIDE, ag_min_tokens=AG_MIN_TOKENS,
         rs_min_tokens=RS_MIN_TOKENS, rs_max_tokens=RS_MAX_TOKENS):
    """cuda_flux_wins (the bounds as arguments for the sweep below; rs_max_tokens None: no bound)"""
    if world < 2 or world > 8 or n_in % 64 or n_out % 8:
        return False
    if all_gather and n_tokens < ag_min_tokens:
        return False
    if not all_gather and n_tokens < rs_min_tokens:  # the fewest tokens measured: decode stays unfused
        return False
    if not all_gather and rs_max_tokens is not None and n_tokens > rs_max_tokens:
        return False
    side = (n_out if all_gather else n_in) * world / (world - 1)
    return side <= (ag_side if all_gather else rs_side)


def load(paths, merge):
    """[(label, json, rows)]: each JSON alone, or with merge one set of points, later files' rows
    replacing earlier ones at the same point"""
    docs = [(path, json.load(open(path))) for path in paths]
    for path, d in docs:
        print(f"{path}: {d['gpu']}, build {d['build']}, {d['dtype']}, {len(d['rows'])} points, delayed runs' "
              f"persistent grid on {d.get('delayed_ctas', d.get('max_ctas', 0)) or 'every'} SM(s)")
    if not merge:
        return [(path, d, d["rows"]) for path, d in docs]
    points = {}
    for _, d in docs:
        for r in d["rows"]:
            points[(r["model"], r["gemm"], r["tokens"], r["tp"])] = dict(r, _configs=d["configs"])
    return [("merged", docs[-1][1], list(points.values()))]


def main(paths, merge):
    for label, d, rows in load(paths, merge):
        print(f"{label}: {len(rows)} points")
        ratios, worst = [], (0, None)
        for r in rows:
            index = [r.get("_configs", d["configs"]).index(name) for name in CONFIGS]  # ours -> the JSON's
            chunk_rows = [r["tokens"] // r["tp"]] * r["tp"]
            times = [r["fused_ms"][i] for i in index]
            p = pick(chunk_rows, r["tp"], r["K"], r["N"])
            ratio = times[p] / min(times)
            ratios.append(ratio)
            if ratio > worst[0]:
                worst = (ratio, r)
        g = math.exp(sum(map(math.log, ratios)) / len(ratios))
        w = worst[1]
        print(f"  pick: {g:.3f}x the fastest configuration (geometric mean), worst {worst[0]:.3f}x "
              f"({w['model']} {w['gemm']} T {w['tokens']} tp {w['tp']}); the fastest at "
              f"{sum(x == 1.0 for x in ratios)} of {len(ratios)} points")
        best = sum(max(0.0, r["hidden"] * r["comm_ms"]) for r in rows)
        variants = [("the rule", {})]
        variants += [(f"AG side <= {s}", {"ag_side": s}) for s in (4096, 10240, 16384, 65536)]
        variants += [(f"AG from {t} tokens", {"ag_min_tokens": t}) for t in (1024, 16384)]
        variants += [(f"RS side <= {s}", {"rs_side": s}) for s in (4096, 10240, 16384, 65536)]
        variants += [(f"RS up to {t} tokens", {"rs_max_tokens": t}) for t in (4096, 8192)]
        variants += [("the old rule (RS side <= 16384, up to 8192 tokens)", {"rs_side": 16384, "rs_max_tokens": 8192, "rs_min_tokens": 0})]
        for label, bounds in variants:
            match, taken_losses, left_gains, saved = 0, [], [], 0.0
            for r in rows:
                ag = r["kind"] == "allgather_gemm"
                w_ = wins(ag, r["tokens"], r["K"], r["N"], r["tp"], **bounds)
                match += w_ == (r["hidden"] > 0)
                saved += r["hidden"] * r["comm_ms"] if w_ else 0.0
                name = f"{r['model']} {r['gemm']} T{r['tokens']} tp{r['tp']} {100 * r['hidden']:+.0f}%"
                if w_ and r["hidden"] <= 0:
                    taken_losses.append(name)
                if not w_ and r["hidden"] > 0:
                    left_gains.append(name)
            print(f"  wins ({label}): matches the sign of hidden at {match} of {len(rows)} points; saves "
                  f"{saved:.3f} ms of the {best:.3f} ms a perfect rule would")
            if label == "the rule":
                print(f"    takes {len(taken_losses)} losers: {', '.join(taken_losses) or '-'}")
                print(f"    leaves {len(left_gains)} winners: {', '.join(left_gains) or '-'}")


if __name__ == "__main__":
    args = sys.argv[1:]
    merge = "--merge" in args
    args = [a for a in args if a != "--merge"]
    if not args:
        sys.exit("usage: tools/flux_rules.py [--merge] FLUX_JSON...")
    main(args, merge)
