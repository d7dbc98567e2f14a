"""`semsoft eval` and `semsoft tune` subcommands (registered by `semsoft_plugin.app.cli`).

The Semantic Softmax flags are generated from [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig]'s
field table by `semsoft_plugin.app.config_args.add_config_arguments` (`own_vote` is
`--own-vote`, in `eval` an override of `--preset`/`--config`, in `tune` a grid axis
over the start config; `semsoft_eval.tune.DEFAULT_GRID` by default), so a flag and the
field it sets cannot drift apart. User errors raise `ValueError`; the `semsoft` command prints them
as one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from semsoft_plugin.app.cli import json_object as _json_object
from semsoft_plugin.app.config_args import (
    add_config_arguments,
    config_from_args,
    grid_from_args,
    start_from_args,
)
from semsoft_plugin.core.labels import LABELS_SYNTAX, split_labels

__all__ = ["add_eval_parser", "add_tune_parser", "run_eval", "run_tune"]


def _add_data_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument(
        "--dataset", help="built-in: goemotions, ekman, davidson, sst2; or a name for --input"
    )
    group.add_argument(
        "--input", help="GoEmotions TSV (with --labels-file) or a CSV/TSV/JSONL file"
    )
    group.add_argument("--labels-file", help="GoEmotions labels file (one label per line)")
    group.add_argument("--text-column", default="text", help="text column of a CSV/TSV/JSONL file")
    group.add_argument("--label-column", help="hard label column")
    group.add_argument(
        "--prob-column",
        help="binary soft label column: the raters' fraction for the positive label",
    )
    group.add_argument(
        "--labels", help=f"the labels (with --prob-column: negative,positive); {LABELS_SYNTAX}"
    )
    group.add_argument(
        "--any-gold",
        action="store_true",
        help="GoEmotions: keep multi-label items; any gold label counts as right",
    )
    group.add_argument("--limit", type=int, help="a fixed random sample of N items")
    group.add_argument("--seed", type=int, default=0, help="sampling and fold seed")
    parser.add_argument(
        "--model", default="default", help="'default' (= qwen2.5-coder-1.5b), 'qwen2.5-coder-0.5b', 'smollm2-135m' (small, for tests) or a checkpoint dir"
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
    from semsoft_eval.backends import ENGINES

    parser.add_argument(
        "--backend",
        type=_engine,
        choices=ENGINES,
        default="transformers",
        help="engine that runs the forward passes: transformers or vLLM (with the plugin)",
    )
    parser.add_argument(
        "--engine-args",
        type=_json_object,
        help="vLLM engine arguments as JSON, e.g. '{\"tensor_parallel_size\": 4}'",
    )


class _RenamedFlag(argparse.Action):
    """An old flag, hidden from `--help`: refused naming the new one."""

    RENAMED = {"--no-temperature": "--no-score-temperature"}

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        parser.error(f"{option}: renamed: use {self.RENAMED[str(option)]}")


def _engine(text: str) -> str:
    from semsoft_eval.backends import engine_name

    try:
        return engine_name(text, "--backend")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _data_options(args: argparse.Namespace) -> dict[str, Any]:
    labels = None
    if args.labels:
        labels = split_labels(args.labels, "--labels")
    return {
        "data_file": args.input,
        "labels_file": args.labels_file,
        "text_column": args.text_column,
        "label_column": args.label_column,
        "prob_column": args.prob_column,
        "labels": labels,
        "any_gold": args.any_gold,
    }


def _template(args: argparse.Namespace) -> Any:
    from semsoft_plugin.engines.prompting import load_template

    return load_template(args.prompt_file) if args.prompt_file else None


def _cache_dir(args: argparse.Namespace) -> str | None:
    return "" if args.no_cache else args.cache_dir


def add_eval_parser(subparsers: Any) -> None:
    """Register `semsoft eval`."""
    from semsoft_eval.methods import ALL_METHODS, DEFAULT_METHODS

    parser = subparsers.add_parser(
        "eval",
        allow_abbrev=False,  # one spelling per option: --out is not --output
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
    add_config_arguments(parser)  # the settings of the method 'semantic'
    parser.add_argument("--paper-k", type=int, default=50, help="k of semantic-paper")
    parser.add_argument("--paper-tau", type=float, default=0.0, help="tau of semantic-paper")
    parser.add_argument(
        "--n-folds", type=int, default=5, help="folds for the methods fitted on held data"
    )
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (0: none)")
    parser.add_argument("--output", help="write the JSON report here")
    parser.add_argument("--plot", help="write reliability diagrams (PNG) here")
    parser.add_argument("--markdown", help="also write the Markdown table here")
    parser.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from semsoft_eval.evaluate import evaluate
    from semsoft_eval.report import format_markdown, write_report

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    report = evaluate(
        args.model,
        args.dataset,
        methods=methods,
        config=config_from_args(args),
        paper_k=args.paper_k,
        paper_tau=args.paper_tau,
        limit=args.limit,
        seed=args.seed,
        template=_template(args),
        batch_size=args.batch_size,
        n_folds=args.n_folds,
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
    if args.output:
        write_report(report, args.output)
        print(f"report written to {args.output}", file=sys.stderr)
    return 0


# tune fits the score temperature: it is no grid axis.
_FITTED = ("score_temperature",)


def _name_list(text: str) -> tuple[str, ...]:
    """`a,b` -> `("a", "b")` (checked where used, each bad name refused by name)."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_tune_parser(subparsers: Any) -> None:
    """Register `semsoft tune`."""
    from semsoft_eval.tune import DEFAULT_GRID
    from semsoft_plugin.fit.fitting import FAMILY

    parser = subparsers.add_parser(
        "tune",
        allow_abbrev=False,
        help="fit the pool weight, a temperature, the bias corrections and a probe on a few "
        "labels (Classifier.fit)",
        description="Fit Semantic Softmax's settings on labelled items as Classifier.fit does (from "
        "--config or the default: the family of --fit-family, i.e. the pool weight over a grid "
        "with a final temperature, a temperature alone, a per-label offset, batch and "
        "contextual calibration, a probe on the hidden state; and the rule that keeps the "
        "start unless one beats it out of fold by --margin standard errors). The printed "
        "figures are out of fold (the fit nested in the folds); the config written to --output "
        "is fitted on all items. Without a bias member or probe it is a plain config every "
        "adapter, 'eval --config' and the vLLM per-request options accept; with one, it "
        "carries the correction (a probe's weights beside it, safetensors) and "
        "'semsoft classify --config' applies it.",
    )
    _add_data_arguments(parser)
    add_config_arguments(parser, grid=DEFAULT_GRID, skip=_FITTED)
    parser.add_argument(
        "--margin",
        type=float,
        default=1.0,
        help="standard errors of out-of-fold NLL gain the fit needs to replace the start",
    )
    parser.add_argument(
        "--no-score-temperature",
        action="store_true",
        help="do not fit the final score temperature (score_temperature stays the start's)",
    )
    parser.add_argument(
        "--no-temperature", nargs=0, action=_RenamedFlag, help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--fit-family",
        type=_name_list,
        default=None,
        help="the members the fit may choose, comma-separated, from "
        + ",".join(FAMILY)
        + " (default: all the engine supports; the probe needs --backend transformers)",
    )
    parser.add_argument("--n-folds", type=int, default=5, help="cross-validation folds")
    parser.add_argument(
        "--output",
        default="semsoft-config.json",
        help="the config file to write (.json; checked before the tune starts)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing --output"
    )
    parser.add_argument("--report", help="also write the full tuning report (JSON)")
    parser.set_defaults(func=run_tune)


