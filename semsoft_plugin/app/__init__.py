"""The application on top of the adapters.

* [`classifier`][semsoft_plugin.app.classifier]: [`Classifier`][semsoft_plugin.app.classifier.Classifier], a scikit-learn estimator
  (with `classifier_settings`, `classifier_fit`, `fitted_state`, `scorer`, `pass_cache`);
* [`predictions`][semsoft_plugin.app.predictions]: [`Predictions`][semsoft_plugin.app.predictions.Predictions], the arrays it returns for a batch;
* `texts`: the checks on the texts it takes, and the cut of a text that is too long;
* `cli`, `classify_args`: the `semsoft` command and what `semsoft classify` names;
* `classify_file`, `file_plan`, `file_settings`, `output_lock`: `semsoft classify
  --input`, a whole table scored, checked before the model loads and resumable;
* `tables`, `table_writers`, `columns`: the input and output tables and their columns;
* [`ray`][semsoft_plugin.app.ray], `ray_llm`: a `ray.data.Dataset` classified on a Ray
  cluster, and the steps around Ray Data's own vLLM processor.
"""
