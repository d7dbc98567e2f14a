"""The plan of `semsoft classify --input IN --output OUT`: what the job reads, scores
and writes, decided and checked before a model is loaded.

Everything knowable from the arguments, the input's schema and the output's path is
refused here, by name, with nothing written: the formats, the text column and its type
(only strings are classified), every passthrough column's type and whether the output
format holds it (`semsoft_plugin.app.table_writers.unholdable`), the rows a `--resume`
keeps and the settings they were scored with. The job itself
(`semsoft_plugin.app.classify_file`) is then a straight read, score, write.

Passthrough columns come back as they went in (a Parquet output of a Parquet input takes
them from the input's Arrow table, never through Python values), and each distinct text is
scored once. What is refused and kept: docs/input-files.md ("Reading", "Writing").
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semsoft_plugin.app.columns import ResultColumns, counts_votes, text_of
from semsoft_plugin.app.file_settings import (
    TextFingerprint,
    check_fingerprints,
    check_settings,
    provenance,
    recorded_calibration,
    run_settings,
    settings_path,
)
from semsoft_plugin.app.table_writers import (
    ParquetTableWriter,
    TableWriter,
    read_output,
    unholdable,
)
from semsoft_plugin.app.tables import (
    located_rows,
    read_parquet_table,
    table_format,
    table_schema,
)
from semsoft_plugin.core.calibration import MIN_FILE_ROWS
from semsoft_plugin.core.text_rules import is_blank

__all__ = ["FileJob", "FilePlan", "check_output", "check_output_place", "file_job", "make_plan"]


@dataclass(frozen=True)
class FileJob:
    """The options of one file job, read from the command line once, at the start.

    Everything after (reading, scoring, writing, the settings record) takes this object
    and never the parsed arguments: each file's format is known here, from its suffix,
    and is not asked again.

    Attributes
    ----------
    input : Path
        The `--input` file.
    output : Path
        The `--output` file.
    input_kind : str
        The input's format (`"csv"`, `"tsv"`, `"jsonl"` or `"parquet"`).
    output_kind : str
        The output's format (`"csv"`, `"tsv"`, `"jsonl"` or `"parquet"`).
    text_column : str
        The column classified.
    encoding : str
        The input's text encoding (CSV, TSV, JSONL).
    column_prefix : str
        Put before every added column's name.
    batch_size : int
        Distinct texts per forward pass.
    review_below : float
        A row whose top probability is below it is flagged for review.
    resume : bool
        Keep the complete rows already in the output.
    overwrite : bool
        Replace an existing output.
    settings : dict
        What the rows are scored with (`run_settings`), recorded beside the output.
    made_with : dict
        The package version and known weights' hash (`provenance`).
    """

    input: Path
    output: Path
    input_kind: str
    output_kind: str
    text_column: str
    encoding: str
    column_prefix: str
    batch_size: int
    review_below: float
    resume: bool
    overwrite: bool
    settings: dict[str, Any]
    made_with: dict[str, Any]

    @property
    def file_strength(self) -> float | str | None:
        """`--calibrate file`'s strength (`"auto"` or a number), else `None`."""
        strength: float | str | None = self.settings["file_strength"]
        return strength