def _check_fit_output(output: Path, *, overwrite: bool) -> None:
    """`tune --output`, checked before the tune: a `.json` name in a folder that
    exists and can be written, not a folder, and an existing file only with
    `--overwrite`; `ValueError` naming the path."""
    if output.suffix.lower() != ".json":
        raise ValueError(
            f"--output {output}: a fit is written as JSON; name the file with a .json suffix"
        )
    from semsoft_plugin.app.file_plan import check_output_place

    check_output_place(output)
    if output.exists() and not overwrite:
        raise ValueError(f"--output {output} exists: pass --overwrite to replace it")


def run_tune(args: argparse.Namespace) -> int:
    from semsoft_eval.tune import format_tune, tune_dataset
    from semsoft_plugin.fit.fitted import save_fitted

    _check_fit_output(Path(args.output), overwrite=args.overwrite)
    start = start_from_args(args)
    grid = grid_from_args(args, skip=_FITTED)
    result = tune_dataset(
        args.model,
        args.dataset,
        start=start,
        grid=grid,
        fit_score_temperature=not args.no_score_temperature,
        margin=args.margin,
        n_folds=args.n_folds,
        limit=args.limit,
        seed=args.seed,
        template=_template(args),
        batch_size=args.batch_size,
        cache_dir=_cache_dir(args),
        backend=args.backend,
        engine_args=args.engine_args,
        family=args.fit_family,
        **_data_options(args),
    )
    print(format_tune(result))
    save_fitted(
        args.output, result.config, result.correction, result.identity, result.fit.policy
    )
    print(f"config written to {args.output}", file=sys.stderr)
    if args.report:
        Path(args.report).write_text(json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n")
    return 0
