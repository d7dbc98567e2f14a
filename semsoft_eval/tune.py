"""``semsoft tune``: fit Semantic Softmax's settings on a labelled dev set, honestly.

The grid (``k``, ``tau``, ``center``, ``own_vote``, ``normalize_votes``), plus an
optional final temperature, is scored on the kept logits of one forward pass per item
(:mod:`semsoft_eval.forward`), so a sweep costs no new forward passes.

Honest figures: the choice is *nested* in cross-validation. For each of ``n_folds``
stratified folds (:func:`~semsoft_eval.calibrate.stratified_folds`) the best setting is chosen (and its temperature fitted) on the other folds and
applied to the held fold; the figures printed are those out-of-fold predictions. The
configuration written to ``--out`` is then chosen on all items. The objective is mean
NLL (default) or ECE (``--objective ece``); ties go to the earlier grid entry.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from semsoft_eval import calibrate, metrics
from semsoft_eval.forward import Forward
from semsoft_plugin.config import SemsoftConfig
from semsoft_plugin.core import (
    LabelTokens,
    OutputEmbeddings,
    SemanticSoftmax,
    as_output_embeddings,
)
from semsoft_plugin.labels import LabelSet

__all__ = ["DEFAULT_GRID", "TuneResult", "grid_configs", "grid_probs", "tune", "label_cosines"]

DEFAULT_GRID: dict[str, tuple[Any, ...]] = {
    "k": (20, 50, 100, 200),
    "tau": (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5),
    "center": (True, False),
    "own_vote": (True, False),
    "normalize_votes": (False, True),
}
_EPS = 1e-12


def grid_configs(grid: dict[str, Sequence[Any]] | None = None) -> list[SemsoftConfig]:
    """Every combination of the grid's values (unknown keys raise ``ValueError``)."""
    grid = dict(DEFAULT_GRID if grid is None else grid)
    names = list(grid)
    for name in names:
        if not grid[name]:
            raise ValueError(f"grid value list for {name!r} is empty")
    return [
        SemsoftConfig().replace(**dict(zip(names, values, strict=True)))
        for values in itertools.product(*grid.values())
    ]


def _compact(
    forward: Forward, embeddings: Any, labels: LabelSet, max_k: int
) -> tuple[torch.Tensor, OutputEmbeddings, LabelTokens]:
    """Logits ``[N, U]`` over the union U of kept and label tokens, with matching rows.

    A grid sweep only ever looks at the kept top tokens and the label tokens, so it
    scores this compact vocabulary instead of ~150k columns per config; the rows come
    from :meth:`OutputEmbeddings.subset`, which keeps the whole vocabulary's mean row
    (centring) and sample (``tau_quantile``).
    """
    full = as_output_embeddings(embeddings)
    top_ids = forward.top_ids[:, :max_k].contiguous()
    tokens = labels.label_tokens
    # Anchors enter through their embedding rows only (their logits may stay -inf).
    anchors = torch.tensor(tokens.anchors, dtype=forward.label_ids.dtype)
    # A label's own spellings (automatic variants) may lie outside both the kept top-K
    # and the label ids the forwards stored; beyond the top 1024 their probability is
    # negligible, so they enter with logit -inf.
    own = torch.tensor([t for ids in tokens.own_token_ids for t in ids], dtype=anchors.dtype)
    keep = torch.unique(torch.cat([top_ids.reshape(-1), forward.label_ids, anchors, own]))
    logits = torch.full((forward.n, len(keep)), float("-inf"))
    logits.scatter_(
        1, torch.searchsorted(keep, forward.label_ids).expand(forward.n, -1), forward.label_logits
    )
    logits.scatter_(1, torch.searchsorted(keep, top_ids), forward.top_logits[:, :max_k])
    where = {int(t): i for i, t in enumerate(keep.tolist())}
    remapped = LabelTokens(
        tuple(where[t] for t in tokens.answer_token_ids),
        tuple(tuple(where[t] for t in own) for own in tokens.own_token_ids),
        None if tokens.anchor_token_ids is None else tuple(where[t] for t in tokens.anchors),
    )
    return logits, full.subset(keep), remapped


