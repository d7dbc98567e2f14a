"""`semsoft distill` on the command line: its flags, and the command that runs the recipe.

The flags map one to one onto [`DistillConfig`][semsoft_eval.distill.run.DistillConfig]
([`add_arguments`][semsoft_eval.distill.cli.add_arguments], [`config_from_args`][semsoft_eval.distill.cli.config_from_args]), so `benchmarks/distill_run.py`
reuses them with other defaults.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from semsoft_eval.distill.data import TASKS
from semsoft_eval.distill.run import DistillConfig, run_distill
from semsoft_eval.distill.tables import format_markdown

__all__ = ["add_arguments", "add_parser", "config_from_args", "run"]


def add_parser(subparsers: Any) -> None:
    """Register `semsoft distill`."""
    parser = subparsers.add_parser(
        "distill",
        allow_abbrev=False,
        help="distil self-consistency into a stated confidence (LoRA)",
        description="Sample answers, turn the share of correct samples into a confidence "
        "target, refuse a collapsed target set, LoRA-tune the model (TRL) to answer with "
        "'Confidence: NN%%', and compare the confidence signals on held-out items "
        "(Cacioli 2026).",
    )
    add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The recipe's flags (shared by the command and `benchmarks/distill_run.py`)."""
    d = DistillConfig()
    parser.add_argument(
        "--model", default=d.model, help="'default' (= qwen2.5-coder-1.5b), 'qwen2.5-coder-0.5b', 'smollm2-135m' (small, for tests) or a checkpoint dir"
    )
    parser.add_argument("--task", choices=TASKS, default=d.task, help="question set")
    parser.add_argument(
        "--input", dest="data", default=d.data,
        help="nq only: JSONL {question, answer: [aliases]}",
    )
    parser.add_argument(
        "--output", dest="out", default=d.out, help="output dir (adapters, samples, report)"
    )
    parser.add_argument("--train-items", type=int, default=d.train_items)
    parser.add_argument("--eval-items", type=int, default=d.eval_items)
    parser.add_argument("--n", type=int, default=d.n, help="samples per item")
    parser.add_argument(
        "--temperature",
        type=float,
        default=d.temperature,
        help="the engine's sampling temperature of the teacher's sampled answers",
    )
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument(
        "--match", choices=("contains", "exact"), default=d.match, help="open-QA matching rule"
    )
    parser.add_argument("--sample-batch-size", type=int, default=d.sample_batch_size)
    parser.add_argument("--eval-batch-size", type=int, default=d.eval_batch_size)
    parser.add_argument("--rank", type=int, default=d.rank, help="LoRA rank")
    parser.add_argument("--alpha", type=int, default=d.alpha, help="LoRA alpha")
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="SFT batch size")
    parser.add_argument(
        "--warmup-items",
        type=int,
        default=d.warmup_items,
        help="first teach the answer alone on this many other items (0: none)",
    )
    parser.add_argument("--warmup-epochs", type=int, default=d.warmup_epochs)
    parser.add_argument(
        "--warmup-lr",
        type=float,
        default=d.warmup_lr,
        help="learning rate of the answer warm-up (default: --lr)",
    )
    parser.add_argument("--max-steps", type=int, default=d.max_steps, help="cap the SFT steps")
    parser.add_argument(
        "--min-entropy", type=float, default=d.min_entropy_bits, help="guard: minimum bits"
    )
    parser.add_argument(
        "--max-top-share", type=float, default=d.max_top_share, help="guard: top target share"
    )
    parser.add_argument("--no-control", action="store_true", help="skip the shuffled control")
    parser.add_argument("--no-modal-filter", action="store_true", help="skip the modal filter")
    parser.add_argument(
        "--modal-filter-guard-only",
        action="store_true",
        help="check the modal-filter set's guard but do not train it when it passes",
    )
    parser.add_argument("--eval-max-tokens", type=int, default=d.eval_max_tokens)
    parser.add_argument("--device", default=d.device, help="auto, cpu or cuda")
    parser.add_argument("--resample", action="store_true", help="ignore a matching samples.json")


def config_from_args(args: argparse.Namespace) -> DistillConfig:
    """A [`DistillConfig`][semsoft_eval.distill.DistillConfig] from the flags of [`add_arguments`][semsoft_eval.distill.cli.add_arguments]."""
    return DistillConfig(
        model=args.model, task=args.task, data=args.data, out=args.out,
        train_items=args.train_items, eval_items=args.eval_items, n=args.n,
        temperature=args.temperature, seed=args.seed, match=args.match,
        sample_batch_size=args.sample_batch_size, eval_batch_size=args.eval_batch_size,
        rank=args.rank, alpha=args.alpha, lr=args.lr, epochs=args.epochs,
        batch_size=args.batch_size, max_steps=args.max_steps,
        warmup_items=args.warmup_items, warmup_epochs=args.warmup_epochs,
        warmup_lr=args.warmup_lr,
        min_entropy_bits=args.min_entropy, max_top_share=args.max_top_share,
        control=not args.no_control, modal_filter_run=not args.no_modal_filter,
        modal_filter_train=not args.modal_filter_guard_only,
        eval_max_tokens=args.eval_max_tokens,
        device=args.device, resample=args.resample,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """`semsoft distill`: run the recipe and print the held-out tables."""
    config = config_from_args(args)
    report = run_distill(config)
    print(json.dumps(report, indent=2) if args.json else format_markdown(report))
    print(f"report: {Path(config.out) / 'report.json'}")
    return 0
