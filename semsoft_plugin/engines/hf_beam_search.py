"""Beam search detection for the transformers adapter: why it is refused, and how it is seen.

Beam search reorders (and duplicates) rows between steps, so the per-row record of
[`SemanticSoftmaxLogitsProcessor`][semsoft_plugin.engines.hf.SemanticSoftmaxLogitsProcessor] would end up under
another input's row. transformers tells a processor nothing about beams, so the signs it
leaves in what a processor is handed are read here, apart from the processor's scoring:
`refuse_beam_search` at the start of each generation, `num_beams` before a `generate`
call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["BEAM_MESSAGE", "num_beams", "refuse_beam_search"]

BEAM_MESSAGE = (
    "num_beams > 1 (beam search) is not supported: it reorders rows between steps, so "
    "a row's label probabilities would be recorded under another input; use greedy "
    "decoding or sampling (num_return_sequences works)"
)


# How far from 0 a row's logsumexp may be and still count as log-probabilities (float32
# rounding over a vocabulary of a few hundred thousand tokens stays far below it).
_NORMALISED = 1e-3


def refuse_beam_search(previous: Tensor | None, input_ids: Tensor, scores: Tensor) -> None:
    """Raise `ValueError` if this call is part of a beam search.

    Beam search reorders (and duplicates) rows between steps, so a per-row record
    would end up under another input's row: the scores of one input returned for
    another, silently. transformers passes a processor no beam information, so two
    signs are checked at the start of each generation, both read from the processor's
    own arguments: log-probabilities where greedy decoding and sampling hand over the
    logits (transformers' `_beam_search` applies `log_softmax` before the processors;
    its first step already has `batch * num_beams` rows), and rows that continue the
    previous step's rows in another order (any other loop that reorders).
    """
    if scores.shape[0] > 1:
        mass = torch.logsumexp(scores.float(), dim=-1)
        if bool((mass.abs() < _NORMALISED).all()):
            raise ValueError(BEAM_MESSAGE)
    if (
        previous is not None
        and previous.shape[0] == input_ids.shape[0] > 1
        and input_ids.shape[1] == previous.shape[1] + 1
    ):
        prefix = input_ids[:, :-1]
        same = (prefix.unsqueeze(1) == previous.unsqueeze(0)).all(-1)  # [B, B]
        if bool(same.any(-1).all()):  # every row continues some previous row, reordered
            raise ValueError(BEAM_MESSAGE)


def num_beams(model: Any, kwargs: Mapping[str, Any]) -> int:
    """The `num_beams` a `generate(**kwargs)` call would use."""
    if "num_beams" in kwargs and kwargs["num_beams"] is not None:
        return int(kwargs["num_beams"])
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    return int(getattr(config, "num_beams", 1) or 1)
