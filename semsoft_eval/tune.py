"""`semsoft tune`: fit Semantic Softmax's settings on labelled data, honestly.

The fit is [`fit_kept`][semsoft_plugin.app.classifier_fit.fit_kept], the one `Classifier.fit`
runs on its kept passes: every member of the family (`--fit-family`) is scored on the kept
values of one forward pass per item (`semsoft_eval.forward`), and the starting setting
(`--config` or the label-free default) is kept unless one beats it out of fold by `margin`
standard errors. A probe asked for where the kept passes have no hidden states is refused
by name.

Honest figures: the whole fit (the rule included) is nested in cross-validation
(`semsoft_eval.held_fit.cross_fit_plan`) and the figures printed are its out-of-fold
predictions. The config written to `--output` is then fitted on all items, with the
correction a bias member or the probe adds
([`semsoft_plugin.fit.fitted.save_fitted`][semsoft_plugin.fit.fitted.save_fitted]).
The family and the rule: docs/few-labels.md ("What is fitted").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from semsoft_eval import calibrate, metrics
from semsoft_eval.backends import engine_name
from semsoft_eval.forward import Forward
from semsoft_eval.held_fit import cross_fit_plan
from semsoft_eval.preparation import prepare
from semsoft_plugin.app.classifier_fit import fit_kept
from semsoft_plugin.app.classifier_settings import checked_family
from semsoft_plugin.core import kept_scores
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.tokens import as_output_embeddings
from semsoft_plugin.fit import fit_family, fitting
from semsoft_plugin.fit.fit_file import FitIdentity, output_layer_sha256
from semsoft_plugin.fit.fitted import FittedCorrection
from semsoft_plugin.fit.folds import check_fit_data, check_fit_settings
from semsoft_plugin.fit.probe import probe_refused

__all__ = ["DEFAULT_GRID", "TuneResult", "grid_configs", "tune", "label_cosines"]

DEFAULT_GRID: dict[str, tuple[Any, ...]] = {"semantic_weight": fitting.DEFAULT_WEIGHTS}
_ADVICE = (
    "the passes kept none (a vLLM engine given without the worker extension "
    "semsoft_plugin.engines.vllm.fits.FittedRows, which returns the hidden state read back from "
    "the logits row): leave 'probe' out of --fit-family, or let semsoft build the engine"
)


def grid_configs(
    grid: dict[str, Sequence[Any]] | None = None, start: SemsoftConfig | None = None
) -> list[SemsoftConfig]:
    """Every combination of the grid's values over `start` (unknown keys raise)."""
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
    """What `tune` chose and how it measured.

    Attributes
    ----------
    config : SemsoftConfig
        The setting to use (the fit on all items, or the start if the rule kept it)
    fit : fit_family.FitResult
        The fit on all items (`semsoft_plugin.fit.fitting.FitResult`)
    cross_validated : dict[str, dict[str, float | None]]
        Out-of-fold metrics of the whole fit, of `constrained`, of
        `constrained` + temperature and of the starting config
    fold_choices : list[dict[str, Any]]
        What the fit chose on each fold's training part
    correction : FittedCorrection | None
        What a bias member or the probe adds after `config` (fitted on all
        items), or None
    identity : FitIdentity | None
        What the fit was made on (labels, prompt, the model's output layer), set
        by `tune_dataset`; what `save_fitted` records beside a correction
    """

    config: SemsoftConfig
    fit: fit_family.FitResult
    cross_validated: dict[str, dict[str, float | None]]
    fold_choices: list[dict[str, Any]]
    seconds: float
    correction: FittedCorrection | None = None
    identity: FitIdentity | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "correction": None if self.correction is None else self.correction.to_dict(),
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
    fit_score_temperature: bool = True,
    margin: float = 1.0,
    n_folds: int = 5,
    seed: int = 0,
    progress: bool = False,
    gold_sets: Sequence[Sequence[int]] | None = None,
    family: Sequence[str] | None = None,
) -> TuneResult:
    """Fit the settings with [`fit_kept`][semsoft_plugin.app.classifier_fit.fit_kept], nested
    in cross-validation for the figures (module docstring). `family`: the members
    checked (`None`: all these passes allow; the probe needs `forward.hidden`)."""
    targets = np.asarray(targets, dtype=np.int64)
    if len(targets) != forward.n:
        raise ValueError(f"{len(targets)} targets for {forward.n} items")
    check_fit_data(targets, n_folds, margin)  # two labels, enough items: before the grid
    start = start or SemsoftConfig()
    grid = dict(DEFAULT_GRID if grid is None else grid)
    started = time.perf_counter()
    policy = FitPolicy(
        family=_family(family, forward),
        grid=grid,
        fit_score_temperature=fit_score_temperature,
        margin=margin,
        random_state=seed,
    )
    hidden = None if forward.hidden is None else forward.hidden.numpy()
    fold_ids = calibrate.stratified_folds(targets, n_folds, seed)
    tuned, fold_choices = cross_fit_plan(
        forward, embeddings, labels, targets, fold_ids, start, policy, n_folds=n_folds
    )
    state = fit_kept(
        forward, hidden, forward.content_free(), embeddings, labels, targets, policy, start,
        n_folds=n_folds,
    )  # fmt: skip
    assert state.result is not None  # a family was searched
    start_probs = kept_scores.grid_probs(forward, embeddings, labels, [start], progress=progress)
    constrained = torch.softmax(forward.label_logits[:, : len(labels)].double(), -1).numpy()
    scaled, _ = calibrate.cross_fit_temperature(constrained, targets, fold_ids)
    cross_validated = {
        "tuned": metrics.classification_metrics(tuned, targets, gold_sets),
        "constrained": metrics.classification_metrics(constrained, targets, gold_sets),
        "temperature": metrics.classification_metrics(scaled, targets, gold_sets),
        "semantic-default": metrics.classification_metrics(start_probs[0][0], targets, gold_sets),
    }
    seconds = time.perf_counter() - started
    return TuneResult(
        state.config, state.result, cross_validated, fold_choices, seconds, state.correction
    )


