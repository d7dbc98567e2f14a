#!/usr/bin/env bash
# Installs the test dependencies (first run only), then runs CI's two lanes:
#   fast: ruff on the whole repository, mypy on both packages, the documentation site
#         (mkdocs build --strict into a temporary folder: warnings are errors, a dead link
#         is one; tests/test_site.py then checks that build's HTML), every test
#         that starts no engine (pytest -m "not engine": the math, the adapters on the small
#         model, the CLI, the readers, the eval, the docstring examples); a failure here
#         stops before the slow lane.
#   slow: the tests that start vLLM, Outlines or a vLLM server (pytest -m engine), with the
#         15 slowest listed so that the lane's cost stays visible.
# The `engine` marker is set by tests/conftest.py from what each test requests.
# Extra arguments go to both pytest runs (e.g. a test file, -x, -k NAME).
# The interpreter is the one scripts/_python.sh picks (never the system Python).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
source scripts/_python.sh
py="$(semsoft_python "$root")"
PYTHON="$py" bash scripts/install.sh test
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

# The engines must import: otherwise every engine test would skip and the slow lane
# would pass having tested nothing.
"$py" -c "import vllm, outlines, openai, ray.data" || {
  echo "test.sh: the engines (vllm, outlines, openai, ray) do not import: the slow lane cannot run" >&2
  exit 1
}

# pytest exits 5 when a selection holds no test. With no arguments that means a lane
# lost its tests (a marker or collection broke): a failure. With a selection (a file,
# -k NAME) a lane may legitimately hold none.
lane() {
  local status=0
  "$py" -m pytest -q "$@" || status=$?
  [ "$status" -eq 0 ] || { [ "$status" -eq 5 ] && [ "$selected" -eq 1 ]; }
}
selected=$(( $# > 0 ? 1 : 0 ))

start=$SECONDS
"$py" -m ruff check .
"$py" -m mypy semsoft_plugin semsoft_eval
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 "$py" -m mkdocs build --strict --quiet --site-dir "$site"
# tests/test_site.py reads this build instead of building the site again.
export SEMSOFT_SITE_DIR="$site"
lane -m "not engine" "$@"
echo "CI fast lane (ruff, mypy, docs, engine-free tests): passed in $((SECONDS - start)) s"

start=$SECONDS
lane -m engine --durations=15 "$@"
echo "CI slow lane (vLLM, Outlines, server tests): passed in $((SECONDS - start)) s"
