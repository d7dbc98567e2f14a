"""Evaluation, tuning and baselines for semsoft (`semsoft eval`, `semsoft tune`).

Kept beside the plugin, not inside it: it needs scikit-learn, torchmetrics, scipy and
matplotlib (the `eval` extra), which the plugin itself never imports.
"""
