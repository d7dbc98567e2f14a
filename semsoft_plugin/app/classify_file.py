"""``semsoft classify --input FILE --output FILE``: every row of a table scored, a batch
at a time, resumable.

The output path is checked before anything is read or loaded; the settings that change
a written value are recorded beside the output (``OUTPUT.semsoft.json``) so that
``--resume`` can refuse to continue rows scored with other settings. Reading and
writing the tables is :mod:`semsoft_plugin.app.tables` and
:mod:`semsoft_plugin.app.table_writers`; the columns added are
:mod:`semsoft_plugin.app.columns`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from semsoft_plugin.app.classify_args import classifier_from_args

__all__ = ["run_classify_file", "settings_path"]


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


def run_classify_file(
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
    from semsoft_plugin.app.table_writers import open_table_writer, read_output
    from semsoft_plugin.app.tables import read_records, table_format

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

    classifier = (
        classifier_from_args(args, labels, template, config) if len(done) < len(todo) else None
    )
    if not resuming:
        _write_settings(output, settings)
    # Only a Parquet output needs the column types (and pyarrow, an optional extra).
    parquet = table_format(output, role="output file") == "parquet"
    arrow = result.arrow_types() if parquet else ()
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
