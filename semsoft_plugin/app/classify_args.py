"""What the parsed `semsoft classify` arguments stand for: the labels, the prompt
template and the classifier.

Shared by the one-text path (`semsoft_plugin.app.cli`) and the file path
(`semsoft_plugin.app.classify_file`), so that both read `--labels`, `--prompt`
and the model options the same way.
"""

from __future__ import annotations

import argparse
from typing import Any

from semsoft_plugin.core.labels import split_labels
from semsoft_plugin.engines.prompting import DEFAULT_PROMPT

__all__ = [
    "check_fitted_args",
    "classifier_from_args",
    "file_strength",
    "parse_labels",
    "prompt_template",
    "strength_arg",
]


def file_strength(args: argparse.Namespace) -> float | str | None:
    """The file mode's strength (`--file-strength`, default `"auto"`, the guard), or
    `None` without `--calibrate file`."""
    if getattr(args, "calibrate", None) != "file":
        return None
    given = getattr(args, "file_strength", None)
    return "auto" if given is None else given


def strength_arg(text: str) -> float | str:
    """An argparse type: `--file-strength auto` or a number (its range is checked with
    the other settings, by `semsoft_plugin.app.classifier_settings.check_file_strength`)."""
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be 'auto' or a number in [0, 1]") from None


def parse_labels(text: str) -> list[str]:
    """`--labels a,b,c` as a list, read as one CSV row (`yes,"no, maybe"` is two
    labels: [`split_labels`][semsoft_plugin.core.labels.split_labels]); `ValueError` for an
    empty label or fewer than two."""
    labels = split_labels(text, "--labels")
    if len(labels) < 2:
        raise ValueError(f"--labels {text!r}: give at least two comma-separated labels")
    return labels


def prompt_template(args: argparse.Namespace) -> Any:
    """The `PromptTemplate` of `--prompt-file`, or of `--prompt`/`--answer-prefix`
    (each defaulting to the generic one), or the default template when none is given."""
    from semsoft_plugin.engines.prompting import DEFAULT_TEMPLATE, PromptTemplate, load_template

    if args.prompt_file:
        if args.prompt is not None or args.answer_prefix is not None:
            raise ValueError("give --prompt-file or --prompt/--answer-prefix, not both")
        return load_template(args.prompt_file)
    if args.prompt is None and args.answer_prefix is None:
        return DEFAULT_TEMPLATE
    return PromptTemplate(
        user=args.prompt if args.prompt is not None else DEFAULT_PROMPT,
        answer_prefix=args.answer_prefix if args.answer_prefix is not None else "Answer:",
    )


def classifier_from_args(
    args: argparse.Namespace, labels: list[str], template: Any, config: Any, *, fitted: bool = False
) -> Any:
    """The [`Classifier`][semsoft_plugin.app.classifier.Classifier] the model, backend and batch
    options name (imported when called, so that the command starts without it).
    `fitted`: `--config` holds a fitted correction, which the classifier takes from
    the file ([`load_fit`][semsoft_plugin.app.classifier.Classifier.load_fit]) and applies
    row by row."""
    from semsoft_plugin.app.classifier import Classifier
    from semsoft_plugin.app.engine_settings import EngineSettings

    classifier = Classifier.from_pretrained(
        args.model,
        labels,
        backend=args.backend,
        engine=EngineSettings(
            batch_size=args.batch_size, dtype=args.dtype, engine_args=args.engine_args
        ),
        prompt=template,
        config=config,
        max_text_tokens=getattr(args, "max_text_tokens", None),
        # The file mode corrects the written rows itself (classify_file, ray): its
        # classifier gives the raw scores of the first pass.
        calibrate="contextual" if getattr(args, "calibrate", None) == "contextual" else None,
    )
    if fitted:
        classifier.load_fit(args.config)
    return classifier


def check_fitted_args(args: argparse.Namespace, procedure: str) -> None:
    """A `--config` file with a fitted correction (`procedure`) goes with no option
    that would change what it was fitted on, nor with `--ray` (whose workers build
    their own classifiers): each refused by name rather than ignored."""
    from semsoft_plugin.app.config_args import flag
    from semsoft_plugin.core.config import config_field_specs

    given = [flag(name) for name in config_field_specs() if getattr(args, name, None) is not None]
    if getattr(args, "preset", None) is not None:
        given.append("--preset")
    if getattr(args, "calibrate", None) is not None:
        given.append("--calibrate")
    if getattr(args, "ray", False):
        given.append("--ray")
    if given:
        raise ValueError(
            f"--config {args.config} holds a fitted correction ({procedure}), fitted with the "
            f"file's settings on uncorrected scores: {given[0]} cannot go with it (fit again "
            "with semsoft tune for other settings)"
        )
