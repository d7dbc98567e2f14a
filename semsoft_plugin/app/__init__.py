"""The application on top of the adapters.

* :mod:`.classifier`: :class:`~.classifier.Classifier`, scikit-learn style, on the
  transformers or vLLM backend;
* :mod:`.cli`: the ``semsoft`` command;
* :mod:`.tables`: CSV/TSV/JSONL/Parquet input and output, strictly read;
* :mod:`.columns`: the result columns every table output shares;
* :mod:`.ray`: a ``ray.data.Dataset`` classified on a Ray cluster (``semsoft classify --ray``);
* :mod:`.ray_llm`: the pre- and postprocess steps around Ray Data's own vLLM processor.
"""
