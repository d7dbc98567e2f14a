"""One thin adapter per engine, each translating between its engine and the core math.

* :mod:`.hf`: transformers (``LogitsProcessor``, ``classify``), with
  :mod:`.hf_beam_search` (why and how beam search is refused);
* :mod:`.vllm`: vLLM's logits processor, request options, offline reader, server middleware;
* :mod:`.openai`: any OpenAI-compatible server, read on the client (no vLLM needed);
* :mod:`.outlines`: a drop-in wrapper for Outlines choice generators (a package: one
  generator class per engine).

What the adapters share, engine-free: :mod:`.scoring` (scores from a decision step's
top-k log-probabilities, exact or refused), :mod:`.reader_contract` (the readers' one
entry point, ``read_scores``), :mod:`.prompting` (chat templates, literal text) and
:mod:`.models` (the weights that install from the package registry). An adapter imports
its engine when it is imported; nothing here imports from the application
(:mod:`semsoft_plugin.app`).
"""
