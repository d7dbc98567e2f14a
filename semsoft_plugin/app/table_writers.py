"""Writing the scored rows of `semsoft classify --input`, and reading them back on
`--resume`.

Output: CSV, TSV or JSON lines, chosen by the suffix, written by `TableWriter`
one batch at a time (each batch is one `write` followed by a flush and `fsync`), so
an interrupted run keeps every finished batch and at most one partial record, which
`read_output` drops on `--resume`. A Parquet file is readable only once its
footer is written, so `ParquetTableWriter` (pyarrow, imported only there) writes
one row group per batch and the footer on close, and a Parquet output cannot be
resumed. Reading the input is `semsoft_plugin.app.tables`.
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

from semsoft_plugin.app.tables import table_format

__all__ = [
    "ParquetTableWriter",
    "TableWriter",
    "cell",
    "read_output",
    "unholdable",
]


def cell(value: Any) -> str:
    """A value as CSV text: strings as they are, `''` for None, a non-finite number as
    `inf`, `-inf` or `nan` (what pandas and pyarrow read back as one), JSON for
    everything else, a non-finite number inside it as Python's `json` writes and reads
    it (`NaN`, `Infinity`): a passthrough value survives a CSV/TSV output."""
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _json_line(record: Mapping[str, Any]) -> str:
    """One JSON-lines record, strict JSON: a NaN or infinity is refused (`ValueError`,
    named by `_unwritable`), never written as `null`; the file plan refuses an input
    holding one before any scoring."""
    return json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"


def _unwritable(path: Path, name: str, record: Mapping[str, Any], error: Exception) -> str:
    """The message for a record that cannot be encoded: the first bad column named."""
    strict = path.suffix.lower() in (".jsonl", ".ndjson")
    for column, value in record.items():
        try:
            if strict:
                json.dumps(value, allow_nan=False)
            else:
                cell(value)
        except (TypeError, ValueError) as bad:
            return (
                f"{path}: {name}, column {column!r}: "
                f"{type(value).__name__} value {value!r:.80} cannot be written ({bad})"
            )
    return f"{path}: {name} cannot be written ({error})"


class TableWriter:
    """Appends records to a CSV/TSV (fixed `columns`) or JSONL file, one batch per call.

    Parameters
    ----------
    path : str | Path
        The output file; its suffix picks the format
    columns : Sequence[str]
        The CSV/TSV header (JSONL records keep their own keys)
    append : bool
        Continue an existing file (`--resume`) instead of starting a new one
    kind : str | None
        The format when the caller already read it from the suffix, else read here
    """

    def __init__(
        self, path: str | Path, columns: Sequence[str], *, append: bool, kind: str | None = None
    ) -> None:
        self.path = Path(path)
        self.kind = kind or table_format(self.path, role="output file")
        self.columns = list(columns)
        fresh = not append or not self.path.exists() or self.path.stat().st_size == 0
        # Unbuffered bytes: a failed write (a full disk, a file-size limit) leaves nothing
        # in a buffer for close() or the garbage collector to try and fail again.
        self._handle = self.path.open("wb" if fresh else "ab", buffering=0)
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
        data = memoryview(text.encode("utf-8"))
        while data:  # a raw write may take only part of the bytes
            data = data[self._handle.write(data) or 0 :]
        os.fsync(self._handle.fileno())

    def write(
        self, records: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None
    ) -> None:
        """Write a batch of records and make it durable before returning.

        A value that cannot be written is a `ValueError` naming its record (by
        `names`, e.g. `"input row 7"`, else its number among the records this
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
    path: str | Path,
    columns: Sequence[str],
    *,
    required: Sequence[str] | None = None,
    kind: str | None = None,
) -> list[dict[str, Any]]:
    """The complete records of an output file written by `TableWriter`.

    A record cut short by an interruption (the file does not end with a newline, or a
    CSV row lacks fields) can only be the last one: it is dropped and the file is
    rewritten without it, so appending continues on a clean record boundary.
    `ValueError` when the file is not such an output (a CSV/TSV header other than
    `columns`, a JSONL record without the `required` keys, a bad line before the end).
    `kind`: the format when the caller already read it from the suffix.
    """
    path = Path(path)
    kind = kind or table_format(path, role="output file")
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
        with TableWriter(path, columns, append=False, kind=kind) as writer:
            writer.write(records)
    return records


class ParquetTableWriter:
    """Writes Arrow tables to a Parquet file, one row group per `write`; readable once
    closed.

    Parameters
    ----------
    path : str | Path
        The `.parquet` output
    schema : Any
        The pyarrow schema of every table written (passthrough columns keep the
        input's types, see `semsoft_plugin.app.file_plan`)
    """

    def __init__(self, path: str | Path, schema: Any) -> None:
        import pyarrow.parquet as pq

        self.path = Path(path)
        self.schema = schema
        self._writer = pq.ParquetWriter(self.path, schema)

    def write(self, table: Any, names: Sequence[str] | None = None) -> None:
        """Write a batch (a `pyarrow.Table` of `schema`) as one row group."""
        if table.num_rows:
            self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> ParquetTableWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def unholdable(kind: Any) -> str | None:
    """The part of the pyarrow type `kind` that CSV, TSV and JSON lines cannot hold as
    it is, or None when they can.

    They hold text, booleans, integers and floats (JSON numbers: a float32 is written
    as the exact double it is), and lists and structs of those (as JSON). Not held:
    bytes (`binary`: JSON has no bytes), times, dates and durations (Python's
    `datetime` stops at microseconds, so nanoseconds would be cut), decimals (no
    exact JSON type), maps (they would come back as lists of pairs), unions and
    extension types. A dictionary column is held when its values are.
    """
    import pyarrow as pa

    types = pa.types
    if types.is_dictionary(kind):
        return unholdable(kind.value_type)
    if (
        types.is_list(kind)
        or types.is_large_list(kind)
        or types.is_fixed_size_list(kind)
        or types.is_list_view(kind)
        or types.is_large_list_view(kind)
    ):
        return unholdable(kind.value_type)
    if types.is_struct(kind):
        return next(
            (found for field in kind if (found := unholdable(field.type)) is not None), None
        )
    simple = (
        types.is_null,
        types.is_boolean,
        types.is_integer,
        types.is_floating,
        types.is_string,
        types.is_large_string,
        types.is_string_view,
    )
    if isinstance(kind, pa.DataType) and any(test(kind) for test in simple):
        return None
    return str(kind)
