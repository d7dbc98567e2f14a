"""Exact decision-step logits: the float32 head against the model's own bf16 head.

For one model and the first ``--items`` reviews of SST-2 dev (the quick start's kind of
data), three ways of scoring through :class:`semsoft_plugin.app.classifier.Classifier`
(``--backend hf``: transformers, ``--backend vllm``: a ``vllm.LLM``):

* ``bfloat16`` weights with the model's own head (logits rounded to bf16),
* ``bfloat16`` weights with the float32 head (transformers:
  :func:`semsoft_plugin.engines.hf.float32_head`; vLLM: ``hf_overrides={"head_dtype":
  "float32"}``),
* ``float32`` weights.

Measured for each: ties (pairs of different texts with identical constrained
probabilities), the largest change of a row's Semantic Softmax and constrained
probabilities between scoring the texts one at a time and in batches of 8
(transformers) or all at once (vLLM schedules its own batches), the largest difference
from the float32 model, and seconds per row (median of ``--repeats`` timed runs). Run on
demand::

    python benchmarks/perf/bench_head.py --model default --items 48
    VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/perf/bench_head.py --backend vllm --items 48

(vLLM in its default multiprocess mode: the in-process engine cannot be built a second
time in one process.)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from semsoft_eval.data import load_builtin
from semsoft_plugin.app.classifier import Classifier
from semsoft_plugin.app.engine_settings import EngineSettings
from semsoft_plugin.app.predictions import Predictions
from semsoft_plugin.engines import models

WAYS = {
    "bf16 weights, bf16 head": ("bfloat16", False),
    "bf16 weights, float32 head": ("bfloat16", True),
    "float32 weights": ("float32", True),
}


def _classifier(backend: str, model: str, labels: list[str], dtype: str, exact: bool) -> Any:
    if backend == "vllm":
        head = "float32" if exact else "model"
        engine = {"dtype": dtype, "hf_overrides": {"head_dtype": head}, "enforce_eager": True}
        settings = EngineSettings(engine_args=engine)
        return Classifier.from_pretrained(model, labels, backend="vllm", engine=settings)
    settings = EngineSettings(dtype=dtype, batch_size=8, exact_head=exact)
    return Classifier.from_pretrained(model, labels, engine=settings)


def _rows(clf: Any, texts: list[str], one_at_a_time: bool) -> Predictions:
    if not one_at_a_time:
        return clf.predict_details(texts)
    parts = [clf.predict_details([t]) for t in texts]
    return Predictions(
        parts[0].labels,
        [p.label[0] for p in parts],
        np.vstack([p.probs for p in parts]),
        np.vstack([p.constrained_probs for p in parts]),
        np.concatenate([p.coverage for p in parts]),
        np.concatenate([p.fallback for p in parts]),
        np.concatenate([p.truncated for p in parts]),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--model", default="default")
    parser.add_argument("--items", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/head-{backend}-{model}.json")
    args = parser.parse_args()

    data = load_builtin("sst2")
    texts, names = list(data.texts[: args.items]), list(data.labels)
    rows: dict[str, dict[str, Any]] = {}
    kept: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for way, (dtype, exact) in WAYS.items():
        clf = _classifier(args.backend, args.model, names, dtype, exact)
        _rows(clf, texts[:8], False)  # warm-up
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            batched = _rows(clf, texts, False)
            seconds.append((time.perf_counter() - start) / len(texts))
        single = _rows(clf, texts, True)
        kept[way] = (batched.probs, batched.constrained_probs)
        distinct = len({round(float(p), 12) for p in batched.constrained_probs[:, 0]})
        rows[way] = {
            "seconds_per_row": statistics.median(seconds),
            "tied_texts": len(texts) - distinct,
            "one_vs_batched_semantic": float(np.abs(single.probs - batched.probs).max()),
            "one_vs_batched_constrained": float(
                np.abs(single.constrained_probs - batched.constrained_probs).max()
            ),
        }
        del clf
    reference = kept["float32 weights"]
    for way, (sem, con) in kept.items():
        rows[way]["vs_float32_semantic"] = float(np.abs(sem - reference[0]).max())
        rows[way]["vs_float32_constrained"] = float(np.abs(con - reference[1]).max())
    base = rows["bf16 weights, bf16 head"]["seconds_per_row"]
    for row in rows.values():
        row["time_vs_bf16_head"] = row["seconds_per_row"] / base
    result = {
        "backend": args.backend,
        "model": args.model,
        "items": len(texts),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_bf16": models.default_dtype() == "bfloat16",
        "threads": torch.get_num_threads(),
        "ways": rows,
        "command": " ".join(["python", "benchmarks/perf/bench_head.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out = Path(args.out.format(backend=args.backend, model=args.model))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"`{result['command']}` ({result['date']}, {result['machine']}, native bf16: "
        f"{result['cpu_bf16']}, {result['threads']} threads, {result['items']} SST-2 reviews)",
        "",
        f"| way ({args.backend}) | s/row | time vs bf16 head | tied texts | max Δ one at a time vs batched "
        "(semantic / constrained) | max Δ vs float32 (semantic / constrained) |",
        "|---|---|---|---|---|---|",
    ]
    for way, r in rows.items():
        lines.append(
            f"| {way} | {r['seconds_per_row']:.3f} | {r['time_vs_bf16_head']:.2f}x | "
            f"{r['tied_texts']} | {r['one_vs_batched_semantic']:.2g} / "
            f"{r['one_vs_batched_constrained']:.2g} | {r['vs_float32_semantic']:.2g} / "
            f"{r['vs_float32_constrained']:.2g} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
