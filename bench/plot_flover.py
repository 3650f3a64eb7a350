#!/usr/bin/env python3
"""Plots of bench/engine_arrivals.py's JSON (matplotlib, PNG).

flover JSON   per gap, flover_gap<G>ms.png: one request timeline per mode (a line per request,
              sorted by arrival: thin grey from its arrival to its first token, thick from the
              first token to its end; window mode marks its batches) and, below, tokens/s over time
              of every mode (ids delivered per bin, from the sampled engine counters); and
              flover_summary.png: total time and mean request latency against the gap, per mode.
eviction JSON eviction.png: decode-only step time against the live batch size for each L (median
              per batch size), and the total time with and without early leaving per L.

    python3 bench/plot_flover.py flover.json [eviction.json ...] --outdir DIR
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"engine": "tab:blue", "serial": "tab:red", "instances": "tab:orange", "window": "tab:green"}
LABELS = {"engine": "nopad engine", "serial": "(a) one at a time", "instances": "(b) independent instances",
          "window": "(c) 2 s static window"}


def rate(series, fields, bin_s):
    i_t, i_tok = fields.index("t"), fields.index("tokens_generated")
    if not series:
        return [], []
    t_end = series[-1][i_t]
    nb = max(1, int(t_end / bin_s) + 1)
    edges, j = [], 0
    for b in range(nb + 1):
        t = b * bin_s
        while j + 1 < len(series) and series[j + 1][i_t] <= t:
            j += 1
        edges.append(series[j][i_tok] if series[j][i_t] <= t else series[0][i_tok])
    xs = [(b + 0.5) * bin_s for b in range(nb)]
    ys = [(edges[b + 1] - edges[b]) / bin_s for b in range(nb)]
    return xs, ys


def plot_gap(point, outdir, title):
    modes = [m for m in point["modes"] if "requests_detail" in point["modes"][m]]
    if not modes:
        return None
    fig, axes = plt.subplots(len(modes) + 1, 1, figsize=(11, 2.6 * len(modes) + 3), sharex=True,
                             gridspec_kw={"height_ratios": [2] * len(modes) + [1.6]})
    t_max = max((r.get("end_s") or r.get("submit_s") or r["arrival_s"])
                for m in modes for r in point["modes"][m]["requests_detail"])
    for ax, m in zip(axes, modes):
        res = point["modes"][m]
        rows = sorted(res["requests_detail"], key=lambda r: r["arrival_s"])
        for y, r in enumerate(rows):
            a, f, e = r["arrival_s"], r.get("first_token_s"), r.get("end_s")
            ax.plot([a, f if f is not None else t_max], [y, y], color="0.7", lw=0.8)
            if f is not None:
                ax.plot([f, e if e is not None else t_max], [y, y], color=COLORS.get(m, "k"), lw=2.2,
                        solid_capstyle="butt")
            ax.plot([a], [y], marker="|", color="k", ms=4)
        if m == "window":
            for t in sorted({r["batch_close_s"] for r in rows if "batch_close_s" in r}):
                ax.axvline(t, color="tab:green", ls=":", lw=0.8)
        note = res.get("partial")
        ax.set_title("%s: total %s s, mean latency %s s, p99 %s s%s" % (
            LABELS.get(m, m), _f(res.get("total_s"), "%.2f"), _f(res.get("latency_mean_s"), "%.2f"),
            _f(res.get("latency_p99_s"), "%.2f"), " (%s)" % note if note else ""), fontsize=9, loc="left")
        ax.set_ylabel("request")
        ax.set_ylim(-1, len(rows))
    ax = axes[-1]
    span = max(t_max, 1e-3)
    bin_s = max(0.02, span / 150)
    for m in modes:
        res = point["modes"][m]
        xs, ys = rate(res["series"], res["series_fields"], bin_s)
        ax.plot(xs, ys, color=COLORS.get(m, "k"), lw=1.2, label=LABELS.get(m, m))
    ax.set_ylabel("tokens/s (%.2g s bins)" % bin_s)
    ax.set_xlabel("seconds from the first arrival")
    ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = os.path.join(outdir, "flover_gap%gms.png" % point["gap_ms"])
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _f(v, fmt):
    return fmt % v if isinstance(v, (int, float)) else "–"


def plot_flover(d, outdir):
    info = d["info"]
    head = "%s shape %s, %s; nopad %s" % (info.get("gpu", info["device"]), d["shape"], d["dtype"],
                                          (info.get("build") or info.get("git") or "?").split()[0])
    paths = []
    for p in d["points"]:
        paths.append(plot_gap(p, outdir, "Flover's experiment: %d requests, Poisson arrivals, mean gap %g ms — %s" % (
            p["requests"], p["gap_ms"], head)))
    if not any("total_s" in r for p in d["points"] for r in p["modes"].values()):
        return [q for q in paths if q]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    modes = sorted({m for p in d["points"] for m in p["modes"]}, key=lambda m: list(COLORS).index(m)
                   if m in COLORS else 9)
    for m in modes:
        pts = [(p["gap_ms"], p["modes"][m]) for p in d["points"] if "total_s" in p["modes"].get(m, {})]
        a1.plot([g for g, _ in pts], [r.get("total_s") or float("nan") for _, r in pts], "o-",
                color=COLORS.get(m), label=LABELS.get(m, m))
        a2.plot([g for g, _ in pts], [r.get("latency_mean_s") or float("nan") for _, r in pts], "o-",
                color=COLORS.get(m), label=LABELS.get(m, m))
    for ax, yl in ((a1, "total time s"), (a2, "mean request latency s")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("mean arrival gap ms (requests per gap: %s)" % ", ".join(
            "%g:%d" % (p["gap_ms"], p["requests"]) for p in d["points"]))
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
    a1.legend(fontsize=8)
    fig.suptitle("Flover's experiment — " + head, fontsize=10)
    fig.tight_layout()
    path = os.path.join(outdir, "flover_summary.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [q for q in paths if q] + [path]


def plot_eviction(d, outdir):
    info = d["info"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    cmap = plt.get_cmap("viridis")
    pts = [p for p in d["points"] if "skipped" not in p]
    for k, p in enumerate(pts):
        e = p["runs"].get("evict", {})
        by = e.get("by_batch", [])
        a1.plot([t["batch"] for t in by], [t["ms_median"] for t in by], "o-", ms=3,
                color=cmap(k / max(1, len(pts) - 1)), label="L = %d" % p["L"])
    a1.set_xlabel("live batch (rows of a decode-only step)")
    a1.set_ylabel("step ms (median)")
    a1.grid(alpha=0.3)
    a1.legend(fontsize=7)
    Ls = [p["L"] for p in pts]
    a2.plot(Ls, [p["runs"].get("evict", {}).get("total_s") or float("nan") for p in pts], "o-",
            label="requests leave when done")
    if any("no_evict" in p["runs"] for p in pts):
        a2.plot(Ls, [p["runs"].get("no_evict", {}).get("total_s") or float("nan") for p in pts], "s--",
                label="every request to L (nobody leaves early)")
    a2.set_xlabel("L (outputs U[128, L])")
    a2.set_ylabel("total s")
    a2.grid(alpha=0.3)
    a2.legend(fontsize=8)
    fig.suptitle("Eviction: %d requests, %g ms gaps — %s shape %s, %s" % (
        d["args"]["requests"], d["args"]["gap_ms"], info.get("gpu", info["device"]), d["shape"], d["dtype"]),
        fontsize=10)
    fig.tight_layout()
    path = os.path.join(outdir, "eviction.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--outdir", default=".")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    for path in args.json:
        d = json.load(open(path))
        kind = d.get("experiment", "flover")
        made = plot_flover(d, args.outdir) if kind == "flover" else plot_eviction(d, args.outdir)
        for m in made:
            print(m)


if __name__ == "__main__":
    main()
