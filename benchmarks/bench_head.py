"""Exact decision-step logits: the float32 head against the model's own bf16 head.

For one model and the first ``--items`` reviews of SST-2 dev (the quick start's kind of
data), three ways of scoring with :func:`semsoft_plugin.hf.classify`:

* ``bfloat16`` weights with the model's own head (logits rounded to bf16),
* ``bfloat16`` weights with the float32 head (:func:`semsoft_plugin.hf.float32_head`),
* ``float32`` weights.

Measured for each: ties (pairs of different texts with identical constrained
probabilities), the largest change of a row's Semantic Softmax and constrained
probabilities between batch size 1 and 8, the largest difference from the float32
model, and seconds per row (median of ``--repeats`` timed runs at batch 8). Run on
demand::

    python benchmarks/bench_head.py --model default --items 48
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
from semsoft_eval.prompts import TEMPLATES, build_inputs
from semsoft_plugin import models
from semsoft_plugin.hf import classify

WAYS = {
    "bf16 weights, bf16 head": ("bfloat16", False),
    "bf16 weights, float32 head": ("bfloat16", True),
    "float32 weights": ("float32", True),
}


def _probs(results: list[Any], names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    semantic = np.array([[r.probs[n] for n in names] for r in results])
    constrained = np.array([[r.constrained_probs[n] for n in names] for r in results])
    return semantic, constrained


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--items", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/head-{model}.json")
    args = parser.parse_args()

    data = load_builtin("sst2")
    texts, names = data.texts[: args.items], data.labels
    rows: dict[str, dict[str, Any]] = {}
    kept: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for way, (dtype, exact) in WAYS.items():
        model, tokenizer = models.load(args.model, dtype=dtype)
        inputs = build_inputs(TEMPLATES["sentiment"], texts, names, tokenizer)

        def run(
            batch: int, *, m: Any = model, t: Any = tokenizer, x: Any = inputs, e: bool = exact
        ) -> list[Any]:
            return classify(m, t, x, names, batch_size=batch, exact_head=e, progress=False)

        run(8)  # warm-up
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            batched = run(8)
            seconds.append((time.perf_counter() - start) / len(texts))
        single = run(1)
        sem8, con8 = _probs(batched, names)
        sem1, con1 = _probs(single, names)
        kept[way] = (sem8, con8)
        distinct = len({round(float(p), 12) for p in con8[:, 0]})
        rows[way] = {
            "seconds_per_row_batch8": statistics.median(seconds),
            "tied_texts": len(texts) - distinct,
            "batch1_vs_batch8_semantic": float(np.abs(sem1 - sem8).max()),
            "batch1_vs_batch8_constrained": float(np.abs(con1 - con8).max()),
        }
        del model
    reference = kept["float32 weights"]
    for way, (sem, con) in kept.items():
        rows[way]["vs_float32_semantic"] = float(np.abs(sem - reference[0]).max())
        rows[way]["vs_float32_constrained"] = float(np.abs(con - reference[1]).max())
    base = rows["bf16 weights, bf16 head"]["seconds_per_row_batch8"]
    for row in rows.values():
        row["time_vs_bf16_head"] = row["seconds_per_row_batch8"] / base
    result = {
        "model": args.model,
        "items": len(texts),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_bf16": models.default_dtype() == "bfloat16",
        "threads": torch.get_num_threads(),
        "ways": rows,
        "command": " ".join(["python", "benchmarks/bench_head.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out = Path(args.out.format(model=args.model))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"`{result['command']}` ({result['date']}, {result['machine']}, native bf16: "
        f"{result['cpu_bf16']}, {result['threads']} threads, {result['items']} SST-2 reviews)",
        "",
        "| way | s/row (batch 8) | time vs bf16 head | tied texts | max Δ batch 1 vs 8 "
        "(semantic / constrained) | max Δ vs float32 (semantic / constrained) |",
        "|---|---|---|---|---|---|",
    ]
    for way, r in rows.items():
        lines.append(
            f"| {way} | {r['seconds_per_row_batch8']:.3f} | {r['time_vs_bf16_head']:.2f}x | "
            f"{r['tied_texts']} | {r['batch1_vs_batch8_semantic']:.2g} / "
            f"{r['batch1_vs_batch8_constrained']:.2g} | {r['vs_float32_semantic']:.2g} / "
            f"{r['vs_float32_constrained']:.2g} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
