"""Forward passes and time of a model selection: ``GridSearchCV`` over ``semantic_weight``.

``GridSearchCV(Classifier(...), {"config__semantic_weight": [0, 0.3, 1]}, cv=3)`` on ``--texts``
labelled texts (the stored SST-2 sample ``tests/data/sst2/dev.txt`` and the reviews of
``tests/data/reviews/reviews.tsv``), timed twice in one
process on the same loaded model:

* ``without the cache``: :data:`semsoft_plugin.app.pass_cache.PASSES` bounded at 0 bytes,
  so every fit, prediction and score runs its own forward passes, as before the cache
  (a repeated text within one call is still run once);
* ``with the cache``: the process-wide cache of kept passes (the default), so every text
  runs one forward pass whatever the candidates and folds.

Passes are counted where they run (the transformers adapter's ``classify``). The fit is the
default family (every member; ``semantic_weight`` is the search's, so fit keeps it). The
scores of both runs are compared: the cache never changes one. The freshness check that
keys each kept pass by the model's and tokenizer's state now is timed where it runs. Run::

    python benchmarks/perf/bench_grid_search.py --texts 60 --model smollm2-135m --dtype float32 \\
        --out benchmarks/results/grid-search-passes.json
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.model_selection import GridSearchCV

import semsoft_plugin.engines.hf as hf
from semsoft_eval.benchmarking import write_results
from semsoft_plugin import Classifier
from semsoft_plugin.app.engine_settings import EngineSettings
from semsoft_plugin.app.handles import Loaded
from semsoft_plugin.app.pass_cache import PASSES
from semsoft_plugin.core.fit_policy import FitPolicy

ROOT = Path(__file__).resolve().parents[2]
SST2 = ROOT / "tests" / "data" / "sst2" / "dev.txt"
REVIEWS = ROOT / "tests" / "data" / "reviews" / "reviews.tsv"
GRID = {"semantic_weight": [0.0, 0.3, 1.0]}


def _texts(n: int) -> tuple[list[str], np.ndarray]:
    """``n`` distinct labelled texts (at most 60), alternating negative and positive: the
    stored SST-2 sample's 48, then the 12 reviews written for the tests."""
    rows = [line.split(" ", 1) for line in SST2.read_text("utf-8").splitlines() if line.strip()]
    extra = [line.split("\t", 1) for line in REVIEWS.read_text("utf-8").splitlines()[1:]]
    rows += [("0" if label == "negative" else "1", text) for label, text in extra]
    neg = [t.strip() for label, t in rows if label == "0"]
    pos = [t.strip() for label, t in rows if label == "1"]
    texts = [t for pair in zip(neg, pos, strict=False) for t in pair][:n]
    return texts, np.array(["negative", "positive"] * (len(texts) // 2))


def _search(model: str, dtype: str, texts: list[str], y: np.ndarray) -> dict[str, Any]:
    passes: list[int] = []
    real = hf.classify

    def counting(model_, tokenizer, inputs, labels, **kwargs):  # type: ignore[no-untyped-def]
        inputs = list(inputs)
        passes.append(len(inputs))
        return real(model_, tokenizer, inputs, labels, **kwargs)

    # The freshness check of kept passes (the model's and tokenizer's state, read on every
    # call) is timed where it runs.
    checks: list[float] = []
    real_state = Loaded.state

    def timed_state(self: Loaded) -> str:
        start = time.perf_counter()
        try:
            return real_state(self)
        finally:
            checks.append(time.perf_counter() - start)

    hf.classify = counting  # type: ignore[assignment]
    Loaded.state = timed_state  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        # the policy leaves the weight out of the fit's own grid: the search's value is scored
        clf = Classifier(model, labels=["negative", "positive"], engine=EngineSettings(dtype=dtype),
                         fit_policy=FitPolicy(grid={}))  # fmt: skip
        search = GridSearchCV(clf, GRID, cv=3).fit(texts, y)
        seconds = time.perf_counter() - start
    finally:
        hf.classify = real  # type: ignore[assignment]
        Loaded.state = real_state  # type: ignore[method-assign]
    return {
        "forward_passes": int(sum(passes)),
        "seconds": round(seconds, 1),
        "state_checks": len(checks),
        "state_check_seconds": round(sum(checks), 2),
        "state_check_median_ms": round(1000 * float(np.median(checks)), 1) if checks else None,
        "state_check_share": round(sum(checks) / seconds, 4),
        "mean_test_score": [float(s) for s in search.cv_results_["mean_test_score"]],
        "best_params": search.best_params_,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=60)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/grid-search-passes.json"))
    args = parser.parse_args()
    texts, y = _texts(args.texts)
    engine = EngineSettings(dtype=args.dtype)
    Classifier(args.model, labels=["negative", "positive"], engine=engine).predict(texts[:1])
    old = PASSES.resize(0)
    try:
        before = _search(args.model, args.dtype, texts, y)
    finally:
        PASSES.resize(old)
    PASSES.clear()
    after = _search(args.model, args.dtype, texts, y)
    same = np.allclose(before["mean_test_score"], after["mean_test_score"], rtol=0, atol=1e-12)
    result = {
        "command": (
            f"python benchmarks/perf/bench_grid_search.py --texts {args.texts} --model {args.model} "
            f"--dtype {args.dtype}"
        ),
        "model": args.model, "dtype": args.dtype, "texts": args.texts, "grid": GRID, "cv": 3,
        "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "load": round(os.getloadavg()[0], 1),
        "without_cache": before, "with_cache": after, "same_scores": bool(same),
    }  # fmt: skip
    text = "\n".join([
        f"# GridSearchCV over semantic_weight: forward passes and time ({args.texts} texts)",
        "",
        f"`{result['command']}` ({args.model}, {args.dtype} weights, {result['threads']} "
        f"thread(s), load {result['load']} on a shared machine). `GridSearchCV(Classifier(...), "
        f"{GRID}, cv=3)`, the default fit family; the same scores with and without the cache: "
        f"{same}. With the cache every text runs once, and so do the three content-free "
        "prompts of the family's member `contextual` (N/A, empty, [MASK]): texts + 3 passes.",
        "",
        "| | forward passes | seconds |",
        "|---|---|---|",
        f"| without the cache (every fit and prediction runs its passes) | "
        f"{before['forward_passes']} | {before['seconds']} |",
        f"| with the cache of kept passes | {after['forward_passes']} | {after['seconds']} |",
        "",
        "The freshness check (the model's and the tokenizer's state, read on every call so "
        "that a model changed in place is never read from old passes): "
        f"{after['state_checks']} checks, median {after['state_check_median_ms']} ms, "
        f"{after['state_check_seconds']} s in all: {100 * after['state_check_share']:.1f}% "
        "of the run with the cache.",
    ])  # fmt: skip
    write_results(result, args.out, text)


if __name__ == "__main__":
    main()
