# Shared by the `nopad train` CLI tests (sourced, not a test itself): a temporary folder removed at
# exit, D (the tiny BERTs of tests/data/train), fail counting and the closing verdict, and
# bare_model: the MLM checkpoint stripped to a bare BertModel.
: "${NOPAD_CLI:?NOPAD_CLI must name the nopad binary}"
: "${NOPAD_TEST_DATA:?NOPAD_TEST_DATA must name tests/data}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
D="$NOPAD_TEST_DATA/train"
failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# finish NAME: exit 1 naming the failure count, or say all passed.
finish() {
    if [ "$failures" -ne 0 ]; then
        echo "$1: $failures failure(s)" >&2
        exit 1
    fi
    echo "$1: all passed"
}

# bare_model DIR: DIR (made) holds the MLM checkpoint of $D/bert_mlm as a bare BertModel, as a
# sentence-transformers folder is (cls.predictions.* dropped, "bert." stripped), with vocab.txt.
bare_model() {
    mkdir -p "$1"
    cp "$D/vocab.txt" "$1/"
    python3 - "$D/bert_mlm" "$1" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
blob = open(src + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
data = blob[8 + n:]
out, parts, offset = {}, [], 0
for name, t in header.items():
    if name == "__metadata__" or not name.startswith("bert."):
        continue  # cls.predictions.* dropped
    a, b = t["data_offsets"]
    out[name[len("bert."):]] = dict(t, data_offsets=[offset, offset + b - a])
    parts.append(data[a:b])
    offset += b - a
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(dst + "/model.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(parts))
cfg = json.load(open(src + "/config.json"))
cfg["architectures"] = ["BertModel"]
json.dump(cfg, open(dst + "/config.json", "w"))
PY
}
