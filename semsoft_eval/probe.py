"""A probe on the decision step's hidden state ("hidden calibration", Cho et al., NAACL 2025).

Temperature scaling and the bias corrections rescale or shift the label logits, which
hold one number per label. The last layer's hidden state at the decision step holds
what the model knows about the input before its output layer throws most of it away;
with a few labels, a regularised multinomial logistic regression on it can separate
labels the label logits confuse. The ``probe`` method of ``semsoft eval`` fits one
(scikit-learn: standardised features, L2, its ``C`` chosen by the *inner* stratified
folds on log-loss, ``LogisticRegressionCV``) on each run's training folds and scores
the held fold, like ``temperature``.

Where the hidden state comes from: :class:`~semsoft_eval.forward.Forward` ``.hidden``,
kept by the transformers backend during the decision step itself (no extra pass). A
cache written before it was kept is extended when ``probe`` is asked for
(``collect(hidden=True)``); an engine that gives none is refused by name.

What vLLM can do (0.32, offline, read from its source, not built): its generate runner
returns token log-probabilities only, no hidden states (the ``extract_hidden_states``
speculative method feeds a drafter or a KV connector, not the output). A *second*
engine of the same checkpoint can: ``LLM(model, runner="pooling", convert="embed",
pooler_config=PoolerConfig(pooling_type="LAST", use_activation=False))`` then
``llm.embed(prompts)`` (``LLM.encode(..., pooling_task="embed")``) returns the last
position's final hidden state (after the final norm, unnormalised with
``use_activation=False``). That is one more model load and one more prompt pass per
item beside the scoring engine.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

__all__ = ["CS", "cross_fit_probe", "fit_probe", "probe_probs"]

# Inverse L2 strengths searched by the inner folds (on standardised features).
CS: tuple[float, ...] = tuple(float(c) for c in np.logspace(-4, 2, 7))


def fit_probe(hidden: Any, targets: Any, *, inner_folds: int = 5, seed: int = 0) -> Any:
    """A fitted ``StandardScaler`` + ``LogisticRegressionCV`` pipeline (L2, ``C`` over
    :data:`CS` chosen by inner stratified folds on log-loss)."""
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.asarray(hidden, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    folds = max(2, min(inner_folds, int(np.bincount(y).max()), len(y) // 2))
    model = make_pipeline(
        StandardScaler(),
        LogisticRegressionCV(
            Cs=list(CS),
            l1_ratios=(0.0,),
            cv=StratifiedKFold(folds, shuffle=True, random_state=seed),
            scoring="neg_log_loss",
            max_iter=1000,
            use_legacy_attributes=False,
        ),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a rare label: fewer members than folds
        model.fit(x, y)
    return model


def probe_probs(model: Any, hidden: Any, n_labels: int, n_train: int) -> np.ndarray:
    """``[N, L]`` probabilities of a fitted probe, with every label a column.

    A label absent from the training rows gets ``1 / (n_train + L)`` (the add-one
    estimate of a label never seen), the seen labels share the rest as the probe says:
    no label is impossible, so no NLL is infinite."""
    x = np.asarray(hidden, dtype=np.float64)
    seen = np.asarray(model.classes_, dtype=np.int64)
    unseen = n_labels - len(seen)
    floor = 1.0 / (n_train + n_labels)
    out = np.full((len(x), n_labels), floor)
    out[:, seen] = model.predict_proba(x) * (1.0 - unseen * floor)
    return out


def cross_fit_probe(
    hidden: Any, targets: Any, fold_ids: np.ndarray, n_labels: int, *, seed: int = 0
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Out-of-fold probe probabilities (each fold scored by the probe fitted on the other
    folds) and each fold's chosen ``C``. A training part with a single label gives that
    part's add-one label frequencies (no regression can be fitted)."""
    x = np.asarray(hidden, dtype=np.float64)
    y = np.asarray(targets, dtype=np.int64)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"hidden {x.shape} and targets {y.shape} must be [N, H] and [N]")
    out = np.empty((len(y), n_labels))
    choices: list[dict[str, Any]] = []
    for fold in np.unique(fold_ids):
        held = fold_ids == fold
        train = y[~held]
        if len(np.unique(train)) < 2:
            counts = np.bincount(train, minlength=n_labels) + 1.0
            out[held] = counts / counts.sum()
            choices.append({"C": None})
            continue
        model = fit_probe(x[~held], train, seed=seed)
        out[held] = probe_probs(model, x[held], n_labels, len(train))
        choices.append({"C": float(np.ravel(model[-1].C_)[0])})
    return out, choices
