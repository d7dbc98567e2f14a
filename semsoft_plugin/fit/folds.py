"""The folds a fit is judged on, and what a fit needs before anything is scored.

The fit (`semsoft_plugin.fit.fitting`) and the bias members' inner folds
(`semsoft_plugin.fit.label_offsets`) both split items into stratified folds; the
split is here so that neither imports the other. `check_fit_data` is the one
check of a fit's labels, folds and margin that `Classifier.fit` and `semsoft tune`
run before any text is scored, each bad value named with its count.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["MIN_ITEMS", "check_fit_data", "check_fit_settings", "fold_count", "stratified_folds"]

# A fit splits its items into at least 2 folds of at least 2 items each.
MIN_ITEMS = 4


def check_fit_settings(n_folds: Any, margin: Any) -> None:
    """`ValueError` naming the value unless `n_folds` is an integer >= 2 and `margin`
    a finite number >= 0: what a fit needs before it sees any label.

    Parameters
    ----------
    n_folds : Any
        The folds of the out-of-fold check.
    margin : Any
        The standard errors of out-of-fold NLL a member must beat the start by.

    Examples
    --------
    >>> from semsoft_plugin.fit.folds import check_fit_settings
    >>> check_fit_settings(5, 1.0)
    >>> check_fit_settings(1, 1.0)
    Traceback (most recent call last):
        ...
    ValueError: n_folds=1 must be an integer >= 2: the fit judges each setting on held-out folds, at least 2
    """
    if isinstance(n_folds, bool) or not isinstance(n_folds, int | np.integer) or n_folds < 2:
        raise ValueError(
            f"n_folds={n_folds!r} must be an integer >= 2: the fit judges each setting on "
            "held-out folds, at least 2"
        )
    number = isinstance(margin, int | float | np.floating) and not isinstance(margin, bool)
    if not number or not math.isfinite(margin) or margin < 0:
        raise ValueError(f"margin={margin!r} must be a finite number >= 0")


def check_fit_data(targets: Sequence[Any] | np.ndarray, n_folds: Any, margin: Any) -> None:
    """`ValueError` unless a fit on `targets` (one label per item, any hashable
    values) can be judged out of fold: the settings checked by
    `check_fit_settings`, at least `MIN_ITEMS` items (2 folds of 2) and at
    least two distinct labels (a one-class fit would learn only to favour that label).
    Fewer items than `2 * n_folds` is allowed: the fit then uses
    `fold_count` folds.

    Parameters
    ----------
    targets : Sequence[Any] | np.ndarray
        The items' labels.
    n_folds : Any
        The folds asked for.
    margin : Any
        The rule's margin.

    Examples
    --------
    >>> from semsoft_plugin.fit.folds import check_fit_data
    >>> check_fit_data(["pos", "neg", "pos", "neg"], 5, 1.0)
    >>> check_fit_data(["pos"] * 10, 5, 1.0)
    Traceback (most recent call last):
        ...
    ValueError: a fit needs at least two labels (classes) among its items; all 10 are 'pos'
    """
    check_fit_settings(n_folds, margin)
    values = [v.item() if isinstance(v, np.generic) else v for v in np.asarray(targets).tolist()]
    if len(values) < MIN_ITEMS:
        raise ValueError(
            f"a fit needs at least {MIN_ITEMS} labelled items (2 folds of 2), got {len(values)}"
        )
    counts = Counter(values)
    if len(counts) < 2:
        raise ValueError(
            f"a fit needs at least two labels (classes) among its items; all {len(values)} are "
            f"{values[0]!r}"
        )


def fold_count(n_items: int, n_folds: int) -> int:
    """The folds a fit on `n_items` uses: `n_folds`, lowered to `n_items // 2` so
    that every fold holds at least 2 items."""
    return min(n_folds, n_items // 2)


def stratified_folds(targets: Any, n_folds: int, seed: int = 0) -> np.ndarray:
    """A fold id per item with each label's share kept in every fold.

    Parameters
    ----------
    targets : Any
        One label per item (any values `np.unique` orders).
    n_folds : int
        The number of folds, at least 2 and at most the number of items.
    seed : int
        The shuffle's seed.

    Returns
    -------
    np.ndarray
        `[N]` int64 fold ids in `[0, n_folds)`.

    The same ids as scikit-learn's `StratifiedKFold(n_folds, shuffle=True,
    random_state=seed)` (written out here so the plugin does not need scikit-learn).
    With an imbalanced label set a plain split can leave a rare label out of a training
    part altogether. When some label has fewer items than folds no split can hold it in
    every fold: `KFold(shuffle=True)`'s ids are used instead, with a warning naming
    the count.
    """
    targets = np.asarray(targets)
    n = len(targets)
    if isinstance(n_folds, bool) or not isinstance(n_folds, int | np.integer) or n_folds < 2:
        raise ValueError(f"n_folds={n_folds!r} must be an integer >= 2")
    if n < n_folds:
        raise ValueError(f"{n} items cannot fill {n_folds} folds: give at least {n_folds}")
    rng = np.random.RandomState(seed)
    _, first, inverse = np.unique(targets, return_index=True, return_inverse=True)
    encoded = np.unique(first, return_inverse=True)[1][inverse]  # by order of appearance
    counts = np.bincount(encoded)
    ids = np.empty(n, dtype=np.int64)
    if counts.min() < n_folds:
        warnings.warn(
            f"a label has {counts.min()} items, fewer than the {n_folds} folds: "
            "the folds are not stratified (KFold)",
            stacklevel=2,
        )
        order = np.arange(n)
        rng.shuffle(order)
        sizes = np.full(n_folds, n // n_folds)
        sizes[: n % n_folds] += 1
        ids[order] = np.repeat(np.arange(n_folds), sizes)
        return ids
    ordered = np.sort(encoded)
    allocation = np.array(
        [np.bincount(ordered[i::n_folds], minlength=len(counts)) for i in range(n_folds)]
    )
    for label in range(len(counts)):
        folds = np.arange(n_folds).repeat(allocation[:, label])
        rng.shuffle(folds)
        ids[encoded == label] = folds
    return ids
