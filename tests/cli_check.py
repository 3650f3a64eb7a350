"""Numeric checks for the CLI tests (tests/cli_*.sh): reads the `nopad embed` outputs (.npy or
.jsonl) and the golden safetensors fixtures, compares them, exits 1 with a message on a mismatch.

    cli_check.py golden-ids GOLDEN IDS_TXT KEEP_JSON   ids lines of the golden sequences, and
                                                       the list of those with all-zero types
    cli_check.py hidden GOT GOLDEN KEEP_JSON TOL       per-token output vs last_hidden_state
    cli_check.py pooling GOT HIDDEN GOLDEN MODE TOL    pooled output vs pooling HIDDEN (the
                                                       per-token output of all of GOLDEN's
                                                       sequences) here
    cli_check.py cosine GOT GOLDEN KEY MIN_COS [KEEP_JSON]
                                                       pooled output vs golden[KEY], per row
    KEEP_JSON: a JSON list of the golden sequences to compare, or "all".
    cli_check.py same A B TOL                          two outputs agree (row-relative error)
    cli_check.py shape FILE ROWS COLS                  output has ROWS x COLS floats
    cli_check.py unit-norm FILE                        every row has L2 norm 1
    cli_check.py json-get FILE KEY                     prints a key of a JSON object file
    cli_check.py count GOLDEN                          prints B and T of a golden file
    cli_check.py has GOLDEN KEY                        exit status 0 when GOLDEN holds KEY

Only numpy is needed: safetensors files are read by the small parser below.
"""
import json
import struct
import sys

import numpy as np

ST_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I32": "<i4", "I64": "<i8"}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        out[name] = np.frombuffer(data[base + begin : base + end], dtype=ST_DTYPES[t["dtype"]]).reshape(
            t["shape"]
        )
    return out


