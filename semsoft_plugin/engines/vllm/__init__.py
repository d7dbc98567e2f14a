"""vLLM adapter: Semantic Softmax inside the engine, offline and behind the OpenAI server.

vLLM is imported in this package only. [`processor`][semsoft_plugin.engines.vllm.processor]
holds the engine's logits processor (one class for both of vLLM 0.32's model runners: the
label constraint at the decision step); [`params`][semsoft_plugin.engines.vllm.params]
builds and checks an opted-in request; [`reader`][semsoft_plugin.engines.vllm.reader] reads
an offline output's scores and hidden state; [`batch`][semsoft_plugin.engines.vllm.batch]
classifies prompts on a `vllm.LLM`; [`middleware`][semsoft_plugin.engines.vllm.middleware]
is the OpenAI server's (`--middleware semsoft_plugin.engines.vllm.admission`). Requests opt
in through `SamplingParams.extra_args`; every other request is left untouched. The request
options live in `semsoft_plugin.core.request`, the engine-neutral scorer in
`semsoft_plugin.engines.scoring`, the OpenAI client helpers in
[`semsoft_plugin.engines.openai`][semsoft_plugin.engines.openai]. The usage guide, and why
the scores travel as raw log-probs: docs/vllm.md ("Inside the engine").
"""

from semsoft_plugin.engines.vllm.batch import classify_vllm
from semsoft_plugin.engines.vllm.middleware import admission
from semsoft_plugin.engines.vllm.params import sampling_params, validate_params
from semsoft_plugin.engines.vllm.processor import SemanticSoftmaxLogitsProcessor
from semsoft_plugin.engines.vllm.reader import label_probs, label_scores, output_hidden

__all__ = [
    "SemanticSoftmaxLogitsProcessor",
    "admission",
    "classify_vllm",
    "label_probs",
    "label_scores",
    "output_hidden",
    "sampling_params",
    "validate_params",
]
