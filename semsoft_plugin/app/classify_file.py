"""`semsoft classify --input FILE --output FILE`: every row of a table scored, a batch
at a time, resumable.

The job is one plan, made and checked before the model loads
(`semsoft_plugin.app.file_plan`), under the output's lock (`semsoft_plugin.app.output_lock`:
one writer per output); then a straight read, score, write. The settings that change a
written value are recorded beside the output (`OUTPUT.semsoft.json`,
`semsoft_plugin.app.file_settings`). With `--calibrate file`
(`semsoft_plugin.app.file_mode`) a first pass scores every distinct text and writes
nothing; its scores stay in memory, so no text is scored twice. See docs/input-files.md.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from semsoft_plugin.app import file_mode
from semsoft_plugin.app.columns import row_list
from semsoft_plugin.app.file_plan import FileJob, FilePlan, check_output, make_plan
from semsoft_plugin.app.file_settings import settings_path, write_settings
from semsoft_plugin.app.output_lock import OutputLock

__all__ = ["run_classify_file"]


def run_classify_file(
    job: FileJob, labels: list[str], make_classifier: Callable[[], Any]
) -> int:
    """Score every row of `--input` into `--output`, a batch at a time.

    Each output row holds the input row's columns (a Parquet output keeps their types
    exactly), then `label`, `p_<label>` (Semantic Softmax), `constrained_<label>`,
    `coverage`, `fallback`, `review` (top probability below `--review-below`) and
    `truncated` (tokens cut from the end of a text longer than the context or
    `--max-text-tokens`; 0 for most rows). Rows whose text is empty are not scored and
    not written; they are named in one line on stderr. A text is scored once however
    many rows hold it. Each batch is written and flushed when it finishes. `--resume`
    keeps the complete rows already in the output (checking that they are this input's
    rows, in order, scored with the same settings); every text is scored in the same
    batch as in an uninterrupted run, so the numbers are the same. With `--calibrate
    file`, `p_<label>`, `label` and `review` have the file correction applied (a
    `--resume` reuses the recorded one; a run stopped before it was recorded estimates
    it again).

    Parameters
    ----------
    job : FileJob
        The job's options, read once from the command line
        ([file_job][semsoft_plugin.app.file_plan.file_job]).
    labels : list of str
        The labels in the user's order.
    make_classifier : callable
        Builds the classifier; called once the plan is checked, and only when rows are
        left to score.

    Returns
    -------
    int
        0, or 1 when writing the output failed (a full disk, a file-size limit): one
        line on stderr says so and that `--resume` continues.
    """
    output = check_output(job)
    with OutputLock(output):
        plan = make_plan(job, labels)
        if plan.empty:
            print(
                f"semsoft classify: skipped {len(plan.empty)} row(s) with an empty "
                f"{job.text_column!r}: row {row_list(plan.empty)}",
                file=sys.stderr,
            )
        remaining = len(plan.done) < len(plan.todo)
        classifier = make_classifier() if remaining else None
        return _score(plan, classifier, labels)


@dataclass
class _Tally:
    """What a run did, for its summary lines."""

    rows: int = 0  # rows written now
    texts: int = 0  # distinct texts scored now
    batches: int = 0
    labels: Counter[str] = field(default_factory=Counter)
    review: int = 0
    truncated: list[int] = field(default_factory=list)  # input row numbers

    def add(self, plan: FilePlan, rows: list[int], added: list[dict[str, Any]]) -> None:
        result = plan.result
        self.rows += len(rows)
        self.labels.update(str(a.get(result.label)) for a in added)
        self.review += sum(str(a.get(result.review)).lower() == "true" for a in added)
        self.truncated += [
            i + 1
            for i, a in zip(rows, added, strict=True)
            if str(a.get(result.truncated)) not in ("0", "")
        ]


def _score(plan: FilePlan, classifier: Any, labels: list[str]) -> int:
    """Score the plan's batches and write each row as soon as its text has scores."""
    from tqdm.auto import tqdm

    kept, now = _Tally(), _Tally()
    kept.add(plan, plan.todo[: len(plan.done)], plan.done)
    bar = tqdm(
        total=len(plan.todo), initial=len(plan.done), unit="row", desc="classify", file=sys.stderr
    )
    began, writer = time.perf_counter(), None
    scores: dict[str, dict[str, Any]] = {}
    first: dict[str, dict[str, Any]] = {}  # --calibrate file: the first pass's raw rows
    pending = len(plan.done)  # the next position in plan.todo to write
    correction = plan.correction
    whole, done = plan.fingerprint().to_dict(), plan.fingerprint(pending)

    def record() -> None:
        write_settings(plan.output, plan.settings, plan.made_with, correction,
                       input_print=whole, done_print=done.to_dict())  # fmt: skip

    try:
        if not plan.resuming:
            record()
        if plan.file_strength is not None and correction is None and classifier is not None:
            correction = _first_pass(plan, classifier, first, now)
            record()
        writer = plan.open_writer()
        for chunk in plan.batches() if classifier is not None else []:
            if all(text in first for text in chunk):
                added = [first[text] for text in chunk]
            else:
                details = classifier.predict_details(chunk)
                added = plan.result.values(details, plan.review_below)
                now.texts, now.batches = now.texts + len(chunk), now.batches + 1
            if correction is not None:
                added = file_mode.corrected_rows(plan.result, added, correction, plan.review_below)
            scores.update(zip(chunk, added, strict=True))
            end = pending
            while end < len(plan.todo) and plan.texts[plan.todo[end]] in scores:
                end += 1
            rows = plan.todo[pending:end]
            added = [scores[plan.texts[i]] for i in rows]
            writer.write(plan.output_rows(rows, added), names=[f"input row {i + 1}" for i in rows])
            done.add([plan.texts[i] for i in rows])
            record()  # after the rows are durable: the record never counts a row not written
            now.add(plan, rows, added)
            bar.update(len(rows))
            pending = end
        writer.close()
    except KeyboardInterrupt:
        bar.close()
        _close_quietly(writer)
        if writer is None and plan.file_strength is not None:
            print(
                "semsoft classify: interrupted in the first pass of --calibrate file (nothing "
                "written): run the same command again",
                file=sys.stderr,
            )
            raise
        print(
            f"semsoft classify: interrupted; {pending} of {len(plan.todo)} rows are in "
            f"{plan.output}: run again with --resume to finish",
            file=sys.stderr,
        )
        raise
    except OSError as error:
        bar.close()
        _close_quietly(writer)
        then = (
            "Parquet cannot be continued: run again with --overwrite"
            if plan.kind == "parquet"
            else "then run the same command with --resume to continue"
        )
        print(
            f"semsoft classify: error: writing {plan.output} failed after {pending} of "
            f"{len(plan.todo)} rows ({error.strerror or error}): free space or raise the "
            f"file-size limit, {then}",
            file=sys.stderr,
        )
        return 1
    except Exception:
        bar.close()
        _close_quietly(writer)
        if not plan.resuming and pending == 0:  # nothing of this run's: nothing to resume
            plan.output.unlink(missing_ok=True)
            settings_path(plan.output).unlink(missing_ok=True)
        raise
    bar.close()
    _summary(plan, kept, now, time.perf_counter() - began, labels)
    if correction is not None:
        print(file_mode.describe(labels, correction))
    return 0


