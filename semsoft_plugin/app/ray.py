"""Classify a data set on a Ray cluster (Ray Data).

Two pieces, not a second scoring path (vLLM run by Ray's own LLM processor is read by
`semsoft_plugin.app.ray_llm`):

* [`classify_dataset`][semsoft_plugin.app.ray.classify_dataset]: a `ray.data.Dataset` in,
  the same rows out with the columns of `semsoft classify --input` added; one
  [`Classifier`][semsoft_plugin.app.classifier.Classifier] per actor, so a row's numbers
  are those the CLI computes for it in a batch of the same rows;
* [`run_classify_cli`][semsoft_plugin.app.ray.run_classify_cli]: `semsoft classify --input DIR_OR_FILE --output DIR --ray`.

A dead actor is restarted and its unfinished batch resubmitted, with no row lost or scored
twice; a row the classifier cannot score is dropped and named on stderr. The file mode is
the CLI's two passes. `import semsoft_plugin.app.ray` does not import Ray
(`pip install 'semsoft-plugin[ray]'`). Faults and the file mode: docs/ray.md.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from semsoft_plugin.app import file_mode
from semsoft_plugin.app.columns import ResultColumns, counts_votes, row_list, text_of
from semsoft_plugin.app.engine_settings import EngineSettings
from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.core.text_rules import is_blank

__all__ = ["aligned_blocks", "classify_dataset", "run_classify_cli"]

ROW_COLUMN = "row"
OUTPUT_FORMATS = ("parquet", "csv", "jsonl")


# ---------------------------------------------------------------------------
# classify a Dataset: one Classifier per actor
# ---------------------------------------------------------------------------


class _ScoreBatch:
    """The `map_batches` actor: builds one `Classifier` when Ray starts the actor
    (and again if Ray restarts it) and scores each pyarrow batch it is given."""

    def __init__(
        self,
        model: str,
        labels: Sequence[str],
        classifier_kwargs: Mapping[str, Any],
        text_column: str,
        id_column: str | None,
        column_prefix: str,
        review_below: float,
        threads: int,
    ) -> None:
        import torch

        from semsoft_plugin.app.classifier import Classifier

        torch.set_num_threads(threads)
        self.classifier = Classifier.from_pretrained(model, list(labels), **classifier_kwargs)
        votes = counts_votes(classifier_kwargs.get("config"))
        self.columns = ResultColumns(tuple(labels), column_prefix, votes=votes)
        self.text_column = text_column
        self.id_column = id_column
        self.review_below = review_below

    def _name(self, batch: Any, index: int) -> str:
        if self.id_column is None:
            return f"a row ({self.text_column} starts {text_of(batch.column(self.text_column)[index].as_py())[:40]!r})"
        return f"{self.id_column} {batch.column(self.id_column)[index].as_py()!r}"

    def _score(self, texts: list[str]) -> list[dict[str, Any] | ValueError]:
        """The added columns of each text; a batch refused as a whole is scored text by
        text so that only the bad rows are lost (their error in their place)."""
        try:
            details = self.classifier.predict_details(texts)
            return list(self.columns.values(details, self.review_below))
        except ValueError:
            if len(texts) == 1:
                raise
        found: list[dict[str, Any] | ValueError] = []
        for text in texts:
            try:
                found.extend(self._score([text]))
            except ValueError as error:
                found.append(error)
        return found

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        texts = [text_of(v) for v in batch.column(self.text_column).to_pylist()]
        keep = [i for i, t in enumerate(texts) if not is_blank(t)]
        for i in sorted(set(range(len(texts))) - set(keep)):
            print(f"semsoft: {self._name(batch, i)}: empty text, not scored", file=sys.stderr)
        scored = self._score([texts[i] for i in keep]) if keep else []
        rows, added = [], []
        for i, values in zip(keep, scored, strict=True):
            if isinstance(values, ValueError):
                print(f"semsoft: {self._name(batch, i)}: not scored: {values}", file=sys.stderr)
                continue
            rows.append(i)
            added.append(values)
        out = batch.take(pa.array(rows, type=pa.int64()))
        for name, kind in self.columns.arrow_types():
            out = out.append_column(pa.field(name, kind), pa.array([a[name] for a in added], kind))
        return out


def classify_dataset(
    dataset: Any,
    labels: Sequence[str],
    *,
    model: str = "default",
    text_column: str = "text",
    id_column: str | None = None,
    backend: str = "transformers",
    engine_args: Mapping[str, Any] | None = None,
    dtype: str = "auto",
    batch_size: int = 8,
    concurrency: int | tuple[int, int] = 1,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    review_below: float = 0.6,
    column_prefix: str = "",
    **classifier_kwargs: Any,
) -> Any:
    """Classify every row of a `ray.data.Dataset`; lazy, like any Ray Data transform.

    Parameters
    ----------
    dataset : Any
        A `ray.data.Dataset` with a text column
    labels : Sequence[str]
        Label names (at least two), as for [`Classifier`][semsoft_plugin.app.classifier.Classifier]
    model : str
        As [`Classifier.from_pretrained`][semsoft_plugin.app.classifier.Classifier.from_pretrained];
        each actor loads the model once (`backend="vllm"`: one `vllm.LLM` per actor, give it
        `num_gpus=1`)
    backend : str
        As `model`
    engine_args : Mapping[str, Any] | None
        As `model`; the actors' `EngineSettings(engine_args=...)`
    dtype : str
        As `model`; the actors' `EngineSettings(dtype=...)`
    text_column : str
        The column to classify
    id_column : str | None
        A column naming rows in the messages about rows not scored (every
        input column is kept in the output in any case)
    batch_size : int
        Rows per `Classifier` call, as `--batch-size`; a row's scores are the CLI's when its batch
        holds the same rows (blocks whose sizes are multiples of `batch_size` keep the batches
        aligned; [`run_classify_cli`][semsoft_plugin.app.ray.run_classify_cli] makes them so)
    concurrency : int | tuple[int, int]
        Actors (an int, or `(min, max)` for an autoscaling pool)
    num_cpus, num_gpus : float | None
        Resources per actor, passed to `map_batches`; torch in a CPU
        actor uses `num_cpus` threads (default 1)
    review_below : float
        Flag `review` when the top probability is below this
    column_prefix : str
        Prefix of the added columns (`--column-prefix`)
    **classifier_kwargs : Any
        The `Classifier`'s other options (`prompt`, `config`, `calibrate`,
        `fit_policy`, ...). With `calibrate="file"` the scoring pass runs at this call (the
        correction needs every row), then a lazy model-free `map_batches` applies the
        correction, estimated with `fit_policy.file_strength` (docs/ray.md, "From Python")

    Returns
    -------
    Any
        The scored rows: every input column, then `label`, `p_<label>`,
        `constrained_<label>`, `coverage` (where `semantic_weight > 0`), `fallback`,
        `review`, `truncated`. Rows with an empty text, or that the classifier refuses,
        are left out and named on stderr. Bad options fail here, before any actor starts.

    Examples
    --------
    ```python
    import ray
    from semsoft_plugin.app.ray import classify_dataset

    ds = ray.data.read_csv("reviews.csv")
    scored = classify_dataset(ds, ["positive", "negative"], text_column="text", concurrency=2)
    scored.write_parquet("scored/")   # the input columns, then label, p_<label>, ...
    ```
    """
    from semsoft_plugin.app.classifier import Classifier
    from semsoft_plugin.core.labels import label_names

    names = label_names(labels)
    if not 0.0 <= review_below <= 1.0:
        raise ValueError(f"review_below={review_below} must be a probability in [0, 1]")
    columns = list(dataset.schema().names)
    for name, role in ((text_column, "text_column"), (id_column, "id_column")):
        if name is not None and name not in columns:
            raise ValueError(f"{role}={name!r} is not a column; the columns are {columns}")
    ResultColumns(tuple(names), column_prefix).check_clash(columns, "the dataset")
    engine = EngineSettings(
        batch_size=batch_size, dtype=dtype, engine_args=dict(engine_args) if engine_args else None
    )
    kwargs = {"backend": backend, "engine": engine, **classifier_kwargs}
    Classifier(model, None, names, **kwargs).check_params()  # an unknown option: TypeError
    strength = (kwargs.get("fit_policy") or FitPolicy()).file_strength
    file = kwargs.get("calibrate") == "file"
    if file:  # the actors give raw scores; the second pass corrects them with `strength`
        kwargs["calibrate"] = None
        if kwargs.get("fit_policy") is not None:
            kwargs["fit_policy"] = kwargs["fit_policy"].set_params(file_strength="auto")
    resources = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    scored = dataset.map_batches(
        _ScoreBatch,
        fn_constructor_kwargs={
            "model": model,
            "labels": names,
            "classifier_kwargs": kwargs,
            "text_column": text_column,
            "id_column": id_column,
            "column_prefix": column_prefix,
            "review_below": review_below,
            "threads": max(1, int(num_cpus or 1)),
        },
        batch_size=batch_size,
        batch_format="pyarrow",
        compute=_actor_pool(concurrency),
        **{k: v for k, v in resources.items() if v is not None},
    )
    if not file:
        return scored
    votes = counts_votes(kwargs.get("config"))
    result = ResultColumns(tuple(names), column_prefix, votes=votes)
    return _file_pass(scored.materialize(), result, text_column, strength, review_below)


def _file_pass(
    scored: Any,
    columns: ResultColumns,
    text_column: str,
    strength: float | str,
    review_below: float,
) -> Any:
    """The file mode's second pass: the correction of one row per distinct text, applied
    to every row alone by a model-free `map_batches`."""
    first: dict[str, dict[str, Any]] = {}
    for batch in scored.select_columns([text_column, *columns.p]).iter_batches(
        batch_format="pyarrow"
    ):
        for row in batch.to_pylist():
            first.setdefault(text_of(row[text_column]), row)
    correction = file_mode.estimate_rows(columns, list(first.values()), strength)
    print(f"semsoft: {file_mode.describe(columns.labels, correction)}", file=sys.stderr)
    return scored.map_batches(
        _apply_correction,
        fn_kwargs={"columns": columns, "correction": correction, "review_below": review_below},
        batch_format="pyarrow",
    )


def _apply_correction(
    batch: Any, columns: ResultColumns, correction: Any, review_below: float
) -> Any:
    """One pyarrow batch with `correction` applied to each row's probability columns."""
    import pyarrow as pa

    changed = [*columns.p, columns.label, columns.review]
    rows = file_mode.corrected_rows(
        columns, batch.select(changed).to_pylist(), correction, review_below
    )
    for name in changed:
        index = batch.schema.get_field_index(name)
        kind = batch.schema.field(name)
        batch = batch.set_column(index, kind, pa.array([r[name] for r in rows], kind.type))
    return batch


