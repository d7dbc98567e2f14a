"""Temperature scaling: ``softmax(log p / T)``, the NLL it is judged by, and the ``T``
that minimises it.

The last step of :meth:`SemanticSoftmax._score` is a temperature, and the post-hoc
baseline of the evaluation is temperature scaling of the constrained softmax: both are
fitted by :func:`fit_temperature`, with numpy only, so the fit (:mod:`semsoft_plugin.core.fitting`) and
the evaluation package share one NLL and one search.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["LOG_T_BOUNDS", "apply_temperature", "fit_temperature", "nll"]

# Temperatures searched: wide enough for a twenty-fold over- or under-confident model.
LOG_T_BOUNDS = (math.log(0.05), math.log(20.0))
_EPS = 1e-12


def apply_temperature(log_probs: Any, temperature: float) -> np.ndarray:
    """``softmax(log_probs / T)`` row-wise, float64 (the core's final step)."""
    z = np.asarray(log_probs, dtype=np.float64) / temperature
    z = z - z.max(1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(1, keepdims=True)


def nll(probs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-item negative log-likelihood of the target label (probabilities floored at
    1e-12, as the evaluation's metrics are)."""
    return -np.log(np.clip(probs[np.arange(len(targets)), targets], _EPS, 1.0))


def fit_temperature(log_probs: Any, targets: Any, *, tol: float = 1e-7) -> float:
    """The temperature minimising the mean NLL of ``softmax(log_probs / T)``.

    The NLL is convex in ``1/T`` (a log-sum-exp of linear functions minus a linear
    function), hence unimodal in ``log T``: a golden-section search on ``log T`` over
    ``[0.05, 20]`` finds the minimum to ``tol`` (ties go to the smaller ``T`` end only
    when the loss is flat there).
    """
    z = np.asarray(log_probs, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    if z.ndim != 2 or len(z) != len(y) or len(y) == 0:
        raise ValueError(f"log_probs {z.shape} and targets {y.shape} must be [N, L] and [N]")
    z = z - z.max(1, keepdims=True)
    picked = z[np.arange(len(y)), y]

    def loss(log_t: float) -> float:
        scaled = z / math.exp(log_t)
        top = scaled.max(1)
        lse = top + np.log(np.exp(scaled - top[:, None]).sum(1))
        return float((lse - picked / math.exp(log_t)).mean())

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
