"""Reading the tables `semsoft classify --input` works on, strictly (stdlib; pyarrow
only for Parquet).

Input: CSV (`.csv`), TSV (`.tsv`/`.tab`), JSON lines (`.jsonl`/`.ndjson`) or
Parquet (`.parquet`), one record per row; the evaluation package reads its data
files with the same `read_records`. A malformed file is refused with the file and
line named, never read with rows lost. `read_arrow` reads a file, or a directory
of them, as one `pyarrow.Table` (the Ray path); pyarrow is imported only there and in
the Parquet reader. Writing the output, and reading it back on `--resume`, is
`semsoft_plugin.app.table_writers`.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "INPUT_SUFFIXES",
    "OUTPUT_SUFFIXES",
    "delimited_rows",
    "jsonl_rows",
    "located_rows",
    "read_arrow",
    "read_delimited",
    "read_jsonl",
    "read_lines",
    "read_parquet_records",
    "read_parquet_table",
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
    """`"csv"`, `"tsv"`, `"jsonl"` or `"parquet"` from the suffix; `ValueError`
    naming it otherwise (`role="output file"` takes only the suffixes it writes)."""
    suffix = Path(path).suffix.lower()
    allowed = INPUT_SUFFIXES if role == "data file" else OUTPUT_SUFFIXES
    if suffix not in allowed:
        raise ValueError(
            f"{role} {path}: unknown format {suffix!r}; use .csv, .tsv, .jsonl or .parquet"
        )
    return _FORMATS[suffix]


def read_text(path: Path, encoding: str = "utf-8") -> str:
    """The whole text of `path` decoded with `encoding`.

    UTF-8 is read as `utf-8-sig`: a byte-order mark at the start (Excel's "CSV
    UTF-8") is dropped instead of ending up in the first column's name. A byte that
    does not decode is a `ValueError` naming the file, the line and the byte, and
    suggesting `--encoding` (a latin-1 or cp1252 export read as UTF-8 is the usual
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
    """The codec to decode with: `utf-8-sig` for UTF-8; `ValueError` if unknown."""
    import codecs

    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise ValueError(f"--encoding {encoding!r} is not a known text encoding") from None
    return "utf-8-sig" if name in ("utf-8", "utf-8-sig") else name


def read_lines(path: Path, encoding: str = "utf-8") -> list[str]:
    """The non-blank lines of a text file; `ValueError` if missing or empty."""
    if not path.is_file():
        raise ValueError(f"data file not found: {path}")
    lines = [line for line in read_text(path, encoding).splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"data file {path} is empty")
    return lines


def read_records(path: Path, encoding: str = "utf-8") -> list[dict[str, object]]:
    """The rows of a CSV, TSV or JSONL file as dicts (CSV values are strings).

    Malformed files are refused with the file and line named, never read with rows
    lost: see `read_delimited` and `read_jsonl`.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data file not found: {path}")
    if table_format(path) == "parquet":
        return read_parquet_records(path)
    return [record for _, record in located_rows(path, encoding)]


def located_rows(
    path: Path, encoding: str = "utf-8", *, kind: str | None = None
) -> list[tuple[int, dict[str, object]]]:
    """`(line number, record)` for each row of a CSV, TSV or JSONL file: the line
    names a bad value in a message (`file:line`); Parquet has no lines, see
    `read_parquet_table`. `kind`: the format when the caller already read it
    from the suffix (`table_format`), else read here."""
    path = Path(path)
    kind = kind or table_format(path)
    if kind == "parquet":
        raise ValueError(f"{path}: Parquet has no lines; read it with read_parquet_table")
    if not path.is_file():
        raise ValueError(f"data file not found: {path}")
    if kind == "jsonl":
        return jsonl_rows(path, encoding)
    return delimited_rows(path, "," if kind == "csv" else "\t", encoding)


def read_jsonl(path: Path, encoding: str = "utf-8") -> list[dict[str, object]]:
    """The objects of a JSON-lines file, one per non-blank line (see `jsonl_rows`)."""
    return [record for _, record in jsonl_rows(path, encoding)]


def jsonl_rows(path: Path, encoding: str = "utf-8") -> list[tuple[int, dict[str, object]]]:
    """`(line number, object)` for each non-blank line of a JSON-lines file.

    Refused naming the line: a line that is not a JSON object, an object with a key
    twice (`json` would keep the last value and drop the first in silence), and a
    string holding a lone surrogate (a `"\\ud800"` escape decodes to one; it cannot
    be tokenised or written back as UTF-8, so it would fail the run later, after rows
    were scored). Lines are split at newlines only: a raw U+2028 inside a JSON string
    is text, not a line break. An empty file is refused.
    """

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        twice = sorted({key for key in keys if keys.count(key) > 1})
        if twice:
            raise _DuplicateKey(twice)
        return dict(pairs)

    if not path.is_file():
        raise ValueError(f"data file not found: {path}")
    rows = []
    for number, line in enumerate(read_text(path, encoding).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, object_pairs_hook=unique)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        except _DuplicateKey as error:
            raise ValueError(f"{path}:{number}: key(s) {error.args[0]} appear twice") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: each JSONL line must be an object")
        bad = _surrogate_key(record)
        if bad is not None:
            raise ValueError(
                f"{path}:{number}: {bad} holds a lone surrogate (an unpaired \\ud800-\\udfff "
                "escape), which is not text: fix the line or drop it"
            )
        rows.append((number, record))
    if not rows:
        raise ValueError(f"data file {path} is empty")
    return rows


def _surrogate_key(value: Any, where: str = "") -> str | None:
    """Where in a decoded JSON value a string holds a lone surrogate (`key 'text'`,
    `key 'a'[2]`), or None; paired escapes were already joined by the decoder."""
    if isinstance(value, str):
        return where or "a value" if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{where}[{key!r}]" if where else f"key {key!r}"
            found = _surrogate_key(key, f"the name of {name}") or _surrogate_key(item, name)
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _surrogate_key(item, f"{where}[{index}]")
            if found:
                return found
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


class _DuplicateKey(Exception):
    """A JSON object with a repeated key (raised from the decoder's pairs hook)."""


def read_delimited(path: Path, delimiter: str, encoding: str = "utf-8") -> list[dict[str, object]]:
    """The rows of a CSV/TSV file under its header (see `delimited_rows`)."""
    return [record for _, record in delimited_rows(path, delimiter, encoding)]


def delimited_rows(
    path: Path, delimiter: str, encoding: str = "utf-8"
) -> list[tuple[int, dict[str, object]]]:
    """`(line number, row)` for each row of a CSV/TSV file under its header (the line
    a row starts on: a quoted field may span lines), every row checked against it.

    Refused, naming the file and line: a header with an empty or repeated column name
    (a dict would drop one of the two columns); a row with more or fewer fields than
    the header (`csv.DictReader` files the extra fields under `None` and fills the
    missing ones with `None`); a quoted field that is never closed (an unbalanced
    quote would otherwise swallow the rest of the file into one text, so the error
    names the line where that field starts) or text after a closing quote. Blank
    lines are skipped. A BOM left in a name (a second one, after a concatenation) is
    removed.
    """
    reader = csv.reader(
        io.StringIO(read_text(path, encoding), newline=""), delimiter=delimiter, strict=True
    )
    header: list[str] | None = None
    records: list[tuple[int, dict[str, object]]] = []
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
        records.append((line, dict(zip(header, row, strict=True))))
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


# ---------------------------------------------------------------------------
# Parquet and directories (pyarrow; the Ray path and .parquet files)
# ---------------------------------------------------------------------------


def read_parquet_records(path: Path) -> list[dict[str, object]]:
    """The rows of a Parquet file as dicts (values in their Parquet types)."""
    return list(read_parquet_table(path).to_pylist())


def read_parquet_table(path: Path) -> Any:
    """A Parquet file as one `pyarrow.Table`; `ValueError` naming the file when it is
    not readable or holds no rows."""
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        raise ValueError(f"data file not found: {path}")
    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow's ArrowInvalid and OSError name no file
        raise ValueError(f"data file {path}: not a readable Parquet file ({error})") from None
    if table.num_rows == 0:
        raise ValueError(f"data file {path} is empty (no rows)")
    return table


def table_schema(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> Any:
    """A pyarrow schema for `records` with `columns` in order, inferred from every
    record (a column that is None throughout becomes a string column);
    `ValueError` naming a column whose values have no common type."""
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
    `pyarrow.Table` (CSV/TSV values stay strings, as `read_records` reads them).
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
