"""The `semsoft` command line: `classify` here; other subcommands found like plugins.

`semsoft classify TEXT --labels a,b` scores one text; `semsoft classify --input
texts.csv --labels a,b --output scored.csv` scores a whole file (see
`semsoft_plugin.app.classify_file`). Both go through [`semsoft_plugin.Classifier`][semsoft_plugin.Classifier],
built from the arguments by `semsoft_plugin.app.classify_args`.

Further subcommands (`eval`, `tune`, `distill` from the evaluation package beside
the plugin) are registered in the entry-point group `semsoft.commands` as
`"module:add_parser_function"`. At start-up only their names are read from the
installed metadata: the plugin imports a subcommand's module only when that subcommand is
invoked, so `semsoft classify` starts with the core install alone, and `semsoft
eval` without its extra says in one line what to install.

User errors (`ValueError`) print as one line and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from semsoft_plugin.app.classifier_settings import check_file_strength
from semsoft_plugin.app.classify_args import (
    check_fitted_args,
    classifier_from_args,
    parse_labels,
    prompt_template,
    strength_arg,
)
from semsoft_plugin.app.classify_file import run_classify_file
from semsoft_plugin.app.classify_modes import check_mode_flags, fill_defaults
from semsoft_plugin.app.config_args import (
    add_config_arguments,
    check_one_base,
    config_from_args,
)
from semsoft_plugin.app.file_plan import file_job
from semsoft_plugin.core.config import config_field_specs
from semsoft_plugin.core.labels import LABELS_SYNTAX
from semsoft_plugin.engines.fit_identity import run_identity
from semsoft_plugin.fit.fitted import read_fit

__all__ = [
    "COMMAND_GROUP",
    "Command",
    "build_parser",
    "command_parsers",
    "discover_commands",
    "json_object",
    "main",
]

COMMAND_GROUP = "semsoft.commands"


@dataclass(frozen=True)
class Command:
    """A subcommand from another package: where its parser comes from, its help, and
    what to install when its module cannot be imported."""

    name: str
    target: str  # "module:function" adding the subparser
    help: str
    install: str


# The subcommands this package defines itself; another package cannot replace them.
BUILT_IN = ("classify", "upgrade-fit")


def discover_commands() -> dict[str, Command]:
    """Subcommands registered in the entry-point group `semsoft.commands`, without
    importing any of them.

    The install line comes from the entry point's distribution and extras (`eval =
    "pkg.mod:add_parser [eval]"` reads `pip install 'dist[eval]'`), so the plugin names
    no other package: a command is whatever the installed metadata says."""
    from importlib.metadata import entry_points

    try:
        found = list(entry_points(group=COMMAND_GROUP))
    except Exception:  # unreadable metadata must not stop `semsoft classify`
        found = []
    commands = {}
    for ep in sorted(found, key=lambda e: e.name):
        if ep.name in BUILT_IN or ep.name in commands:
            continue
        dist = getattr(getattr(ep, "dist", None), "name", None) or ep.module.split(".")[0]
        extras = f"[{','.join(ep.extras)}]" if ep.extras else ""
        install = f"pip install '{dist}{extras}'" if extras else f"pip install --upgrade '{dist}'"
        commands[ep.name] = Command(
            ep.name, f"{ep.module}:{ep.attr}", f"from {dist}{extras}: semsoft {ep.name} --help", install
        )
    return commands


class MissingExtra(Exception):
    """A subcommand's module (or one it imports) is not installed."""


def _load_command(command: Command, subparsers: Any) -> None:
    from importlib import import_module

    module_name, _, function = command.target.partition(":")
    try:
        add_parser = getattr(import_module(module_name), function)
        add_parser(subparsers)
    except ImportError as error:
        raise MissingExtra(_missing_line(command, error)) from None


def _missing_line(command: Command, error: ImportError) -> str:
    missing = getattr(error, "name", None) or str(error)
    return f"semsoft {command.name} needs {missing!s}, which is not installed: {command.install}"


# ---------------------------------------------------------------------------
# classify
# ---------------------------------------------------------------------------


def json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object (`--engine-args`)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {err.msg}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object")
    return value


def _backend(text: str) -> str:
    """`--backend`'s value; the old spelling `hf` is refused naming `transformers`
    (the Classifier's own check, so every path says the same)."""
    from semsoft_plugin.app.handles import check_backend

    try:
        check_backend(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _add_upgrade_fit_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "upgrade-fit",
        allow_abbrev=False,
        help="rewrite a fit file of an older format in this one",
        description="Rewrite fit files saved by an older version in this version's format: a "
        "probe fit then records its probe file's sha256 as the file is now, so that a probe "
        "replaced later is refused. Each file is read back with this version's checks; one "
        "they refuse is left as it was.",
    )
    parser.add_argument("fits", nargs="+", metavar="FIT", help="fit files (JSON)")
    parser.set_defaults(func=_run_upgrade_fit)


def _run_upgrade_fit(args: argparse.Namespace) -> int:
    from semsoft_plugin.fit.fitted import upgrade_fit

    for path in args.fits:
        print(upgrade_fit(path))
    return 0


class _Help(argparse.Action):
    """`--help`: the everyday options only; `--help-all`: every option. An option is
    left out of `--help` when its action carries `everyday = False` (`_ADVANCED`)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None,
                 every_option: bool = False) -> None:  # fmt: skip
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)
        self.every_option = every_option

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        hidden = [
            a for a in parser._actions if not self.every_option and not getattr(a, "everyday", True)
        ]
        saved = [a.help for a in hidden]
        for action in hidden:
            action.help = argparse.SUPPRESS
        try:
            parser.print_help()
        finally:
            for action, text in zip(hidden, saved, strict=True):
                action.help = text
        parser.exit()


# `semsoft classify`'s options that `--help` leaves to `--help-all`: the nine SemsoftConfig
# fields (also set through --preset or --config), the engine's and the file job's finer
# settings, and the Ray cluster's.
_ADVANCED = (
    "dtype", "engine_args", "calibrate", "file_strength", "json", "encoding", "batch_size",
    "column_prefix", "answer_prefix", "prompt_file", "ray", "ray_address", "concurrency",
    "num_cpus", "num_gpus", "output_format", "id_column",
)  # fmt: skip


def _add_classify_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "classify",
        allow_abbrev=False,  # one spelling per option: --out is not --output
        add_help=False,
        help="calibrated label probabilities for one text or a whole file",
        description="Classify a text, or every row of a CSV, TSV, JSONL or Parquet file, with an LLM: "
        "each label's probability (by default the constrained softmax over the label tokens; the "
        "pool, file or fitted scores where the options ask for them).",
        epilog="--help-all lists every option: the SemsoftConfig fields (--k, --tau, ...), the "
        "engine's (--dtype, --engine-args), --calibrate, the file's finer settings and Ray's.",
    )
    parser.add_argument("-h", "--help", action=_Help, help="show the everyday options and exit")
    parser.add_argument(
        "--help-all", action=_Help, every_option=True, help="show every option and exit"
    )
    parser.add_argument("text", nargs="?", help="the text to classify (or give --input)")
    parser.add_argument(
        "--labels",
        required=True,
        help=f"the labels, e.g. joy,sadness,anger; {LABELS_SYNTAX}",
    )
    parser.add_argument(
        "--model", default="default", help="'default' (= qwen2.5-coder-1.5b), 'qwen2.5-coder-0.5b', 'smollm2-135m' (small, for tests) or a checkpoint dir"
    )
    parser.add_argument(
        "--dtype",
        choices=("auto", "bfloat16", "float32"),
        default="auto",
        help="transformers weights dtype; auto: bf16 where the CPU has native bf16, else "
        "float32 (several times faster there)",
    )
    prompt = parser.add_argument_group("prompt")
    prompt.add_argument(
        "--prompt", help="user message; {text} and {labels} are filled in (default: a generic one)"
    )
    prompt.add_argument(
        "--answer-prefix", help="pre-filled start of the answer (default 'Answer:')"
    )
    prompt.add_argument(
        "--prompt-file", help="JSON prompt template (keys user, answer_prefix, system), as in eval"
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--backend",
        type=_backend,
        choices=("transformers", "vllm"),
        default="transformers",
        help="engine: transformers, or vLLM with the plugin (the forward path of 'semsoft eval')",
    )
    parser.add_argument(
        "--engine-args",
        type=json_object,
        help="vLLM engine arguments as JSON, e.g. '{\"tensor_parallel_size\": 4}'",
    )
    parser.add_argument(
        "--calibrate",
        choices=("contextual", "file"),
        help="also divide out the prompt's label bias: 'contextual' reads it from content-free "
        "inputs; 'file' (with --input) estimates it once from the file's distinct texts (a "
        "first pass, at least 32) and applies it to each row alone. Opt-in: it harms a file "
        "where one label is truly the majority (docs/defaults.md)",
    )
    parser.add_argument(
        "--file-strength",
        type=strength_arg,
        metavar="S",
        help="with --calibrate file: 'auto' (the default: the guard applies the whole "
        "correction when the rows' mean top probability is at most 0.5, none above, where a "
        "sure model's lean is the file's content) or the share applied, in [0, 1] (0 "
        "changes nothing)",
    )
    parser.add_argument("--json", action="store_true", default=None, help="one text: print JSON")
    files = parser.add_argument_group("a file")
    files.add_argument("--input", help="CSV, TSV, JSONL or Parquet file with a text column")
    files.add_argument("--text-column", help="the column to classify (default text)")
    files.add_argument(
        "--encoding",
        help="the input file's text encoding (default utf-8, with or without a BOM), "
        "e.g. latin-1 or cp1252 for older exports",
    )
    files.add_argument(
        "--max-text-tokens",
        type=int,
        metavar="N",
        help="score at most the first N tokens of each text (default: what the model's "
        "context holds); the 'truncated' column counts the tokens cut",
    )
    files.add_argument(
        "--output",
        help="where the scored rows go: .csv, .tsv, .jsonl or .parquet (the only one that "
        "keeps every input column's type); one run at a time writes it",
    )
    files.add_argument("--batch-size", type=int, help="rows per forward pass (default 8)")
    files.add_argument(
        "--review-below",
        type=float,
        metavar="P",
        help="flag a row for review when its top probability is below P (default 0.6)",
    )
    files.add_argument(
        "--resume",
        action="store_true",
        default=None,
        help="keep the rows already in --output, score the rest"
    )
    files.add_argument(
        "--overwrite", action="store_true", default=None, help="replace an existing --output"
    )
    files.add_argument(
        "--column-prefix",
        help="prefix of the added columns, when the input already has e.g. a 'label' column "
        "(default none)",
    )
    _add_ray_options(parser)
    config_fields = set(config_field_specs())
    for action in parser._actions:
        if action.dest in _ADVANCED or action.dest in config_fields:
            action.everyday = False
    parser.set_defaults(func=_run_classify)


def _add_ray_options(parser: argparse.ArgumentParser) -> None:
    """`--ray`: the same classification on a Ray cluster (semsoft_plugin.app.ray)."""
    group = parser.add_argument_group("on a Ray cluster (pip install 'semsoft-plugin[ray]')")
    group.add_argument(
        "--ray",
        action="store_true",
        help="classify --input (a file or a directory of files) on Ray, one model per actor; "
        "--output is a directory",
    )
    group.add_argument(
        "--ray-address", help="the cluster to join ('auto'); default: start a local one"
    )
    group.add_argument("--concurrency", type=int, help="actors (models) at once (default 1)")
    group.add_argument("--num-cpus", type=float, help="CPUs per actor (torch threads)")
    group.add_argument("--num-gpus", type=float, help="GPUs per actor (e.g. 1 with vLLM)")
    group.add_argument(
        "--output-format",
        choices=("parquet", "csv", "jsonl"),
        help="the files Ray writes into --output (default parquet)",
    )
    group.add_argument(
        "--id-column",
        help="an input column naming each row (default: a 'row' column with the row number)",
    )


def _run_classify(args: argparse.Namespace) -> int:
    if (args.text is None) == (args.input is None):
        raise ValueError("give one text to classify or --input FILE, not both or neither")
    check_mode_flags(args)  # a flag with no effect in this mode: refused, not ignored
    fill_defaults(args)
    if args.engine_args and args.backend != "vllm":
        raise ValueError(
            f"--engine-args {json.dumps(args.engine_args)} apply only to --backend vllm"
        )
    if isinstance(args.batch_size, bool) or args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size} must be a positive integer")
    if args.max_text_tokens is not None and args.max_text_tokens < 1:
        raise ValueError(f"--max-text-tokens {args.max_text_tokens} must be a positive integer")
    if args.file_strength is not None:
        check_file_strength(args.file_strength, args.calibrate, "--file-strength")
        if args.calibrate != "file":  # the default 'auto' given by hand, without the mode
            raise ValueError("--file-strength goes with --calibrate file")
    if args.calibrate == "file" and args.input is None:
        raise ValueError(
            "--calibrate file learns the label bias from a whole file, and one text has no "
            "file to learn from: give --input FILE (at least 32 distinct texts), or "
            "--calibrate contextual"
        )
    labels = parse_labels(args.labels)
    check_one_base(args)  # --preset beside --config: refused before the file is read
    _check_engine_installed(args.backend)
    template = prompt_template(args)
    # The file is read and checked whole here, before any engine starts: its config is
    # the base, its correction (if any) is applied by the classifier (classify_args), row
    # by row, and only where it was fitted (labels, prompt, output layer).
    fit = read_fit(args.config) if args.config else None
    correction = None if fit is None else fit.correction
    if fit is not None and correction is not None:
        check_fitted_args(args, correction.procedure)
        fit.check_run(run_identity(labels, template, args.model, allow_download=True))
    config = config_from_args(args, base=None if fit is None else fit.config)
    fitted = correction is not None
    if args.input is not None and args.ray:
        from semsoft_plugin.app.ray import run_classify_cli

        return run_classify_cli(args, labels, template, config)
    if args.input is not None:
        fit_sha256 = fit.sha256 if fit is not None and fitted else None
        job = file_job(args, labels, template, config, fit_sha256=fit_sha256)
        return run_classify_file(
            job,
            labels,
            lambda: classifier_from_args(args, labels, template, config, fitted=fitted),
        )
    classifier = classifier_from_args(args, labels, template, config, fitted=fitted)
    details = classifier.predict_details([args.text])
    probs = _by_label(details.labels, details.probs[0], labels)
    constrained = _by_label(details.labels, details.constrained_probs[0], labels)
    fallback, coverage = bool(details.fallback[0]), float(details.coverage[0])
    # The coverage measures the votes, which only a pool (semantic_weight > 0) counts: at
    # the constrained softmax it says nothing, so it is not shown (JSON: null).
    votes = config.semantic_weight > 0
    if args.json:
        print(
            json.dumps(
                {
                    "labels": labels,
                    "label": details.label[0],
                    "probs": probs,
                    "constrained_probs": constrained,
                    "fallback": fallback,
                    "coverage": coverage if votes else None,
                    "model": args.model,
                    "config": config.to_dict(),
                }
            )
        )
        return 0
    width = max(len(label) for label in labels)
    print(f"label: {details.label[0]}" + ("   (fallback: constrained softmax)" if fallback else ""))
    print(f"{'':{width}}  {'probs':>8}  constrained_probs")
    for label in labels:
        print(f"{label:{width}}  {probs[label]:8.3f}  {constrained[label]:17.3f}")
    if votes:
        print(f"coverage of the top-{config.k} mass by label neighbours: {coverage:.2f}")
    return 0


def _check_engine_installed(backend: str) -> None:
    """`--backend vllm` where vLLM is not installed: one line, before anything loads."""
    from importlib.util import find_spec

    if backend == "vllm" and find_spec("vllm") is None:
        raise ValueError(
            "--backend vllm needs vLLM, which is not installed: pip install "
            "'semsoft-plugin[vllm]' (a GPU; on CPU see docs/vllm.md), or use --backend transformers"
        )


def _by_label(columns: Sequence[str], row: Any, labels: Sequence[str]) -> dict[str, float]:
    """One row of a [`Predictions`][semsoft_plugin.app.predictions.Predictions] array (columns in
    `classes_` order) as label -> probability in the user's label order."""
    values = dict(zip(columns, row.tolist(), strict=True))
    return {label: values[label] for label in labels}


# ---------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------


def _requested(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (the first argument not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    """The `semsoft` parser. Other packages' subcommands are listed by name; only the
    one named `load` is imported and gets its real parser (`MissingExtra` when its
    module or a module it needs is not installed)."""
    parser = argparse.ArgumentParser(
        prog="semsoft",
        allow_abbrev=False,
        description="Calibrated label probabilities for LLM zero-shot classifiers.",
        epilog=f"Subcommands besides classify are those the installed packages register in the "
        f"entry-point group {COMMAND_GROUP!r} (this package's 'eval' extra brings eval, tune "
        "and distill).",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_classify_parser(subparsers)
    _add_upgrade_fit_parser(subparsers)
    for name, command in discover_commands().items():
        if name == load:
            _load_command(command, subparsers)
        else:
            subparsers.add_parser(name, help=command.help, add_help=False)
    return parser


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's real parser by name (`""` for `semsoft` itself), each other
    package's module imported; no model loads. For the generated CLI reference
    (`scripts/mkdocs_cli_reference.py`) and the test that every documented flag exists.
    A subcommand whose module cannot be imported raises `MissingExtra` naming the extra
    to install: the reference never leaves one out without a word. The parsers' modules
    import no extra (numpy and torch only), so the `docs` extra alone builds them all."""
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name in (*BUILT_IN, *discover_commands()):
        root = build_parser(load=name)
        parsers.setdefault("", root)
        for action in root._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers[name] = action.choices[name]
    return parsers


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = list(sys.argv[1:] if argv is None else argv)
    wanted = _requested(argv)
    commands = discover_commands()
    try:
        parser = build_parser(load=wanted if wanted in commands else None)
    except MissingExtra as error:
        print(error, file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as error:
        print(f"semsoft {args.command}: error: {error}", file=sys.stderr)
        return 2
    except ImportError as error:
        if args.command not in commands:
            raise
        print(_missing_line(commands[args.command], error), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
