"""Label-free bias corrections applied after the scores (torch only).

Semantic Softmax puts back the probability a model gave to synonyms of the labels (the
silent vote). A prompt also biases the model towards some labels whatever the input
(Zhao et al., 2021; Zhou et al., 2024): that is a different error, with a different
correction, and neither needs labelled data:

* **batch calibration** (Zhou et al., ICLR 2024, "Batch Calibration"): the bias is the
  mean predicted distribution over the unlabelled items being classified,

  .. math::

      \\hat b(l) = \\frac{1}{N} \\sum_i p(l \\mid x_i), \\qquad
      p_{bc}(l \\mid x) = \\frac{p(l \\mid x) / \\hat b(l)}{\\sum_{l'} p(l' \\mid x) / \\hat b(l')}

  It needs the batch (no extra forward pass); online, a running mean per label set
  (:class:`RunningBias`) stands in for it.

Contextual calibration (the bias read from content-free inputs such as "N/A") is the
same division with another estimate of ``b``; ``semsoft eval`` has both.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = ["CONTENT_FREE", "RunningBias", "batch_calibrate", "debias"]

# Inputs that carry no content, scored in the user's prompt to read its label bias
# (Zhao et al., 2021).
CONTENT_FREE = ("N/A", "", "[MASK]")

_EPS = 1e-12
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
    """Divide each row by ``bias`` (one value per label) and renormalise.

    Parameters
    ----------
    probs : array or Tensor of shape (N, L)
    bias : array or Tensor of shape (L,), positive

    Returns
    -------
    The same kind as ``probs`` (float64), rows summing to 1. A row whose mass is
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
    """Batch calibration: divide by the batch's mean distribution (or a given ``bias``).

    Parameters
    ----------
    probs : array or Tensor of shape (N, L)
        Label probabilities of the N unlabelled items being classified together.
    bias : array or Tensor of shape (L,), optional
        A bias estimated elsewhere (e.g. :class:`RunningBias`); default the mean row.

    Returns
    -------
    The same kind as ``probs``. Invariants: a batch whose mean is uniform is left
    unchanged, and permuting the batch permutes the result.
    """
    values = _as_probs(probs)
    return debias(probs, values.mean(0) if bias is None else bias)


class RunningBias:
    """The running mean of label distributions seen so far: batch calibration online.

    A server classifies one request at a time; the batch's mean is then replaced by
    the mean over every request with the same label set so far. Until ``min_count``
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
        """Add rows ``[N, L]`` to the running mean."""
        values = _as_probs(probs)
        if values.shape[1] != self.total.shape[0]:
            raise ValueError(f"expected {self.total.shape[0]} labels, got {values.shape[1]}")
        self.total += values.sum(0)
        self.count += int(values.shape[0])

    @property
    def bias(self) -> Tensor:
        """The current estimate ``[L]`` (uniform before ``min_count`` items)."""
        if self.count < self.min_count:
            return torch.full_like(self.total, 1.0 / self.total.shape[0])
        return self.total / self.count
