"""`semsoft classify --input`, tried as a hostile user would (issue 34): passthrough columns
kept exactly, one writer per output, texts that are not text, late write failures and
duplicate texts.

Each test names what it guards. A refusal that must come before the model loads is
checked with the model loader replaced by one that fails the test if it is called.
"""

from __future__ import annotations

import csv
import decimal
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from semsoft_plugin import Classifier
from semsoft_plugin.app import cli as cli_module
from semsoft_plugin.app.cli import main
from semsoft_plugin.app.file_settings import settings_path
from semsoft_plugin.app.output_lock import OutputLock, lock_path

ROOT = Path(__file__).resolve().parents[1]
LABELS = "positive,negative"
SMALL = "smollm2-135m"
REVIEWS = [
    "I loved this film, the acting was wonderful.",
    "Awful, just awful.",
    "Great fun.",
    "A warm and funny story.",
    "Dull and far too long.",
    "The best thing I saw this year.",
]


def run(inp: Path, out: Path, *extra: str) -> int:
    argv = ["classify", "--input", str(inp), "--labels", LABELS, "--output", str(out)]
    return main([*argv, "--model", SMALL, *extra])


def command(inp: Path, out: Path, *extra: str) -> list[str]:
    """The same run as a separate process (``python -m semsoft_plugin``)."""
    argv = ["classify", "--input", str(inp), "--labels", LABELS, "--output", str(out)]
    return [sys.executable, "-m", "semsoft_plugin", *argv, "--model", SMALL, *extra]


def subprocess_env() -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        TQDM_DISABLE="1",
    )


@pytest.fixture
def no_model(monkeypatch):
    """Fails the test if the job gets as far as loading a model."""

    def refuse(*_, **__):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(cli_module, "classifier_from_args", refuse)


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def left_behind(folder: Path, *keep: Path) -> list[str]:
    """Files a refused run left in ``folder`` (none may block a rerun)."""
    return sorted(p.name for p in folder.iterdir() if p not in keep)


def write_csv(path: Path, texts: list[str]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "text"])
        writer.writerows([str(n), text] for n, text in enumerate(texts, start=1))
    return path


# ---------------------------------------------------------------------------
# 1. Parquet passthrough columns: the same type and the same bits
# ---------------------------------------------------------------------------


def passthrough_table() -> pa.Table:
    """One column of every Arrow type a passthrough column may have; row 2's text is
    null (skipped), so the kept rows are a selection, not the whole table."""
    nested = pa.list_(pa.struct([("a", pa.int32()), ("b", pa.string())]))
    return pa.table(
        {
            "text": pa.array([REVIEWS[0], None, REVIEWS[1], REVIEWS[2]], pa.string()),
            "ts": pa.array([1577836800123456789, 1577836800123456001, 5, 6], pa.timestamp("ns")),
            "ts_tz": pa.array([1, 2, 3, 4], pa.timestamp("ns", tz="Europe/Paris")),
            "dur": pa.array([1, 2, 3, -4], pa.duration("ns")),
            "cat": pa.array(["x", "y", "x", "z"]).dictionary_encode(),
            "u8": pa.array([0, 255, 7, 8], pa.uint8()),
            "u64": pa.array([2**64 - 1, 0, 1, 2], pa.uint64()),
            "f32": pa.array([0.1, -1e-45, float("nan"), 3.4e38], pa.float32()),
            "dec": pa.array(
                [decimal.Decimal("12345678.91"), decimal.Decimal("0.01"), None, 0],
                pa.decimal128(10, 2),
            ),
            "nested": pa.array([[{"a": 1, "b": "q"}], [], None, [{"a": None, "b": "é"}]], nested),
            "map": pa.array([[("k", 1)], [], None, [("a", 2)]], pa.map_(pa.string(), pa.int64())),
            "bin": pa.array([b"\x00\xff", b"", None, b"x"], pa.binary()),
            "date": pa.array([0, 1, 2, 19000], pa.date32()),
            "large": pa.array(["a", "b", None, "d"], pa.large_string()),
            "flag": pa.array([True, False, None, True]),
        }
    )


