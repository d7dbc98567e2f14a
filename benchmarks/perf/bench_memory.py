"""Peak resident memory of the README's file command, against the weights' own bytes.

For each embedded model, a fresh interpreter imports torch and transformers, reads its
resident set (the baseline), resets the kernel's peak counter (``/proc/self/clear_refs``),
and runs the README's command in-process::

    semsoft classify --input examples/reviews.csv --text-column text \\
        --labels positive,negative --output OUT.csv --model MODEL

The peak resident set above the baseline (``VmHWM`` minus the baseline ``VmRSS``) is
measured twice: when ``models.load`` returns (the load alone) and when the command ends
(load and scoring). It is divided by the parameter bytes as loaded: every distinct
parameter and buffer storage in its loaded dtype (a tied output embedding counted once,
as it is stored once; the decision head is float32 when the weights are, and a bf16
model's float32 head is computed chunk by chunk, with no float32 copy to count). The
target (issue 33) is a ratio of at most 1.3. A bf16 model loaded from a bf16 file is a
view of the memory-mapped file: its pages become resident as the first rows read them,
so its peak comes in scoring, not at load. Run on demand, one model at a time (Linux)::

    python benchmarks/perf/bench_memory.py          # the three embedded models, float32 and bf16
    python benchmarks/perf/bench_memory.py --models smollm2-135m --dtypes float32

Writes ``benchmarks/results/memory.json`` and ``memory.md`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
TARGET = 1.3


def _status(field: str) -> int:
    """``field`` of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _parameter_bytes(model: Any) -> int:
    """Bytes of every distinct parameter and buffer storage (tied weights once)."""
    seen: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def child(model_name: str, dtype: str) -> dict[str, Any]:
    """One measurement in this (fresh) process: the README command on ``model_name``."""
    import gc

    import torch  # noqa: F401  the baseline includes torch and transformers
    import transformers  # noqa: F401

    from semsoft_plugin.app.cli import main
    from semsoft_plugin.engines import models

    models.resolve(model_name)  # fetched and converted before the baseline, if needed
    gc.collect()
    baseline = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS from here on
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    imports = _status("VmRSS") - baseline  # transformers' model code, lazily imported
    seen: dict[str, Any] = {}
    load = models.load

    def recording_load(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        loaded, tokenizer = load(*args, **kwargs)
        seen["load_peak"] = _status("VmHWM") - baseline
        seen["after_load"] = _status("VmRSS") - baseline
        seen["parameter_bytes"] = _parameter_bytes(loaded)
        seen["dtype"] = str(next(loaded.parameters()).dtype).removeprefix("torch.")
        seen["parameters"] = sum(p.numel() for p in loaded.parameters())
        return loaded, tokenizer

    models.load = recording_load  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["classify", "--input", str(ROOT / "examples" / "reviews.csv")]
        argv += ["--text-column", "text", "--labels", "positive,negative"]
        argv += ["--output", str(Path(tmp) / "out.csv"), "--model", model_name]
        code = main(argv + ["--dtype", dtype])
    if code != 0:
        raise RuntimeError(f"semsoft classify exited {code} for {model_name}")
    peak = _status("VmHWM") - baseline
    params = seen["parameter_bytes"]
    return {
        "model": model_name,
        "dtype": seen["dtype"],
        "parameters": seen["parameters"],
        "parameter_bytes": params,
        "baseline_rss": baseline,
        "imports": imports,
        "load_peak": seen["load_peak"],
        "after_load": seen["after_load"],
        "peak": peak,
        "load_ratio": round(seen["load_peak"] / params, 3),
        "ratio": round(peak / params, 3),
        "ratio_less_imports": round((peak - imports) / params, 3),
    }


def markdown(result: dict[str, Any]) -> str:
    gb = 1e9
    lines = [
        "# Peak resident memory: load and score `examples/reviews.csv`",
        "",
        f"`python benchmarks/perf/bench_memory.py` ({result['cpu']}, torch {result['torch']}, "
        f"transformers {result['transformers']}). Peak RSS above the interpreter's "
        "baseline (after `import torch, transformers`), over the parameter bytes as "
        f"loaded; target at most {TARGET}x. *imports*: what importing transformers' model "
        "code (`AutoModelForCausalLM`, lazily imported) adds to the interpreter, the same "
        "for every model; *ratio less imports* leaves it out.",
        "",
        "| model | dtype | params (GB) | peak at load (GB) | after load (GB) "
        "| peak, load + score (GB) | ratio at load | **ratio** | imports (GB) "
        "| ratio less imports |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["models"]:
        lines.append(
            f"| {row['model']} | {row['dtype']} | {row['parameter_bytes'] / gb:.3f} "
            f"| {row['load_peak'] / gb:.3f} | {row['after_load'] / gb:.3f} "
            f"| {row['peak'] / gb:.3f} | {row['load_ratio']:.2f} | **{row['ratio']:.2f}** "
            f"| {row['imports'] / gb:.3f} | {row['ratio_less_imports']:.2f} |"
        )
    return "\n".join(lines)


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    parser.add_argument(
        "--dtypes",
        default="float32,bfloat16",
        help="comma-separated: float32 is what `auto` gives on a CPU without native bf16, "
        "bfloat16 what it gives on one with it",
    )
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "memory.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.dtypes)))
        return

    import torch
    import transformers

    rows = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's semsoft_plugin
    for dtype in args.dtypes.split(","):
        for name in args.models.split(","):
            command = [sys.executable, __file__, "--child", name, "--dtypes", dtype]
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
            if done.returncode != 0:
                raise SystemExit(f"{name}: the measurement failed\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {
        "cpu": _cpu(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "target_ratio": TARGET,
        "models": rows,
    }
    from semsoft_eval.benchmarking import write_results

    write_results(result, args.out, markdown(result))


if __name__ == "__main__":
    main()
