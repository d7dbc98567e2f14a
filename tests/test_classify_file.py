"""`semsoft classify` on a file, the `Classifier` estimator, and the core-install start-up.

Everything that scores runs the real default model (SmolLM2-135M); files are a few rows.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from semsoft_plugin import Classifier
from semsoft_plugin.app.cli import main
from semsoft_plugin.app.engine_settings import EngineSettings
from semsoft_plugin.app.file_settings import settings_path
from semsoft_plugin.app.table_writers import TableWriter, read_output
from semsoft_plugin.engines.prompting import DEFAULT_TEMPLATE, PromptTemplate, build_inputs

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

ROOT = Path(__file__).resolve().parents[1]
LABELS = ["positive", "negative"]
SMALL = "smollm2-135m"  # the small embedded model: the tests check the API, not the answers
ADDED = [
    "label",
    "p_positive",
    "p_negative",
    "constrained_positive",
    "constrained_negative",
    "fallback",
    "review",
    "truncated",
]
ROWS = [
    {"id": "1", "text": "I loved this film, the acting was wonderful.", "gold": "positive"},
    {"id": "2", "text": "  ", "gold": "negative"},
    {"id": "3", "text": 'A "masterpiece" of boredom.\nTruly dull.', "gold": "negative"},
    {"id": "4", "text": "Great fun.", "gold": "positive"},
    {"id": "5", "text": "", "gold": "negative"},
    {"id": "6", "text": "Awful, just awful.", "gold": "negative"},
    {"id": "7", "text": "A warm and funny story.", "gold": "positive"},
]
TEXTS = [r["text"] for r in ROWS if r["text"].strip()]


def write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def classify_file(inp: Path, out: Path, *extra: str) -> int:
    argv = ["classify", "--input", str(inp), "--labels", ",".join(LABELS), "--output", str(out)]
    argv += ["--model", SMALL]
    return main([*argv, *extra])


# ---------------------------------------------------------------------------
# the core install: nothing of the evaluation stack is needed or imported
# ---------------------------------------------------------------------------

# scikit-learn (and its scipy) come with the transformers extra: Classifier is an estimator.
HIDDEN = ("semsoft_eval", "torchmetrics", "matplotlib", "peft")
RUNNER = r"""
import contextlib, io, json, sys
HIDDEN = set(sys.argv[1].split(","))
asked = []

class Hidden:
    # Wraps every finder: hidden top-level packages are simply not found, as in an
    # environment that never installed them (find_spec answers None, import fails).
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            asked.append(name)
            return None
        find = getattr(self.inner, "find_spec", None)
        return find(name, path, target) if find else None
    def __getattr__(self, attr):
        return getattr(self.inner, attr)

for name in list(sys.modules):
    if name.partition(".")[0] in HIDDEN:
        del sys.modules[name]
sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
from semsoft_plugin.app.file_settings import settings_path
from semsoft_plugin.app.cli import main
from semsoft_plugin.app.engine_settings import EngineSettings  # noqa: E402
report = []
for argv in json.loads(sys.argv[2]):
    del asked[:]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as stop:
            rc = stop.code
    report.append({"rc": rc, "out": out.getvalue(), "err": err.getvalue(), "asked": sorted(set(asked))})