def same_bits(a: pa.ChunkedArray, b: pa.ChunkedArray) -> bool:
    """Equal values and nulls; floats compared by their bits (NaN equals NaN)."""
    a, b = a.combine_chunks(), b.combine_chunks()
    if not pa.types.is_floating(a.type):
        return a.equals(b)
    width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.type.byte_width]
    bits = [np.asarray(x.fill_null(0).to_numpy()).view(width) for x in (a, b)]
    return a.is_null().equals(b.is_null()) and np.array_equal(*bits)


@pytest.mark.slow
def test_parquet_passthrough_columns_keep_their_type_and_bits(tmp_path):
    """Guards item 1: timestamp[ns] and duration[ns] were cut to microseconds, a
    dictionary became string, uint8 int64, float32 float64, decimal128(10,2)
    decimal128(3,2), in silence."""
    table = passthrough_table()
    table = table.replace_schema_metadata({"origin": "test"})
    inp, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(table, inp)
    given = pq.read_table(inp)
    assert run(inp, out) == 0
    got = pq.read_table(out)
    kept = given.take([0, 2, 3])  # row 2 has no text
    for name in given.column_names:
        assert got.schema.field(name).type == given.schema.field(name).type, name
        assert same_bits(got.column(name), kept.column(name)), name
    assert got.schema.metadata[b"origin"] == b"test"
    assert got.column("label").to_pylist()[0] in ("positive", "negative")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".tsv"])
@pytest.mark.parametrize(
    "column, shown",
    [
        ("ts", "timestamp[ns]"),
        ("dur", "duration[ns]"),
        ("dec", "decimal128(10, 2)"),
        ("map", "map<string, int64"),
        ("bin", "binary"),
        ("deep", "which holds timestamp[ns]"),
    ],
)
def test_a_text_output_refuses_a_column_it_cannot_hold_before_the_model_loads(
    tmp_path, capsys, no_model, suffix, column, shown
):
    """Guards items 1 and 8: a binary column going to CSV/JSONL was refused only after the
    model loaded and a batch was scored, leaving a header-only file that blocked a rerun;
    a timestamp was written cut to microseconds."""
    table = passthrough_table().select(["text", "u8", "cat", "nested", "large"])
    source = passthrough_table()
    if column == "deep":
        value = pa.array([[1], [2], [3], [4]], pa.list_(pa.timestamp("ns")))
        table = table.append_column("deep", value)
    else:
        table = table.append_column(column, source.column(column))
    inp, out = tmp_path / "in.parquet", tmp_path / f"out{suffix}"
    pq.write_table(table, inp)
    assert run(inp, out) == 2
    err = one_error(capsys)
    assert f"column {column!r} is " in err and shown in err and suffix in err, err
    assert left_behind(tmp_path, inp) == []


def test_a_parquet_binary_text_column_is_refused_by_its_type(tmp_path, capsys, no_model):
    """Guards item 8: a binary text column was a raw TypeError traceback."""
    inp = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": pa.array([b"good", b"bad"], pa.binary())}), inp)
    assert run(inp, tmp_path / "out.csv") == 2
    err = one_error(capsys)
    assert "column 'text' is binary, not a string column" in err and "decode" in err, err
    assert left_behind(tmp_path, inp) == []


# ---------------------------------------------------------------------------
# 3 and 5: JSONL texts that are not strings, lone surrogates
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, kind",
    [("42", "int"), ("true", "bool"), ('["good", "bad"]', "list"), ('{"a": "great"}', "dict")],
)
def test_a_jsonl_text_that_is_not_a_string_is_refused_by_line_and_type(
    tmp_path, capsys, no_model, value, kind
):
    """Guards item 3: these were scored as their JSON text while predict_proba refuses
    them. Line 4 counts the blank line before it."""
    inp = tmp_path / "in.jsonl"
    inp.write_text(f'{{"text": "fine"}}\n{{"text": null}}\n\n{{"text": {value}}}\n')
    assert run(inp, tmp_path / "out.jsonl") == 2
    err = one_error(capsys)
    assert f"{inp}:4: column 'text'" in err and f"is a {kind}, not a string" in err, err
    assert left_behind(tmp_path, inp) == []


