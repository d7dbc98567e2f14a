"""Step 6 of the recipe: the confidence signals on held-out items, side by side.

Every signal gives, per item, a predicted answer, whether it is right, and a confidence,
scored by AUROC2, ECE (10 equal bins, where the confidence is a probability) and the
ceiling rate (share >= 90%): [`verbal_signal`][semsoft_eval.distill.evaluation.verbal_signal],
the logit entropy of its answer line,
[`self_consistency_signal`][semsoft_eval.distill.evaluation.self_consistency_signal],
[`label_signals`][semsoft_eval.distill.evaluation.label_signals] (label tasks only) and
[`stated_value_signal`][semsoft_eval.distill.evaluation.stated_value_signal]. The Spearman
correlation of each one-pass signal with the teacher's agreement says which is closest
to self-consistency. What each signal reads: docs/distillation.md ("The signals").
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from semsoft_eval.confidence import (
    PAPER_TARGETS,
    auroc2,
    auroc2_interval,
    ceiling_rate,
    format_confidence,
)
from semsoft_eval.distill.data import QAItem, grade, qa_prompt
from semsoft_eval.distill.targets import SampledItem
from semsoft_eval.metrics import ece_numpy
from semsoft_eval.selfconsistency import verbal_readings

__all__ = [
    "Signal",
    "verbal_signal",
    "self_consistency_signal",
    "label_signals",
    "stated_value_signal",
    "stated_values",
    "score",
    "closeness",
]


@dataclass
class Signal:
    """Per-item correctness and confidence of one signal (`None`: not readable)."""

    name: str
    correct: list[bool]
    confidence: list[float | None]
    probability: bool  # whether the confidence is a probability (ECE applies)
    seconds: float
    passes: str  # forward passes per item, in words
    parsed: list[bool] | None = None
    examples: list[dict[str, Any]] | None = None
    answers: list[str] | None = None  # verbal: each greedy answer line, as generated


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
        "auroc2_ci95": [_round(v) for v in auroc2_interval(hits, conf)] if len(keep) else None,
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
    max_tokens: int = 16,
    progress: bool | None = None,
) -> tuple[Signal, Signal]:
    """The verbal confidence and the logit entropy of the same greedy answers."""
    prompts = [qa_prompt(tokenizer, item, verbal=True) for item in items]
    start = time.perf_counter()
    readings = verbal_readings(
        model, tokenizer, prompts, batch_size=batch_size, max_tokens=max_tokens,
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
        answers=[r.text.split("\n")[0] for r in readings],
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
    """The teacher: modal answer's correctness and agreement of the `n` samples."""
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
    from semsoft_plugin.engines.hf import classify

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


def stated_values(signal: Signal) -> dict[str, int]:
    """How often each confidence was stated (`"none"`: unreadable), most common first."""
    counts = Counter("none" if c is None else f"{round(c * 100)}%" for c in signal.confidence)
    return dict(counts.most_common())


def stated_value_signal(
    model: Any,
    tokenizer: Any,
    items: Sequence[QAItem],
    verbal: Signal,
    *,
    name: str = "verbal, expected stated value",
    values: Sequence[int] = tuple(sorted(set(PAPER_TARGETS.values()))),
) -> Signal:
    """The expectation of the taught confidence statements after each greedy answer.

    For item `i` with greedy answer line `a_i` (`verbal.answers`) and the statements
    `s_v = "\\nConfidence: v%"` + EOS for `v` in `values`,

    $$
    c_i = \\sum_v v \\, \\frac{p(s_v \\mid x_i, a_i)}{\\sum_u p(s_u \\mid x_i, a_i)},
    $$

    with `p` the product of the model's next-token probabilities over the statement's
    tokens, tokenised as in training (prompt, then the completion). Correctness is the
    greedy answer's (`verbal.correct`), so only the confidence reading differs.
    """
    import torch

    from semsoft_plugin.engines.prompting import encode_prompts, format_prompt

    if verbal.answers is None or len(verbal.answers) != len(items):
        raise ValueError("stated_value_signal needs the verbal_signal of the same items")
    if not values or any(not 0 <= v <= 100 for v in values):
        raise ValueError(f"values={values!r} must be percentages in [0, 100]")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    device = next(model.parameters()).device
    weights_of_values = np.asarray(values, dtype=np.float64)
    start = time.perf_counter()
    confidence: list[float | None] = []
    for item, answer in zip(items, verbal.answers, strict=True):
        prompt_ids = encode_prompts(
            tokenizer, [format_prompt(tokenizer, qa_prompt(tokenizer, item, verbal=True))]
        )[0]
        rows = [
            prompt_ids
            + tokenizer.encode(f"{answer}\n{format_confidence(v / 100)}", add_special_tokens=False)
            + eos
            for v in values
        ]
        totals = _continuation_log_probs(model, rows, pad, device)
        weights = torch.softmax(totals, dim=0).numpy()
        confidence.append(float(weights @ weights_of_values) / 100)
    return Signal(
        name=name,
        correct=list(verbal.correct),
        confidence=confidence,
        probability=True,
        seconds=time.perf_counter() - start,
        passes=f"+1 forward pass (prompt and answer once, {len(values)} short continuations)",
    )


def _continuation_log_probs(model: Any, rows: list[list[int]], pad: int, device: Any) -> Any:
    """`log p(row[shared:] | row[:shared])` for each row, `shared` their common prefix.

    The common prefix (prompt, answer, `"\\nConfidence: "`) is run once and its cache
    repeated for the rows' tails, so an item costs one prompt pass plus a few tokens per
    row. Its own probability is the same for every row and cancels in the normalisation
    over rows, so it is left out. At least one token per row is kept as tail.
    """
    import torch

    shared = min(len(r) for r in rows) - 1
    for i, token in enumerate(rows[0][:shared]):
        if any(r[i] != token for r in rows):
            shared = i
            break
    with torch.inference_mode():
        head = model(
            input_ids=torch.tensor([rows[0][:shared]], device=device),
            use_cache=True,
            logits_to_keep=1,
        )
        first = torch.log_softmax(head.logits[0, -1].double(), dim=-1).cpu()
        cache = head.past_key_values
        cache.batch_repeat_interleave(len(rows))
        tails = [r[shared:] for r in rows]
        width = max(map(len, tails))
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), shared + width), dtype=torch.long)
        mask[:, :shared] = 1
        for k, tail in enumerate(tails):
            ids[k, : len(tail)] = torch.tensor(tail)
            mask[k, shared : shared + len(tail)] = 1
        logits = model(
            input_ids=ids.to(device), attention_mask=mask.to(device), past_key_values=cache
        ).logits
        logp = torch.log_softmax(logits.double(), dim=-1).cpu()
    return torch.stack(
        [
            first[tail[0]]
            + logp[k, : len(tail) - 1].gather(1, torch.tensor(tail[1:])[:, None]).sum()
            for k, tail in enumerate(tails)
        ]
    )


def closeness(signal: Signal, teacher: Signal) -> float | None:
    """Spearman rank correlation of a signal's confidence with the teacher's (same items)."""
    from scipy.stats import spearmanr

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
