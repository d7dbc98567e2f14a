"""What the Semantic Softmax core is given: label tokens and output embeddings.

[`LabelTokens`][semsoft_plugin.core.tokens.LabelTokens] says which token ids stand for each label (answer token, own
tokens, embedding anchor); [`OutputEmbeddings`][semsoft_plugin.core.tokens.OutputEmbeddings] wraps the lm_head matrix with what
the cosines need once per matrix (the mean row for centring, a fixed vocabulary sample
for `tau_quantile`). Both are checked at construction so the math in
[`semsoft_plugin.core.softmax`][semsoft_plugin.core.softmax] can trust them. Torch only.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["LabelTokens", "OutputEmbeddings", "as_output_embeddings"]

# Rows of the embedding matrix are reduced to its mean in chunks of this many rows so
# that a bf16 matrix is never copied whole to float32.
_MEAN_CHUNK_ROWS = 16384
# Vocabulary rows sampled to derive a label's threshold from the model (tau_quantile).
_SAMPLE_ROWS = 8192


@dataclass(frozen=True)
class LabelTokens:
    """Token ids that stand for each label at the decision step.

    Parameters
    ----------
    answer_token_ids : tuple[int, ...]
        Tuple of int, length L
        The first answer token of each label as the model emits it. The constrained
        softmax is taken over these, and `E_l` is their output embedding.
    own_token_ids : tuple[tuple[int, ...], ...]
        Tuple of tuple of int, length L
        Per label, the tokens that are that label itself (its answer token and any
        declared spelling variants such as " Joy" for " joy"). With `own_vote` they
        vote for that label only. Must include `answer_token_ids[l]`.
    anchor_token_ids : tuple[int, ...] | None
        Length L: the token whose output embedding is each label's $E_l$ (None: the
        answer token, the paper's rule); e.g. " sadness" for a label answered as the
        fragment "s" (docs/method.md, "Label sets"). The constrained softmax still
        uses the answer token.
    """

    answer_token_ids: tuple[int, ...]
    own_token_ids: tuple[tuple[int, ...], ...]
    anchor_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.answer_token_ids) == 0:
            raise ValueError("label set is empty: need at least one label token id")
        self._check_one_per_label("own_token_ids", self.own_token_ids)
        seen: dict[int, int] = {}
        for index, token_id in enumerate(self.answer_token_ids):
            _check_token_id(index, token_id, "token id")
            if token_id in seen:
                raise ValueError(
                    f"labels {seen[token_id]} and {index} have the same answer token id "
                    f"{token_id}: they cannot be told apart"
                )
            seen[token_id] = index
        if self.anchor_token_ids is not None:
            self._check_one_per_label("anchor_token_ids", self.anchor_token_ids)
            for index, token_id in enumerate(self.anchor_token_ids):
                _check_token_id(index, token_id, "anchor token id")
        owner: dict[int, int] = {}
        for index, own in enumerate(self.own_token_ids):
            if self.answer_token_ids[index] not in own:
                raise ValueError(f"label {index}: own_token_ids must include its answer token")
            for token_id in own:
                if owner.setdefault(token_id, index) != index:
                    raise ValueError(
                        f"token id {token_id} is declared as its own by labels "
                        f"{owner[token_id]} and {index}"
                    )

    @classmethod
    def from_ids(cls, label_token_ids: Sequence[int] | Tensor) -> LabelTokens:
        """One answer token per label, no variants (the paper's single-token setting)."""
        if isinstance(label_token_ids, Tensor):
            if label_token_ids.dim() != 1:
                raise ValueError(
                    f"label_token_ids must be 1-D, got shape {tuple(label_token_ids.shape)}"
                )
            ids = tuple(int(t) for t in label_token_ids.tolist())
        else:
            ids = tuple(label_token_ids)
        return cls(ids, tuple((t,) for t in ids))

    def _check_one_per_label(self, name: str, values: Sequence[Any]) -> None:
        if len(values) != len(self.answer_token_ids):
            raise ValueError(
                f"{name} has {len(values)} entries for {len(self.answer_token_ids)} labels"
            )

    def __len__(self) -> int:
        return len(self.answer_token_ids)

    @property
    def anchors(self) -> tuple[int, ...]:
        """The token each label's embedding is read from (`anchor_token_ids` or the answer)."""
        return self.answer_token_ids if self.anchor_token_ids is None else self.anchor_token_ids


def _check_token_id(index: int, token_id: Any, what: str) -> None:
    if not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0:
        raise ValueError(f"label {index}: {what} {token_id!r} is not a non-negative int")


def as_label_tokens(labels: Any) -> LabelTokens:
    if isinstance(labels, LabelTokens):
        return labels
    tokens = getattr(labels, "label_tokens", None)  # a semsoft_plugin.core.labels.LabelSet
    if isinstance(tokens, LabelTokens):
        return tokens
    return LabelTokens.from_ids(labels)


class OutputEmbeddings:
    """An output-embedding matrix with the statistics the method needs, computed once.

    Holds the matrix without copying it. The mean row (for centring) is computed on
    first use and cached; per call only the `K` kept rows and the label rows are
    gathered and normalised, so no `V x d` or `V x L` tensor is made per call.

    Parameters
    ----------
    weight : Tensor of shape (V_rows, d)
        The lm_head weight (or tied input embedding). May be bf16/fp16.
    vocab_size : int, optional
        Number of real tokens. Rows past it (a padded vocabulary) are ignored for the
        mean and may never be selected.
    """

    def __init__(self, weight: Tensor, vocab_size: int | None = None) -> None:
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise ValueError(
                f"embeddings must be a 2-D tensor (V, d), got {type(weight).__name__} "
                f"{tuple(getattr(weight, 'shape', ()))}"
            )
        rows = weight.shape[0]
        if vocab_size is None:
            vocab_size = rows
        if not 0 < vocab_size <= rows:
            raise ValueError(f"vocab_size={vocab_size} must be in [1, {rows}] (matrix rows)")
        self.weight = weight.detach()
        self.vocab_size = int(vocab_size)
        self._mean: Tensor | None = None

    @property
    def dim(self) -> int:
        return int(self.weight.shape[1])

    @property
    def mean(self) -> Tensor:
        """Mean output embedding over the real vocabulary, float32 `[d]`."""
        if self._source is not None:
            return self._source.mean
        if self._mean is None:
            total = torch.zeros(self.dim, dtype=torch.float64, device=self.weight.device)
            for start in range(0, self.vocab_size, _MEAN_CHUNK_ROWS):
                stop = min(start + _MEAN_CHUNK_ROWS, self.vocab_size)
                total += self.weight[start:stop].to(torch.float64).sum(0)
            self._mean = (total / self.vocab_size).to(torch.float32)
        return self._mean

    def sample_rows(self, *, center: bool, size: int | None = None) -> Tensor:
        """A fixed random sample of real vocabulary rows, as [`unit_rows`][semsoft_plugin.core.tokens.OutputEmbeddings.unit_rows] gives them.

        The sample (seed 0) is the same in every process, so thresholds derived from it
        (`tau_quantile`) agree between the transformers and vLLM adapters.
        """
        if self._source is not None:
            return self._source.sample_rows(center=center, size=size)
        generator = torch.Generator().manual_seed(0)
        count = min(size or _SAMPLE_ROWS, self.vocab_size)
        ids = torch.randperm(self.vocab_size, generator=generator)[:count]
        return self.unit_rows(ids.to(self.weight.device), center=center)

    def unit_rows(self, token_ids: Tensor, *, center: bool) -> Tensor:
        """Gathered rows, optionally centred, L2-normalised, float32 `[..., d]`."""
        rows = self.weight[token_ids].to(torch.float32)
        if center:
            rows = rows - self.mean.to(rows.device)
        return torch.nn.functional.normalize(rows, dim=-1, eps=1e-12)

    # Set by subset(): the whole matrix, whose mean and vocabulary sample a subset keeps.
    _source: OutputEmbeddings | None = None

    def subset(self, token_ids: Tensor) -> OutputEmbeddings:
        """The rows `token_ids` as a matrix of their own, with this matrix's statistics.

        Row `i` of the result is token `token_ids[i]`; the mean row (centring) and the
        vocabulary sample (`tau_quantile`) stay the whole vocabulary's, so scoring logits
        restricted to these columns (label ids remapped) equals scoring the full rows.
        `semsoft tune` sweeps its grid this way over the kept and label tokens only.
        """
        part = OutputEmbeddings(self.weight[token_ids])
        part._source = self._source or self
        return part


# Wrapping a raw tensor caches its OutputEmbeddings so the mean is computed once per
# matrix even through the functional API. Keyed by id() with a weakref finaliser,
# because tensors compare elementwise and cannot be dictionary keys by value.
_WRAPPED: dict[int, tuple[weakref.ref[Tensor], OutputEmbeddings]] = {}


def as_output_embeddings(embeddings: Tensor | OutputEmbeddings) -> OutputEmbeddings:
    """`embeddings` as an [`OutputEmbeddings`][semsoft_plugin.core.tokens.OutputEmbeddings] (a raw matrix is wrapped once, so
    its mean row is computed once however often it is passed)."""
    if isinstance(embeddings, OutputEmbeddings):
        return embeddings
    if not isinstance(embeddings, Tensor):
        raise ValueError(
            f"embeddings must be a Tensor or OutputEmbeddings, got {type(embeddings).__name__}"
        )
    key = id(embeddings)
    cached = _WRAPPED.get(key)
    if cached is not None and cached[0]() is embeddings:
        return cached[1]
    wrapped = OutputEmbeddings(embeddings)

    def forget(_ref: weakref.ref[Tensor]) -> None:
        _WRAPPED.pop(key, None)

    _WRAPPED[key] = (weakref.ref(embeddings, forget), wrapped)
    return wrapped
