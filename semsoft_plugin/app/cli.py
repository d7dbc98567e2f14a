"""The ``semsoft`` command line: ``classify`` here; other subcommands found like plugins.

``semsoft classify TEXT --labels a,b`` scores one text; ``semsoft classify --input
texts.csv --labels a,b --output scored.csv`` scores a whole file (see
:func:`_run_classify_file`). Both go through :class:`semsoft_plugin.Classifier`.

Further subcommands (``eval``, ``tune``, ``distill`` from the evaluation package beside
the plugin) are registered in the entry-point group ``semsoft.commands`` as
``"module:add_parser_function"``. At start-up only their names are read from the
installed metadata (with a fallback list for an install whose metadata predates the
group): the plugin imports a subcommand's module only when that subcommand is
invoked, so ``semsoft classify`` starts with the core install alone, and ``semsoft
eval`` without its extra says in one line what to install.

User errors (``ValueError``) print as one line and exit with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semsoft_plugin.engines.prompting import DEFAULT_PROMPT

__all__ = [
    "COMMAND_GROUP",
    "DEFAULT_PROMPT",
    "build_parser",
    "discover_commands",
    "json_object",
    "main",
]

COMMAND_GROUP = "semsoft.commands"
EVAL_EXTRA = "pip install 'semsoft-plugin[eval]'"


@dataclass(frozen=True)
class Command:
    """A subcommand from another package: where its parser comes from, its help, and
    what to install when its module cannot be imported."""

    name: str
    target: str  # "module:function" adding the subparser
    help: str
    install: str


# Used when the installed metadata has no `semsoft.commands` group (an install made
# before it existed) and for the help text shown before a module is loaded.
_FALLBACK_COMMANDS = (
    Command(
        "eval",
        "semsoft_eval.cli_eval:add_eval_parser",
        "compare calibration methods on labelled data",
        EVAL_EXTRA,
    ),
    Command(
        "tune",
        "semsoft_eval.cli_eval:add_tune_parser",
        "fit k, tau, centring and a temperature on labelled dev data",
        EVAL_EXTRA,
    ),
    Command(
        "distill",
        "semsoft_eval.distill:add_parser",
        "distil self-consistency into a stated confidence (LoRA)",
        EVAL_EXTRA,
    ),
)


def discover_commands() -> dict[str, Command]:
    """Subcommands registered in ``semsoft.commands``, without importing any of them."""
    from importlib.metadata import entry_points

    commands = {c.name: c for c in _FALLBACK_COMMANDS}
    try:
        found = list(entry_points(group=COMMAND_GROUP))
    except Exception:  # unreadable metadata must not stop `semsoft classify`
        found = []
    for ep in found:
        if ep.name == "classify":
            continue
        known = commands.get(ep.name)
        if known is not None and known.target == ep.value:
            continue
        dist = getattr(getattr(ep, "dist", None), "name", None) or ep.value.split(":")[0]
        commands[ep.name] = Command(
            ep.name, ep.value, f"(from {dist})", f"pip install --upgrade '{dist}'"
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
    """An argparse type: a JSON object (``--engine-args``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {err.msg}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object")
    return value


def _add_classify_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "classify",
        help="calibrated label probabilities for one text or a whole file",
        description="Classify a text, or every row of a CSV/TSV/JSONL file, with an LLM: the "
        "Semantic Softmax label distribution beside the constrained (label-tokens-only) softmax.",
    )
    parser.add_argument("text", nargs="?", help="the text to classify (or give --input)")
    parser.add_argument(
        "--labels", required=True, help="comma-separated labels, e.g. joy,sadness,anger"
    )
    parser.add_argument(
        "--model", default="default", help="'default', 'qwen2.5-coder-1.5b' or a checkpoint dir"
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
    parser.add_argument("--config", help="a SemsoftConfig JSON file (e.g. from 'semsoft tune')")
    parser.add_argument("--k", type=int, help="top-K tokens kept")
    parser.add_argument("--tau", type=float, help="cosine threshold")
    parser.add_argument(
        "--backend",
        choices=("hf", "vllm"),
        default="hf",
        help="engine: transformers, or vLLM with the plugin (the forward path of 'semsoft eval')",
    )
    parser.add_argument(
        "--engine-args",
        type=json_object,
        help="vLLM engine arguments as JSON, e.g. '{\"tensor_parallel_size\": 4}'",
    )
    parser.add_argument("--json", action="store_true", help="one text: print JSON")
    files = parser.add_argument_group("a file")
    files.add_argument("--input", help="CSV, TSV or JSONL file with a text column")
    files.add_argument("--text-column", default="text", help="the column to classify")
    files.add_argument(
        "--encoding",
        default="utf-8",
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
    files.add_argument("--output", help="where the scored rows go: .csv, .tsv or .jsonl")
    files.add_argument("--batch-size", type=int, default=8, help="rows per forward pass")
    files.add_argument(
        "--review-below",
        type=float,
        default=0.6,
        metavar="P",
        help="flag a row for review when its top probability is below P (default 0.6)",
    )
    files.add_argument(
        "--resume", action="store_true", help="keep the rows already in --output, score the rest"
    )
    files.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    files.add_argument(
        "--column-prefix",
        default="",
        help="prefix of the added columns, when the input already has e.g. a 'label' column",
    )
    _add_ray_options(parser)
    parser.set_defaults(func=_run_classify)


def _add_ray_options(parser: argparse.ArgumentParser) -> None:
    """``--ray``: the same classification on a Ray cluster (semsoft_plugin.app.ray)."""
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
    group.add_argument("--concurrency", type=int, default=1, help="actors (models) at once")
    group.add_argument("--num-cpus", type=float, help="CPUs per actor (torch threads)")
    group.add_argument("--num-gpus", type=float, help="GPUs per actor (e.g. 1 with vLLM)")
    group.add_argument(
        "--output-format",
        choices=("parquet", "csv", "jsonl"),
        default="parquet",
        help="the files Ray writes into --output (default parquet)",
    )
    group.add_argument(
        "--id-column",
        help="an input column naming each row (default: a 'row' column with the row number)",
    )


def _parse_labels(text: str) -> list[str]:
    labels = [label.strip() for label in text.split(",")]
    if any(not label for label in labels):
        raise ValueError(f"--labels {text!r} has an empty label")
    if len(labels) < 2:
        raise ValueError(f"--labels {text!r}: give at least two comma-separated labels")
    return labels


def _template(args: argparse.Namespace) -> Any:
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


def _classifier(args: argparse.Namespace, labels: list[str], template: Any, config: Any) -> Any:
    from semsoft_plugin.app.classifier import Classifier

    return Classifier.from_pretrained(
        args.model,
        labels,
        backend=args.backend,
        engine_args=args.engine_args,
        dtype=args.dtype,
        prompt=template,
        config=config,
        batch_size=args.batch_size,
        max_text_tokens=getattr(args, "max_text_tokens", None),
    )


def _run_classify(args: argparse.Namespace) -> int:
    from semsoft_plugin.core.config import SemsoftConfig

    if (args.text is None) == (args.input is None):
        raise ValueError("give one text to classify or --input FILE, not both or neither")
    if args.engine_args and args.backend != "vllm":
        raise ValueError(
            f"--engine-args {json.dumps(args.engine_args)} apply only to --backend vllm"
        )
    if isinstance(args.batch_size, bool) or args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size} must be a positive integer")
    if args.max_text_tokens is not None and args.max_text_tokens < 1:
        raise ValueError(f"--max-text-tokens {args.max_text_tokens} must be a positive integer")
    labels = _parse_labels(args.labels)
    config = SemsoftConfig.load(args.config) if args.config else SemsoftConfig()
    config = config.replace(k=args.k, tau=args.tau)
    template = _template(args)
    if args.input is not None and args.ray:
        from semsoft_plugin.app.ray import run_classify_cli

        return run_classify_cli(args, labels, template, config)
    if args.ray:
        raise ValueError("--ray goes with --input DIR_OR_FILE")
    if args.input is not None:
        return _run_classify_file(args, labels, template, config)
    if args.output or args.resume:
        raise ValueError("--output and --resume go with --input FILE")
    details = _classifier(args, labels, template, config).predict_details([args.text])
    probs = _by_label(details.labels, details.probs[0], labels)
    constrained = _by_label(details.labels, details.constrained[0], labels)
    fallback, coverage = bool(details.fallback[0]), float(details.coverage[0])
    if args.json:
        print(
            json.dumps(
                {
                    "labels": labels,
                    "label": details.label[0],
                    "semantic": probs,
                    "constrained": constrained,
                    "fallback": fallback,
                    "coverage": coverage,
                    "model": args.model,
                    "config": config.to_dict(),
                }
            )
        )
        return 0
    width = max(len(label) for label in labels)
    print(f"label: {details.label[0]}" + ("   (fallback: constrained softmax)" if fallback else ""))
    print(f"{'':{width}}  semantic  constrained")
    for label in labels:
        print(f"{label:{width}}  {probs[label]:8.3f}  {constrained[label]:11.3f}")
    print(f"coverage of the top-{config.k} mass by label neighbours: {coverage:.2f}")
    return 0


def _by_label(columns: Sequence[str], row: Any, labels: Sequence[str]) -> dict[str, float]:
    """One row of a :class:`~semsoft_plugin.app.predictions.Predictions` array (columns in
    ``classes_`` order) as label -> probability in the user's label order."""
    values = dict(zip(columns, row.tolist(), strict=True))
    return {label: values[label] for label in labels}


def _output_path(args: argparse.Namespace) -> Path:
    """``--output`` checked before anything is read or loaded: a known suffix, a folder
    that exists and is writable, not a folder itself, and not the input file under
    another name (a hard link or a symbolic link: compared by device and inode, so
    even ``--overwrite`` cannot truncate the input)."""
    from semsoft_plugin.app.tables import table_format

    table_format(args.input)
    table_format(args.output, role="output file")
    output = Path(args.output)
    folder = output.parent
    if not folder.is_dir():
        raise ValueError(f"--output {output}: folder {folder} does not exist")
    if output.is_dir():
        raise ValueError(f"--output {output} is a folder; name a file in it")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"--output {output}: folder {folder} is not writable")
    source = Path(args.input)
    same = source.resolve() == output.resolve()
    if not same and source.exists() and output.exists():
        same = os.path.samefile(source, output)
    if same:
        raise ValueError(f"--output {output} is the input file {source} (the same file on disk)")
    return output


