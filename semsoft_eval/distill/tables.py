"""The held-out figures of a `semsoft distill` report as Markdown tables.

Kept apart from the recipe ([`semsoft_eval.distill.run`][semsoft_eval.distill.run]): it reads only the
`report.json` dictionary, never the run's settings or models, so a report written
earlier can be turned into tables again (`benchmarks/distill_readout.py` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["format_markdown"]


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _interval(metrics: dict[str, Any]) -> str:
    """The bootstrap interval of AUROC2; reports written before it was kept say n/a."""
    low, high = metrics.get("auroc2_ci95") or (None, None)
    return "n/a" if low is None or high is None else f"{low:.2f}-{high:.2f}"


def format_markdown(report: dict[str, Any]) -> str:
    """The held-out figures as Markdown tables (signals, then arms)."""
    held = report["heldout"]
    rows = [
        "| signal (held-out) | accuracy | AUROC2 | AUROC2 95% CI | ECE | ceiling (>=90%) | "
        "parse rate | rank corr. with self-consistency | forward passes per item | s/item |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    entries = [("self-consistency (teacher)", held["self_consistency"], None)]
    entries.append(("verbal, before training", held["verbal_before"], None))
    entries += [(name, m, None) for name, m in held["one_pass"].items()]
    for name, run in report["runs"].items():
        if "verbal" in run:
            entries.append((f"verbal, after: {name}", run["verbal"], run))
            if "verbal_expected" in run:  # reports written before this reading lack it
                entries.append(
                    (f"verbal expected stated value, after: {name}", run["verbal_expected"], None)
                )
    for name, m, run in entries:
        corr = (
            run["verbal_closeness_to_self_consistency"]
            if run
            else m.get("closeness_to_self_consistency", "-")
        )
        rows.append(
            f"| {name} | {_cell(m['accuracy'])} | {_cell(m['auroc2'])} | {_interval(m)} | "
            f"{_cell(m['ece'])} | "
            f"{_cell(m['ceiling_rate'])} | {_cell(m.get('parse_rate', '-'))} | "
            f"{_cell(corr) if name != 'self-consistency (teacher)' else '1'} | {m['passes']} | "
            f"{_cell(m['seconds_per_item'])} |"
        )
    arms = [
        "| arm | examples | guard | steps | loss first -> last | train s |",
        "|---|---|---|---|---|---|",
    ]
    for name, run in report["runs"].items():
        g = run["guard"]
        verdict = "refused" if "refused" in g else f"{g['entropy_bits']:.2f} bits"
        arms.append(
            f"| {name} | {run['examples']} | {verdict} | {_cell(run.get('steps'))} | "
            f"{_cell(run.get('loss_first'))} -> {_cell(run.get('loss_last'))} | "
            f"{_cell(run.get('train_s'))} |"
        )
    lines = ["\n".join(rows), "", "\n".join(arms), ""]
    warm = report.get("answer_warmup")
    if warm:
        lines.append(
            f"answer warm-up (before sampling; every row above uses the warmed-up model): "
            f"{warm['items']} other items, {warm['epochs']} epoch(s), {warm['steps']} steps, "
            f"loss {_cell(warm['loss_first'])} -> {_cell(warm['loss_last'])}, "
            f"{_cell(warm['train_s'])} s"
        )
    notes: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        (
            "target_ceiling_auroc2",
            lambda run: (
                "AUROC2 of the held-out targets themselves against this arm's "
                "correctness (a student that repeated the teacher exactly): "
                f"{_cell(run['target_ceiling_auroc2'])}"
            ),
        ),
        (
            "train_fit_spearman",
            lambda run: (
                f"on {run['train_fit_items']} of its own training items, Spearman of "
                f"the expected stated value with the targets it was taught: "
                f"{_cell(run['train_fit_spearman'])}"
            ),
        ),
        (
            "stated_values",
            lambda run: (
                "confidences stated (greedy): "
                + ", ".join(f"{v} x{c}" for v, c in run["stated_values"].items())
            ),
        ),
    ]
    for key, note in notes:
        lines += [f"{name}: {note(run)}" for name, run in report["runs"].items() if key in run]
    for name, run in report["runs"].items():
        if "refused" in run["guard"]:
            lines.append(f"{name}: refused by the guard: {run['guard']['refused']}")
    return "\n".join(lines)