def file_job(
    args: argparse.Namespace,
    labels: list[str],
    template: Any,
    config: Any,
    *,
    fit_sha256: str | None = None,
) -> FileJob:
    """The options of a file job from the parsed `semsoft classify` arguments, the
    ones knowable without touching a file checked (`ValueError` naming the option).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments; read here and nowhere else in the file job.
    labels : list of str
        The labels in the user's order.
    template : PromptTemplate
        The prompt.
    config : SemsoftConfig
        The settings the rows are scored with.
    fit_sha256 : str or None
        The sha256 of the `--config` file holding a fitted correction, recorded in the
        settings so that `--resume` refuses another fit; `None` without one.

    Returns
    -------
    FileJob
        The job's options, each file's format read once from its suffix.
    """
    if not 0.0 <= args.review_below <= 1.0:
        raise ValueError(f"--review-below {args.review_below} must be a probability in [0, 1]")
    if args.json:
        raise ValueError("--json is for one text; with --input the format follows --output")
    if not args.output:
        raise ValueError("--input needs --output (a .csv, .tsv, .jsonl or .parquet file)")
    if args.resume and args.overwrite:
        raise ValueError("give --resume or --overwrite, not both")
    input_kind = table_format(args.input)
    output_kind = table_format(args.output, role="output file")
    settings = run_settings(args, labels, template, config)
    settings["fit"] = fit_sha256
    return FileJob(
        input=Path(args.input),
        output=Path(args.output),
        input_kind=input_kind,
        output_kind=output_kind,
        text_column=args.text_column,
        encoding=args.encoding,
        column_prefix=args.column_prefix,
        batch_size=args.batch_size,
        review_below=args.review_below,
        resume=bool(args.resume),
        overwrite=bool(args.overwrite),
        settings=settings,
        made_with=provenance(args.model),
    )


def check_output_place(output: Path, option: str = "--output") -> None:
    """Where an output file goes, checked before any work: its folder exists and can be
    written, and it is not a folder itself.

    Parameters
    ----------
    output : Path
        The output file.
    option : str
        The option that named it, for the messages.

    Raises
    ------
    ValueError
        Naming the path and what is wrong with it.
    """
    folder = output.parent
    if not folder.is_dir():
        raise ValueError(f"{option} {output}: folder {folder} does not exist")
    if output.is_dir():
        raise ValueError(f"{option} {output} is a folder; name a file in it")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{option} {output}: folder {folder} is not writable")


def check_output(job: FileJob) -> Path:
    """The output of a file job, checked before anything is read: a folder that exists,
    not a folder itself, not the input file under another name (a hard or symbolic
    link: compared by device and inode, so even `--overwrite` cannot truncate the
    input), and an existing output only with `--resume` or `--overwrite`.

    Parameters
    ----------
    job : FileJob
        The job's options (`file_job`).

    Returns
    -------
    Path
        The output file.
    """
    output = job.output
    check_output_place(output)
    source = job.input
    same = source.resolve() == output.resolve()
    if not same and source.exists() and output.exists():
        same = os.path.samefile(source, output)
    if same:
        raise ValueError(f"--output {output} is the input file {source} (the same file on disk)")
    if _has_rows(output) and not (job.resume or job.overwrite):
        raise ValueError(
            f"--output {output} exists: pass --resume to continue it or --overwrite to replace it"
        )
    if output.exists():
        try:  # root passes os.access on a read-only file system: open it to know
            output.open("ab").close()
        except OSError as error:
            raise ValueError(f"--output {output} cannot be written ({error.strerror})") from None
    return output


def _has_rows(output: Path) -> bool:
    return output.exists() and output.stat().st_size > 0