def _first_pass(
    plan: FilePlan, classifier: Any, first: dict[str, dict[str, Any]], now: _Tally
) -> Any:
    """`--calibrate file`: score every distinct text (in the write pass's batches, so
    its numbers are the write pass's) and estimate the correction from them (each text
    once); the caller records it beside the output before any row is written."""
    from tqdm.auto import tqdm

    distinct = plan.distinct
    with tqdm(total=len(distinct), unit="text", desc="first pass", file=sys.stderr) as bar:
        for chunk in plan.batches():
            details = classifier.predict_details(chunk)
            first.update(zip(chunk, plan.result.values(details, plan.review_below), strict=True))
            now.texts, now.batches = now.texts + len(chunk), now.batches + 1
            bar.update(len(chunk))
    rows = [first[text] for text in distinct]
    # Only called in the file mode, where the plan holds the strength (0 is a strength:
    # `or 1.0` once applied --file-strength 0 at full strength).
    assert plan.file_strength is not None
    return file_mode.estimate_rows(plan.result, rows, plan.file_strength)


def _close_quietly(writer: Any) -> None:
    """Close a writer after a failure; a second error from it (the same full disk)
    adds nothing to the first."""
    if writer is not None:
        try:
            writer.close()
        except OSError:
            pass


def _summary(plan: FilePlan, kept: _Tally, now: _Tally, seconds: float, labels: list[str]) -> None:
    total = kept.rows + now.rows
    rate = f"{seconds / now.rows:.3f} s/row" if now.rows else "nothing left to score"
    texts = ""
    if now.rows:
        texts = f"; {now.texts} distinct text(s) scored in {now.batches} batch(es)"
        if now.rows > now.texts:
            texts += f", {now.rows - now.texts} duplicate row(s) not scored again"
    print(
        f"{total} rows in {plan.output} ({now.rows} scored now in {seconds:.1f} s, {rate}"
        f"{texts}; {kept.rows} kept from before; {len(plan.empty)} empty skipped)"
    )
    review = kept.review + now.review
    share = review / total if total else 0.0
    print(f"review (top probability < {plan.review_below:g}): {review} rows ({share:.1%})")
    counts = kept.labels + now.labels
    print("labels: " + ", ".join(f"{label} {counts.get(label, 0)}" for label in labels))
    truncated = kept.truncated + now.truncated
    if truncated:
        print(
            f"truncated to fit the context or --max-text-tokens: {len(truncated)} rows "
            f"(input row {row_list(truncated)}; column {plan.result.truncated} counts the "
            "tokens cut)"
        )
