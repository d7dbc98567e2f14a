"""The per-text result: one classified input, whatever engine produced it.

The result types are one hierarchy (docs/glossary.md, "The result types"), each level
holding the fields of the level above under the same names:

* `SemanticSoftmaxResult` (`semsoft_plugin.core.softmax`): the core's tensors for a
  batch of decision-step rows;
* [`LabelResult`][semsoft_plugin.core.result.LabelResult]: **one text**, label ->
  probability dicts in the order the labels were given, from every engine; the fields an
  engine cannot know, or was not asked for, are None;
* [`ScoredLabel`][semsoft_plugin.core.result.ScoredLabel]: the same label and scores on the
  `str` Outlines returns;
* `Predictions` (`semsoft_plugin.app.predictions`): N texts as numpy arrays, columns in
  `classes_` (sorted) order, from `Classifier.predict_details`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor

from semsoft_plugin.core.softmax import SemanticSoftmaxResult

__all__ = ["LabelResult", "ScoredLabel"]


@dataclass(frozen=True)
class LabelResult:
    """Semantic Softmax's answer for one input.

    Attributes
    ----------
    label : str | None
        The label the text spells (constrain mode) or the calibrated argmax;
        None only when a reader can know neither
    probs : dict[str, float] | None
        Label -> calibrated probability (Semantic Softmax); None only in the 0/0
        case when the constrained softmax it falls back to cannot be read (label
        tokens outside a returned top-k)
    constrained_probs : dict[str, float] | None
        Label -> softmax over the label tokens only (the baseline);
        None when a reader saw some label token outside the returned top-k
    fallback : bool
        No kept token voted for any label (`probs` is the constrained softmax)
    coverage : float
        Share of the top-k mass that voted for some label
    text : str | None
        The generated text (transformers); None where the reader does not produce it
    top_k_mass : float | None
        Total probability of the k kept tokens (readers of top-k outputs)
    decision_step : int | None
        Index of the generated token that was the decision step (readers)
    logits : Tensor | None
        Raw decision-step scores, float32 `[V]` (`hf.classify(keep_logits=True)`)
    top_logprobs : dict[int, float] | None
        Token id -> raw decision-step log-probability of the highest
        `keep_logprobs` tokens (`classify_vllm(keep_logprobs=...)`)
    token_logprobs : dict[int, float] | None
        Token id -> raw decision-step log-probability of each requested
        token, inside the top-k or not (`classify_vllm(token_ids=...)`)
    hidden : Tensor | None
        `[d]` float32 hidden state entering the output layer at the decision step,
        read back from the logits row (`classify_vllm(hidden=True)`)
    """

    label: str | None
    probs: dict[str, float] | None
    constrained_probs: dict[str, float] | None
    fallback: bool
    coverage: float
    text: str | None = None
    top_k_mass: float | None = None
    decision_step: int | None = None
    logits: Tensor | None = None
    top_logprobs: dict[int, float] | None = None
    token_logprobs: dict[int, float] | None = None
    hidden: Tensor | None = None


class ScoredLabel(str):
    """The generated label, as the exact `str` Outlines returns, with its scores.

    Attributes
    ----------
    probs : dict
        label -> calibrated probability (Semantic Softmax).
    constrained_probs : dict
        label -> softmax over the labels' first tokens only (the baseline).
    fallback : bool
        True when no kept token voted for any label and `probs` is the
        constrained softmax.
    coverage : float
        Share of the top-K mass that voted for some label.
    """

    probs: dict[str, float]
    constrained_probs: dict[str, float] | None
    fallback: bool
    coverage: float

    def __new__(
        cls,
        text: str,
        probs: Mapping[str, float],
        constrained_probs: Mapping[str, float] | None,
        fallback: bool,
        coverage: float,
    ) -> ScoredLabel:
        self = super().__new__(cls, text)
        self.probs = dict(probs)
        # None only from vLLM when a label's first token is outside the returned top-k.
        self.constrained_probs = None if constrained_probs is None else dict(constrained_probs)
        self.fallback = bool(fallback)
        self.coverage = float(coverage)
        return self

    @classmethod
    def from_result(
        cls, text: str, names: Sequence[str], result: SemanticSoftmaxResult
    ) -> ScoredLabel:
        """From an unbatched core result."""
        return cls(
            text,
            dict(zip(names, result.probs.tolist(), strict=True)),
            dict(zip(names, result.constrained_probs.tolist(), strict=True)),
            bool(result.fallback),
            float(result.coverage),
        )

    @property
    def label(self) -> str:
        """The label as a plain `str`."""
        return str(self)
