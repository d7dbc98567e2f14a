"""A probe on the decision step's hidden state ("hidden calibration", Cho et al., NAACL 2025).

Temperature scaling and the bias corrections rescale or shift the label logits, which
hold one number per label. The last layer's hidden state at the decision step holds
what the model knows about the input before its output layer throws most of it away;
with a few labels, a regularised multinomial logistic regression on it, anchored on the
label logits so that it keeps their ranking unless the labels show better, can separate
labels the label logits confuse. The `probe` method of `semsoft eval` fits one
(`semsoft_plugin.app.probe.fit_probe`, the one `Classifier.fit` uses) on each
run's training folds and scores the held fold, like `temperature`.

Where the hidden state comes from: `semsoft_eval.forward.Forward` `.hidden`,
kept by the transformers backend during the decision step itself (no extra pass), and by
the vLLM backend from the same pass: vLLM's generate runner returns no hidden states, so
the engine's processor reads it back from the decision step's logits row (`h = W⁺ z`,
each row judged by its residual) and its worker returns it through `collective_rpc`
(`semsoft_eval.backend_vllm`). A cache written before it was kept is extended when
`probe` is asked for (`collect(hidden=True)`); an engine that gives none (a vLLM engine
without the worker extension) is refused by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from semsoft_plugin.app.probe import held_probs

__all__ = ["cross_fit_probe"]


def cross_fit_probe(
    hidden: Any, targets: Any, fold_ids: np.ndarray, n_labels: int, *, label_rows: Any,
    seed: int = 0,
) -> tuple[np.ndarray, list[dict[str, Any]]]:  # fmt: skip
    """Out-of-fold probe probabilities (`label_rows`: `[n_labels, H]`, the labels'
    answer-token output rows, `semsoft_plugin.app.probe.label_logit_rows`) (each fold scored by the probe fitted on the other
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
