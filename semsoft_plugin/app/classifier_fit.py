"""`Classifier.fit` on labels, as helpers with explicit arguments: the labels `y`
names, and the labelled fit (one kept forward pass per text through the
`semsoft_plugin.app.scorer.Scorer`, then the core's search over the family,
[`semsoft_plugin.core.fit_family.fit_config`][semsoft_plugin.core.fit_family.fit_config], the one `semsoft tune` runs, with the
probe fitted here where the engine exposes the hidden state). What the fit leaves is a
`semsoft_plugin.app.fitted_state.FittedState`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from semsoft_plugin.app.classifier_settings import FitPlan
from semsoft_plugin.app.fitted import FittedCorrection
from semsoft_plugin.app.fitted_state import FittedState
from semsoft_plugin.app.probe import fit_probe, probe_anchor, probe_member
from semsoft_plugin.app.scorer import Scorer
from semsoft_plugin.app.texts import target_list
from semsoft_plugin.core import fit_family
from semsoft_plugin.core.calibration import CONTENT_FREE
from semsoft_plugin.core.kept_scores import KeptScores
from semsoft_plugin.core.labels import label_names
from semsoft_plugin.engines.prompting import build_inputs

__all__ = ["fit_labelled", "fit_targets"]


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


def _split(kept: KeptScores, n: int) -> tuple[KeptScores, KeptScores]:
    def part(rows: slice) -> KeptScores:
        return KeptScores(kept.top_ids[rows], kept.top_logits[rows], kept.label_ids,
                          kept.label_logits[rows])  # fmt: skip

    return part(slice(0, n)), part(slice(n, None))


def fit_labelled(
    scorer: Scorer,
    values: list[str],
    targets: Sequence[int],
    plan: FitPlan,
    *,
    n_folds: int,
    margin: float,
    seed: int,
    sample_weight: Any = None,
) -> FittedState:
    """The labelled fit on `values` (label indices `targets` in `scorer.labels`
    order), from `scorer.config` as `plan` says; what it chose and the correction it
    adopted (`None`: the config alone).

    Parameters
    ----------
    scorer : Scorer
        The classifier's scorer for these labels.
    values : list[str]
        The texts.
    targets : Sequence[int]
        Their label indices.
    plan : FitPlan
        The members, grid and temperature (`semsoft_plugin.app.classifier_settings.fit_plan`).
    n_folds : int
        Folds of the out-of-fold check.
    margin : float
        The rule's margin in standard errors.
    seed : int
        The fold seed.
    sample_weight : Any
        `[N]` non-negative weights of the items' NLL (`None`: 1 each).
    """
    import numpy as np

    family = plan.family
    weighted = {} if sample_weight is None else {"sample_weight": sample_weight}
    start = scorer.config
    store_k = max(c.k for c in fit_family.configs_with_start(plan.axes, start)[0])
    inputs = scorer.fitter.prompts(values)[0]
    names = list(scorer.labels.names)
    if "contextual" in family:  # the content-free inputs ride in the same pass
        tokenizer = scorer.loaded.tokenizer
        inputs += build_inputs(scorer.prompt, list(CONTENT_FREE), names, tokenizer)
    kept, hidden = scorer.kept(inputs, store_k, hidden="probe" in family)
    kept, content_free = _split(kept, len(values))
    y = np.asarray(targets, dtype=np.int64)
    external = {}
    embeddings = scorer.loaded.embeddings()
    if hidden is not None:
        x = hidden[: len(values)].numpy()
        anchor = probe_anchor(embeddings, scorer.labels)
        external["probe"] = probe_member(x, y, len(names), anchor=anchor, seed=seed, **weighted)
    result = fit_family.fit_config(
        kept, embeddings, scorer.labels, y, start=start, grid=plan.axes,
        temperature=plan.temperature, n_folds=n_folds, margin=margin, seed=seed,
        family=family, content_free=content_free if "contextual" in family else None,
        external=external, **weighted,
    )  # fmt: skip
    correction = None
    if not result.kept_default and result.procedure == "probe":
        fitted = fit_probe(x, y, len(names), anchor=anchor, seed=seed, **weighted)
        correction = FittedCorrection("probe", tuple(names), probe=fitted)
    elif not result.kept_default and result.procedure not in ("grid", "temperature"):
        offset = tuple(float(v) for v in result.offset or ())
        correction = FittedCorrection(result.procedure, tuple(names), offset=offset)
    return FittedState(tuple(names), result.config, correction, result)
