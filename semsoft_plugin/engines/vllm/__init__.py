"""vLLM adapter: Semantic Softmax inside the engine, offline and behind the OpenAI server.

The floors (vLLM is imported in this package only):

* [`processor`][semsoft_plugin.engines.vllm.processor]: [`SemanticSoftmaxLogitsProcessor`][semsoft_plugin.engines.vllm.SemanticSoftmaxLogitsProcessor], the engine's logits
  processor (label constraint at the decision step; the mechanism is documented there);
* [`params`][semsoft_plugin.engines.vllm.params]: [`sampling_params`][semsoft_plugin.engines.vllm.sampling_params] builds an opted-in request,
  [`validate_params`][semsoft_plugin.engines.vllm.validate_params] checks one at admission;
* [`reader`][semsoft_plugin.engines.vllm.reader]: [`label_scores`][semsoft_plugin.engines.vllm.label_scores] / [`label_probs`][semsoft_plugin.engines.vllm.label_probs] read an offline output;
  [`output_hidden`][semsoft_plugin.engines.vllm.output_hidden] its decision step's hidden state (`semsoft_hidden`), read back from the logits row in the engine;
* [`batch`][semsoft_plugin.engines.vllm.batch]: [`classify_vllm`][semsoft_plugin.engines.vllm.classify_vllm], a batch of prompts on a `vllm.LLM`;
* [`middleware`][semsoft_plugin.engines.vllm.middleware]: [`admission`][semsoft_plugin.engines.vllm.admission], the OpenAI server middleware
  (`--middleware semsoft_plugin.engines.vllm.admission`: vLLM imports this package and
  takes its `admission` attribute).

The per-request options and their limits are in `semsoft_plugin.core.request`, the
engine-neutral top-k scorer and `semsoft_plugin.engines.scoring.output_embeddings`
in `semsoft_plugin.engines.scoring`, and the OpenAI client helpers (no vLLM needed)
in [`semsoft_plugin.engines.openai`][semsoft_plugin.engines.openai].

One class, [`SemanticSoftmaxLogitsProcessor`][semsoft_plugin.engines.vllm.SemanticSoftmaxLogitsProcessor], satisfies both of vLLM 0.32's
logits-processor interfaces (the V1 model runner's, used on CPU, and Model Runner
V2's, picked on most GPUs) and is loaded by class, by the string
`"semsoft_plugin.engines.vllm:SemanticSoftmaxLogitsProcessor"`, by the server's
`--logits-processors` flag or through the `vllm.logits_processors` entry point.
Requests opt in through `SamplingParams.extra_args` (`vllm_xargs` over HTTP);
every other request is left untouched, bit for bit.

How the scores come back (the mechanism, and why)
-------------------------------------------------
No vLLM API returns side data from a logits processor. This adapter returns the
scores through the ordinary output: an opted-in request asks for the top-`k`
*raw* log-probabilities (`logprobs=k`; `top_logprobs=k` over HTTP), which vLLM
takes before any processor, penalty or temperature, and
[`label_scores`][semsoft_plugin.engines.vllm.label_scores] / [`openai_label_scores`][semsoft_plugin.engines.openai.openai_label_scores] compute Semantic Softmax from them
with the same core code and the model's output embeddings. The semantic
distribution reads only the top-`k` probabilities and the embeddings (a ratio, so the
top-`k` raw log-probabilities determine it exactly); the constrained softmax (the
default, and part of every pool) also reads each label's answer token. Chosen over the
alternatives because

* it needs no engine-wide setting: `logprobs_mode="processed_logprobs"` (the
  other working route) would change the log-probabilities of *every* request on the
  engine, including those that never opted in, and would return values already
  bent by temperature, top-p/top-k and min-p;
* raw log-probabilities do not depend on the request's sampling settings, so the
  scores are the model's, whatever the temperature;
* it also yields the coverage and the top-`k` mass, which a value written into
  the label logits cannot carry;
* the very same reader works against any OpenAI-compatible server that returns top
  log-probabilities for an open-weights model, with no plugin on it (then without
  the label constraint, and with `k` capped by the server's top-logprobs limit).

Its price: the engine needs `max_logprobs >= k` (vLLM's default is 20, the
method's `k` is 50: `LLM(..., max_logprobs=50)` / `--max-logprobs 50`), and
the reader needs the output embeddings (read once per model from the checkpoint).
A label answer token outside the returned top-`k` is fetched exactly (one
`max_tokens=1` request with `logprob_token_ids`: [`classify_vllm`][semsoft_plugin.engines.vllm.classify_vllm] per affected
prompt, [`label_scores`][semsoft_plugin.engines.vllm.label_scores] given the `LLM`, the server's middleware) or the reader
refuses with `MissingLabelLogprobs`; no bound stands in for it (the reader contract,
`docs/reader-contract.md`).

The processor's own job is the label constraint (vLLM's guided choice masks the
logits before any processor and before the raw log-probabilities, erasing the silent
vote, so it is refused for opted-in requests). At the decision step it computes
Semantic Softmax from the same logits and leaves only the label answer tokens, at
`log P_sem`: greedy decoding emits the calibrated argmax, sampling draws from
`P_sem` (then shaped by temperature/top-p as usual). The rest of a multi-token
label is forced, then EOS.

The decision step
-----------------
The first generated token, or with `trigger` the step right after the generated
text ends with the trigger (matched within generated text only). The V1 runner
also shows the processor the rows of partial prefills under chunked prefill, whose
samples are discarded; the processor keeps no record from those rows and derives
everything from the request's output tokens on each step, so the last write at the
decision step (the real one) is the one sampled. Model Runner V2 reports each row's
position, and rows before the end of the prompt are skipped outright.

Async scheduling (placeholder output tokens)
--------------------------------------------
With async scheduling (vLLM's default on GPUs) the V1 runner schedules step `n + 1`
before step `n`'s sampled token has reached the host: its bookkeeping appends a
`-1` placeholder to the request's output-token list (the very list a processor was
handed in `BatchUpdate.added`) and repairs it in place, right before the sampler,
only when `InputBatch.logitsprocs_need_output_token_ids` is set, i.e. when
`model_config.logits_processors` is non-empty (`LLM(logits_processors=[...])`,
`--logits-processors`), or when some request in the batch uses penalties or bad
words. A processor loaded *only* through the entry point sees `-1` for every
generated token (vLLM issue 52461). Model Runner V2 has no placeholders: its
`post_update` writes each sampled token into `req_states.all_token_ids` on the
device before the next step. The CPU platform turns async scheduling off
(`CpuPlatform.check_and_update_config`), whatever the engine argument says.

So the processor never acts on a placeholder: the trigger search stops at the first
`-1` (and resumes there once the token is known), and a row whose decision-step
token is still `-1` is not forced. For greedy requests (the default) it does not
need the list: greedy decoding takes the argmax of the logits this processor wrote,
so the processor records that pick itself at the decision step and forces the rest
of that label and EOS from it. A sampled (temperature > 0) multi-token label or a
trigger on an engine whose output tokens are never repaired cannot be followed;
the processor warns once, naming the fix (`--logits-processors ...` or
`--no-async-scheduling`).
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
