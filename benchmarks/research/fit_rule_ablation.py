"""What each part of the few-label fit's rule changes: the rule of succession, the macro-F1 guard, the temperature floor.

Run on demand; reads the kept forward passes `benchmarks/research/fit_curve.py` reads (the same
pairs, the same draws of labels: `--draws` random draws of `--sizes` labels, the rest
of the set scored). For each pair and size, the whole family
(`semsoft_plugin.fit.fitting.fit_probs`) under five rules:

* `hard`: temperatures and offsets fitted to the hard labels, no guard (the rule
  before issue 36's second pass);
* `succession`: held to the rule of succession (an answer may not be made surer than
  `(N + 1) / (N + 2)` by `N` labels): temperatures by
  `semsoft_plugin.fit.temperature_scaling.succession_temperature`, offsets fitted to
  `semsoft_plugin.fit.temperature_scaling.succession_targets`;
* `hard + F1 guard`: a member that changes decisions is adopted only where its
  out-of-fold macro-F1 change less `FitPolicy.f1_z` (`--f1-z`) bootstrap standard errors
  is at least `-FitPolicy.f1_tolerance` (`fitting.fit_probs`);
* `succession + F1 guard`: both;
* `+ temperature floor`: both, and the temperature as the rule's floor
  (`FitPolicy.temperature_floor`): always adopted unless another member beats it (what
  `Classifier.fit` and `semsoft tune` run, `FitPolicy()`).

Each rule is a `semsoft_plugin.core.fit_policy.FitPolicy` passed to every fit it runs.

Beside them: temperature scaling of the constrained softmax on the same labels, and the
constrained softmax. Reported: mean test NLL (and its worst draw), the change against
temperature scaling, mean macro-F1 against the constrained softmax's, and what the rule
adopted.

Usage::

    python benchmarks/research/fit_rule_ablation.py --out benchmarks/results/fit-rule-ablation.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from semsoft_eval.metrics import macro_f1
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.core.kept_scores import grid_probs
from semsoft_plugin.fit import fitting, temperature_scaling
from semsoft_plugin.fit.label_offsets import MEMBERS

RULES = {  # name -> the rule of succession, F1 guard, temperature floor (FitPolicy fields)
    "hard": {"succession": False, "f1_guard": False, "temperature_floor": False},
    "succession": {"succession": True, "f1_guard": False, "temperature_floor": False},
    "hard + F1 guard": {"succession": False, "f1_guard": True, "temperature_floor": False},
    "succession + F1 guard": {"succession": True, "f1_guard": True, "temperature_floor": False},
    "+ temperature floor": {"succession": True, "f1_guard": True, "temperature_floor": True},
}


def _pair_arrays(model: str, dataset: str, limit: int, seed: int) -> dict[str, Any]:
    """The pair's grid, start, content-free and constrained probabilities (fit_curve's)."""
    from semsoft_eval.benchmarking import load_pair

    pair = load_pair(model, dataset, limit, seed, False)
    start = SemsoftConfig()
    configs = fitting.grid_configs({"semantic_weight": fitting.DEFAULT_WEIGHTS}, start)
    single = fitting.single_entries(configs, start)
    forward, labels = pair["forward"], pair["labels"]
    probs, _ = grid_probs(forward, pair["embeddings"], labels, [*configs, start])
    base = configs[single["temperature"]]
    content_free, _ = grid_probs(forward.content_free(), pair["embeddings"], labels, [base])
    constrained = torch.softmax(forward.label_logits[:, : len(labels)].double(), -1).numpy()
    return {
        "grid": probs[:-1],
        "start": probs[-1],
        "content_free": content_free[0],
        "constrained": constrained,
        "single": single,
        "y": pair["data"].targets,
    }


def _rule_run(
    arrays: dict[str, Any], size: int, draws: int, seed: int, f1_z: float
) -> dict[str, Any]:
    """Each rule's mean test scores over the draws (the guard at `f1_z` standard errors, the
    margin 1), and the baselines'."""
    from fit_curve import _fit

    y, constrained = arrays["y"], arrays["constrained"]
    log_con = np.log(np.clip(constrained, 1e-30, 1.0))
    out: dict[str, Any] = {}
    # A draw whose items hold one label cannot be fitted (the fit refuses it, as
    # Classifier.fit does): it is left out of every rule and counted.
    splits = [
        order
        for order in (
            np.random.default_rng([seed, size, draw]).permutation(len(y)) for draw in range(draws)
        )
        if len(np.unique(y[order[:size]])) > 1
    ]
    baseline: dict[str, list[float]] = {"temperature": [], "constrained": [], "constrained_f1": []}
    for order in splits:
        train, test = order[:size], order[size:]
        t = temperature_scaling.fit_temperature(log_con[train], y[train])
        scaled = temperature_scaling.apply_temperature(log_con[test], t)
        baseline["temperature"].append(float(temperature_scaling.nll(scaled, y[test]).mean()))
        baseline["constrained"].append(
            float(temperature_scaling.nll(constrained[test], y[test]).mean())
        )
        baseline["constrained_f1"].append(macro_f1(constrained[test], y[test]))
    out["baselines"] = {k: float(np.mean(v)) for k, v in baseline.items()}
    out["one_label_draws_left_out"] = draws - len(splits)
    for name, rule in RULES.items():
        policy = FitPolicy(margin=1.0, f1_z=f1_z, random_state=seed, **rule)
        nlls, f1s, adopted = [], [], []
        for order in splits:
            train, test = order[:size], order[size:]
            probs, keep, procedure = _fit(
                arrays["grid"], arrays["start"], y, train, test, policy=policy,
                single=arrays["single"], bias=MEMBERS, content_free=arrays["content_free"],
            )  # fmt: skip
            nlls.append(float(temperature_scaling.nll(probs, y[test]).mean()))
            f1s.append(macro_f1(probs, y[test]))
            adopted.append("kept" if keep else procedure)
        out[name] = {
            "nll": float(np.mean(nlls)),
            "nll_worst_draw": float(np.max(nlls)),
            "macro_f1": float(np.mean(f1s)),
            "adopted": {p: adopted.count(p) for p in dict.fromkeys(adopted)},
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# The few-label fit's rule: the rule of succession, the macro-F1 guard, the temperature floor",
        "",
        f"Command: `{result['command']}` ({result['date']})",
        "",
        "Kept forward passes of `benchmarks/research/fit_curve.py` (bf16 weights, float32 output "
        "head); the whole family, margin 1 standard error, the macro-F1 guard at "
        f"{result['f1_z']:g} bootstrap standard errors; mean over "
        f"{result['draws']} random draws of the labels, test = the rest of the set. "
        "`vs temp.`: NLL minus temperature scaling's on the same labels (negative: "
        "better); `F1 − constr.`: macro-F1 minus the constrained softmax's.",
        "",
        "| pair | labels | temp. NLL | constr. NLL | rule | NLL (worst draw) | vs temp. "
        "| F1 − constr. | adopted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pair, sizes in result["pairs"].items():
        for size, run in sizes.items():
            base = run["baselines"]
            left_out = run.get("one_label_draws_left_out", 0)
            labels = f"{size} ({left_out} one-label draws left out)" if left_out else size
            head = [pair, labels, f"{base['temperature']:.3f}", f"{base['constrained']:.3f}"]
            for name in RULES:
                r = run[name]
                adopted = ", ".join(f"{k} {v}" for k, v in r["adopted"].items())
                cells = [
                    *head,
                    name,
                    f"{r['nll']:.3f} ({r['nll_worst_draw']:.3f})",
                    f"{r['nll'] - base['temperature']:+.3f}",
                    f"{r['macro_f1'] - base['constrained_f1']:+.3f}",
                    adopted,
                ]
                lines.append("| " + " | ".join(cells) + " |")
                head = ["", "", "", ""]  # the pair's cells once
    return "\n".join(lines)


def main() -> int:
    from semsoft_eval.benchmarking import KEPT_PAIRS, merge_parts, split_pair, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default=KEPT_PAIRS, help="model/dataset:items, comma-separated")
    parser.add_argument("--sizes", default="25,100", help="labels to fit on")
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="the sample seed semsoft eval used")
    parser.add_argument("--f1-z", type=float, default=FitPolicy().f1_z,
                        help="the guard's standard errors (FitPolicy.f1_z)")  # fmt: skip
    parser.add_argument("--merge", help="comma-separated result JSONs (runs of parts of the "
                        "pairs, side by side): their pairs in one table")  # fmt: skip
    parser.add_argument("--out", default="benchmarks/results/fit-rule-ablation.json")
    args = parser.parse_args()
    f1_tolerance = FitPolicy().f1_tolerance  # the guard's tolerance: no flag, the default
    if args.merge:  # one result, the first part's date and the parts' own settings
        settings = {"draws": args.draws, "f1_tolerance": f1_tolerance, "f1_z": args.f1_z}
        parts = args.merge.split(",")
        first = json.loads(Path(parts[0]).read_text())
        result = {
            **first,
            **merge_parts(parts, settings, "benchmarks/research/fit_rule_ablation.py"),
        }
        write_results(result, args.out, markdown(result))
        return 0

    pairs: dict[str, Any] = {}
    for spec in args.pairs.split(","):
        model, dataset, limit = split_pair(spec)
        name = f"{model}/{dataset}"
        arrays = _pair_arrays(model, dataset, limit, args.seed)
        pairs[name] = {
            size: _rule_run(arrays, int(size), args.draws, args.seed, args.f1_z)
            for size in args.sizes.split(",")
        }
        print(f"{name} done", flush=True)
    result = {
        "command": " ".join(["python", "benchmarks/research/fit_rule_ablation.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "draws": args.draws,
        "f1_tolerance": f1_tolerance,
        "f1_z": args.f1_z,
        "pairs": pairs,
    }
    write_results(result, args.out, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
