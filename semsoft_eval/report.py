"""The report of `semsoft eval`: metrics per method, a Markdown table, reliability plots.

`build_report` scores each method's probabilities with `semsoft_eval.metrics`
(and bootstrap intervals of the difference to `constrained`); `plot_reliability`
draws one reliability diagram per method. Its bins are the ECE's (`reliability_bins`: 15
equal-width bins, bin `i` holding `(i/n, (i+1)/n]`, as in torchmetrics and
`metrics.ece_numpy`), and `reliability_figure` draws bins however they were computed:
the documentation's figures (`benchmarks/figures.py`) draw the bins a benchmark wrote with
it, so a user's `semsoft eval --plot` looks like the docs.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from semsoft_eval import metrics
from semsoft_eval.data import EvalData
from semsoft_eval.methods import MethodResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "METRIC_COLUMNS",
    "SOFT_COLUMNS",
    "build_report",
    "format_markdown",
    "machine",
    "bins_ece",
    "confidence_bins",
    "draw_reliability",
    "plot_reliability",
    "reliability_bins",
    "reliability_figure",
    "write_report",
]

METRIC_COLUMNS = ("accuracy", "macro_f1", "ece", "brier", "nll", "auroc", "auroc2")
SOFT_COLUMNS = (
    "mae_vs_raters",
    "ece_vs_raters",
    "spearman_vs_raters",
    "share_over_0_9_on_ambiguous",
)


def machine() -> str:
    return f"{platform.machine()} {platform.processor() or platform.system()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def build_report(
    results: dict[str, MethodResult],
    data: EvalData,
    fold_ids: np.ndarray,
    *,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """`{"methods": {name: metrics}}` with intervals against `constrained`."""
    out: dict[str, Any] = {}
    reference = results.get("constrained")
    for name, result in results.items():
        row: dict[str, Any] = metrics.classification_metrics(
            result.probs, data.targets, data.gold_sets
        )
        row["fallback_rate"] = result.fallback_rate
        row["coverage"] = result.coverage
        row["seconds_per_item"] = result.seconds / len(data)
        if data.soft is not None:
            row.update(metrics.soft_label_metrics(result.probs, data.soft))
        if reference is not None and name != "constrained" and n_bootstrap > 0:
            row["vs_constrained"] = metrics.bootstrap_difference(
                result.probs,
                reference.probs,
                data.targets,
                n_resamples=n_bootstrap,
                seed=seed,
                gold_sets=data.gold_sets,
            )
        if result.extra:
            row.update(result.extra)
        out[name] = row
    return {"methods": out, "folds": int(fold_ids.max()) + 1}


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}"


def _interval(row: dict[str, Any], metric: str) -> str:
    cmp = row.get("vs_constrained", {}).get(metric)
    if cmp is None:
        return ""
    return f"{cmp['diff']:+.3f} [{cmp['low']:+.3f}, {cmp['high']:+.3f}]"


def _fold_lines(methods: dict[str, Any]) -> list[str]:
    """One line per method that reports a fit's choice per fold (`fit`:
    `semsoft_eval.held_fit.fold_choice`): the member adopted on each fold and its
    parameters, or that the rule kept the start."""
    lines = []
    for name, row in methods.items():
        choices = row.get("fold_choices") or []
        if not choices or not all(isinstance(c, dict) and "kept_default" in c for c in choices):
            continue
        parts = [f"{c['fold'] + 1} {_member(c)}" for c in choices]
        lines += ["", f"`{name}` per fold: " + "; ".join(parts)]
    return lines


def _member(choice: dict[str, Any]) -> str:
    """A fold's choice in a few words, e.g. `grid (w=0.3, T=0.912)`."""
    if choice.get("note"):
        return "kept the start (too few items to fit)"
    if choice["kept_default"]:
        return "kept the start"
    procedure = choice["procedure"]
    if procedure == "probe":
        return f"probe (C={choice['C']:g})"
    t = f"T={choice['score_temperature']:.3f}"
    if procedure == "grid":
        return f"grid (w={choice['semantic_weight']:g}, {t})"
    return f"{procedure} ({t})"


