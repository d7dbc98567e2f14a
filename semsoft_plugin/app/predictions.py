"""What [`Classifier.predict_details`][semsoft_plugin.app.classifier.Classifier.predict_details]
returns for a batch: [`Predictions`][semsoft_plugin.app.predictions.Predictions], numpy arrays over N texts in the classifier's
`classes_` column order, and [`probability_rows`][semsoft_plugin.app.predictions.probability_rows], which turns the engines'
per-text label -> probability dicts into those rows.

Apart from the classifier: these are the arrays the CLI and the table columns read, and
they do not depend on how the texts were scored. numpy is imported only when rows are built:
`import semsoft_plugin` stays torch-only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Predictions", "probability_rows"]


@dataclass(frozen=True)
class Predictions:
    """Everything scored for N texts, rows in input order, columns in `labels` order.

    Attributes
    ----------
    labels : tuple[str, ...]
        The label names in column order: the classifier's `classes_` (sorted)
    label : list[str]
        Per text, the calibrated label (argmax of `probs`)
    probs : np.ndarray
        `[N, L]` float64 label probabilities, rows summing to 1: the constrained softmax by
        default; the pool, file or fitted scores where the settings ask for them
    constrained_probs : np.ndarray
        `[N, L]` float64 softmax over the label tokens only (the baseline)
    coverage : np.ndarray
        `[N]` share of the top-K mass that voted for some label
    fallback : np.ndarray
        `[N]` bool, True where no kept token voted for any label and
        `probs` is the constrained softmax
    truncated : np.ndarray
        `[N]` int, the number of tokens cut from the end of each text to fit
        the model's context (or `max_text_tokens`); 0 where the whole text was scored

    Examples
    --------
    ```python
    from semsoft_plugin import Classifier

    clf = Classifier.from_pretrained("default", ["positive", "negative"])
    d = clf.predict_details(["Funny, warm and beautifully shot.", "Flat and predictable."])
    d.labels                 # ('negative', 'positive'): clf.classes_, the columns' order
    d.label                  # one label per text, e.g. ['positive', 'negative']
    d.probs.shape            # (2, 2) float64, rows sum to 1
    d.constrained_probs      # the softmax over the label tokens (the default scores are these)
    d.truncated              # array([0, 0]): no text was cut
    ```
    """

    labels: tuple[str, ...]
    label: list[str]
    probs: np.ndarray
    constrained_probs: np.ndarray
    coverage: np.ndarray
    fallback: np.ndarray
    truncated: np.ndarray

    def __len__(self) -> int:
        return len(self.label)

    def with_probs(self, probs: np.ndarray) -> Predictions:
        """The same predictions with `probs` replaced (a bias correction applied) and
        `label` following them; `constrained_probs` stays the raw baseline."""
        return replace(self, probs=probs, label=[self.labels[i] for i in probs.argmax(axis=1)])


def probability_rows(dicts: Sequence[Mapping[str, float]], names: Sequence[str]) -> np.ndarray:
    """Label -> probability dicts as `[N, L]` float64 rows renormalised to sum to 1
    (the engines compute in float32; scikit-learn checks the sums)."""
    import numpy as np

    rows = np.array([[d[n] for n in names] for d in dicts], dtype=np.float64)
    rows = rows.reshape(len(dicts), len(names))
    return rows / rows.sum(axis=1, keepdims=True)
