"""A fitted probe applied to the decision step's logits row, one row at a time.

A probe fitted on hidden states ("hidden calibration", Cho et al., NAACL 2025) is a linear
map `s = A h + c` of the decision step's hidden state over the `S` labels seen in
training, turned into label probabilities by `probe_distribution` (the softmax of `s`,
and the add-one floor `1 / (n_train + n_labels)` for a label never seen): the one function
every path that applies a probe uses.
[LogitsProbe][semsoft_plugin.fit.row_probe.LogitsProbe] reads `h` back from the logits
row with a [LogitsInverse][semsoft_plugin.fit.logits_inverse.LogitsInverse] and scores a
row with the fit only where its residual says it is `W h + b` (`readable`). A row's
probabilities never depend on the rows beside it.

Torch only. Its memory, and why the fit is not folded into the logits row: docs/vllm.md
("The probe's hidden state, from the logits row").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from semsoft_plugin.fit.logits_inverse import DEFAULT_TOLERANCE, LogitsInverse

__all__ = ["LogitsProbe", "ProbeRows", "probe_distribution"]


def probe_distribution(
    scores: Tensor, seen: Sequence[int] | Tensor, n_labels: int, n_train: int
) -> Tensor:
    """Label probabilities from a probe's scores over the labels seen in training.

    Parameters
    ----------
    scores : Tensor
        `[N, S]` the probe's scores `A h + c`, one column per seen label.
    seen : sequence of int or Tensor
        `[S]` the label index (`< n_labels`) of each column, distinct.
    n_labels : int
        The number of labels in all.
    n_train : int
        The number of training rows the probe was fitted on.

    Returns
    -------
    Tensor
        `[N, n_labels]` float64: each unseen label gets `1 / (n_train + n_labels)` (the
        add-one estimate of a label never seen), the seen labels share the rest by the
        softmax of `scores`. Rows sum to 1.

    Examples
    --------
    >>> probs = probe_distribution(torch.tensor([[0.0, 0.0]]), [0, 2], 3, 7)
    >>> [round(p, 4) for p in probs[0].tolist()]
    [0.45, 0.1, 0.45]
    """
    index = torch.as_tensor(seen, dtype=torch.int64)
    z = scores.to(torch.float64)
    if z.dim() != 2 or index.dim() != 1 or z.shape[1] != len(index):
        raise ValueError(
            f"scores of shape {tuple(scores.shape)} and seen of shape {tuple(index.shape)}: "
            "need [N, S] and [S]"
        )
    if n_labels < 2 or n_train < 1:
        raise ValueError(f"n_labels={n_labels} must be >= 2 and n_train={n_train} >= 1")
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= n_labels):
        raise ValueError(f"seen labels {index.tolist()} must lie in [0, n_labels={n_labels})")
    if len(torch.unique(index)) != len(index):
        raise ValueError(f"seen labels {index.tolist()} must be distinct")
    floor = 1.0 / (n_train + n_labels)
    out = torch.full((z.shape[0], n_labels), floor, dtype=torch.float64)
    out[:, index] = torch.softmax(z, dim=1) * (1.0 - (n_labels - len(index)) * floor)
    return out


@dataclass(frozen=True)
class ProbeRows:
    """A probe's label probabilities for logits rows, and whether each row could be read.

    Attributes
    ----------
    probs : Tensor
        `[N, n_labels]` float64; a row that is not readable holds the uniform
        distribution, which is no score: check `readable` first.
    residual : Tensor
        `[N]` float32, `max_i |z_i - (W h + b)_i|` of each row (`inf` for a row holding a
        non-finite logit).
    readable : Tensor
        `[N]` bool, `residual <= tolerance`: only these rows are scored with the fit.
    """

    probs: Tensor
    residual: Tensor
    readable: Tensor


class LogitsProbe:
    """A fitted linear probe on the hidden state, applied to logits rows.

    Parameters
    ----------
    weight : Tensor
        `[S, d]` the map `A` of the raw hidden state (any standardisation folded in,
        see `from_standardised`).
    bias : Tensor
        `[S]` the offset `c`.
    seen : sequence of int
        `[S]` the label index of each row of `weight`.
    n_labels : int
        The number of labels in all.
    n_train : int
        The training rows the probe was fitted on (the unseen labels' floor).
    inverse : LogitsInverse
        The output layer's inverse of the model the probe was fitted on.

    Examples
    --------
    >>> torch.manual_seed(0) and None
    >>> w = torch.randn(40, 3, dtype=torch.float64)
    >>> probe = LogitsProbe(torch.eye(2, 3), torch.zeros(2), [0, 1], 2, 10, LogitsInverse(w))
    >>> h = torch.tensor([[2.0, 0.0, 1.0]], dtype=torch.float64)
    >>> rows = probe.apply((h @ w.T).float())
    >>> [round(p, 3) for p in rows.probs[0].tolist()], rows.readable.tolist()
    ([0.881, 0.119], [True])
    """

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor,
        seen: Sequence[int],
        n_labels: int,
        n_train: int,
        inverse: LogitsInverse,
    ) -> None:
        a = weight.detach().to(torch.float64)
        c = bias.detach().to(torch.float64)
        if a.dim() != 2 or a.shape[1] != inverse.dim or tuple(c.shape) != (a.shape[0],):
            raise ValueError(
                f"a probe of shape {tuple(weight.shape)} + {tuple(bias.shape)} does not read "
                f"this model's hidden state: need [S, {inverse.dim}] + [S]"
            )
        if not bool(torch.isfinite(a).all()) or not bool(torch.isfinite(c).all()):
            raise ValueError("the probe's weights hold a non-finite value")
        self.weight = a
        self.bias = c
        self.seen = tuple(int(i) for i in seen)
        self.n_labels = int(n_labels)
        self.n_train = int(n_train)
        self.inverse = inverse
        # Checks seen, n_labels and n_train once, here rather than at the first row.
        probe_distribution(torch.zeros(1, len(self.seen)), self.seen, self.n_labels, self.n_train)
        if len(self.seen) != a.shape[0]:
            raise ValueError(f"{len(self.seen)} seen labels for a probe of {a.shape[0]} rows")

    @classmethod
    def from_standardised(
        cls,
        mean: Tensor,
        scale: Tensor,
        weight: Tensor,
        bias: Tensor,
        seen: Sequence[int],
        n_labels: int,
        n_train: int,
        inverse: LogitsInverse,
    ) -> LogitsProbe:
        """The probe `((h - mean) / scale) @ weight.T + bias` with its standardisation
        folded in: `A = weight / scale`, `c = bias - A mean` (float64).

        Parameters
        ----------
        mean : Tensor
            `[d]` the standardisation's mean.
        scale : Tensor
            `[d]` the standardisation's scale (each entry > 0).
        weight : Tensor
            `[S, d]` the probe's weights on standardised features.
        bias : Tensor
            `[S]` its intercepts.
        seen : sequence of int
            `[S]` the label index of each row.
        n_labels : int
            The number of labels in all.
        n_train : int
            The training rows.
        inverse : LogitsInverse
            The output layer's inverse.

        Returns
        -------
        LogitsProbe
            The same probe on the raw hidden state.
        """
        s = scale.detach().to(torch.float64)
        if not bool((s > 0).all()):
            raise ValueError("the probe's standardisation scale must be > 0 everywhere")
        a = weight.detach().to(torch.float64) / s
        c = bias.detach().to(torch.float64) - a @ mean.detach().to(torch.float64)
        return cls(a, c, seen, n_labels, n_train, inverse)

    @property
    def nbytes(self) -> int:
        """Bytes this fit keeps beside its model's shared inverse (`A` and `c`)."""
        return int(self.weight.numel() + self.bias.numel()) * self.weight.element_size()

    def hidden_probs(self, hidden: Tensor) -> Tensor:
        """The probe's label probabilities of hidden states already read back.

        Parameters
        ----------
        hidden : Tensor
            `[N, d]` hidden states (`ReadBack.hidden` of this probe's inverse).

        Returns
        -------
        Tensor
            `[N, n_labels]` float64.
        """
        scores = hidden.to(torch.float64) @ self.weight.T + self.bias
        return probe_distribution(scores, self.seen, self.n_labels, self.n_train)

    def apply(self, logits: Tensor, tolerance: float = DEFAULT_TOLERANCE) -> ProbeRows:
        """The probe's label probabilities of `[N, V]` (or `[V]`) decision-step logits rows.

        Parameters
        ----------
        logits : Tensor
            The rows as the processor got them (columns past the inverse's vocabulary,
            a padded vocabulary, are ignored).
        tolerance : float
            The largest `|z - W h - b|` of a row still scored (logit units).

        Returns
        -------
        ProbeRows
            `probs`, `residual`, `readable`, one entry per row; each row is computed
            on its own.
        """
        back = self.inverse.read(logits, tolerance)
        probs = self.hidden_probs(back.hidden)
        uniform = torch.full_like(probs, 1.0 / self.n_labels)
        probs = torch.where(back.readable.unsqueeze(1), probs, uniform)
        return ProbeRows(probs=probs, residual=back.residual, readable=back.readable)
