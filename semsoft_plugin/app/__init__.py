"""The application on top of the adapters.

* [`classifier`][semsoft_plugin.app.classifier]: [`Classifier`][semsoft_plugin.app.classifier.Classifier], a scikit-learn estimator, on the
  transformers or vLLM backend;
* `classifier_settings`: its parameters checked, and the fit they ask for;
* `scorer`: what the parameters resolve to, and the scoring through kept passes;
* `pass_cache`: the process-wide cache of kept forward passes (each text once);
* `classifier_fit`: the labelled fit;
* `fitted_state`: what a fit leaves, one object the classifier asks;
* [`predictions`][semsoft_plugin.app.predictions]: [`Predictions`][semsoft_plugin.app.predictions.Predictions], the arrays it returns for a batch;
* `texts`: the checks on the texts it takes, and the cut of a text that is too long;
* `cli`: the `semsoft` command;
* `classify_args`: the labels, prompt and classifier `semsoft classify`'s
  arguments name;
* `classify_file`: `semsoft classify --input`, a whole table scored and resumable;
* `file_plan`: that job's plan, every check made before the model loads;
* `file_settings`: the settings record beside its output, checked on `--resume`;
* `output_lock`: one writer per output file;
* `tables`: CSV/TSV/JSONL/Parquet input, strictly read;
* `table_writers`: the output tables, written a batch at a time and resumed;
* `columns`: the result columns every table output shares;
* [`ray`][semsoft_plugin.app.ray]: a `ray.data.Dataset` classified on a Ray cluster (`semsoft classify --ray`);
* `ray_llm`: the pre- and postprocess steps around Ray Data's own vLLM processor.
"""
