#!/usr/bin/env bash
# Installs the test dependencies (first run only), then runs CI's two lanes:
#   fast: ruff on the whole repository, mypy on both packages, every test that starts no
#         engine (pytest -m "not engine": the math, the adapters on the small default
#         model, the CLI, the readers, the eval); a failure here stops before the slow lane.
#   slow: the tests that start vLLM, Outlines or a vLLM server (pytest -m engine), with the
#         15 slowest listed so that the lane's cost stays visible.
# The `engine` marker is set by tests/conftest.py from what each test requests.
# Extra arguments go to both pytest runs (e.g. a test file, -x, -k NAME).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/install.sh test
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
py="${PYTHON:-python3}"

# pytest exits 5 when a selection holds no test (e.g. a file with no engine test).
lane() {
  local status=0
  "$py" -m pytest -q "$@" || status=$?
  [ "$status" -eq 0 ] || [ "$status" -eq 5 ]
}

start=$SECONDS
"$py" -m ruff check .
"$py" -m mypy semsoft_plugin semsoft_eval
lane -m "not engine" "$@"
echo "CI fast lane (ruff, mypy, engine-free tests): passed in $((SECONDS - start)) s"

start=$SECONDS
lane -m engine --durations=15 "$@"
echo "CI slow lane (vLLM, Outlines, server tests): passed in $((SECONDS - start)) s"
