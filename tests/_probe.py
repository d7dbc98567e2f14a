"""A probe fitted with label rows that read nothing, for tests about what happens to a
fitted probe (files, rows, engines) rather than about its label rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from semsoft_plugin.fit.probe import LinearProbe, fit_probe


def zero_label_rows(hidden: Any, n_labels: int) -> np.ndarray:
    """`[n_labels, H]` zeros: the anchored probe then reads the hidden state alone."""
    return np.zeros((n_labels, np.shape(hidden)[1]))


def fit_plain(hidden: Any, targets: Any, n_labels: int, **options: Any) -> LinearProbe:
    """`fit_probe` on the hidden state alone (`zero_label_rows`)."""
    return fit_probe(hidden, targets, n_labels, label_rows=zero_label_rows(hidden, n_labels), **options)
