"""The few-label fit over the whole family, on kept forward passes: what
`Classifier.fit` and `semsoft tune` run (one implementation for both).

The family (`semsoft_plugin.fit.fitting.FAMILY`): the pool weight over a grid with a
temperature (`"grid"`), a temperature alone (`"temperature"`), the bias corrections
(`"offset"`, `"batch"`, `"contextual"`: `semsoft_plugin.fit.label_offsets`) and a probe on
the decision step's hidden state (`"probe"`, fitted by the caller, who has scikit-learn and
the hidden states), each scored out of fold under the rule of
`semsoft_plugin.fit.fitting.fit_probs`. What the fit gives is applied to each row alone: a
[`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig] (its `score_temperature` the
last step) and, for a bias member, a per-label log-offset after it (`FitResult.offset`,
`softmax(log p_config + offset)`; for `"batch"` the mean of the *fitted* rows, estimated
once). The members and the rule: docs/few-labels.md ("What is fitted", "The rule").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.core.kept_scores import Kept, grid_probs
from semsoft_plugin.fit.fitting import (
    DEFAULT_WEIGHTS,
    FAMILY,
    External,
    check_family,
    fit_probs,
    grid_configs,
    single_entries,
)

__all__ = [
    "FitResult",
    "configs_with_start",
    "default_family",
    "fit_config",
    "fit_from_grid",
    "policy_grid",
]


@dataclass
class FitResult:
    """What [`fit_config`][semsoft_plugin.fit.fit_family.fit_config] chose and why.

    Attributes
    ----------
    config : SemsoftConfig
        The setting to use: the fitted one, or `start` when the rule kept it
    fitted : SemsoftConfig
        The best setting on all labels (whether or not it was adopted)
    kept_default : bool
        True when the rule kept `start`
    n : int
        Labelled items
    n_folds : int
        Folds of the out-of-fold check
    gain : float
        Mean out-of-fold NLL gain of the fitting procedure over `start` (> 0: better)
    gain_se : float
        Its standard error (paired over items)
    margin : float
        The policy's margin (read from `policy`): a member other than the temperature is
        adopted when `gain > margin * gain_se`, `gain > 0` and it beats the temperature by
        `margin` standard errors
    nll_start, nll_fitted : float
        Out-of-fold mean NLL of `start` and of the procedure
    procedure : str
        The family member adopted (when none passed, the first member checked,
        `"grid"` by default): `"grid"` (every grid entry with its temperature),
        `"temperature"` (a temperature on `start` alone), `"offset"`, `"batch"`,
        `"contextual"` (`config` then `offset`) or `"probe"` (the caller's)
    procedures : dict[str, Any]
        Each checked member's gain and its standard error, its out-of-fold macro-F1
        change and that change's bootstrap standard error (`f1_change`, `f1_change_se`),
        whether it showed its gain (`shows_gain`), whether it passed the rule with the
        macro-F1 guard (`passes`: the temperature, the floor, always does), and its NLL
    offset : list[float] | None
        A bias member's per-label log-offset, in the targets' label order, added
        after `config` (`None` for the other members)
    in_sample : list[dict[str, Any]]
        Per grid entry, the training NLL with its own fitted temperature
    fold_choices : list[dict[str, Any]]
        The setting chosen on each fold's training part
    policy : FitPolicy
        What was searched and the rule that chose

    Examples
    --------
    What `Classifier.fit` chose (`fit_result_`), or `semsoft tune`'s report:

    ```python
    import json

    from semsoft_plugin import Classifier

    clf = Classifier("default", labels=["negative", "positive"]).fit(texts, y)
    result = clf.fit_result_
    result.kept_default       # True: the rule kept the start (the labels showed no gain)
    result.procedure          # the member adopted, e.g. "offset"
    result.gain, result.gain_se   # out-of-fold NLL gain over the start, and its standard error
    result.config             # the SemsoftConfig every prediction uses
    print(json.dumps(result.to_dict(), indent=2))   # every member checked, with its gain and guard
    ```
    """

    config: SemsoftConfig
    fitted: SemsoftConfig
    kept_default: bool
    n: int
    n_folds: int
    gain: float
    gain_se: float
    nll_start: float
    nll_fitted: float
    procedure: str = "grid"
    procedures: dict[str, Any] = field(default_factory=dict)
    offset: list[float] | None = None
    in_sample: list[dict[str, Any]] = field(default_factory=list)
    fold_choices: list[dict[str, Any]] = field(default_factory=list)
    policy: FitPolicy = field(default_factory=FitPolicy)

    @property
    def margin(self) -> float:
        """The rule's margin in standard errors, the policy's."""
        return float(self.policy.margin)

    @property
    def label_offset(self) -> list[float] | None:
        """The offset predictions apply: `offset` when the rule adopted it, else None."""
        return None if self.kept_default else self.offset

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
            "offset": self.offset,
            "in_sample": self.in_sample,
            "fold_choices": self.fold_choices,
            "fit_policy": self.policy.to_dict(),
        }


def configs_with_start(
    grid: Mapping[str, Sequence[Any]], start: SemsoftConfig
) -> tuple[list[SemsoftConfig], int]:
    """The grid's configs over `start` at `T = 1`, with that start itself appended
    where the grid lacks it (the temperature alone and the bias members fit on it, the
    `"grid"` member does not), and how many are the grid's."""
    if "score_temperature" in grid:
        raise ValueError("score_temperature is fitted, not a grid axis (temperature=False: T=1)")
    base = start.replace(score_temperature=1.0)
    configs = grid_configs(grid, base)
    return (configs, len(configs)) if base in configs else ([*configs, base], len(configs))


def fit_config(
    kept: Kept,
    embeddings: Any,
    labels: Any,
    targets: Any,
    *,
    start: SemsoftConfig | None = None,
    policy: FitPolicy | None = None,
    n_folds: int = 5,
    folds: np.ndarray | None = None,
    content_free: Kept | None = None,
    external: Mapping[str, External] | None = None,
    sample_weight: Any = None,
) -> FitResult:
    """Fit Semantic Softmax's settings on labelled kept forward passes.

    Parameters
    ----------
    kept : Kept
        The items' kept decision-step scores (`KeptScores` or the
        evaluation package's `Forward`)
    embeddings : Any
        The model's output embeddings (Tensor or OutputEmbeddings)
    labels : Any
        LabelSet or LabelTokens, in the column order of `targets`
    targets : Any
        `[N]` label indices
    start : SemsoftConfig | None
        The setting to start from and keep unless beaten (default: the label-free
        default `SemsoftConfig()`)
    policy : FitPolicy | None
        What is searched and the rule ([`FitPolicy`][semsoft_plugin.core.fit_policy.FitPolicy];
        default `FitPolicy()`). Its `family=None`: every member these inputs allow (the
        contextual one needs `content_free`, the probe `external["probe"]`)
    n_folds : int
        Stratified folds of the out-of-fold check
    folds : np.ndarray | None
        A fold id per item (a caller's splitter) instead of `n_folds` stratified folds
    content_free : Kept | None
        The content-free inputs' kept scores (`"contextual"`)
    external : Mapping[str, External] | None
        Name -> a member the caller fits (`semsoft_plugin.fit.fitting.fit_probs`)
    sample_weight : Any
        `[N]` weights counting the items in every fit and in the rule
        (`None`: 1 each; `semsoft_plugin.fit.fitting.fit_probs`)
    """
    start = start or SemsoftConfig()
    policy = FitPolicy() if policy is None else policy
    grid = policy_grid(policy)
    configs, grid_size = configs_with_start(grid, start)
    probs, _ = grid_probs(kept, embeddings, labels, [*configs, start])
    cf = None
    if content_free is not None:
        base = [start.replace(score_temperature=1.0)]
        cf = grid_probs(content_free, embeddings, labels, base)[0][0]
    return fit_from_grid(
        probs, configs, start, targets, axes=list(grid), policy=policy, n_folds=n_folds,
        folds=folds, content_free=cf, external=external, grid_size=grid_size,
        sample_weight=sample_weight,
    )  # fmt: skip


def policy_grid(policy: FitPolicy) -> dict[str, Sequence[Any]]:
    """What the member `"grid"` searches under `policy`: its `grid`, by default
    `semantic_weight` over `DEFAULT_WEIGHTS`."""
    return {"semantic_weight": DEFAULT_WEIGHTS} if policy.grid is None else dict(policy.grid)


def default_family(content_free: Any, external: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Every member of the family these inputs can fit."""
    out = [m for m in FAMILY if m not in ("contextual", "probe")]
    if content_free is not None:
        out.append("contextual")
    return (*out, *(m for m in FAMILY if m == "probe" and m in (external or {})))


def fit_from_grid(
    probs: np.ndarray,
    configs: Sequence[SemsoftConfig],
    start: SemsoftConfig,
    targets: Any,
    *,
    axes: Sequence[str] = ("semantic_weight",),
    policy: FitPolicy | None = None,
    n_folds: int = 5,
    folds: np.ndarray | None = None,
    content_free: np.ndarray | None = None,
    external: Mapping[str, External] | None = None,
    grid_size: int | None = None,
    sample_weight: Any = None,
) -> FitResult:
    """[`fit_config`][semsoft_plugin.fit.fit_family.fit_config] on probabilities already scored: `probs` `[C + 1, N, L]`,
    one per config of `configs` ([`configs_with_start`][semsoft_plugin.fit.fit_family.configs_with_start], `grid_size` of them the
    grid's) and last `start`'s (`axes`: the fields the grid varies, for the report;
    `content_free`: `[C, L]` the start at `T = 1` on the content-free inputs;
    `sample_weight`: the items' weights)."""
    policy = FitPolicy() if policy is None else policy
    family = policy.family
    family = default_family(content_free, external) if family is None else check_family(family)
    best, t, kept_default, stats = fit_probs(
        probs[:-1], probs[-1], targets, single=single_entries(configs, start),
        policy=dataclasses.replace(policy, family=family), n_folds=n_folds, folds=folds,
        content_free=content_free, external=external, grid_size=grid_size,
        sample_weight=sample_weight,
    )  # fmt: skip
    return _result(configs, axes, best, t, kept_default, stats, start, policy)


def _result(
    configs: Sequence[SemsoftConfig],
    grid: Sequence[str],
    best: int,
    t: float,
    kept_default: bool,
    stats: dict[str, Any],
    start: SemsoftConfig,
    policy: FitPolicy,
) -> FitResult:
    def axes(config: SemsoftConfig) -> dict[str, Any]:
        return {k: getattr(config, k) for k in grid}

    # The probe replaces the probabilities, not the settings: its config is the start's.
    fitted = start if stats["procedure"] == "probe" else configs[best].replace(score_temperature=t)
    return FitResult(
        config=start if kept_default else fitted,
        fitted=fitted,
        kept_default=kept_default,
        n=stats["n"],
        n_folds=stats["n_folds"],
        gain=stats["gain"],
        gain_se=stats["gain_se"],
        policy=policy,
        nll_start=stats["nll_start"],
        nll_fitted=stats["nll_fitted"],
        procedure=stats["procedure"],
        procedures=stats["procedures"],
        offset=stats["offset"],
        in_sample=[
            {**axes(c), "temperature": tt, "nll": s}
            for c, s, tt in zip(configs, stats["scores"], stats["temperatures"], strict=True)
        ],
        fold_choices=[
            {**axes(configs[f["entry"]]), "temperature": f["temperature"]}
            for f in stats["fold_choices"]
        ],
    )
