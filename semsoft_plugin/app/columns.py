"""The columns a scored table gets, defined once for every path that writes one.

`semsoft classify --input` (one process), [`semsoft_plugin.app.ray.classify_dataset`][semsoft_plugin.app.ray.classify_dataset]
(one [`Classifier`][semsoft_plugin.app.classifier.Classifier] per Ray actor) and the vLLM-on-Ray
postprocess all add the same columns to each input row, from the same
[`Predictions`][semsoft_plugin.app.predictions.Predictions]: `label`, `p_<label>` (Semantic
Softmax), `constrained_<label>` (label tokens only), `coverage` (only where the scores
count votes, `counts_votes`), `fallback` and
`review` (top probability below the review threshold) and `truncated` (tokens cut
from a text longer than the model's context). Keeping the names and the
row assembly here is what makes a Ray run's rows equal to the CLI's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ResultColumns", "row_list", "text_of"]


def text_of(value: Any) -> str:
    """A cell as the text to classify: strings as they are, `""` for None/NaN,
    JSON for any other value (the CLI's rule, so every path reads a cell the same)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def row_list(numbers: Sequence[Any], limit: int = 20) -> str:
    """Row numbers (or ids) for a message: the first `limit`, then how many more."""
    shown = ", ".join(str(n) for n in numbers[:limit])
    return shown + (f" and {len(numbers) - limit} more" if len(numbers) > limit else "")


def counts_votes(config: Any = None, semantic_weight: float | None = None) -> bool:
    """Whether scores with these settings count the kept tokens' votes (a pool:
    `semantic_weight > 0`, the override's if given, else the config's, else the
    default config's). Only then is a coverage shown: at the constrained softmax it
    would measure votes nobody counts."""
    if semantic_weight is None:
        from semsoft_plugin.core.config import SemsoftConfig

        semantic_weight = (config or SemsoftConfig()).semantic_weight
    return float(semantic_weight) > 0


@dataclass(frozen=True)
class ResultColumns:
    """Names of the added columns for `labels` (in the user's order) and `prefix`.

    Parameters
    ----------
    labels : tuple[str, ...]
        Label names in the order the user gave them (the column order)
    prefix : str
        Put before every added name (`--column-prefix`), for inputs that
        already hold e.g. a `label` column
    votes : bool
        Whether the scores count votes (a pool: `semantic_weight > 0`); only then
        is there a `coverage` column, the share of the top-K mass the votes claimed.
        At the constrained softmax (the default) it would measure votes nobody counts.
    """

    labels: tuple[str, ...]
    prefix: str = ""
    votes: bool = True

    @property
    def label(self) -> str:
        return f"{self.prefix}label"

    @property
    def p(self) -> list[str]:
        return [f"{self.prefix}p_{label}" for label in self.labels]

    @property
    def constrained(self) -> list[str]:
        return [f"{self.prefix}constrained_{label}" for label in self.labels]

    @property
    def review(self) -> str:
        return f"{self.prefix}review"

    @property
    def truncated(self) -> str:
        return f"{self.prefix}truncated"

    @property
    def names(self) -> list[str]:
        """Every added column, in output order."""
        tail = [f"{self.prefix}{c}" for c in ("coverage", "fallback", "review", "truncated")]
        return [self.label, *self.p, *self.constrained, *tail[0 if self.votes else 1 :]]

    def check_clash(self, columns: Sequence[str], where: str) -> None:
        """`ValueError` naming the input columns an added column would overwrite."""
        clash = [c for c in self.names if c in columns]
        if clash:
            raise ValueError(
                f"{where} already has column(s) {clash}: pass e.g. --column-prefix semsoft_ "
                "(column_prefix='semsoft_')"
            )

    def row(
        self,
        label: str | None,
        probs: Sequence[float],
        constrained: Sequence[float],
        coverage: float,
        fallback: bool,
        truncated: int,
        review_below: float,
    ) -> dict[str, Any]:
        """The added columns of one row; `probs` and `constrained` in the order of
        [`labels`][semsoft_plugin.core.labels]. The one place a row's result columns are made."""
        row: dict[str, Any] = {self.label: label}
        row.update(zip(self.p, (float(v) for v in probs), strict=True))
        row.update(zip(self.constrained, (float(v) for v in constrained), strict=True))
        if self.votes:
            row[f"{self.prefix}coverage"] = float(coverage)
        row[f"{self.prefix}fallback"] = bool(fallback)
        row[self.review] = max(float(v) for v in probs) < review_below
        row[self.truncated] = int(truncated)
        return row

    def values(self, details: Any, review_below: float) -> list[dict[str, Any]]:
        """The added columns of each row of a `Predictions` (`classes_` column order
        mapped back to the user's label order)."""
        order = [list(details.labels).index(label) for label in self.labels]
        return [
            self.row(
                details.label[j],
                [details.probs[j][i] for i in order],
                [details.constrained_probs[j][i] for i in order],
                details.coverage[j],
                details.fallback[j],
                details.truncated[j],
                review_below,
            )
            for j in range(len(details))
        ]

    def rows(
        self, records: Sequence[Mapping[str, Any]], details: Any, review_below: float
    ) -> list[dict[str, Any]]:
        """Each input record followed by its added columns."""
        return [
            {**record, **added}
            for record, added in zip(records, self.values(details, review_below), strict=True)
        ]

    def arrow_types(self) -> list[tuple[str, Any]]:
        """`(name, pyarrow type)` of every added column, for Parquet output."""
        import pyarrow as pa

        floats = [(name, pa.float64()) for name in (*self.p, *self.constrained)]
        coverage = [(f"{self.prefix}coverage", pa.float64())] if self.votes else []
        return [
            (self.label, pa.string()),
            *floats,
            *coverage,
            (f"{self.prefix}fallback", pa.bool_()),
            (self.review, pa.bool_()),
            (self.truncated, pa.int64()),
        ]
