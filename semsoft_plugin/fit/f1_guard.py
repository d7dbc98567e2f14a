"""The rule's macro-F1 guard: scikit-learn's macro F1 in closed form and the paired
bootstrap of a fit's change in it (`f1_change`), which `FitPolicy.f1_z` and
`FitPolicy.f1_tolerance` judge. Apart from the fit so that a member fitted by the caller
(the probe) can score its own choices without calling back into the fit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["F1_RESAMPLES", "f1_change", "macro_f1"]

# The bootstrap's resamples (the guard's switch, z and tolerance are FitPolicy fields).
F1_RESAMPLES = 1000
# The bootstrap's resample-by-item count matrix is built in parts of about this many cells.
_BOOTSTRAP_CELLS = 2_000_000


def macro_f1(
    targets: np.ndarray,
    predicted: np.ndarray,
    n_labels: int,
    weights: np.ndarray | None = None,
    labels: np.ndarray | None = None,
) -> float:
    """scikit-learn's macro F1 (`zero_division=0`, items counted by `weights` where
    given) in closed form: the core has no scikit-learn, and a bootstrap calls it a
    thousand times. Averaged over `labels` (a `[n_labels]` mask, scikit-learn's
    `labels=`), by default the labels in `targets` or `predicted`."""
    right = targets == predicted
    tp = np.bincount(
        targets[right], weights=None if weights is None else weights[right], minlength=n_labels
    )
    support = np.bincount(targets, weights=weights, minlength=n_labels)
    chosen = np.bincount(predicted, weights=weights, minlength=n_labels)
    present = (support + chosen) > 0 if labels is None else np.asarray(labels, dtype=bool)
    f1 = 2 * tp[present] / np.maximum(support[present] + chosen[present], 1e-300)
    return float(f1.mean())


def f1_change(
    targets: np.ndarray,
    start: np.ndarray,
    predicted: np.ndarray,
    n_labels: int,
    weights: np.ndarray | None = None,
    *,
    resamples: int = F1_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """`(change, se)`: the macro-F1 of `predicted` minus that of `start` (both `[N]`
    label indices for `targets`), averaged over the labels the items hold, and the
    paired bootstrap standard error of that change.

    Both are averaged over the same labels: over the labels each one predicts
    (scikit-learn's default), a member that stops predicting a label the items lack
    drops that label's 0 from its own mean and seems to gain. The bootstrap resamples
    items (`weights`: counts, so an item of weight 2 is that item twice), the same
    resample for both, so the error is that of the difference; `seed` fixes it.
    Where no decision changes, both are 0.

    Examples
    --------
    The start names label 2 once, which no item holds; naming label 1 there instead costs
    label 1 precision (scikit-learn's default, each over its own labels, calls it +.178):

    >>> import numpy as np
    >>> from semsoft_plugin.fit.f1_guard import f1_change
    >>> targets = np.array([0, 0, 1, 1])
    >>> change, se = f1_change(targets, np.array([0, 2, 1, 1]), np.array([0, 1, 1, 1]), 3)
    >>> round(change, 3)
    -0.1
    >>> f1_change(targets, targets, targets.copy(), 3)   # no decision changed
    (0.0, 0.0)
    """
    if np.array_equal(start, predicted):
        return 0.0, 0.0
    seen = np.bincount(targets, minlength=n_labels) > 0
    change = macro_f1(targets, predicted, n_labels, weights, seen) - macro_f1(
        targets, start, n_labels, weights, seen
    )
    n = len(targets)
    rng = np.random.default_rng(seed)
    truth = np.eye(n_labels)[targets][:, seen]
    picks = {
        "start": np.eye(n_labels)[start][:, seen],
        "predicted": np.eye(n_labels)[predicted][:, seen],
    }
    diffs = []
    for size in _chunks(resamples, max(1, _BOOTSTRAP_CELLS // n)):  # bounded memory
        rows = (np.arange(size)[:, None] * n + rng.integers(0, n, size=(size, n))).ravel()
        counts = np.bincount(rows, minlength=size * n).reshape(size, n).astype(np.float64)
        if weights is not None:
            counts *= weights
        support = counts @ truth
        f1 = {}
        for name, picked in picks.items():
            total = support + counts @ picked
            f1[name] = (2 * (counts @ (truth * picked)) / np.where(total > 0, total, 1.0)).mean(1)
        diffs.append(f1["predicted"] - f1["start"])
    diffs = np.concatenate(diffs)
    return float(change), float(diffs.std(ddof=1))


def _chunks(total: int, size: int) -> list[int]:
    """`total` split into parts of at most `size`."""
    return [min(size, total - i) for i in range(0, total, size)]
