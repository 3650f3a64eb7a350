"""Issue 44's SERVE constrained row: what JSON-schema requests cost the engine's throughput.

64 requests (ENGINE workload 1's prompts and output lengths), every other one under a 10-field JSON
schema, against the same 64 requests unconstrained with the same output lengths: the constrained
run's requests end when their document is whole (or at their length), and the plain run then asks
each request for exactly the ids it produced there. Both runs do the same packed steps on the same
tokens; only the masks differ. The two alternate on one engine (warm-up first) and each is timed
--reps times. Reported: useful tokens/s of both, their ratio, and the host's mask time per step
(nopad_engine_stats.mask_ms / steps) with the time per mask.

The engine needs the vocabulary's token bytes for the masks, so each random checkpoint gets a
tokenizer.json: SmolLM2's byte-level BPE (49,152 ids) for the smollm2 shape, its first 32,000 ids
(the merges among them, a closed prefix since BPE ranks merges in id order) for the 1b shape.

Here (the gguf package reads SmolLM2's GGUF):
    python3 bench/constrained_bench.py tokenizers --gguf SmolLM2.gguf --out DIR
On the GPU machine:
    python3 bench/constrained_bench.py run --library libnopad.so --tokenizers DIR --out r.json
        [--shapes smollm2,1b] [--model smollm2=PATH.gguf] (a real model for a shape instead)
Where the difference goes (one constrained and one plain pass of a shape under CUPTI, through
torch.profiler; engine_profile.py's steps: each step's device span and the idle gap after it, and
the device time per kernel name):
    python3 bench/constrained_bench.py profile --library libnopad.so --tokenizers DIR --out p.json
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import engine_common as ec  # noqa: E402

# The 10-field schema of tests/test_grammar.c's mask-time test (uuid, email, bounded integer,
# number, boolean, enum, array, date, a nested object with a pattern).
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "name": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "score": {"type": "number"},
        "active": {"type": "boolean"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "born": {"type": "string", "format": "date"},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string"},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
    },
    "required": ["id", "name", "email", "age", "score", "active", "role", "tags", "born", "address"],
    "additionalProperties": False,
}
VOCAB = {"smollm2": 49152, "1b": 32000, "tiny": 1000}  # tiny: a check of the script on the CPU


def write_tokenizer(gguf_path, n_ids, folder):
    """tokenizer.json for a byte-level BPE GGUF vocabulary cut to its first n_ids ids."""
    import gguf
    r = gguf.GGUFReader(gguf_path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in r.fields["tokenizer.ggml.token_type"].data]
    merges = strings("tokenizer.ggml.merges")
    if len(tokens) < n_ids:
        raise SystemExit("%s has %d tokens, fewer than %d" % (gguf_path, len(tokens), n_ids))
    vocab = {t: i for i, t in enumerate(tokens[:n_ids])}
    kept = []
    for m in merges:
        a, b = m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            kept.append([a, b])
    added = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in range(n_ids) if types[i] == 3]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": byte_level, "post_processor": None, "decoder": dict(byte_level, add_prefix_space=True),
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": False, "vocab": vocab, "merges": kept}}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer.json"), "w") as fh:
        json.dump(doc, fh, ensure_ascii=False)
    return len(vocab), len(kept), len(added)


def check_document(text):
    """Whether a constrained output is a whole document meeting the schema's bounds that are easy
    to check here (the grammar's own tests check them all)."""
    try:
        d = json.loads(text)
    except ValueError:
        return False
    return (isinstance(d, dict) and set(d) == set(SCHEMA["required"]) and 0 <= d["age"] <= 130
            and d["role"] in ("admin", "user", "guest") and len(d["tags"]) <= 5 and len(d["name"]) <= 40
            and len(d["address"]["zip"]) == 5 and d["address"]["zip"].isdigit())


def timed_run(eng, prompts, outs, constrained, label, seed):
    """One pass of the requests; constrained[i]: request i under the schema; request i samples with
    seed + i (each pass its own seeds: another pass's documents, so masks one pass kept in the
    engine's shared cache do not serve the next). Its row."""
    s0 = eng.stats()
    t0 = time.perf_counter()
    reqs = []
    for i, (p, o) in enumerate(zip(prompts, outs)):
        if constrained[i]:
            reqs.append(eng.submit(p, max_tokens=o, temperature=0.7, seed=seed + i, json_schema=SCHEMA))
        else:
            reqs.append(eng.submit(p, max_tokens=o, temperature=0.7, seed=seed + i, ignore_eos=True))
    for r in reqs:
        r.result()
    wall = time.perf_counter() - t0
    s1 = eng.stats()
    produced = [len(r.ids) for r in reqs]
    steps = s1["steps"] - s0["steps"]
    masks = s1["masks_built"] - s0["masks_built"]
    mask_ms = s1["mask_ms"] - s0["mask_ms"]
    row = {"run": label, "wall_s": wall, "tokens": sum(produced), "tokens_per_s": sum(produced) / wall,
           "steps": steps, "masks_built": masks, "mask_ms": mask_ms,
           "mask_ms_per_step": mask_ms / steps if steps else 0.0, "us_per_mask": 1e3 * mask_ms / masks if masks else None,
           "produced": produced}
    if any(constrained):
        fins = [r.finish_reason for r, c in zip(reqs, constrained) if c]
        docs = [r.text() for r, c in zip(reqs, constrained) if c]
        row["constrained_finish"] = {k: fins.count(k) for k in sorted(set(fins))}
        row["whole_documents_valid"] = sum(check_document(d) for d, f in zip(docs, fins) if f == "stop")
        row["example"] = next((d for d, f in zip(docs, fins) if f == "stop"), docs[0])[:400]
    for r in reqs:
        r.close()
    print("# %-12s %6.3f s  %5d tokens  %7.0f tokens/s  %4d steps  %5d masks  %.3f ms mask/step%s" % (
        label, wall, row["tokens"], row["tokens_per_s"], steps, masks, row["mask_ms_per_step"],
        "  %.0f us/mask" % row["us_per_mask"] if masks else ""), flush=True)
    return row


def run_shape(args, nopad, shape, out):
    V = VOCAB[shape]
    path, info = checkpoint_for(args, shape)
    prompts, outs = ec.throughput_workload(args.requests, args.seed, V)
    constrained = [i % 2 == 1 for i in range(args.requests)]
    res = {"shape": shape, "checkpoint": info, "weights": args.weights, "requests": args.requests,
           "constrained": sum(constrained),
           "prompt_tokens": sum(map(len, prompts)), "max_tokens": sum(outs), "records": []}
    out["shapes"].append(res)
    kv = sum(len(p) + o for p, o in zip(prompts, outs)) + 16 * args.requests
    with nopad.Generator(path, device=args.device, dtype=args.dtype, kv_cache_tokens=16, max_batch_tokens=16,
                         weights=args.weights) as gen, \
            nopad.Engine(gen, kv_cache_tokens=kv, max_running=args.requests, max_queue=args.requests,
                         max_step_tokens=4096, prefix_sharing=False) as eng:
        # warm-up: the constrained pass (it builds the vocabulary's trie) then the plain one
        first = timed_run(eng, prompts, outs, constrained, "warm-up c", 1000)
        timed_run(eng, prompts, first["produced"], [False] * args.requests, "warm-up p", 1000)
        for rep in range(args.reps):
            seed = 1000 * (rep + 2)
            c = timed_run(eng, prompts, outs, constrained, "constrained", seed)
            # the plain pass asks each request for what the constrained pass just produced
            p = timed_run(eng, prompts, c["produced"], [False] * args.requests, "plain", seed)
            if p["tokens"] != c["tokens"]:
                p["error"] = "token counts differ: %d against %d" % (p["tokens"], c["tokens"])
            res["records"] += [c, p]
            ec.save_json(args.out, out)
    cs = [r for r in res["records"] if r["run"] == "constrained"]
    ps = [r for r in res["records"] if r["run"] == "plain"]
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    res.update(constrained_tokens_per_s=med(cs, "tokens_per_s"), plain_tokens_per_s=med(ps, "tokens_per_s"),
               mask_ms_per_step=med(cs, "mask_ms_per_step"), us_per_mask=med(cs, "us_per_mask"),
               ratio=med(cs, "tokens_per_s") / med(ps, "tokens_per_s"))
    print("# %s: constrained %.0f tokens/s, plain %.0f tokens/s (%.3f), host mask %.3f ms a step, %.0f us a mask" % (
        shape, res["constrained_tokens_per_s"], res["plain_tokens_per_s"], res["ratio"], res["mask_ms_per_step"],
        res["us_per_mask"]), flush=True)
    ec.save_json(args.out, out)


def profile_shape(args, nopad, shape, out):
    """One constrained and one plain pass under CUPTI, after a warm-up of each: per pass the sums of
    the steps' device spans and of the idle gaps between them, and the device time per kernel."""
    from torch.profiler import ProfilerActivity, profile
    import torch
    import decode_profile  # its trace reader
    import engine_profile  # its step cutter

    path, info = checkpoint_for(args, shape)
    prompts, outs = ec.throughput_workload(args.requests, args.seed, VOCAB[shape])
    constrained = [i % 2 == 1 for i in range(args.requests)]
    res = {"shape": shape, "checkpoint": info, "weights": args.weights, "passes": []}
    out["shapes"].append(res)
    kv = sum(len(p) + o for p, o in zip(prompts, outs)) + 16 * args.requests
    with nopad.Generator(path, device="cuda", dtype=args.dtype, kv_cache_tokens=16, max_batch_tokens=16,
                         weights=args.weights) as gen, \
            nopad.Engine(gen, kv_cache_tokens=kv, max_running=args.requests, max_queue=args.requests,
                         max_step_tokens=4096, prefix_sharing=False) as eng:
        first = timed_run(eng, prompts, outs, constrained, "warm-up c", 1000)
        timed_run(eng, prompts, first["produced"], [False] * args.requests, "warm-up p", 1000)
        seed, produced = 2000, None
        for label in ("constrained", "plain"):
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                if label == "constrained":
                    row = timed_run(eng, prompts, outs, constrained, label, seed)
                    produced = row["produced"]
                else:
                    row = timed_run(eng, prompts, produced, [False] * args.requests, label, seed)
                torch.cuda.synchronize()
            events = decode_profile.trace_events(prof)
            steps = engine_profile.steps_of(events)
            rows, _ = engine_profile.analyse(steps)
            kernels = {}
            for e in events:
                if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                    k = kernels.setdefault(e["name"][:80], [0, 0.0])
                    k[0] += 1
                    k[1] += e["dur"]
            top = sorted(kernels.items(), key=lambda kv_: -kv_[1][1])[:25]
            p = {"run": label, "wall_s": row["wall_s"], "tokens": row["tokens"], "steps": len(rows),
                 "engine_steps": row["steps"], "mask_ms": row["mask_ms"],
                 "span_s_sum": round(sum(r["span_us"] for r in rows) / 1e6, 4),
                 "gap_s_sum": round(sum(r["gap_us"] for r in rows if r["gap_us"] is not None) / 1e6, 4),
                 "span_us_median": statistics.median(r["span_us"] for r in rows) if rows else None,
                 "gap_us_median": statistics.median(r["gap_us"] for r in rows if r["gap_us"] is not None)
                 if len(rows) > 1 else None,
                 "kernels": [{"name": n, "count": c, "ms": round(t / 1e3, 3)} for n, (c, t) in top]}
            res["passes"].append(p)
            print("# %s %-11s wall %.3f s  device spans %.3f s  gaps %.3f s  (median span %.0f us, gap %.0f us)" % (
                shape, label, p["wall_s"], p["span_s_sum"], p["gap_s_sum"], p["span_us_median"] or 0,
                p["gap_us_median"] or 0), flush=True)
            for k in p["kernels"][:12]:
                print("#     %8.3f ms %6d  %s" % (k["ms"], k["count"], k["name"]), flush=True)
            ec.save_json(args.out, out)


def checkpoint_for(args, shape):
    """A shape's checkpoint: the real model given for it, else a random one with its tokenizer."""
    model = dict(m.split("=", 1) for m in args.model).get(shape)
    if model:
        return model, {"model": model}
    path, info = ec.checkpoint(shape)
    shutil.copy(os.path.join(args.tokenizers, shape, "tokenizer.json"), os.path.join(path, "tokenizer.json"))
    return path, info


def add_run_args(r):
    r.add_argument("--library", required=True)
    r.add_argument("--tokenizers", required=True, help="the folder `tokenizers` wrote")
    r.add_argument("--out", required=True)
    r.add_argument("--shapes", default="smollm2,1b")
    r.add_argument("--model", action="append", default=[], help="SHAPE=PATH: a real model for that shape")
    r.add_argument("--requests", type=int, default=64)
    r.add_argument("--reps", type=int, default=3)
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--dtype")
    r.add_argument("--weights", default="auto", help="nopad's weights (auto, native, f16, ...): a GGUF's blocks kept or not")
    r.add_argument("--seed", type=int, default=ec.SEED)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizers", help="write DIR/<shape>/tokenizer.json from SmolLM2's GGUF")
    t.add_argument("--gguf", required=True)
    t.add_argument("--out", required=True)
    for name in ("run", "profile"):
        r = sub.add_parser(name)
        add_run_args(r)
    args = ap.parse_args()
    if args.cmd == "tokenizers":
        for shape, n in VOCAB.items():
            print(shape, "ids %d, merges %d, special %d" % write_tokenizer(args.gguf, n, os.path.join(args.out, shape)))
        return
    os.environ["NOPAD_LIBRARY"] = os.path.abspath(args.library)
    import nopad
    args.dtype = args.dtype or ec.DTYPES[args.device]
    out = {"info": ec.env_info(args.device, args.library), "schema": SCHEMA, "shapes": []}
    out["info"]["args"] = vars(args)
    print(json.dumps(out["info"]), flush=True)
    for shape in args.shapes.split(","):
        try:
            (profile_shape if args.cmd == "profile" else run_shape)(args, nopad, shape, out)
        except Exception as e:  # noqa: BLE001
            out["shapes"].append({"shape": shape, "error": "%s: %s" % (type(e).__name__, e)})
            print("# %s: error %s" % (shape, e), flush=True)
        ec.save_json(args.out, out)


if __name__ == "__main__":
    main()
