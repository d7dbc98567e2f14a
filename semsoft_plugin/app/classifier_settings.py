"""The :class:`~semsoft_plugin.app.classifier.Classifier` parameters that need no model,
checked: what ``fit`` and ``predict*`` check first, and what a caller (``semsoft
classify --ray``, :func:`~semsoft_plugin.app.ray.classify_dataset`) checks before any
model loads or any actor starts. Each bad value is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from semsoft_plugin.core.calibration import check_strength
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.engines.prompting import DEFAULT_TEMPLATE, PromptTemplate

if TYPE_CHECKING:
    from semsoft_plugin.app.classifier import Classifier

__all__ = ["CALIBRATIONS", "check_file_strength", "checked_settings"]

# None: the scores as they are; "contextual": divided by the content-free inputs' mean
# (Zhao et al., 2021); "file": divided by the mean of the distinct texts given to
# fit(texts), estimated once (semsoft_plugin.core.calibration.FileCalibration). There is
# no per-call batch calibration: a row's score would depend on the rows beside it.
CALIBRATIONS = (None, "contextual", "file")


def check_file_strength(strength: object, calibrate: object, name: str = "file_strength") -> None:
    """``ValueError`` unless ``strength`` is ``"auto"`` (the guard, the default) or a
    number in [0, 1] (:func:`~semsoft_plugin.core.calibration.check_strength`), and,
    since a setting that would be ignored is refused rather than dropped, unless it is
    the default ``"auto"`` or goes with ``calibrate="file"``."""
    check_strength(strength, name)
    if strength != "auto" and calibrate != "file":
        raise ValueError(
            f"{name}={strength!r} applies only to the file mode (calibrate='file'; on the "
            f"command line --calibrate file), not to calibrate={calibrate!r}"
        )


def checked_settings(clf: Classifier) -> tuple[PromptTemplate, SemsoftConfig]:
    """The prompt and Semantic Softmax settings ``clf``'s parameters name, with every
    parameter that needs no model checked (each refused by name)."""
    n = clf.max_text_tokens
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"max_text_tokens={n!r} must be a positive int")
    if clf.calibrate not in CALIBRATIONS:
        raise ValueError(f"calibrate={clf.calibrate!r} must be one of {CALIBRATIONS}")
    check_file_strength(clf.file_strength, clf.calibrate)
    size = clf.batch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"batch_size={size!r} must be a positive int")
    if not isinstance(clf.dtype, str):
        raise ValueError(f"dtype={clf.dtype!r} must be a torch dtype name or 'auto'")
    if clf.fit_grid is not None and not isinstance(clf.fit_grid, Mapping):
        raise ValueError(f"fit_grid={clf.fit_grid!r} must be a mapping field -> values")
    if clf.engine_args is not None and not isinstance(clf.engine_args, Mapping):
        raise ValueError(f"engine_args={clf.engine_args!r} must be a mapping or None")
    prompt = clf.prompt
    if isinstance(prompt, str):
        prompt = PromptTemplate(user=prompt)
    if prompt is not None and not isinstance(prompt, PromptTemplate):
        raise ValueError(f"prompt must be a PromptTemplate or a str, got {type(prompt).__name__}")
    if clf.config is not None and not isinstance(clf.config, SemsoftConfig):
        raise ValueError(f"config must be a SemsoftConfig or None, got {clf.config!r}")
    own = {
        "k": clf.k,
        "semantic_weight": clf.semantic_weight,
        "score_temperature": clf.score_temperature,
    }
    given = {name: value for name, value in own.items() if value is not None}  # None: config's
    return prompt or DEFAULT_TEMPLATE, (clf.config or SemsoftConfig()).replace(**given)
