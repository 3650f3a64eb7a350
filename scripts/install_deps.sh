#!/usr/bin/env bash
# Installs what building and testing nopad needs on Debian 12: compilers, CMake, the C libraries
# (cJSON, utf8proc, PCRE2, OpenBLAS, cmocka, libmicrohttpd for nopad serve, Open MPI for tensor parallelism on the CPU), clang for the fuzzers, numpy + safetensors for the CLI
# tests (+ pytest for the Python package's tests, tokenizers for the live tokenizer parity test, the
# openai client and jinja2 for nopad serve's tests, jsonschema and pydantic as the grammar tests' references), and CUTLASS's headers (pip nvidia-cutlass) for
# the CUDA build. Safe to run again.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential cmake pkg-config clang libclang-rt-14-dev libomp-dev \
    libcjson-dev libutf8proc-dev libpcre2-dev libopenblas-dev libcmocka-dev libmicrohttpd-dev \
    libopenmpi-dev openmpi-bin \
    curl python3 python3-pip >/dev/null
# nvidia-cutlass: CUTLASS's headers for the CUDA build's fused-epilogue GEMMs (header-only; only
# the headers are used, so none of the wheel's Python dependencies are needed: --no-deps).
# tokenizers (Hugging Face's Rust library, pinned to the fixtures' version): the tokenizer parity
# test on random strings (tokenizer_random_parity: 10,000 per tokenizer file, 100,000 with
# scripts/test.sh --long) compares nopad with it live
python3 -m pip install --quiet --disable-pip-version-check numpy safetensors pytest tokenizers==0.23.3 openai jinja2 jsonschema pydantic 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages numpy safetensors pytest tokenizers==0.23.3 openai jinja2 jsonschema pydantic
python3 -m pip install --quiet --disable-pip-version-check --no-deps nvidia-cutlass==4.2.0.0 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check --no-deps --break-system-packages nvidia-cutlass==4.2.0.0
echo "nopad: dependencies installed" >&2
