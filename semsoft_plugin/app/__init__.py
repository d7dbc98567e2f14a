"""The application on top of the adapters.

* :mod:`.classifier`: :class:`~.classifier.Classifier`, scikit-learn style, on the
  transformers or vLLM backend;
* :mod:`.predictions`: :class:`~.predictions.Predictions`, the arrays it returns for a batch;
* :mod:`.texts`: the checks on the texts it takes, and the cut of a text that is too long;
* :mod:`.cli`: the ``semsoft`` command;
* :mod:`.tables`: CSV/TSV/JSONL/Parquet input and output, strictly read;
* :mod:`.columns`: the result columns every table output shares;
* :mod:`.ray`: a ``ray.data.Dataset`` classified on a Ray cluster (``semsoft classify --ray``).
"""
