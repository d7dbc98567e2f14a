#!/usr/bin/env bash
# The quick start's install (scripts/install.sh core: torch + the package with its `hf`
# extra) timed both ways on a fresh virtual environment with empty package caches:
# pip, then uv (its own bootstrap, `pip install uv`, counted). scripts/install.sh keeps
# the faster (uv). Usage: bash benchmarks/perf/bench_install.sh  (run on demand; ~3 min).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

python3 -m venv "$tmp/pip" && python3 -m venv "$tmp/uv"
start=$SECONDS
PIP_CACHE_DIR="$tmp/pip-cache" "$tmp/pip/bin/python" -m pip install -q "torch==2.13.0" -e "$root[hf]" 2>&1 \
  | grep -v "^WARNING: Location" || true
pip_s=$((SECONDS - start))
start=$SECONDS
PIP_CACHE_DIR="$tmp/pip-cache-uv" "$tmp/uv/bin/python" -m pip install -q uv 2>&1 | grep -v "^WARNING: Location" || true
UV_CACHE_DIR="$tmp/uv-cache" UV_FIND_LINKS="${UV_FIND_LINKS:-${PIP_FIND_LINKS:-}}" \
  "$tmp/uv/bin/uv" pip install -q --python "$tmp/uv/bin/python" "torch==2.13.0" -e "$root[hf]"
uv_s=$((SECONDS - start))
for v in pip uv; do "$tmp/$v/bin/python" -c "import torch, transformers, semsoft_plugin"; done
echo "install (core: torch + .[hf]), fresh venv, empty caches: pip ${pip_s} s, uv ${uv_s} s (bootstrap included); $(nproc) cores, $(date -u +%F)"
