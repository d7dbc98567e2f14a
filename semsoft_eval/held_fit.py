"""`semsoft eval`'s method `fit`: what `Classifier.fit` gives a user, on held folds.

On each of the run's folds, `Classifier.fit`'s own fit from the kept passes on
([`fit_kept`][semsoft_plugin.app.classifier_fit.fit_kept]: the classifier's default
family for the engine, [`fit_plan`][semsoft_plugin.app.classifier_settings.fit_plan] with
the default parameters, the out-of-fold rule with its margin and its macro-F1 guard) runs
on the other folds' items, and the state it leaves is applied to the held fold as
`Classifier.predict_proba` applies it
([`FittedState.kept_probs`][semsoft_plugin.app.fitted_state.FittedState.kept_probs]). Nothing
here fits or scores on its own: a change to the classifier's fit changes this method.

The family is the engine's: on transformers it includes the probe, which reads the
decision step's hidden states; kept passes without them (a cache from an engine that
gives none) are refused by name, never fitted with a smaller family.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from semsoft_eval.forward import Forward
from semsoft_plugin.app.classifier_fit import fit_kept
from semsoft_plugin.app.classifier_settings import fit_plan
from semsoft_plugin.app.fitted_state import FittedState
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.core.kept_scores import kept_rows
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.fit.folds import check_fit_data

__all__ = ["classifier_plan", "cross_fit_classifier", "cross_fit_plan", "fold_choice"]


def classifier_plan(
    start: SemsoftConfig, engine: str, seed: int
) -> tuple[FitPolicy, dict[str, Any]]:
    """The fit `Classifier(config=start, fit_policy=FitPolicy(random_state=seed))` on
    `engine` runs with its other parameters at their defaults, and those parameters.

    Parameters
    ----------
    start : SemsoftConfig
        The settings the fit starts from.
    engine : str
        `"transformers"` or `"vllm"`.
    seed : int
        The policy's `random_state` (the fit's fold seed).

    Returns
    -------
    tuple[FitPolicy, dict[str, Any]]
        The policy resolved for `engine`, and the classifier's parameters (`cv`, ...).
    """
    from semsoft_plugin.app.classifier import Classifier

    policy = FitPolicy(random_state=seed)
    params = Classifier(config=start, fit_policy=policy).get_params(deep=False)
    return fit_plan(params, engine), params


def cross_fit_classifier(
    forward: Forward,
    embeddings: Any,
    labels: LabelSet,
    targets: Any,
    fold_ids: np.ndarray,
    start: SemsoftConfig,
    engine: str,
    *,
    seed: int = 0,
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Out-of-fold probabilities of `Classifier.fit` (module docstring), and what it
    chose on each fold (`fold_choice`).

    A fold whose other folds are too few for a fit (`check_fit_data`: fewer than 4
    items or one label), which `Classifier.fit` would refuse, keeps `start`, and its
    choice says why (`"note"`), so a tiny evaluation still runs.

    Parameters
    ----------
    forward : Forward
        The run's kept passes (items, content-free inputs, hidden states).
    embeddings : Any
        The model's output embeddings.
    labels : LabelSet
        The labels, in prompt order (the columns of the result).
    targets : Any
        `[N]` label indices.
    fold_ids : np.ndarray
        `[N]` the fold of each item.
    start : SemsoftConfig
        The classifier's settings before the fit (the run's config).
    engine : str
        The engine that kept the passes (`"transformers"` or `"vllm"`): its default
        family is fitted.
    seed : int
        The fit policy's `random_state`.

    Returns
    -------
    tuple[np.ndarray, list[dict[str, Any]]]
        `[N, L]` float64 probabilities in `labels` order, and one choice per fold.
    """
    policy, params = classifier_plan(start, engine, seed)
    family = policy.family or ()
    if "probe" in family and forward.hidden is None:
        raise ValueError(
            f"method 'fit' is Classifier.fit's default family on {engine}, "
            f"{', '.join(family)}: the probe needs the decision step's hidden states, "
            f"which these kept passes lack (a {engine} backend that keeps none, or a cache "
            "written before they were kept); it is not fitted without the probe"
        )
    return cross_fit_plan(
        forward, embeddings, labels, targets, fold_ids, start, policy, n_folds=params["cv"]
    )


