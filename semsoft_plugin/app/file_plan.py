"""The plan of ``semsoft classify --input IN --output OUT``: what the job reads, scores
and writes, decided and checked before a model is loaded.

Everything knowable from the arguments, the input's schema and the output's path is
refused here, by name, with nothing written: the input and output formats, the text
column and its type (only strings are classified: a JSONL ``42``, ``true``, list or
object is refused by ``file:line``, a Parquet ``binary`` column by its type), every
passthrough column's type and whether the output format holds it (CSV, TSV and JSON
lines cannot hold a ``timestamp[ns]`` without cutting it, see
:func:`~semsoft_plugin.app.table_writers.unholdable`), the rows a ``--resume`` keeps and
the settings they were scored with. The job itself
(:mod:`semsoft_plugin.app.classify_file`) is then a straight read, score, write.

Passthrough columns come back as they went in: a Parquet output of a Parquet input
takes them from the input's Arrow table (the same type and bits: nanoseconds,
dictionaries, unsigned and 32-bit numbers, decimals, nested types), never through
Python values. Texts are scored once each: a batch holds distinct texts, in the order
they first appear, and a row whose text was scored before takes those scores.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semsoft_plugin.app.columns import ResultColumns, text_of
from semsoft_plugin.app.file_settings import (
    check_settings,
    provenance,
    recorded_calibration,
    run_settings,
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

__all__ = ["FilePlan", "check_output", "make_plan"]


def check_output(args: argparse.Namespace) -> Path:
    """The options of a file job and ``--output``, checked before anything is read: a
    known format for both files, a folder that exists, not a folder itself, not the
    input file under another name (a hard or symbolic link: compared by device and
    inode, so even ``--overwrite`` cannot truncate the input), and an existing output
    only with ``--resume`` or ``--overwrite``."""
    if not 0.0 <= args.review_below <= 1.0:
        raise ValueError(f"--review-below {args.review_below} must be a probability in [0, 1]")
    if args.json:
        raise ValueError("--json is for one text; with --input the format follows --output")
    if not args.output:
        raise ValueError("--input needs --output (a .csv, .tsv, .jsonl or .parquet file)")
    if args.resume and args.overwrite:
        raise ValueError("give --resume or --overwrite, not both")
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
    if _has_rows(output) and not (args.resume or args.overwrite):
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

    ``texts[i]`` is input row ``i``'s text (``""`` when empty); ``todo`` the input rows
    scored, in order; ``done`` the output rows a ``--resume`` keeps (the first
    ``len(done)`` of ``todo``). ``records`` are the input rows as Python values (empty
    for a Parquet output of a Parquet input, which takes ``arrow``, the input table);
    ``schema`` is a Parquet output's schema. ``file_strength`` is ``--calibrate
    file``'s strength (``"auto"`` or a number; ``None`` without it) and ``correction`` the file correction a
    ``--resume`` found recorded (``None``: the first pass estimates it).
    """

    input: Path
    output: Path
    kind: str
    columns: list[str]
    result: ResultColumns
    texts: list[str]
    todo: list[int]
    empty: list[int]
    done: list[dict[str, Any]]
    settings: dict[str, Any]
    made_with: dict[str, Any]
    resuming: bool
    batch_size: int
    review_below: float
    records: list[dict[str, Any]] = field(default_factory=list)
    arrow: Any = None
    schema: Any = None
    file_strength: float | str | None = None
    correction: Any = None

    @property
    def distinct(self) -> list[str]:
        """The texts of :attr:`todo`, each once, in the order they first appear."""
        return list(dict.fromkeys(self.texts[i] for i in self.todo))

    def batches(self) -> list[list[str]]:
        """The batches of distinct texts that the rows still to write need, in order.

        A batch is the same ``batch_size`` distinct texts whether a run is resumed or
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
        return TableWriter(self.output, self.columns, append=self.resuming)

    def output_rows(self, rows: list[int], added: list[dict[str, Any]]) -> Any:
        """The output of input ``rows`` with their ``added`` columns: records for
        CSV/TSV/JSONL, a ``pyarrow.Table`` of :attr:`schema` for Parquet."""
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


def make_plan(
    args: argparse.Namespace, labels: list[str], template: Any, config: Any, output: Path
) -> FilePlan:
    """The checked plan of a file job (``output`` from :func:`check_output`). Call it
    holding the output's lock: a ``--resume`` trims a row cut short from the output."""
    source, kind = Path(args.input), table_format(output, role="output file")
    result = ResultColumns(tuple(labels), args.column_prefix)
    column = args.text_column
    arrow = schema = None
    records: list[dict[str, Any]] = []
    if table_format(source) == "parquet":
        arrow = read_parquet_table(source)
        columns = list(arrow.column_names)
        _need_column(source, column, columns)
        texts = _parquet_texts(source, arrow, column)
        result.check_clash(columns, str(source))
        if kind == "parquet":
            schema = _with_added(arrow.schema, result)
        else:
            _check_holdable(source, arrow.schema, output)
            records, arrow = arrow.to_pylist(), None
    else:
        located = located_rows(source, encoding=args.encoding)
        records = [record for _, record in located]
        columns = list(dict.fromkeys(key for record in records for key in record))
        _need_column(source, column, columns)
        texts = [_text(r.get(column), f"{source}:{n}", column) for n, r in located]
        result.check_clash(columns, str(source))
        if kind == "parquet":
            schema = _with_added(table_schema(records, columns), result)
    todo = [i for i, text in enumerate(texts) if text.strip()]
    settings = run_settings(args, labels, template, config)
    resuming = bool(args.resume) and _has_rows(output)
    out_columns = columns + result.names
    done = read_output(output, out_columns, required=result.names) if resuming else []
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
        check_settings(output, settings)
    strength = settings["file_strength"]
    if strength is not None:
        correction = _file_correction(source, output, texts, todo, done, resuming)
    return FilePlan(
        input=source,
        output=output,
        kind=kind,
        columns=out_columns,
        result=result,
        texts=texts,
        todo=todo,
        empty=[i + 1 for i, text in enumerate(texts) if not text.strip()],
        done=done,
        settings=settings,
        made_with=provenance(args.model),
        resuming=resuming,
        batch_size=args.batch_size,
        review_below=args.review_below,
        records=records,
        arrow=arrow,
        schema=schema,
        file_strength=strength,
        correction=correction,
    )


def _file_correction(
    source: Path, output: Path, texts: list[str], todo: list[int], done: list[Any], resuming: bool
) -> Any:
    """``--calibrate file``: the correction a ``--resume`` reuses (``None``: estimate it in
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
    """A CSV/TSV/JSONL cell as the text to classify: ``""`` for a missing value (None,
    NaN); ``ValueError`` at ``where`` for anything but a string (a JSON number, bool,
    list or object is not a text; ``predict_proba`` refuses the same)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if not isinstance(value, str):
        raise ValueError(
            f"{where}: column {column!r} = {value!r:.60} is a {type(value).__name__}, not a "
            "string: only text is classified (quote it as a JSON string, or drop the row)"
        )
    return value


def _parquet_texts(source: Path, table: Any, column: str) -> list[str]:
    """A Parquet text column's values (``""`` for null); ``ValueError`` naming the column
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


def _check_holdable(source: Path, schema: Any, output: Path) -> None:
    """``ValueError`` naming the first passthrough column whose type ``output``'s
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
    """``schema`` (its metadata kept) followed by the added columns' fields."""
    import pyarrow as pa

    added = [pa.field(name, kind) for name, kind in result.arrow_types()]
    return pa.schema([*schema, *added], metadata=schema.metadata)
