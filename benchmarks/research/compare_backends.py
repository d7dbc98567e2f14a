"""``semsoft eval`` on both backends, same items: do the reports agree, and at what cost?

Runs :func:`semsoft_eval.evaluate.evaluate` with ``backend="hf"`` and ``backend="vllm"``
on one fixed sample (no cache, so both do their forward passes) and prints, per method,
each metric on both engines and the largest difference, plus the seconds per item of
each backend's forward passes. Both engines load the checkpoint in its own dtype (bf16
for the default model), where the two engines' kernels round differently; pass
``--dtype float32`` to see the adapters agree to the kernels' order of summation.

Usage::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=2 OMP_NUM_THREADS=2 \\
        python benchmarks/research/compare_backends.py --dataset sst2 --limit 200 --out backends.json
"""

from __future__ import annotations

import argparse
from typing import Any

from semsoft_eval.benchmarking import report, sample_parser
from semsoft_eval.evaluate import evaluate
from semsoft_eval.methods import DEFAULT_METHODS
from semsoft_eval.report import METRIC_COLUMNS
from semsoft_plugin.engines import models


def run(args: argparse.Namespace) -> dict[str, Any]:
    common = dict(
        methods=DEFAULT_METHODS,
        limit=args.limit,
        seed=args.seed,
        n_bootstrap=0,
        cache_dir="",
        progress=False,
    )
    hf_model = models.load(args.model, dtype=args.dtype)
    hf = evaluate(args.model, args.dataset, loaded=hf_model, **common)
    del hf_model
    engine_args = {"dtype": args.dtype, "max_model_len": 2048}
    from vllm.platforms import current_platform

    if current_platform.is_cpu() or args.eager:  # no graphs to capture on CPU
        engine_args["enforce_eager"] = True
    vllm = evaluate(args.model, args.dataset, backend="vllm", engine_args=engine_args, **common)
    rows = []
    for method in DEFAULT_METHODS:
        a, b = hf["methods"][method], vllm["methods"][method]
        diffs = [
            abs(a[m] - b[m])
            for m in METRIC_COLUMNS
            if a.get(m) is not None and b.get(m) is not None
        ]
        rows.append(
            {
                "method": method,
                "hf": {m: a.get(m) for m in METRIC_COLUMNS},
                "vllm": {m: b.get(m) for m in METRIC_COLUMNS},
                "max_abs_metric_diff": max(diffs) if diffs else None,
            }
        )
    return {
        "dataset": args.dataset,
        "model": args.model,
        "dtype": args.dtype,
        "n": hf["run"]["n"],
        "seconds_per_item": {
            "hf": hf["run"]["seconds_per_item"],
            "vllm": vllm["run"]["seconds_per_item"],
        },
        "cache_check_max_abs_diff": {
            "hf": hf["run"]["cache_check_max_abs_diff"],
            "vllm": vllm["run"]["cache_check_max_abs_diff"],
        },
        "methods": rows,
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"{result['dataset']}, n={result['n']}, {result['model']} ({result['dtype']}); "
        f"forward s/item hf {result['seconds_per_item']['hf']:.3f}, "
        f"vllm {result['seconds_per_item']['vllm']:.3f}"
    )
    print("| method | ECE hf | ECE vllm | NLL hf | NLL vllm | acc hf | acc vllm | max |Δ| |")
    print("|---|---|---|---|---|---|---|---|")
    for row in result["methods"]:
        h, v = row["hf"], row["vllm"]
        print(
            f"| {row['method']} | {h['ece']:.3f} | {v['ece']:.3f} | {h['nll']:.3f} | "
            f"{v['nll']:.3f} | {h['accuracy']:.3f} | {v['accuracy']:.3f} | "
            f"{row['max_abs_metric_diff']:.4f} |"
        )


def main() -> None:
    parser = sample_parser(__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--eager", action="store_true", help="enforce_eager on GPU too")
    args = parser.parse_args()
    report(run(args), args.out, print_table)


if __name__ == "__main__":
    main()
