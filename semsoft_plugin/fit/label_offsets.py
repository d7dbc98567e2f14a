"""Bias corrections fitted on a few labels: a per-label log-offset with a temperature
(numpy only).

A temperature never changes which label wins; a prompt's bias toward some labels needs a
per-label offset. Every member here is $p(l \\mid x) \\propto \\exp(\\log p_0(l \\mid x) / T + b_l)$
on the base probabilities `p0`, with `b` from: `"offset"`, `(1/T, b)` fitted jointly
(bias-corrected temperature scaling, Alexandari et al., ICML 2020; `b` pulled toward zero
by an L2 penalty the inner folds choose from `STRENGTHS`; convex, solved by a damped
Newton method); `"batch"`, `-log mean(p0)` over the fitted rows; `"contextual"`,
`-log mean(p0)` over content-free inputs (the last two then divided by a fitted
temperature). `semsoft_plugin.fit.fitting` scores each member out of fold against the
default and keeps the default unless one beats it. See docs/few-labels.md ("What is fitted").
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from semsoft_plugin.fit.folds import stratified_folds
from semsoft_plugin.fit.temperature_scaling import (
    LOG_T_BOUNDS,
    apply_temperature,
    fit_temperature,
    nll,
    succession_targets,
    target_rows,
)

__all__ = [
    "MEMBERS",
    "STRENGTHS",
    "apply_offset",
    "check_members",
    "checked_names",
    "fit_member",
    "fit_offset",
    "fit_offset_cv",
    "member_out_of_fold",
]

# L2 strengths tried for the offset (on the mean NLL; the penalty is strength/2 |b|^2):
# from nearly free (1e-3) to nearly zero offsets (10).
STRENGTHS: tuple[float, ...] = (1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 10.0)
# The bias members, in the order the fit reports them.
MEMBERS: tuple[str, ...] = ("offset", "batch", "contextual")
_FLOOR = 1e-30
_A_BOUNDS = (math.exp(-LOG_T_BOUNDS[1]), math.exp(-LOG_T_BOUNDS[0]))  # 1/T


def apply_offset(log_probs: Any, temperature: float, offset: Any) -> np.ndarray:
    """`softmax(log_probs / T + offset)` row-wise, float64."""
    z = np.asarray(log_probs, dtype=np.float64) / temperature + np.asarray(offset, np.float64)
    return apply_temperature(z, 1.0)


def _loss(
    x: np.ndarray, q: np.ndarray, a: float, b: np.ndarray, strength: float, u: np.ndarray
) -> float:
    z = a * x + b
    top = z.max(1)
    lse = top + np.log(np.exp(z - top[:, None]).sum(1))
    return float(u @ (lse - (q * z).sum(1)) + 0.5 * strength * b @ b)


def _shares(weights: Any, n: int) -> np.ndarray:
    """Each row's share of a weighted mean: `weights / sum(weights)`, or `1 / n`."""
    if weights is None:
        return np.full(n, 1.0 / n)
    w = np.asarray(weights, dtype=np.float64)
    return w / w.sum()


def _count(weights: Any) -> float | None:
    """The items the weights count (their sum), for the succession targets."""
    return None if weights is None else float(np.sum(weights))