def grid_probs(
    forward: Forward,
    embeddings: Any,
    labels: LabelSet,
    configs: Sequence[SemsoftConfig],
    *,
    chunk: int = 256,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``[C, N, L]`` Semantic Softmax probabilities per config, and ``[C]`` fallback rates.

    Every config is scored by the core's :class:`SemanticSoftmax` on a compact
    vocabulary (:func:`_compact`): the same kept tokens, embeddings and mean row, so
    the same result as on the full logits rows, at a fraction of the cost.
    """
    from tqdm.auto import tqdm

    too_big = [c.k for c in configs if c.k > forward.store_k]
    if too_big:
        raise ValueError(f"k={too_big[0]} exceeds the {forward.store_k} logits kept per item")
    logits, subset, tokens = _compact(forward, embeddings, labels, max(c.k for c in configs))
    out = np.empty((len(configs), forward.n, len(labels)))
    fallback = np.zeros(len(configs))
    for c, config in enumerate(tqdm(configs, desc="grid", unit="config", disable=not progress)):
        scorer = SemanticSoftmax(subset, tokens, config)
        for start in range(0, forward.n, chunk):
            result = scorer(logits[start : start + chunk])
            out[c, start : start + chunk] = result.semantic.double().numpy()
            fallback[c] += float(result.fallback.sum())
    out /= out.sum(-1, keepdims=True)
    return out, fallback / forward.n


def label_cosines(embeddings: Any, labels: LabelSet, *, center: bool) -> dict[str, float]:
    """Mean and largest cosine between different labels' embeddings (their anchors)."""
    rows = as_output_embeddings(embeddings).unit_rows(
        torch.tensor(labels.label_tokens.anchors), center=center
    )
    cos = (rows @ rows.T).numpy()
    off = cos[~np.eye(len(cos), dtype=bool)]
    return {"mean": float(off.mean()), "max": float(off.max())}


def _objective(probs: np.ndarray, targets: np.ndarray, objective: str) -> float:
    if objective == "nll":
        return float(-np.log(np.clip(probs[np.arange(len(targets)), targets], _EPS, 1.0)).mean())
    return float(metrics.ece_numpy(probs.max(1), probs.argmax(1) == targets))


def _fit(
    probs: np.ndarray, targets: np.ndarray, objective: str, temperature: bool
) -> tuple[float, float]:
    """(score, temperature) of one config on these items."""
    if not temperature:
        return _objective(probs, targets, objective), 1.0
    t = calibrate.fit_temperature(np.log(np.clip(probs, _EPS, 1.0)), targets, objective)
    return _objective(
        calibrate.apply_temperature(np.log(np.clip(probs, _EPS, 1.0)), t), targets, objective
    ), t


def _choose(
    all_probs: np.ndarray, targets: np.ndarray, objective: str, temperature: bool
) -> tuple[int, float, np.ndarray]:
    scores = np.empty(len(all_probs))
    temps = np.empty(len(all_probs))
    for c, probs in enumerate(all_probs):
        scores[c], temps[c] = _fit(probs, targets, objective, temperature)
    best = int(np.argmin(scores))  # argmin returns the first of equal scores
    return best, float(temps[best]), scores


@dataclass
class TuneResult:
    """What ``tune`` chose and how it measured.

    Attributes
    ----------
    config : the chosen settings (with the fitted temperature), chosen on all items
    cross_validated : out-of-fold metrics of the whole procedure, of ``constrained``,
        of ``constrained`` + temperature and of the default config
    ranking : the best grid entries on all items, ``(config dict, score)``
    fold_choices : the config chosen on each fold's training part
    """

    config: SemsoftConfig
    objective: str
    cross_validated: dict[str, dict[str, float | None]]
    ranking: list[tuple[dict[str, Any], float]]
    fold_choices: list[dict[str, Any]]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "objective": self.objective,
            "cross_validated": self.cross_validated,
            "ranking": [{"config": c, "score": s} for c, s in self.ranking],
            "fold_choices": self.fold_choices,
            "seconds": self.seconds,
        }


