"""Step 6 of the recipe: the confidence signals on held-out items, side by side.

Every signal gives, per item, a predicted answer, whether it is right, and a confidence;
each is scored by AUROC2 (telling right from wrong answers), ECE (10 equal bins, where
the confidence is a probability) and the ceiling rate (share >= 90%):

* **verbal** (:func:`verbal_signal`): the greedy answer and the "Confidence: NN%" stated
  with it, before or after training. An answer that names no label / is empty counts as
  wrong; AUROC2, ECE and the ceiling rate are over items with a readable confidence, and
  the parse rate (readable answer and confidence) is reported;
* **logit entropy**: minus the mean raw next-token entropy over that greedy answer line
  (the same pass, no extra cost; not a probability, so no ECE);
* **self-consistency** (:func:`self_consistency_signal`): the modal answer of the ``n``
  samples and the share that agree with it (the teacher; ``n`` times the cost);
* **constrained / Semantic Softmax top probability** (:func:`label_signals`, label tasks
  only): one forward pass over the label set through :func:`semsoft_plugin.hf.classify`;
  the argmax label and its probability. For open QA there is no label set and these do
  not apply.

Which one-pass signal is closest to self-consistency is measured by the Spearman rank
correlation of its confidence with the teacher's agreement on the same items.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from semsoft_eval.confidence import auroc2, ceiling_rate
from semsoft_eval.distill.data import QAItem, grade, qa_prompt
from semsoft_eval.distill.targets import SampledItem
from semsoft_eval.metrics import ece_numpy
from semsoft_eval.selfconsistency import verbal_readings

__all__ = [
    "Signal",
    "verbal_signal",
    "self_consistency_signal",
    "label_signals",
    "score",
    "closeness",
]


@dataclass
class Signal:
    """Per-item correctness and confidence of one signal (``None``: not readable)."""

    name: str
    correct: list[bool]
    confidence: list[float | None]
    probability: bool  # whether the confidence is a probability (ECE applies)
    seconds: float
    passes: str  # forward passes per item, in words
    parsed: list[bool] | None = None
    examples: list[dict[str, Any]] | None = None


def _round(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), 4)


def score(signal: Signal) -> dict[str, Any]:
    """AUROC2, ECE, ceiling rate, accuracy, parse rate and cost of one signal."""
    n = len(signal.correct)
    keep = [i for i, c in enumerate(signal.confidence) if c is not None]
    hits = np.array([signal.correct[i] for i in keep], dtype=bool)
    conf = np.array([signal.confidence[i] for i in keep], dtype=np.float64)
    out: dict[str, Any] = {
        "n": n,
        "accuracy": _round(float(np.mean(signal.correct))) if n else None,
        "n_scored": len(keep),
        "auroc2": _round(auroc2(hits, conf)) if len(keep) else None,
        "ece": _round(float(ece_numpy(conf, hits))) if signal.probability and len(keep) else None,
        "ceiling_rate": _round(ceiling_rate(conf)) if signal.probability and len(keep) else None,
        "mean_confidence": _round(float(conf.mean())) if signal.probability and len(keep) else None,
        "seconds_per_item": _round(signal.seconds / n) if n else None,
        "passes": signal.passes,
    }
    if signal.parsed is not None:
        out["parse_rate"] = _round(float(np.mean(signal.parsed))) if n else None
    if signal.examples is not None:
        out["examples"] = signal.examples
    return out


def verbal_signal(
    model: Any,
    tokenizer: Any,
    items: Sequence[QAItem],
    *,
    name: str = "verbal",
    batch_size: int = 8,
    match: str = "contains",
    max_new_tokens: int = 16,
    progress: bool | None = None,
) -> tuple[Signal, Signal]:
    """The verbal confidence and the logit entropy of the same greedy answers."""
    prompts = [qa_prompt(tokenizer, item, verbal=True) for item in items]
    start = time.perf_counter()
    readings = verbal_readings(
        model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
        keep_entropy=True, progress=progress,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    graded = [grade(r.answer, item, match=match) for r, item in zip(readings, items, strict=True)]
    correct = [ok for _, ok in graded]
    parsed = [
        key is not None and r.confidence is not None
        for (key, _), r in zip(graded, readings, strict=True)
    ]
    n_prefilled = sum(r.prefilled for r in readings)
    verbal = Signal(
        name=name,
        correct=correct,
        confidence=[r.confidence for r in readings],
        probability=True,
        seconds=seconds,
        passes=f"1 greedy generation (+1 short pre-filled pass on {n_prefilled}/{len(items)})",
        parsed=parsed,
        examples=[
            {"text": r.text, "confidence": r.confidence, "correct": bool(ok)}
            for r, ok in list(zip(readings, correct, strict=True))[:5]
        ],
    )
    # an empty answer line has no entropy: it counts as maximally uncertain
    entropy = Signal(
        name=f"{name} logit entropy",
        correct=correct,
        confidence=[
            -r.answer_entropy if r.answer_entropy is not None else -math.log(1e6) for r in readings
        ],
        probability=False,
        seconds=0.0,
        passes="0 extra (the greedy answer's pass)",
    )
    return verbal, entropy


def self_consistency_signal(sampled: Sequence[SampledItem], seconds: float | None) -> Signal:
    """The teacher: modal answer's correctness and agreement of the ``n`` samples."""
    n = len(sampled[0].samples) if sampled else 0
    return Signal(
        name=f"self-consistency (n={n})",
        correct=[s.modal_correct for s in sampled],
        confidence=[s.agreement for s in sampled],
        probability=True,
        seconds=seconds if seconds is not None else float("nan"),
        passes=f"{n} sampled generations",
    )


def label_signals(
    model: Any,
    tokenizer: Any,
    items: Sequence[QAItem],
    *,
    batch_size: int = 8,
    progress: bool | None = None,
) -> list[Signal]:
    """Constrained and Semantic Softmax top probability (one pass; label tasks only)."""
    from semsoft_plugin.hf import classify

    labels = items[0].labels
    if labels is None or any(item.labels != labels for item in items):
        raise ValueError("label_signals needs items of one label task (open QA has no label set)")
    prompts = [qa_prompt(tokenizer, item) for item in items]
    start = time.perf_counter()
    results = classify(
        model, tokenizer, prompts, list(labels), batch_size=batch_size, progress=progress
    )
    seconds = time.perf_counter() - start
    signals = []
    for name, field in (
        ("constrained top probability", "constrained_probs"),
        ("Semantic Softmax top probability", "probs"),
    ):
        correct, confidence = [], []
        for result, item in zip(results, items, strict=True):
            probs: dict[str, float] = getattr(result, field)
            top = max(probs, key=probs.__getitem__)
            correct.append(top in item.aliases)
            confidence.append(float(probs[top]))
        signals.append(
            Signal(
                name=name,
                correct=correct,
                confidence=confidence,  # type: ignore[arg-type]
                probability=True,
                seconds=seconds,
                passes="1 forward pass (both from the same pass)",
            )
        )
    return signals


def closeness(signal: Signal, teacher: Signal) -> float | None:
    """Spearman rank correlation of a signal's confidence with the teacher's (same items)."""
    from scipy.stats import spearmanr  # type: ignore[import-untyped]

    pairs = [
        (a, b)
        for a, b in zip(signal.confidence, teacher.confidence, strict=True)
        if a is not None and b is not None
    ]
    if len(pairs) < 3:
        return None
    x, y = zip(*pairs, strict=True)
    if len(set(x)) < 2 or len(set(y)) < 2:
        return None  # a constant confidence has no rank correlation
    return _round(float(spearmanr(x, y).statistic))
