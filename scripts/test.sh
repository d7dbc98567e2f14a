#!/usr/bin/env bash
# Installs the test dependencies (first run only), then runs the whole test suite.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/install.sh test
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
py="${PYTHON:-python3}"
"$py" -m mypy semsoft_plugin
exec "$py" -m pytest -q "$@"
