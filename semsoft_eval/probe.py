"""A probe on the decision step's hidden state ("hidden calibration", Cho et al., NAACL 2025).

The `probe` method of `semsoft eval` fits one (`semsoft_plugin.fit.probe.fit_probe`, the
one `Classifier.fit` uses) on each run's training folds and scores the held fold, like
`temperature`. Its input is `semsoft_eval.forward.Forward` `.hidden`, kept during the
decision step itself: by the transformers backend, and by the vLLM backend read back from
the logits row by the engine's processor (`h = W⁺ z`, each row judged by its residual;
`semsoft_eval.backend_vllm`). A cache written without it is extended when `probe` is asked
for (`collect(hidden=True)`); an engine that gives none is refused by name.
Why a probe and how it is fitted: docs/few-labels.md ("The probe on the hidden state").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from semsoft_plugin.fit.probe import held_probs

__all__ = ["cross_fit_probe"]


def cross_fit_probe(
    hidden: Any, targets: Any, fold_ids: np.ndarray, n_labels: int, *, label_rows: Any,
    seed: int = 0,
) -> tuple[np.ndarray, list[dict[str, Any]]]:  # fmt: skip
    """Out-of-fold probe probabilities (`label_rows`: `[n_labels, H]`, the labels'
    answer-token output rows, `semsoft_plugin.fit.probe.label_logit_rows`) (each fold scored by the probe fitted on the other
    folds) and each fold's chosen `C`. A training part with a single label gives that
    part's add-one label frequencies (no regression can be fitted)."""
    x = np.asarray(hidden, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"hidden {x.shape} and targets {y.shape} must be [N, H] and [N]")
    out = np.empty((len(y), n_labels))
    choices: list[dict[str, Any]] = []
    for fold in np.unique(fold_ids):
        held = fold_ids == fold
        train, rows = np.flatnonzero(~held), np.flatnonzero(held)
        out[held], probe = held_probs(x, y, train, rows, n_labels, label_rows=label_rows, seed=seed)
        choices.append({"C": None if probe is None else probe.strength})
    return out, choices
