"""The ``semsoft`` command line: ``classify`` here; ``eval``, ``tune`` and ``distill`` from
the evaluation package beside the plugin (``semsoft_eval``), loaded only when asked for.

User errors (``ValueError``) print as one line and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "build_parser"]

# subcommand -> "module:function" that adds its parser (kept lazy: no engine import
# happens until a subcommand runs).
_EXTERNAL_COMMANDS = {
    "eval": "semsoft_eval.cli_eval:add_eval_parser",
    "tune": "semsoft_eval.cli_eval:add_tune_parser",
    "distill": "semsoft_eval.distill:add_parser",
}

DEFAULT_PROMPT = (
    "Classify the text into one of these labels: {labels}.\n"
    "Text: {text}\nAnswer with the label only."
)


def _add_classify_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "classify",
        help="calibrated label probabilities for one text",
        description="Classify a text with an LLM and print the Semantic Softmax label "
        "distribution beside the constrained (label-tokens-only) softmax.",
    )
    parser.add_argument("text", help="the text to classify")
    parser.add_argument(
        "--labels", required=True, help="comma-separated labels, e.g. joy,sadness,anger"
    )
    parser.add_argument(
        "--model", default="default", help="'default', 'qwen2.5-coder-1.5b' or a checkpoint dir"
    )
    parser.add_argument(
        "--prompt", default=DEFAULT_PROMPT, help="user message; {text} and {labels} are filled in"
    )
    parser.add_argument("--answer-prefix", default="Answer:", help="pre-filled start of the answer")
    parser.add_argument("--config", help="a SemsoftConfig JSON file (e.g. from 'semsoft tune')")
    parser.add_argument("--k", type=int, help="top-K tokens kept")
    parser.add_argument("--tau", type=float, help="cosine threshold")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=_run_classify)


def _parse_labels(text: str) -> list[str]:
    labels = [label.strip() for label in text.split(",")]
    if any(not label for label in labels):
        raise ValueError(f"--labels {text!r} has an empty label")
    if len(labels) < 2:
        raise ValueError(f"--labels {text!r}: give at least two comma-separated labels")
    return labels


def _run_classify(args: argparse.Namespace) -> int:
    from semsoft_plugin import models
    from semsoft_plugin.config import SemsoftConfig
    from semsoft_plugin.hf import classify

    labels = _parse_labels(args.labels)
    config = SemsoftConfig.load(args.config) if args.config else SemsoftConfig()
    config = config.replace(k=args.k, tau=args.tau)
    try:
        user = args.prompt.format(text=args.text, labels=", ".join(labels))
    except (KeyError, IndexError) as error:
        raise ValueError(
            f"--prompt has an unknown placeholder {error}; use {{text}} and {{labels}}"
        ) from None
    model, tokenizer = models.load(args.model)
    messages = [{"role": "user", "content": user}]
    if args.answer_prefix:
        messages.append({"role": "assistant", "content": args.answer_prefix})
    inputs: list[Any] = [messages]
    if getattr(tokenizer, "chat_template", None) is None:
        inputs = [user + "\n" + args.answer_prefix]
    (result,) = classify(model, tokenizer, inputs, labels, config=config)
    if args.json:
        print(
            json.dumps(
                {
                    "labels": labels,
                    "label": result.label,
                    "semantic": result.probs,
                    "constrained": result.constrained_probs,
                    "fallback": result.fallback,
                    "coverage": result.coverage,
                    "model": args.model,
                    "config": config.to_dict(),
                }
            )
        )
        return 0
    width = max(len(label) for label in labels)
    print(
        f"label: {result.label}" + ("   (fallback: constrained softmax)" if result.fallback else "")
    )
    print(f"{'':{width}}  semantic  constrained")
    for label in labels:
        print(
            f"{label:{width}}  {result.probs[label]:8.3f}  {result.constrained_probs[label]:11.3f}"
        )
    print(f"coverage of the top-{config.k} mass by label neighbours: {result.coverage:.2f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="semsoft", description="Calibrated label probabilities for LLM zero-shot classifiers."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_classify_parser(subparsers)
    for spec in _EXTERNAL_COMMANDS.values():
        module_name, function = spec.split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue  # the evaluation extra is not installed
        getattr(module, function)(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as error:
        print(f"semsoft {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
