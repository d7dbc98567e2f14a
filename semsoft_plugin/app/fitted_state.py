"""What [`Classifier.fit`][semsoft_plugin.app.classifier.Classifier.fit] (or
`load_fit`) leaves behind, as one object the classifier holds and asks.

A `FittedState` is the label names in prompt order, the settings every prediction
uses, the correction applied after them row by row (a bias member's offset or the
probe, [`FittedCorrection`][semsoft_plugin.fit.fitted.FittedCorrection]), what the fit chose and why,
and the file mode's correction. The classifier's public fitted attributes
(`labels_`, `fitted_config_`, `fitted_correction_`, `fit_result_`,
`file_calibration_`) read it; predictions ask it to correct their rows; `save_fit`
and `load_fit` ask it to write and read the fit file ([`semsoft_plugin.fit.fitted`][semsoft_plugin.fit.fitted],
whose format this module does not define).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.fit.fit_file import FitIdentity
from semsoft_plugin.fit.fitted import FittedCorrection, read_fit, save_fitted

if TYPE_CHECKING:
    import numpy as np

    from semsoft_plugin.core.calibration import FileCalibration
    from semsoft_plugin.core.kept_scores import Kept
    from semsoft_plugin.core.labels import LabelSet
    from semsoft_plugin.core.softmax import SemanticSoftmaxResult
    from semsoft_plugin.fit.fit_family import FitResult

__all__ = ["FittedState", "label_rows"]


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

    def kept_probs(
        self,
        kept: Kept,
        embeddings: Any,
        labels: LabelSet,
        classes: tuple[str, ...],
        hidden: Any = None,
    ) -> tuple[np.ndarray, SemanticSoftmaxResult]:
        """What a prediction gives once the forward passes are kept: Semantic Softmax
        under `config`, the rows in `classes` order as float64 summing to 1
        (`label_rows`), then the correction row by row. `Classifier.predict_proba`
        and `semsoft eval`'s method `fit` (on each held fold) both apply a fit here.

        Parameters
        ----------
        kept : Kept
            `N` kept forward passes with at least `config.k` top scores each.
        embeddings : Any
            The model's output embeddings.
        labels : LabelSet
            The labels, in prompt order (the kept passes' label tokens).
        classes : tuple[str, ...]
            The column order wanted (a permutation of `labels.names`).
        hidden : Any
            `[N, H]` the hidden states, read by the probe (else unread).

        Returns
        -------
        tuple[np.ndarray, SemanticSoftmaxResult]
            The corrected `[N, L]` probabilities, and the core's result under `config`
            (label columns in prompt order) for the uncorrected figures.
        """
        from semsoft_plugin.core.kept_scores import kept_result

        result = kept_result(kept, embeddings, labels, self.config)
        names = list(labels.names)
        probs = label_rows(result.probs, [names.index(c) for c in classes])
        return self.correct(probs, classes, hidden), result

    def save(self, path: str | Path, identity: FitIdentity | None) -> None:
        """Write the config and correction to a config file (`semsoft classify --config`
        reads it; [`save_fitted`][semsoft_plugin.fit.fitted.save_fitted]).

        Parameters
        ----------
        path : str | Path
            The file.
        identity : FitIdentity | None
            The labels, prompt and output layer the fit was made on (needed with a
            correction).
        """
        policy = None if self.result is None else self.result.policy
        save_fitted(path, self.config, self.correction, identity, policy)

    @classmethod
    def load(
        cls,
        path: str | Path,
        names: list[str],
        *,
        calibrate: str | None,
        identity: FitIdentity | None,
    ) -> FittedState:
        """The fit a config file holds ([`read_fit`][semsoft_plugin.fit.fitted.read_fit], checked
        whole), checked against the classifier that takes it.

        Parameters
        ----------
        path : str | Path
            The file.
        names : list[str]
            The classifier's labels, in prompt order.
        calibrate : str | None
            The classifier's `calibrate`: no correction on top of a fitted one.
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


def label_rows(probs: Any, order: list[int]) -> np.ndarray:
    """`[N, L]` float64 rows in `order`'s columns, renormalised to sum to 1 (the core
    computes in float32; scikit-learn checks the sums).

    Parameters
    ----------
    probs : Any
        `[N, L]` a tensor of probabilities.
    order : list[int]
        The column of each output column.

    Returns
    -------
    np.ndarray
        The rows.
    """
    import numpy as np

    rows = probs.double().numpy()[:, order] if len(probs) else np.zeros((0, len(order)))
    total = rows.sum(axis=1, keepdims=True)
    out: np.ndarray = rows / np.where(total > 0, total, 1.0)
    return out