def fit_offset(
    log_probs: Any,
    targets: Any,
    strength: float,
    *,
    temperature: bool = True,
    max_iter: int = 100,
    tol: float = 1e-10,
    sample_weight: Any = None,
) -> tuple[float, np.ndarray]:
    """`(T, b)` minimising mean NLL of `softmax(log_probs / T + b)` plus
    `strength / 2 * |b|^2`; `temperature=False` keeps `T = 1`. `targets`:
    `[N]` label indices or `[N, L]` target rows (the cross-entropy to them).

    The objective is convex in `(1/T, b)` (a log-sum-exp of linear functions, minus a
    linear one, plus a ridge), so a Newton step with backtracking converges to the
    optimum; `1/T` stays inside the temperature search's bounds `[0.05, 20]`. The
    ridge also fixes the constant a softmax ignores: `b` sums to zero.
    `sample_weight`: `[N]` weights of the rows' losses (the weighted mean).
    """
    x = np.asarray(log_probs, dtype=np.float64)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"log_probs {x.shape} must be [N, L] with N > 0")
    if not strength > 0:
        raise ValueError(f"strength={strength!r} must be > 0 (the offset is unidentified at 0)")
    q = target_rows(targets, len(x), x.shape[1])  # one-hot or soft rows, each summing to 1
    q = q / q.sum(1, keepdims=True)
    x = x - x.max(1, keepdims=True)
    n, width = x.shape
    u = _shares(sample_weight, n)
    a, b = 1.0, np.zeros(width)
    current = _loss(x, q, a, b, strength, u)
    for _ in range(max_iter):
        p = apply_temperature(a * x + b, 1.0)
        r = p - q
        up = u[:, None] * p
        grad_b = u @ r + strength * b
        hess_bb = np.diag(up.sum(0)) - up.T @ p + strength * np.eye(width)
        if temperature:
            px = (p * x).sum(1)
            grad = np.concatenate([[u @ (r * x).sum(1)], grad_b])
            hess = np.empty((width + 1, width + 1))
            hess[0, 0] = float(u @ ((p * x * x).sum(1) - px * px))
            cross = u @ ((p * x) - p * px[:, None])
            hess[0, 1:] = hess[1:, 0] = cross
            hess[1:, 1:] = hess_bb
        else:
            grad, hess = grad_b, hess_bb
        step = np.linalg.solve(hess + 1e-12 * np.eye(len(grad)), grad)
        decrement = float(grad @ step)
        if decrement < tol:
            break
        size = 1.0
        while size > 1e-8:
            if temperature:
                a_new = float(np.clip(a - size * step[0], *_A_BOUNDS))
                b_new = b - size * step[1:]
            else:
                a_new, b_new = a, b - size * step
            trial = _loss(x, q, a_new, b_new, strength, u)
            if trial <= current - 1e-4 * size * decrement:
                break
            size /= 2
        else:
            break  # no descent (at a bound): the optimum up to the tolerance
        a, b, current = a_new, b_new, trial
    return 1.0 / a, b


