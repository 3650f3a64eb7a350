#!/usr/bin/env bash
# Prints the Unicode 9.0 tables of src/io/tokenizer_unicode.c (see scripts/unicode9_tables.c):
# fetches the PyPI sdist unicodedata2 9.0.0 for its Unicode 9.0 database header.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: unicodedata2==9.0.0 -d "$tmp" >&2
tar xzf "$tmp"/unicodedata2-9.0.0.tar.gz -C "$tmp"
gcc -O1 -w -I"$tmp"/unicodedata2-9.0.0/unicodedata2 "$here"/unicode9_tables.c -lutf8proc -o "$tmp"/gen
"$tmp"/gen
