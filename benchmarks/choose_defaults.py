"""Choose the default Semantic Softmax method by measurement, do-no-harm first.

Run on demand; reads the forward passes ``semsoft eval`` keeps (run ``semsoft eval
--model M --dataset D --limit N`` first, or ``--collect`` here). For every (model, data
set) pair the items are split in two fixed halves: a *tune* half, on which one method
for all pairs is chosen, and a *report* half, on which everything printed is measured.
The held-out splits the project is checked on are not available here; the report half
stands in for them.

Candidates are label-free: a :class:`SemsoftConfig` (the paper's formula, the previous
default that shares every kept token's mass out, and the residual forms with a fixed
or a model-derived threshold), each alone or followed by batch calibration (Zhou et
al., 2024) or contextual calibration (Zhao et al., 2021) of its own scores.

Choice rule (the do-no-harm rule of the no-harm issue): on every tune half, against
``constrained``, NLL and ECE at most +0.01, macro-F1 and AUROC at least -0.01; among the
candidates that pass everywhere, the lowest mean NLL relative to ``constrained``; if
none passes, the one whose worst overshoot of those bounds is smallest (ties broken by
the smallest total overshoot over all pairs and metrics, then by the mean NLL). A candidate
that wins on one pair and harms another is not a default. Two choices are made: the
best of all candidates, and the best *per item* (no batch, no content-free passes:
what an engine can apply to a single request).

Also measured (the mechanism): the share of the top-K mass on tokens with no clear label
neighbour (best centred cosine below 0.1 / 0.2, a label's own tokens excluded), and what
each method does on the items where ``constrained`` was right and confident (p >= 0.9).

Usage::

    python benchmarks/choose_defaults.py --collect --models default,qwen2.5-coder-1.5b \\
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
from semsoft_eval.tune import grid_probs
from semsoft_plugin import models
from semsoft_plugin.calibration import batch_calibrate
from semsoft_plugin.config import SemsoftConfig
from semsoft_plugin.embeddings import from_checkpoint
from semsoft_plugin.labels import LabelSet

# Allowed difference vs constrained: the issue's bounds, and AUROC not lower (its
# GoEmotions/Ekman target) by more than 0.01, so a default cannot buy NLL with ranking.
HARM = {"nll": 0.01, "ece": 0.01, "macro_f1": -0.01, "auroc": -0.01}
K = 50

# name -> (config, auto_variants): the label set's automatic capitalised/upper-case
# spellings as own tokens (on in the first releases, off now) is a candidate too.
CANDIDATES: dict[str, tuple[SemsoftConfig, bool]] = {
    "paper": (SemsoftConfig.paper(k=K), False),
    "shared": (SemsoftConfig.shared_votes(k=K), True),  # the first default
    **{
        f"residual tau={t} a={a}{' +variants' if v else ''}": (
            SemsoftConfig(k=K, tau=t, residual=True, semantic_weight=a),
            v,
        )
        for t in (0.0, 0.2)
        for a in (0.3, 0.5, 0.7, 1.0)
        for v in (False, True)
    },
    **{
        f"residual q={q} a={a}": (
            SemsoftConfig(k=K, residual=True, tau_quantile=q, semantic_weight=a),
            False,
        )
        for q in (0.99,)
        for a in (0.5, 1.0)
    },
}
CONFIGS = {name: config for name, (config, _) in CANDIDATES.items()}
POSTS = ("", "batch", "contextual")


def load_pair(model: str, dataset: str, limit: int, seed: int, collect: bool) -> dict[str, Any]:
    from transformers import AutoTokenizer

    model_dir = models.resolve(model)
    data = sample(load_builtin(dataset), limit, seed)
    template = TEMPLATES[data.task]
    path = cache_path(
        models.cache_dir() / "eval", model_dir, data.texts, data.labels, template.to_dict(), STORE_K
    )
    if not path.is_file():
        if not collect:
            raise SystemExit(f"no kept forward passes for {model} {dataset} {limit} ({path})")
        from semsoft_eval.evaluate import prepare

        prepare(model, dataset, limit=limit, seed=seed, sequence=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return {
        "forward": Forward.load(path),
        "embeddings": from_checkpoint(model_dir),
        "labels": LabelSet(data.labels, tokenizer),
        "tokenizer": tokenizer,
        "data": data,
    }


def _constrained(values: torch.Tensor, n_labels: int) -> np.ndarray:
    return torch.softmax(values[:, :n_labels].double(), -1).numpy()


def candidate_probs(pair: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every candidate's ``[N, L]`` probabilities, and the label-free baselines'."""
    forward, labels = pair["forward"], pair["labels"]
    constrained = _constrained(forward.label_logits, len(labels))
    out = {
        "constrained": constrained,
        "contextual": calibrate.contextual(
            constrained, _constrained(forward.cf_label_logits, len(labels))
        ),
        "batch": batch_calibrate(constrained),
    }
    for variants in (False, True):
        names = [n for n, (_, v) in CANDIDATES.items() if v == variants]
        label_set = LabelSet(list(labels.names), pair["tokenizer"], auto_variants=variants)
        configs = [CONFIGS[n] for n in names]
        probs, _ = grid_probs(forward, pair["embeddings"], label_set, configs)
        cf_probs, _ = grid_probs(forward.content_free(), pair["embeddings"], label_set, configs)
        for i, name in enumerate(names):
            out[name] = probs[i]
            out[f"{name} + batch"] = batch_calibrate(probs[i])
            out[f"{name} + contextual"] = calibrate.contextual(probs[i], cf_probs[i])
    return out


