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

Everything is computed from *kept forward passes*: per item the top ``S`` decision-step
logits (or log-probabilities) and those of every label token (:class:`KeptScores`), one
forward pass per item whatever the grid. ``Classifier.fit`` keeps them from its engine;
``semsoft eval`` / ``semsoft tune`` keep them on disk (``semsoft_eval.forward.Forward``,
which has the same fields).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.result import LabelResult
from semsoft_plugin.core.softmax import SemanticSoftmax
from semsoft_plugin.core.tokens import LabelTokens, as_label_tokens, as_output_embeddings

__all__ = [
    "DEFAULT_WEIGHTS",
    "FitResult",
    "Kept",
    "KeptScores",
    "apply_temperature",
    "compress",
    "fit_config",
    "fit_from_grid",
    "fit_probs",
    "fitted_probs",
    "cross_fit",
    "single_entries",
    "fit_temperature",
    "grid_configs",
    "grid_probs",
    "kept_from_top_logprobs",
    "label_token_ids",
    "nll",
    "stratified_folds",
]

# The pool weights searched by default: from the constrained softmax (0) to the
# semantic distribution alone (1).
DEFAULT_WEIGHTS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))
# Temperatures searched: wide enough for a twenty-fold over- or under-confident model.
LOG_T_BOUNDS = (math.log(0.05), math.log(20.0))
_EPS = 1e-12
# The core floors probabilities at this value before a log (core._tempered).
_FLOOR = 1e-30


class Kept(Protocol):
    """What grid scoring reads from kept forward passes (``KeptScores`` or
    ``semsoft_eval.forward.Forward``)."""

    top_ids: Tensor
    top_logits: Tensor
    label_ids: Tensor
    label_logits: Tensor


@dataclass
class KeptScores:
    """Decision-step scores of N items, compressed losslessly for Semantic Softmax with
    any ``k <= S``.

    Attributes
    ----------
    top_ids, top_logits : ``[N, S]`` the S highest raw logits (or log-probabilities) per
        item, highest first, and their token ids
    label_ids : ``[M]`` every label's answer token, then its own-token variants
    label_logits : ``[N, M]`` their raw values (``-inf`` where unknown)
    """

    top_ids: Tensor
    top_logits: Tensor
    label_ids: Tensor
    label_logits: Tensor


def label_token_ids(labels: Any) -> list[int]:
    """Every label's answer token, then the own-token variants not already listed (the
    answer tokens come first). ``labels``: a LabelSet or LabelTokens."""
    tokens = as_label_tokens(labels)
    ids = list(tokens.answer_token_ids)
    ids += [t for own in tokens.own_token_ids for t in own if t not in ids]
    return ids