def _actor_pool(concurrency: int | tuple[int, int]) -> Any:
    """`concurrency` as Ray's `ActorPoolStrategy`: `map_batches(concurrency=...)`
    is deprecated since Ray 2.51 and logs a warning a user would have to look up."""
    from ray.data import ActorPoolStrategy

    if isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1:
        return ActorPoolStrategy(size=concurrency)
    if (
        isinstance(concurrency, tuple)
        and len(concurrency) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in concurrency)
        and 1 <= concurrency[0] <= concurrency[1]
    ):
        return ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1])
    raise ValueError(
        f"concurrency={concurrency!r} must be a positive int or a (min, max) pair of them"
    )


def aligned_blocks(table: Any, batch_size: int, *, max_blocks: int = 256) -> list[Any]:
    """`table` cut into blocks of a multiple of `batch_size` rows (at most about
    `max_blocks`), so Ray's batches hold the same rows as the CLI's batches."""
    batches = max(1, math.ceil(table.num_rows / batch_size))
    rows = batch_size * max(1, math.ceil(batches / max_blocks))
    return [table.slice(start, rows) for start in range(0, table.num_rows, rows)]


# ---------------------------------------------------------------------------
# semsoft classify --ray
# ---------------------------------------------------------------------------


def _read_output_dir(path: Path, kind: str, columns: Sequence[str]) -> Any:
    import pyarrow.dataset as pads

    pattern = {"parquet": "parquet", "csv": "csv", "jsonl": "json"}[kind]
    files = sorted(str(p) for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    # One thread: in the driver after a Ray Data run, Arrow's threaded scan of many JSON
    # files waited forever (60 files of a 2-actor run); the files are small, read once.
    return pads.dataset(files, format=pattern).to_table(columns=list(columns), use_threads=False)


def run_classify_cli(args: Any, labels: list[str], template: Any, config: Any) -> int:
    """`semsoft classify --input DIR_OR_FILE --output DIR --ray`.

    The input (a CSV/TSV/JSONL/Parquet file, or a directory of them read in name
    order) is read on this machine; every row gets its 1-based number in the column
    `row` (`--id-column` names an input column to use instead), rows with an empty
    text are named and skipped as in the CLI, and the rest go to the cluster in blocks
    aligned to `--batch-size`. The output directory holds Ray's files (Parquet by
    default, `--output-format`); afterwards its `row`/`label`/`review` columns
    are read back for the summary, which names any row missing from the output.
    """
    import pyarrow as pa
    import ray

    from semsoft_plugin.app.classify_args import file_strength
    from semsoft_plugin.app.tables import read_arrow

    if args.resume:
        raise ValueError(
            "--resume does not apply with --ray: Ray retries failed work itself; write to a "
            "new --output directory"
        )
    if args.json:
        raise ValueError("--json is for one text; with --input the format follows --output")
    if not args.output:
        raise ValueError("--ray needs --output DIR (a directory Ray writes its files into)")
    if not 0.0 <= args.review_below <= 1.0:
        raise ValueError(f"--review-below {args.review_below} must be a probability in [0, 1]")
    kind = args.output_format
    output = Path(args.output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        if not args.overwrite:
            raise ValueError(f"--output {output} exists: pass --overwrite to replace it")
        if not output.is_dir():
            raise ValueError(f"--output {output} is a file; --ray writes a directory")
        for old in output.iterdir():
            if old.is_file():
                old.unlink()
    table = read_arrow(args.input)
    columns = list(table.schema.names)
    if args.text_column not in columns:
        raise ValueError(f"{args.input}: no column {args.text_column!r}; columns are {columns}")
    result = ResultColumns(tuple(labels), args.column_prefix, votes=counts_votes(config))
    id_column = args.id_column
    if id_column is None:
        id_column = f"{args.column_prefix}{ROW_COLUMN}"
        if id_column in columns:
            raise ValueError(
                f"{args.input} already has a column {id_column!r}: pass --id-column "
                f"{id_column} to use it, or --column-prefix"
            )
        table = table.append_column(id_column, pa.array(range(1, table.num_rows + 1), pa.int64()))
    elif id_column not in columns:
        raise ValueError(f"--id-column {id_column!r} is not a column; columns are {columns}")
    result.check_clash(columns, args.input)
    texts = [text_of(v) for v in table.column(args.text_column).to_pylist()]
    ids = table.column(id_column).to_pylist()
    empty = [ids[i] for i, t in enumerate(texts) if is_blank(t)]
    if empty:
        print(
            f"semsoft classify: skipped {len(empty)} row(s) with an empty {args.text_column!r}: "
            f"{id_column} {row_list(empty)}",
            file=sys.stderr,
        )
    todo = [i for i, t in enumerate(texts) if not is_blank(t)]
    table = table.take(pa.array(todo, pa.int64()))
    if not ray.is_initialized():
        ray.init(address=args.ray_address, log_to_driver=True)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # files in input order
    dataset = ray.data.from_arrow(aligned_blocks(table, args.batch_size))
    began = time.perf_counter()
    strength = file_strength(args)  # None without --calibrate file
    scored = classify_dataset(
        dataset,
        labels,
        model=args.model,
        text_column=args.text_column,
        id_column=id_column,
        backend=args.backend,
        engine_args=args.engine_args,
        dtype=args.dtype,
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        review_below=args.review_below,
        column_prefix=args.column_prefix,
        prompt=template,
        config=config,
        calibrate=args.calibrate,
        **({"fit_policy": FitPolicy(file_strength=strength)} if strength is not None else {}),
    )
    # The writes reserve no CPU, at most one per actor: when the actors hold every CPU
    # (two one-CPU actors on two CPUs), a write asking for one waits until the actors
    # finish, and every scored block piles up in the object store meanwhile. Writing
    # Arrow blocks to files is I/O next to the model's work.
    write = {"ray_remote_args": {"num_cpus": 0}, "concurrency": args.concurrency}
    if kind == "parquet":
        scored.write_parquet(str(output), **write)
    elif kind == "csv":
        scored.write_csv(str(output), **write)
    else:  # pandas writes 10 significant digits unless told otherwise
        scored.write_json(str(output), double_precision=15, force_ascii=False, **write)
    seconds = time.perf_counter() - began
    done = _read_output_dir(output, kind, [id_column, result.label, result.review])
    written = done.column(id_column).to_pylist()
    missing = sorted(set(ids[i] for i in todo) - set(written), key=str)
    repeated = [k for k, n in Counter(written).items() if n > 1]
    if repeated:  # a broken id column (not unique), or a fault we do not know of
        print(
            f"semsoft classify: {id_column} {row_list(repeated)} appear more than once in {output}",
            file=sys.stderr,
        )
    if missing:
        print(
            f"semsoft classify: {len(missing)} row(s) could not be scored (see the messages "
            f"above): {id_column} {row_list(missing)}",
            file=sys.stderr,
        )
    total = done.num_rows
    rate = f"{seconds / total:.3f} s/row" if total else "nothing scored"
    print(
        f"{total} rows in {output} ({kind}; {seconds:.1f} s, {rate} with "
        f"{args.concurrency} actor(s); {len(empty)} empty skipped; {len(missing)} failed)"
    )
    review = sum(
        bool(v) and str(v).lower() != "false" for v in done.column(result.review).to_pylist()
    )
    share = review / total if total else 0.0
    print(f"review (top probability < {args.review_below:g}): {review} rows ({share:.1%})")
    counts = Counter(done.column(result.label).to_pylist())
    print("labels: " + ", ".join(f"{label} {counts.get(label, 0)}" for label in labels))
    return 1 if missing else 0