def settings_path(output: str | Path) -> Path:
    """The sidecar of an output file: ``OUTPUT.semsoft.json`` beside it."""
    output = Path(output)
    return output.with_name(output.name + ".semsoft.json")


def _run_settings(
    args: argparse.Namespace, labels: list[str], template: Any, config: Any
) -> dict[str, Any]:
    """What a file's rows were scored with, flattened to dotted names (``config.k``):
    everything besides the texts that changes a written value."""
    from semsoft_plugin.engines.models import default_dtype

    settings: dict[str, Any] = {
        "model": args.model,
        "backend": args.backend,
        "dtype": default_dtype() if args.dtype == "auto" else args.dtype,
        "engine_args": args.engine_args,
        "labels": labels,
        "batch_size": args.batch_size,
        "max_text_tokens": args.max_text_tokens,
        "review_below": args.review_below,
        "text_column": args.text_column,
        "column_prefix": args.column_prefix,
    }
    if args.backend == "vllm":  # transformers' dtype does not apply; engine_args does
        settings["dtype"] = None
    settings.update({f"prompt.{k}": v for k, v in template.to_dict().items()})
    settings.update({f"config.{k}": v for k, v in config.to_dict().items()})
    # Through JSON and back: what is compared is what the sidecar holds.
    return dict(json.loads(json.dumps(settings)))