def tune(
    forward: Forward,
    embeddings: Any,
    labels: LabelSet,
    targets: np.ndarray,
    *,
    grid: dict[str, Sequence[Any]] | None = None,
    objective: str = "nll",
    temperature: bool = True,
    n_folds: int = 5,
    seed: int = 0,
    progress: bool = False,
    gold_sets: Sequence[Sequence[int]] | None = None,
) -> TuneResult:
    """Choose Semantic Softmax settings by nested cross-validation (module docstring)."""
    if objective not in ("nll", "ece"):
        raise ValueError(f"objective={objective!r} must be 'nll' or 'ece'")
    targets = np.asarray(targets, dtype=np.int64)
    if len(targets) != forward.n:
        raise ValueError(f"{len(targets)} targets for {forward.n} items")
    start = time.perf_counter()
    configs = grid_configs(grid)
    all_probs, _ = grid_probs(forward, embeddings, labels, configs, progress=progress)
    fold_ids = calibrate.stratified_folds(targets, n_folds, seed)
    tuned = np.empty_like(all_probs[0])
    fold_choices = []
    for fold in range(n_folds):
        held = fold_ids == fold
        best, t, _ = _choose(all_probs[:, ~held], targets[~held], objective, temperature)
        log_p = np.log(np.clip(all_probs[best, held], _EPS, 1.0))
        tuned[held] = calibrate.apply_temperature(log_p, t)
        fold_choices.append(configs[best].replace(temperature=t).to_dict())
    best, t, scores = _choose(all_probs, targets, objective, temperature)
    chosen = configs[best].replace(temperature=t)

    constrained = torch.softmax(forward.label_logits[:, : len(labels)].double(), -1).numpy()
    scaled, _ = calibrate.cross_fit_temperature(constrained, targets, fold_ids, objective)
    default_probs, _ = grid_probs(forward, embeddings, labels, [SemsoftConfig()])
    cross_validated = {
        "tuned": metrics.classification_metrics(tuned, targets, gold_sets),
        "constrained": metrics.classification_metrics(constrained, targets, gold_sets),
        "temperature": metrics.classification_metrics(scaled, targets, gold_sets),
        "semantic-default": metrics.classification_metrics(default_probs[0], targets, gold_sets),
    }
    order = np.argsort(scores, kind="stable")[:10]
    ranking = [(configs[i].to_dict(), float(scores[i])) for i in order]
    return TuneResult(
        chosen, objective, cross_validated, ranking, fold_choices, time.perf_counter() - start
    )


def format_tune(result: TuneResult) -> str:
    """Markdown summary: the chosen config and the cross-validated comparison."""
    cfg = result.config
    lines = [
        f"chosen (objective {result.objective}): k={cfg.k} tau={cfg.tau:g} center={cfg.center} "
        f"own_vote={cfg.own_vote} normalize_votes={cfg.normalize_votes} temperature={cfg.temperature:.3f}",
        "",
        "cross-validated (choice nested in the folds):",
        "",
        "| method | acc | macro-F1 | ECE | Brier | NLL | AUROC |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in result.cross_validated.items():
        cells = [name] + [
            "n/a" if row[k] is None else f"{row[k]:.3f}"
            for k in ("accuracy", "macro_f1", "ece", "brier", "nll", "auroc")
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tune_dataset(
    model: str,
    dataset: Any,
    *,
    grid: dict[str, Sequence[Any]] | None = None,
    objective: str = "nll",
    temperature: bool = True,
    n_folds: int = 5,
    limit: int | None = None,
    seed: int = 0,
    template: Any = None,
    batch_size: int = 8,
    cache_dir: Any = None,
    progress: bool = True,
    loaded: tuple[Any, Any] | None = None,
    backend: str = "hf",
    engine_args: dict[str, Any] | None = None,
    **data_options: Any,
) -> TuneResult:
    """Load data and model, run the forward passes (or read them back), then :func:`tune`.

    ``backend``, ``engine_args`` and ``loaded`` as in :func:`semsoft_eval.evaluate.prepare`.
    """
    from semsoft_eval.evaluate import prepare

    prepared = prepare(
        model,
        dataset,
        limit=limit,
        seed=seed,
        template=template,
        batch_size=batch_size,
        cache_dir=cache_dir,
        progress=progress,
        loaded=loaded,
        backend=backend,
        engine_args=engine_args,
        min_items=2 * n_folds,
        **data_options,
    )
    return tune(
        prepared.forward,
        prepared.embeddings,
        prepared.labels,
        prepared.data.targets,
        grid=grid,
        objective=objective,
        temperature=temperature,
        n_folds=n_folds,
        seed=seed,
        progress=progress,
        gold_sets=prepared.data.gold_sets,
    )
