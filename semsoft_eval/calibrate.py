"""Post-hoc pieces shared by `eval` and `tune`: folds, temperature fitting, baselines.

The folds and the NLL temperature fit are the plugin's (`semsoft_plugin.fit.fitting`
and `semsoft_plugin.fit.temperature_scaling`, which `Classifier.fit` runs),
re-exported here.

Everything that needs labels (temperature scaling, the label prior) is *cross-fitted*:
the items are split into folds, and each fold is scored with what was fitted on the
other folds, so every item gets an out-of-fold prediction and no figure is scored on
the data it was fitted to.
"""

from __future__ import annotations

import numpy as np

from semsoft_eval.metrics import ece_numpy
from semsoft_plugin.core.calibration import debias
from semsoft_plugin.fit import temperature_scaling
from semsoft_plugin.fit.folds import stratified_folds
from semsoft_plugin.fit.temperature_scaling import apply_temperature

__all__ = [
    "folds",
    "stratified_folds",
    "fit_temperature",
    "apply_temperature",
    "cross_fit_temperature",
    "cross_fit_prior",
    "contextual",
]

_EPS = 1e-12


def folds(n: int, n_folds: int, seed: int = 0) -> np.ndarray:
    """A fold id in `[0, n_folds)` per item, balanced, fixed by `seed`."""
    if n_folds < 2 or n < n_folds:
        raise ValueError(f"need at least {n_folds} items for {n_folds} folds, got {n}")
    ids = np.arange(n) % n_folds
    return np.random.default_rng(seed).permutation(ids)


def _ece(log_probs: np.ndarray, targets: np.ndarray, temperature: float) -> float:
    p = apply_temperature(log_probs, temperature)
    return float(ece_numpy(p.max(1), p.argmax(1) == targets))


def fit_temperature(log_probs: np.ndarray, targets: np.ndarray, objective: str = "nll") -> float:
    """The temperature minimising NLL (the plugin's
    `semsoft_plugin.fit.temperature_scaling.fit_temperature`: convex in `1/T`, golden-section
    search on log T) or ECE (not smooth: a grid of 81 log-spaced values, ties to the
    value nearest 1)."""
    log_probs = np.asarray(log_probs, dtype=np.float64)
    if objective == "nll":
        return temperature_scaling.fit_temperature(log_probs, targets)
    if objective == "ece":
        grid = np.exp(np.linspace(*temperature_scaling.LOG_T_BOUNDS, 81))
        scores = np.array([_ece(log_probs, targets, t) for t in grid])
        best = np.flatnonzero(scores <= scores.min() + 1e-12)
        return float(grid[best[np.argmin(np.abs(np.log(grid[best])))]])
    raise ValueError(f"objective={objective!r} must be 'nll' or 'ece'")


def cross_fit_temperature(
    probs: np.ndarray, targets: np.ndarray, fold_ids: np.ndarray, objective: str = "nll"
) -> tuple[np.ndarray, list[float]]:
    """Out-of-fold temperature-scaled probabilities and the temperature of each fold."""
    log_probs = np.log(np.clip(probs, _EPS, 1.0))
    out = np.empty_like(log_probs)
    temperatures = []
    for fold in np.unique(fold_ids):
        held = fold_ids == fold
        t = fit_temperature(log_probs[~held], targets[~held], objective)
        out[held] = apply_temperature(log_probs[held], t)
        temperatures.append(t)
    return out, temperatures


def cross_fit_prior(targets: np.ndarray, n_labels: int, fold_ids: np.ndarray) -> np.ndarray:
    """Label frequencies of the other folds (add-one smoothed, so no label gets 0)."""
    out = np.empty((len(targets), n_labels))
    for fold in np.unique(fold_ids):
        held = fold_ids == fold
        counts = np.bincount(targets[~held], minlength=n_labels) + 1.0
        out[held] = counts / counts.sum()
    return out


def contextual(constrained: np.ndarray, content_free: np.ndarray) -> np.ndarray:
    """Contextual calibration (Zhao et al., 2021): divide the label probabilities by the
    mean label probabilities of content-free inputs, then renormalise (the plugin's
    [`debias`][semsoft_plugin.core.calibration.debias], which `Classifier` uses too)."""
    reference = np.asarray(content_free, dtype=np.float64).mean(0)
    return debias(np.asarray(constrained, dtype=np.float64), reference)