print("REPORT" + json.dumps(report))
"""


@pytest.mark.slow
def test_cli_starts_and_classifies_with_the_eval_packages_hidden(tmp_path):
    inp = write_csv(tmp_path / "in.csv", ROWS[:2])
    out = tmp_path / "out.csv"
    commands = [
        ["--help"],
        ["classify", TEXTS[0], "--labels", "positive,negative", "--json", "--model", SMALL],
        ["classify", "--input", str(inp), "--labels", "positive,negative", "--output", str(out)]
        + ["--model", SMALL],
        ["eval", "--dataset", "sst2", "--limit", "4", "--model", SMALL],
        ["tune", "--help"],
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, ",".join(HIDDEN), json.dumps(commands)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    help_, one, file_, evaluation, tune = json.loads(done.stdout.split("REPORT", 1)[1])
    for report in (help_, one, file_):
        assert report["rc"] == 0, report["err"]
        assert "Traceback" not in report["err"]
        assert not [m for m in report["asked"] if m.startswith("semsoft_eval")], report["asked"]
    assert all(name in help_["out"] for name in ("classify", "eval", "tune", "distill"))
    result = json.loads(one["out"])
    assert sum(result["probs"].values()) == pytest.approx(1.0, abs=1e-6)
    assert [r["text"] for r in read_csv(out)] == [TEXTS[0]]
    # Without the extra: one line naming what to install, status 2, no traceback.
    for report in (evaluation, tune):
        assert report["rc"] == 2
        lines = report["err"].strip().splitlines()
        assert len(lines) == 1 and "pip install 'semsoft-plugin[eval]'" in lines[0], lines


def test_subcommands_are_discovered_without_importing_them():
    code = (
        "import sys; from semsoft_plugin.app.cli import discover_commands, build_parser; "
        "names = sorted(discover_commands()); build_parser(); "
        "print(names, [m for m in sys.modules if m.startswith('semsoft_eval')])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "['distill', 'eval', 'tune'] []"


# ---------------------------------------------------------------------------
# a whole file
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_csv_file_end_to_end(tmp_path, capsys, model_and_tokenizer):
    inp = write_csv(tmp_path / "in.csv", ROWS)
    out = tmp_path / "scored.csv"
    assert classify_file(inp, out, "--batch-size", "3", "--review-below", "0.7") == 0
    captured = capsys.readouterr()
    assert "skipped 2 row(s) with an empty 'text': row 2, 5" in captured.err
    assert "5 rows in" in captured.out and "s/row" in captured.out
    assert "labels: positive" in captured.out and "review (top probability < 0.7)" in captured.out
    rows = read_csv(out)
    assert list(rows[0]) == ["id", "text", "gold", *ADDED]
    assert [r["text"] for r in rows] == TEXTS  # multi-line and quoted texts survive
    assert [r["id"] for r in rows] == ["1", "3", "4", "6", "7"]
    probs = np.array([[float(r["p_positive"]), float(r["p_negative"])] for r in rows])
    constrained = np.array([[float(r[f"constrained_{x}"]) for x in LABELS] for r in rows])
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-12)
    np.testing.assert_allclose(constrained.sum(1), 1.0, atol=1e-12)
    assert [r["label"] for r in rows] == [LABELS[i] for i in probs.argmax(1)]
    assert [r["review"] for r in rows] == ["true" if p < 0.7 else "false" for p in probs.max(1)]
    assert {r["fallback"] for r in rows} <= {"true", "false"}
    # No coverage column at the default (the constrained softmax counts no vote); a pool
    # (semantic_weight > 0) has one, just before fallback.
    pooled = tmp_path / "pooled.csv"
    assert classify_file(inp, pooled, "--batch-size", "3", "--preset", "pooled") == 0
    pooled_rows = read_csv(pooled)
    assert list(pooled_rows[0])[-5:] == [
        "constrained_negative",
        "coverage",
        "fallback",
        "review",
        "truncated",
    ]
    assert all(0.0 <= float(r["coverage"]) <= 1.0 for r in pooled_rows)
    # The file path is the estimator's path: same batches, same numbers.
    model, tokenizer = model_and_tokenizer
    clf = Classifier(model, tokenizer, LABELS, engine=EngineSettings(batch_size=3))
    expected = np.vstack([clf.predict_proba(TEXTS[:3]), clf.predict_proba(TEXTS[3:])])
    assert list(clf.classes_) == sorted(LABELS)  # columns in sorted order, as sklearn's
    np.testing.assert_array_equal(probs[:, ::-1], expected)


@pytest.mark.slow
def test_jsonl_in_jsonl_out_keeps_types_and_fields(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    records = [
        {"text": "Great fun.", "meta": {"source": "a", "n": 1}, "score": 2.5},
        {"text": None, "meta": None},
        {"other": "no text here"},
        {"text": "Awful, just awful.", "meta": [1, 2]},
    ]
    inp.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    out = tmp_path / "out.jsonl"
    assert classify_file(inp, out, "--prompt-file", str(_prompt_file(tmp_path))) == 0
    assert "row 2, 3" in capsys.readouterr().err
    lines = out.read_text().splitlines()
    written = [json.loads(line) for line in lines]
    assert [w["text"] for w in written] == ["Great fun.", "Awful, just awful."]
    assert written[0]["meta"] == {"source": "a", "n": 1} and written[0]["score"] == 2.5
    assert written[1]["meta"] == [1, 2]
    for w in written:
        assert isinstance(w["fallback"], bool) and isinstance(w["review"], bool)
        assert w["p_positive"] + w["p_negative"] == pytest.approx(1.0, abs=1e-12)
        assert w["label"] == max(LABELS, key=lambda x: w[f"p_{x}"])


def _prompt_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompt.json"
    template = {"user": "Is this review {labels}?\nReview: {text}", "answer_prefix": "Sentiment:"}
    path.write_text(json.dumps(template))
    return path


@pytest.mark.slow
def test_resume_after_a_stop_half_way_gives_the_same_rows(tmp_path, capsys):
    inp = write_csv(tmp_path / "in.csv", ROWS)
    whole = tmp_path / "whole.csv"
    assert classify_file(inp, whole, "--batch-size", "2") == 0
    full = whole.read_text()
    # Stopped half way: three complete rows (the third in the middle of batch 2) and a
    # fourth cut in the middle of its write. Row 2's text holds a newline: two lines.
    lines = full.split("\n")
    cut = tmp_path / "cut.csv"
    cut.write_text("\n".join(lines[:5]) + "\n" + lines[5][:10])
    settings_path(cut).write_bytes(settings_path(whole).read_bytes())  # written at its start
    capsys.readouterr()
    assert classify_file(inp, cut, "--batch-size", "2", "--resume") == 0
    out = capsys.readouterr().out
    assert "2 scored now" in out and "3 kept from before" in out
    assert cut.read_text() == full
    # A finished file is left as it is, and nothing is scored again.
    assert classify_file(inp, cut, "--batch-size", "2", "--resume") == 0
    assert "nothing left to score" in capsys.readouterr().out
    assert cut.read_text() == full


def test_resume_refuses_another_inputs_output(tmp_path, capsys):
    inp = write_csv(tmp_path / "in.csv", ROWS)
    out = tmp_path / "out.csv"
    other = dict(ROWS[0], text="something else entirely")
    with TableWriter(out, ["id", "text", "gold", *ADDED], append=False) as writer:
        writer.write([dict(other, label="positive")])
    assert classify_file(inp, out, "--resume") == 2
    err = capsys.readouterr().err.strip()
    # The refusal alone: the plan is checked before the skipped empty rows are reported.
    assert "row 1 of" in err and "not this input's output" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_read_output_drops_only_a_partial_last_record(tmp_path, suffix):
    path = tmp_path / f"out{suffix}"
    columns = ["text", "label", "p"]
    rows = [{"text": f't{i}, "q"\nx', "label": "a", "p": 0.5} for i in range(3)]
    with TableWriter(path, columns, append=False) as writer:
        writer.write(rows[:2])
    whole = path.read_text()
    with TableWriter(path, columns, append=True) as writer:
        writer.write(rows[2:])
    complete = path.read_text()
    assert len(read_output(path, columns)) == 3 and path.read_text() == complete
    for end in range(len(whole) + 1, len(complete)):  # cut anywhere inside record 3
        path.write_text(complete[:end])
        assert len(read_output(path, columns)) == 2, complete[:end]
        assert path.read_text() == whole


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--text-column", "body"], "no column 'body'; columns are ['id', 'text', 'gold']"),
        (["--review-below", "2"], "--review-below 2.0 must be a probability in [0, 1]"),
        (["--output", "{tmp}/out.xlsx"], "unknown format '.xlsx'"),
        (["--input", "{tmp}/in.txt"], "unknown format '.txt'"),
        (["--input", "{tmp}/missing.csv"], "data file not found"),
        (["--output", "{tmp}/exists.csv"], "exists: pass --resume"),
        (["--column-prefix", ""], "already has column(s) ['label']"),
        (["--engine-args", '{"dtype": "float32"}'], "apply only to --backend vllm"),
        (["--batch-size", "0"], "--batch-size 0 must be a positive integer"),
        (["--json"], "--json does not apply to a file"),
        (["--prompt-file", "{tmp}/nope.json"], "prompt file not found"),
        (["--prompt", "Rate {txt}"], "unknown placeholder(s) ['txt']"),
        (["--labels", "positive"], "at least two"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, extra, message):
    inp = write_csv(tmp_path / "in.csv", ROWS[:2])
    if "--column-prefix" in extra:
        inp = write_csv(tmp_path / "in.csv", [dict(r, label="x") for r in ROWS[:2]])
    (tmp_path / "in.txt").write_text("text\nhello\n")
    (tmp_path / "exists.csv").write_text("id\n1\n")
    argv = ["classify", "--input", str(inp), "--labels", "positive,negative"]
    argv += [
        "--output",
        str(tmp_path / "out.csv"),
        *[e.replace("{tmp}", str(tmp_path)) for e in extra],
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_one_text_or_a_file_not_both(tmp_path, capsys):
    inp = write_csv(tmp_path / "in.csv", ROWS[:2])
    for argv in (
        ["classify", "--labels", "a,b"],
        ["classify", "hello", "--input", str(inp), "--labels", "a,b"],
    ):
        assert main(argv) == 2
        assert "give one text to classify or --input FILE" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# the estimator
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_classifier_outputs_go_into_sklearn_metrics_unchanged(model_and_tokenizer):
    from sklearn.metrics import accuracy_score, brier_score_loss, log_loss, roc_auc_score

    model, tokenizer = model_and_tokenizer
    clf = Classifier(model, tokenizer, LABELS, prompt=PromptTemplate(user="Review: {text}"))
    gold = [r["gold"] for r in ROWS if r["text"].strip()]
    proba = clf.predict_proba(TEXTS)
    assert proba.shape == (len(TEXTS), 2) and proba.dtype == np.float64
    np.testing.assert_allclose(proba.sum(1), 1.0, atol=1e-12)
    assert list(clf.classes_) == list(np.unique(LABELS))  # sklearn's column order
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sklearn warns when columns are not in its order
        loss = log_loss(gold, proba, labels=clf.classes_)
        assert loss == pytest.approx(log_loss(gold, proba))
        predicted = clf.predict(TEXTS)
        assert 0.0 <= accuracy_score(gold, predicted) <= 1.0
        positive = np.array([g == "positive" for g in gold])
        column = list(clf.classes_).index("positive")
        assert 0.0 <= roc_auc_score(positive, proba[:, column]) <= 1.0
        assert 0.0 <= brier_score_loss(positive, proba[:, column]) <= 1.0
    # The hand-computed log loss: sklearn read the columns as labelled.
    rows = np.arange(len(gold))
    truth = [list(clf.classes_).index(g) for g in gold]
    assert loss == pytest.approx(-np.log(proba[rows, truth]).mean())
    assert list(predicted) == list(clf.classes_[proba.argmax(1)])
    details = clf.predict_details(TEXTS)
    assert details.constrained_probs.shape == proba.shape and details.fallback.dtype == bool
    assert details.coverage.shape == (len(TEXTS),)


@pytest.mark.slow
def test_predict_proba_equals_classify(model_and_tokenizer):
    from semsoft_plugin.app.pass_cache import PASSES
    from semsoft_plugin.engines.hf import classify

    model, tokenizer = model_and_tokenizer
    clf = Classifier(model, tokenizer, LABELS, engine=EngineSettings(batch_size=4))
    # bf16 rows move with their batch's padding: the passes are run here, in classify's batches
    PASSES.clear()
    details = clf.predict_details(TEXTS)
    inputs = build_inputs(DEFAULT_TEMPLATE, TEXTS, LABELS, tokenizer)
    results = classify(model, tokenizer, inputs, LABELS, batch_size=4)
    classes = list(clf.classes_)
    assert list(details.labels) == classes
    expected = np.array([[r.probs[x] for x in classes] for r in results])
    np.testing.assert_allclose(details.probs, expected, atol=1e-6)
    constrained = np.array([[r.constrained_probs[x] for x in classes] for r in results])
    np.testing.assert_allclose(details.constrained_probs, constrained, atol=1e-6)
    np.testing.assert_allclose(details.coverage, [r.coverage for r in results], atol=1e-6)
    assert list(details.fallback) == [r.fallback for r in results]
    assert details.label == [r.label for r in results]


def test_classifier_rejects_bad_input(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    clf = Classifier(model, tokenizer, LABELS)
    with pytest.raises(ValueError, match="not a single string"):
        clf.predict_proba("one text")
    with pytest.raises(ValueError, match=r"texts\[1\] = '  '"):
        clf.predict_proba(["fine", "  "])
    # Settings are checked where they are used (scikit-learn's rule), before any text is scored.
    with pytest.raises(ValueError, match="batch_size=0"):
        Classifier(model, tokenizer, LABELS, engine=EngineSettings(batch_size=0))
    with pytest.raises(ValueError, match="tokenizer is None"):
        Classifier(model, None, LABELS).predict(["fine"])
    with pytest.raises(ValueError, match="prompt template must contain"):
        Classifier(model, tokenizer, LABELS, prompt="no placeholder").predict(["fine"])
    with pytest.raises(ValueError, match="batch_size=0"):
        Classifier.from_pretrained("smollm2-135m", LABELS, engine=EngineSettings(batch_size=0))
    assert clf.predict_proba([]).shape == (0, 2)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_backend_file_matches_transformers_in_float32(tmp_path):
    pytest.importorskip("vllm")
    from semsoft_plugin.engines import models

    inp = write_csv(tmp_path / "in.csv", ROWS)
    out = tmp_path / "out.jsonl"
    engine = {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "seed": 0}
    assert classify_file(inp, out, "--backend", "vllm", "--engine-args", json.dumps(engine)) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    got = np.array([[w[f"p_{x}"] for x in LABELS] for w in written])
    model, tokenizer = models.load("smollm2-135m", dtype="float32")
    clf = Classifier(model, tokenizer, LABELS)
    expected = clf.predict_proba(TEXTS)[:, [list(clf.classes_).index(x) for x in LABELS]]
    np.testing.assert_allclose(got, expected, atol=1e-3)
    assert [w["label"] for w in written] == [LABELS[i] for i in expected.argmax(1)]


def test_the_coverage_column_only_where_votes_are_counted() -> None:
    """A coverage measures the votes, which only a pool counts: at the constrained
    softmax (the default) the added columns leave it out, in every output form."""
    from semsoft_plugin.app.columns import ResultColumns, counts_votes
    from semsoft_plugin.core.config import SemsoftConfig

    assert not counts_votes(SemsoftConfig()) and not counts_votes(None)
    assert counts_votes(SemsoftConfig.preset("pooled"))
    assert not counts_votes(SemsoftConfig.preset("pooled"), semantic_weight=0.0)
    plain, pooled = (ResultColumns(("a", "b"), votes=v) for v in (False, True))
    assert "coverage" not in plain.names and "coverage" in pooled.names
    row = plain.row("a", [0.7, 0.3], [0.6, 0.4], 0.99, False, 0, 0.6)
    assert list(row) == plain.names
    assert list(pooled.row("a", [0.7, 0.3], [0.6, 0.4], 0.99, False, 0, 0.6)) == pooled.names
    pytest.importorskip("pyarrow")
    assert [name for name, _ in plain.arrow_types()] == plain.names