def cross_fit_plan(
    forward: Forward,
    embeddings: Any,
    labels: LabelSet,
    targets: Any,
    fold_ids: np.ndarray,
    start: SemsoftConfig,
    policy: FitPolicy,
    *,
    n_folds: int,
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Out-of-fold probabilities of the fit `policy` names (`fit_kept` on the other
    folds' items, the state applied to the held fold as predictions apply it), and each
    fold's choice: `cross_fit_classifier` with the classifier's policy, `semsoft tune`
    with its own.

    Parameters
    ----------
    forward : Forward
        The run's kept passes.
    embeddings : Any
        The model's output embeddings.
    labels : LabelSet
        The labels, in prompt order.
    targets : Any
        `[N]` label indices.
    fold_ids : np.ndarray
        `[N]` the fold of each item.
    start : SemsoftConfig
        The settings before the fit.
    policy : FitPolicy
        The fit's policy, its family resolved.
    n_folds : int
        Folds of each fit's own out-of-fold check.

    Returns
    -------
    tuple[np.ndarray, list[dict[str, Any]]]
        `[N, L]` float64 probabilities in `labels` order, and one choice per fold.
    """
    y = np.asarray(targets, dtype=np.int64)
    if len(y) != forward.n or np.shape(fold_ids) != (forward.n,):
        raise ValueError(
            f"{len(y)} targets and fold ids of shape {np.shape(fold_ids)} for {forward.n} items"
        )
    hidden = None if forward.hidden is None else forward.hidden.numpy()
    content_free = forward.content_free() if "contextual" in (policy.family or ()) else None
    names = tuple(labels.names)
    out = np.empty((forward.n, len(names)))
    choices: list[dict[str, Any]] = []
    for fold in np.unique(fold_ids):
        held = fold_ids == fold
        train, rows = np.flatnonzero(~held), np.flatnonzero(held)
        note = None
        try:
            check_fit_data(y[train], n_folds, policy.margin)
        except ValueError as error:
            state, note = FittedState(names, start), str(error)
        else:
            state = fit_kept(
                kept_rows(forward, train), None if hidden is None else hidden[train],
                content_free, embeddings, labels, y[train], policy, start, n_folds=n_folds,
            )  # fmt: skip
        out[rows], _ = state.kept_probs(
            kept_rows(forward, rows), embeddings, labels, names,
            None if hidden is None else hidden[rows],
        )  # fmt: skip
        extra = {} if note is None else {"note": note}
        choices.append({"fold": int(fold), **fold_choice(state), **extra})
    return out, choices


def fold_choice(state: FittedState) -> dict[str, Any]:
    """What a fit chose, for a report: the member (`procedure`; where the rule kept the
    start, `kept_default` is true and `procedure` is the first member checked), its
    out-of-fold gain, and the parameters predictions use: the pool weight and score
    temperature, a bias member's per-label `offset`, the probe's `C`.

    Parameters
    ----------
    state : FittedState
        A fit's state.

    Returns
    -------
    dict[str, Any]
        JSON-ready values (`None` where nothing was searched).
    """
    result, correction = state.result, state.correction
    choice: dict[str, Any] = {
        "procedure": None if result is None else result.procedure,
        "kept_default": True if result is None else result.kept_default,
        "gain": None if result is None else result.gain,
        "gain_se": None if result is None else result.gain_se,
        "semantic_weight": state.config.semantic_weight,
        "score_temperature": state.config.score_temperature,
    }
    if correction is not None and correction.offset is not None:
        choice["offset"] = [float(v) for v in correction.offset]
    if correction is not None and correction.probe is not None:
        choice["C"] = correction.probe.strength
    return choice
