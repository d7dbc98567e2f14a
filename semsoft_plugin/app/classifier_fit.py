"""`Classifier.fit` on labels, as helpers with explicit arguments: the labels `y`
names, and the labelled fit (one kept forward pass per text through the
`semsoft_plugin.app.scorer.Scorer`, then the core's search over the family,
[`semsoft_plugin.fit.fit_family.fit_config`][semsoft_plugin.fit.fit_family.fit_config], the one `semsoft tune` runs, with the
probe fitted here where the engine exposes the hidden state). What the fit leaves is a
`semsoft_plugin.app.fitted_state.FittedState`.

The fit from the kept passes on is one function, `fit_kept`: `Classifier.fit` runs it
on the texts it was given, and `semsoft eval`'s method `fit` on each fold's training
items (then applies the state to the held fold as predictions do,
[`FittedState.kept_probs`][semsoft_plugin.app.fitted_state.FittedState.kept_probs]), so
the evaluation measures what a user gets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from semsoft_plugin.app.fitted_state import FittedState
from semsoft_plugin.app.scorer import Scorer
from semsoft_plugin.app.texts import target_list
from semsoft_plugin.core.calibration import CONTENT_FREE
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.core.kept_scores import Kept, kept_rows
from semsoft_plugin.core.labels import LabelSet, label_names
from semsoft_plugin.engines.prompting import build_inputs
from semsoft_plugin.fit import fit_family
from semsoft_plugin.fit.fit_family import FitResult
from semsoft_plugin.fit.fitted import FittedCorrection
from semsoft_plugin.fit.probe import fit_probe, label_logit_rows, probe_member

__all__ = ["fit_kept", "fit_labelled", "fit_targets", "fitted_correction"]


def fit_targets(
    values: list[str], y: Any, names: list[str] | None, *, unlabelled: bool
) -> tuple[list[str], list[int] | None]:
    """The label names a fit fits and `y` as their indices, each bad value refused by
    name.

    Parameters
    ----------
    values : list[str]
        The texts (checked).
    y : Any
        Their labels, or `None`.
    names : list[str] | None
        The classifier's labels in prompt order; `None`: the sorted labels of `y`.
    unlabelled : bool
        Whether `y is None` is the file mode's unlabelled fit.

    Returns
    -------
    tuple[list[str], list[int] | None]
        The names, and `y` as indices into them (`None` for the unlabelled fit).
    """
    if unlabelled and names is None:
        raise ValueError("fit(texts) without y needs labels=[...]: texts do not name them")
    if y is None and not unlabelled:  # scikit-learn's words (check_requires_y_none)
        raise ValueError(
            "Classifier requires y to be passed, but the target y is None (only "
            "calibrate='file' fits on texts alone)"
        )
    given = [] if y is None else target_list(y, len(values))
    names = names if names is not None else label_names(sorted(set(given)))
    index = {name: i for i, name in enumerate(names)}
    unknown = [label for label in given if label not in index]
    if unknown:
        raise ValueError(f"y holds {unknown[0]!r}, which is not a label; labels: {names}")
    return names, None if unlabelled else [index[label] for label in given]


def fit_labelled(
    scorer: Scorer,
    values: list[str],
    targets: Sequence[int],
    policy: FitPolicy,
    *,
    n_folds: int,
    folds: np.ndarray | None = None,
    sample_weight: Any = None,
) -> FittedState:
    """The labelled fit on `values` (label indices `targets` in `scorer.labels`
    order), from `scorer.config` as `policy` says: one kept forward pass per text (and
    per content-free input where `"contextual"` is checked), then `fit_kept`.

    Parameters
    ----------
    scorer : Scorer
        The classifier's scorer for these labels.
    values : list[str]
        The texts.
    targets : Sequence[int]
        Their label indices.
    policy : FitPolicy
        The fit's policy, resolved (`semsoft_plugin.app.classifier_settings.fit_plan`).
    n_folds : int
        Folds of the out-of-fold check.
    folds : np.ndarray | None
        A fold id per item (a splitter's), instead of `n_folds` stratified folds.
    sample_weight : Any
        `[N]` non-negative weights of the items' NLL (`None`: 1 each).

    Returns
    -------
    FittedState
        What the fit chose and the correction it adopted.
    """
    family = policy.family or ()
    start = scorer.config
    grid = fit_family.policy_grid(policy)
    store_k = max(c.k for c in fit_family.configs_with_start(grid, start)[0])
    inputs = scorer.fitter.prompts(values)[0]
    names = list(scorer.labels.names)
    if "contextual" in family:  # the content-free inputs ride in the same pass
        tokenizer = scorer.loaded.tokenizer
        inputs += build_inputs(scorer.prompt, list(CONTENT_FREE), names, tokenizer)
    kept, hidden = scorer.kept(inputs, store_k, hidden="probe" in family)
    n = len(values)
    items, content_free = kept_rows(kept, slice(0, n)), kept_rows(kept, slice(n, None))
    return fit_kept(
        items, None if hidden is None else hidden[:n].numpy(),
        content_free if "contextual" in family else None, scorer.loaded.embeddings(),
        scorer.labels, targets, policy, start, n_folds=n_folds, folds=folds,
        sample_weight=sample_weight,
    )  # fmt: skip


def fit_kept(
    kept: Kept,
    hidden: np.ndarray | None,
    content_free: Kept | None,
    embeddings: Any,
    labels: LabelSet,
    targets: Sequence[int] | np.ndarray,
    policy: FitPolicy,
    start: SemsoftConfig,
    *,
    n_folds: int,
    folds: np.ndarray | None = None,
    sample_weight: Any = None,
) -> FittedState:
    """`Classifier.fit`'s fit once the forward passes are kept: the family `policy`
    names searched from `start`
    ([`fit_config`][semsoft_plugin.fit.fit_family.fit_config], the rule and its
    guard included), the probe fitted here, and the correction the adopted member adds.
    `semsoft eval`'s method `fit` runs this on each fold's training items (one
    implementation).

    Parameters
    ----------
    kept : Kept
        The labelled items' kept decision-step scores.
    hidden : np.ndarray | None
        `[N, H]` their decision step's hidden states (needed where `policy` checks the
        probe, else unread).
    content_free : Kept | None
        The content-free inputs' kept scores (needed where `policy` checks
        `"contextual"`, else unread).
    embeddings : Any
        The model's output embeddings.
    labels : LabelSet
        The labels, in prompt order (the columns of `targets`).
    targets : Sequence[int] | np.ndarray
        `[N]` label indices.
    policy : FitPolicy
        The fit's policy, its family resolved (`classifier_settings.fit_plan`).
    start : SemsoftConfig
        The settings the fit starts from and keeps unless beaten.
    n_folds : int
        Folds of the out-of-fold check.
    folds : np.ndarray | None
        A fold id per item (a splitter's), instead of `n_folds` stratified folds.
    sample_weight : Any
        `[N]` non-negative weights of the items' NLL (`None`: 1 each).

    Returns
    -------
    FittedState
        The settings, the correction (`None`: the config alone) and the
        [`FitResult`][semsoft_plugin.fit.fit_family.FitResult].
    """
    family = policy.family or ()
    seed, succession = policy.random_state, policy.succession
    names = list(labels.names)
    weighted = {} if sample_weight is None else {"sample_weight": sample_weight}
    y = np.asarray(targets, dtype=np.int64)
    if "probe" in family and hidden is None:
        raise ValueError(
            f"the fit family {list(family)} checks the probe, which reads the decision step's "
            "hidden states: these kept passes have none"
        )
    if "contextual" in family and content_free is None:
        raise ValueError(
            f"the fit family {list(family)} checks 'contextual', which reads the content-free "
            "inputs' kept passes: none were given"
        )
    x = None if hidden is None or "probe" not in family else np.asarray(hidden)
    external = {}
    label_rows = None if x is None else label_logit_rows(embeddings, labels)
    if x is not None:
        external["probe"] = probe_member(x, y, len(names), label_rows=label_rows, seed=seed,
                                         succession=succession, **weighted)  # fmt: skip
    result = fit_family.fit_config(
        kept, embeddings, labels, y, start=start, policy=policy, n_folds=n_folds, folds=folds,
        content_free=content_free if "contextual" in family else None, external=external,
        **weighted,
    )  # fmt: skip
    correction = fitted_correction(result, tuple(names), x, y, label_rows=label_rows,
                                   **weighted)  # fmt: skip
    return FittedState(tuple(names), result.config, correction, result)


def fitted_correction(
    result: FitResult,
    names: tuple[str, ...],
    hidden: np.ndarray | None,
    targets: np.ndarray,
    *,
    label_rows: np.ndarray | None,
    sample_weight: Any = None,
) -> FittedCorrection | None:
    """What the member a fit adopted adds after its config, fitted on all its items:
    the probe (`fit_probe`), or a bias member's offset; `None` where the rule kept
    the start or a grid or temperature member won (the config alone).

    Parameters
    ----------
    result : FitResult
        The fit's outcome.
    names : tuple[str, ...]
        The label names, in the columns of `targets`.
    hidden : np.ndarray | None
        `[N, H]` the items' hidden states (read where the probe won).
    targets : np.ndarray
        `[N]` label indices.
    label_rows : np.ndarray | None
        `[L, H]` the labels' answer-token output rows
        ([`label_logit_rows`][semsoft_plugin.fit.probe.label_logit_rows]; read where the probe won).
    sample_weight : Any
        `[N]` the items' weights (`None`: 1 each).

    Returns
    -------
    FittedCorrection | None
        The correction.
    """
    if result.kept_default or result.procedure in ("grid", "temperature"):
        return None
    if result.procedure == "probe":
        if hidden is None or label_rows is None:
            raise ValueError(
                "the probe won the fit, but no hidden states and label rows were given to fit it"
            )
        policy = result.policy  # the probe's inner folds and targets follow the fit's policy
        fitted = fit_probe(hidden, targets, len(names), label_rows=label_rows,
                           seed=policy.random_state, sample_weight=sample_weight,
                           succession=policy.succession)  # fmt: skip
        return FittedCorrection("probe", names, probe=fitted)
    offset = tuple(float(v) for v in result.offset or ())
    return FittedCorrection(result.procedure, names, offset=offset)
