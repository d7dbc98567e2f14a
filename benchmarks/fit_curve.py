"""Learning curve of the few-label fit (``Classifier.fit``) against temperature scaling.

For every pair (model, data set) of the leave-one-kind-out benchmark
(``benchmarks/choose_defaults.py``: the same samples, the same kept forward passes), and
for 50, 100 and 200 labels: draw that many items at random (``--draws`` times), fit on
them, and score the rest of the set. Three methods see the same labels:

* ``fit``: :func:`semsoft_plugin.core.fitting.fit_probs`, what ``Classifier.fit`` runs (pool
  weight over a grid, a final temperature, the rule that keeps the default unless the
  fit beats it out of fold by ``--margin`` standard errors);
* ``temperature``: temperature scaling of the constrained softmax fitted on the labels;
* ``default``: the label-free default ``SemsoftConfig()`` (no labels used).

Target (issue 25): with 100 labels, test NLL at or below temperature scaling on every
kind, both models. Reads the cache only: pairs whose forward passes are missing are
listed and skipped (``choose_defaults.py --collect`` computes them).

Usage::

    python benchmarks/fit_curve.py --models default,qwen2.5-coder-1.5b \\
        --out benchmarks/results/fit-curve.json
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch

from semsoft_eval.metrics import ece_numpy
from semsoft_plugin.core import fitting
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.kept_scores import grid_probs
from semsoft_plugin.core.temperature_scaling import apply_temperature, fit_temperature, nll

SETS = "goemotions:300,ekman:300,sst2:300,agnews:300,trec:300,convabuse:300,davidson:300"
SIZES = (50, 100, 200)
TARGET_SIZE = 100


def _scores(probs: np.ndarray, y: np.ndarray) -> dict[str, float]:
    return {
        "nll": float(nll(probs, y).mean()),
        "ece": float(ece_numpy(probs.max(1), probs.argmax(1) == y)),
        "accuracy": float((probs.argmax(1) == y).mean()),
    }


def pair_curve(
    grid: np.ndarray,
    start: np.ndarray,
    constrained: np.ndarray,
    y: np.ndarray,
    *,
    sizes: tuple[int, ...],
    draws: int,
    margin: float,
    seed: int,
    single: dict[str, int],
) -> dict[str, Any]:
    """Per size: each method's test scores averaged over the draws, and fit - temperature."""
    log_grid = np.log(np.clip(grid, 1e-30, 1.0))
    log_con = np.log(np.clip(constrained, 1e-30, 1.0))
    out: dict[str, Any] = {}
    for size in sizes:
        if size >= len(y):
            continue
        rows: dict[str, list[dict[str, float]]] = {"fit": [], "temperature": [], "default": []}
        kept_default = 0
        weights = []
        null_adopted, null_harm = 0, []
        for draw in range(draws):
            order = np.random.default_rng([seed, size, draw]).permutation(len(y))
            train, test = order[:size], order[size:]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # rare labels: unstratified folds, said once
                best, t, keep, _ = fitting.fit_probs(
                    grid[:, train],
                    start[train],
                    y[train],
                    margin=margin,
                    seed=seed,
                    single=single,
                )
            kept_default += keep
            fitted = start[test] if keep else apply_temperature(log_grid[best, test], t)
            weights.append(None if keep else fitting.DEFAULT_WEIGHTS[best])
            t_con = fit_temperature(log_con[train], y[train])
            rows["fit"].append(_scores(fitted, y[test]))
            rows["temperature"].append(_scores(apply_temperature(log_con[test], t_con), y[test]))
            rows["default"].append(_scores(start[test], y[test]))
            # Uninformative labels: drawn from the default's own distribution, so the
            # default is right and any move away from it is overfitting.
            rng = np.random.default_rng([seed, size, draw, 1])
            y_null = (
                (rng.random(len(y))[:, None] > start.cumsum(1)).sum(1).clip(0, len(start[0]) - 1)
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                best, t, keep, _ = fitting.fit_probs(
                    grid[:, train], start[train], y_null[train], margin=margin, seed=seed,
                    single=single,
                )  # fmt: skip
            null_adopted += not keep
            moved = start[test] if keep else apply_temperature(log_grid[best, test], t)
            null_harm.append(
                float(nll(moved, y_null[test]).mean() - nll(start[test], y_null[test]).mean())
            )
        diff = np.array(
            [f["nll"] - t["nll"] for f, t in zip(rows["fit"], rows["temperature"], strict=True)]
        )
        out[str(size)] = {
            **{
                name: {m: float(np.mean([r[m] for r in rs])) for m in ("nll", "ece", "accuracy")}
                for name, rs in rows.items()
            },
            "fit_minus_temperature_nll": {
                "mean": float(diff.mean()),
                "sd": float(diff.std(ddof=1)) if draws > 1 else 0.0,
                "share_fit_at_or_below": float((diff <= 0).mean()),
            },
            "kept_default_share": kept_default / draws,
            "uninformative_labels": {
                "adopted_share": null_adopted / draws,
                "test_nll_harm_mean": float(np.mean(null_harm)),
                "test_nll_harm_max": float(np.max(null_harm)),
            },
            "fitted_weights": weights,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,qwen2.5-coder-1.5b")
    parser.add_argument("--sets", default=SETS)
    parser.add_argument("--seed", type=int, default=0, help="the sample seed semsoft eval used")
    parser.add_argument("--draws", type=int, default=20, help="random label draws per size")
    parser.add_argument(
        "--margin", type=float, default=1.0, help="the fit's rule, in standard errors"
    )
    parser.add_argument("--out", default="benchmarks/results/fit-curve.json")
    args = parser.parse_args()

    # benchmarks/ is on sys.path when run as a script
    from _cli import write_results
    from choose_defaults import load_pair  # the same samples and cached passes

    start_config = SemsoftConfig()
    configs = fitting.grid_configs({"semantic_weight": fitting.DEFAULT_WEIGHTS}, start_config)
    single = fitting.single_entries(configs, start_config)
    pairs: dict[str, Any] = {}
    missing = []
    for model in args.models.split(","):
        for spec in args.sets.split(","):
            dataset, limit = spec.split(":")
            try:
                pair = load_pair(model, dataset, int(limit), args.seed, False)
            except SystemExit:
                missing.append(f"{model}/{dataset}")
                continue
            forward, labels, y = pair["forward"], pair["labels"], pair["data"].targets
            probs, _ = grid_probs(forward, pair["embeddings"], labels, [*configs, start_config])
            constrained = torch.softmax(forward.label_logits[:, : len(labels)].double(), -1).numpy()
            pairs[f"{model}/{dataset}"] = {
                "model": model,
                "kind": dataset,
                "n": len(y),
                "sizes": pair_curve(
                    probs[:-1],
                    probs[-1],
                    constrained,
                    y,
                    sizes=SIZES,
                    draws=args.draws,
                    margin=args.margin,
                    seed=args.seed,
                    single=single,
                ),  # fmt: skip
            }
            print(f"{model}/{dataset} done", flush=True)
    at = str(TARGET_SIZE)
    met = {k: p["sizes"][at]["fit_minus_temperature_nll"]["mean"] <= 0 for k, p in pairs.items()}
    result = {
        "target": f"with {TARGET_SIZE} labels, test NLL at or below temperature scaling on every kind",
        "target_met_on_measured_pairs": all(met.values()) if met else None,
        "met_per_pair": met,
        "missing_pairs": missing,
        "start_config": start_config.to_dict(),
        "grid": {"semantic_weight": list(fitting.DEFAULT_WEIGHTS)},
        "margin": args.margin,
        "draws": args.draws,
        "pairs": pairs,
        "command": " ".join(["python", "benchmarks/fit_curve.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    write_results(result, args.out, markdown(result))
    return 0


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Command: `{result['command']}` ({result['date']})",
        "",
        f"Target: {result['target']}. Met on every measured pair: "
        f"{result['target_met_on_measured_pairs']}. Missing pairs (no cached passes): "
        f"{', '.join(result['missing_pairs']) or 'none'}.",
        "",
        f"Mean over {result['draws']} random draws of the labels; test = the rest of the "
        f"set. Rule margin {result['margin']:g} standard errors.",
        "",
        "| model / data | labels | NLL fit | NLL temperature | NLL default | fit − temp. "
        "(sd) | draws fit ≤ temp. | ECE fit | ECE temp. | ECE default | acc fit | acc temp. "
        "| default kept | uninformative labels: fit moved (mean / max NLL harm) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, pair in result["pairs"].items():
        for size, row in pair["sizes"].items():
            d = row["fit_minus_temperature_nll"]
            u = row["uninformative_labels"]
            lines.append(
                f"| {key} | {size} | {row['fit']['nll']:.3f} | {row['temperature']['nll']:.3f} "
                f"| {row['default']['nll']:.3f} | {d['mean']:+.3f} ({d['sd']:.3f}) | "
                f"{d['share_fit_at_or_below']:.0%} | {row['fit']['ece']:.3f} | "
                f"{row['temperature']['ece']:.3f} | {row['default']['ece']:.3f} | "
                f"{row['fit']['accuracy']:.3f} | {row['temperature']['accuracy']:.3f} | "
                f"{row['kept_default_share']:.0%} | "
                f"{u['adopted_share']:.0%} ({u['test_nll_harm_mean']:+.4f} / "
                f"{u['test_nll_harm_max']:+.3f}) |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
