"""One thin adapter per engine, each translating between its engine and the core math.

* [`hf`][semsoft_plugin.engines.hf]: transformers (`LogitsProcessor`, `classify`), with
  `hf_beam_search` (why and how beam search is refused);
* [`vllm`][semsoft_plugin.engines.vllm]: vLLM's logits processor, request options, offline reader, server middleware;
* [`openai`][semsoft_plugin.engines.openai]: any OpenAI-compatible server, read on the client (no vLLM needed);
* [`outlines`][semsoft_plugin.engines.outlines]: a drop-in wrapper for Outlines choice generators (a package: one
  generator class per engine).

What the adapters share, engine-free: `scoring` (scores from a decision step's
top-k log-probabilities, exact or refused), `reader_contract` (the readers' one
entry point, `read_scores`), `prompting` (chat templates, literal text) and
`models` (the weights that install from the package registry). An adapter imports
its engine when it is imported; nothing here imports from the application
(`semsoft_plugin.app`).
"""