@pytest.mark.parametrize("key", ["text", "note"])
def test_a_lone_surrogate_in_a_jsonl_row_is_refused_up_front(tmp_path, capsys, no_model, key):
    """Guards item 5: a "\\ud800" text was found after two batches were scored, naming no
    file, line or row, and the failing batch was lost. In a passthrough column it cannot
    be written back as UTF-8 either."""
    inp = tmp_path / "in.jsonl"
    bad = json.dumps({"text": "fine", "note": "fine"}).replace(
        f'"{key}": "fine', f'"{key}": "fine \\ud800'
    )
    good = [json.dumps({"text": "paired \U0001F600 is fine", "note": "fine"})] * 3
    inp.write_text("\n".join([*good, bad]) + "\n", encoding="utf-8")
    assert run(inp, tmp_path / "out.jsonl") == 2
    err = one_error(capsys)
    assert f"{inp}:4: key {key!r} holds a lone surrogate" in err, err


# ---------------------------------------------------------------------------
# 2. One writer per output
# ---------------------------------------------------------------------------


def test_the_lock_refuses_a_live_holder_and_replaces_a_dead_one(tmp_path):
    """Guards item 2 at the unit: a lock held by a live process refuses; a lock file left
    behind (no holder) or held on behalf of a dead pid (a child of a killed run that
    inherited it) is taken."""
    out = tmp_path / "out.csv"
    with OutputLock(out), pytest.raises(ValueError, match=f"pid {os.getpid()} on"):
        OutputLock(out).acquire()
    assert not lock_path(out).exists()  # released: the file goes
    lock_path(out).write_text(f"pid {os.getpid()} on {socket.gethostname()} since then\n")
    with OutputLock(out):  # a file without a holder: free
        pass
    import fcntl

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    fd = os.open(lock_path(out), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"pid {int(dead.stdout)} on {socket.gethostname()} since then\n".encode())
    try:
        with OutputLock(out):
            assert lock_path(out).read_text().startswith(f"pid {os.getpid()} ")
            with pytest.raises(ValueError, match="being written by another semsoft run"):
                OutputLock(out).acquire()
    finally:
        os.close(fd)


def test_an_output_under_proc_is_refused_before_the_model_loads(tmp_path, capsys, no_model):
    """Guards item 8: /proc passed the writable check (root) and failed after the model
    loaded."""
    inp = write_csv(tmp_path / "in.csv", REVIEWS[:2])
    assert run(inp, Path("/proc/semsoft-out.csv")) == 2
    assert "/proc" in one_error(capsys)


def wait_for(condition, seconds: float = 300) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_second_writer_of_one_output_is_refused_by_name(tmp_path, capsys):
    """Guards item 2: two runs on one --output (other labels, or a --resume) both said
    they succeeded and left rows of two widths, or rows twice."""
    inp = write_csv(tmp_path / "in.csv", REVIEWS * 2)
    out = tmp_path / "out.csv"
    first = subprocess.Popen(
        command(inp, out, "--batch-size", "1"), env=subprocess_env(), stderr=subprocess.PIPE
    )
    try:
        wait_for(lambda: lock_path(out).exists() and lock_path(out).read_text().strip() != "")
        other = ["classify", "--input", str(inp), "--labels", "good,bad,neutral"]
        assert main([*other, "--output", str(out), "--model", SMALL, "--overwrite"]) == 2
        assert f"being written by another semsoft run (pid {first.pid} " in one_error(capsys)
        assert run(inp, out, "--batch-size", "1", "--resume") == 2
        assert f"(pid {first.pid} " in one_error(capsys)
    finally:
        _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err.decode()
    rows = list(csv.DictReader(out.open(newline="", encoding="utf-8")))
    assert [r["text"] for r in rows] == REVIEWS * 2
    assert all(None not in r and r["p_positive"] for r in rows)
    assert not lock_path(out).exists()


@pytest.mark.slow
def test_a_lock_left_by_sigkill_never_blocks_resume(tmp_path, capsys):
    """Guards item 2: the lock file of a killed run stays behind; --resume must still
    run, and finish the file."""
    texts = [f"{review} ({n})" for n in range(4) for review in REVIEWS]
    inp = write_csv(tmp_path / "in.csv", texts)
    out = tmp_path / "out.csv"
    victim = subprocess.Popen(
        command(inp, out, "--batch-size", "1"), env=subprocess_env(), stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: out.exists() and out.read_text().count("\n") >= 3)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    assert lock_path(out).read_text().startswith(f"pid {victim.pid} ")
    assert run(inp, out, "--batch-size", "1", "--resume") == 0
    rows = list(csv.DictReader(out.open(newline="", encoding="utf-8")))
    assert [r["text"] for r in rows] == texts
    assert not lock_path(out).exists()


