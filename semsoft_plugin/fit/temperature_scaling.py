"""Temperature scaling: `softmax(log p / T)`, the NLL it is judged by, and the `T`
that minimises it.

The last step of `SemanticSoftmax._score` is a temperature, and the post-hoc
baseline of the evaluation is temperature scaling of the constrained softmax: both are
fitted by `fit_temperature`, with numpy only, so the fit (`semsoft_plugin.fit.fitting`) and
the evaluation package share one NLL and one search. The few-label fit holds the search's
answer to the rule of succession where a few labels would make it surer than they show
(`succession_temperature`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "LOG_T_BOUNDS",
    "apply_temperature",
    "fit_temperature",
    "nll",
    "succession_targets",
    "succession_temperature",
    "target_rows",
]

# Temperatures searched: wide enough for a twenty-fold over- or under-confident model.
LOG_T_BOUNDS = (math.log(0.05), math.log(20.0))
_EPS = 1e-12


def apply_temperature(log_probs: Any, temperature: float) -> np.ndarray:
    """`softmax(log_probs / T)` row-wise, float64 (the core's final step)."""
    z = np.asarray(log_probs, dtype=np.float64) / temperature
    z = z - z.max(1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(1, keepdims=True)


def nll(probs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-item negative log-likelihood of the target label (probabilities floored at
    1e-12, as the evaluation's metrics are)."""
    return -np.log(np.clip(probs[np.arange(len(targets)), targets], _EPS, 1.0))


def succession_targets(
    targets: Any, n_labels: int, *, count: float | None = None, succession: bool = True
) -> np.ndarray:
    """The targets the few-label fit's offsets and the probe's label logits are fitted
    to: `[N, L]` rows that give each item's label `(N + 1) / (N + 2)` and share
    `1 / (N + 2)` evenly among the other labels (its temperatures are held to the same
    rule by `succession_temperature`).

    Why: on a few labels that one temperature separates perfectly, the hard targets'
    NLL keeps falling as `T -> 0`, so the fit makes every answer nearly certain and the
    first error on new items costs `~1/T` nats (measured: Qwen2.5-Coder-1.5B on SST-2,
    25 labels, test NLL .87 against the constrained softmax's .51). By Laplace's rule of
    succession, after `N` answers seen right the chance that the next is wrong is still
    `1 / (N + 2)`: the fit may not make an answer surer than its labels show. The
    targets fade to the hard ones as labels grow (Platt, 1999, smooths binary targets
    the same way, per class; per class was worse here, as it pushes rare labels down).
    The out-of-fold checks still score hard labels. `count`: the `N` of the rule
    where items are weighted (the sum of their weights; default `len(targets)`), so
    that integer weights give the targets of the items repeated. `succession=False`
    (`FitPolicy.succession`): the hard targets.

    >>> succession_targets([0, 0, 1], 2).round(3).tolist()
    [[0.8, 0.2], [0.8, 0.2], [0.2, 0.8]]
    """
    y = np.asarray(targets, dtype=np.int64)
    if y.ndim != 1 or n_labels < 2 or (len(y) and (y.min() < 0 or y.max() >= n_labels)):
        raise ValueError(f"targets must be [N] label indices in [0, {n_labels}), got {y[:8]}")
    if not succession:
        return target_rows(y, len(y), n_labels)
    rest = 1.0 / ((len(y) if count is None else float(count)) + 2.0)
    out = np.full((len(y), n_labels), rest / (n_labels - 1))
    out[np.arange(len(y)), y] = 1.0 - rest
    return out


def target_rows(targets: Any, n: int, n_labels: int) -> np.ndarray:
    """`[N, L]` target rows: one-hot rows for label indices, soft rows as given."""
    values = np.asarray(targets)
    if values.ndim == 2:
        if values.shape != (n, n_labels) or not np.all(np.isfinite(values)):
            raise ValueError(f"soft targets must be finite [N, L] = [{n}, {n_labels}] rows")
        return values.astype(np.float64)
    y = values.astype(np.int64)
    if y.ndim != 1 or len(y) != n:
        raise ValueError(f"targets {y.shape} must be [N] = [{n}] label indices or [N, L] rows")
    onehot = np.zeros((n, n_labels))
    onehot[np.arange(n), y] = 1.0
    return onehot


def fit_temperature(
    log_probs: Any, targets: Any, *, tol: float = 1e-7, sample_weight: Any = None
) -> float:
    """The temperature minimising the mean NLL of `softmax(log_probs / T)`.

    `targets`: `[N]` label indices, or `[N, L]` target rows (e.g.
    `succession_targets`; the loss is then the cross-entropy to them).
    `sample_weight`: `[N]` weights of the items' losses (the weighted mean; `None`:
    the plain mean).

    The NLL is convex in `1/T` (a log-sum-exp of linear functions minus a linear
    function), hence unimodal in `log T`: a golden-section search on `log T` over
    `[0.05, 20]` finds the minimum to `tol` (ties go to the smaller `T` end only
    when the loss is flat there).
    """
    z = np.asarray(log_probs, dtype=np.float64)
    if z.ndim != 2 or len(z) == 0:
        raise ValueError(f"log_probs {z.shape} must be [N, L] with N > 0")
    q = target_rows(targets, len(z), z.shape[1])
    z = z - z.max(1, keepdims=True)
    picked = (q * z).sum(1) / q.sum(1)

    weights = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)

    def loss(log_t: float) -> float:
        scaled = z / math.exp(log_t)
        top = scaled.max(1)
        lse = top + np.log(np.exp(scaled - top[:, None]).sum(1))
        per_item = lse - picked / math.exp(log_t)
        if weights is None:
            return float(per_item.mean())
        return float((weights * per_item).sum() / weights.sum())

    lo, hi = LOG_T_BOUNDS
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo + (1 - ratio) * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = loss(a), loss(b)
    while hi - lo > tol:
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = lo + (1 - ratio) * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = loss(b)
    best = (lo + hi) / 2.0
    # The search stays inside the bounds; a flat loss (one label only) keeps T = 1.
    return float(math.exp(best)) if loss(best) < loss(0.0) else 1.0


def succession_temperature(
    log_probs: Any, targets: Any, *, sample_weight: Any = None, succession: bool = True
) -> float:
    """Temperature scaling held to the rule of succession: the few-label fit's `T`.

    `fit_temperature` on the hard labels, unless at that `T` the items' labels get more
    than `(N + 1) / (N + 2)` of the probability on average (`succession_targets` says
    why no more); then the `T` at which they get exactly that (a bisection on `log T`
    above the hard optimum). Where the labels do not separate, this is temperature
    scaling itself: fitting every `T` to the smoothed targets instead raised it on every
    fit, and Qwen2.5-Coder-1.5B on Ekman's emotions (50 labels) paid .002 of test NLL
    against temperature scaling on each of 5 draws. `sample_weight`: as in
    `fit_temperature`; the weights count items, so the rule's `N` is their sum.
    `succession=False` (`FitPolicy.succession`): the hard optimum.

    >>> z = np.array([[2.0, 0.0], [0.0, 2.0], [3.0, 0.0]])  # three right answers
    >>> t = succession_temperature(z, [0, 1, 0])
    >>> round(float(apply_temperature(z, t)[np.arange(3), [0, 1, 0]].mean()), 4)
    0.8
    >>> y = [0, 1, 1]  # one wrong: the hard optimum is already modest
    >>> succession_temperature(z, y) == fit_temperature(z, y)
    True
    """
    z = np.asarray(log_probs, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    hard = fit_temperature(z, y, sample_weight=sample_weight)
    if not succession:
        return hard
    weights = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, np.float64)
    most = 1.0 - 1.0 / (float(weights.sum()) + 2.0)

    def sureness(log_t: float) -> float:
        picked = apply_temperature(z, math.exp(log_t))[np.arange(len(y)), y]
        return float((weights * picked).sum() / weights.sum())

    lo, hi = math.log(hard), LOG_T_BOUNDS[1]
    if sureness(lo) <= most:
        return hard
    for _ in range(60):  # |hi - lo| < 1e-16 of the bounds' width
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if sureness(mid) > most else (lo, mid)
    return float(math.exp(hi))
