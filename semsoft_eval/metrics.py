"""Classification and calibration metrics for `semsoft eval`.

`probs` is `[N, L]`, rows summing to 1 (checked within `ROW_SUM_TOLERANCE`, then divided
by their sum, so scikit-learn sees exact float64 distributions; a row further off is an
error, not fixed silently); `targets` is `[N]` label indices. The metrics: accuracy,
macro-F1, ECE (15 equal-width bins on the top-label confidence), Brier, NLL, AUROC,
AUROC2 and, on binary soft labels (the raters' fraction `r` for `labels[1]`), the
distances to the raters. A metric undefined on the data at hand (AUROC with one class,
Spearman with a constant input, ...) is `None` (JSON `null`, "n/a" in tables), never NaN.

Each metric's definition: docs/metrics.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

# scipy, scikit-learn and torchmetrics (the `eval` extra) are imported by the functions
# that use them, so that the `semsoft eval`, `tune` and `distill` parsers, which import
# this module, load without the extra (the docs build reads them: scripts/mkdocs_cli_reference.py).
# scikit-learn's macro F1 in closed form, shared with the fit's macro-F1 guard, so a
# bootstrap can call it a thousand times.
from semsoft_plugin.fit.f1_guard import macro_f1 as macro_f1_of_labels

__all__ = [
    "N_BINS",
    "ROW_SUM_TOLERANCE",
    "accuracy",
    "auroc",
    "auroc2",
    "bootstrap_difference",
    "brier",
    "classification_metrics",
    "correct",
    "ece",
    "ece_numpy",
    "macro_f1",
    "nll",
    "soft_label_metrics",
]

N_BINS = 15
ROW_SUM_TOLERANCE = 1e-3


def _check(probs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    probs = np.asarray(probs, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    if probs.ndim != 2 or targets.ndim != 1 or probs.shape[0] != targets.shape[0]:
        raise ValueError(f"probs {probs.shape} and targets {targets.shape} must be [N, L] and [N]")
    if probs.shape[0] == 0:
        raise ValueError("no items to score")
    if not np.isfinite(probs).all():
        raise ValueError("probs contain NaN or inf")
    if (probs < 0).any():
        raise ValueError(f"probs contain a negative value ({probs.min()})")
    sums = probs.sum(1)
    worst = int(np.abs(sums - 1.0).argmax())
    if abs(sums[worst] - 1.0) > ROW_SUM_TOLERANCE:
        raise ValueError(f"probs row {worst} sums to {sums[worst]:.6g}, not 1")
    probs = probs / sums[:, None]
    if targets.min() < 0 or targets.max() >= probs.shape[1]:
        raise ValueError(f"a target is outside the {probs.shape[1]} labels")
    return probs, targets


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def correct(
    probs: np.ndarray, targets: np.ndarray, gold_sets: Sequence[Sequence[int]] | None = None
) -> np.ndarray:
    """Per item: is the argmax right (any gold label counts when `gold_sets` is given)."""
    predicted = np.asarray(probs).argmax(1)
    if gold_sets is None:
        return predicted == np.asarray(targets)
    return np.array([p in g for p, g in zip(predicted, gold_sets, strict=True)])


def accuracy(
    probs: np.ndarray, targets: np.ndarray, gold_sets: Sequence[Sequence[int]] | None = None
) -> float:
    probs, targets = _check(probs, targets)
    return float(correct(probs, targets, gold_sets).mean())


def macro_f1(probs: np.ndarray, targets: np.ndarray) -> float:
    from sklearn.metrics import f1_score

    probs, targets = _check(probs, targets)
    return float(f1_score(targets, probs.argmax(1), average="macro", zero_division=0))


def ece(probs: np.ndarray, targets: np.ndarray, n_bins: int = N_BINS) -> float:
    """Top-label ECE with `n_bins` equal-width bins (torchmetrics)."""
    from torchmetrics.functional.classification import multiclass_calibration_error

    probs, targets = _check(probs, targets)
    value = multiclass_calibration_error(
        torch.from_numpy(probs),
        torch.from_numpy(targets),
        num_classes=probs.shape[1],
        n_bins=n_bins,
        norm="l1",
    )
    return float(value)


def ece_numpy(confidence: np.ndarray, hit: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Top-label ECE for many resamples at once: `confidence`, `hit` are `[..., N]`.

    The same binning as torchmetrics (bin `i` holds `(i/n, (i+1)/n]`); used by the
    bootstrap, where a thousand torchmetrics calls would dominate the run time.
    `hit` may be fractional (the raters' agreement for soft labels).
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    hit = np.asarray(hit, dtype=np.float64)
    bins = np.clip(np.ceil(confidence * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    flat = bins.reshape(-1, bins.shape[-1])
    conf = confidence.reshape(flat.shape)
    acc = hit.reshape(flat.shape)
    offset = (np.arange(flat.shape[0]) * n_bins)[:, None]
    size = flat.shape[0] * n_bins
    gap = np.bincount((flat + offset).ravel(), weights=(conf - acc).ravel(), minlength=size)
    gap = np.abs(gap.reshape(flat.shape[0], n_bins)).sum(1) / flat.shape[1]
    return gap.reshape(bins.shape[:-1])


def brier(probs: np.ndarray, targets: np.ndarray) -> float:
    """Multiclass Brier score, summed over classes (scikit-learn)."""
    from sklearn.metrics import brier_score_loss

    probs, targets = _check(probs, targets)
    return float(
        brier_score_loss(targets, probs, labels=list(range(probs.shape[1])), scale_by_half=False)
    )


def nll(probs: np.ndarray, targets: np.ndarray) -> float:
    from sklearn.metrics import log_loss

    probs, targets = _check(probs, targets)
    return float(log_loss(targets, probs, labels=list(range(probs.shape[1]))))


def auroc(probs: np.ndarray, targets: np.ndarray) -> float | None:
    """Macro one-vs-rest ROC AUC over the labels with both classes present; None if none."""
    from sklearn.metrics import roc_auc_score

    probs, targets = _check(probs, targets)
    if probs.shape[1] == 2:
        if len(np.unique(targets)) < 2:
            return None
        return float(roc_auc_score(targets, probs[:, 1]))
    scores = [
        roc_auc_score(targets == label, probs[:, label])
        for label in range(probs.shape[1])
        if 0 < (targets == label).sum() < len(targets)
    ]
    return float(np.mean(scores)) if scores else None


def auroc2(is_correct: np.ndarray, confidence: np.ndarray) -> float | None:
    """ROC AUC of confidence for telling right from wrong answers; None with one class.

    Arguments in scikit-learn's order (truth, score), as in the plugin's
    `semsoft_eval.confidence.auroc2`, which computes it and returns NaN where
    the AUC is undefined; reports say `None` instead.
    """
    from semsoft_eval.confidence import auroc2 as _auroc2

    return _finite_or_none(_auroc2(is_correct, confidence))


def classification_metrics(
    probs: np.ndarray, targets: np.ndarray, gold_sets: Sequence[Sequence[int]] | None = None
) -> dict[str, float | None]:
    """accuracy, macro_f1, ece, brier, nll, auroc, auroc2 (see the module docstring).

    Examples
    --------
    >>> import numpy as np
    >>> from semsoft_eval.metrics import classification_metrics
    >>> probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    >>> scores = classification_metrics(probs, np.array([0, 1, 1, 1]))
    >>> scores["accuracy"], round(scores["brier"], 3), round(scores["nll"], 3)
    (0.75, 0.25, 0.4)
    >>> scores["auroc"]
    1.0
    """
    probs, targets = _check(probs, targets)
    hits = correct(probs, targets, gold_sets)
    return {
        "accuracy": float(hits.mean()),
        "macro_f1": macro_f1(probs, targets),
        "ece": ece(probs, targets),
        "brier": brier(probs, targets),
        "nll": nll(probs, targets),
        "auroc": auroc(probs, targets),
        "auroc2": auroc2(hits, probs.max(1)),
    }


def soft_label_metrics(probs: np.ndarray, raters: np.ndarray) -> dict[str, float | None]:
    """Agreement of binary `probs` `[N, 2]` with the raters' fraction for label 1."""
    from scipy.stats import spearmanr

    probs = np.asarray(probs, dtype=np.float64)
    raters = np.asarray(raters, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[1] != 2 or raters.shape != (probs.shape[0],):
        raise ValueError(
            f"soft-label metrics need probs [N, 2] and raters [N], got {probs.shape}, {raters.shape}"
        )
    positive = probs[:, 1]
    predicted = probs.argmax(1)
    agreement = np.where(predicted == 1, raters, 1.0 - raters)
    ambiguous = (raters > 0) & (raters < 1)
    if np.ptp(positive) == 0 or np.ptp(raters) == 0:
        rho = None
    else:
        rho = _finite_or_none(spearmanr(positive, raters).statistic)
    return {
        "mae_vs_raters": float(np.abs(positive - raters).mean()),
        "ece_vs_raters": float(ece_numpy(probs.max(1), agreement)),
        "spearman_vs_raters": rho,
        "share_over_0_9_on_ambiguous": float((probs.max(1)[ambiguous] > 0.9).mean())
        if ambiguous.any()
        else None,
        "n_ambiguous": int(ambiguous.sum()),
    }


def bootstrap_difference(
    probs: np.ndarray,
    reference: np.ndarray,
    targets: np.ndarray,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    gold_sets: Sequence[Sequence[int]] | None = None,
) -> dict[str, dict[str, float]]:
    """95% percentile intervals for `metric(probs) - metric(reference)`.

    Items are resampled with replacement (the same resample for both methods, so the
    interval is for the paired difference). Metrics: `ece`, `macro_f1`, `nll`.
    Returns `{metric: {"diff", "low", "high"}}`; `diff` is on the full sample.
    """
    probs, targets = _check(probs, targets)
    reference, _ = _check(reference, targets)
    n, n_labels = probs.shape
    rng = np.random.default_rng(seed)
    index = rng.integers(0, n, size=(n_resamples, n))
    out: dict[str, dict[str, float]] = {}

    def hits(p: np.ndarray) -> np.ndarray:
        return correct(p, targets, gold_sets).astype(np.float64)

    per_item: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "nll": lambda p: -np.log(np.clip(p[np.arange(n), targets], 1e-15, 1.0)),
    }
    a_hit, b_hit = hits(probs), hits(reference)
    a_conf, b_conf = probs.max(1), reference.max(1)
    ece_diff = ece_numpy(a_conf[index], a_hit[index]) - ece_numpy(b_conf[index], b_hit[index])
    full = float(ece_numpy(a_conf, a_hit) - ece_numpy(b_conf, b_hit))
    out["ece"] = _interval(full, ece_diff)
    a_pred, b_pred = probs.argmax(1), reference.argmax(1)
    f1_diff = np.array(
        [
            macro_f1_of_labels(targets[i], a_pred[i], n_labels)
            - macro_f1_of_labels(targets[i], b_pred[i], n_labels)
            for i in index
        ]
    )
    out["macro_f1"] = _interval(
        macro_f1_of_labels(targets, a_pred, n_labels)
        - macro_f1_of_labels(targets, b_pred, n_labels),
        f1_diff,
    )
    for name, fn in per_item.items():
        delta = fn(probs) - fn(reference)
        out[name] = _interval(float(delta.mean()), delta[index].mean(1))
    return out


def _interval(full: float, samples: np.ndarray) -> dict[str, float]:
    low, high = np.percentile(samples, [2.5, 97.5])
    return {"diff": float(full), "low": float(low), "high": float(high)}
