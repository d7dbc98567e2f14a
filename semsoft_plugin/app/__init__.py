"""The application on top of the adapters.

* :mod:`.classifier`: :class:`~.classifier.Classifier`, a scikit-learn estimator, on the
  transformers or vLLM backend;
* :mod:`.classifier_settings`: its parameters checked, and the fit they ask for;
* :mod:`.scorer`: what the parameters resolve to, and the scoring through kept passes;
* :mod:`.pass_cache`: the process-wide cache of kept forward passes (each text once);
* :mod:`.classifier_fit`: the labelled fit;
* :mod:`.fitted_state`: what a fit leaves, one object the classifier asks;
* :mod:`.predictions`: :class:`~.predictions.Predictions`, the arrays it returns for a batch;
* :mod:`.texts`: the checks on the texts it takes, and the cut of a text that is too long;
* :mod:`.cli`: the ``semsoft`` command;
* :mod:`.classify_args`: the labels, prompt and classifier ``semsoft classify``'s
  arguments name;
* :mod:`.classify_file`: ``semsoft classify --input``, a whole table scored and resumable;
* :mod:`.file_plan`: that job's plan, every check made before the model loads;
* :mod:`.file_settings`: the settings record beside its output, checked on ``--resume``;
* :mod:`.output_lock`: one writer per output file;
* :mod:`.tables`: CSV/TSV/JSONL/Parquet input, strictly read;
* :mod:`.table_writers`: the output tables, written a batch at a time and resumed;
* :mod:`.columns`: the result columns every table output shares;
* :mod:`.ray`: a ``ray.data.Dataset`` classified on a Ray cluster (``semsoft classify --ray``);
* :mod:`.ray_llm`: the pre- and postprocess steps around Ray Data's own vLLM processor.
"""
