"""The [`Classifier`][semsoft_plugin.app.classifier.Classifier] parameters, checked in one
table before any model loads: what `fit` and `predict*` check first, and what
`semsoft classify --ray` and [`classify_dataset`][semsoft_plugin.app.ray.classify_dataset] check
before an actor starts. Each bad value, and each combination that would be ignored, is refused
by name. Every function takes the parameters as a mapping (`get_params(deep=False)`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from semsoft_plugin.app import handles
from semsoft_plugin.app.engine_settings import EngineSettings
from semsoft_plugin.core.calibration import check_strength
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.engines.prompting import DEFAULT_TEMPLATE, PromptTemplate
from semsoft_plugin.fit.fit_family import policy_grid
from semsoft_plugin.fit.fitting import FAMILY, check_family
from semsoft_plugin.fit.probe import probe_refused

__all__ = [
    "CALIBRATIONS",
    "MOVED_PARAMS",
    "PARAMETER_CONSTRAINTS",
    "check_file_strength",
    "checked_family",
    "checked_settings",
    "fit_plan",
    "fold_ids",
]

# None: the scores as they are; "contextual": divided by the content-free inputs' mean
# (Zhao et al., 2021); "file": divided by the mean of the distinct texts given to
# fit(texts) (core.calibration.FileCalibration). No per-call batch calibration: a row's
# score would depend on the rows beside it.
CALIBRATIONS = (None, "contextual", "file")


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | np.integer) and bool(value >= 1)


def _splitter(value: Any) -> bool:
    if isinstance(value, bool | str | Mapping) or value is None:
        return False
    if isinstance(value, int | np.integer):
        return bool(value >= 2)
    splitter = callable(getattr(value, "split", None)) and callable(
        getattr(value, "get_n_splits", None)
    )
    return splitter or hasattr(value, "__iter__")


# name -> (what it must be, the check): the spirit of scikit-learn's `_parameter_constraints`.
# `model`, `tokenizer` and `labels` are checked where the model loads (`handles`, `LabelSet`),
# `backend` by `handles.check_backend` (which names the old spelling "hf").
PARAMETER_CONSTRAINTS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "prompt": ("a PromptTemplate, a str or None", lambda v: v is None or isinstance(v, str | PromptTemplate)),
    "config": ("a SemsoftConfig or None", lambda v: v is None or isinstance(v, SemsoftConfig)),
    "calibrate": (f"one of {CALIBRATIONS}", lambda v: v in CALIBRATIONS),
    "max_text_tokens": ("a positive int or None", lambda v: v is None or _positive_int(v)),
    "truncate": ("True or False", lambda v: isinstance(v, bool | np.bool_)),
    "engine": ("an EngineSettings or None", lambda v: v is None or isinstance(v, EngineSettings)),
    "fit_policy": ("a FitPolicy or None", lambda v: v is None or isinstance(v, FitPolicy)),
    "cv": ("an int >= 2, a splitter or an iterable of (train, test) splits", _splitter),
}  # fmt: skip

# The parameters of earlier versions, refused naming where each went.
MOVED_PARAMS: dict[str, str] = {
    **{name: f"config=SemsoftConfig({name}=...)" for name in ("k", "semantic_weight", "score_temperature")},
    **{name: f"engine=EngineSettings({name}=...)" for name in ("batch_size", "progress", "exact_head", "dtype", "engine_args")},
    **{name: f"fit_policy=FitPolicy({name}=...)" for name in ("file_strength", "margin", "random_state")},
    "fit_grid": "fit_policy=FitPolicy(grid=...)",
    "fit_family": "fit_policy=FitPolicy(family=...)",
    "fit_score_temperature": "fit_policy=FitPolicy(fit_score_temperature=...)",
    "fit_temperature": "fit_policy=FitPolicy(fit_score_temperature=...)",
    "n_folds": "cv",
}  # fmt: skip


def check_file_strength(strength: object, calibrate: object, name: str = "file_strength") -> None:
    """`ValueError` unless `strength` is `"auto"` or a number in [0, 1], and is the default
    `"auto"` or goes with `calibrate="file"`: a setting that would be ignored is refused
    (`name`: the caller's spelling)."""
    check_strength(strength, name)
    if strength != "auto" and calibrate != "file":
        raise ValueError(
            f"{name}={strength!r} applies only to the file mode (calibrate='file'; on the "
            f"command line --calibrate file), not to calibrate={calibrate!r}"
        )


def checked_settings(params: Mapping[str, Any]) -> tuple[PromptTemplate, SemsoftConfig]:
    """The prompt and Semantic Softmax settings the parameters name, after every
    parameter in `PARAMETER_CONSTRAINTS` and every combination that would be ignored is
    checked (each refused by name)."""
    for name, (what, ok) in PARAMETER_CONSTRAINTS.items():
        if not ok(params[name]):
            raise ValueError(f"{name}={params[name]!r} must be {what}")
    handles.check_backend(params["backend"])
    policy, engine = params["fit_policy"] or FitPolicy(), params["engine"] or EngineSettings()
    check_file_strength(policy.file_strength, params["calibrate"], "fit_policy.file_strength")
    handles.check_engine_args(params["model"], params["backend"], engine.dtype, engine.engine_args)
    prompt = params["prompt"]
    if isinstance(prompt, str):
        prompt = PromptTemplate(user=prompt)
    return prompt or DEFAULT_TEMPLATE, params["config"] or SemsoftConfig()


def checked_family(family: Any, engine: str, no_hidden: str | None = None) -> tuple[str, ...]:
    """The members a fit checks on `engine`: `family` checked (an unknown member refused by
    name), or with `None` every member the engine supports. An engine that cannot return
    the hidden state (`no_hidden` says why) leaves the probe out, or refuses it if named."""
    if family is None:
        return tuple(m for m in FAMILY if m != "probe" or no_hidden is None)
    names = check_family(family)
    if "probe" in names and no_hidden is not None:
        raise probe_refused(f"{no_hidden} ({engine}); or leave 'probe' out of fit_policy.family")
    return names


def fit_plan(params: Mapping[str, Any], engine: str, no_hidden: str | None = None) -> FitPolicy:
    """The classifier's `fit_policy` resolved for `engine`: its family (the members that can
    fit something here) and grid made explicit, refused before any text is scored where a
    field would be inert (`grid` without the member `"grid"`, `"temperature"` named with
    `temperature=False`, a `"grid"` member with nothing to search, a family that fits nothing).

    Parameters
    ----------
    params : Mapping[str, Any]
        A classifier's parameters (`get_params(deep=False)`).
    engine : str
        `"transformers"` or `"vllm"`.
    no_hidden : str | None
        Why the engine cannot return the hidden state (`checked_family`), or None.
    """
    policy: FitPolicy = params["fit_policy"] or FitPolicy()
    named = policy.family
    family = checked_family(named, engine, no_hidden)
    if policy.grid is not None and "grid" not in family:
        raise ValueError(
            f"fit_policy.grid={dict(policy.grid)!r} is what the member 'grid' searches, which "
            f"fit_policy.family={named!r} leaves out: add 'grid' to the family or drop the grid"
        )
    axes = policy_grid(policy)
    if "score_temperature" in axes:
        raise ValueError(
            "fit_policy.grid cannot search score_temperature: it is fitted "
            "(fit_policy.fit_score_temperature=True) or kept from the config (False)"
        )
    temperature = bool(policy.fit_score_temperature)
    if named is not None and "temperature" in family and not temperature:
        raise ValueError(
            f"fit_policy.family={named!r} names 'temperature', but fit_policy.fit_score_temperature="
            "False: there is no temperature to fit"
        )
    if named is not None and "grid" in family and not axes and not temperature:
        raise ValueError(
            f"fit_policy.family={named!r} names 'grid', but the grid is empty and "
            "fit_policy.fit_score_temperature=False: the grid member would fit nothing"
        )
    able = tuple(
        m
        for m in family
        if (m != "grid" or axes or temperature) and (m != "temperature" or temperature)
    )
    if family and not able:
        raise ValueError(
            f"this fit can fit nothing: fit_policy.family={named!r} with an empty grid and "
            "fit_score_temperature=False; FitPolicy(family=()) is the fit that only reads the labels"
        )
    grid = {name: tuple(values) for name, values in axes.items()}
    return dataclasses.replace(policy, family=able, grid=grid)


def fold_ids(cv: Any, targets: list[int]) -> np.ndarray | None:
    """The fold of each item under a splitter or an iterable of splits `cv` (`None` for an
    integer `cv`: the fit draws stratified folds itself), refused where test folds overlap
    or miss an item."""
    from sklearn.model_selection import check_cv

    if isinstance(cv, int | np.integer):
        return None
    n = len(targets)
    ids = np.full(n, -1, dtype=np.int64)
    splitter = check_cv(cv, np.asarray(targets), classifier=True)
    for fold, (_, test) in enumerate(splitter.split(np.zeros((n, 1)), np.asarray(targets))):
        if (ids[test] >= 0).any():
            raise ValueError(f"cv={cv!r}: its test folds overlap; each item must be held out once")
        ids[test] = fold
    if (ids < 0).any():
        raise ValueError(
            f"cv={cv!r} holds out {int((ids >= 0).sum())} of {n} items: every item must be in "
            "one test fold (the rule scores each item out of fold)"
        )
    return ids
