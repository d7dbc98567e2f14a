"""semsoft: calibrated label probabilities for LLM zero-shot classifiers (Semantic Softmax).

The package root needs torch only. ``Classifier`` (``predict_proba`` and friends) loads
transformers or vLLM when it is used. Engine adapters load their engine on import:

* ``semsoft_plugin.engines.hf``: transformers ``LogitsProcessor`` and ``classify``;
* ``semsoft_plugin.engines.vllm``: vLLM logits processor and per-request options;
* ``semsoft_plugin.engines.openai``: any OpenAI-compatible server (no vLLM needed);
* ``semsoft_plugin.engines.outlines``: drop-in ``Generator`` for Outlines choices.
"""

from semsoft_plugin.app.classifier import Classifier
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.result import LabelResult
from semsoft_plugin.core.softmax import (
    SemanticSoftmax,
    SemanticSoftmaxResult,
    constrained_softmax,
    semantic_softmax,
    semantic_softmax_details,
)
from semsoft_plugin.core.tokens import LabelTokens, OutputEmbeddings

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
