"""Reading and writing the tables ``semsoft classify --input`` works on (stdlib only).

Input: CSV (``.csv``), TSV (``.tsv``/``.tab``) or JSON lines (``.jsonl``/``.ndjson``),
one record per row; the evaluation package reads its data files with the same
:func:`read_records`. Output: CSV, TSV or JSON lines, chosen by the suffix, written by
:class:`TableWriter` one batch at a time (each batch is one ``write`` followed by a
flush and ``fsync``), so an interrupted run keeps every finished batch and at most one
partial record, which :func:`read_output` drops on ``--resume``.

Parquet (``.parquet``), in and out, and directories of such files (the Ray path) are
handled by the functions at the end (pyarrow, imported only there): a Parquet file is
readable only once its footer is written, so :class:`ParquetTableWriter` writes one row
group per batch and the footer on close, and a Parquet output cannot be resumed.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "INPUT_SUFFIXES",
    "OUTPUT_SUFFIXES",
    "ParquetTableWriter",
    "TableWriter",
    "cell",
    "json_safe",
    "open_table_writer",
    "read_arrow",
    "read_delimited",
    "read_jsonl",
    "read_lines",
    "read_output",
    "read_parquet_records",
    "read_records",
    "read_text",
    "table_format",
    "table_schema",
]

_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
}
INPUT_SUFFIXES = tuple(_FORMATS)
OUTPUT_SUFFIXES = (".csv", ".tsv", ".jsonl", ".parquet")


def table_format(path: str | Path, *, role: str = "data file") -> str:
    """``"csv"``, ``"tsv"`` or ``"jsonl"`` from the suffix; ``ValueError`` naming it otherwise."""
    suffix = Path(path).suffix.lower()
    allowed = INPUT_SUFFIXES if role == "data file" else OUTPUT_SUFFIXES
    if suffix not in allowed:
        raise ValueError(
            f"{role} {path}: unknown format {suffix!r}; use .csv, .tsv, .jsonl or .parquet"
        )
    return _FORMATS[suffix]


def read_text(path: Path, encoding: str = "utf-8") -> str:
    """The whole text of ``path`` decoded with ``encoding``.

    UTF-8 is read as ``utf-8-sig``: a byte-order mark at the start (Excel's "CSV
    UTF-8") is dropped instead of ending up in the first column's name. A byte that
    does not decode is a ``ValueError`` naming the file, the line and the byte, and
    suggesting ``--encoding`` (a latin-1 or cp1252 export read as UTF-8 is the usual
    case); nothing is replaced silently.
    """
    codec = _codec(encoding)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot be read ({error.strerror})") from None
    try:
        return data.decode(codec)
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        byte = data[error.start : error.start + 1].hex()
        raise ValueError(
            f"{path}:{line}: not valid {encoding} (byte 0x{byte} at offset {error.start}); "
            "pass the file's encoding, e.g. --encoding latin-1 or --encoding cp1252"
        ) from None


def _codec(encoding: str) -> str:
    """The codec to decode with: ``utf-8-sig`` for UTF-8; ``ValueError`` if unknown."""
    import codecs

    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise ValueError(f"--encoding {encoding!r} is not a known text encoding") from None
    return "utf-8-sig" if name in ("utf-8", "utf-8-sig") else name


def read_lines(path: Path, encoding: str = "utf-8") -> list[str]:
    """The non-blank lines of a text file; ``ValueError`` if missing or empty."""
    if not path.is_file():
        raise ValueError(f"data file not found: {path}")
    lines = [line for line in read_text(path, encoding).splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"data file {path} is empty")
    return lines


def read_records(path: Path, encoding: str = "utf-8") -> list[dict[str, object]]:
    """The rows of a CSV, TSV or JSONL file as dicts (CSV values are strings).

    Malformed files are refused with the file and line named, never read with rows
    lost: see :func:`read_delimited` and :func:`read_jsonl`.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data file not found: {path}")
    kind = table_format(path)
    if kind == "parquet":
        return read_parquet_records(path)
    if kind == "jsonl":
        return read_jsonl(path, encoding)
    return read_delimited(path, "," if kind == "csv" else "\t", encoding)


def read_jsonl(path: Path, encoding: str = "utf-8") -> list[dict[str, object]]:
    """The objects of a JSON-lines file, one per non-blank line.

    A line that is not a JSON object, or an object with a key twice (``json`` would
    keep the last value and drop the first in silence), is refused naming the line.
    """

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        twice = sorted({key for key in keys if keys.count(key) > 1})
        if twice:
            raise _DuplicateKey(twice)
        return dict(pairs)

    records = []
    for number, line in enumerate(read_lines(path, encoding), start=1):
        try:
            record = json.loads(line, object_pairs_hook=unique)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        except _DuplicateKey as error:
            raise ValueError(f"{path}:{number}: key(s) {error.args[0]} appear twice") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: each JSONL line must be an object")
        records.append(record)
    return records


class _DuplicateKey(Exception):
    """A JSON object with a repeated key (raised from the decoder's pairs hook)."""


def read_delimited(path: Path, delimiter: str, encoding: str = "utf-8") -> list[dict[str, object]]:
    """The rows of a CSV/TSV file under its header, every row checked against it.

    Refused, naming the file and line: a header with an empty or repeated column name
    (a dict would drop one of the two columns); a row with more or fewer fields than
    the header (``csv.DictReader`` files the extra fields under ``None`` and fills the
    missing ones with ``None``); a quoted field that is never closed (an unbalanced
    quote would otherwise swallow the rest of the file into one text, so the error
    names the line where that field starts) or text after a closing quote. Blank
    lines are skipped. A BOM left in a name (a second one, after a concatenation) is
    removed.
    """
    reader = csv.reader(
        io.StringIO(read_text(path, encoding), newline=""), delimiter=delimiter, strict=True
    )
    header: list[str] | None = None
    records: list[dict[str, object]] = []
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as error:
            what = (
                "a quoted field opened on this line is never closed (unbalanced quote)"
                if "end of data" in str(error)
                else f"malformed quoting ({error})"
            )
            raise ValueError(f"{path}:{start}: {what}") from None
        line, start = start, reader.line_num + 1
        if not row:
            continue
        if header is None:
            header = [name.replace("\ufeff", "") for name in row]
            _check_header(path, line, header)
            continue
        if len(row) != len(header):
            raise ValueError(
                f"{path}:{line}: {len(row)} field(s), the header has {len(header)} "
                f"({header}); quote fields holding {delimiter!r}"
            )
        records.append(dict(zip(header, row, strict=True)))
    if not records:
        raise ValueError(f"data file {path} is empty (no rows under the header)")
    return records


def _check_header(path: Path, line: int, header: list[str]) -> None:
    empty = [i + 1 for i, name in enumerate(header) if not name.strip()]
    if empty:
        raise ValueError(f"{path}:{line}: header column(s) {empty} have no name")
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise ValueError(f"{path}:{line}: header names column(s) {twice} more than once")


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinity (at any depth) replaced by ``None``.

    JSON has no NaN: a passthrough column holding one (pandas writes NaN for a missing
    value, and Python's ``json`` reads ``NaN`` from a JSONL file) is written as
    ``null`` in JSON lines and as an empty cell in CSV/TSV, the same as a missing
    value, instead of failing the batch after it was scored.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def cell(value: Any) -> str:
    """A value as CSV text: strings as they are, JSON for everything else, '' for None
    (and for NaN or infinity, see :func:`json_safe`)."""
    value = json_safe(value)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _json_line(record: Mapping[str, Any]) -> str:
    return json.dumps(json_safe(record), ensure_ascii=False, allow_nan=False) + "\n"


def _unwritable(path: Path, name: str, record: Mapping[str, Any], error: Exception) -> str:
    """The message for a record that cannot be encoded: the first bad column named."""
    for column, value in record.items():
        try:
            cell(value)
        except (TypeError, ValueError) as bad:
            return (
                f"{path}: {name}, column {column!r}: "
                f"{type(value).__name__} value {value!r:.80} cannot be written ({bad})"
            )
    return f"{path}: {name} cannot be written ({error})"


class TableWriter:
    """Appends records to a CSV/TSV (fixed ``columns``) or JSONL file, one batch per call.

    Parameters
    ----------
    path : the output file; its suffix picks the format
    columns : the CSV/TSV header (JSONL records keep their own keys)
    append : continue an existing file (``--resume``) instead of starting a new one
    """

    def __init__(self, path: str | Path, columns: Sequence[str], *, append: bool) -> None:
        self.path = Path(path)
        self.kind = table_format(self.path, role="output file")
        self.columns = list(columns)
        fresh = not append or not self.path.exists() or self.path.stat().st_size == 0
        self._handle = self.path.open("w" if fresh else "a", encoding="utf-8", newline="")
        self._rows = 0  # data rows written by this writer (error messages count from 1)
        if fresh and self.kind != "jsonl":
            self._write_text(self._encode([dict(zip(self.columns, self.columns, strict=True))]))

    def _encode(
        self, records: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None
    ) -> str:
        buffer = io.StringIO()
        writer = csv.writer(
            buffer, delimiter="," if self.kind == "csv" else "\t", lineterminator="\n"
        )
        for number, record in enumerate(records):
            try:
                if self.kind == "jsonl":
                    buffer.write(_json_line(record))
                else:
                    writer.writerow([cell(record.get(c)) for c in self.columns])
            except (TypeError, ValueError) as error:
                name = names[number] if names else f"record {self._rows + number + 1}"
                raise ValueError(_unwritable(self.path, name, record, error)) from None
        return buffer.getvalue()

    def _write_text(self, text: str) -> None:
        self._handle.write(text)
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def write(
        self, records: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None
    ) -> None:
        """Write a batch of records and make it durable before returning.

        A value that cannot be written is a ``ValueError`` naming its record (by
        ``names``, e.g. ``"input row 7"``, else its number among the records this
        writer wrote) and its column, raised before anything of the batch is written.
        """
        if records:
            self._write_text(self._encode(records, names))
            self._rows += len(records)

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def read_output(
    path: str | Path, columns: Sequence[str], *, required: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The complete records of an output file written by :class:`TableWriter`.

    A record cut short by an interruption (the file does not end with a newline, or a
    CSV row lacks fields) can only be the last one: it is dropped and the file is
    rewritten without it, so appending continues on a clean record boundary.
    ``ValueError`` when the file is not such an output (a CSV/TSV header other than
    ``columns``, a JSONL record without the ``required`` keys, a bad line before the end).
    """
    path = Path(path)
    kind = table_format(path, role="output file")
    if kind == "parquet":
        raise ValueError(
            f"--resume: {path} is Parquet, which is complete only once closed: it cannot be "
            "continued (write .jsonl or .csv to resume, or use --ray, which retries failed work)"
        )
    raw = path.read_text(encoding="utf-8")
    if not raw:
        return []
    clean_end = raw.endswith("\n")
    if kind == "jsonl":
        lines = raw.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        records: list[dict[str, Any]] = []
        for number, line in enumerate(lines, start=1):
            last = number == len(lines)
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if last:
                    break
                raise ValueError(f"--resume: {path}:{number} is not valid JSON") from None
            if last and not clean_end:
                break
            keys = columns if required is None else required
            missing = [c for c in keys if c not in record] if isinstance(record, dict) else keys
            if missing:
                raise ValueError(
                    f"--resume: {path}:{number} lacks column(s) {missing}; it was not written "
                    "by this command with these labels"
                )
            records.append(record)
        complete = len(records) == len(lines) and clean_end
    else:
        reader = csv.DictReader(io.StringIO(raw), delimiter="," if kind == "csv" else "\t")
        header = reader.fieldnames or []
        if list(header) != list(columns):
            raise ValueError(
                f"--resume: {path} has columns {list(header)}, this run writes {list(columns)}"
            )
        rows = list(reader)
        records = []
        for number, row in enumerate(rows, start=1):
            cut = None in row.values() or None in row
            if number == len(rows) and (cut or not clean_end):
                break
            if cut:
                raise ValueError(f"--resume: {path}: row {number} has a wrong number of fields")
            records.append(row)
        complete = len(records) == len(rows) and clean_end
    if not complete:
        with TableWriter(path, columns, append=False) as writer:
            writer.write(records)
    return records


# ---------------------------------------------------------------------------
# Parquet and directories (pyarrow; the Ray path and .parquet files)
# ---------------------------------------------------------------------------


def read_parquet_records(path: Path) -> list[dict[str, object]]:
    """The rows of a Parquet file as dicts (values in their Parquet types)."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow's ArrowInvalid and OSError name no file
        raise ValueError(f"data file {path}: not a readable Parquet file ({error})") from None
    if table.num_rows == 0:
        raise ValueError(f"data file {path} is empty (no rows)")
    return table.to_pylist()


def table_schema(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Any:
    """A pyarrow schema for ``records`` with ``columns`` in order, inferred from every
    record (a column that is None throughout becomes a string column);
    ``ValueError`` naming a column whose values have no common type."""
    import pyarrow as pa

    fields = []
    for name in columns:
        try:
            kind = pa.array([r.get(name) for r in records]).type
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise ValueError(
                f"column {name!r} mixes value types Parquet cannot hold ({error})"
            ) from None
        fields.append(pa.field(name, pa.string() if pa.types.is_null(kind) else kind))
    return pa.schema(fields)


def read_arrow(path: str | Path) -> Any:
    """One file, or every table file of a directory in name order, as one
    ``pyarrow.Table`` (CSV/TSV values stay strings, as :func:`read_records` reads them).
    Files of a directory must agree on their columns' types."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if path.is_dir():
        files = sorted(
            p for p in path.iterdir() if p.is_file() and p.suffix.lower() in INPUT_SUFFIXES
        )
        if not files:
            raise ValueError(f"input directory {path} holds no {'/'.join(INPUT_SUFFIXES)} file")
    elif path.is_file():
        files = [path]
    else:
        raise ValueError(f"data file not found: {path}")
    tables = []
    for file in files:
        if table_format(file) == "parquet":
            tables.append(pq.read_table(file))
            continue
        records = read_records(file)
        columns = list(dict.fromkeys(key for record in records for key in record))
        schema = table_schema(records, columns)
        tables.append(pa.Table.from_pylist(records, schema=schema))
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise ValueError(f"the files of {path} do not agree on their columns: {error}") from None


class ParquetTableWriter:
    """Writes records to a Parquet file, one row group per ``write``; readable once closed.

    Parameters
    ----------
    path : the ``.parquet`` output
    schema : the pyarrow schema of every record (see :func:`table_schema`)
    """

    def __init__(self, path: str | Path, schema: Any) -> None:
        import pyarrow.parquet as pq

        self.path = Path(path)
        self.schema = schema
        self._writer = pq.ParquetWriter(self.path, schema)

    def write(
        self, records: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None
    ) -> None:
        """Write a batch as one row group (``names`` as in :meth:`TableWriter.write`;
        pyarrow's own error names the column a value does not fit)."""
        import pyarrow as pa

        if records:
            self._writer.write_table(pa.Table.from_pylist(list(records), schema=self.schema))

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> ParquetTableWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def open_table_writer(
    path: str | Path,
    columns: Sequence[str],
    *,
    append: bool,
    records: Sequence[Mapping[str, Any]] = (),
    added: Sequence[tuple[str, Any]] = (),
) -> TableWriter | ParquetTableWriter:
    """The writer for ``path``'s format: :class:`TableWriter` (CSV/TSV/JSONL), or
    :class:`ParquetTableWriter` with the input ``records``' column types followed by
    the ``added`` ``(name, pyarrow type)`` columns (Parquet cannot be appended to)."""
    if table_format(path, role="output file") != "parquet":
        return TableWriter(path, columns, append=append)
    import pyarrow as pa

    if append:
        raise ValueError(f"--resume: {path} is Parquet, which cannot be continued")
    names = {name for name, _ in added}
    schema = table_schema(records, [c for c in columns if c not in names])
    return ParquetTableWriter(path, pa.schema([*schema, *(pa.field(n, t) for n, t in added)]))
