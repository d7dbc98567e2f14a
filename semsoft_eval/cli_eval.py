"""``semsoft eval`` and ``semsoft tune`` subcommands (registered by ``semsoft_plugin.cli``).

User errors raise ``ValueError``; the ``semsoft`` command prints them as one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from semsoft_plugin.cli import json_object as _json_object

__all__ = ["add_eval_parser", "add_tune_parser", "run_eval", "run_tune"]


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument(
        "--dataset", help="built-in: goemotions, ekman, davidson, sst2; or a name for --data-file"
    )
    group.add_argument(
        "--data-file", help="GoEmotions TSV (with --labels-file) or a CSV/TSV/JSONL file"
    )
    group.add_argument("--labels-file", help="GoEmotions labels file (one label per line)")
    group.add_argument("--text-column", default="text", help="text column of a CSV/TSV/JSONL file")
    group.add_argument("--label-column", help="hard label column")
    group.add_argument(
        "--prob-column",
        help="binary soft label column: the raters' fraction for the positive label",
    )
    group.add_argument(
        "--labels", help="comma-separated labels (with --prob-column: negative,positive)"
    )
    group.add_argument(
        "--any-gold",
        action="store_true",
        help="GoEmotions: keep multi-label items; any gold label counts as right",
    )
    group.add_argument("--limit", type=int, help="a fixed random sample of N items")
    group.add_argument("--seed", type=int, default=0, help="sampling and fold seed")
    parser.add_argument(
        "--model", default="default", help="'default', 'qwen2.5-coder-1.5b' or a checkpoint dir"
    )
    parser.add_argument(
        "--prompt-file", help="JSON prompt template (keys user, answer_prefix, system)"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--cache-dir", help="where forward passes are kept (default <semsoft cache>/eval)"
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="neither read nor write kept forward passes"
    )
    from semsoft_eval.evaluate import BACKENDS

    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="hf",
        help="engine that runs the forward passes: transformers or vLLM (with the plugin)",
    )
    parser.add_argument(
        "--engine-args",
        type=_json_object,
        help="vLLM engine arguments as JSON, e.g. '{\"tensor_parallel_size\": 4}'",
    )


def _data_options(args: argparse.Namespace) -> dict[str, Any]:
    labels = None
    if args.labels:
        labels = [label.strip() for label in args.labels.split(",")]
        if any(not label for label in labels):
            raise ValueError(f"--labels {args.labels!r} has an empty label")
    return {
        "data_file": args.data_file,
        "labels_file": args.labels_file,
        "text_column": args.text_column,
        "label_column": args.label_column,
        "prob_column": args.prob_column,
        "labels": labels,
        "any_gold": args.any_gold,
    }


def _template(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from semsoft_eval.prompts import load_template

    return load_template(args.prompt_file) if args.prompt_file else None


def _config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from semsoft_plugin.config import SemsoftConfig

    config = SemsoftConfig.load(args.config) if args.config else SemsoftConfig()
    return config.replace(k=args.k, tau=args.tau)


def _cache_dir(args: argparse.Namespace) -> str | None:
    return "" if args.no_cache else args.cache_dir


def add_eval_parser(subparsers: Any) -> None:
    """Register ``semsoft eval``."""
    from semsoft_eval.evaluate import ALL_METHODS, DEFAULT_METHODS

    parser = subparsers.add_parser(
        "eval",
        help="compare calibration methods on labelled data",
        description="Evaluate Semantic Softmax against the baselines on the same forward passes: "
        "accuracy, macro-F1, ECE (15 bins, top label), Brier (sum over classes), NLL, AUROC "
        "(macro one-vs-rest), AUROC2, bootstrap intervals against constrained.",
    )
    _add_data_arguments(parser)
    parser.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help=f"comma separated, from: {', '.join(ALL_METHODS)}",
    )
    parser.add_argument(
        "--config", help="SemsoftConfig JSON for 'semantic' (e.g. from semsoft tune)"
    )
    parser.add_argument("--k", type=int, help="override the config's k")
    parser.add_argument("--tau", type=float, help="override the config's tau")
    parser.add_argument("--paper-k", type=int, default=50, help="k of semantic-paper")
    parser.add_argument("--paper-tau", type=float, default=0.0, help="tau of semantic-paper")
    parser.add_argument(
        "--folds", type=int, default=2, help="folds for the methods fitted on held data"
    )
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (0: none)")
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--plot", help="write reliability diagrams (PNG) here")
    parser.add_argument("--markdown", help="also write the Markdown table here")
    parser.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from semsoft_eval.evaluate import evaluate, format_markdown, write_report

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    report = evaluate(
        args.model,
        args.dataset,
        methods=methods,
        config=_config(args),
        paper_k=args.paper_k,
        paper_tau=args.paper_tau,
        limit=args.limit,
        seed=args.seed,
        template=_template(args),
        batch_size=args.batch_size,
        n_folds=args.folds,
        n_bootstrap=args.bootstrap,
        cache_dir=_cache_dir(args),
        backend=args.backend,
        engine_args=args.engine_args,
        plot=args.plot,
        **_data_options(args),
    )
    table = format_markdown(report)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    if args.out:
        write_report(report, args.out)
        print(f"report written to {args.out}", file=sys.stderr)
    return 0


def _float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of numbers"
        ) from None


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None


def _bool_list(text: str) -> tuple[bool, ...]:
    values = {"true": True, "false": False, "1": True, "0": False}
    try:
        return tuple(values[x.strip().lower()] for x in text.split(","))
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of true/false"
        ) from None


def add_tune_parser(subparsers: Any) -> None:
    """Register ``semsoft tune``."""
    from semsoft_eval.tune import DEFAULT_GRID

    parser = subparsers.add_parser(
        "tune",
        help="fit k, tau, centring and a temperature on labelled dev data",
        description="Choose Semantic Softmax settings by nested cross-validation (the printed figures "
        "are out of fold) and write them as a config file every adapter and 'eval' accept (--config).",
    )
    _add_data_arguments(parser)
    grid = parser.add_argument_group("grid (comma-separated values)")
    fmt = lambda values: ",".join(str(v).lower() for v in values)  # noqa: E731
    grid.add_argument(
        "--k", type=_int_list, default=DEFAULT_GRID["k"], help=f"default {fmt(DEFAULT_GRID['k'])}"
    )
    grid.add_argument(
        "--tau",
        type=_float_list,
        default=DEFAULT_GRID["tau"],
        help=f"default {fmt(DEFAULT_GRID['tau'])}",
    )
    grid.add_argument(
        "--center", type=_bool_list, default=DEFAULT_GRID["center"], help="default true,false"
    )
    grid.add_argument(
        "--own-vote", type=_bool_list, default=DEFAULT_GRID["own_vote"], help="default true,false"
    )
    grid.add_argument(
        "--normalize-votes",
        type=_bool_list,
        default=DEFAULT_GRID["normalize_votes"],
        help="default false,true",
    )
    parser.add_argument(
        "--objective", choices=("nll", "ece"), default="nll", help="what the choice minimises"
    )
    parser.add_argument(
        "--no-temperature", action="store_true", help="do not fit a final temperature"
    )
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds")
    parser.add_argument("--out", default="semsoft-config.json", help="the config file to write")
    parser.add_argument("--report", help="also write the full tuning report (JSON)")
    parser.set_defaults(func=run_tune)


def run_tune(args: argparse.Namespace) -> int:
    from semsoft_eval.tune import format_tune, tune_dataset

    grid = {
        "k": args.k,
        "tau": args.tau,
        "center": args.center,
        "own_vote": args.own_vote,
        "normalize_votes": args.normalize_votes,
    }
    result = tune_dataset(
        args.model,
        args.dataset,
        grid=grid,
        objective=args.objective,
        temperature=not args.no_temperature,
        n_folds=args.folds,
        limit=args.limit,
        seed=args.seed,
        template=_template(args),
        batch_size=args.batch_size,
        cache_dir=_cache_dir(args),
        backend=args.backend,
        engine_args=args.engine_args,
        **_data_options(args),
    )
    print(format_tune(result))
    result.config.save(args.out)
    print(f"config written to {args.out}", file=sys.stderr)
    if args.report:
        Path(args.report).write_text(json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n")
    return 0