def _family(family: Sequence[str] | None, forward: Forward) -> tuple[str, ...]:
    """The members `tune` checks: `family` checked, or every member these passes
    allow (the probe where they kept hidden states); the probe asked for without
    them refused by name."""
    if family is None:
        return tuple(m for m in fitting.FAMILY if m != "probe" or forward.hidden is not None)
    names = fitting.check_family(family)
    if "probe" in names and forward.hidden is None:
        raise probe_refused(_ADVICE)
    return names


def format_tune(result: TuneResult) -> str:
    """Markdown summary: the chosen config and the cross-validated comparison."""
    fit = result.fit
    cfg = result.config
    kept = (
        "kept the start (no member beat it by the margin and kept macro-F1)"
        if fit.kept_default
        else (f"adopted ({fit.procedure})")
    )
    lines = [
        f"chosen: semantic_weight={cfg.semantic_weight:g} "
        f"score_temperature={cfg.score_temperature:.3f} "
        f"({kept}; out-of-fold NLL gain {fit.gain:+.4f}, se {fit.gain_se:.4f}, margin "
        f"{fit.margin:g} se)",
        *_correction_lines(result.correction),
        "",
        *_member_lines(fit.procedures),
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


def _member_lines(procedures: dict[str, Any]) -> list[str]:
    """Each member's out-of-fold evidence: what the rule and its macro-F1 guard read."""
    if not procedures:
        return []
    lines = [
        "each member out of fold (NLL gain and macro-F1 change over the start, with their "
        "standard errors; the temperature is the rule's floor and always passes):",
        "",
        "| member | NLL gain | se | macro-F1 change | se | passes |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in procedures.items():
        cells = [
            name,
            f"{row['gain']:+.4f}",
            f"{row['gain_se']:.4f}",
            f"{row['f1_change']:+.3f}",
            f"{row['f1_change_se']:.3f}",
            "yes" if row["passes"] else "no",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _correction_lines(correction: FittedCorrection | None) -> list[str]:
    if correction is None:
        return []
    if correction.probe is not None:
        return [f"then the probe on the hidden state (C={correction.probe.strength:g})"]
    offsets = ", ".join(
        f"{name} {value:+.3f}"
        for name, value in zip(correction.labels, correction.offset or (), strict=True)
    )
    return [f"then a per-label log-offset ({correction.procedure}): {offsets}"]


def tune_dataset(
    model: str,
    dataset: Any,
    *,
    start: SemsoftConfig | None = None,
    grid: dict[str, Sequence[Any]] | None = None,
    fit_score_temperature: bool = True,
    margin: float = 1.0,
    n_folds: int = 5,
    limit: int | None = None,
    seed: int = 0,
    template: Any = None,
    batch_size: int = 8,
    cache_dir: Any = None,
    progress: bool = True,
    loaded: tuple[Any, Any] | None = None,
    backend: str = "transformers",
    engine_args: dict[str, Any] | None = None,
    family: Sequence[str] | None = None,
    **data_options: Any,
) -> TuneResult:
    """Load data and model, run the forward passes (or read them back), then `tune`.

    `backend`, `engine_args` and `loaded` as in `semsoft_eval.preparation.prepare`.
    """
    check_fit_settings(n_folds, margin)  # before the data or the model loads
    if family is not None:
        names = fitting.check_family(family)
        # the probe where the engine's classifier cannot fit it (no hidden states)
        if "probe" in names and "probe" not in checked_family(None, engine_name(backend)):
            raise probe_refused(_ADVICE)
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
        hidden=family is None or "probe" in family,
        **data_options,
    )
    result = tune(
        prepared.forward,
        prepared.embeddings,
        prepared.labels,
        prepared.data.targets,
        start=start,
        grid=grid,
        fit_score_temperature=fit_score_temperature,
        margin=margin,
        n_folds=n_folds,
        seed=seed,
        progress=progress,
        gold_sets=prepared.data.gold_sets,
        family=family,
    )
    layer = output_layer_sha256(prepared.model_dir)
    result.identity = FitIdentity(tuple(prepared.labels.names), prepared.template.to_dict(), layer)
    return result