def mechanism(pair: dict[str, Any], probs: dict[str, np.ndarray], chosen: str) -> dict[str, Any]:
    """Where the top-K mass goes, and what happens to right, confident items."""
    forward, labels, emb = pair["forward"], pair["labels"], pair["embeddings"]
    tokens = labels.label_tokens
    top_ids = forward.top_ids[:, :K]
    p = torch.softmax(forward.top_logits[:, :K].double(), -1)  # shares of the top-K mass
    label_rows = emb.unit_rows(torch.tensor(tokens.anchors), center=True)
    best = (emb.unit_rows(top_ids, center=True) @ label_rows.T).amax(-1).double()
    own = torch.isin(top_ids, torch.tensor([t for o in tokens.own_token_ids for t in o]))
    out: dict[str, Any] = {"own_token_share": float((p * own).sum(-1).mean())}
    for cut in (0.1, 0.2):
        far = (best < cut) & ~own
        out[f"share_best_cos_below_{cut}"] = float((p * far).sum(-1).mean())
    y = pair["data"].targets
    rows = np.arange(len(y))
    con = probs["constrained"]
    sure = (con.argmax(1) == y) & (con[rows, y] >= 0.9)
    out["n_right_and_confident"] = int(sure.sum())
    if sure.any():
        for name in ("constrained", "shared", chosen):
            q = probs[name]
            out[f"p_true_on_confident[{name}]"] = float(q[rows, y][sure].mean())
            out[f"flipped_on_confident[{name}]"] = float((q.argmax(1) != y)[sure].mean())
    return out