def _inner_folds(y: np.ndarray, seed: int, n_folds: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rare labels: unstratified inner folds
        return stratified_folds(y, min(n_folds, len(y) // 2), seed)


def fit_offset_cv(
    log_probs: Any,
    targets: Any,
    *,
    strengths: tuple[float, ...] = STRENGTHS,
    temperature: bool = True,
    n_folds: int = 5,
    seed: int = 0,
    sample_weight: Any = None,
    succession: bool = True,
) -> tuple[float, np.ndarray, float]:
    """`(T, b, strength)`: the strength with the least mean NLL over inner stratified
    folds (ties: the stronger), then `fit_offset` with it on all rows
    (`sample_weight`: the rows' weights in every loss; `succession`: as in
    `succession_targets`)."""
    x = np.asarray(log_probs, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, np.float64)
    given = sample_weight is not None
    fold_ids = _inner_folds(y, seed, n_folds)
    losses = np.zeros(len(strengths))
    for fold in np.unique(fold_ids):
        held = fold_ids == fold
        train_w = w[~held] if given else None
        train = succession_targets(
            y[~held], x.shape[1], count=_count(train_w), succession=succession
        )
        for s, strength in enumerate(strengths):
            t, b = fit_offset(
                x[~held], train, strength, temperature=temperature, sample_weight=train_w
            )
            losses[s] += (w[held] * nll(apply_offset(x[held], t, b), y[held])).sum()
    best = int(np.flatnonzero(losses <= losses.min() + 1e-12)[-1])
    targets_all = succession_targets(
        y, x.shape[1], count=_count(sample_weight), succession=succession
    )
    t, b = fit_offset(
        x, targets_all, strengths[best], temperature=temperature, sample_weight=sample_weight
    )
    return t, b, float(strengths[best])


def _fixed(
    bias: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    temperature: bool,
    sample_weight: Any,
    succession: bool,
) -> tuple[float, Any]:
    """A label-free offset `-log bias`, then a temperature on the corrected scores."""
    corrected = x - np.log(np.clip(bias, _FLOOR, None))
    rows = succession_targets(y, x.shape[1], count=_count(sample_weight), succession=succession)
    t = fit_temperature(corrected, rows, sample_weight=sample_weight) if temperature else 1.0
    return t, -np.log(np.clip(bias, _FLOOR, None)) / t


def fit_member(
    name: str,
    log_probs: np.ndarray,
    targets: np.ndarray,
    *,
    content_free: np.ndarray | None = None,
    temperature: bool = True,
    seed: int = 0,
    sample_weight: Any = None,
    succession: bool = True,
) -> tuple[float, np.ndarray]:
    """`(T, b)` of bias member `name` (`MEMBERS`) fitted on these rows.

    `content_free`: `[C, L]` the base probabilities of the content-free inputs
    (needed by `"contextual"`). `sample_weight`: the rows' weights (the batch's mean
    distribution and every loss weighted by them). `succession`: as in
    `succession_targets` (`FitPolicy.succession`).
    """
    x = np.asarray(log_probs, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    w = sample_weight
    batch_mean = _shares(w, len(x)) @ apply_temperature(x, 1.0)
    fitters: dict[str, Callable[[], tuple[float, Any]]] = {
        "offset": lambda: fit_offset_cv(
            x, y, temperature=temperature, seed=seed, sample_weight=w, succession=succession
        )[:2],
        "batch": lambda: _fixed(batch_mean, x, y, temperature, w, succession),
        "contextual": lambda: _fixed(
            _content_free_bias(content_free), x, y, temperature, w, succession
        ),
    }
    if name not in fitters:
        raise ValueError(f"unknown bias member {name!r}; members are {', '.join(MEMBERS)}")
    t, b = fitters[name]()
    return float(t), np.asarray(b, dtype=np.float64)


def _content_free_bias(content_free: np.ndarray | None) -> np.ndarray:
    if content_free is None:
        raise ValueError("the 'contextual' member needs the content-free inputs' probabilities")
    cf = np.asarray(content_free, dtype=np.float64)
    if cf.ndim != 2 or len(cf) == 0:
        raise ValueError(f"content_free must be [C, L] probabilities, got shape {cf.shape}")
    return cf.mean(0)


def checked_names(names: Sequence[str], allowed: Sequence[str], what: str) -> tuple[str, ...]:
    """`names` as a tuple, each one of `allowed` and listed once, else refused by
    name (`what`: what a name is, for the message)."""
    names = tuple(names)
    unknown = [m for m in names if m not in allowed]
    if unknown:
        raise ValueError(f"unknown {what} {unknown[0]!r}; members are {', '.join(allowed)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{what}s are listed twice: {list(names)}")
    return names


def check_members(
    bias: Sequence[str], single: Mapping[str, int] | None, content_free: np.ndarray | None
) -> int:
    """The grid entry the members fit on (`single["temperature"]`: the start at
    `T = 1`; 0 when no member is asked for); unknown names or missing inputs are
    refused by name."""
    names = checked_names(bias, MEMBERS, "bias member")
    if not names:
        return 0
    if "temperature" not in (single or {}):
        raise ValueError("bias members need the start at T = 1 in the grid (single['temperature'])")
    if "contextual" in names and content_free is None:
        raise ValueError("bias member 'contextual' needs content_free probabilities")
    return int(single["temperature"])  # type: ignore[index]


def member_out_of_fold(
    name: str,
    base: np.ndarray,
    y: np.ndarray,
    fold_ids: np.ndarray,
    *,
    content_free: np.ndarray | None,
    temperature: bool,
    seed: int,
    entry: int,
    sample_weight: Any = None,
    succession: bool = True,
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Per-item probabilities `[N, L]` of bias member `name` fitted on the other
    folds (the offset's strength chosen by inner folds inside each), and each fold's
    choice (`entry`: the grid entry `base` is)."""
    out = np.empty(base.shape)
    choices = []
    for fold in np.unique(fold_ids):
        held = fold_ids == fold
        train_w = None if sample_weight is None else np.asarray(sample_weight)[~held]
        t, b = fit_member(name, base[~held], y[~held], content_free=content_free,
                          temperature=temperature, seed=seed, sample_weight=train_w,
                          succession=succession)  # fmt: skip
        out[held] = apply_offset(base[held], t, b)
        choices.append({"entry": entry, "temperature": t, "offset": b.tolist()})
    return out, choices
