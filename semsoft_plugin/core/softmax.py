"""Semantic Softmax: the pure-math core every adapter calls (torch only).

Notation (Badhe, Tiwari, Shah, 2026, "The Silent Vote"): over the top-K tokens $V_K$ of
$P = \\mathrm{softmax}(z)$, each label $l$ gets the mass of its neighbours,
$P_{sem}(l) \\propto \\sum_{v \\in V_K} P(v)\\, w(v, l)$ with
$w(v, l) = \\max(0, \\cos(E_v, E_l) - \\tau)$, where $E$ are the model's *output*
embeddings and $E_l$ the output embedding of label `l`'s anchor token (see
`anchor_token_ids` in [`LabelTokens`][semsoft_plugin.core.tokens.LabelTokens]).

The paper leaves several things open; this module decides them: a zero denominator gives
the constrained softmax and sets `fallback` (no NaN leaves this module), `center`,
`own_vote`, the vote rule (`vote`), the pool with the constrained softmax
(`semantic_weight`), a final `score_temperature`, and `-inf` logits as masked tokens (NaN
and `+inf` raise `ValueError`). `SemsoftConfig.preset("paper")` is exactly the paper's
formula. Each decision and why: docs/method.md ("Decisions").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.silent_vote import silent_vote_mass, silent_vote_weight
from semsoft_plugin.core.tokens import (
    LabelTokens,
    OutputEmbeddings,
    as_label_tokens,
    as_output_embeddings,
)

__all__ = [
    "SemanticSoftmax",
    "SemanticSoftmaxResult",
    "constrained_softmax",
    "semantic_softmax",
    "semantic_softmax_details",
]


def _check_logits(logits: Tensor) -> Tensor:
    if not isinstance(logits, Tensor):
        raise ValueError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dim() not in (1, 2):
        raise ValueError(f"logits must have shape [V] or [B, V], got {tuple(logits.shape)}")
    if logits.shape[-1] == 0:
        raise ValueError("logits have an empty vocabulary dimension")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    bad = torch.isnan(logits) | (logits == float("inf"))
    if bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        raise ValueError(
            f"logits contain NaN or +inf (first at index {where}); -inf (a masked token) is allowed"
        )
    if bool((logits == float("-inf")).all(dim=-1).any()):
        raise ValueError("a row of logits is entirely -inf: no token has any probability")
    return logits


def _check_label_ids(tokens: LabelTokens, vocab: int) -> None:
    for index, own in enumerate(tokens.own_token_ids):
        for token_id in (*own, tokens.anchors[index]):
            if token_id >= vocab:
                raise ValueError(
                    f"label {index}: token id {token_id} is outside the vocabulary of size {vocab}"
                )


def constrained_softmax(logits: Tensor, label_token_ids: Sequence[int] | Tensor | Any) -> Tensor:
    """Softmax over the label tokens only: the baseline constrained decoding implies.

    Parameters
    ----------
    logits : Tensor
        Tensor of shape (V,) or (B, V)
    label_token_ids : Sequence[int] | Tensor | Any
        Sequence of int, 1-D Tensor, LabelTokens or LabelSet
        The answer token of each label.

    Returns
    -------
    Tensor
        Tensor of shape (L,) or (B, L), float32, rows summing to 1. If every label token
        is masked (-inf) in a row, that row is uniform.

    Examples
    --------
    >>> import torch
    >>> from semsoft_plugin.core.softmax import constrained_softmax
    >>> logits = torch.tensor([2.0, 0.0, 5.0, 2.0])   # token 2 is not a label's
    >>> constrained_softmax(logits, [0, 1, 3])
    tensor([0.4683, 0.0634, 0.4683])
    >>> constrained_softmax(torch.tensor([[0.0, float("-inf"), float("-inf")]]), [1, 2])
    tensor([[0.5000, 0.5000]])
    """
    logits = _check_logits(logits)
    tokens = as_label_tokens(label_token_ids)
    _check_label_ids(tokens, logits.shape[-1])
    return _constrained(logits, tokens)


def _constrained(logits: Tensor, tokens: LabelTokens) -> Tensor:
    ids = torch.tensor(tokens.answer_token_ids, device=logits.device)
    picked = logits.index_select(-1, ids).to(torch.float32)
    all_masked = (picked == float("-inf")).all(dim=-1, keepdim=True)
    picked = torch.where(all_masked, torch.zeros_like(picked), picked)
    return torch.softmax(picked, dim=-1)


@dataclass(frozen=True)
class SemanticSoftmaxResult:
    """Everything one Semantic Softmax call measures, per row.

    Attributes
    ----------
    probs : Tensor (B, L)
        Calibrated label probabilities (the constrained softmax where `fallback`).
    constrained_probs : Tensor (B, L)
        Softmax over the label answer tokens only, for comparison.
    fallback : Tensor (B,) bool
        True where no kept token cleared `tau` for any label (0/0) and
        `probs` is the constrained softmax.
    coverage : Tensor (B,)
        Share of the top-K probability mass whose tokens vote for at least one
        label. Low coverage means the model's answer lies outside the label set.
    top_k_mass : Tensor (B,)
        Total probability of the K kept tokens.
    """

    probs: Tensor
    constrained_probs: Tensor
    fallback: Tensor
    coverage: Tensor
    top_k_mass: Tensor

    def squeeze(self) -> SemanticSoftmaxResult:
        """Drop the batch dimension of a single-row result."""
        return SemanticSoftmaxResult(*(t.squeeze(0) for t in self.__dict__.values()))


class SemanticSoftmax:
    """A label set bound to one model's output embeddings, ready to score logits.

    Everything that depends only on the labels and the embeddings (the label rows,
    their normalisation, the own-token lookup) is computed here once; each call
    then costs a top-K, a `[B, K, d]` gather and a `[B, K, L]` weight tensor.
    Adapters build one per label set and reuse it for every request.

    Parameters
    ----------
    embeddings : Tensor | OutputEmbeddings
        Tensor (V, d) or OutputEmbeddings
    labels : Sequence[int] | Tensor | LabelTokens | Any
        Sequence of int, 1-D Tensor, LabelTokens or LabelSet
    config : SemsoftConfig, optional
        Method settings; keyword arguments override its fields.
    **overrides : Any
        Any [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig] field (`k`, `vote`, `score_temperature`, ...).
    """

    def __init__(
        self,
        embeddings: Tensor | OutputEmbeddings,
        labels: Sequence[int] | Tensor | LabelTokens | Any,
        config: SemsoftConfig | None = None,
        **overrides: Any,
    ) -> None:
        self.config = (config or SemsoftConfig()).replace(**overrides)
        self.embeddings = as_output_embeddings(embeddings)
        self.labels = as_label_tokens(labels)
        _check_label_ids(self.labels, self.embeddings.vocab_size)
        device = self.embeddings.weight.device
        anchor_ids = torch.tensor(self.labels.anchors, device=device)
        self._label_rows = self.embeddings.unit_rows(anchor_ids, center=self.config.center)
        self._tau = self._label_thresholds()  # [L]
        own_ids = [t for own in self.labels.own_token_ids for t in own]
        own_label = [i for i, own in enumerate(self.labels.own_token_ids) for _ in own]
        self._own_ids = torch.tensor(own_ids, device=device)
        self._answer_ids = torch.tensor(self.labels.answer_token_ids, device=device)
        self._own_label = torch.tensor(own_label, device=device)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def thresholds(self) -> Tensor:
        """Each label's cosine threshold `tau_l`, float32 `[L]`."""
        return self._tau

    def _label_thresholds(self) -> Tensor:
        """`tau` for every label, or with `tau_quantile` the model's own cut-off.

        The quantile is taken over the cosines between a fixed sample of vocabulary
        rows and each label's embedding: how close an *unrelated* token typically is.
        A fixed seed makes it the same in every process and engine.
        """
        cfg = self.config
        device = self._label_rows.device
        if cfg.tau_quantile is None:
            return torch.full((self.num_labels,), cfg.tau, device=device)
        sample = self.embeddings.sample_rows(center=cfg.center)  # [S, d]
        cosine = sample.to(device) @ self._label_rows.T  # [S, L]
        tau = torch.quantile(cosine, cfg.tau_quantile, dim=0)
        # Bound away from 1 so the own-token weight 1 - tau_l stays positive.
        return tau.clamp(-1.0, 0.99)

    def __call__(self, logits: Tensor) -> SemanticSoftmaxResult:
        """Score logits `[V]` or `[B, V]`; see [`SemanticSoftmaxResult`][semsoft_plugin.core.softmax.SemanticSoftmaxResult]."""
        logits = _check_logits(logits)
        vocab = logits.shape[-1]
        if vocab > self.embeddings.weight.shape[0]:
            raise ValueError(
                f"logits have {vocab} entries but the embedding matrix has only "
                f"{self.embeddings.weight.shape[0]} rows"
            )
        _check_label_ids(self.labels, vocab)
        single = logits.dim() == 1
        rows = logits.unsqueeze(0) if single else logits
        result = self._score(rows)
        return result.squeeze() if single else result

    def score_top_k(self, top_ids: Tensor, top_log_probs: Tensor) -> SemanticSoftmaxResult:
        """Score sparse rows: the ids and log-probabilities of each row's kept tokens.

        What an engine returns instead of logits (vLLM's `logprobs=k`, an OpenAI
        server's `top_logprobs`). Semantic Softmax, the coverage and the constrained
        softmax of the kept label tokens are ratios of kept probabilities, so the missing
        normaliser cancels and this equals `__call__` on the full logits whenever
        the row holds its `k` most likely tokens and every label's answer token. Extra
        ids beyond the top `k` are allowed (they rank below the kept ones): pass the
        answer tokens' log-probs where known. An answer token the row lacks enters the
        pool at the smallest kept probability (an upper bound; the engines' readers
        fetch it or refuse instead) and the constrained softmax at 0.

        Parameters
        ----------
        top_ids : Tensor
            Integer token ids `[K]` or `[B, K]` (distinct within a row)
        top_log_probs : Tensor
            Their log-probabilities, same shape (any common offset)
        """
        ids = torch.as_tensor(top_ids)
        values = torch.as_tensor(top_log_probs, dtype=torch.float32)
        if ids.shape != values.shape or ids.dim() not in (1, 2) or ids.shape[-1] == 0:
            raise ValueError(
                f"top_ids {tuple(ids.shape)} and top_log_probs {tuple(values.shape)} must "
                "have one same non-empty shape [K] or [B, K]"
            )
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"top_ids must be integer token ids, got dtype {ids.dtype}")
        vocab = self.embeddings.vocab_size
        if bool(((ids < 0) | (ids >= vocab)).any()):
            bad = ids[(ids < 0) | (ids >= vocab)].flatten()[0].item()
            raise ValueError(f"top_ids holds token id {bad} outside the vocabulary [0, {vocab})")
        single = ids.dim() == 1
        rows_ids = ids.reshape(-1, ids.shape[-1]).long()
        if bool((rows_ids.sort(-1).values.diff(dim=-1) == 0).any()):
            raise ValueError("top_ids repeats a token id within a row")
        rows = torch.full((rows_ids.shape[0], vocab), float("-inf"))
        rows.scatter_(1, rows_ids, values.reshape(rows_ids.shape))
        return self(rows[0] if single else rows)

    def _score(self, logits: Tensor) -> SemanticSoftmaxResult:
        cfg = self.config
        # Padded-vocabulary columns (if any) never hold real tokens.
        real = min(logits.shape[-1], self.embeddings.vocab_size)
        log_p = torch.log_softmax(logits[:, :real].to(torch.float32), dim=-1)
        top_log_p, top_ids = torch.topk(log_p, min(cfg.k, real), dim=-1)  # [B, K]
        device = self._label_rows.device
        top_p = top_log_p.exp().to(device)
        constrained = _constrained(logits, self.labels).to(device)
        claims = self._claims(top_ids.to(device), top_p)
        coverage = (top_p * (claims.weights.sum(-1) > 0)).sum(-1) / top_p.sum(-1).clamp_min(1e-30)
        if cfg.semantic_weight == 0.0:
            # The constrained softmax itself: no vote is computed to be pooled with weight 0.
            pooled = _pool_constrained(log_p, top_log_p, self._answer_ids.to(log_p.device))
            probs = pooled.to(device=device, dtype=top_p.dtype)
            fallback = torch.zeros(probs.shape[0], dtype=torch.bool, device=device)
        else:
            semantic, fallback = _VOTE_RULES[cfg.vote](claims)
            weight = self._pool_weight(claims)
            if not isinstance(weight, float) or weight != 1.0:
                pool_with = _pool_constrained(log_p, top_log_p, self._answer_ids.to(log_p.device))
                semantic = _pooled(pool_with.to(device), semantic, weight)
            probs = torch.where(fallback.unsqueeze(-1), constrained, semantic)
        if cfg.score_temperature != 1.0:
            # The last step, on every row (a fallback row too): what Classifier.fit fits.
            probs = _tempered(probs, cfg.score_temperature)
        return SemanticSoftmaxResult(probs, constrained, fallback, coverage, top_p.sum(-1))

    def _pool_weight(self, claims: _Claims) -> float | Tensor:
        """`semantic_weight` for every row, or with `silent_vote` each row's own weight
        from its silent vote (`[B, 1]`, [semsoft_plugin.core.silent_vote][])."""
        cfg = self.config
        if cfg.silent_vote is None:
            return cfg.semantic_weight
        own = torch.isin(claims.top_ids, self._own_ids)
        m_out = silent_vote_mass(claims.top_p, _closeness(claims), own)
        return silent_vote_weight(m_out, cfg.semantic_weight, cfg.silent_vote)

    def _claims(self, top_ids: Tensor, top_p: Tensor) -> _Claims:
        """What each kept token claims of each label, before any vote rule."""
        tau = self._tau  # [L]
        token_rows = self.embeddings.unit_rows(top_ids, center=self.config.center)  # [B, K, d]
        weights = (token_rows @ self._label_rows.T - tau).clamp_min(0.0)  # [B, K, L]
        if self.config.own_vote:
            # A label's own token votes for that label alone, with the weight it gives itself.
            match = top_ids.unsqueeze(-1) == self._own_ids  # [B, K, M]
            owner = torch.zeros((*top_ids.shape, self.num_labels), dtype=weights.dtype,
                                device=weights.device)  # fmt: skip
            owner.scatter_add_(-1, self._own_label.expand(*match.shape), match.to(weights.dtype))
            own_weight = owner * (1.0 - tau).clamp_min(0.0)
            weights = torch.where(match.any(-1).unsqueeze(-1), own_weight, weights)
        return _Claims(top_ids, top_p, weights, tau, self._answer_ids)


