#!/usr/bin/env bash
# Runs the `semsoft` command after installing what it needs (first run only), in the
# interpreter scripts/_python.sh picks: $PYTHON, the active virtual environment, or the
# checkout's own .venv (never the system Python).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/_python.sh"
py="$(semsoft_python "$root")"
PYTHON="$py" bash "$root/scripts/install.sh" core >&2
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false
exec "$py" -m semsoft_plugin "$@"