def _check_settings(output: Path, settings: dict[str, Any]) -> None:
    """``--resume``: refuse to continue rows scored with other settings, by name."""
    sidecar = settings_path(output)
    try:
        recorded = json.loads(sidecar.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"--resume: {output} has no settings record {sidecar.name}, so its rows cannot be "
            "checked against this run's settings: pass --overwrite to score it again"
        ) from None
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--resume: {sidecar} is not readable JSON ({error})") from None
    recorded = recorded.get("settings") if isinstance(recorded, dict) else None
    if not isinstance(recorded, dict):
        raise ValueError(f"--resume: {sidecar} holds no 'settings' object")
    differ = [
        k for k in sorted(set(recorded) | set(settings)) if recorded.get(k) != settings.get(k)
    ]
    if differ:
        shown = "; ".join(
            f"{k}: {json.dumps(recorded.get(k))} then, {json.dumps(settings.get(k))} now"
            for k in differ[:4]
        )
        raise ValueError(
            f"--resume: the rows in {output} were scored with other settings ({shown}); "
            "resume with the same settings, or pass --overwrite"
        )


def _write_settings(output: Path, settings: dict[str, Any]) -> None:
    """Record the settings beside a new output (written whole, then renamed)."""
    sidecar = settings_path(output)
    staged = sidecar.with_name(sidecar.name + ".tmp")
    body = {"semsoft_classify": 1, "settings": settings}
    staged.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(staged, sidecar)


