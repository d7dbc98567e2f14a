"""Fitting Semantic Softmax's settings on a few labels: the pure math (torch and numpy).

A user who can label 50-200 items wants the settings that make the scores right *for
their model and prompt*, without letting a handful of labels overfit. What is fitted:

* the pool weight ``semantic_weight`` (how far to move from the constrained softmax
  toward the semantic distribution), over a small grid, and
* a final ``temperature`` (the last step of :meth:`SemanticSoftmax._score`), by
  minimising the NLL (convex in ``1/T``, so a golden-section search on ``log T`` finds
  the optimum).

Together they are two free non-negative coefficients on ``log P_con`` and ``log P_sem``
(``P ∝ P_con^((1-a)/T) · P_sem^(a/T)``); ``a = 0`` is temperature scaling of the
constrained softmax, so the search contains the usual post-hoc baseline.

**The rule that keeps the default.** The label-free default is the starting point. The
fitting procedure is scored *out of fold* (stratified folds): each fold's items are
scored with the setting fitted on the other folds, and the default is kept unless the
procedure's mean out-of-fold NLL gain over the default exceeds ``margin`` standard
errors of that gain (paired over items). So labels that carry no evidence against the
default (too few, or drawn from the default's own distribution) leave it unchanged.

**Bias corrections** (``fit_probs(bias=...)``, :mod:`~semsoft_plugin.core.label_offsets`):
a per-label offset, batch and contextual calibration, each one more procedure under the
same rule. An offset per label is no :class:`SemsoftConfig`, so :func:`fit_config`
(``Classifier.fit``, ``semsoft tune``) leaves them out; ``semantic-fit`` searches them.

Everything is computed from *kept forward passes*: per item the top ``S`` decision-step
logits (or log-probabilities) and those of every label token, one forward pass per item
whatever the grid (:mod:`semsoft_plugin.core.kept_scores`, which also scores the grid on
them). The temperature search and the NLL are :mod:`semsoft_plugin.core.temperature_scaling`;
this module holds the search over the grid, the folds and the rule.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from semsoft_plugin.core.config import SemsoftConfig, grid_entry
from semsoft_plugin.core.kept_scores import Kept, grid_probs
from semsoft_plugin.core.label_offsets import (
    apply_offset,
    check_members,
    fit_member,
    member_out_of_fold,
)
from semsoft_plugin.core.temperature_scaling import apply_temperature, fit_temperature, nll

__all__ = [
    "DEFAULT_WEIGHTS",
    "FitResult",
    "cross_fit",
    "fit_config",
    "fit_from_grid",
    "fit_probs",
    "fitted_probs",
    "grid_configs",
    "single_entries",
    "stratified_folds",
]

# The pool weights searched by default: from the constrained softmax (0) to the
# semantic distribution alone (1).
DEFAULT_WEIGHTS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))
# The core floors probabilities at this value before a log (core._tempered).
_FLOOR = 1e-30


# -- the grid and the folds ---------------------------------------------------------


def grid_configs(
    grid: Mapping[str, Sequence[Any]], start: SemsoftConfig | None = None
) -> list[SemsoftConfig]:
    """Every combination of the grid's values over ``start`` (unknown keys raise); an
    entry at ``semantic_weight = 0`` keeps the vote settings' defaults
    (:func:`~semsoft_plugin.core.config.grid_entry`)."""
    start = start or SemsoftConfig()
    names = list(grid)
    for name in names:
        if not grid[name]:
            raise ValueError(f"grid value list for {name!r} is empty")
    return [
        grid_entry(start, dict(zip(names, values, strict=True)))
        for values in itertools.product(*(grid[n] for n in names))
    ]


def stratified_folds(targets: Any, n_folds: int, seed: int = 0) -> np.ndarray:
    """A fold id per item with each label's share kept in every fold.

    The same ids as scikit-learn's ``StratifiedKFold(n_folds, shuffle=True,
    random_state=seed)`` (written out here so the plugin does not need scikit-learn).
    With an imbalanced label set a plain split can leave a rare label out of a training
    part altogether. When some label has fewer items than folds no split can hold it in
    every fold: ``KFold(shuffle=True)``'s ids are used instead, with a warning naming
    the count.
    """
    targets = np.asarray(targets)
    n = len(targets)
    if isinstance(n_folds, bool) or not isinstance(n_folds, int) or n_folds < 2 or n < n_folds:
        raise ValueError(f"need at least {n_folds} items for {n_folds} folds, got {n}")
    rng = np.random.RandomState(seed)
    _, first, inverse = np.unique(targets, return_index=True, return_inverse=True)
    encoded = np.unique(first, return_inverse=True)[1][inverse]  # by order of appearance
    counts = np.bincount(encoded)
    ids = np.empty(n, dtype=np.int64)
    if counts.min() < n_folds:
        warnings.warn(
            f"a label has {counts.min()} items, fewer than the {n_folds} folds: "
            "the folds are not stratified (KFold)",
            stacklevel=2,
        )
        order = np.arange(n)
        rng.shuffle(order)
        sizes = np.full(n_folds, n // n_folds)
        sizes[: n % n_folds] += 1
        ids[order] = np.repeat(np.arange(n_folds), sizes)
        return ids
    ordered = np.sort(encoded)
    allocation = np.array(
        [np.bincount(ordered[i::n_folds], minlength=len(counts)) for i in range(n_folds)]
    )
    for label in range(len(counts)):
        folds = np.arange(n_folds).repeat(allocation[:, label])
        rng.shuffle(folds)
        ids[encoded == label] = folds
    return ids


def _log(probs: np.ndarray) -> np.ndarray:
    return np.log(np.clip(probs, _FLOOR, 1.0))


# -- the fit -------------------------------------------------------------------------


@dataclass
class FitResult:
    """What :func:`fit_config` chose and why.

    Attributes
    ----------
    config : the setting to use: the fitted one, or ``start`` when the rule kept it
    fitted : the best setting on all labels (whether or not it was adopted)
    kept_default : True when the rule kept ``start``
    n : labelled items
    n_folds : folds of the out-of-fold check
    gain : mean out-of-fold NLL gain of the fitting procedure over ``start`` (> 0: better)
    gain_se : its standard error (paired over items)
    margin : the rule: adopt when ``gain > margin * gain_se`` and ``gain > 0``
    nll_start, nll_fitted : out-of-fold mean NLL of ``start`` and of the procedure
    procedure : the procedure adopted (``"grid"`` when none passed): ``"grid"``
        (every grid entry with its temperature) or ``"temperature"`` (a temperature on
        ``start`` alone)
    procedures : each checked procedure's gain, standard error, pass and NLL
    in_sample : per grid entry, the training NLL with its own fitted temperature
    fold_choices : the setting chosen on each fold's training part
    """

    config: SemsoftConfig
    fitted: SemsoftConfig
    kept_default: bool
    n: int
    n_folds: int
    gain: float
    gain_se: float
    margin: float
    nll_start: float
    nll_fitted: float
    procedure: str = "grid"
    procedures: dict[str, Any] = field(default_factory=dict)
    in_sample: list[dict[str, Any]] = field(default_factory=list)
    fold_choices: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "fitted": self.fitted.to_dict(),
            "kept_default": self.kept_default,
            "n": self.n,
            "n_folds": self.n_folds,
            "gain": self.gain,
            "gain_se": self.gain_se,
            "margin": self.margin,
            "nll_start": self.nll_start,
            "nll_fitted": self.nll_fitted,
            "procedure": self.procedure,
            "procedures": self.procedures,
            "in_sample": self.in_sample,
            "fold_choices": self.fold_choices,
        }


def _choose(
    log_grid: np.ndarray, targets: np.ndarray, temperature: bool
) -> tuple[int, float, np.ndarray, np.ndarray]:
    """(entry, temperature) with the least training NLL; each entry's NLL and T."""
    scores = np.empty(len(log_grid))
    temps = np.ones(len(log_grid))
    for c, log_p in enumerate(log_grid):
        if temperature:
            temps[c] = fit_temperature(log_p, targets)
        scores[c] = nll(apply_temperature(log_p, temps[c]), targets).mean()
    best = int(np.argmin(scores))  # the first of equal scores: the grid's order decides
    return best, float(temps[best]), scores, temps


