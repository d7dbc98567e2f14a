"""The math, with torch only: no engine, tokenizer download or file format here.

* [`softmax`][semsoft_plugin.core.softmax]: Semantic Softmax and the constrained softmax (the scores);
* [`config`][semsoft_plugin.core.config]: [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig], the method's settings;
* [`tokens`][semsoft_plugin.core.tokens]: label answer tokens and output embeddings, checked;
* [`labels`][semsoft_plugin.core.labels]: [`LabelSet`][semsoft_plugin.core.labels.LabelSet], label names turned into answer tokens
  by any tokenizer;
* `request`: the per-request options every engine adapter parses the same way;
* `text_rules`: what an empty text is, what a label may hold, when two labels are
  one (Unicode);
* `embeddings`: output embeddings from a model or a safetensors checkpoint;
* [`calibration`][semsoft_plugin.core.calibration]: content-free and batch calibration of label probabilities;
* `kept_scores`: kept forward passes, and a grid of settings scored on them;
* `temperature_scaling`: the NLL and the temperature that minimises it;
* `fitting`: fitting the settings on a few labelled items;
* [`result`][semsoft_plugin.core.result]: [`LabelResult`][semsoft_plugin.core.result.LabelResult], the one result type of every path.

Every engine adapter (`semsoft_plugin.engines`) calls this code; nothing here
imports from the adapters or the application.
"""
