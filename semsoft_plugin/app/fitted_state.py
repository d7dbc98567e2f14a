"""What [`Classifier.fit`][semsoft_plugin.app.classifier.Classifier.fit] (or
`load_fit`) leaves behind, as one object the classifier holds and asks.

A `FittedState` is the label names in prompt order, the settings every prediction
uses, the correction applied after them row by row (a bias member's offset or the
probe, [`FittedCorrection`][semsoft_plugin.app.fitted.FittedCorrection]), what the fit chose and why,
and the file mode's correction. The classifier's public fitted attributes
(`labels_`, `fitted_config_`, `fitted_correction_`, `fit_result_`,
`file_calibration_`) read it; predictions ask it to correct their rows; `save_fit`
and `load_fit` ask it to write and read the fit file ([`semsoft_plugin.app.fitted`][semsoft_plugin.app.fitted],
whose format this module does not define).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semsoft_plugin.app.fit_file import FitIdentity
from semsoft_plugin.app.fitted import FittedCorrection, read_fit, save_fitted
from semsoft_plugin.core.config import SemsoftConfig

if TYPE_CHECKING:
    import numpy as np

    from semsoft_plugin.core.calibration import FileCalibration
    from semsoft_plugin.core.fit_family import FitResult

__all__ = ["FittedState"]


@dataclass(frozen=True)
class FittedState:
    """A classifier's fit.

    Attributes
    ----------
    labels : tuple[str, ...]
        The label names, in prompt order.
    config : SemsoftConfig
        The settings every prediction uses.
    correction : FittedCorrection | None
        What a bias member or the probe adds after `config`, row by row; `None`: the
        config alone.
    result : FitResult | None
        What the fit chose and why (`None`: nothing was searched, or the fit was loaded).
    file_calibration : FileCalibration | None
        The file mode's correction (`calibrate="file"`), else `None`.
    """

    labels: tuple[str, ...]
    config: SemsoftConfig
    correction: FittedCorrection | None = None
    result: FitResult | None = None
    file_calibration: FileCalibration | None = None

    @property
    def needs_hidden(self) -> bool:
        """Whether correcting a row reads the decision step's hidden state (the probe)."""
        return self.correction is not None and self.correction.needs_hidden

    def correct(
        self, probs: np.ndarray, classes: tuple[str, ...], hidden: Any = None
    ) -> np.ndarray:
        """`[N, L]` probabilities in `classes` order with the correction applied row by
        row (`hidden`: `[N, H]`, read by the probe); unchanged without one."""
        if self.correction is None:
            return probs
        return self.correction.apply(probs, classes, hidden)

    def save(self, path: str | Path, identity: FitIdentity | None) -> None:
        """Write the config and correction to a config file (`semsoft classify --config`
        reads it; [`save_fitted`][semsoft_plugin.app.fitted.save_fitted]).

        Parameters
        ----------
        path : str | Path
            The file.
        identity : FitIdentity | None
            The labels, prompt and output layer the fit was made on (needed with a
            correction).
        """
        save_fitted(path, self.config, self.correction, identity)

    @classmethod
    def load(
        cls,
        path: str | Path,
        names: list[str],
        *,
        calibrate: str | None,
        engine: str,
        identity: FitIdentity | None,
    ) -> FittedState:
        """The fit a config file holds ([`read_fit`][semsoft_plugin.app.fitted.read_fit], checked
        whole), checked against the classifier that takes it.

        Parameters
        ----------
        path : str | Path
            The file.
        names : list[str]
            The classifier's labels, in prompt order.
        calibrate : str | None
            The classifier's `calibrate`: no correction on top of a fitted one.
        engine : str
            `"transformers"` or `"vllm"` (both apply the probe; vLLM reads its hidden
            state back from the logits row).
        identity : FitIdentity | None
            The run's labels, prompt and output layer, compared with the fit's.

        Returns
        -------
        FittedState
            The loaded fit.
        """
        fit = read_fit(path)
        config, correction = fit.config, fit.correction
        if correction is not None:
            fit.check_run(identity)
            if calibrate is not None:
                raise ValueError(
                    f"calibrate={calibrate!r} with a fitted correction ({correction.procedure}) "
                    "from a config file: the correction was fitted on uncorrected scores; use "
                    "one or the other"
                )
        return cls(tuple(names), config, correction)