def _check_targets(targets: Any, n: int, n_labels: int) -> np.ndarray:
    y = np.asarray(targets)
    if y.ndim != 1 or len(y) != n:
        raise ValueError(f"targets must be [N] = [{n}] label indices, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and (y.min() < 0 or y.max() >= n_labels)):
        raise ValueError(f"targets must be label indices in [0, {n_labels}), got {y[:8].tolist()}")
    return y.astype(np.int64)


def _out_of_fold(
    log_grid: np.ndarray, y: np.ndarray, fold_ids: np.ndarray, temperature: bool
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Per-item NLL of the procedure "choose the entry and T on the other folds"."""
    out = np.empty(len(y))
    choices = []
    for fold in np.unique(fold_ids):
        held = fold_ids == fold
        c, t, _, _ = _choose(log_grid[:, ~held], y[~held], temperature)
        out[held] = nll(apply_temperature(log_grid[c, held], t), y[held])
        choices.append({"entry": c, "temperature": t})
    return out, choices


def fit_probs(
    grid: np.ndarray,
    start: np.ndarray,
    targets: Any,
    *,
    single: Mapping[str, int] | None = None,
    temperature: bool = True,
    n_folds: int = 5,
    margin: float = 1.0,
    seed: int = 0,
    bias: Sequence[str] = (),
    content_free: np.ndarray | None = None,
) -> tuple[int, float, bool, dict[str, Any]]:
    """The fit on precomputed probabilities: ``grid`` ``[C, N, L]`` per grid entry,
    ``start`` ``[N, L]`` of the starting setting (scored as is). Returns ``(entry,
    temperature, kept_default, stats)``.

    Procedures are checked out of fold against ``start``: the whole grid with a
    temperature each, and each ``single`` entry (name -> grid entry, e.g. from
    :func:`single_entries`: ``start`` at ``T = 1``) with a temperature alone: one parameter, so less variance where only the temperature
    matters. Each is adopted only if its gain passes the rule (module docstring); of
    those that pass, the larger gain wins.
    ``n_folds`` is lowered to half the number of items when there are fewer.

    ``bias``: the bias members also checked (``label_offsets.MEMBERS``), on the
    ``single["temperature"]`` entry; ``content_free`` ``[C, L]``: that entry on the
    content-free inputs (``"contextual"``). ``stats["offset"]``: the adopted member's
    per-label log-offset (else None), which :func:`fitted_probs` applies.
    """
    y = _check_targets(targets, grid.shape[1], grid.shape[2])
    n = len(y)
    if n < 4:
        raise ValueError(f"fit needs at least 4 labelled items, got {n}")
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not margin >= 0:
        raise ValueError(f"margin={margin!r} must be a number >= 0")
    folds = min(n_folds, n // 2)
    log_grid = _log(grid)
    start_nll = nll(start, y)
    fold_ids = stratified_folds(y, folds, seed)
    subsets = {"grid": np.arange(len(grid))}
    if temperature and len(grid) > 1:
        subsets.update({name: np.array([entry]) for name, entry in (single or {}).items()})
    base_entry = check_members(bias, single, content_free)
    base = log_grid[base_entry]
    checked: dict[str, dict[str, Any]] = {}
    for name in [*subsets, *bias]:
        if name in subsets:
            fitted_nll, choices = _out_of_fold(log_grid[subsets[name]], y, fold_ids, temperature)
            for choice in choices:
                choice["entry"] = int(subsets[name][choice["entry"]])
        else:
            fitted_nll, choices = member_out_of_fold(
                name, base, y, fold_ids, content_free=content_free, temperature=temperature,
                seed=seed, entry=base_entry,
            )  # fmt: skip
        diff = start_nll - fitted_nll
        gain, se = float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(n))
        checked[name] = {
            "gain": gain,
            "gain_se": se,
            "passes": gain > 0 and gain > margin * se,
            "nll": float(fitted_nll.mean()),
            "fold_choices": choices,
        }
    passing = [k for k, v in checked.items() if v["passes"]]
    chosen = max(passing, key=lambda k: checked[k]["gain"]) if passing else "grid"
    offset = None
    if chosen in subsets:
        best, t, scores_all, temps_all = _choose(log_grid[subsets[chosen]], y, temperature)
        best = int(subsets[chosen][best])
    else:
        t, b = fit_member(chosen, base, y, content_free=content_free, temperature=temperature,
                          seed=seed)  # fmt: skip
        best, offset = base_entry, b.tolist()
    if chosen != "grid":  # the report lists every grid entry
        _, _, scores_all, temps_all = _choose(log_grid, y, temperature)
    stats = {
        "n": n,
        "n_folds": folds,
        "procedure": chosen,
        "gain": checked[chosen]["gain"],
        "gain_se": checked[chosen]["gain_se"],
        "nll_start": float(start_nll.mean()),
        "nll_fitted": checked[chosen]["nll"],
        "procedures": {
            k: {x: v[x] for x in ("gain", "gain_se", "passes", "nll")} for k, v in checked.items()
        },
        "scores": scores_all.tolist(),
        "temperatures": temps_all.tolist(),
        "fold_choices": checked[chosen]["fold_choices"],
        "offset": offset,
    }
    return best, t, not passing, stats


def fitted_probs(
    grid: np.ndarray,
    start: np.ndarray,
    entry: int,
    temperature: float,
    kept_default: bool,
    offset: Sequence[float] | None = None,
) -> np.ndarray:
    """What a fit's outcome gives on items: ``start`` as is when the rule kept it, else
    grid entry ``entry`` with its temperature (the core's last step) and, from a bias
    member, its per-label log-offset."""
    if kept_default:
        return start
    return apply_offset(_log(grid[entry]), temperature, 0.0 if offset is None else offset)


def cross_fit(
    grid: np.ndarray,
    start: np.ndarray,
    targets: Any,
    fold_ids: np.ndarray,
    **options: Any,
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Out-of-fold probabilities of the whole fit (rule included): each fold scored with
    what :func:`fit_probs` chose on the other folds (``options`` go to it). For honest
    figures, as ``semsoft eval`` cross-fits temperature scaling. A fold whose other
    folds hold fewer than the 4 items a fit needs keeps ``start``: no evidence is what
    the rule answers with the default, so a tiny evaluation still runs."""
    y = np.asarray(targets)
    out = np.empty_like(start)
    choices = []
    for fold in np.unique(fold_ids):
        held = fold_ids == fold
        if int((~held).sum()) < 4:
            out[held] = start[held]
            choices.append({"entry": None, "temperature": 1.0, "kept_default": True})
            continue
        entry, t, keep, stats = fit_probs(grid[:, ~held], start[~held], y[~held], **options)
        out[held] = fitted_probs(grid[:, held], start[held], entry, t, keep, stats["offset"])
        choices.append({"entry": entry, "temperature": t, "kept_default": keep,
                        "procedure": stats["procedure"], "offset": stats["offset"]})  # fmt: skip
    return out, choices


def single_entries(configs: Sequence[SemsoftConfig], start: SemsoftConfig) -> dict[str, int]:
    """The one-parameter procedures :func:`fit_probs` checks beside the grid, where the
    grid has their entry: ``"temperature"`` (``start`` at ``T = 1``). (Temperature
    scaling of the constrained softmax as a third procedure was measured and dropped:
    one more choice among noisy out-of-fold estimates did not lower the test NLL,
    ``docs/few-labels.md``.)"""
    wanted = {"temperature": start.replace(score_temperature=1.0)}
    out: dict[str, int] = {}
    for name, config in wanted.items():
        found = next((i for i, c in enumerate(configs) if c == config), None)
        if found is not None and found not in out.values():
            out[name] = found
    return out


def fit_config(
    kept: Kept,
    embeddings: Any,
    labels: Any,
    targets: Any,
    *,
    start: SemsoftConfig | None = None,
    grid: Mapping[str, Sequence[Any]] | None = None,
    temperature: bool = True,
    n_folds: int = 5,
    margin: float = 1.0,
    seed: int = 0,
) -> FitResult:
    """Fit Semantic Softmax's settings on labelled kept forward passes.

    Parameters
    ----------
    kept : the items' kept decision-step scores (:class:`KeptScores` or the
        evaluation package's ``Forward``)
    embeddings : the model's output embeddings (Tensor or OutputEmbeddings)
    labels : LabelSet or LabelTokens, in the column order of ``targets``
    targets : ``[N]`` label indices
    start : the setting to start from and keep unless beaten (default: the label-free
        default ``SemsoftConfig()``)
    grid : config field -> values searched over ``start`` (default: ``semantic_weight``
        over :data:`DEFAULT_WEIGHTS`); ``score_temperature`` is fitted, not searched
    temperature : fit a final temperature for every grid entry
    n_folds : stratified folds of the out-of-fold check
    margin : standard errors by which the procedure must beat ``start`` out of fold
    seed : fold seed
    """
    start = start or SemsoftConfig()
    grid = {"semantic_weight": DEFAULT_WEIGHTS} if grid is None else dict(grid)
    if "score_temperature" in grid:
        raise ValueError("score_temperature is fitted, not a grid axis (temperature=False: T=1)")
    configs = grid_configs(grid, start.replace(score_temperature=1.0))
    probs, _ = grid_probs(kept, embeddings, labels, [*configs, start])
    return fit_from_grid(
        probs, configs, start, targets, axes=list(grid), temperature=temperature,
        n_folds=n_folds, margin=margin, seed=seed,
    )  # fmt: skip


def fit_from_grid(
    probs: np.ndarray,
    configs: Sequence[SemsoftConfig],
    start: SemsoftConfig,
    targets: Any,
    *,
    axes: Sequence[str] = ("semantic_weight",),
    temperature: bool = True,
    n_folds: int = 5,
    margin: float = 1.0,
    seed: int = 0,
) -> FitResult:
    """:func:`fit_config` on probabilities already scored: ``probs`` ``[C + 1, N, L]``,
    one per config of ``configs`` and last ``start``'s (``axes``: the fields the grid
    varies, for the report)."""
    best, t, kept_default, stats = fit_probs(
        probs[:-1],
        probs[-1],
        targets,
        single=single_entries(configs, start),
        temperature=temperature,
        n_folds=n_folds,
        margin=margin,
        seed=seed,
    )
    return _result(configs, axes, best, t, kept_default, stats, start, margin)


def _result(
    configs: Sequence[SemsoftConfig],
    grid: Sequence[str],
    best: int,
    t: float,
    kept_default: bool,
    stats: dict[str, Any],
    start: SemsoftConfig,
    margin: float,
) -> FitResult:
    def axes(config: SemsoftConfig) -> dict[str, Any]:
        return {k: getattr(config, k) for k in grid}

    fitted = configs[best].replace(score_temperature=t)
    return FitResult(
        config=start if kept_default else fitted,
        fitted=fitted,
        kept_default=kept_default,
        n=stats["n"],
        n_folds=stats["n_folds"],
        gain=stats["gain"],
        gain_se=stats["gain_se"],
        margin=float(margin),
        nll_start=stats["nll_start"],
        nll_fitted=stats["nll_fitted"],
        procedure=stats["procedure"],
        procedures=stats["procedures"],
        in_sample=[
            {**axes(c), "temperature": tt, "nll": s}
            for c, s, tt in zip(configs, stats["scores"], stats["temperatures"], strict=True)
        ],
        fold_choices=[
            {**axes(configs[f["entry"]]), "temperature": f["temperature"]}
            for f in stats["fold_choices"]
        ],
    )