# ---------------------------------------------------------------------------
# 8. A write that fails: one line, and --resume continues
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_file_size_limit_is_one_line_that_says_resume_continues(tmp_path, capsys):
    """Guards item 8: a full disk or RLIMIT_FSIZE was a raw OSError traceback."""
    texts = [f"{review} ({n})" for n in range(3) for review in REVIEWS]
    inp = write_csv(tmp_path / "in.csv", texts)
    out = tmp_path / "out.csv"
    limit = 1500  # bytes: the header and a few rows, then EFBIG in the middle of a row

    def small_files() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        command(inp, out, "--batch-size", "2"),
        env=subprocess_env(),
        preexec_fn=small_files,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr
    err = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "File too large" in err[0] and "--resume" in err[0], err[0]
    assert 0 < out.stat().st_size <= limit
    assert run(inp, out, "--batch-size", "2", "--resume") == 0
    rows = list(csv.DictReader(out.open(newline="", encoding="utf-8")))
    assert [r["text"] for r in rows] == texts


# ---------------------------------------------------------------------------
# 11. Duplicate texts are scored once
# ---------------------------------------------------------------------------


@pytest.fixture
def scored_texts(monkeypatch):
    """Every text the Classifier is asked to score (the real model still scores them)."""
    seen: list[str] = []
    real = Classifier.predict_details

    def counting(self, texts):
        texts = list(texts)
        seen.extend(texts)
        return real(self, texts)

    monkeypatch.setattr(Classifier, "predict_details", counting)
    return seen


@pytest.mark.slow
def test_duplicate_texts_are_scored_once(tmp_path, capsys, scored_texts):
    """Guards item 11: 512 identical texts cost 512 forward passes."""
    texts = [REVIEWS[0]] * 512 + REVIEWS[1:4]
    inp = write_csv(tmp_path / "in.csv", texts)
    out = tmp_path / "out.csv"
    assert run(inp, out, "--batch-size", "8") == 0
    assert scored_texts == REVIEWS[:4]
    summary = capsys.readouterr().out.splitlines()[0]
    assert "4 distinct text(s) scored in 1 batch(es), 511 duplicate row(s) not scored again" in (
        summary
    )
    rows = list(csv.DictReader(out.open(newline="", encoding="utf-8")))
    assert len(rows) == 515 and [r["id"] for r in rows] == [str(n) for n in range(1, 516)]
    assert len({(r["p_positive"], r["constrained_negative"]) for r in rows[:512]}) == 1


@pytest.mark.slow
def test_resume_with_duplicates_gives_the_same_bytes(tmp_path, capsys, scored_texts):
    """Guards item 11 with --resume: a duplicate of an early text after the stop is
    scored again in that text's own batch, so the file is the same as an unbroken run."""
    a, b, c, d, e = REVIEWS[:5]
    inp = write_csv(tmp_path / "in.csv", [a, b, c, a, d, b, e, a])
    whole = tmp_path / "whole.csv"
    assert run(inp, whole, "--batch-size", "2") == 0
    assert scored_texts == [a, b, c, d, e]
    lines = whole.read_text().split("\n")
    cut = tmp_path / "cut.csv"
    cut.write_text("\n".join(lines[:6]) + "\n" + lines[6][:7])  # five rows, a sixth cut
    settings_path(cut).write_bytes(settings_path(whole).read_bytes())
    del scored_texts[:]
    capsys.readouterr()
    assert run(inp, cut, "--batch-size", "2", "--resume") == 0
    assert scored_texts == [a, b, e]  # batches [a, b] and [e]; [c, d] is not needed
    assert cut.read_text() == whole.read_text()


@pytest.mark.slow
def test_a_run_that_fails_before_its_first_row_leaves_nothing_to_block_a_rerun(
    tmp_path, monkeypatch
):
    """Guards item 8: a run that died after opening its output left a header-only file,
    and the rerun was refused as "--output exists"."""

    def broken(self, texts):
        raise RuntimeError("the engine died")

    inp = write_csv(tmp_path / "in.csv", REVIEWS[:2])
    out = tmp_path / "out.csv"
    monkeypatch.setattr(Classifier, "predict_details", broken)
    with pytest.raises(RuntimeError, match="the engine died"):
        run(inp, out)
    assert left_behind(tmp_path, inp) == []
