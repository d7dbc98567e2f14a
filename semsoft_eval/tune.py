"""``semsoft tune``: fit Semantic Softmax's settings on labelled data, honestly.

The fit is :mod:`semsoft_plugin.core.fitting`, the one ``Classifier.fit`` runs: from the
starting setting (``--config`` or the label-free default), the grid (default: the pool
weight ``semantic_weight``; any config field can be an axis) is scored on the kept
logits of one forward pass per item (:mod:`semsoft_eval.forward`), each entry gets a
fitted final temperature, and the default is kept unless the fit beats it out of fold
by ``margin`` standard errors.

Honest figures: the whole fit (the rule included) is *nested* in cross-validation. For
each of ``n_folds`` stratified folds the setting is fitted on the other folds and applied
to the held fold; the figures printed are those out-of-fold predictions. The
configuration written to ``--output`` is then fitted on all items.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from semsoft_eval import calibrate, metrics
from semsoft_eval.forward import Forward
from semsoft_eval.preparation import prepare
from semsoft_plugin.core import fitting, kept_scores
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.tokens import as_output_embeddings

__all__ = ["DEFAULT_GRID", "TuneResult", "grid_configs", "tune", "label_cosines"]

DEFAULT_GRID: dict[str, tuple[Any, ...]] = {"semantic_weight": fitting.DEFAULT_WEIGHTS}


def grid_configs(
    grid: dict[str, Sequence[Any]] | None = None, start: SemsoftConfig | None = None
) -> list[SemsoftConfig]:
    """Every combination of the grid's values over ``start`` (unknown keys raise)."""
    return fitting.grid_configs(DEFAULT_GRID if grid is None else grid, start)


def label_cosines(embeddings: Any, labels: LabelSet, *, center: bool) -> dict[str, float]:
    """Mean and largest cosine between different labels' embeddings (their anchors)."""
    rows = as_output_embeddings(embeddings).unit_rows(
        torch.tensor(labels.label_tokens.anchors), center=center
    )
    cos = (rows @ rows.T).numpy()
    off = cos[~np.eye(len(cos), dtype=bool)]
    return {"mean": float(off.mean()), "max": float(off.max())}


@dataclass
class TuneResult:
    """What ``tune`` chose and how it measured.

    Attributes
    ----------
    config : the setting to use (the fit on all items, or the start if the rule kept it)
    fit : the fit on all items (:class:`semsoft_plugin.core.fitting.FitResult`)
    cross_validated : out-of-fold metrics of the whole fit, of ``constrained``, of
        ``constrained`` + temperature and of the starting config
    fold_choices : what the fit chose on each fold's training part
    """

    config: SemsoftConfig
    fit: fitting.FitResult
    cross_validated: dict[str, dict[str, float | None]]
    fold_choices: list[dict[str, Any]]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "fit": self.fit.to_dict(),
            "cross_validated": self.cross_validated,
            "fold_choices": self.fold_choices,
            "seconds": self.seconds,
        }


def tune(
    forward: Forward,
    embeddings: Any,
    labels: LabelSet,
    targets: np.ndarray,
    *,
    start: SemsoftConfig | None = None,
    grid: dict[str, Sequence[Any]] | None = None,
    temperature: bool = True,
    margin: float = 1.0,
    n_folds: int = 5,
    seed: int = 0,
    progress: bool = False,
    gold_sets: Sequence[Sequence[int]] | None = None,
) -> TuneResult:
    """Fit the settings with :mod:`semsoft_plugin.core.fitting`, nested in cross-validation
    for the figures (module docstring)."""
    targets = np.asarray(targets, dtype=np.int64)
    if len(targets) != forward.n:
        raise ValueError(f"{len(targets)} targets for {forward.n} items")
    start = start or SemsoftConfig()
    grid = dict(DEFAULT_GRID if grid is None else grid)
    started = time.perf_counter()
    configs = grid_configs(grid, start.replace(score_temperature=1.0))
    probs, _ = kept_scores.grid_probs(
        forward, embeddings, labels, [*configs, start], progress=progress
    )
    options = {
        "single": fitting.single_entries(configs, start),
        "temperature": temperature,
        "n_folds": n_folds,
        "margin": margin,
        "seed": seed,
    }
    fold_ids = calibrate.stratified_folds(targets, n_folds, seed)
    tuned, fold_choices = fitting.cross_fit(probs[:-1], probs[-1], targets, fold_ids, **options)
    fit = fitting.fit_from_grid(
        probs, configs, start, targets, axes=list(grid), temperature=temperature,
        n_folds=n_folds, margin=margin, seed=seed,
    )  # fmt: skip
    constrained = torch.softmax(forward.label_logits[:, : len(labels)].double(), -1).numpy()
    scaled, _ = calibrate.cross_fit_temperature(constrained, targets, fold_ids)
    cross_validated = {
        "tuned": metrics.classification_metrics(tuned, targets, gold_sets),
        "constrained": metrics.classification_metrics(constrained, targets, gold_sets),
        "temperature": metrics.classification_metrics(scaled, targets, gold_sets),
        "semantic-default": metrics.classification_metrics(probs[-1], targets, gold_sets),
    }
    for choice in fold_choices:
        entry = configs[choice.pop("entry")]
        choice["config"] = {k: getattr(entry, k) for k in grid}
    return TuneResult(fit.config, fit, cross_validated, fold_choices, time.perf_counter() - started)


def format_tune(result: TuneResult) -> str:
    """Markdown summary: the chosen config and the cross-validated comparison."""
    fit = result.fit
    cfg = result.config
    kept = (
        "kept the start (the fit did not beat it by the margin)"
        if fit.kept_default
        else (f"adopted ({fit.procedure})")
    )
    lines = [
        f"chosen: semantic_weight={cfg.semantic_weight:g} "
        f"score_temperature={cfg.score_temperature:.3f} "
        f"({kept}; out-of-fold NLL gain {fit.gain:+.4f}, se {fit.gain_se:.4f}, margin "
        f"{fit.margin:g} se)",
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
    start: SemsoftConfig | None = None,
    grid: dict[str, Sequence[Any]] | None = None,
    temperature: bool = True,
    margin: float = 1.0,
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

    ``backend``, ``engine_args`` and ``loaded`` as in :func:`semsoft_eval.preparation.prepare`.
    """
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
        start=start,
        grid=grid,
        temperature=temperature,
        margin=margin,
        n_folds=n_folds,
        seed=seed,
        progress=progress,
        gold_sets=prepared.data.gold_sets,
    )
