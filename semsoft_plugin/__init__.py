"""semsoft: calibrated label probabilities for LLM zero-shot classifiers (Semantic Softmax).

The package root needs torch only. ``Classifier`` (``predict_proba`` and friends) loads
transformers or vLLM when it is used. Engine adapters load their engine on import:

* ``semsoft_plugin.hf``: transformers ``LogitsProcessor`` and ``classify``;
* ``semsoft_plugin.vllm``: vLLM logits processor and per-request options;
* ``semsoft_plugin.openai``: any OpenAI-compatible server (no vLLM needed);
* ``semsoft_plugin.outlines``: drop-in ``Generator`` for Outlines choices.
"""

from semsoft_plugin.classifier import Classifier
from semsoft_plugin.config import SemsoftConfig
from semsoft_plugin.core import (
    LabelTokens,
    OutputEmbeddings,
    SemanticSoftmax,
    SemanticSoftmaxResult,
    constrained_softmax,
    semantic_softmax,
    semantic_softmax_details,
)
from semsoft_plugin.labels import LabelSet
from semsoft_plugin.result import LabelResult

__version__ = "0.1.0"

__all__ = [
    "Classifier",
    "LabelResult",
    "LabelSet",
    "LabelTokens",
    "OutputEmbeddings",
    "SemanticSoftmax",
    "SemanticSoftmaxResult",
    "SemsoftConfig",
    "constrained_softmax",
    "semantic_softmax",
    "semantic_softmax_details",
]
