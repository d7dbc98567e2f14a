"""The math, with torch only: no engine, tokenizer download or file format here.

* :mod:`.softmax`: Semantic Softmax and the constrained softmax (the scores);
* :mod:`.config`: :class:`~.config.SemsoftConfig`, the method's settings;
* :mod:`.tokens`: label answer tokens and output embeddings, checked;
* :mod:`.labels`: :class:`~.labels.LabelSet`, label names turned into answer tokens
  by any tokenizer;
* :mod:`.request`: the per-request options every engine adapter parses the same way;
* :mod:`.text_rules`: what an empty text is, what a label may hold, when two labels are
  one (Unicode);
* :mod:`.embeddings`: output embeddings from a model or a safetensors checkpoint;
* :mod:`.calibration`: content-free and batch calibration of label probabilities;
* :mod:`.kept_scores`: kept forward passes, and a grid of settings scored on them;
* :mod:`.temperature_scaling`: the NLL and the temperature that minimises it;
* :mod:`.fitting`: fitting the settings on a few labelled items;
* :mod:`.result`: :class:`~.result.LabelResult`, the one result type of every path.

Every engine adapter (:mod:`semsoft_plugin.engines`) calls this code; nothing here
imports from the adapters or the application.
"""
