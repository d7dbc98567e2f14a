"""The probe: a regularised logistic regression on the decision step's hidden state
("hidden calibration", Cho et al., NAACL 2025), anchored on the model's own label logits:
the family member of the few-label fit that reads more than the label logits.

A plain logistic regression on the hidden state `h` can separate labels the label logits
confuse, but with many labels and few items it forgets the model's ranking. So the probe
is a *correction* of the label logits `u = W_L h` (`label_logit_rows`),
`p(label | h) = softmax(beta * u + A x + c)`, with `A` shrunk toward 0 by an L2 penalty
whose strength inner stratified folds choose (falling back to the label logits with a
temperature where the labels show no better). The fitted probe is one linear map of `h`,
kept as plain arrays (`LinearProbe`): predicting needs numpy only, one row at a time, and
the weights are saved with safetensors, never pickle. `semsoft eval`'s `probe` method and
`Classifier.fit` fit it here. The objective, the choice of strength and why the fit is
exact in the span of the training rows: docs/few-labels.md ("The probe on the hidden state").
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
    from semsoft_plugin.fit.logits_inverse import LogitsInverse
    from semsoft_plugin.fit.row_probe import LogitsProbe

__all__ = [
    "CS",
    "LinearProbe",
    "fit_probe",
    "held_probs",
    "label_logit_rows",
    "probe_member",
    "probe_refused",
]

# Inverse L2 strengths on A searched by the inner folds (on standardised features): from
# next to nothing (the label logits with a temperature and per-label offsets) to 0.1.
# Weaker penalties fit 50-200 items of a 1,000-dimensional hidden state exactly, were never
# chosen on the dev kinds, and cost most of the fit's time (L-BFGS converges slowest there).
CS: tuple[float, ...] = tuple(float(c) for c in np.logspace(-6, -1, 6))


@dataclass(frozen=True)
class LinearProbe:
    """A fitted probe: `softmax(((h - mean) / scale) @ weight.T + bias)` over the labels
    seen in training, every label a column.

    Attributes
    ----------
    mean, scale : np.ndarray
        `[H]` the standardisation of the hidden state
    weight, bias : np.ndarray
        `[S, H]` and `[S]`, one row per seen label (`beta * W_L` folded in)
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

        from semsoft_plugin.fit.row_probe import probe_distribution

        if not np.isfinite(x).all():
            row = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            raise ValueError(f"hidden state {row} holds NaN or inf: the model's pass failed")
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

        from semsoft_plugin.fit.row_probe import LogitsProbe

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
            The safetensors file (a regular file: a FIFO or a device is refused).

        Returns
        -------
        tuple
            The probe and its label names.

        Raises
        ------
        ValueError
            One line naming the file: missing, not a regular file, truncated or not
            safetensors, an array missing, of the wrong shape, not finite or out of
            `PROBE_BOUNDS`, a `seen` index repeated or out of the labels' range, bad
            metadata.
        """
        from semsoft_plugin.core.config import read_file_bytes

        return cls.from_bytes(read_file_bytes(path, "probe weights"), str(path))

    @classmethod
    def from_bytes(cls, data: bytes, source: str) -> tuple[LinearProbe, list[str]]:
        """A probe and its label names from a safetensors file's bytes (`load`), so that
        the bytes checked against a fit's `probe_sha256` are the bytes used.

        Parameters
        ----------
        data : bytes
            The file's content.
        source : str
            The file, for the messages.

        Returns
        -------
        tuple
            The probe and its label names.
        """
        from safetensors import SafetensorError
        from safetensors.numpy import load

        try:
            size = int.from_bytes(data[:8], "little")
            header = json.loads(data[8 : 8 + size]) if 0 < size <= len(data) - 8 else None
            if not isinstance(header, dict):
                raise ValueError("no safetensors header")
            meta = header.get("__metadata__") or {}
            tensors = load(data)
            arrays = {k: tensors[k] for k in _ARRAYS}
            labels = json.loads(meta["labels"])
            if not isinstance(labels, list) or not all(isinstance(n, str) for n in labels):
                raise ValueError("its labels are not a list of names")
            probe = cls(**arrays, n_labels=len(labels), n_train=int(meta["n_train"]),
                        strength=float(meta["strength"]))  # fmt: skip
            probe.check()
        except (KeyError, ValueError, TypeError, OSError, SafetensorError) as error:
            raise ValueError(f"{source} is not a probe written by semsoft ({error})") from None
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
        for name, (low, high) in PROBE_BOUNDS.items():
            size = np.abs(getattr(self, name))
            bad = size[(size < low) | (size > high)]
            if bad.size:
                raise ValueError(
                    f"{name} holds {float(bad[0]):.6g}, outside [{low:g}, {high:g}] in size: "
                    "a fitted probe's values lie far inside these bounds, and values beyond "
                    "them overflow the scores to NaN"
                )
        if not np.issubdtype(self.seen.dtype, np.integer):
            raise ValueError(f"seen is {self.seen.dtype}, not integer label indices")
        bad = [int(i) for i in self.seen if not 0 <= int(i) < self.n_labels]
        if bad or len(set(self.seen.tolist())) != seen:
            raise ValueError(
                f"seen {self.seen.tolist()} must be distinct label indices in [0, {self.n_labels})"
            )
        if self.n_train < 1 or not math.isfinite(self.strength) or self.strength <= 0:
            raise ValueError(
                f"n_train {self.n_train} and strength {self.strength} must be positive"
            )


_ARRAYS = ("mean", "scale", "weight", "bias", "seen")
# The sizes a probe's arrays may hold: standardised hidden states times penalised
# coefficients then stay below 1e30 for any hidden state under 1e5 and hidden size under
# 1e5, so every score is finite in float64 and every probability a number. A fit gives
# scales near the hidden states' spread (StandardScaler; 1 for a constant feature) and
# coefficients below 1e3 (its penalty is at most C = 0.1).
PROBE_BOUNDS: dict[str, tuple[float, float]] = {
    "mean": (0.0, 1e6),
    "scale": (1e-12, 1e12),
    "weight": (0.0, 1e8),
    "bias": (0.0, 1e8),
}


def label_logit_rows(embeddings: Any, labels: Any) -> np.ndarray:
    """Each label's answer-token row of the output layer: the rows whose logits the probe corrects.

    Parameters
    ----------
    embeddings : Any
        The model's output embeddings (`OutputEmbeddings` or a `[V, H]` tensor).
    labels : Any
        A `LabelSet` or `LabelTokens`, in the probe's label order.

    Returns
    -------
    np.ndarray
        `[n_labels, H]` float64 `W_L`, so that `h @ W_L.T` are the label tokens' logits
        (less a bias the model may have, which the probe's per-label `c` absorbs).
    """
    import torch

    from semsoft_plugin.core.tokens import as_label_tokens

    weight = getattr(embeddings, "weight", embeddings)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"output embeddings must be a [V, H] tensor, got {type(weight).__name__}")
    ids = torch.tensor(as_label_tokens(labels).answer_token_ids, dtype=torch.int64)
    return weight.index_select(0, ids.to(weight.device)).detach().to("cpu", torch.float64).numpy()


@dataclass(frozen=True)
class _Anchored:
    """One penalised fit's parameters on projected features: `[S, r]` A, beta, `[S]` c."""

    a: np.ndarray
    beta: float
    c: np.ndarray

    def scores(self, features: np.ndarray, label_logits: np.ndarray) -> np.ndarray:
        return self.beta * label_logits + features @ self.a.T + self.c


def _fit_anchored(
    features: np.ndarray,
    label_logits: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    strength: float,
    start: _Anchored | None = None,
    succession: bool = True,
) -> _Anchored:
    """Minimise `C * sum_i w_i CE(t_i, p_i) + |A|^2 / 2` over `(A, beta, c)` with
    L-BFGS (convex: a multinomial logistic regression with unpenalised `beta` and `c`);
    `start` warm-starts it (the previous strength of a path).

    The targets `t` are the few-label fit's succession targets
    (`semsoft_plugin.fit.temperature_scaling.succession_targets`): where the label logits
    with an offset separate the training items, hard targets would drive the unpenalised
    `beta` without bound, and the first error on a new item would cost ~`beta` nats
    (`succession=False`, `FitPolicy.succession`: the hard targets)."""
    from scipy.optimize import minimize
    from scipy.special import logsumexp

    from semsoft_plugin.fit.temperature_scaling import succession_targets

    n, r = features.shape
    s = label_logits.shape[1]
    soft = succession_targets(y, s, count=float(w.sum()), succession=succession)

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        a, beta, c = theta[: s * r].reshape(s, r), theta[s * r], theta[s * r + 1 :]
        z = beta * label_logits + features @ a.T + c
        lse = logsumexp(z, axis=1)
        loss = strength * float(w @ (lse - (soft * z).sum(1))) + 0.5 * float(np.sum(a * a))
        g = strength * w[:, None] * (np.exp(z - lse[:, None]) - soft)
        grad = np.concatenate([(g.T @ features + a).ravel(), [np.sum(g * label_logits)], g.sum(0)])
        return loss, grad

    if start is None:
        theta0 = np.concatenate([np.zeros(s * r), [1.0], np.zeros(s)])
    else:
        theta0 = np.concatenate([start.a.ravel(), [start.beta], start.c])
    theta = minimize(objective, theta0, jac=True, method="L-BFGS-B",
                     options={"maxiter": 1000}).x  # fmt: skip
    return _Anchored(theta[: s * r].reshape(s, r), float(theta[s * r]), theta[s * r + 1 :])


def _span(x: np.ndarray) -> np.ndarray:
    """`[r, H]` an orthonormal basis of the rows of `x` (the penalised `A` lies in it).

    LAPACK's divide-and-conquer SVD (`gesdd`, numpy's) can fail to converge on finite
    rows: it did on 200 standardised hidden states of Qwen2.5-Coder-1.5B (abuse, one of
    10 draws), where the classic driver (`gesvd`, slower) converges; so that one is the
    fallback."""
    try:
        _, sv, vt = np.linalg.svd(x, full_matrices=False)
    except np.linalg.LinAlgError:
        from scipy.linalg import svd

        _, sv, vt = svd(x, full_matrices=False, lapack_driver="gesvd")
    return vt[sv > 1e-10 * max(float(sv[0]), 1e-300)] if len(sv) else vt


def _choose_strength(
    x: np.ndarray,
    u: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    folds: np.ndarray,
    succession: bool = True,
) -> float:
    """The `CS` entry with the smallest inner-fold weighted NLL among those whose
    inner-fold macro-F1 is at least the label logits' own (their ranking); where
    none is, the one with the best macro-F1."""
    from semsoft_plugin.fit.f1_guard import macro_f1

    s = u.shape[1]
    held_nll = np.zeros(len(CS))
    predicted = np.zeros((len(CS), len(y)), dtype=np.int64)
    for fold in np.unique(folds):
        train, held = folds != fold, folds == fold
        basis = _span(x[train])
        features, held_features = x[train] @ basis.T, x[held] @ basis.T
        previous = None
        for i, strength in enumerate(CS):
            previous = _fit_anchored(
                features, u[train], y[train], w[train], strength, previous, succession
            )
            z = previous.scores(held_features, u[held])
            z -= z.max(axis=1, keepdims=True)
            log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            held_nll[i] -= float(w[held] @ log_p[np.arange(held.sum()), y[held]])
            predicted[i, held] = z.argmax(axis=1)
    seen = np.bincount(y, minlength=s) > 0  # the same labels for each: fitting.fit_probs
    own = macro_f1(y, u.argmax(axis=1), s, w, labels=seen)
    f1 = np.array([macro_f1(y, p, s, w, labels=seen) for p in predicted])
    keeps = f1 >= own
    return float(CS[int(np.argmin(np.where(keeps, held_nll, np.inf)))] if keeps.any()
                 else CS[int(np.argmax(f1))])  # fmt: skip


def fit_probe(
    hidden: Any,
    targets: Any,
    n_labels: int,
    *,
    label_rows: Any,
    inner_folds: int = 5,
    seed: int = 0,
    sample_weight: Any = None,
    succession: bool = True,
) -> LinearProbe:
    """The probe on hidden states, anchored on the label logits (module docstring).

    Parameters
    ----------
    hidden : Any
        `[N, H]` decision-step hidden states.
    targets : Any
        `[N]` label indices, `< n_labels`; at least two labels among them.
    n_labels : int
        Labels in all.
    label_rows : Any
        `[n_labels, H]` each label's answer-token row of the output layer
        (`label_logit_rows`).
    inner_folds : int
        Stratified inner folds that choose the strength (fewer where a label is rarer).
    seed : int
        Their seed.
    sample_weight : Any
        `[N]` weights of the rows in the standardisation, the NLL and the choice of
        strength (`None`: 1 each).
    succession : bool
        Fit to the succession targets (`FitPolicy.succession`); `False`: the hard ones.

    Returns
    -------
    LinearProbe
        `softmax(beta W_L h + A x + c)` folded into one linear map of `h`.
    """
    from sklearn.preprocessing import StandardScaler

    from semsoft_plugin.fit.folds import stratified_folds

    x = np.asarray(hidden, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    w_l = np.asarray(label_rows, dtype=np.float64)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"hidden {x.shape} and targets {y.shape} must be [N, H] and [N]")
    if w_l.shape != (n_labels, x.shape[1]):
        raise ValueError(
            f"label_rows of shape {w_l.shape}: the probe needs [n_labels, H] = "
            f"[{n_labels}, {x.shape[1]}] (each label's answer-token output row)"
        )
    seen = np.unique(y)
    if len(seen) < 2:
        raise ValueError(f"the probe needs two labels among the targets, got {seen}")
    w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    column = np.searchsorted(seen, y)
    scaler = StandardScaler().fit(x, sample_weight=sample_weight)
    mean = np.asarray(scaler.mean_, dtype=np.float64)
    scale = np.asarray(scaler.scale_, dtype=np.float64)
    standard = (x - mean) / scale
    u = x @ w_l[seen].T
    folds_n = max(2, min(inner_folds, int(np.bincount(column).max()), len(y) // 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a rare label: fewer members than folds
        folds = stratified_folds(column, folds_n, seed)
    strength = _choose_strength(standard, u, column, w, folds, succession)
    basis = _span(standard)
    fitted = _fit_anchored(standard @ basis.T, u, column, w, strength, succession=succession)
    # beta * W_L h = beta * (W_L * scale) x + beta * W_L mean: one linear map of x.
    weight = fitted.a @ basis + fitted.beta * w_l[seen] * scale
    bias = fitted.c + fitted.beta * (w_l[seen] @ mean)
    return LinearProbe(mean=mean, scale=scale, weight=weight, bias=bias, seen=seen,
                       n_labels=int(n_labels), n_train=len(y), strength=strength)  # fmt: skip


def held_probs(
    hidden: np.ndarray, targets: np.ndarray, train: np.ndarray, held: np.ndarray, n_labels: int,
    *, label_rows: np.ndarray, seed: int = 0, sample_weight: np.ndarray | None = None,
    succession: bool = True,
) -> tuple[np.ndarray, LinearProbe | None]:  # fmt: skip
    """The `held` rows' probabilities from the probe fitted on the `train` rows, and
    that probe. A training part with a single label gives its add-one label frequencies
    and no probe (no regression can be fitted)."""
    if len(np.unique(targets[train])) < 2:
        counts = np.bincount(targets[train], minlength=n_labels) + 1.0
        return np.tile(counts / counts.sum(), (len(held), 1)), None
    weights = None if sample_weight is None else sample_weight[train]
    probe = fit_probe(hidden[train], targets[train], n_labels, label_rows=label_rows, seed=seed,
                      sample_weight=weights, succession=succession)  # fmt: skip
    return probe.probs(hidden[held]), probe


def probe_member(
    hidden: Any, targets: Any, n_labels: int, *, label_rows: Any, seed: int = 0,
    sample_weight: Any = None, succession: bool = True,
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:  # fmt: skip
    """The probe as a member of the few-label fit (`fit_probs(external=...)`):
    `(train, held)` row indices -> the held rows' `[len(held), n_labels]`
    probabilities (`held_probs`)."""
    x = np.asarray(hidden, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    a = np.asarray(label_rows, dtype=np.float64)
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    return lambda train, held: held_probs(x, y, train, held, n_labels, label_rows=a, seed=seed,
                                          sample_weight=w, succession=succession)[0]  # fmt: skip


def probe_refused(advice: str) -> ValueError:
    """The error for a probe asked for where the engine cannot give the decision step's
    hidden state; `advice` says why and what to do instead."""
    return ValueError("fit family member 'probe' needs the decision step's hidden state: " + advice)