def format_markdown(report: dict[str, Any]) -> str:
    """The results as a Markdown table (one row per method)."""
    run = report["run"]
    soft = any("mae_vs_raters" in row for row in report["methods"].values())
    header = ["method", "acc", "macro-F1", "ECE", "Brier", "NLL", "AUROC", "AUROC2"]
    keys = list(METRIC_COLUMNS)
    if soft:
        header += ["MAE raters", "ECE raters", "Spearman", ">0.9 on ambiguous"]
        keys += list(SOFT_COLUMNS)
    header += ["ΔECE vs constrained [95%]", "ΔNLL", "Δmacro-F1"]
    lines = [
        f"**{run['dataset']}**, {run['n']} items, model `{run['model']}`, "
        f"{run['seconds_per_item']:.3f} s/item forward ({run['machine']}, {run['date']})",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name, row in report["methods"].items():
        cells = [name] + [_fmt(row.get(k)) for k in keys]
        cells += [_interval(row, "ece"), _interval(row, "nll"), _interval(row, "macro_f1")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _fold_lines(report["methods"])
    multi = run["label_report"]["multi_token_labels"]
    lines.append("")
    lines.append(f"multi-token labels: {', '.join(multi) if multi else 'none'}")
    return "\n".join(lines)


def confidence_bins(
    confidence: np.ndarray, hit: np.ndarray, n_bins: int = metrics.N_BINS
) -> dict[str, list[Any]]:
    """Each of `n_bins` equal-width bins of the confidence: its items' mean `confidence`,
    their `accuracy` (the mean of `hit`, which may be fractional) and their `count`.

    Bin `i` holds the confidences in `(i/n, (i+1)/n]`, a confidence of 0 falling in the
    first: `metrics.ece_numpy`'s bins, so `bins_ece` of the result is its ECE. An empty
    bin's confidence and accuracy are None (JSON's null).

    >>> b = confidence_bins(np.array([0.3, 0.5, 0.75, 1.0]), np.array([1, 0, 1, 1]), 2)
    >>> b["count"], b["confidence"], b["accuracy"]
    ([2, 2], [0.4, 0.875], [0.5, 1.0])
    >>> round(bins_ece(b), 6)
    0.1125
    """
    confidence = np.asarray(confidence, dtype=np.float64).ravel()
    hit = np.asarray(hit, dtype=np.float64).ravel()
    if confidence.shape != hit.shape:
        raise ValueError(f"confidence {confidence.shape} and hit {hit.shape} differ")
    index = np.clip(np.ceil(confidence * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    count = np.bincount(index, minlength=n_bins)
    conf_sum = np.bincount(index, weights=confidence, minlength=n_bins)
    hit_sum = np.bincount(index, weights=hit, minlength=n_bins)
    return {
        "confidence": [float(s / c) if c else None for s, c in zip(conf_sum, count, strict=True)],
        "accuracy": [float(s / c) if c else None for s, c in zip(hit_sum, count, strict=True)],
        "count": [int(c) for c in count],
    }


def reliability_bins(
    probs: np.ndarray, targets: np.ndarray, n_bins: int = metrics.N_BINS
) -> dict[str, list[Any]]:
    """`confidence_bins` of the top label of `[N, L]` probabilities against `[N]` targets."""
    probs = np.asarray(probs)
    return confidence_bins(probs.max(1), probs.argmax(1) == np.asarray(targets), n_bins)


def bins_ece(bins: dict[str, list[Any]]) -> float:
    """The ECE of `confidence_bins`: each bin's |accuracy - confidence| weighted by its
    share of the items.

    >>> bins_ece({"confidence": [0.75, None], "accuracy": [0.5, None], "count": [4, 0]})
    0.25
    """
    total = sum(bins["count"])
    return float(
        sum(
            n / total * abs(a - c)
            for c, a, n in zip(bins["confidence"], bins["accuracy"], bins["count"], strict=True)
            if n
        )
    )


def draw_reliability(ax: Axes, hist: Axes, bins: dict[str, list[Any]], name: str) -> None:
    """One reliability diagram on `ax`: each bin's accuracy as a bar over the bin, its mean
    confidence as a dot on the bar (on the dashed diagonal where calibrated), the ECE in
    the title; `hist` beneath it shows each bin's share of the items."""
    n_bins = len(bins["count"])
    edges = np.arange(n_bins) / n_bins
    filled = [i for i, n in enumerate(bins["count"]) if n]
    accuracy = [bins["accuracy"][i] for i in filled]
    ax.bar(edges[filled], accuracy, width=1 / n_bins, align="edge", color="C0", alpha=0.75,
           edgecolor="k", linewidth=0.5, label="accuracy")  # fmt: skip
    ax.plot([bins["confidence"][i] for i in filled], accuracy, "o", ms=3.5, color="C3",
            label="mean confidence")  # fmt: skip
    ax.plot([0, 1], [0, 1], "--", color="gray", lw=1)
    ax.set(xlim=(0, 1), ylim=(0, 1), title=f"{name} (ECE {bins_ece(bins):.3f})")
    ax.title.set_fontsize(9)
    ax.tick_params(labelbottom=False, labelsize=8)
    total = sum(bins["count"])
    hist.bar(edges, [n / total for n in bins["count"]], width=1 / n_bins, align="edge",
             color="0.6", edgecolor="k", linewidth=0.5)  # fmt: skip
    hist.set(xlim=(0, 1), ylim=(0, 1))
    hist.set_xlabel("confidence", fontsize=8)
    hist.tick_params(labelsize=7)


def reliability_figure(
    panels: dict[str, dict[str, list[Any]]], *, title: str = "", cols: int = 4
) -> Figure:
    """A figure of reliability diagrams, one panel per entry of `panels` (a name and its
    `confidence_bins`), `cols` to a row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(panels)
    cols = min(cols, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(
        2 * rows, cols, figsize=(3.2 * cols, 3.6 * rows), squeeze=False,
        gridspec_kw={"height_ratios": [4, 1] * rows},
    )  # fmt: skip
    for k in range(rows * cols):
        row, col = divmod(k, cols)
        ax, hist = axes[2 * row, col], axes[2 * row + 1, col]
        if k >= len(names):
            ax.axis("off")
            hist.axis("off")
            continue
        draw_reliability(ax, hist, panels[names[k]], names[k])
        if col == 0:
            ax.set_ylabel("accuracy", fontsize=8)
            hist.set_ylabel("share", fontsize=8)
    axes[0, 0].legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_reliability(
    probs: dict[str, np.ndarray],
    targets: np.ndarray,
    path: str | Path,
    *,
    title: str = "",
    n_bins: int = metrics.N_BINS,
) -> None:
    """Reliability diagrams, one panel per method: accuracy against top-label confidence
    in the ECE's bins (`reliability_figure`, as the documentation's figures), written to
    `path` (PNG, SVG or PDF by its suffix)."""
    import matplotlib.pyplot as plt

    panels = {name: reliability_bins(p, targets, n_bins) for name, p in probs.items()}
    fig = reliability_figure(panels, title=title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
