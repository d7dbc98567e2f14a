"""`FitPolicy`: what a labelled fit searches and the rule that judges it, as one value.

The fit (`semsoft_plugin.fit.fitting`) reads its rule from this object, never from module
state, so two fits in one process can use two policies, a benchmark passes the variant it
measures, and a fit file records the policy it was made under. The rule itself (why each
field has its default) is on the docs page `few-labels.md`, "The rule".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from semsoft_plugin.core.calibration import check_strength
from semsoft_plugin.core.value_params import ValueParams

__all__ = ["FitPolicy"]


@dataclass(frozen=True)
class FitPolicy(ValueParams):
    """What [`Classifier.fit`][semsoft_plugin.app.classifier.Classifier.fit] and `semsoft tune`
    fit, and the rule that keeps a member only where it wins out of fold.

    A frozen value with scikit-learn's `get_params`/`set_params`, so `GridSearchCV` reaches a
    field as `fit_policy__margin`.

    Parameters
    ----------
    family : tuple[str, ...] | None
        The members the fit may choose (`fitting.FAMILY`); `None`: every member the engine
        supports; `()`: none (the fit only reads the labels).
    grid : Mapping[str, Sequence[Any]] | None
        What the member `"grid"` searches, config field -> values; `None`: `semantic_weight`
        over 0, 0.1, ..., 1; `{}`: no field.
    fit_score_temperature : bool
        Whether each member also fits a final score temperature (a bare "temperature" is
        only ever the engine's sampling temperature).
    margin : float
        Standard errors of out-of-fold NLL by which a member must beat the start and the
        temperature; a finite number >= 0.
    temperature_floor : bool
        The temperature is the rule's floor: with labels the fit is at least temperature
        scaling. Off only to measure what the floor changes.
    f1_guard : bool
        A member that changes decisions must keep macro-F1: its out-of-fold change less
        `f1_z` bootstrap standard errors is at least `-f1_tolerance`.
    f1_z : float
        The guard's standard errors (1.96: a one-sided 2.5% test).
    f1_tolerance : float
        The macro-F1 the guard lets a member lose.
    succession : bool
        Hold the fit's targets and temperatures to the rule of succession
        (`temperature_scaling.succession_targets`); `False`: the hard labels.
    file_strength : float | str
        With `calibrate="file"`: `"auto"` (the guard of `core.calibration`) or the share of
        the correction `fit(texts)` estimates that is applied, in [0, 1].
    random_state : int
        The seed of the folds (for an integer `cv`) and of the rule's bootstrap.

    Examples
    --------
    >>> policy = FitPolicy(margin=0.5)
    >>> policy.set_params(f1_guard=False).get_params()["f1_guard"]
    False
    >>> FitPolicy(margin=-1)
    Traceback (most recent call last):
        ...
    ValueError: FitPolicy(margin=-1): must be a finite number >= 0
    """

    family: tuple[str, ...] | None = None
    grid: Mapping[str, Sequence[Any]] | None = None
    fit_score_temperature: bool = True
    margin: float = 1.0
    temperature_floor: bool = True
    f1_guard: bool = True
    f1_z: float = 1.96
    f1_tolerance: float = 0.01
    succession: bool = True
    file_strength: float | str = "auto"
    random_state: int = 0

    def __post_init__(self) -> None:
        for name in ("fit_score_temperature", "temperature_floor", "f1_guard", "succession"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                _refuse(name, getattr(self, name), "must be True or False")
        for name in ("margin", "f1_z", "f1_tolerance"):
            value = getattr(self, name)
            number = isinstance(value, int | float | np.integer | np.floating)
            if isinstance(value, bool) or not number or not math.isfinite(value) or value < 0:
                _refuse(name, value, "must be a finite number >= 0")
        family = self.family
        if family is not None and (
            isinstance(family, str) or not all(isinstance(m, str) for m in family)
        ):
            _refuse("family", family, "must be a sequence of member names or None")
        if self.grid is not None and not isinstance(self.grid, Mapping):
            _refuse("grid", self.grid, "must be a mapping field -> values or None")
        check_strength(self.file_strength, "file_strength")
        seed = self.random_state
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            _refuse("random_state", seed, "must be an integer >= 0")

    # -- the fit file ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values (the fit file's `"fit_policy"`)."""
        out = self.get_params()
        out["family"] = None if self.family is None else list(self.family)
        out["grid"] = None if self.grid is None else {k: list(v) for k, v in self.grid.items()}
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str) -> FitPolicy:
        """The policy a fit file recorded, each key checked (`source` names the file)."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: fit_policy must be an object, got {data!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"{source}: fit_policy has no field {unknown[0]!r}")
        values = dict(data)
        if isinstance(values.get("family"), list):
            values["family"] = tuple(values["family"])
        if isinstance(values.get("grid"), dict):  # as `fit_plan` resolves it: tuples
            values["grid"] = {
                k: tuple(v) if isinstance(v, list) else v for k, v in values["grid"].items()
            }
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None


def _refuse(name: str, value: Any, why: str) -> None:
    raise ValueError(f"FitPolicy({name}={value!r}): {why}")
