"""The file mode on every path a user has: one label bias estimated from the distinct
texts to classify, then applied to each row alone.

The math is [`FileCalibration`][semsoft_plugin.core.calibration.FileCalibration]'s; this module
holds what the paths share around it: the check that a classifier's fitted correction
still matches its parameters (`Classifier(calibrate="file")`), and the correction of
scored rows' `p_<label>` columns (`semsoft classify --input ... --calibrate file`
and [`classify_dataset`][semsoft_plugin.app.ray.classify_dataset]), whose `label` and `review`
follow the corrected probabilities while `constrained_<label>` stays the raw
constrained softmax. In a row table the bias is in the order of the user's labels.
Opt-in, with the guard (`"auto"`) as its default strength: docs/input-files.md ("The
file mode").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from semsoft_plugin.app.columns import ResultColumns
from semsoft_plugin.core.calibration import GUARD_CONFIDENCE, MIN_FILE_ROWS, FileCalibration

__all__ = ["checked_fit", "corrected_rows", "describe", "estimate_rows"]


def checked_fit(
    fitted: FileCalibration | None,
    strength: float | str,
    fitted_labels: Sequence[str] | None,
    labels: Sequence[str],
    not_fitted: type[Exception] = LookupError,
) -> FileCalibration:
    """A classifier's `file_calibration_`, refused by name when there is none
    (`not_fitted`, the classifier's not-fitted error) or when the parameters changed
    since it was fitted (`ValueError`)."""
    if fitted is None:
        raise not_fitted(
            "calibrate='file': the label bias is estimated from the texts to classify; call "
            f"fit(texts) first (unlabelled, at least {MIN_FILE_ROWS} distinct), then predict"
        )
    if not fitted.matches(strength):
        then = f"'auto' (the guard chose {fitted.strength:g})" if fitted.guard else fitted.strength
        raise ValueError(
            f"file_strength={strength!r}, but file_calibration_ was fitted at {then}: call "
            "fit(texts) again"
        )
    if tuple(fitted_labels or ()) != tuple(labels):
        raise ValueError(
            f"the labels {list(labels)} are not those file_calibration_ was fitted on "
            f"({list(fitted_labels or ())}): call fit(texts) again"
        )
    return fitted


def _p_rows(columns: ResultColumns, rows: Sequence[Mapping[str, Any]]) -> Any:
    import numpy as np

    return np.array([[float(row[name]) for name in columns.p] for row in rows], dtype=np.float64)


def estimate_rows(
    columns: ResultColumns, rows: Sequence[Mapping[str, Any]], strength: float | str
) -> FileCalibration:
    """The correction of scored rows, one per distinct text (the first pass): the mean
    of their `p_<label>` columns, in the user's label order, at `strength` (a number
    in [0, 1], or `"auto"`: the guard decides from the same rows)."""
    import numpy as np

    p = _p_rows(columns, rows) if rows else np.zeros((0, len(columns.labels)))
    return FileCalibration.estimate(p, strength=strength)


def corrected_rows(
    columns: ResultColumns,
    rows: Sequence[Mapping[str, Any]],
    correction: FileCalibration,
    review_below: float,
) -> list[dict[str, Any]]:
    """Each row's added columns with `correction` applied to its `p_<label>` alone,
    `label` its argmax and `review` its top probability below `review_below`; the
    other columns (`constrained_<label>`, `coverage`, ...) as they were."""
    if not rows:
        return []
    p = correction.apply(_p_rows(columns, rows))
    out = []
    for row, values in zip(rows, p.tolist(), strict=True):
        new = dict(row)
        new.update(zip(columns.p, values, strict=True))
        new[columns.label] = columns.labels[max(range(len(values)), key=values.__getitem__)]
        new[columns.review] = max(values) < review_below
        out.append(new)
    return out


def describe(labels: Sequence[str], correction: FileCalibration) -> str:
    """One summary line: the bias divided out, how many texts it is the mean of, and the
    strength applied (with the guard: whether it applied the correction, and why)."""
    bias = ", ".join(f"{label} {b:.3f}" for label, b in zip(labels, correction.bias, strict=True))
    applied = f"applied at strength {correction.strength:g}"
    if correction.guard and correction.confidence is not None:
        confidence = f"the guard: mean top probability {correction.confidence:.3f}"
        if correction.strength > 0:
            applied += f" ({confidence} <= {GUARD_CONFIDENCE:g})"
        else:
            applied = (
                f"not applied ({confidence} > {GUARD_CONFIDENCE:g}: a sure model's lean is "
                "taken as the file's content)"
            )
    return (
        f"file correction (--calibrate file): bias {bias} from {correction.rows} distinct "
        f"text(s), {applied}"
    )
