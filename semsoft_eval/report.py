"""The report of `semsoft eval`: metrics per method, a Markdown table, reliability plots.

`build_report` scores each method's probabilities with `semsoft_eval.metrics`
(and bootstrap intervals of the difference to `constrained`); `plot_reliability`
draws one reliability diagram per method from scikit-learn's `calibration_curve`, whose
uniform bins are the ECE's (bin `i` holds `(i/n, (i+1)/n]`, as in torchmetrics).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch

from semsoft_eval import metrics
from semsoft_eval.data import EvalData
from semsoft_eval.methods import MethodResult

__all__ = [
    "METRIC_COLUMNS",
    "SOFT_COLUMNS",
    "build_report",
    "format_markdown",
    "machine",
    "plot_reliability",
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


def plot_reliability(
    probs: dict[str, np.ndarray],
    targets: np.ndarray,
    path: str | Path,
    *,
    title: str = "",
    n_bins: int = metrics.N_BINS,
) -> None:
    """Reliability diagrams, one panel per method: accuracy against top-label confidence."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.calibration import calibration_curve

    names = list(probs)
    cols = min(4, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.ravel(), names, strict=False):
        p = probs[name]
        conf, hit = p.max(1), p.argmax(1) == targets
        accuracy, mean_conf = calibration_curve(hit, conf, n_bins=n_bins, pos_label=True)
        ax.bar(mean_conf, accuracy, width=1 / n_bins, alpha=0.7, edgecolor="k", label="accuracy")
        ax.plot(mean_conf, accuracy, "o", ms=3, color="C3", label="mean confidence")
        ax.plot([0, 1], [0, 1], "--", color="gray", lw=1)
        ax.set(
            xlim=(0, 1),
            ylim=(0, 1),
            title=f"{name} (ECE {metrics.ece_numpy(conf, hit):.3f})",
            xlabel="confidence",
        )
        ax.title.set_fontsize(9)
    for ax in axes.ravel()[len(names) :]:
        ax.axis("off")
    axes[0, 0].set_ylabel("accuracy")
    axes[0, 0].legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
