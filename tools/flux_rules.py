#!/usr/bin/env python3
"""The rules of cuda_flux_pick and cuda_flux_wins (src/backend/cuda/flux/flux.cu), derived from a
flux_bench JSON (bench/results/flux_*/): this script restates both rules in Python and prints how
well they fit the measurements, so the next run's JSON re-checks (or re-derives) them.

  tools/flux_rules.py bench/results/flux_2026-12-07b_H100/*_f16.json [more JSON]

- pick: against each shape's fastest configuration of those flux.cu still has (matched by name,
  so a JSON from a build with more configurations works): the geometric mean and the worst of
  pick / fastest, and at how many points the pick is the fastest.
- wins: whether the rule's answer matches the sign of "hidden" (the fused kernel, its peers'
  chunks arriving as over the emulated link, against the collective then cuBLASLt), the losses it
  takes and the gains it leaves; and the same for other bounds on the side, to show the choice.
Keep both functions here in step with flux.cu.
"""
import json
import math
import sys

SMS = 132  # the H100's and the H200's; cuda_flux_pick reads the device's
# flux.cu's configurations, in its order (CONFIG_NAMES)
CONFIGS = ["wgmma 128x128x64 3 stages 2 CTAs/SM", "wgmma 64x128x64 4 stages 2 CTAs/SM",
           "tma warp-specialized persistent 128x256x64 4 stages",
           "tma warp-specialized persistent 128x128x64 6 stages"]


def tiles(rows, n_out, bm, bn):
    return sum(-(-r // bm) * -(-n_out // bn) for r in rows)


def pick(rows, world, n_in, n_out, sms=SMS):
    """cuda_flux_pick (n_in: no longer a rule: since the ReduceScatter's partials come through the
    TMA ring, 128 x 128 tiles at two CTAs a SM no longer win at K < 2048)"""
    t128, t256 = tiles(rows, n_out, 128, 128), tiles(rows, n_out, 128, 256)
    if t128 < sms // 2:
        return 1
    # the share of the last wave's SMs busy, 128 x 128 against 128 x 256 tiles (one CTA a SM)
    busy128 = t128 / (sms * math.ceil(t128 / sms))
    busy256 = t256 / (sms * math.ceil(t256 / sms))
    return 3 if busy128 > 1.1 * busy256 else 2


def wins(all_gather, n_tokens, n_in, n_out, world, ag_side=20480, rs_side=16384):
    """cuda_flux_wins (the side bounds as arguments for the sweep below)"""
    if world < 2 or world > 8 or n_in % 64 or n_out % 8:
        return False
    if all_gather and n_tokens < 4096:
        return False
    if not all_gather and n_tokens > 8192:
        return False
    side = (n_out if all_gather else n_in) * world / (world - 1)
    return side <= (ag_side if all_gather else rs_side)


def main(paths):
    for path in paths:
        d = json.load(open(path))
        index = [d["configs"].index(name) for name in CONFIGS]  # ours -> the JSON's
        rows = d["rows"]
        print(f"{path}: {d['gpu']}, build {d['build']}, {d['dtype']}, {len(rows)} points")
        ratios, worst = [], (0, None)
        for r in rows:
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
        for label, ag_side, rs_side in [("the rule", 20480, 16384)] + [
                (f"AG side <= {s}", s, 16384) for s in (4096, 10240, 16384, 65536)] + [
                (f"RS side <= {s}", 20480, s) for s in (1400, 4096, 10240, 65536)]:
            match, taken_losses, left_gains = 0, [], []
            for r in rows:
                ag = r["kind"] == "allgather_gemm"
                w_ = wins(ag, r["tokens"], r["K"], r["N"], r["tp"], ag_side, rs_side)
                match += w_ == (r["hidden"] > 0)
                name = f"{r['model']} {r['gemm']} T{r['tokens']} tp{r['tp']} {100 * r['hidden']:+.0f}%"
                if w_ and r["hidden"] <= 0:
                    taken_losses.append(name)
                if not w_ and r["hidden"] > 0:
                    left_gains.append(name)
            print(f"  wins ({label}): matches the sign of hidden at {match} of {len(rows)} points")
            if label == "the rule":
                print(f"    takes {len(taken_losses)} losers: {', '.join(taken_losses) or '-'}")
                print(f"    leaves {len(left_gains)} winners: {', '.join(left_gains) or '-'}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: tools/flux_rules.py FLUX_JSON...")
    main(sys.argv[1:])
