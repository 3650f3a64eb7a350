"""Shared parts of the ENGINE benchmarks (issue 22; bench/engine_bench.py, engine_peers.py,
engine_arrivals.py): the shapes and random checkpoints (bench/decode_bench.py's), the request
workloads drawn from a printed seed, a sampler of the engine's counters, and what the run ran on."""
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

import decode_bench as db  # noqa: E402

SHAPES = db.SHAPES
SEED = 20261125
# the nopad dtype name and the one HF runs in, per device
DTYPES = {"cuda": "fp16", "cpu": "f32"}


def checkpoint(shape_name, folder=None):
    """The random checkpoint folder of a shape (written once, reused after)."""
    folder = folder or "/tmp/nopad_dec_%s" % shape_name
    info = db.make_checkpoint(SHAPES[shape_name], folder)
    return folder, info


def throughput_workload(n, seed, vocab, prompt_range=(32, 256), out_range=(64, 512)):
    """Workload 1 of issue 22: n prompts of U[prompt_range] random ids and n output lengths
    U[out_range] (both ends included). The draw order is engine_bench.py's first one, so its lengths
    stay those of the first measurement."""
    rng = np.random.default_rng(seed + n)
    prompts = [rng.integers(0, vocab, int(rng.integers(prompt_range[0], prompt_range[1] + 1))).tolist()
               for _ in range(n)]
    outs = [int(rng.integers(out_range[0], out_range[1] + 1)) for _ in range(n)]
    return prompts, outs


def pct(xs, q):
    xs = [x for x in xs if x is not None]
    return float(np.percentile(xs, q)) if xs else None


def env_info(device, library=None):
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": device, "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "numpy": np.__version__, "seed": SEED}
    from importlib import metadata
    for mod in ("torch", "transformers"):  # versions without importing them (no second OpenMP runtime here)
        try:
            info[mod] = metadata.version(mod)
        except Exception as e:  # noqa: BLE001
            info[mod] = "missing (%s)" % type(e).__name__
    try:
        import nopad
        info["nopad"] = nopad.library_version()
        info["build"] = nopad.library_build_id()  # the build measured, from the library itself
    except Exception as e:  # noqa: BLE001
        info["nopad"] = "? (%s)" % e
    if library:
        info["library"] = os.path.abspath(library)
    if device == "cuda":
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
            info["gpu"] = q.stdout.strip().split("\n")[0]
        except Exception as e:  # noqa: BLE001
            info["gpu"] = "? (%s)" % e
    return info


def save_json(path, obj):
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
    os.replace(tmp, path)


class StatsSampler(threading.Thread):
    """Polls nopad_engine_get_stats of one or more engines every `interval` s on a thread of its
    own and keeps a row whenever the summed step count changed (and one every `keep_every` s
    otherwise): (t from t0, steps, tokens_generated, prompt_tokens_computed, running, waiting,
    last_step_ms of the first engine). Sums over engines for the concurrent-instance runs.
    The engine publishes its counters once per step under a lock, so a row is a consistent
    snapshot; between two rows whose steps differ by exactly 1 (one engine) the deltas are that
    one step's ids delivered and prompt tokens computed."""

    FIELDS = ("t", "steps", "tokens_generated", "prompt_tokens_computed", "running", "waiting", "last_step_ms")

    def __init__(self, engines, t0, interval=0.005, keep_every=0.05):
        super().__init__(daemon=True)
        self.engines, self.t0, self.interval, self.keep_every = list(engines), t0, interval, keep_every
        self.rows = []
        self.polls = 0
        self._halt = threading.Event()

    def _snapshot(self):
        tot = [0, 0, 0, 0, 0]
        last = 0.0
        for i, e in enumerate(self.engines):
            s = e.stats()
            tot[0] += s["steps"]
            tot[1] += s["tokens_generated"]
            tot[2] += s["prompt_tokens_computed"]
            tot[3] += s["running"]
            tot[4] += s["waiting"]
            if i == 0:
                last = s["last_step_ms"]
        return [time.perf_counter() - self.t0] + tot + [last]

    def run(self):
        prev_steps, prev_t = None, -1e9
        while not self._halt.is_set():
            try:
                row = self._snapshot()
            except Exception:  # noqa: BLE001 - an engine closed under us: the run is over
                break
            self.polls += 1
            if row[1] != prev_steps or row[0] - prev_t >= self.keep_every:
                self.rows.append(row)
                prev_steps, prev_t = row[1], row[0]
            if self.interval > 0:
                time.sleep(self.interval)

    def stop(self):
        self._halt.set()
        self.join(timeout=5)
        return [dict(zip(self.FIELDS, r)) for r in self.rows]


def rate_series(rows, bin_s):
    """Tokens/s over time from sampler rows: ids delivered per bin of bin_s seconds."""
    if not rows:
        return []
    out = []
    t_end = rows[-1]["t"]
    nb = int(t_end / bin_s) + 1
    # cumulative tokens at each bin edge (the last row at or before it)
    edges = [0.0] * (nb + 1)
    j = 0
    for b in range(nb + 1):
        t = b * bin_s
        while j + 1 < len(rows) and rows[j + 1]["t"] <= t:
            j += 1
        edges[b] = rows[j]["tokens_generated"] if rows[j]["t"] <= t else 0
    for b in range(nb):
        out.append([round(b * bin_s, 4), (edges[b + 1] - edges[b]) / bin_s])
    return out
