"""The application on top of the adapters.

* :mod:`.classifier`: :class:`~.classifier.Classifier`, scikit-learn style, on the
  transformers or vLLM backend;
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
