"""Label-free bias corrections applied after the scores (torch only).

A prompt biases a model towards some labels whatever the input (Zhao et al., 2021; Zhou
et al., 2024): a different error from the silent vote's, with a correction that needs no
labelled data. **Batch calibration** divides each row by the mean predicted distribution
$\\hat b$ over the unlabelled items being classified; online, a running mean per label set
([`RunningBias`][semsoft_plugin.core.calibration.RunningBias]) stands in for it, and
contextual calibration reads `b` from content-free inputs instead. **The file mode**
([`FileCalibration`][semsoft_plugin.core.calibration.FileCalibration]) estimates `b` once
from a file's distinct rows and applies it to each row alone, at a `strength` in `[0, 1]`
or under the guard (`"auto"`, the default: the full correction when the rows' mean top
probability is at most `GUARD_CONFIDENCE`, else none). It is opt-in: it needs the whole
file before any row is scored.

The formulas, and why the guard decides as it does: docs/method.md ("Label-free bias corrections").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = [
    "CONTENT_FREE",
    "GUARD_CONFIDENCE",
    "MIN_FILE_ROWS",
    "FileCalibration",
    "RunningBias",
    "batch_calibrate",
    "check_strength",
    "debias",
]

# Inputs that carry no content, scored in the user's prompt to read its label bias
# (Zhao et al., 2021).
CONTENT_FREE = ("N/A", "", "[MASK]")

_EPS = 1e-12
# The fewest distinct rows the file mode estimates a label bias from: a mean over a
# handful of rows is mostly their own content.
MIN_FILE_ROWS = 32
# The guard's bound (strength="auto"): the full correction when the rows' mean top
# probability is at most this, none above it (the module docstring says why).
GUARD_CONFIDENCE = 0.5
ArrayT = TypeVar("ArrayT")


def _as_probs(probs: Any, name: str = "probs") -> Tensor:
    values = torch.as_tensor(probs, dtype=torch.float64)
    if values.dim() != 2 or values.shape[1] < 2:
        raise ValueError(f"{name} must have shape [N, L] with L >= 2, got {tuple(values.shape)}")
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{name} contain NaN or inf")
    if bool((values < 0).any()):
        raise ValueError(f"{name} contain negative values")
    return values


def _like(result: Tensor, original: Any) -> Any:
    """Return a tensor for a tensor, a numpy array for anything else."""
    return result if isinstance(original, Tensor) else result.numpy()


def debias(probs: ArrayT, bias: Any) -> ArrayT:
    """Divide each row by `bias` (one value per label) and renormalise.

    Parameters
    ----------
    probs : array or Tensor of shape (N, L)
    bias : array or Tensor of shape (L,), positive

    Returns
    -------
    ArrayT
        The same kind as `probs` (float64), rows summing to 1. A row whose mass is
        removed entirely (all zero after division) is uniform, never NaN.
    """
    values = _as_probs(probs)
    b = torch.as_tensor(bias, dtype=torch.float64).reshape(-1)
    if b.shape[0] != values.shape[1] or not bool(torch.isfinite(b).all()) or bool((b < 0).any()):
        raise ValueError(
            f"bias must hold {values.shape[1]} finite non-negative values, got {b.tolist()[:8]}"
        )
    scaled = values / b.clamp_min(_EPS)
    total = scaled.sum(1, keepdim=True)
    uniform = torch.full_like(scaled, 1.0 / scaled.shape[1])
    out = torch.where(total > 0, scaled / total.clamp_min(_EPS), uniform)
    return _like(out, probs)


def batch_calibrate(probs: ArrayT, bias: Any | None = None) -> ArrayT:
    """Batch calibration: divide by the batch's mean distribution (or a given `bias`).

    Parameters
    ----------
    probs : array or Tensor of shape (N, L)
        Label probabilities of the N unlabelled items being classified together.
    bias : array or Tensor of shape (L,), optional
        A bias estimated elsewhere (e.g. [`RunningBias`][semsoft_plugin.core.calibration.RunningBias]); default the mean row.

    Returns
    -------
    ArrayT
        The same kind as `probs`. Invariants: a batch whose mean is uniform is left
        unchanged, and permuting the batch permutes the result.
    """
    values = _as_probs(probs)
    return debias(probs, values.mean(0) if bias is None else bias)


class RunningBias:
    """The running mean of label distributions seen so far: batch calibration online.

    A server classifies one request at a time; the batch's mean is then replaced by
    the mean over every request with the same label set so far. Until `min_count`
    items are seen the bias is uniform (no correction), since a mean over a handful
    of items is mostly noise.
    """

    def __init__(self, num_labels: int, *, min_count: int = 32) -> None:
        if num_labels < 2:
            raise ValueError(f"num_labels={num_labels} must be at least 2")
        if min_count < 1:
            raise ValueError(f"min_count={min_count} must be at least 1")
        self.total = torch.zeros(num_labels, dtype=torch.float64)
        self.count = 0
        self.min_count = min_count

    def update(self, probs: Any) -> None:
        """Add rows `[N, L]` to the running mean."""
        values = _as_probs(probs)
        if values.shape[1] != self.total.shape[0]:
            raise ValueError(f"expected {self.total.shape[0]} labels, got {values.shape[1]}")
        self.total += values.sum(0)
        self.count += int(values.shape[0])

    @property
    def bias(self) -> Tensor:
        """The current estimate `[L]` (uniform before `min_count` items)."""
        if self.count < self.min_count:
            return torch.full_like(self.total, 1.0 / self.total.shape[0])
        return self.total / self.count


@dataclass(frozen=True)
class FileCalibration:
    """A label bias estimated from the unlabelled rows of one file, applied row by row.

    Parameters
    ----------
    bias : tuple of float
        The mean label distribution `b` of the distinct rows it was estimated on, in
        the label order of those rows.
    strength : float in [0, 1]
        The share of the correction applied: rows are divided by `b ** strength` and
        renormalised; `0` changes nothing, `1` is batch calibration.
    rows : int
        How many distinct rows `bias` is the mean of (kept for the settings record).
    guard : bool
        Whether the guard chose `strength` (`estimate(strength="auto")`).
    confidence : float or None
        The rows' mean top probability, the statistic the guard reads (`None` when
        the correction was built from a bias alone).

    Notes
    -----
    The math: $p_{file}(l \\mid x) \\propto p(l \\mid x) / \\hat b(l)^s$ with
    $\\hat b = \\frac{1}{N} \\sum_i p(\\cdot \\mid x_i)$ over the N distinct rows.
    Duplicated texts count once, so a file of repeated rows does not outvote the rest.

    Examples
    --------
    A prompt that leans toward the first label on every row (the mean of the distinct
    rows is `[0.75, 0.25]`); the full correction divides that lean out of each row
    alone:

    >>> import numpy as np
    >>> from semsoft_plugin.core.calibration import FileCalibration
    >>> rows = np.array([[0.9, 0.1], [0.6, 0.4]] * 16)   # 32 distinct rows in a real file
    >>> calibration = FileCalibration.estimate(rows, strength=1.0)
    >>> [round(b, 3) for b in calibration.bias], calibration.rows
    ([0.75, 0.25], 32)
    >>> calibration.apply(np.array([[0.75, 0.25]])).round(3)
    array([[0.5, 0.5]])

    The guard (the default) reads the rows' mean top probability: .75 here, a model sure
    on most rows, so it applies nothing; on unsure rows it applies the full correction:

    >>> guarded = FileCalibration.estimate(rows)
    >>> guarded.guard, guarded.confidence, guarded.strength
    (True, 0.75, 0.0)
    >>> unsure = np.array([[0.5, 0.3, 0.2], [0.4, 0.35, 0.25]] * 16)
    >>> FileCalibration.estimate(unsure).strength
    1.0
    """

    bias: tuple[float, ...]
    strength: float = 1.0
    rows: int = 0
    guard: bool = False
    confidence: float | None = None

    def __post_init__(self) -> None:
        if len(self.bias) < 2:
            raise ValueError(f"bias must hold at least 2 labels, got {len(self.bias)}")
        if not all(math.isfinite(b) and b > 0 for b in self.bias):
            raise ValueError(f"bias must be finite and positive, got {list(self.bias)[:8]}")
        if not (isinstance(self.strength, (int, float)) and 0.0 <= self.strength <= 1.0):
            raise ValueError(f"strength={self.strength!r} must be a number in [0, 1]")
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 0:
            raise ValueError(f"rows={self.rows!r} must be a non-negative integer")
        if not isinstance(self.guard, bool):
            raise ValueError(f"guard={self.guard!r} must be True or False")
        c = self.confidence
        if c is not None and not (isinstance(c, float) and 0.0 <= c <= 1.0):
            raise ValueError(f"confidence={c!r} must be a probability or None")

    @classmethod
    def estimate(
        cls, probs: Any, *, strength: float | str = "auto", min_rows: int = MIN_FILE_ROWS
    ) -> FileCalibration:
        """The correction of the distinct rows `probs` `[N, L]` (the first pass).

        `strength`: a number in `[0, 1]`, or `"auto"` (the guard: 1 when the rows'
        mean top probability is at most `GUARD_CONFIDENCE`, else 0). Fewer than
        `min_rows` rows are refused: a mean over a handful of rows is mostly noise,
        and would move every row's score.
        """
        check_strength(strength)
        values = _as_probs(probs)
        if values.shape[0] < min_rows:
            raise ValueError(
                f"the file mode needs at least {min_rows} distinct rows to estimate the label "
                f"bias, got {values.shape[0]}"
            )
        rows = values / values.sum(1, keepdim=True).clamp_min(_EPS)
        bias = rows.mean(0).clamp_min(_EPS)
        confidence = float(rows.amax(1).mean().clamp(0.0, 1.0))
        guard = strength == "auto"
        applied = float(confidence <= GUARD_CONFIDENCE) if guard else float(strength)
        return cls(tuple(float(b) for b in bias), applied, int(values.shape[0]), guard, confidence)

    def apply(self, probs: ArrayT) -> ArrayT:
        """Each row of `probs` `[N, L]` divided by `bias ** strength`, renormalised;
        the result does not depend on the other rows."""
        values = _as_probs(probs)
        if values.shape[1] != len(self.bias):
            raise ValueError(
                f"probs have {values.shape[1]} labels, the file correction {len(self.bias)}"
            )
        bias = torch.tensor(self.bias, dtype=torch.float64) ** self.strength
        return debias(probs, bias)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the settings record (`from_dict` reads it back)."""
        return {
            "bias": list(self.bias),
            "strength": self.strength,
            "rows": self.rows,
            "guard": self.guard,
            "confidence": self.confidence,
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> FileCalibration:
        unknown = set(record) - {"bias", "strength", "rows", "guard", "confidence"}
        if unknown:
            raise ValueError(f"unknown file calibration field(s): {sorted(unknown)}")
        confidence = record.get("confidence")
        return cls(
            tuple(float(b) for b in record["bias"]),
            float(record.get("strength", 1.0)),
            int(record.get("rows", 0)),
            bool(record.get("guard", False)),
            None if confidence is None else float(confidence),
        )

    def matches(self, strength: float | str) -> bool:
        """Whether this correction is what `strength` (a number or `"auto"`) asks
        for: made by the guard for `"auto"`, at that strength without it otherwise."""
        if strength == "auto":
            return self.guard
        return not self.guard and self.strength == strength


def check_strength(strength: object, name: str = "strength") -> None:
    """`ValueError` unless `strength` is `"auto"` or a number in `[0, 1]`."""
    if strength == "auto":
        return
    if isinstance(strength, bool) or not isinstance(strength, int | float):
        raise ValueError(f"{name}={strength!r} must be 'auto' or a number in [0, 1]")
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"{name}={strength!r} must be 'auto' or a number in [0, 1]")
