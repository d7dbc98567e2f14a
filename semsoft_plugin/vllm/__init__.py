"""vLLM adapter: Semantic Softmax inside the engine, offline and behind the OpenAI server.

The floors (vLLM is imported in this package only):

* :mod:`.processor`: :class:`SemanticSoftmaxLogitsProcessor`, the engine's logits
  processor (label constraint at the decision step; the mechanism is documented there);
* :mod:`.params`: :func:`sampling_params` builds an opted-in request,
  :func:`validate_params` checks one at admission;
* :mod:`.reader`: :func:`label_scores` / :func:`label_probs` read an offline output;
* :mod:`.batch`: :func:`classify_vllm`, a batch of prompts on a ``vllm.LLM``;
* :mod:`.middleware`: :func:`admission`, the OpenAI server middleware
  (``--middleware semsoft_plugin.vllm.admission``: vLLM imports this package and
  takes its ``admission`` attribute).

The per-request options and their limits are in :mod:`semsoft_plugin.request`, the
engine-neutral top-k scorer in :mod:`semsoft_plugin.scoring` and the OpenAI client
helpers (no vLLM needed) in :mod:`semsoft_plugin.openai`; they are re-exported here
so ``from semsoft_plugin import vllm as semsoft`` keeps offering every name.
"""

from semsoft_plugin.config import SemsoftConfig  # as the single module offered it
from semsoft_plugin.openai import (
    OpenAIRequest,
    openai_label_probs,
    openai_label_scores,
    openai_request,
)
from semsoft_plugin.request import (
    ENTRY_POINT,
    SERVER_MAX_K,
    SERVER_MAX_LABEL_BYTES,
    SERVER_MAX_LABELS,
    SERVER_MAX_TRIGGER_BYTES,
    SemsoftRequest,
    parse_request,
)
from semsoft_plugin.result import LabelResult
from semsoft_plugin.scoring import LabelScores, output_embeddings
from semsoft_plugin.vllm.batch import classify_vllm
from semsoft_plugin.vllm.middleware import admission
from semsoft_plugin.vllm.params import sampling_params, validate_params
from semsoft_plugin.vllm.processor import SemanticSoftmaxLogitsProcessor
from semsoft_plugin.vllm.reader import label_probs, label_scores

__all__ = [
    "ENTRY_POINT",
    "LabelResult",
    "LabelScores",
    "SERVER_MAX_K",
    "SERVER_MAX_LABELS",
    "SERVER_MAX_LABEL_BYTES",
    "SERVER_MAX_TRIGGER_BYTES",
    "OpenAIRequest",
    "SemanticSoftmaxLogitsProcessor",
    "SemsoftConfig",
    "SemsoftRequest",
    "admission",
    "classify_vllm",
    "label_probs",
    "label_scores",
    "openai_label_probs",
    "openai_label_scores",
    "openai_request",
    "output_embeddings",
    "parse_request",
    "sampling_params",
    "validate_params",
]
