#!/usr/bin/env bash
# Runs the `semsoft` command after installing what it needs (first run only).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/install.sh" core >&2
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python3}" -m semsoft_plugin "$@"