def _run_classify_file(
    args: argparse.Namespace, labels: list[str], template: Any, config: Any
) -> int:
    """Score every row of ``--input`` into ``--output``, a batch at a time.

    Each output row holds the input row's columns, then ``label``, ``p_<label>``
    (Semantic Softmax), ``constrained_<label>``, ``coverage``, ``fallback``, ``review``
    (top probability below ``--review-below``) and ``truncated`` (tokens cut from the
    end of a text longer than the context or ``--max-text-tokens``; 0 for most rows).
    Rows whose text is empty are not scored and not written; they are named in one
    line on stderr. Each batch is written and flushed when it finishes. The settings
    that change a value are recorded in ``OUTPUT.semsoft.json``. ``--resume`` keeps
    the complete rows already in the output (checking that they are this input's
    rows, in order, scored with the same settings) and restarts at the start of the
    batch it stopped in, so with the same ``--batch-size`` every row is computed in
    the same batch as in an uninterrupted run: the same numbers.
    """
    from tqdm.auto import tqdm

    from semsoft_plugin.app.columns import ResultColumns
    from semsoft_plugin.app.columns import row_list as _row_list
    from semsoft_plugin.app.columns import text_of as _text_of
    from semsoft_plugin.app.tables import open_table_writer, read_output, read_records

    if not 0.0 <= args.review_below <= 1.0:
        raise ValueError(f"--review-below {args.review_below} must be a probability in [0, 1]")
    if args.json:
        raise ValueError("--json is for one text; with --input the format follows --output")
    if not args.output:
        raise ValueError("--input needs --output (a .csv, .tsv, .jsonl or .parquet file)")
    if args.resume and args.overwrite:
        raise ValueError("give --resume or --overwrite, not both")
    output = _output_path(args)
    exists = output.exists() and output.stat().st_size > 0
    if exists and not (args.resume or args.overwrite):
        raise ValueError(
            f"--output {output} exists: pass --resume to continue it or --overwrite to replace it"
        )
    records = read_records(Path(args.input), encoding=args.encoding)
    columns = list(dict.fromkeys(key for record in records for key in record))
    if args.text_column not in columns:
        raise ValueError(f"{args.input}: no column {args.text_column!r}; columns are {columns}")
    result = ResultColumns(tuple(labels), args.column_prefix)
    label_col, added = result.label, result.names
    result.check_clash(columns, args.input)
    out_columns = columns + added
    texts = [_text_of(r.get(args.text_column)) for r in records]
    empty = [i + 1 for i, t in enumerate(texts) if not t.strip()]
    todo = [i for i, t in enumerate(texts) if t.strip()]
    if empty:
        print(
            f"semsoft classify: skipped {len(empty)} row(s) with an empty {args.text_column!r}: "
            f"row {_row_list(empty)}",
            file=sys.stderr,
        )

    settings = _run_settings(args, labels, template, config)
    resuming = args.resume and exists
    done: list[dict[str, Any]] = (
        read_output(output, out_columns, required=added) if resuming else []
    )
    if len(done) > len(todo):
        raise ValueError(f"--resume: {output} holds {len(done)} rows, the input only {len(todo)}")
    for n, (row, index) in enumerate(zip(done, todo, strict=False), start=1):
        if _text_of(row.get(args.text_column)) != texts[index]:
            raise ValueError(
                f"--resume: row {n} of {output} is not row {index + 1} of {args.input} "
                f"(column {args.text_column!r} differs): not this input's output"
            )
    if resuming:
        _check_settings(output, settings)
    # Restart at the start of the batch the last run stopped in (see the docstring).
    start = len(done) // args.batch_size * args.batch_size
    counts: Counter[str] = Counter(str(r.get(label_col)) for r in done)
    review = sum(str(r.get(result.review)).lower() == "true" for r in done)
    truncated = [
        todo[n] + 1 for n, r in enumerate(done) if str(r.get(result.truncated)) not in ("0", "")
    ]

    classifier = _classifier(args, labels, template, config) if len(done) < len(todo) else None
    if not resuming:
        _write_settings(output, settings)
    # Only a Parquet output needs the column types (and pyarrow, an optional extra).
    arrow = result.arrow_types() if output.suffix.lower() == ".parquet" else ()
    writer = open_table_writer(
        output, out_columns, append=args.resume, records=records, added=arrow
    )
    bar = tqdm(total=len(todo), initial=len(done), unit="row", desc="classify", file=sys.stderr)
    began, scored = time.perf_counter(), 0
    try:
        for first in range(start, len(todo) if classifier is not None else 0, args.batch_size):
            batch = todo[first : first + args.batch_size]
            details = classifier.predict_details([texts[i] for i in batch])  # type: ignore[union-attr]
            rows = result.rows([records[i] for i in batch], details, args.review_below)
            skip = max(0, len(done) - first)  # rows a resumed run already has
            fresh = rows[skip:]
            writer.write(fresh, names=[f"input row {i + 1}" for i in batch[skip:]])
            scored += len(fresh)
            counts.update(r[label_col] for r in fresh)
            review += sum(r[result.review] for r in fresh)
            truncated += [
                i + 1 for i, r in zip(batch[skip:], fresh, strict=True) if r[result.truncated]
            ]
            bar.update(len(fresh))
    except KeyboardInterrupt:
        bar.close()
        writer.close()
        print(
            f"semsoft classify: interrupted; {len(done) + scored} of {len(todo)} rows are in "
            f"{output}: run again with --resume to finish",
            file=sys.stderr,
        )
        raise
    bar.close()
    writer.close()
    seconds = time.perf_counter() - began
    total = len(done) + scored
    rate = f"{seconds / scored:.3f} s/row" if scored else "nothing left to score"
    print(
        f"{total} rows in {output} ({scored} scored now in {seconds:.1f} s, {rate}; "
        f"{len(done)} kept from before; {len(empty)} empty skipped)"
    )
    share = review / total if total else 0.0
    print(f"review (top probability < {args.review_below:g}): {review} rows ({share:.1%})")
    print("labels: " + ", ".join(f"{label} {counts.get(label, 0)}" for label in labels))
    if truncated:
        print(
            f"truncated to fit the context or --max-text-tokens: {len(truncated)} rows "
            f"(input row {_row_list(truncated)}; column {result.truncated} counts the tokens cut)"
        )
    return 0


# ---------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------


def _requested(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (the first argument not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    """The ``semsoft`` parser. Other packages' subcommands are listed by name; only the
    one named ``load`` is imported and gets its real parser (``MissingExtra`` when its
    module or a module it needs is not installed)."""
    parser = argparse.ArgumentParser(
        prog="semsoft", description="Calibrated label probabilities for LLM zero-shot classifiers."
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_classify_parser(subparsers)
    for name, command in discover_commands().items():
        if name == load:
            _load_command(command, subparsers)
        else:
            subparsers.add_parser(name, help=command.help, add_help=False)
    return parser


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
