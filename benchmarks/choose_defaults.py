"""Choose the default SemsoftConfig by measurement (run on demand; reads kept forward passes).

For every (model, data set) pair whose forward passes ``semsoft eval`` has kept (run
``semsoft eval --model M --dataset D --limit N`` first), the items are split in two
fixed halves: a *tune* half, on which one configuration for all pairs is chosen, and a
*report* half, on which everything printed is measured. The held-out splits the
project is checked on are not available here; the report half stands in for them.

Choice rule: among the grid, the configuration with the lowest mean NLL relative to
``constrained`` over the tune halves, among those no worse than ``constrained`` in NLL
and ECE on any tune half (do no harm); if none qualifies, the lowest mean relative NLL.

Also measured, on the report halves: each hypothesis (own_vote, center,
normalize_votes) as the best configuration with that switch fixed; the best tau per
pair beside the label-label cosines; and Semantic Softmax plus a temperature fitted on
the tune half against temperature scaling fitted on the same half.

Usage::

    python benchmarks/choose_defaults.py --models default,qwen2.5-coder-1.5b \\
        --sets goemotions:600,ekman:400,sst2:400,davidson:400 --out defaults.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from semsoft_eval import calibrate, metrics
from semsoft_eval.data import load_builtin, sample
from semsoft_eval.forward import STORE_K, Forward, cache_path
from semsoft_eval.prompts import TEMPLATES
from semsoft_eval.tune import DEFAULT_GRID, grid_configs, grid_probs, label_cosines
from semsoft_plugin import models
from semsoft_plugin.config import SemsoftConfig
from semsoft_plugin.embeddings import from_checkpoint
from semsoft_plugin.labels import LabelSet

EPS = 1e-12


def _nll(p: np.ndarray, y: np.ndarray) -> float:
    return float(-np.log(np.clip(p[np.arange(len(y)), y], EPS, 1)).mean())


def _ece(p: np.ndarray, y: np.ndarray) -> float:
    return float(metrics.ece_numpy(p.max(1), p.argmax(1) == y))


def load_pair(model: str, dataset: str, limit: int, seed: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    model_dir = models.resolve(model)
    data = sample(load_builtin(dataset), limit, seed)
    template = TEMPLATES[data.task]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    labels = LabelSet(data.labels, tokenizer)
    path = cache_path(
        models.cache_dir() / "eval", model_dir, data.texts, data.labels, template.to_dict(), STORE_K
    )
    if not path.is_file():
        raise SystemExit(
            f"no kept forward passes for {model} {dataset} {limit}: run semsoft eval first ({path})"
        )
    return {
        "forward": Forward.load(path),
        "embeddings": from_checkpoint(model_dir),
        "labels": labels,
        "data": data,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,qwen2.5-coder-1.5b")
    parser.add_argument("--sets", default="goemotions:600,ekman:400,sst2:400,davidson:400")
    parser.add_argument("--seed", type=int, default=0, help="the sample seed semsoft eval used")
    parser.add_argument("--split-seed", type=int, default=1)
    parser.add_argument("--out", default="defaults.json")
    parser.add_argument(
        "--k", default="20,50,100", help="k values of the grid (the rest is tune's grid)"
    )
    args = parser.parse_args()

    configs = grid_configs({**DEFAULT_GRID, "k": tuple(int(k) for k in args.k.split(","))})
    pairs: dict[str, dict[str, Any]] = {}
    for model in args.models.split(","):
        for spec in args.sets.split(","):
            dataset, limit = spec.split(":")
            try:
                pair = load_pair(model, dataset, int(limit), args.seed)
            except SystemExit as missing:
                print(missing)
                continue
            start = time.perf_counter()
            probs, fallback = grid_probs(
                pair["forward"], pair["embeddings"], pair["labels"], configs
            )
            pair["grid"], pair["fallback"] = probs, fallback
            y = pair["data"].targets
            half = calibrate.folds(len(y), 2, args.split_seed)
            pair["tune"], pair["report"] = half == 0, half == 1
            constrained = torch.softmax(
                pair["forward"].label_logits[:, : len(pair["labels"])].double(), -1
            ).numpy()
            pair["constrained"] = constrained
            pair["cos"] = {
                c: label_cosines(pair["embeddings"], pair["labels"], center=c)
                for c in (True, False)
            }
            key = f"{model}/{dataset}"
            pairs[key] = pair
            print(
                f"{key}: grid of {len(configs)} scored in {time.perf_counter() - start:.0f} s",
                flush=True,
            )

    # Relative NLL/ECE against constrained, per pair, per config, on each half.
    rel: dict[str, dict[str, np.ndarray]] = {}
    for key, pair in pairs.items():
        y = pair["data"].targets
        rel[key] = {}
        for part in ("tune", "report"):
            m = pair[part]
            base_nll, base_ece = (
                _nll(pair["constrained"][m], y[m]),
                _ece(pair["constrained"][m], y[m]),
            )
            rel[key][f"{part}_nll"] = np.array([_nll(p[m], y[m]) for p in pair["grid"]]) / base_nll
            rel[key][f"{part}_ece_diff"] = (
                np.array([_ece(p[m], y[m]) for p in pair["grid"]]) - base_ece
            )
    keys = list(pairs)
    tune_nll = np.mean([rel[k]["tune_nll"] for k in keys], 0)
    harmless = np.all(
        [(rel[k]["tune_nll"] <= 1.0) & (rel[k]["tune_ece_diff"] <= 0.0) for k in keys], 0
    )
    candidates = np.flatnonzero(harmless) if harmless.any() else np.arange(len(configs))
    chosen = int(candidates[np.argmin(tune_nll[candidates])])

    def best_with(**fixed: Any) -> int:
        ok = [i for i, c in enumerate(configs) if all(getattr(c, f) == v for f, v in fixed.items())]
        return ok[int(np.argmin(tune_nll[ok]))]

    hypotheses = {}
    for switch in ("own_vote", "center", "normalize_votes"):
        for value in (True, False):
            i = best_with(**{switch: value})
            hypotheses[f"{switch}={value}"] = {
                "config": configs[i].to_dict(),
                "tune_rel_nll": float(tune_nll[i]),
                "report_rel_nll": float(np.mean([rel[k]["report_nll"][i] for k in keys])),
                "report_rel_nll_per_pair": {k: float(rel[k]["report_nll"][i]) for k in keys},
            }
    paper_i = [i for i, c in enumerate(configs) if c == SemsoftConfig.paper(k=50, tau=0.0)]
    default_i = [i for i, c in enumerate(configs) if c == SemsoftConfig()]

    per_pair = {}
    for key, pair in pairs.items():
        y, tune_m, rep_m = pair["data"].targets, pair["tune"], pair["report"]
        best_here = int(np.argmin([_nll(p[tune_m], y[tune_m]) for p in pair["grid"]]))
        log_sem = np.log(np.clip(pair["grid"][chosen], EPS, 1))
        t_sem = calibrate.fit_temperature(log_sem[tune_m], y[tune_m])
        log_con = np.log(np.clip(pair["constrained"], EPS, 1))
        t_con = calibrate.fit_temperature(log_con[tune_m], y[tune_m])
        # tune: config and temperature chosen on the tune half of this pair
        log_best = np.log(np.clip(pair["grid"][best_here], EPS, 1))
        t_best = calibrate.fit_temperature(log_best[tune_m], y[tune_m])
        prior = np.bincount(y[tune_m], minlength=len(pair["labels"])) + 1.0
        methods = {
            "constrained": pair["constrained"][rep_m],
            "semantic (chosen default)": pair["grid"][chosen][rep_m],
            "semantic (current default)": pair["grid"][default_i[0]][rep_m] if default_i else None,
            "semantic-paper": pair["grid"][paper_i[0]][rep_m] if paper_i else None,
            "temperature": calibrate.apply_temperature(log_con[rep_m], t_con),
            "semantic + temperature": calibrate.apply_temperature(log_sem[rep_m], t_sem),
            "tuned on this pair (config + temperature)": calibrate.apply_temperature(
                log_best[rep_m], t_best
            ),
            "prior": np.tile(prior / prior.sum(), (int(rep_m.sum()), 1)),
        }
        rows = {}
        for name, p in methods.items():
            if p is None:
                continue
            row: dict[str, Any] = metrics.classification_metrics(p, y[rep_m])
            if pair["data"].soft is not None:
                row.update(metrics.soft_label_metrics(p, pair["data"].soft[rep_m]))
            if name != "constrained":
                row["vs_constrained"] = metrics.bootstrap_difference(
                    p, methods["constrained"], y[rep_m]
                )
            rows[name] = row
        per_pair[key] = {
            "n_report": int(rep_m.sum()),
            "n_tune": int(tune_m.sum()),
            "methods": rows,
            "best_config_here": configs[best_here].to_dict(),
            "label_cosines": pair["cos"],
            "multi_token_labels": list(pair["labels"].multi_token_labels),
            "chosen_fallback_rate": float(pair["fallback"][chosen]),
            "temperature_on_chosen": t_sem,
        }
    result = {
        "chosen": configs[chosen].to_dict(),
        "chosen_is_harmless_on_tune_halves": bool(harmless[chosen]),
        "n_harmless_configs": int(harmless.sum()),
        "top10": [
            {"config": configs[i].to_dict(), "tune_rel_nll": float(tune_nll[i])}
            for i in np.argsort(tune_nll)[:10]
        ],
        "hypotheses": hypotheses,
        "pairs": per_pair,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    Path(args.out).write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    print(markdown(result))
    return 0


def _f(v: Any) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _d(cmp: dict[str, Any], metric: str) -> str:
    if metric not in cmp:
        return ""
    c = cmp[metric]
    return f"{c['diff']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]"


def markdown(result: dict[str, Any]) -> str:
    c = result["chosen"]
    lines = [
        f"chosen: k={c['k']} tau={c['tau']} center={c['center']} own_vote={c['own_vote']} "
        f"normalize_votes={c['normalize_votes']} (harmless on every tune half: {result['chosen_is_harmless_on_tune_halves']})",
        "",
        "| model / data | method | acc | macro-F1 | ECE | Brier | NLL | AUROC | ΔECE [95%] | ΔNLL [95%] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, pair in result["pairs"].items():
        for i, (name, row) in enumerate(pair["methods"].items()):
            cmp = row.get("vs_constrained", {})
            label = f"{key} (n={pair['n_report']})" if i == 0 else ""
            lines.append(
                f"| {label} | {name} | {_f(row['accuracy'])} | {_f(row['macro_f1'])} | {_f(row['ece'])} | "
                f"{_f(row['brier'])} | {_f(row['nll'])} | {_f(row['auroc'])} | {_d(cmp, 'ece')} | {_d(cmp, 'nll')} |"
            )
    lines += [
        "",
        "| hypothesis (best config with the switch fixed) | tune rel. NLL | report rel. NLL |",
        "|---|---|---|",
    ]
    for name, h in result["hypotheses"].items():
        lines.append(f"| {name} | {h['tune_rel_nll']:.3f} | {h['report_rel_nll']:.3f} |")
    lines += [
        "",
        "| pair | best config on its tune half | label-label cos (centred mean/max) | (raw mean/max) |",
        "|---|---|---|---|",
    ]
    for key, pair in result["pairs"].items():
        b = pair["best_config_here"]
        cc, cr = (
            pair["label_cosines"].get(k, pair["label_cosines"].get(str(k == "centred")))
            for k in ("centred", "raw")
        )
        lines.append(
            f"| {key} | k={b['k']} tau={b['tau']} center={b['center']} own={b['own_vote']} norm={b['normalize_votes']} | "
            f"{cc['mean']:.2f}/{cc['max']:.2f} | {cr['mean']:.2f}/{cr['max']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