def _scores(p: np.ndarray, y: np.ndarray) -> dict[str, float]:
    m = metrics.classification_metrics(p, y)
    return {k: m[k] for k in ("accuracy", "macro_f1", "ece", "brier", "nll", "auroc")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,qwen2.5-coder-1.5b")
    parser.add_argument("--sets", default="goemotions:600,ekman:400,sst2:400,davidson:400")
    parser.add_argument(
        "--pairs",
        help="model/dataset:limit,... instead of every --models x --sets pair "
        "(e.g. default/sst2:400,qwen2.5-coder-1.5b/sst2:200)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the sample seed semsoft eval used")
    parser.add_argument("--split-seed", type=int, default=1)
    parser.add_argument("--collect", action="store_true", help="run missing forward passes")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--out", default="defaults.json")
    args = parser.parse_args()

    wanted = (
        [tuple(p.replace("/", ":").split(":")) for p in args.pairs.split(",")]
        if args.pairs
        else [(m, *s.split(":")) for m in args.models.split(",") for s in args.sets.split(",")]
    )
    pairs: dict[str, dict[str, Any]] = {}
    for model, dataset, limit in wanted:
        try:
            pair = load_pair(model, dataset, int(limit), args.seed, args.collect)
        except SystemExit as missing:
            print(missing)
            continue
        start = time.perf_counter()
        pair["probs"] = candidate_probs(pair)
        y = pair["data"].targets
        half = calibrate.folds(len(y), 2, args.split_seed)
        pair["tune"], pair["report"] = half == 0, half == 1
        pairs[f"{model}/{dataset}"] = pair
        print(f"{model}/{dataset}: scored in {time.perf_counter() - start:.0f} s", flush=True)

    candidates = [n for n in next(iter(pairs.values()))["probs"] if n not in ("constrained",)]
    label_free = [n for n in candidates if n not in ("contextual", "batch")]
    # Tune halves: differences against constrained, per candidate and pair.
    tune: dict[str, dict[str, dict[str, float]]] = {}
    for key, pair in pairs.items():
        m, y = pair["tune"], pair["data"].targets[pair["tune"]]
        base = _scores(pair["probs"]["constrained"][m], y)
        tune[key] = {}
        for name in candidates:
            s = _scores(pair["probs"][name][m], y)
            tune[key][name] = {
                **{f"d_{k}": s[k] - base[k] for k in HARM},
                "rel_nll": s["nll"] / base["nll"],
            }

    def overshoots(name: str) -> list[float]:
        """How far each tune half and metric exceeds its harm bound (0 where within)."""
        return [
            max(
                0.0,
                t[name][f"d_{metric}"] - bound if bound > 0 else bound - t[name][f"d_{metric}"],
            )
            for t in tune.values()
            for metric, bound in HARM.items()
        ]

    def excess(name: str) -> float:
        """The worst overshoot of a harm bound over the tune halves (0: harmless)."""
        return max(overshoots(name))

    def total_excess(name: str) -> float:
        return float(sum(overshoots(name)))

    mean_rel = {n: float(np.mean([t[n]["rel_nll"] for t in tune.values()])) for n in candidates}
    passing = [n for n in label_free if excess(n) == 0.0]

    def pick(names: list[str]) -> str:
        # Do no harm first: the least worst-case harm; overshoots within 0.001 of the least
        # are a tie, broken by the least total harm over every pair and metric (so a harm
        # all candidates share does not hide the others'), then the lowest mean relative NLL.
        least = min(excess(n) for n in names)
        tied = [n for n in names if excess(n) <= least + 1e-3]
        fewest = min(total_excess(n) for n in tied)
        tied = [n for n in tied if total_excess(n) <= fewest + 1e-3]
        return min(tied, key=mean_rel.__getitem__)

    chosen = pick(label_free)
    # The best per-item method (what an engine applies to one request, with no batch).
    chosen_item = pick([n for n in label_free if " + " not in n])

    shown = list(
        dict.fromkeys(
            [
                "constrained",
                "prior",
                "temperature",
                "contextual",
                "batch",
                "paper",
                "shared",
                chosen_item,
                f"{chosen_item} + batch",
                f"{chosen_item} + contextual",
                chosen,
            ]
        )
    )
    per_pair: dict[str, Any] = {}
    for key, pair in pairs.items():
        y, tune_m, rep_m = pair["data"].targets, pair["tune"], pair["report"]
        probs = dict(pair["probs"])
        log_con = np.log(np.clip(probs["constrained"], 1e-12, 1))
        probs["temperature"] = calibrate.apply_temperature(
            log_con, calibrate.fit_temperature(log_con[tune_m], y[tune_m])
        )
        prior = np.bincount(y[tune_m], minlength=len(pair["labels"])) + 1.0
        probs["prior"] = np.tile(prior / prior.sum(), (len(y), 1))
        rows = {}
        for name in shown:
            p = probs[name][rep_m]
            row: dict[str, Any] = _scores(p, y[rep_m])
            if pair["data"].soft is not None:
                row.update(metrics.soft_label_metrics(p, pair["data"].soft[rep_m]))
            if name != "constrained":
                row["vs_constrained"] = metrics.bootstrap_difference(
                    p, probs["constrained"][rep_m], y[rep_m], n_resamples=args.bootstrap
                )
            rows[name] = row
        per_pair[key] = {
            "n_report": int(rep_m.sum()),
            "methods": rows,
            "mechanism": mechanism(pair, pair["probs"], chosen_item),
        }
    result = {
        "chosen": chosen,
        "chosen_per_item": chosen_item,
        "configs": {n: {**c.to_dict(), "auto_variants": v} for n, (c, v) in CANDIDATES.items()},
        "harmless_on_every_tune_half": passing,
        "worst_excess": {n: excess(n) for n in label_free},
        "total_excess": {n: total_excess(n) for n in label_free},
        "tune_mean_rel_nll": dict(sorted(mean_rel.items(), key=lambda kv: kv[1])),
        "tune": tune,
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
    lines = [
        f"chosen (batch allowed): {result['chosen']}; chosen per item: {result['chosen_per_item']}",
        f"harmless on every tune half: {', '.join(result['harmless_on_every_tune_half']) or 'none'}",
        "",
        "| model / data | method | acc | macro-F1 | ECE | Brier | NLL | AUROC | ΔNLL [95%] | ΔECE [95%] | ΔF1 [95%] |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, pair in result["pairs"].items():
        for i, (name, row) in enumerate(pair["methods"].items()):
            cmp = row.get("vs_constrained", {})
            label = f"{key} (n={pair['n_report']})" if i == 0 else ""
            lines.append(
                f"| {label} | {name} | {_f(row['accuracy'])} | {_f(row['macro_f1'])} | "
                f"{_f(row['ece'])} | {_f(row['brier'])} | {_f(row['nll'])} | {_f(row['auroc'])} | "
                f"{_d(cmp, 'nll')} | {_d(cmp, 'ece')} | {_d(cmp, 'macro_f1')} |"
            )
    lines += ["", "| pair | mechanism |", "|---|---|"]
    for key, pair in result["pairs"].items():
        mech = ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
            for k, v in pair["mechanism"].items()
        )
        lines.append(f"| {key} | {mech} |")
    lines += ["", "| candidate | tune mean NLL / constrained |", "|---|---|"]
    for name, value in list(result["tune_mean_rel_nll"].items())[:15]:
        lines.append(f"| {name} | {value:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