def load_output(path):
    """An embed output as a 2-D float array: [B, H] pooled or [T, H] per token."""
    if path.endswith(".npy"):
        a = np.load(path)
        if a.dtype != np.float32 or a.ndim != 2:
            fail(f"{path}: expected a 2-D float32 array, got {a.dtype} {a.shape}")
        return a
    rows = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            v = json.loads(line)
            if not isinstance(v, list) or not v:
                fail(f"{path}:{line_no}: expected a non-empty JSON array")
            if isinstance(v[0], list):  # --pooling none: one array per token
                rows.extend(v)
            else:
                rows.append(v)
    return np.array(rows, dtype=np.float32)


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def row_rel_error(a, b):
    """max over rows of |a_r - b_r|_2 / max(|b_r|_2, 1e-6), as tests/testutil.c."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    num = np.linalg.norm(a - b, axis=1)
    den = np.maximum(np.linalg.norm(b, axis=1), 1e-6)
    return float((num / den).max()) if len(a) else 0.0


def load_keep(keep_path):
    return None if keep_path in (None, "all") else json.load(open(keep_path))


def golden_sequences(golden, keep=None):
    cu = golden["cu_seqlens"].astype(np.int64)
    seqs = [(int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)]
    return seqs if keep is None else [seqs[i] for i in keep]


def cmd_golden_ids(golden_path, ids_path, keep_path):
    # Every golden sequence becomes a line. The CLI passes no token type ids (all zero), so KEEP
    # lists only the sequences whose golden token types are all zero: the comparable ones.
    g = load_safetensors(golden_path)
    types = g.get("token_type_ids")
    keep = []
    with open(ids_path, "w") as f:
        for i, (b, e) in enumerate(golden_sequences(g)):
            if types is None or not np.any(types[b:e] != 0):
                keep.append(i)
            f.write(" ".join(str(int(x)) for x in g["input_ids"][b:e]) + "\n")
    with open(keep_path, "w") as f:
        json.dump(keep, f)
    print(f"{len(keep)} of {len(golden_sequences(g))} sequences have all-zero token types")


def cmd_hidden(got_path, golden_path, keep_path, tol):
    """GOT holds the per-token states of all of GOLDEN's sequences; KEEP's are compared."""
    g = load_safetensors(golden_path)
    want = g["last_hidden_state"]
    got = load_output(got_path)
    if got.shape != want.shape:
        fail(f"{got_path}: shape {got.shape}, expected {want.shape}")
    rows = [np.arange(b, e) for b, e in golden_sequences(g, load_keep(keep_path))]
    if not rows:
        print("  no comparable sequence (all have non-zero token types)")
        return
    rows = np.concatenate(rows)
    err = row_rel_error(got[rows], want[rows])
    print(f"  {len(rows)} of {len(want)} tokens compared: row-relative error {err:.3g} (tolerance {tol})")
    if not err <= float(tol):
        fail(f"{got_path}: row-relative error {err:.3g} > {tol}")


def cmd_pooling(got_path, hidden_path, golden_path, mode, tol):
    g = load_safetensors(golden_path)
    hidden = load_output(hidden_path).astype(np.float64)
    rows = []
    for b, e in golden_sequences(g):
        h = hidden[b:e]
        rows.append({"cls": h[0], "mean": h.mean(axis=0), "max": h.max(axis=0)}[mode])
    want = np.array(rows)
    got = load_output(got_path)
    if got.shape != want.shape:
        fail(f"{got_path}: shape {got.shape}, expected {want.shape}")
    err = row_rel_error(got, want)
    if not err <= float(tol):
        fail(f"{got_path}: {mode} pooling differs from pooling the hidden states: {err:.3g} > {tol}")


def cmd_cosine(got_path, golden_path, key, min_cos, keep_path="all"):
    """Per-row cosine of GOT against golden[KEY] on KEEP's rows. GOT holds either all the
    golden's rows or just KEEP's (e.g. the sequences that exist as text)."""
    want = load_safetensors(golden_path)[key].astype(np.float64)
    got = load_output(got_path).astype(np.float64)
    keep = load_keep(keep_path)
    if keep is not None:
        if got.shape[0] == want.shape[0]:
            got = got[keep]
        want = want[keep]
    if got.shape != want.shape:
        fail(f"{got_path}: shape {got.shape}, expected {want.shape}")
    cos = (got * want).sum(1) / np.maximum(np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1), 1e-30)
    worst = int(cos.argmin())
    print(f"  {len(cos)} rows: min cosine {cos.min():.7f} (row {worst}), row-relative error {row_rel_error(got, want):.3g}")
    if not cos.min() >= float(min_cos):
        fail(f"{got_path}: row {worst} has cosine {cos[worst]:.7f} < {min_cos}")


def cmd_same(a_path, b_path, tol):
    a, b = load_output(a_path), load_output(b_path)
    if a.shape != b.shape:
        fail(f"{a_path} {a.shape} and {b_path} {b.shape} differ in shape")
    err = row_rel_error(a, b)
    if not err <= float(tol):
        fail(f"{a_path} and {b_path} differ: row-relative error {err:.3g} > {tol}")


def cmd_shape(path, rows, cols):
    a = load_output(path)
    if a.shape != (int(rows), int(cols)):
        fail(f"{path}: shape {a.shape}, expected ({rows}, {cols})")


def cmd_unit_norm(path):
    n = np.linalg.norm(load_output(path).astype(np.float64), axis=1)
    if not np.all(np.abs(n - 1) < 1e-5):
        fail(f"{path}: row norms {n.min():.6f}..{n.max():.6f}, expected 1")


def cmd_json_get(path, key):
    print(json.load(open(path))[key])


def cmd_count(golden_path):
    cu = load_safetensors(golden_path)["cu_seqlens"]
    print(len(cu) - 1, int(cu[-1]))


def cmd_has(golden_path, key):
    sys.exit(0 if key in load_safetensors(golden_path) else 1)


COMMANDS = {
    "has": cmd_has,
    "golden-ids": cmd_golden_ids,
    "hidden": cmd_hidden,
    "pooling": cmd_pooling,
    "cosine": cmd_cosine,
    "same": cmd_same,
    "shape": cmd_shape,
    "unit-norm": cmd_unit_norm,
    "json-get": cmd_json_get,
    "count": cmd_count,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        fail(f"usage: {sys.argv[0]} {'|'.join(COMMANDS)} ...")
    COMMANDS[sys.argv[1]](*sys.argv[2:])
