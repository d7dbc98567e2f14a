"""The decision step's hidden state, read back from its logits row.

The output layer computes `z = W h + b` (`W` the `[V, d]` output embeddings, full column
rank; `b` a bias most models lack), so a probe's input is `h = W⁺ (z - b)`. Every logits
processor holds `z` (vLLM's, Outlines', transformers'), so a probe fitted on hidden states
applies wherever a processor runs, with no hidden-state API. `W⁺` is computed once from a
QR decomposition in float64 and kept in float32. A row that is not `W h + b` (a grammar
mask, `logit_bias`, penalties, soft-capping, another model) leaves a residual outside the
column space of `W`; a row is read only when its largest residual is within a stated
tolerance (in logit units), otherwise the caller is told why.

Torch only; the engines' adapters call `LogitsInverse.read`. Why QR and what the residual
measures: docs/vllm.md ("A fitted probe in the engine").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["DEFAULT_TOLERANCE", "LogitsInverse", "ReadBack"]

# Largest |z - W h - b| (logits) of a row still read as W h + b. A float32 head leaves
# about 1e-5; a bf16 head rounds a logit near 20 to 1/8, so its residuals reach ~0.07;
# an edit such as logit_bias, a penalty or a mask changes some logit by far more.
DEFAULT_TOLERANCE = 0.25


@dataclass(frozen=True)
class ReadBack:
    """Hidden states read back from logits rows, and how well each row fits.

    Attributes
    ----------
    hidden : Tensor
        `[N, d]` float32, `W⁺ (z - b)` for each row.
    residual : Tensor
        `[N]` float32, `max_i |z_i - (W h + b)_i|` of each row (`inf` for a row holding a
        non-finite logit, such as a masked token's `-inf`).
    readable : Tensor
        `[N]` bool, `residual <= tolerance`: only these rows are `W h + b`.
    """

    hidden: Tensor
    residual: Tensor
    readable: Tensor


class LogitsInverse:
    """The pseudo-inverse of an output layer, for reading hidden states from logits rows.

    Parameters
    ----------
    weight : Tensor
        `[V_rows, d]` output embeddings (the lm_head weight, or the tied input embedding),
        in any floating dtype. Rows past `vocab_size` (a padded vocabulary) are ignored.
    bias : Tensor or None
        `[V_rows]` output bias, if the model has one.
    vocab_size : int or None
        The number of real tokens (default: every row).

    Notes
    -----
    Memory: `W⁺` is kept in float32 beside the weight it was made from, `d x V` (the size
    of the output layer in float32: 113 MB for SmolLM2-135M, 0.93 GB for
    Qwen2.5-Coder-1.5B). A fit is applied to the `h` read back, not folded into an
    `[L, V]` map of the row: the residual check reads `h` anyway, and a fit then keeps
    only its own weights (`[L, d]`).

    Examples
    --------
    >>> torch.manual_seed(0) and None
    >>> w = torch.randn(50, 4, dtype=torch.float64)
    >>> h = torch.randn(3, 4, dtype=torch.float64)
    >>> inverse = LogitsInverse(w)
    >>> back = inverse.read((h @ w.T).float())
    >>> torch.allclose(back.hidden.double(), h, atol=1e-5), bool(back.readable.all())
    (True, True)
    >>> edited = (h @ w.T).float()
    >>> edited[0, 7] += 5.0                    # a logit_bias on one token
    >>> inverse.read(edited).readable.tolist()
    [False, True, True]
    """

    def __init__(
        self, weight: Tensor, bias: Tensor | None = None, *, vocab_size: int | None = None
    ) -> None:
        if not isinstance(weight, Tensor) or weight.dim() != 2 or not weight.is_floating_point():
            raise ValueError(
                f"output embeddings must be a floating [V, d] tensor, got "
                f"{type(weight).__name__} {tuple(getattr(weight, 'shape', ()))}"
            )
        rows, dim = weight.shape
        vocab = rows if vocab_size is None else int(vocab_size)
        if not dim < vocab <= rows:
            raise ValueError(
                f"vocab_size={vocab} must be in ({dim}, {rows}]: the hidden state can be read "
                "back only from more logits than hidden dimensions"
            )
        if bias is not None and tuple(bias.shape) != (rows,):
            raise ValueError(f"bias of shape {tuple(bias.shape)} must be [{rows}]")
        w64 = weight[:vocab].detach().to(torch.float64)
        q, r = torch.linalg.qr(w64)
        diagonal = torch.diagonal(r).abs()
        if not bool(torch.isfinite(w64).all()) or float(diagonal.min()) <= 1e-12 * float(
            diagonal.max()
        ):
            raise ValueError(
                "the output embeddings are not of full column rank (or hold a non-finite "
                "value): the hidden state cannot be read back from the logits"
            )
        self.vocab_size = vocab
        self.dim = int(dim)
        self.weight = weight[:vocab].detach().to(torch.float32)
        self.bias = None if bias is None else bias[:vocab].detach().to(torch.float32)
        # W⁺ = R⁻¹ Qᵀ, solved in float64, kept in float32.
        self.pinv = torch.linalg.solve_triangular(r, q.T, upper=True).to(torch.float32)

    def read(self, logits: Tensor, tolerance: float = DEFAULT_TOLERANCE) -> ReadBack:
        """The hidden states of `[N, V]` (or `[V]`) logits rows, with their residuals.

        Parameters
        ----------
        logits : Tensor
            The decision step's logits rows, as the processor got them (columns past
            `vocab_size`, a padded vocabulary, are ignored).
        tolerance : float
            The largest `|z - W h - b|` of a row still read as `W h + b` (logit units).

        Returns
        -------
        ReadBack
            `hidden`, `residual` and `readable`, one entry per row.
        """
        if not tolerance >= 0:
            raise ValueError(f"tolerance={tolerance!r} must be a number >= 0")
        z = logits.unsqueeze(0) if logits.dim() == 1 else logits
        if z.dim() != 2 or z.shape[1] < self.vocab_size:
            raise ValueError(
                f"logits of shape {tuple(logits.shape)}: need [N, >= {self.vocab_size}] "
                "(rows of the model this inverse was made from)"
            )
        z = z[:, : self.vocab_size].to(torch.float32)
        finite = torch.isfinite(z).all(dim=1)
        z = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
        if self.bias is not None:
            z = z - self.bias
        hidden = z @ self.pinv.T
        residual = (z - hidden @ self.weight.T).abs().amax(dim=1)
        residual = torch.where(finite, residual, torch.full_like(residual, float("inf")))
        return ReadBack(hidden=hidden, residual=residual, readable=residual <= tolerance)