@dataclass(frozen=True)
class _Claims:
    """The kept tokens of B rows and what each claims of each label: what a vote rule reads.

    Attributes
    ----------
    top_ids : Tensor
        `[B, K]` the kept token ids, most likely first.
    top_p : Tensor
        `[B, K]` their probabilities.
    weights : Tensor
        `[B, K, L]` each kept token's claim on each label: `max(0, cos - tau_l)`, or
        with `own_vote` a label's own token's `1 - tau_l` on that label alone.
    tau : Tensor
        `[L]` the labels' cosine thresholds.
    answer_ids : Tensor
        `[L]` the labels' answer tokens.
    """

    top_ids: Tensor
    top_p: Tensor
    weights: Tensor
    tau: Tensor
    answer_ids: Tensor


def _ratio(top_p: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """The votes renormalised: `sum_v P(v) w(v, l) / sum_l' sum_v P(v) w(v, l')` per row,
    and the rows where that is `0/0` (fallback)."""
    numerator = torch.einsum("bk,bkl->bl", top_p, weights)
    denominator = numerator.sum(-1, keepdim=True)
    fallback = denominator.squeeze(-1) <= 0
    # Divided in float64 by the denominator itself, not by a floor: vote mass can be
    # subnormal (kept tokens of probability ~1e-40) and must still sum to 1.
    safe = torch.where(fallback.unsqueeze(-1), torch.ones_like(denominator), denominator)
    return (numerator.double() / safe.double()).to(numerator.dtype), fallback


def _per_label(claims: _Claims) -> tuple[Tensor, Tensor]:
    """`vote="per_label"`, the paper's counting: a token votes once per label it is near."""
    return _ratio(claims.top_p, claims.weights)


def _shared(claims: _Claims) -> tuple[Tensor, Tensor]:
    """`vote="shared"`: each kept token's vote is shared out among the labels it is near
    (its weights normalised), then the votes are renormalised."""
    return _ratio(claims.top_p, _per_token(claims.weights))


def _residual(claims: _Claims) -> tuple[Tensor, Tensor]:
    """`vote="residual"`: a token claims its share of the top-K mass by its closeness to
    its nearest label (1 for a label's own token), shared out among the labels it is near."""
    return _with_residual(claims, _per_token(claims.weights), _closeness(claims))


def _closeness(claims: _Claims) -> Tensor:
    """`[B, K]` each kept token's closeness to its nearest label, `max_l w(v, l) / (1 - tau_l)`
    in [0, 1] (1 for a label's own token under `own_vote`)."""
    return (claims.weights / (1.0 - claims.tau).clamp_min(1e-6)).amax(-1).clamp(0.0, 1.0)


def _nearest(claims: _Claims) -> tuple[Tensor, Tensor]:
    """`vote="nearest"`: as `"residual"`, but all of a token's claim goes to its nearest
    label, by its margin over the second nearest (a token as near an antonym as its own
    label claims nothing). With one label it is `"residual"`."""
    weights, tau = claims.weights, claims.tau
    if weights.shape[-1] < 2:
        return _residual(claims)
    best = weights.topk(2, dim=-1)
    nearest = best.indices[..., 0]
    scale = (1.0 - tau[nearest]).clamp_min(1e-6)
    closeness = ((best.values[..., 0] - best.values[..., 1]) / scale).clamp(0.0, 1.0)
    one_hot = torch.nn.functional.one_hot(nearest, weights.shape[-1]).to(weights.dtype)
    return _with_residual(claims, one_hot, closeness)


def _per_token(weights: Tensor) -> Tensor:
    """`[B, K, L]` weights normalised per kept token (a token near no label keeps 0)."""
    return weights / weights.sum(-1).clamp_min(1e-30).unsqueeze(-1)


def _with_residual(claims: _Claims, shares: Tensor, closeness: Tensor) -> tuple[Tensor, Tensor]:
    """The residual rules' distribution: each kept token's share of the top-K mass times its
    `closeness` goes to the labels by `shares`; the unclaimed rest follows the
    constrained softmax *of the top-K* (the answer tokens among the kept tokens).

    That equals the constrained softmax whenever every answer token is kept, and needs
    nothing outside the top-K, so a reader that sees only the top-K log-probs (vLLM, an
    OpenAI server) gets exactly what transformers gets. A row with no answer token kept
    has only its claimed votes to go by.
    """
    top_p = claims.top_p.double()
    kept_p = top_p / top_p.sum(-1, keepdim=True).clamp_min(1e-300)  # shares of the top-K mass
    claimed = kept_p * closeness.double()  # [B, K]
    numerator = torch.einsum("bk,bkl->bl", claimed, shares.double())
    unclaimed = (1.0 - claimed.sum(-1, keepdim=True)).clamp_min(0.0)
    is_answer = claims.top_ids.unsqueeze(-1) == claims.answer_ids  # [B, K, L]
    answer_p = (kept_p.unsqueeze(-1) * is_answer).sum(1)  # [B, L]
    share = torch.where(answer_p.sum(-1, keepdim=True) > 0, answer_p, numerator)
    share = share / share.sum(-1, keepdim=True).clamp_min(1e-300)
    mixed = numerator + unclaimed * share
    total = mixed.sum(-1, keepdim=True)
    semantic = (mixed / torch.where(total > 0, total, 1.0)).to(claims.weights.dtype)
    return semantic, total.squeeze(-1) <= 0


# The vote rules (SemsoftConfig.vote): each turns the kept tokens' claims into a
# distribution over the labels and the rows where it fell back (0/0).
_VOTE_RULES: dict[str, Callable[[_Claims], tuple[Tensor, Tensor]]] = {
    "residual": _residual,
    "nearest": _nearest,
    "shared": _shared,
    "per_label": _per_label,
}


def _pool_constrained(log_p: Tensor, top_log_p: Tensor, answer_ids: Tensor) -> Tensor:
    """The constrained softmax the pool uses: `[B, L]`, from the row's log-probs.

    Each label's answer token has its own log-probability where the row holds a finite
    one (transformers and the in-engine processor see the whole vocabulary). Where it is
    `-inf` (a reader that got only the top-K log-probs, or an engine mask) it counts
    with the smallest kept log-probability, the most a token outside the top-K can have:
    a label is never pooled to 0 for want of its log-prob.
    """
    answer = log_p[:, answer_ids].to(torch.float64)  # [B, L]
    kept = top_log_p.to(torch.float64)
    # The smallest finite kept log-prob (K may exceed the unmasked tokens of a row).
    floor = torch.where(torch.isfinite(kept), kept, torch.inf).amin(1, keepdim=True)
    log_c = torch.where(torch.isfinite(answer), answer, floor)
    return torch.softmax(log_c, dim=-1)


def _pooled(constrained: Tensor, semantic: Tensor, weight: float | Tensor) -> Tensor:
    """Log-linear pool `softmax((1 - a) log P_con + a log P_sem)`, never NaN; `a` one
    weight, or one per row (`[B, 1]`).

    In float64 with the row maximum subtracted. A label the semantic votes gave exactly
    0 (no kept token near it, its answer token outside the top-K) has no semantic
    evidence either way: it keeps its constrained probability in the pool instead of
    being pooled to 0 (with `tau = 0.2` that zero made Qwen's GoEmotions NLL +4.6:
    the right label was such a label). Probabilities are floored at 1e-30 before the
    log, as in `_tempered`.
    """
    con = constrained.to(torch.float64)
    sem = semantic.to(torch.float64)
    sem = torch.where(sem > 0, sem, con)
    log_p = (1.0 - weight) * con.clamp_min(1e-30).log()
    log_p = log_p + weight * sem.clamp_min(1e-30).log()
    log_p = log_p - log_p.amax(dim=-1, keepdim=True)
    return torch.softmax(log_p, dim=-1).to(semantic.dtype)


def _tempered(probs: Tensor, temperature: float) -> Tensor:
    """`softmax(log probs / T)` for any finite `T > 0`, never NaN.

    In float64 and in log space with the row maximum subtracted first: the top label(s)
    sit at exactly 0, so as `T -> 0` the result tends to a hard argmax (ties split
    evenly) instead of `0/0`, and a huge `T` gives the uniform distribution. Dividing
    the float32 log-probabilities directly made every entry `-inf` (NaN after the
    softmax) for `T = 1e-45`.
    """
    log_p = probs.to(torch.float64).clamp_min(1e-30).log()
    log_p = log_p - log_p.amax(dim=-1, keepdim=True)
    return torch.softmax(log_p / temperature, dim=-1).to(probs.dtype)


def semantic_softmax_details(
    logits: Tensor,
    embeddings: Tensor | OutputEmbeddings,
    label_token_ids: Sequence[int] | Tensor | LabelTokens | Any,
    config: SemsoftConfig | None = None,
    **overrides: Any,
) -> SemanticSoftmaxResult:
    """Semantic and constrained distributions, fallback flag and coverage, per row.

    See [`semantic_softmax`][semsoft_plugin.core.softmax.semantic_softmax] for the parameters and the module docstring for the
    method. For repeated calls with one label set, build a [`SemanticSoftmax`][semsoft_plugin.core.softmax.SemanticSoftmax]
    once instead.
    """
    return SemanticSoftmax(embeddings, label_token_ids, config, **overrides)(logits)


def semantic_softmax(
    logits: Tensor,
    embeddings: Tensor | OutputEmbeddings,
    label_token_ids: Sequence[int] | Tensor | LabelTokens | Any,
    config: SemsoftConfig | None = None,
    **overrides: Any,
) -> Tensor:
    """Calibrated label probabilities by Semantic Softmax.

    Parameters
    ----------
    logits : Tensor
        Tensor of shape (V,) or (B, V)
        Unconstrained logits at the decision step. `-inf` entries are masked
        tokens; NaN and `+inf` raise `ValueError`.
    embeddings : Tensor of shape (V_rows, d) or OutputEmbeddings
        The model's output embeddings (lm_head weight), `V_rows >= V`.
    label_token_ids : Sequence[int] | Tensor | LabelTokens | Any
        Sequence of int, 1-D Tensor, LabelTokens or LabelSet
        Each label's answer token (and, through a LabelSet, its spelling variants).
    config : SemsoftConfig, optional
        Method settings; defaults are [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig]'s.
    **overrides : Any
        Any [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig] field: `k` (kept tokens, default 50), `tau`
        (cosine threshold), `center` (centre the embeddings first), `own_vote`,
        `vote`, `score_temperature`, `semantic_weight`, `tau_quantile`.
        `SemsoftConfig.preset("paper")` is the paper's formula.

    Returns
    -------
    Tensor
        Tensor of shape (L,) or (B, L), float32, rows summing to 1, never NaN. Rows where the
        formula is 0/0 hold the constrained softmax (see
        [`semantic_softmax_details`][semsoft_plugin.core.softmax.semantic_softmax_details] for the
        flag).

    Examples
    --------
    A vocabulary of four tokens in two dimensions: labels are tokens 0 ("yes") and 1
    ("no"); token 2 is a synonym of "yes", token 3 of "no". The model puts most of its
    mass on the synonym of "yes", which the constrained softmax ignores. The default
    `semantic_weight=0` is the constrained softmax; `1` the semantic distribution alone:

    >>> import torch
    >>> from semsoft_plugin.core.softmax import semantic_softmax
    >>> embeddings = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [0.1, 0.9]])
    >>> logits = torch.tensor([0.0, 0.0, 3.0, -1.0])
    >>> semantic_softmax(logits, embeddings, [0, 1], k=4)
    tensor([0.5000, 0.5000])
    >>> semantic_softmax(logits, embeddings, [0, 1], k=4, center=False, semantic_weight=1.0)
    tensor([0.8491, 0.1509])
    """
    return semantic_softmax_details(logits, embeddings, label_token_ids, config, **overrides).probs
