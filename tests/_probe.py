"""A probe fitted with an anchor that carries nothing, for tests about what happens to a
fitted probe (files, rows, engines) rather than about its anchor."""

from __future__ import annotations

from typing import Any

import numpy as np

from semsoft_plugin.app.probe import LinearProbe, fit_probe


def zero_anchor(hidden: Any, n_labels: int) -> np.ndarray:
    """`[n_labels, H]` zeros: the anchored probe then reads the hidden state alone."""
    return np.zeros((n_labels, np.shape(hidden)[1]))


def fit_plain(hidden: Any, targets: Any, n_labels: int, **options: Any) -> LinearProbe:
    """`fit_probe` on the hidden state alone (`zero_anchor`)."""
    return fit_probe(hidden, targets, n_labels, anchor=zero_anchor(hidden, n_labels), **options)
