#!/usr/bin/env python3
"""Tokenizer throughput: nopad against Hugging Face `tokenizers` on one thread.

    python3 bench/tokenizer_bench.py --library build/libnopad.so [--cli build-cli/nopad]
                                     [--only NAME ...] [--out results.json]

For every tokenizer of tests/data/tokenizer/parity/ (scripts/make_tokenizer_parity.py), encode
each line of tests/data/tokenizer/corpus.jsonl separately (special tokens added) and report
tokens per second: the corpus is encoded again and again until at least --min-time seconds have
passed, and the median of --repeats such runs is kept. Tokens are HF's count with special tokens.

    hf_encode        Tokenizer.encode(text) in a Python loop            (RAYON_NUM_THREADS=1)
    hf_batch         Tokenizer.encode_batch(texts), one call per pass   (RAYON_NUM_THREADS=1)
    nopad_ctypes     nopad_tokenize through ctypes in a Python loop
    nopad_c_loop     nopad_tokenize in a C loop: a 60-line driver compiled here with cc against
                     include/nopad.h and the library (nothing in src/); needs a C compiler
    ctypes_call_us   the cost of one ctypes call to a trivial function (nopad_tokenizer_vocab_size)
                     in the same loop: nopad_ctypes pays it once per line, so compare nopad_c_loop
                     with hf_batch and nopad_ctypes with hf_encode (which pays Python's call cost)
With --cli PATH, also `PATH tokenize --model DIR --input FILE` (a command the CLI may not have
yet) on the corpus written one text per line (line breaks inside a text become spaces), repeated
to take about a second, against HF encoding the lines of the same file (cli_file_s vs
hf_file_s: wall seconds, process start and tokenizer load included on nopad's side).

A tokenizer nopad cannot load is reported as "unsupported" with nopad's message; lines where nopad's
ids differ from HF's are counted (`mismatched_lines`), so a fast wrong answer is visible.
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import argparse  # noqa: E402
import ctypes  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "tokenizer")
PARITY = os.path.join(DATA, "parity")

C_DRIVER = r"""
/* Times nopad_tokenize over a file of records (uint32 length, bytes): passes over the whole
 * file until min_time seconds, `repeats` times; prints one line per repeat: passes seconds ids */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "nopad.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 5) return 2;
    nopad_tokenizer *tok = NULL;
    if (nopad_tokenizer_load(argv[1], &tok) != NOPAD_OK) {
        fprintf(stderr, "%s\n", nopad_last_error());
        return 3;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) return 4;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)size + 1);
    if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) return 4;
    fclose(f);
    double min_time = atof(argv[3]);
    int repeats = atoi(argv[4]);
    enum { CAP = 1 << 20 };
    int32_t *ids = malloc(CAP * sizeof *ids);
    for (int r = 0; r < repeats; r++) {
        long passes = 0, n_ids = 0;
        double t0 = now(), t = t0;
        while (t - t0 < min_time) {
            for (long off = 0; off < size;) {
                uint32_t len;
                memcpy(&len, data + off, 4);
                int32_t n = 0;
                if (nopad_tokenize(tok, data + off + 4, len, NULL, ids, CAP, &n) != NOPAD_OK) {
                    fprintf(stderr, "%s\n", nopad_last_error());
                    return 5;
                }
                n_ids += n;
                off += 4 + (long)len;
            }
            passes++;
            t = now();
        }
        printf("%ld %.9f %ld\n", passes, t - t0, n_ids);
    }
    nopad_tokenizer_free(tok);
    free(ids);
    free(data);
    return 0;
}
"""


def corpus_texts():
    with open(os.path.join(DATA, "corpus.jsonl"), encoding="utf-8") as f:
        return [bytes.fromhex(json.loads(line)["hex"]).decode("utf-8") for line in f]


def rate(run_pass, tokens_per_pass, min_time, repeats):
    """Median tokens/s over `repeats` runs of at least min_time seconds each."""
    rates = []
    run_pass()  # warm-up
    for _ in range(repeats):
        passes = 0
        t0 = time.perf_counter()
        while True:
            run_pass()
            passes += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        rates.append(passes * tokens_per_pass / dt)
    return statistics.median(rates)


class Nopad:
    def __init__(self, library):
        lib = ctypes.CDLL(library)
        lib.nopad_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.nopad_tokenizer_load.restype = ctypes.c_int
        lib.nopad_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                       ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32),
                                       ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]
        lib.nopad_tokenize.restype = ctypes.c_int
        lib.nopad_tokenizer_free.argtypes = [ctypes.c_void_p]
        lib.nopad_tokenizer_vocab_size.argtypes = [ctypes.c_void_p]
        lib.nopad_tokenizer_vocab_size.restype = ctypes.c_int32
        lib.nopad_last_error.restype = ctypes.c_char_p
        self.lib = lib
        self.path = os.path.abspath(library)

    def load(self, folder):
        tok = ctypes.c_void_p()
        if self.lib.nopad_tokenizer_load(folder.encode(), ctypes.byref(tok)) != 0:
            err = (self.lib.nopad_last_error() or b"").decode("utf-8", "replace")
            return None, err.replace(os.path.join(folder, "tokenizer.json") + ": ", "")
        return tok, None


def compile_driver(lib_path, workdir):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not cc:
        return None, "no C compiler"
    src = os.path.join(workdir, "tok_loop.c")
    exe = os.path.join(workdir, "tok_loop")
    with open(src, "w") as f:
        f.write(C_DRIVER)
    libdir = os.path.dirname(lib_path)
    cmd = [cc, "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-I", os.path.join(ROOT, "include"),
           src, "-o", exe, lib_path, "-Wl,-rpath," + libdir]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, "cc failed: " + (r.stderr.strip().splitlines() or ["?"])[0]
    return exe, None


def c_loop_rate(exe, folder, texts, min_time, repeats):
    records = os.path.join(folder, "records.bin")
    with open(records, "wb") as f:
        for t in texts:
            b = t.encode("utf-8")
            f.write(struct.pack("<I", len(b)) + b)
    r = subprocess.run([exe, folder, records, str(min_time), str(repeats)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        return None, None, "driver exit %d: %s" % (r.returncode, r.stderr.strip()[:200])
    runs = [line.split() for line in r.stdout.strip().splitlines()]
    rates = [int(n_ids) / float(secs) for _, secs, n_ids in runs]
    ids_per_pass = int(runs[0][2]) // int(runs[0][0])
    return statistics.median(rates), ids_per_pass, None


def cli_times(cli, folder, texts, hf, min_time):
    """(nopad CLI wall seconds, HF seconds, lines) on the same file, or an error message."""
    lines = [t.replace("\r", " ").replace("\n", " ") for t in texts]
    per_pass = sum(len(e.ids) for e in hf.encode_batch(lines))
    t0 = time.perf_counter()
    hf.encode_batch(lines)
    one = max(time.perf_counter() - t0, 1e-6)
    reps = max(1, int(min_time / one))
    body = "\n".join(lines) + "\n"
    path = os.path.join(folder, "input.txt")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for _ in range(reps):
            f.write(body)
    cmd = [cli, "tokenize", "--model", folder, "--input", path]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cli_s = time.perf_counter() - t0
    if r.returncode != 0:
        return None, "exit %d: %s" % (r.returncode, (r.stderr.strip().splitlines() or ["?"])[0])
    t0 = time.perf_counter()
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            hf.encode(line[:-1])
    hf_s = time.perf_counter() - t0
    return {"cli_file_s": cli_s, "hf_file_s": hf_s, "file_lines": reps * len(lines),
            "file_tokens": reps * per_pass}, None


def bench_one(name, texts, nopad, driver, args):
    src = os.path.join(PARITY, name + ".json")
    hf = Tokenizer.from_file(src)
    encs = hf.encode_batch(texts)
    want = [e.ids for e in encs]
    tokens = sum(len(w) for w in want)
    res = {"tokens_per_pass": tokens, "lines": len(texts)}
    res["hf_encode"] = rate(lambda: [hf.encode(t) for t in texts], tokens, args.min_time,
                            args.repeats)
    res["hf_batch"] = rate(lambda: hf.encode_batch(texts), tokens, args.min_time, args.repeats)
    if nopad is None:
        return res
    with tempfile.TemporaryDirectory() as d:
        shutil.copyfile(src, os.path.join(d, "tokenizer.json"))
        tok, err = nopad.load(d)
        if tok is None:
            res["nopad"] = "unsupported: " + (err.splitlines()[0] if err else "?")
            return res
        res["nopad"] = "ok"
        lib = nopad.lib
        cap = 1 << 20
        buf, got = (ctypes.c_int32 * cap)(), ctypes.c_int32()
        datas = [t.encode("utf-8") for t in texts]
        bad = 0
        for data, w in zip(datas, want):
            st = lib.nopad_tokenize(tok, data, len(data), None, buf, cap, ctypes.byref(got))
            if st != 0 or list(buf[:got.value]) != w:
                bad += 1
        res["mismatched_lines"] = bad
        tokenize = lib.nopad_tokenize
        ref = ctypes.byref(got)

        def nopad_pass():
            for data in datas:
                tokenize(tok, data, len(data), None, buf, cap, ref)

        res["nopad_ctypes"] = rate(nopad_pass, tokens, args.min_time, args.repeats)
        vocab_size = lib.nopad_tokenizer_vocab_size
        t0 = time.perf_counter()
        calls = 0
        while time.perf_counter() - t0 < 0.3:
            for data in datas:
                vocab_size(tok)
            calls += len(datas)
        res["ctypes_call_us"] = (time.perf_counter() - t0) / calls * 1e6
        if driver:
            r, ids_per_pass, err = c_loop_rate(driver, d, texts, args.min_time, args.repeats)
            if err:
                res["nopad_c_loop"] = err
            else:
                # rate in nopad's own id count; scaled to HF's count when they differ
                res["nopad_c_loop"] = r * tokens / ids_per_pass if ids_per_pass else r
        if args.cli:
            out, err = cli_times(args.cli, d, texts, hf, args.min_time)
            if err:
                res["nopad_cli"] = err
            else:
                res.update(out)
        lib.nopad_tokenizer_free(tok)
    return res


def fmt(v):
    if isinstance(v, (int, float)):
        return "%.2fM" % (v / 1e6) if v >= 1e5 else "%.0fk" % (v / 1e3)
    return "-" if v is None else str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--library", help="libnopad.so (omit: HF only)")
    ap.add_argument("--cli", help="a nopad CLI with a `tokenize --model DIR --input FILE` command")
    ap.add_argument("--only", nargs="*", help="tokenizer names (default: every parity file)")
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds per run (default 1)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per number, median (default 5)")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()

    names = args.only or sorted(f[:-5] for f in os.listdir(PARITY) if f.endswith(".json"))
    texts = corpus_texts()
    nopad = Nopad(args.library) if args.library else None
    driver = None
    tmp = tempfile.mkdtemp()
    driver_note = None
    if nopad:
        driver, driver_note = compile_driver(nopad.path, tmp)
    results = {}
    try:
        for name in names:
            results[name] = bench_one(name, texts, nopad, driver, args)
            r = results[name]
            print("%-26s hf %8s  hf_batch %8s  nopad %8s  c_loop %8s  %s" % (
                name, fmt(r["hf_encode"]), fmt(r["hf_batch"]), fmt(r.get("nopad_ctypes")),
                fmt(r.get("nopad_c_loop") if isinstance(r.get("nopad_c_loop"), float) else None),
                r.get("nopad", "") if r.get("nopad", "ok") != "ok"
                else "mismatched lines %d" % r["mismatched_lines"]), flush=True)
    finally:
        shutil.rmtree(tmp)

    print()
    print("tokens/s, one thread, %d corpus lines encoded one by one (median of %d runs of >= %g s)"
          % (len(texts), args.repeats, args.min_time))
    cols = ["hf_encode", "hf_batch", "nopad_ctypes", "nopad_c_loop"]
    print("| tokenizer | " + " | ".join(cols) + " | ctypes call | nopad / HF (C loop / batch) |")
    print("| --- " * (len(cols) + 3) + "|")
    for name, r in results.items():
        cells = [fmt(r.get(c)) if isinstance(r.get(c), (int, float)) else "-" for c in cols]
        if r.get("nopad", "ok") != "ok":
            cells[2] = "unsupported"
        ratio = "-"
        if isinstance(r.get("nopad_c_loop"), float):
            ratio = "%.2fx" % (r["nopad_c_loop"] / r["hf_batch"])
        call = "%.2f us" % r["ctypes_call_us"] if "ctypes_call_us" in r else "-"
        print("| %s | %s | %s | %s |" % (name, " | ".join(cells), call, ratio))
    if driver_note:
        print("nopad_c_loop not measured: %s" % driver_note)
    if args.cli:
        print()
        print("CLI on the same file (wall seconds; nopad includes process start and load):")
        for name, r in results.items():
            if "cli_file_s" in r:
                print("  %-26s nopad %.3f s  HF %.3f s  (%d lines, %d tokens)" % (
                    name, r["cli_file_s"], r["hf_file_s"], r["file_lines"], r["file_tokens"]))
            else:
                print("  %-26s %s" % (name, r.get("nopad_cli", r.get("nopad", "-"))))
    if args.out:
        meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                "host": platform.node(), "cpu": platform.processor() or platform.machine(),
                "python": platform.python_version(), "tokenizers": tokenizers.__version__,
                "library": args.library, "cli": args.cli, "min_time": args.min_time,
                "repeats": args.repeats, "corpus_lines": len(texts),
                "corpus_bytes": sum(len(t.encode("utf-8")) for t in texts),
                "rayon_threads": os.environ["RAYON_NUM_THREADS"], "c_driver": driver_note or "ok"}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