def compress(rows: Tensor, store_k: int, label_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(top_ids, top_values, label_values)`` of ``[N, V]`` decision-step rows."""
    rows = rows.to(torch.float32)
    values, ids = torch.topk(rows, min(store_k, rows.shape[1]), dim=-1)
    return ids, values, rows.index_select(1, label_ids)


def kept_from_top_logprobs(results: Sequence[LabelResult], token_ids: Sequence[int]) -> KeptScores:
    """:class:`KeptScores` from ``classify_vllm(..., keep_logprobs=S, token_ids=...)``
    results (``top_logprobs``: id -> raw log-prob, ``token_logprobs`` for ``token_ids``),
    top values sorted highest first."""
    tops = [r.top_logprobs for r in results if r.top_logprobs is not None]
    if len(tops) != len(results):
        raise ValueError("a result without top_logprobs: pass keep_logprobs=... to classify_vllm")
    named = [r.token_logprobs or {} for r in results]  # None when token_ids was empty
    widths = {len(top) for top in tops}
    if len(widths) != 1:
        raise ValueError(f"the engine returned ragged top log-probabilities (widths {widths})")
    ids = torch.tensor([list(top) for top in tops], dtype=torch.long)
    values = torch.tensor([list(top.values()) for top in tops], dtype=torch.float32)
    values, order = values.sort(dim=1, descending=True)
    label_values = torch.tensor(
        [[found[t] for t in token_ids] for found in named], dtype=torch.float32
    )
    return KeptScores(ids.gather(1, order), values, torch.tensor(list(token_ids)), label_values)


# -- grid scoring ------------------------------------------------------------------


def grid_configs(
    grid: Mapping[str, Sequence[Any]], start: SemsoftConfig | None = None
) -> list[SemsoftConfig]:
    """Every combination of the grid's values over ``start`` (unknown keys raise)."""
    start = start or SemsoftConfig()
    names = list(grid)
    for name in names:
        if not grid[name]:
            raise ValueError(f"grid value list for {name!r} is empty")
    return [
        start.replace(**dict(zip(names, values, strict=True)))
        for values in itertools.product(*(grid[n] for n in names))
    ]


def _compact(
    kept: Kept, embeddings: Any, tokens: LabelTokens, max_k: int
) -> tuple[Tensor, Any, LabelTokens]:
    """Logits ``[N, U]`` over the union U of kept, label and own tokens, with matching
    embedding rows.

    A grid sweep only ever looks at the kept top tokens and the label tokens, so it
    scores this compact vocabulary instead of ~150k columns per config; the rows come
    from ``OutputEmbeddings.subset``, which keeps the whole vocabulary's mean row
    (centring) and sample (``tau_quantile``). Own-token variants the kept values lack
    (a label set with more spellings than the pass kept) enter with ``-inf``: they can
    only act as kept tokens, and a kept token is in ``top_ids``.
    """
    full = as_output_embeddings(embeddings)
    top_ids = kept.top_ids[:, :max_k].contiguous()
    n = top_ids.shape[0]
    label_ids = kept.label_ids.to(top_ids.dtype)
    extra = torch.tensor(
        [*tokens.anchors, *(t for own in tokens.own_token_ids for t in own)], dtype=top_ids.dtype
    )
    keep = torch.unique(torch.cat([top_ids.reshape(-1), label_ids, extra]))  # sorted
    logits = torch.full((n, len(keep)), float("-inf"))
    logits.scatter_(1, torch.searchsorted(keep, label_ids).expand(n, -1), kept.label_logits.float())
    logits.scatter_(1, torch.searchsorted(keep, top_ids), kept.top_logits[:, :max_k].float())
    where = {int(t): i for i, t in enumerate(keep.tolist())}
    remapped = LabelTokens(
        tuple(where[t] for t in tokens.answer_token_ids),
        tuple(tuple(where[t] for t in own) for own in tokens.own_token_ids),
        None if tokens.anchor_token_ids is None else tuple(where[t] for t in tokens.anchors),
    )
    return logits, full.subset(keep), remapped


def grid_probs(
    kept: Kept,
    embeddings: Any,
    labels: Any,
    configs: Sequence[SemsoftConfig],
    *,
    chunk: int = 256,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``[C, N, L]`` Semantic Softmax probabilities per config, and ``[C]`` fallback rates.

    Every config is scored by the core's :class:`SemanticSoftmax` on a compact
    vocabulary (:func:`_compact`): the same kept tokens, embeddings and mean row, so
    the same result as on the full logits rows, at a fraction of the cost.
    ``labels``: a LabelSet or LabelTokens.
    """
    from tqdm.auto import tqdm

    store_k = int(kept.top_ids.shape[1])
    too_big = [c.k for c in configs if c.k > store_k]
    if too_big:
        raise ValueError(f"k={too_big[0]} exceeds the {store_k} logits kept per item")
    tokens = as_label_tokens(labels)
    logits, subset, remapped = _compact(kept, embeddings, tokens, max(c.k for c in configs))
    n = logits.shape[0]
    out = np.empty((len(configs), n, len(tokens)))
    fallback = np.zeros(len(configs))
    for c, config in enumerate(tqdm(configs, desc="grid", unit="config", disable=not progress)):
        scorer = SemanticSoftmax(subset, remapped, config)
        for start in range(0, n, chunk):
            result = scorer(logits[start : start + chunk])
            out[c, start : start + chunk] = result.semantic.double().numpy()
            fallback[c] += float(result.fallback.sum())
    out /= out.sum(-1, keepdims=True)
    return out, fallback / max(n, 1)


# -- folds and temperature -----------------------------------------------------------


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
    checked: dict[str, dict[str, Any]] = {}
    for name, entries in subsets.items():
        fitted_nll, choices = _out_of_fold(log_grid[entries], y, fold_ids, temperature)
        diff = start_nll - fitted_nll
        gain, se = float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(n))
        for choice in choices:
            choice["entry"] = int(entries[choice["entry"]])
        checked[name] = {
            "gain": gain,
            "gain_se": se,
            "passes": gain > 0 and gain > margin * se,
            "nll": float(fitted_nll.mean()),
            "fold_choices": choices,
        }
    passing = [k for k, v in checked.items() if v["passes"]]
    chosen = max(passing, key=lambda k: checked[k]["gain"]) if passing else "grid"
    entries = subsets[chosen]
    best, t, scores, temps = _choose(log_grid[entries], y, temperature)
    best = int(entries[best])
    if chosen == "grid":
        scores_all, temps_all = scores, temps
    else:
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
    }
    return best, t, not passing, stats


def fitted_probs(
    grid: np.ndarray, start: np.ndarray, entry: int, temperature: float, kept_default: bool
) -> np.ndarray:
    """What a fit's outcome gives on items: ``start`` as is when the rule kept it, else
    grid entry ``entry`` with its temperature (the core's last step)."""
    return start if kept_default else apply_temperature(_log(grid[entry]), temperature)


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
        entry, t, keep, _ = fit_probs(grid[:, ~held], start[~held], y[~held], **options)
        out[held] = fitted_probs(grid[:, held], start[held], entry, t, keep)
        choices.append({"entry": entry, "temperature": t, "kept_default": keep})
    return out, choices


def single_entries(configs: Sequence[SemsoftConfig], start: SemsoftConfig) -> dict[str, int]:
    """The one-parameter procedures :func:`fit_probs` checks beside the grid, where the
    grid has their entry: ``"temperature"`` (``start`` at ``T = 1``). (Temperature
    scaling of the constrained softmax as a third procedure was measured and dropped:
    one more choice among noisy out-of-fold estimates did not lower the test NLL,
    ``docs/few-labels.md``.)"""
    wanted = {"temperature": start.replace(temperature=1.0)}
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
    kept : the items' kept decision-step scores (:class:`KeptScores` or a
        ``semsoft_eval`` ``Forward``)
    embeddings : the model's output embeddings (Tensor or OutputEmbeddings)
    labels : LabelSet or LabelTokens, in the column order of ``targets``
    targets : ``[N]`` label indices
    start : the setting to start from and keep unless beaten (default: the label-free
        default ``SemsoftConfig()``)
    grid : config field -> values searched over ``start`` (default: ``semantic_weight``
        over :data:`DEFAULT_WEIGHTS`); ``temperature`` is fitted, not searched
    temperature : fit a final temperature for every grid entry
    n_folds : stratified folds of the out-of-fold check
    margin : standard errors by which the procedure must beat ``start`` out of fold
    seed : fold seed
    """
    start = start or SemsoftConfig()
    grid = {"semantic_weight": DEFAULT_WEIGHTS} if grid is None else dict(grid)
    if "temperature" in grid:
        raise ValueError("temperature is fitted, not a grid axis (temperature=False: keep T=1)")
    configs = grid_configs(grid, start.replace(temperature=1.0))
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

    fitted = configs[best].replace(temperature=t)
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
