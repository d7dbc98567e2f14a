"""Does the fit's macro-F1 guard read what new items show? Per draw of labels, each
decision-changing member's out-of-fold macro-F1 change (what the guard reads,
`semsoft_plugin.fit.f1_guard.f1_change`, with its bootstrap standard error) beside the
change the same member, fitted on all the labelled items, makes on the rest of the set.

The pairs and draws are `benchmarks/research/probe_curve.py`'s (the same kept passes, sizes and
seeds). Reported per pair and member: the mean of both changes over the draws, their
correlation, on how many draws the member lost macro-F1 on the test items, and on how many
of those the guard (point estimate, and the shipped bound) would have passed it.

Usage::

    python benchmarks/research/guard_evidence.py \\
        --pairs qwen2.5-coder-1.5b/ekman:300,qwen2.5-coder-1.5b/goemotions:300 \\
        --out benchmarks/results/guard-evidence.json
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import Any

import numpy as np
from probe_curve import SIZES, pair_arrays  # the same sizes, draws and arrays

from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.fit import f1_guard, fitting
from semsoft_plugin.fit.label_offsets import MEMBERS, apply_offset, fit_member
from semsoft_plugin.fit.probe import fit_probe

CHANGING = (*MEMBERS, "probe")  # the members that move decisions
RULE = FitPolicy()  # the shipped rule: its guard's z and tolerance are what is judged


def pair_evidence(pair: dict[str, Any], *, sizes: tuple[int, ...], draws: int,
                  seed: int) -> dict[str, Any]:  # fmt: skip
    """Per member: each draw's out-of-fold change, its standard error and its test change
    (the whole family fitted under the shipped rule, `RULE`, its folds drawn by `seed`)."""
    policy = RULE.set_params(family=fitting.FAMILY, random_state=seed)
    a = pair_arrays(pair, seed)
    y, n_labels, grid, start, single = a["y"], a["n_labels"], a["grid"], a["start"], a["single"]
    content_free, hidden = a["content_free"], a["hidden"]
    rows, member = a["logit_rows"], a["member"]
    base = np.log(np.clip(grid[single["temperature"]], 1e-30, 1.0))
    records: dict[str, list[dict[str, float]]] = {m: [] for m in CHANGING}
    for size in sizes:
        for draw in range(draws):
            order = np.random.default_rng([seed, size, draw]).permutation(len(y))
            train, test = order[:size], order[size:]
            if len(np.unique(y[train])) < 2:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # rare labels: unstratified folds
                _, _, _, stats = fitting.fit_probs(
                    grid[:, train], start[train], y[train], single=single, policy=policy,
                    content_free=content_free, external={"probe": member}, rows=train,
                )  # fmt: skip
                tested = {
                    name: apply_offset(base[test], *fit_member(
                        name, base[train], y[train], content_free=content_free, seed=seed))
                    for name in MEMBERS
                }  # fmt: skip
                probe = fit_probe(hidden[train], y[train], n_labels, label_rows=rows, seed=seed)
                tested["probe"] = probe.probs(hidden[test])
            held = np.bincount(y[test], minlength=n_labels) > 0  # as the guard averages
            default_f1 = f1_guard.macro_f1(y[test], start[test].argmax(1), n_labels, labels=held)
            for name in CHANGING:
                checked = stats["procedures"][name]
                chosen = tested[name].argmax(1)
                test_change = f1_guard.macro_f1(y[test], chosen, n_labels, labels=held) - default_f1
                records[name].append({"size": size, "draw": draw,
                                      "out_of_fold": checked["f1_change"],
                                      "se": checked["f1_change_se"], "test": test_change})  # fmt: skip
    return {name: _summary(rows_) for name, rows_ in records.items()}


def _summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    oof = np.array([r["out_of_fold"] for r in rows])
    se = np.array([r["se"] for r in rows])
    test = np.array([r["test"] for r in rows])
    tolerance = RULE.f1_tolerance
    lost = test < -tolerance
    point = oof >= -tolerance
    bound = oof - RULE.f1_z * se >= -tolerance
    return {
        "draws": len(rows),
        "out_of_fold_mean": float(oof.mean()),
        "test_mean": float(test.mean()),
        "correlation": float(np.corrcoef(oof, test)[0, 1]) if len(rows) > 2 else None,
        "test_lost": int(lost.sum()),
        "lost_but_point_estimate_passes": int((lost & point).sum()),
        "lost_but_bound_passes": int((lost & bound).sum()),
        "rows": rows,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Command: `{result['command']}` ({result['date']})",
        "",
        "Kept passes: bf16 weights, float32 output head. Per draw of labels (sizes "
        f"{result['sizes']}, {result['draws']} draws each), each member's out-of-fold "
        "macro-F1 change over the default (what the guard reads) against the change it "
        f"makes on the rest of the set. `lost`: draws where the test change is below "
        f"-{result['f1_tolerance']}; `point passes` / `bound passes`: of those, the draws "
        f"the guard's point estimate / its bound at {result['f1_z']:g} standard errors "
        "would have passed.",
        "",
        "| pair | member | draws | out-of-fold mean | test mean | correlation | lost | "
        "point passes | bound passes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, members in result["pairs"].items():
        for name, s in members.items():
            corr = "n/a" if s["correlation"] is None else f"{s['correlation']:+.2f}"
            lines.append(
                f"| {key} | {name} | {s['draws']} | {s['out_of_fold_mean']:+.3f} | "
                f"{s['test_mean']:+.3f} | {corr} | {s['test_lost']} | "
                f"{s['lost_but_point_estimate_passes']} | {s['lost_but_bound_passes']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    from semsoft_eval.benchmarking import load_pair, split_pair, write_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pairs",
        default="qwen2.5-coder-1.5b/ekman:300,qwen2.5-coder-1.5b/goemotions:300",
        help="model/data set:items, comma-separated",
    )
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="the sample seed semsoft eval used")
    parser.add_argument("--out", default="benchmarks/results/guard-evidence.json")
    args = parser.parse_args()
    sizes = tuple(int(v) for v in args.sizes.split(","))
    pairs: dict[str, Any] = {}
    for spec in args.pairs.split(","):
        model, dataset, limit = split_pair(spec)
        pair = load_pair(model, dataset, limit, args.seed, collect=False)
        name = f"{model}/{dataset}"
        pairs[name] = pair_evidence(pair, sizes=sizes, draws=args.draws, seed=args.seed)
        print(f"{name} done", flush=True)
    result = {
        "command": " ".join(["python", "benchmarks/research/guard_evidence.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "sizes": list(sizes),
        "draws": args.draws,
        "f1_z": RULE.f1_z,
        "f1_tolerance": RULE.f1_tolerance,
        "pairs": pairs,
    }
    write_results(result, args.out, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
