"""semsoft: calibrated label probabilities for LLM zero-shot classifiers (Semantic Softmax).

The package root needs torch only. `Classifier` (`predict_proba` and friends) is
exported lazily: `from semsoft_plugin import Classifier` imports scikit-learn (the
estimator's base classes), and the classifier loads transformers or vLLM when it is used. Engine adapters load their engine on import:

* `semsoft_plugin.engines.hf`: transformers `LogitsProcessor` and `classify`;
* `semsoft_plugin.engines.vllm`: vLLM logits processor and per-request options;
* `semsoft_plugin.engines.openai`: any OpenAI-compatible server (no vLLM needed);
* `semsoft_plugin.engines.outlines`: drop-in `Generator` for Outlines choices.
"""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from semsoft_plugin.app.classifier import Classifier

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


def __getattr__(name: str) -> Any:
    """`Classifier` on first use: its module imports scikit-learn, which `import
    semsoft_plugin` does not."""
    if name == "Classifier":
        from semsoft_plugin.app.classifier import Classifier

        return Classifier
    raise AttributeError(f"module 'semsoft_plugin' has no attribute {name!r}")
