"""The math, with torch only: no engine, tokenizer download or file format here.

* [`softmax`][semsoft_plugin.core.softmax]: Semantic Softmax and the constrained softmax;
* [`config`][semsoft_plugin.core.config]: [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig], the method's settings;
* [`tokens`][semsoft_plugin.core.tokens] and [`labels`][semsoft_plugin.core.labels]: label
  answer tokens and embeddings, [`LabelSet`][semsoft_plugin.core.labels.LabelSet] for any tokenizer;
* `request`: the per-request options every engine adapter parses the same way;
* `text_rules`: what an empty text is, what a label may hold, when two labels are one;
* `embeddings`: output embeddings from a model or a safetensors checkpoint;
* [`calibration`][semsoft_plugin.core.calibration]: label-free bias corrections;
* `kept_scores`, `temperature_scaling`, `fitting`: kept passes and the few-label fit;
* [`result`][semsoft_plugin.core.result]: [`LabelResult`][semsoft_plugin.core.result.LabelResult], the one result type of every path.

Every engine adapter (`semsoft_plugin.engines`) calls this code; nothing here
imports from the adapters or the application.
"""
