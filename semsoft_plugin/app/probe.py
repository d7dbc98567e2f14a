"""The probe: regularised logistic regression on the decision step's hidden state
("hidden calibration", Cho et al., NAACL 2025), the family member of the few-label fit
that reads more than the label logits.

Temperature scaling and the bias corrections rescale or shift the label logits, which
hold one number per label; the last layer's hidden state at the decision step holds
what the model knows before its output layer throws most of it away. With a few
labels, an L2 multinomial logistic regression on it (scikit-learn: standardised
features, its `C` chosen by inner stratified folds on log-loss,
`LogisticRegressionCV`) can separate labels the label logits confuse.

The fitted probe is kept as plain arrays (`LinearProbe`): predicting needs numpy
only, one row at a time (a row's probabilities never depend on its batch), and the
weights are saved with safetensors, never pickle. `semsoft eval`'s `probe` method and
`Classifier.fit` fit it here (one implementation).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from semsoft_plugin.core.logits_inverse import LogitsInverse
    from semsoft_plugin.core.row_probe import LogitsProbe

__all__ = [
    "CS",
    "LinearProbe",
    "fit_probe",
    "held_probs",
    "probe_member",
    "probe_refused",
]

# Inverse L2 strengths searched by the inner folds (on standardised features).
CS: tuple[float, ...] = tuple(float(c) for c in np.logspace(-4, 2, 7))


@dataclass(frozen=True)
class LinearProbe:
    """A fitted probe: `softmax(((h - mean) / scale) @ weight.T + bias)` over the labels
    seen in training, every label a column.

    Attributes
    ----------
    mean, scale : np.ndarray
        `[H]` the standardisation of the hidden state
    weight, bias : np.ndarray
        `[S, H]` and `[S]`, one row per seen label (a binary fit's single
        row is written as two, the first zero, which is what its sigmoid is)
    seen : np.ndarray
        `[S]` the label indices seen in training
    n_labels : int
        Labels in all; an unseen one gets `1 / (n_train + n_labels)` (the add-one
        estimate of a label never seen), so no NLL is infinite
    n_train : int
        Training rows
    strength : float
        The `C` the inner folds chose
    """

    mean: np.ndarray
    scale: np.ndarray
    weight: np.ndarray
    bias: np.ndarray
    seen: np.ndarray
    n_labels: int
    n_train: int
    strength: float

    def probs(self, hidden: Any) -> np.ndarray:
        """`[N, n_labels]` float64 probabilities of `[N, H]` hidden states, row by row."""
        x = np.asarray(hidden, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.mean):
            raise ValueError(
                f"hidden states of shape {x.shape}: this probe reads [N, {len(self.mean)}] "
                "(the hidden size of the model it was fitted on)"
            )
        import torch

        from semsoft_plugin.core.row_probe import probe_distribution

        z = ((x - self.mean) / self.scale) @ self.weight.T + self.bias
        probs = probe_distribution(torch.from_numpy(z), self.seen.tolist(), self.n_labels,
                                   self.n_train)  # fmt: skip
        return np.asarray(probs.numpy(), dtype=np.float64)

    def on_logits(self, inverse: LogitsInverse) -> LogitsProbe:
        """This probe applied to the decision step's logits row of its model.

        Parameters
        ----------
        inverse : LogitsInverse
            The output layer's inverse of the model the probe was fitted on.

        Returns
        -------
        LogitsProbe
            The same scores, read through `h = W⁺ (z - b)`, each row judged by its
            residual.
        """
        import torch

        from semsoft_plugin.core.row_probe import LogitsProbe

        arrays = {k: torch.from_numpy(np.asarray(getattr(self, k), dtype=np.float64))
                  for k in ("mean", "scale", "weight", "bias")}  # fmt: skip
        return LogitsProbe.from_standardised(
            **arrays, seen=self.seen.tolist(), n_labels=self.n_labels, n_train=self.n_train,
            inverse=inverse,
        )  # fmt: skip

    def save(self, path: str | Path, labels: list[str] | tuple[str, ...]) -> None:
        """The weights as a safetensors file; `labels` (the column names) in its metadata."""
        from safetensors.numpy import save_file

        arrays = {k: np.ascontiguousarray(getattr(self, k)) for k in _ARRAYS}
        meta = {"labels": json.dumps(list(labels)), "n_train": str(self.n_train),
                "strength": repr(self.strength)}  # fmt: skip
        save_file(arrays, str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> tuple[LinearProbe, list[str]]:
        """A probe written by `save` and its label names, checked whole.

        Parameters
        ----------
        path : str or Path
            The safetensors file.

        Returns
        -------
        tuple
            The probe and its label names.

        Raises
        ------
        ValueError
            One line naming the file: missing, truncated or not safetensors, an array
            missing, of the wrong shape or not finite, a `scale` not positive, a
            `seen` index repeated or out of the labels' range, bad metadata.
        """
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = f.metadata() or {}
                arrays = {k: f.get_tensor(k) for k in _ARRAYS}
            labels = json.loads(meta["labels"])
            if not isinstance(labels, list) or not all(isinstance(n, str) for n in labels):
                raise ValueError("its labels are not a list of names")
            probe = cls(**arrays, n_labels=len(labels), n_train=int(meta["n_train"]),
                        strength=float(meta["strength"]))  # fmt: skip
            probe.check()
        except FileNotFoundError:
            raise ValueError(f"probe weights not found: {path}") from None
        except (KeyError, ValueError, TypeError, OSError, SafetensorError) as error:
            raise ValueError(f"{path} is not a probe written by semsoft ({error})") from None
        return probe, labels

    def check(self) -> None:
        """`ValueError` naming the first array of the wrong shape or kind, or holding a
        number that is not finite (a probe read from a file is untrusted input)."""
        hidden = self.mean.shape[0] if self.mean.ndim == 1 else -1
        seen = self.seen.shape[0] if self.seen.ndim == 1 else -1
        shapes = {"mean": (hidden,), "scale": (hidden,), "weight": (seen, hidden),
                  "bias": (seen,), "seen": (seen,)}  # fmt: skip
        if hidden < 1 or seen < 1:
            raise ValueError("mean and seen must be non-empty vectors")
        for name, shape in shapes.items():
            array = getattr(self, name)
            if tuple(array.shape) != shape:
                raise ValueError(f"{name} has shape {list(array.shape)}, not {list(shape)}")
            if name != "seen" and not np.issubdtype(array.dtype, np.floating):
                raise ValueError(f"{name} is {array.dtype}, not floating point")
            if name != "seen" and not np.isfinite(array).all():
                raise ValueError(f"{name} holds a number that is not finite")
        if not (self.scale > 0).all():
            raise ValueError("scale holds a value that is not positive")
        if not np.issubdtype(self.seen.dtype, np.integer):
            raise ValueError(f"seen is {self.seen.dtype}, not integer label indices")
        bad = [int(i) for i in self.seen if not 0 <= int(i) < self.n_labels]
        if bad or len(set(self.seen.tolist())) != seen:
            raise ValueError(
                f"seen {self.seen.tolist()} must be distinct label indices in [0, "
                f"{self.n_labels})"
            )
        if self.n_train < 1 or not math.isfinite(self.strength) or self.strength <= 0:
            raise ValueError(
                f"n_train {self.n_train} and strength {self.strength} must be positive"
            )


_ARRAYS = ("mean", "scale", "weight", "bias", "seen")


def fit_probe(
    hidden: Any,
    targets: Any,
    n_labels: int,
    *,
    inner_folds: int = 5,
    seed: int = 0,
    sample_weight: Any = None,
) -> LinearProbe:
    """The probe on `[N, H]` hidden states and `[N]` label indices (`< n_labels`):
    `StandardScaler` + `LogisticRegressionCV` (L2, `C` over `CS` chosen by
    inner stratified folds on log-loss). Needs two labels among the targets.
    `sample_weight`: `[N]` weights of the rows in the scaler and the regression's
    NLL (`None`: 1 each)."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold
    from sklearn.preprocessing import StandardScaler

    x = np.asarray(hidden, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"hidden {x.shape} and targets {y.shape} must be [N, H] and [N]")
    if len(np.unique(y)) < 2:
        raise ValueError(f"the probe needs two labels among the targets, got {np.unique(y)}")
    folds = max(2, min(inner_folds, int(np.bincount(y).max()), len(y) // 2))
    scaler = StandardScaler().fit(x, sample_weight=sample_weight)
    model = LogisticRegressionCV(
        Cs=list(CS), l1_ratios=(0.0,), cv=StratifiedKFold(folds, shuffle=True, random_state=seed),
        scoring="neg_log_loss", max_iter=1000, use_legacy_attributes=False,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a rare label: fewer members than folds
        model.fit(scaler.transform(x), y, sample_weight=sample_weight)
    weight, bias = model.coef_, model.intercept_
    if len(model.classes_) == 2:  # sigmoid(z) = softmax([0, z])
        weight, bias = np.vstack([np.zeros_like(weight), weight]), np.r_[0.0, bias]
    scale = np.asarray(scaler.scale_, dtype=np.float64)
    return LinearProbe(
        mean=np.asarray(scaler.mean_, dtype=np.float64), scale=scale,
        weight=np.asarray(weight, dtype=np.float64), bias=np.asarray(bias, dtype=np.float64),
        seen=np.asarray(model.classes_, dtype=np.int64), n_labels=int(n_labels),
        n_train=len(y), strength=float(np.ravel(model.C_)[0]),
    )  # fmt: skip


def held_probs(
    hidden: np.ndarray, targets: np.ndarray, train: np.ndarray, held: np.ndarray, n_labels: int,
    *, seed: int = 0, sample_weight: np.ndarray | None = None,
) -> tuple[np.ndarray, LinearProbe | None]:  # fmt: skip
    """The `held` rows' probabilities from the probe fitted on the `train` rows, and
    that probe. A training part with a single label gives its add-one label frequencies
    and no probe (no regression can be fitted)."""
    if len(np.unique(targets[train])) < 2:
        counts = np.bincount(targets[train], minlength=n_labels) + 1.0
        return np.tile(counts / counts.sum(), (len(held), 1)), None
    weights = None if sample_weight is None else sample_weight[train]
    probe = fit_probe(hidden[train], targets[train], n_labels, seed=seed, sample_weight=weights)
    return probe.probs(hidden[held]), probe


def probe_member(
    hidden: Any, targets: Any, n_labels: int, *, seed: int = 0, sample_weight: Any = None
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The probe as a member of the few-label fit (`fit_probs(external=...)`):
    `(train, held)` row indices -> the held rows' `[len(held), n_labels]`
    probabilities (`held_probs`)."""
    x = np.asarray(hidden, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    return lambda train, held: held_probs(x, y, train, held, n_labels, seed=seed,
                                          sample_weight=w)[0]  # fmt: skip


def probe_refused(advice: str) -> ValueError:
    """The error for a probe asked for where the engine cannot give the decision step's
    hidden state; `advice` says why and what to do instead."""
    return ValueError("fit family member 'probe' needs the decision step's hidden state: " + advice)
