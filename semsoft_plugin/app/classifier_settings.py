"""The [`Classifier`][semsoft_plugin.app.classifier.Classifier] parameters that need no model,
checked: what `fit` and `predict*` check first, and what a caller (`semsoft
classify --ray`, [`classify_dataset`][semsoft_plugin.app.ray.classify_dataset]) checks before any
model loads or any actor starts. Each bad value is refused by name.

Every function here takes the parameters as a mapping (the classifier's
`get_params(deep=False)`), never the classifier itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from semsoft_plugin.app.probe import probe_refused
from semsoft_plugin.core.calibration import check_strength
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.fitting import DEFAULT_WEIGHTS, FAMILY, check_family
from semsoft_plugin.core.folds import check_fit_settings
from semsoft_plugin.engines.prompting import DEFAULT_TEMPLATE, PromptTemplate

__all__ = [
    "CALIBRATIONS",
    "FIXABLE",
    "FitPlan",
    "check_file_strength",
    "checked_family",
    "checked_settings",
    "fit_plan",
]

# None: the scores as they are; "contextual": divided by the content-free inputs' mean
# (Zhao et al., 2021); "file": divided by the mean of the distinct texts given to
# fit(texts), estimated once (semsoft_plugin.core.calibration.FileCalibration). There is
# no per-call batch calibration: a row's score would depend on the rows beside it.
CALIBRATIONS = (None, "contextual", "file")
# The settings a classifier parameter can fix (None: the config's, and fit may fit it).
FIXABLE = ("k", "semantic_weight", "score_temperature")


def check_file_strength(strength: object, calibrate: object, name: str = "file_strength") -> None:
    """`ValueError` unless `strength` is `"auto"` (the guard, the default) or a
    number in [0, 1] ([`check_strength`][semsoft_plugin.core.calibration.check_strength]), and,
    since a setting that would be ignored is refused rather than dropped, unless it is
    the default `"auto"` or goes with `calibrate="file"`.

    Parameters
    ----------
    strength : object
        The strength given.
    calibrate : object
        The correction it goes with.
    name : str
        How the caller spells the setting, for the message.
    """
    check_strength(strength, name)
    if strength != "auto" and calibrate != "file":
        raise ValueError(
            f"{name}={strength!r} applies only to the file mode (calibrate='file'; on the "
            f"command line --calibrate file), not to calibrate={calibrate!r}"
        )


def checked_settings(params: Mapping[str, Any]) -> tuple[PromptTemplate, SemsoftConfig]:
    """The prompt and Semantic Softmax settings the parameters name, with every
    parameter that needs no model checked (each refused by name).

    Parameters
    ----------
    params : Mapping[str, Any]
        A classifier's parameters (`get_params(deep=False)`).

    Returns
    -------
    tuple[PromptTemplate, SemsoftConfig]
        The prompt, and `config` with the fixed fields (`FIXABLE`) over it.
    """
    n = params["max_text_tokens"]
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"max_text_tokens={n!r} must be a positive int")
    calibrate = params["calibrate"]
    if calibrate not in CALIBRATIONS:
        raise ValueError(f"calibrate={calibrate!r} must be one of {CALIBRATIONS}")
    check_file_strength(params["file_strength"], calibrate)
    for name in ("truncate", "exact_head"):  # "no" is truthy: never read a flag by truth
        if not isinstance(params[name], bool | np.bool_):
            raise ValueError(f"{name}={params[name]!r} must be True or False")
    if params["progress"] is not None and not isinstance(params["progress"], bool | np.bool_):
        raise ValueError(f"progress={params['progress']!r} must be True, False or None")
    size = params["batch_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"batch_size={size!r} must be a positive int")
    if not isinstance(params["dtype"], str):
        raise ValueError(f"dtype={params['dtype']!r} must be a torch dtype name or 'auto'")
    grid = params["fit_grid"]
    if grid is not None and not isinstance(grid, Mapping):
        raise ValueError(f"fit_grid={grid!r} must be a mapping field -> values")
    engine_args = params["engine_args"]
    if engine_args is not None and not isinstance(engine_args, Mapping):
        raise ValueError(f"engine_args={engine_args!r} must be a mapping or None")
    prompt = params["prompt"]
    if isinstance(prompt, str):
        prompt = PromptTemplate(user=prompt)
    if prompt is not None and not isinstance(prompt, PromptTemplate):
        raise ValueError(f"prompt must be a PromptTemplate or a str, got {type(prompt).__name__}")
    config = params["config"]
    if config is not None and not isinstance(config, SemsoftConfig):
        raise ValueError(f"config must be a SemsoftConfig or None, got {config!r}")
    return prompt or DEFAULT_TEMPLATE, (config or SemsoftConfig()).replace(**fixed(params))


def fixed(params: Mapping[str, Any]) -> dict[str, Any]:
    """The settings the parameters fix (`FIXABLE` given, not `None`)."""
    return {name: params[name] for name in FIXABLE if params[name] is not None}


def checked_family(
    family: Sequence[str] | None, engine: str, no_hidden: str | None = None
) -> tuple[str, ...]:
    """The members a fit checks on `engine` (`"transformers"`/`"vllm"`): `family`
    checked (an unknown member refused by name), or with `None` every member the engine
    supports. Both engines give the probe its hidden state (vLLM reads it back from the
    logits row); an engine that cannot (`no_hidden` says why: a `vllm.LLM` given without
    the worker extension) leaves the probe out of the default family and refuses it by
    name when `family` names it.

    Parameters
    ----------
    family : Sequence[str] | None
        The `fit_family` parameter.
    engine : str
        The engine the classifier runs on.
    no_hidden : str | None
        Why the engine cannot return the decision step's hidden state, or None.
    """
    if family is None:
        return tuple(m for m in FAMILY if m != "probe" or no_hidden is None)
    names = check_family(family)
    if "probe" in names and no_hidden is not None:
        raise probe_refused(f"{no_hidden} ({engine}); or leave 'probe' out of fit_family")
    return names


@dataclass(frozen=True)
class FitPlan:
    """What a labelled fit searches, decided from the parameters before any scoring.

    Attributes
    ----------
    family : tuple[str, ...]
        The members checked (empty: the fit only reads the labels).
    axes : dict[str, Sequence[Any]]
        The grid member's fields and values.
    temperature : bool
        Whether each member fits a final score temperature.
    """

    family: tuple[str, ...]
    axes: dict[str, Sequence[Any]]
    temperature: bool


def fit_plan(params: Mapping[str, Any], engine: str, no_hidden: str | None = None) -> FitPlan:
    """The labelled fit the parameters ask for, refused before any text is scored where
    it could fit nothing or a setting would be inert.

    A setting the user fixed (`FIXABLE` given) is kept: it leaves the default grid
    (`semantic_weight` fixed: the grid is empty), may not be a `fit_grid` axis, and a
    fixed `score_temperature` is not fitted. Refused, each by name: `fit_grid` with
    `"grid"` left out of `fit_family`; `"temperature"` named with no temperature
    to fit; `"grid"` named with nothing to search; a family none of whose members can
    fit anything; `n_folds` below 2 and a `margin` that is not a finite number >= 0.

    Parameters
    ----------
    params : Mapping[str, Any]
        A classifier's parameters (`get_params(deep=False)`).
    engine : str
        `"transformers"` or `"vllm"`.
    no_hidden : str | None
        Why the engine cannot return the hidden state (`checked_family`), or None.
    """
    check_fit_settings(params["n_folds"], params["margin"])
    named = params["fit_family"]
    family = checked_family(named, engine, no_hidden)
    given = fixed(params)
    grid = params["fit_grid"]
    if grid is not None and "grid" not in family:
        raise ValueError(
            f"fit_grid={dict(grid)!r} is what the member 'grid' searches, which "
            f"fit_family={named!r} leaves out: add 'grid' to fit_family or drop fit_grid"
        )
    if grid is None:
        axes: dict[str, Sequence[Any]] = (
            {} if "semantic_weight" in given else {"semantic_weight": DEFAULT_WEIGHTS}
        )
    else:
        axes = dict(grid)
        clash = [name for name in axes if name in given]
        if clash:
            raise ValueError(
                f"fit_grid searches {clash[0]!r}, which the parameter {clash[0]}="
                f"{given[clash[0]]!r} fixes: search one or fix it"
            )
        if "score_temperature" in axes:
            raise ValueError(
                "fit_grid cannot search score_temperature: it is fitted "
                "(fit_score_temperature=True) or fixed (score_temperature=T)"
            )
    temperature = bool(params["fit_score_temperature"]) and "score_temperature" not in given
    why = (
        f"score_temperature={given['score_temperature']!r} is fixed"
        if "score_temperature" in given
        else "fit_score_temperature=False"
    )
    if named is not None and "temperature" in family and not temperature:
        raise ValueError(
            f"fit_family={named!r} names 'temperature', but {why}: there is no temperature "
            "to fit (leave 'temperature' out, or let it be fitted)"
        )
    if named is not None and "grid" in family and not axes and not temperature:
        raise ValueError(
            f"fit_family={named!r} names 'grid', but the grid is empty and {why}: the grid "
            "member would fit nothing"
        )
    able = [
        m
        for m in family
        if (m != "grid" or axes or temperature) and (m != "temperature" or temperature)
    ]
    if family and not able:
        raise ValueError(
            f"this fit can fit nothing: fit_family={named!r} with an empty grid and {why}; "
            "fit_family=() is the fit that only reads the labels"
        )
    return FitPlan(tuple(able), axes, temperature)
