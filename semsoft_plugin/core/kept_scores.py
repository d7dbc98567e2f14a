"""Kept forward passes: what a fit of Semantic Softmax's settings reads, and the grid
of settings scored on them.

A fit compares many settings on the same items, so each item's forward pass is run
once and *kept*: the top `S` decision-step logits (or log-probabilities) and those of
every label token (`KeptScores`). That is lossless for Semantic Softmax with
any `k <= S`, so `grid_probs` scores every setting of a grid from the kept
values alone, on a compact vocabulary instead of the model's whole one.
`Classifier.fit` keeps them from its engine; `semsoft eval` / `semsoft tune`
keep them on disk (the evaluation package's `Forward`, which has the same fields).
The fit itself is `semsoft_plugin.fit.fitting`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.result import LabelResult
from semsoft_plugin.core.softmax import SemanticSoftmax, SemanticSoftmaxResult
from semsoft_plugin.core.tokens import LabelTokens, as_label_tokens, as_output_embeddings

__all__ = [
    "Kept",
    "KeptScores",
    "compress",
    "grid_probs",
    "kept_from_top_logprobs",
    "kept_result",
    "kept_rows",
    "label_token_ids",
]


class Kept(Protocol):
    """What grid scoring reads from kept forward passes (`KeptScores` or the
    evaluation package's `Forward`)."""

    top_ids: Tensor
    top_logits: Tensor
    label_ids: Tensor
    label_logits: Tensor


@dataclass
class KeptScores:
    """Decision-step scores of N items, compressed losslessly for Semantic Softmax with
    any `k <= S`.

    Attributes
    ----------
    top_ids, top_logits : Tensor
        `[N, S]` the S highest raw logits (or log-probabilities) per
        item, highest first, and their token ids
    label_ids : Tensor
        `[M]` every label's answer token, then its own-token variants
    label_logits : Tensor
        `[N, M]` their raw values (`-inf` where unknown)
    """

    top_ids: Tensor
    top_logits: Tensor
    label_ids: Tensor
    label_logits: Tensor


def kept_rows(kept: Kept, rows: slice | Sequence[int] | np.ndarray) -> KeptScores:
    """The kept passes of some items: `rows` a slice or item indices (the label
    tokens are every item's).

    Parameters
    ----------
    kept : Kept
        `N` kept forward passes (`KeptScores` or the evaluation package's `Forward`).
    rows : slice | Sequence[int] | np.ndarray
        Which items, in the order wanted.

    Returns
    -------
    KeptScores
        Those items' kept scores.
    """
    index: slice | Tensor = (
        rows if isinstance(rows, slice) else torch.as_tensor(np.asarray(rows, dtype=np.int64))
    )
    return KeptScores(
        kept.top_ids[index], kept.top_logits[index], kept.label_ids, kept.label_logits[index]
    )


def label_token_ids(labels: Any) -> list[int]:
    """Every label's answer token, then the own-token variants not already listed (the
    answer tokens come first). `labels`: a LabelSet or LabelTokens."""
    tokens = as_label_tokens(labels)
    ids = list(tokens.answer_token_ids)
    ids += [t for own in tokens.own_token_ids for t in own if t not in ids]
    return ids


def compress(rows: Tensor, store_k: int, label_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`(top_ids, top_values, label_values)` of `[N, V]` decision-step rows."""
    rows = rows.to(torch.float32)
    values, ids = torch.topk(rows, min(store_k, rows.shape[1]), dim=-1)
    return ids, values, rows.index_select(1, label_ids)


def kept_from_top_logprobs(results: Sequence[LabelResult], token_ids: Sequence[int]) -> KeptScores:
    """`KeptScores` from `classify_vllm(..., keep_logprobs=S, token_ids=...)`
    results (`top_logprobs`: id -> raw log-prob, `token_logprobs` for `token_ids`),
    top values sorted highest first."""
    tops = [r.top_logprobs for r in results if r.top_logprobs is not None]
    if len(tops) != len(results):
        raise ValueError("a result without top_logprobs: pass keep_logprobs=... to classify_vllm")
    named = [r.token_logprobs or {} for r in results]  # None when token_ids was empty
    widths = {len(top) for top in tops}
    if len(widths) != 1:
        raise ValueError(f"the engine returned ragged top log-probabilities (widths {widths})")
    ids = torch.tensor([list(top) for top in tops], dtype=torch.long)
    values = torch.tensor([list(top.values()) for top in tops], dtype=torch.float32)
    values, order = values.sort(dim=1, descending=True)
    label_values = torch.tensor(
        [[found[t] for t in token_ids] for found in named], dtype=torch.float32
    )
    return KeptScores(ids.gather(1, order), values, torch.tensor(list(token_ids)), label_values)


# -- grid scoring ------------------------------------------------------------------


def _compact(
    kept: Kept, embeddings: Any, tokens: LabelTokens, max_k: int
) -> tuple[Tensor, Any, LabelTokens]:
    """Logits `[N, U]` over the union U of kept, label and own tokens, with matching
    embedding rows.

    A grid sweep only ever looks at the kept top tokens and the label tokens, so it
    scores this compact vocabulary instead of ~150k columns per config; the rows come
    from `OutputEmbeddings.subset`, which keeps the whole vocabulary's mean row
    (centring) and sample (`tau_quantile`). Own-token variants the kept values lack
    (a label set with more spellings than the pass kept) enter with `-inf`: they can
    only act as kept tokens, and a kept token is in `top_ids`.
    """
    full = as_output_embeddings(embeddings)
    top_ids = kept.top_ids[:, :max_k].contiguous()
    n = top_ids.shape[0]
    label_ids = kept.label_ids.to(top_ids.dtype)
    extra = torch.tensor(
        [*tokens.anchors, *(t for own in tokens.own_token_ids for t in own)], dtype=top_ids.dtype
    )
    keep = torch.unique(torch.cat([top_ids.reshape(-1), label_ids, extra]))  # sorted
    logits = torch.full((n, len(keep)), float("-inf"))
    logits.scatter_(1, torch.searchsorted(keep, label_ids).expand(n, -1), kept.label_logits.float())
    logits.scatter_(1, torch.searchsorted(keep, top_ids), kept.top_logits[:, :max_k].float())
    where = {int(t): i for i, t in enumerate(keep.tolist())}
    remapped = LabelTokens(
        tuple(where[t] for t in tokens.answer_token_ids),
        tuple(tuple(where[t] for t in own) for own in tokens.own_token_ids),
        None if tokens.anchor_token_ids is None else tuple(where[t] for t in tokens.anchors),
    )
    return logits, full.subset(keep), remapped


def grid_probs(
    kept: Kept,
    embeddings: Any,
    labels: Any,
    configs: Sequence[SemsoftConfig],
    *,
    chunk: int = 256,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """`[C, N, L]` Semantic Softmax probabilities per config, and `[C]` fallback rates.

    Every config is scored by the core's [`SemanticSoftmax`][semsoft_plugin.core.softmax.SemanticSoftmax] on a compact
    vocabulary (`_compact`): the same kept tokens, embeddings and mean row, so
    the same result as on the full logits rows, at a fraction of the cost.
    `labels`: a LabelSet or LabelTokens.
    """
    from tqdm.auto import tqdm

    store_k = int(kept.top_ids.shape[1])
    too_big = [c.k for c in configs if c.k > store_k]
    if too_big:
        raise ValueError(f"k={too_big[0]} exceeds the {store_k} logits kept per item")
    tokens = as_label_tokens(labels)
    logits, subset, remapped = _compact(kept, embeddings, tokens, max(c.k for c in configs))
    n = logits.shape[0]
    out = np.empty((len(configs), n, len(tokens)))
    fallback = np.zeros(len(configs))
    for c, config in enumerate(tqdm(configs, desc="grid", unit="config", disable=not progress)):
        scorer = SemanticSoftmax(subset, remapped, config)
        for start in range(0, n, chunk):
            result = scorer(logits[start : start + chunk])
            out[c, start : start + chunk] = result.probs.double().numpy()
            fallback[c] += float(result.fallback.sum())
    out /= out.sum(-1, keepdims=True)
    return out, fallback / max(n, 1)


def kept_result(
    kept: Kept, embeddings: Any, labels: Any, config: SemsoftConfig, *, chunk: int = 256
) -> SemanticSoftmaxResult:
    """Semantic Softmax of every kept row under one `config`: the result the core's
    [`SemanticSoftmax`][semsoft_plugin.core.softmax.SemanticSoftmax] gives on the full rows (the compact vocabulary of
    `grid_probs`; equal within float rounding, about 3e-8 on SmolLM2).

    Parameters
    ----------
    kept : Kept
        `N` kept forward passes with at least `config.k` top scores each.
    embeddings : Any
        The model's output embeddings (a matrix or `OutputEmbeddings`).
    labels : Any
        A LabelSet or LabelTokens.
    config : SemsoftConfig
        The settings.
    chunk : int
        Rows scored at a time.

    Returns
    -------
    SemanticSoftmaxResult
        Per row: `probs`, `constrained_probs`, `fallback`, `coverage`, `top_k_mass`.
    """
    store_k = int(kept.top_ids.shape[1])
    if config.k > store_k:
        raise ValueError(f"k={config.k} exceeds the {store_k} logits kept per item")
    tokens = as_label_tokens(labels)
    logits, subset, remapped = _compact(kept, embeddings, tokens, config.k)
    scorer = SemanticSoftmax(subset, remapped, config)
    n = logits.shape[0]
    if n == 0:
        empty = torch.zeros((0, len(tokens)))
        return SemanticSoftmaxResult(
            empty, empty.clone(), torch.zeros(0, dtype=torch.bool), torch.zeros(0), torch.zeros(0)
        )
    parts = [scorer(logits[start : start + chunk]) for start in range(0, n, chunk)]
    return SemanticSoftmaxResult(
        *(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(SemanticSoftmaxResult))
    )
