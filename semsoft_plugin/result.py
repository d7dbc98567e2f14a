"""One result type for one classified input, whatever engine produced it.

``hf.classify``, the vLLM reader (``label_scores``) and the OpenAI reader
(``openai_label_scores``) all return a :class:`LabelResult`; the fields an engine
cannot know are None (a reader of a server response has no generated ``text`` of its
own to report; transformers has no top-k mass to report). ``hf.Classification`` and
``vllm.LabelScores`` remain as aliases of this class for one release so that code
naming them keeps working. (``Classifier.predict_details`` returns arrays over a batch,
``outlines`` returns a ``str`` subclass, as Outlines' interface asks; both are built
from these fields.)
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

__all__ = ["LabelResult"]


@dataclass(frozen=True)
class LabelResult:
    """Semantic Softmax's answer for one input.

    Attributes
    ----------
    label : the label the text spells (constrain mode) or the calibrated argmax;
        None only when a reader can know neither
    probs : label -> calibrated probability (Semantic Softmax); None only in the 0/0
        case when the constrained softmax it falls back to cannot be read (label
        tokens outside a returned top-k)
    constrained_probs : label -> softmax over the label tokens only (the baseline);
        None when a reader saw some label token outside the returned top-k
    fallback : no kept token voted for any label (``probs`` is the constrained softmax)
    coverage : share of the top-k mass that voted for some label
    text : the generated text (transformers); None where the reader does not produce it
    top_k_mass : total probability of the k kept tokens (readers of top-k outputs)
    decision_step : index of the generated token that was the decision step (readers)
    logits : raw decision-step scores, float32 ``[V]`` (``hf.classify(keep_logits=True)``)
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