@dataclass
class FilePlan:
    """One file job, checked: what is read, what is scored, what is written where.

    `texts[i]` is input row `i`'s text (`""` when empty); `todo` the input rows
    scored, in order; `done` the output rows a `--resume` keeps (the first
    `len(done)` of `todo`). `records` are the input rows as Python values (empty
    for a Parquet output of a Parquet input, which takes `arrow`, the input table);
    `schema` is a Parquet output's schema. `correction` is the file correction a
    `--resume` found recorded (`None`: the first pass estimates it). The paths,
    formats and settings are the job's (`FileJob`).
    """

    job: FileJob
    columns: list[str]
    result: ResultColumns
    texts: list[str]
    todo: list[int]
    empty: list[int]
    done: list[dict[str, Any]]
    resuming: bool
    records: list[dict[str, Any]] = field(default_factory=list)
    arrow: Any = None
    schema: Any = None
    correction: Any = None

    @property
    def input(self) -> Path:
        """The input file."""
        return self.job.input

    @property
    def output(self) -> Path:
        """The output file."""
        return self.job.output

    @property
    def kind(self) -> str:
        """The output's format."""
        return self.job.output_kind

    @property
    def settings(self) -> dict[str, Any]:
        """What the rows are scored with (recorded beside the output)."""
        return self.job.settings

    @property
    def made_with(self) -> dict[str, Any]:
        """The package version and known weights' hash."""
        return self.job.made_with

    @property
    def batch_size(self) -> int:
        """Distinct texts per forward pass."""
        return self.job.batch_size

    @property
    def review_below(self) -> float:
        """The review threshold on a row's top probability."""
        return self.job.review_below

    @property
    def file_strength(self) -> float | str | None:
        """`--calibrate file`'s strength, else `None`."""
        return self.job.file_strength

    def fingerprint(self, rows: int | None = None) -> TextFingerprint:
        """The fingerprint of the texts of the first `rows` of `todo` (all: None).

        Parameters
        ----------
        rows : int or None
            How many rows to scored, in order.

        Returns
        -------
        TextFingerprint
            Their running fingerprint (the rows done grow it batch by batch).
        """
        todo = self.todo if rows is None else self.todo[:rows]
        return TextFingerprint([self.texts[i] for i in todo])

    @property
    def distinct(self) -> list[str]:
        """The texts of `todo`, each once, in the order they first appear."""
        return list(dict.fromkeys(self.texts[i] for i in self.todo))

    def batches(self) -> list[list[str]]:
        """The batches of distinct texts that the rows still to write need, in order.

        A batch is the same `batch_size` distinct texts whether a run is resumed or
        not (a resumed run scores again the earlier batch a later duplicate needs), so
        each text is scored in the same company, to the same numbers, either way."""
        distinct = self.distinct
        position = {text: n for n, text in enumerate(distinct)}
        size = self.batch_size
        needed = sorted({position[self.texts[i]] // size for i in self.todo[len(self.done) :]})
        return [distinct[k * size : (k + 1) * size] for k in needed]

    def open_writer(self) -> TableWriter | ParquetTableWriter:
        """The output's writer (a resumed CSV/TSV/JSONL output is continued)."""
        if self.kind == "parquet":
            return ParquetTableWriter(self.output, self.schema)
        return TableWriter(self.output, self.columns, append=self.resuming, kind=self.kind)

    def output_rows(self, rows: list[int], added: list[dict[str, Any]]) -> Any:
        """The output of input `rows` with their `added` columns: records for
        CSV/TSV/JSONL, a `pyarrow.Table` of `schema` for Parquet."""
        if self.kind != "parquet":
            return [{**self.records[i], **a} for i, a in zip(rows, added, strict=True)]
        import pyarrow as pa

        if self.arrow is None:
            merged = [{**self.records[i], **a} for i, a in zip(rows, added, strict=True)]
            return pa.Table.from_pylist(merged, schema=self.schema)
        passed = self.arrow.take(pa.array(rows, type=pa.int64()))
        tail = pa.schema([self.schema.field(name) for name in self.result.names])
        scores = pa.Table.from_pylist(added, schema=tail)
        return pa.Table.from_arrays([*passed.columns, *scores.columns], schema=self.schema)


def make_plan(job: FileJob, labels: list[str]) -> FilePlan:
    """The checked plan of a file job. Call it holding the output's lock: a
    `--resume` trims a row cut short from the output.

    Parameters
    ----------
    job : FileJob
        The job's options (`file_job`), its output checked (`check_output`).
    labels : list of str
        The labels in the user's order (the added columns' order).

    Returns
    -------
    FilePlan
        The rows to read, score and write.
    """
    source, output, kind = job.input, job.output, job.output_kind
    votes = counts_votes(semantic_weight=job.settings["config.semantic_weight"])
    result = ResultColumns(tuple(labels), job.column_prefix, votes=votes)
    column = job.text_column
    arrow = schema = None
    records: list[dict[str, Any]] = []
    if job.input_kind == "parquet":
        arrow = read_parquet_table(source)
        columns = list(arrow.column_names)
        _need_column(source, column, columns)
        texts = _parquet_texts(source, arrow, column)
        places = [f"{source}, row {n}" for n in range(1, len(texts) + 1)]
        result.check_clash(columns, str(source))
        if kind == "parquet":
            schema = _with_added(arrow.schema, result)
        else:
            _check_holdable(source, arrow.schema, output)
            records, arrow = arrow.to_pylist(), None
            if kind == "jsonl":
                _check_finite(source, list(enumerate(records, start=1)), output, "row")
    else:
        located = located_rows(source, encoding=job.encoding, kind=job.input_kind)
        records = [record for _, record in located]
        columns = list(dict.fromkeys(key for record in records for key in record))
        _need_column(source, column, columns)
        texts = [_text(r.get(column), f"{source}:{n}", column) for n, r in located]
        places = [f"{source}:{n}" for n, _ in located]
        result.check_clash(columns, str(source))
        if kind == "jsonl":
            _check_finite(source, located, output)
        if kind == "parquet":
            schema = _with_added(table_schema(records, columns), result)
    # One rule for blank texts on every path (text_rules.is_blank): whitespace, NBSP,
    # zero-width and other invisible characters alike are skipped before scoring.
    blank = [is_blank(text) for text in texts]
    todo = [i for i, empty in enumerate(blank) if not empty]
    _check_texts(texts, todo, places, column)
    resuming = job.resume and _has_rows(output)
    # A recorded run is checked against this one first: other settings also change the
    # columns, and this message names the setting. Without a record the rows are compared
    # first (another input's output says so) and the missing record is refused below.
    recorded = resuming and settings_path(output).is_file()
    if recorded:
        check_settings(output, job.settings)
    out_columns = columns + result.names
    done = read_output(output, out_columns, required=result.names, kind=kind) if resuming else []
    if len(done) > len(todo):
        raise ValueError(f"--resume: {output} holds {len(done)} rows, the input only {len(todo)}")
    for n, (row, index) in enumerate(zip(done, todo, strict=False), start=1):
        if text_of(row.get(column)) != texts[index]:
            raise ValueError(
                f"--resume: row {n} of {output} is not row {index + 1} of {source} "
                f"(column {column!r} differs): not this input's output"
            )
    correction = None
    if resuming:
        if not recorded:
            check_settings(output, job.settings)  # refuses the missing record, by name
        scored = [texts[i] for i in todo]
        check_fingerprints(output, scored, whole=job.file_strength is not None)
    if job.file_strength is not None:
        correction = _file_correction(source, output, texts, todo, done, resuming)
    return FilePlan(
        job=job,
        columns=out_columns,
        result=result,
        texts=texts,
        todo=todo,
        empty=[i + 1 for i, empty in enumerate(blank) if empty],
        done=done,
        resuming=resuming,
        records=records,
        arrow=arrow,
        schema=schema,
        correction=correction,
    )


def _file_correction(
    source: Path, output: Path, texts: list[str], todo: list[int], done: list[Any], resuming: bool
) -> Any:
    """`--calibrate file`: the correction a `--resume` reuses (`None`: estimate it in
    a first pass), refused before the model loads when the file has too few texts."""
    distinct = len({texts[i] for i in todo})
    if distinct < MIN_FILE_ROWS:
        raise ValueError(
            f"--calibrate file needs at least {MIN_FILE_ROWS} distinct texts to estimate "
            f"the label bias, {source} has {distinct}"
        )
    correction = recorded_calibration(output) if resuming else None
    if done and correction is None:
        raise ValueError(
            f"--resume: {output} holds rows but its settings record holds no file correction "
            "to apply to the rest: pass --overwrite to score it again"
        )
    return correction


def _need_column(source: Path, column: str, columns: list[str]) -> None:
    if column not in columns:
        raise ValueError(f"{source}: no column {column!r}; columns are {columns}")


def _text(value: Any, where: str, column: str) -> str:
    """A CSV/TSV/JSONL cell as the text to classify: `""` for a missing value (None,
    NaN); `ValueError` at `where` for anything but a string (a JSON number, bool,
    list or object is not a text; `predict_proba` refuses the same)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if not isinstance(value, str):
        raise ValueError(
            f"{where}: column {column!r} = {value!r:.60} is a {type(value).__name__}, not a "
            "string: only text is classified (quote it as a JSON string, or drop the row)"
        )
    return value


def _parquet_texts(source: Path, table: Any, column: str) -> list[str]:
    """A Parquet text column's values (`""` for null); `ValueError` naming the column
    and its type when it is not a string column."""
    import pyarrow as pa

    kind = table.schema.field(column).type
    value_kind = kind.value_type if pa.types.is_dictionary(kind) else kind
    text = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    if not (pa.types.is_null(value_kind) or any(test(value_kind) for test in text)):
        hint = (
            ": decode its bytes to strings first, e.g. pyarrow.compute.cast(column, pa.string())"
            if pa.types.is_binary(value_kind)
            or pa.types.is_large_binary(value_kind)
            or pa.types.is_fixed_size_binary(value_kind)
            or pa.types.is_binary_view(value_kind)
            else ""
        )
        raise ValueError(
            f"{source}: column {column!r} is {kind}, not a string column: only text is "
            f"classified{hint}"
        )
    try:
        values = table.column(column).to_pylist()
    except (UnicodeDecodeError, pa.ArrowInvalid) as error:
        raise ValueError(f"{source}: column {column!r} holds invalid UTF-8 ({error})") from None
    return [value or "" for value in values]


def _check_texts(texts: list[str], todo: list[int], places: list[str], column: str) -> None:
    """Each text to score checked by the Python API's rule (`text_list`) before any
    scoring, a refusal naming the file's line (or a Parquet row), never a position in
    a batch."""
    from semsoft_plugin.app.texts import text_list

    first = {texts[i]: i for i in reversed(todo)}  # each distinct text at its first row
    for i in sorted(first.values()):
        try:
            text_list([texts[i]])
        except ValueError as error:
            message = str(error).removeprefix("texts[0] ")
            raise ValueError(f"{places[i]}: column {column!r} {message}") from None


def _non_finite(value: Any) -> bool:
    """Whether a value holds a NaN or an infinity at any depth."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_non_finite(item) for item in value)
    return False


def _check_finite(
    source: Path, located: list[tuple[int, dict[str, Any]]], output: Path, unit: str = "line"
) -> None:
    """A JSON-lines output cannot hold a NaN or an infinity (strict JSON has none):
    `ValueError` naming the first passthrough column and row holding one, before any
    scoring, rather than writing it as `null`."""
    for number, record in located:
        for column, value in record.items():
            if _non_finite(value):
                where = f"{source}:{number}" if unit == "line" else f"{source}, row {number}"
                raise ValueError(
                    f"{where}: column {column!r} holds {value!r:.60}, which a JSON-lines "
                    f"output ({output.name}) cannot hold (strict JSON has no NaN or "
                    "infinity): write a .parquet output (or .csv, as inf/nan), or change "
                    "the value in the input"
                )


def _check_holdable(source: Path, schema: Any, output: Path) -> None:
    """`ValueError` naming the first passthrough column whose type `output`'s
    format (CSV/TSV/JSONL) cannot hold unchanged."""
    for column in schema:
        part = unholdable(column.type)
        if part is not None:
            inner = "" if part == str(column.type) else f", which holds {part}"
            raise ValueError(
                f"{source}: column {column.name!r} is {column.type}{inner}: a "
                f"{output.suffix} output cannot hold it unchanged; write a .parquet output, "
                "or convert the column (e.g. to text) in the input"
            )


def _with_added(schema: Any, result: ResultColumns) -> Any:
    """`schema` (its metadata kept) followed by the added columns' fields."""
    import pyarrow as pa

    added = [pa.field(name, kind) for name, kind in result.arrow_types()]
    return pa.schema([*schema, *added], metadata=schema.metadata)
