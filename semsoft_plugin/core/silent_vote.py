"""The silent vote of one row, and the pool weight it decides for that row (torch only).

The paper's claim is per row: the probability the model put on tokens that are not the
labels but mean one of them (the *silent vote*) is what the constrained softmax throws
away. Where the label tokens hold nearly all the kept mass there is no silent vote and
pooling with the semantic distribution can only add noise; where most of it sits on the
labels' neighbours, that is where the pool should act. This module measures the silent
vote of each row and maps it to that row's pool weight; `SemanticSoftmax` applies the
weight (`SemsoftConfig.silent_vote`, `SemsoftConfig.preset("silent-vote")`).

Every quantity is one row's own: no statistic of the batch enters, so a row's scores do
not depend on the rows scored with it.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["silent_vote_mass", "silent_vote_weight"]


def silent_vote_mass(top_p: Tensor, closeness: Tensor, own: Tensor) -> Tensor:
    """Each row's silent vote: the share of its top-K mass on label neighbours.

    ```text
    m_out = sum over kept tokens v not among the labels' own tokens of  P(v) / P(V_K) * c(v)
    ```

    where `c(v)` is the kept token's closeness to its nearest label, `max_l max(0,
    cos(E_v, E_l) - tau_l) / (1 - tau_l)` in [0, 1], and `own` the labels' own tokens
    (answer tokens and spelling variants), whose mass the constrained softmax already
    counts.

    Parameters
    ----------
    top_p : Tensor
        `[B, K]` the kept tokens' probabilities (any positive scale per row).
    closeness : Tensor
        `[B, K]` each kept token's closeness `c(v)` to its nearest label, in [0, 1].
    own : Tensor
        `[B, K]` bool, True where the kept token is a label's own token.

    Returns
    -------
    Tensor
        `[B]` float64 in [0, 1]; 0 for a row whose kept mass is all on label tokens
        (or is 0).

    Examples
    --------
    Two rows of three kept tokens: the first a label token, then a synonym (closeness
    0.8) and a filler (closeness 0):

    >>> import torch
    >>> top_p = torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.8, 0.1]])
    >>> closeness = torch.tensor([[1.0, 0.8, 0.0], [1.0, 0.8, 0.0]])
    >>> own = torch.tensor([[True, False, False], [True, False, False]])
    >>> silent_vote_mass(top_p, closeness, own)
    tensor([0.2400, 0.6400], dtype=torch.float64)
    """
    p = top_p.double()
    shares = p / p.sum(-1, keepdim=True).clamp_min(1e-300)
    silent = shares * closeness.double().clamp(0.0, 1.0) * (~own).double()
    return silent.sum(-1).clamp(0.0, 1.0)


def silent_vote_weight(m_out: Tensor, weight: float, threshold: float) -> Tensor:
    """Each row's pool weight from its silent vote: none below `threshold`, rising to
    `weight` as the silent vote holds all of the kept mass.

    ```text
    a(m_out) = a_max * min(1, max(0, (m_out - t) / (1 - t)))
    ```

    with `a_max = weight` (`SemsoftConfig.semantic_weight`) and `t = threshold`
    (`SemsoftConfig.silent_vote`): monotone in the silent vote, two parameters.

    Parameters
    ----------
    m_out : Tensor
        `[B]` each row's silent vote ([silent_vote_mass][semsoft_plugin.core.silent_vote.silent_vote_mass]), in [0, 1].
    weight : float
        The largest pool weight `a_max`, in [0, 1].
    threshold : float
        The silent vote `t` in [0, 1) at and below which a row is not pooled.

    Returns
    -------
    Tensor
        `[B, 1]` float64 pool weights in `[0, weight]`, ready to broadcast over the
        labels.

    Examples
    --------
    >>> import torch
    >>> m_out = torch.tensor([0.1, 0.4, 0.7, 1.0], dtype=torch.float64)
    >>> silent_vote_weight(m_out, 0.8, 0.4).flatten()
    tensor([0.0000, 0.0000, 0.4000, 0.8000], dtype=torch.float64)
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight={weight!r} must be in [0, 1]")
    if not 0.0 <= threshold < 1.0:
        raise ValueError(f"threshold={threshold!r} must be in [0, 1)")
    ramp = ((m_out.double() - threshold) / (1.0 - threshold)).clamp(0.0, 1.0)
    return (weight * ramp).unsqueeze(-1)
