"""The file mode (issue 36 item 2) on every path: ``Classifier(calibrate="file")``,
``semsoft classify --input ... --calibrate file`` and its ``--resume``.

The mechanics, at a strength given by hand: the correction applied is exactly
:class:`~semsoft_plugin.core.calibration.FileCalibration`'s, estimated from the distinct
texts once, applied to each row alone; strength 0 changes nothing; on a 95/5 file the
full correction does move the majority label's mean probability toward uniform (the
documented harm). And the default, ``file_strength="auto"``: the guard's decision on the
real small model, read from the mean top probability of the distinct texts, and its
effect (tests/test_file_guard.py has it on rows built to be sure or unsure). The texts
are written here.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from semsoft_plugin.app.classifier import Classifier, NotFittedError
from semsoft_plugin.app.cli import main
from semsoft_plugin.app.engine_settings import EngineSettings  # noqa: E402
from semsoft_plugin.app.file_settings import settings_path
from semsoft_plugin.core.calibration import GUARD_CONFIDENCE, FileCalibration
from semsoft_plugin.core.fit_policy import FitPolicy  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
LABELS = ["positive", "negative"]
F32 = {"engine": EngineSettings(dtype="float32", batch_size=8)}
THINGS = ["film", "meal", "hotel", "phone", "book", "concert", "car", "game", "class", "show"]
GOOD = ["wonderful", "a delight", "excellent", "lovely"]
BAD = ["awful", "a waste of money", "dreadful", "boring"]
# 40 distinct reviews, 20 of each label; and 40 where 38 are positive (95/5).
BALANCED = [f"The {t} was {w}." for t in THINGS for w in (GOOD[:2] + BAD[:2])]
SKEWED = [f"The {t} was {w}." for t in THINGS for w in GOOD][:38] + BALANCED[2:4]


@pytest.fixture(scope="module")
def plain() -> Classifier:
    return Classifier(MODEL, labels=LABELS, **F32)


def filemode(labels=LABELS, **options) -> Classifier:
    return Classifier(MODEL, labels=labels, calibrate="file", **F32, **options)


@pytest.mark.parametrize("texts", [BALANCED, SKEWED], ids=["balanced", "95-5"])
def test_the_correction_is_file_calibrations_on_the_distinct_texts(plain, texts):
    assert len(set(texts)) == 40
    raw = plain.predict_proba(texts)
    clf = filemode(fit_policy=FitPolicy(file_strength=1.0)).fit(texts)
    expected = FileCalibration.estimate(raw, strength=1.0)
    assert clf.file_calibration_.rows == 40 and not clf.file_calibration_.guard
    np.testing.assert_allclose(clf.file_calibration_.bias, expected.bias, rtol=0, atol=1e-12)
    got = clf.predict_proba(texts)
    np.testing.assert_allclose(got, expected.apply(raw), rtol=0, atol=1e-12)
    assert list(clf.predict(texts)) == [clf.classes_[i] for i in got.argmax(1)]
    details = clf.predict_details(texts)
    np.testing.assert_array_equal(
        details.constrained_probs, plain.predict_details(texts).constrained_probs
    )
    # Strength 0 changes nothing; a part of the correction lies between none and all.
    none = filemode(fit_policy=FitPolicy(file_strength=0.0)).fit(texts).predict_proba(texts)
    np.testing.assert_allclose(none, raw, rtol=0, atol=1e-12)
    half = filemode(fit_policy=FitPolicy(file_strength=0.5)).fit(texts).predict_proba(texts)
    favourite = int(np.argmax(expected.bias))  # the label the prompt leans to on this file
    means = [p[:, favourite].mean() for p in (raw, half, got)]
    assert means[0] > means[1] > means[2]
    # Given by hand, the full correction pulls the favourite's mean share toward 1/L,
    # also on the 95/5 file, where that share may be the truth (the guard's reason).
    assert abs(means[2] - 0.5) < abs(means[0] - 0.5)


def test_a_rows_score_does_not_depend_on_its_batch(plain):
    clf = filemode(fit_policy=FitPolicy(file_strength=1.0)).fit(BALANCED)
    order = np.random.default_rng(0).permutation(len(SKEWED))
    shuffled = [SKEWED[i] for i in order]
    whole = clf.predict_proba(SKEWED)
    # The correction is applied row by row: any batch gives FileCalibration.apply of
    # that batch's raw rows, whatever the other rows are.
    np.testing.assert_allclose(
        clf.predict_proba(shuffled),
        clf.file_calibration_.apply(plain.predict_proba(shuffled)),
        rtol=0,
        atol=1e-12,
    )
    # And a row scored alone or among others agrees up to float32 padding noise.
    alone = np.vstack([clf.predict_proba([text]) for text in SKEWED[:5]])
    np.testing.assert_allclose(alone, whole[:5], atol=1e-5)
    np.testing.assert_allclose(clf.predict_proba(shuffled), whole[order], atol=1e-5)


def test_duplicates_count_once():
    repeated = [BALANCED[0]] * 50 + BALANCED[1:] + [BALANCED[0]] * 50
    assert len(repeated) == 139 and len(set(repeated)) == 40
    once = filemode().fit(BALANCED).file_calibration_
    many = filemode().fit(repeated).file_calibration_
    assert many == once and many.rows == 40
    extra = ["An utterly forgettable evening."] * 100 + BALANCED
    distinct = ["An utterly forgettable evening.", *BALANCED]
    assert filemode().fit(extra).file_calibration_ == filemode().fit(distinct).file_calibration_


def test_the_guard_on_the_small_model(plain):
    # Two labels: SmolLM2-135M leans to "negative" on every review here and is sure of it
    # (mean top probability .77 on the balanced file, .86 on the 95/5 one), so the guard
    # applies nothing: the 95/5 file is not pushed toward uniform (nor, on these texts,
    # is the balanced file corrected: the guard's price).
    for texts in (BALANCED, SKEWED):
        raw = plain.predict_proba(texts)
        clf = filemode().fit(texts + texts[:7])  # a repeated text counts once
        correction = clf.file_calibration_
        assert correction.guard and correction.rows == 40
        assert correction.confidence == pytest.approx(raw.max(1).mean(), rel=0, abs=1e-12)
        assert correction.confidence > GUARD_CONFIDENCE and correction.strength == 0.0
        np.testing.assert_allclose(clf.predict_proba(texts), raw, rtol=0, atol=1e-12)
    # Four labels on the balanced file: unsure rows (mean top probability .48), so the
    # guard applies the full correction, which moves the rows.
    four = ["positive", "negative", "mixed", "neutral"]
    raw = Classifier(MODEL, labels=four, **F32).predict_proba(BALANCED)
    clf = filemode(four).fit(BALANCED)
    correction = clf.file_calibration_
    assert correction.confidence == pytest.approx(raw.max(1).mean(), rel=0, abs=1e-12)
    assert correction.confidence <= GUARD_CONFIDENCE and correction.strength == 1.0
    full = FileCalibration.estimate(raw, strength=1.0)
    assert correction.bias == pytest.approx(full.bias, rel=0, abs=1e-12)
    got = clf.predict_proba(BALANCED)
    np.testing.assert_allclose(got, full.apply(raw), rtol=0, atol=1e-12)
    assert np.abs(got - raw).max() > 0.1


def test_refusals_are_named(plain):
    with pytest.raises(NotFittedError, match=r"call fit\(texts\) first"):
        filemode().predict_proba(BALANCED[:2])
    with pytest.raises(
        ValueError, match="at least 32 distinct rows to estimate the label bias, got 31"
    ):
        filemode().fit(BALANCED[:31] * 3)
    with pytest.raises(
        ValueError, match=r"file_strength=1\.5 must be 'auto' or a number in \[0, 1\]"
    ):
        filemode(fit_policy=FitPolicy(file_strength=1.5)).fit(BALANCED)
    with pytest.raises(ValueError, match=r"file_strength='high' must be 'auto' or a number"):
        filemode(fit_policy=FitPolicy(file_strength="high")).fit(BALANCED)
    with pytest.raises(ValueError, match="file_strength=0.5 applies only to the file mode"):
        Classifier(MODEL, labels=LABELS, fit_policy=FitPolicy(file_strength=0.5), **F32).predict(
            BALANCED[:1]
        )
    with pytest.raises(ValueError, match="fit without y needs|without y needs labels"):
        Classifier(MODEL, calibrate="file", **F32).fit(BALANCED)
    y = ["positive" if i % 4 < 2 else "negative" for i in range(40)]
    with pytest.raises(ValueError, match=r"fit\(texts, y\) with calibrate='file'"):
        filemode().fit(BALANCED, y)
    # Searching nothing, fit(texts, y) reads the labels and estimates the correction.
    fixed = filemode(fit_policy=FitPolicy(family=())).fit(BALANCED, y)
    assert fixed.file_calibration_ == filemode().fit(BALANCED).file_calibration_
    # A parameter changed after fit is not silently ignored, "auto" included.
    with pytest.raises(
        ValueError, match=r"file_strength=0\.5, but file_calibration_ was fitted at 'auto'"
    ):
        fixed.set_params(fit_policy__file_strength=0.5).predict(BALANCED[:1])
    by_hand = filemode(fit_policy=FitPolicy(file_strength=0.5)).fit(BALANCED)
    with pytest.raises(
        ValueError,
        match=r"file_strength='auto', but file_calibration_ was fitted at 0\.5: call fit",
    ):
        by_hand.set_params(fit_policy__file_strength="auto").predict(BALANCED[:1])
    with pytest.raises(ValueError, match="requires y to be passed"):
        Classifier(MODEL, labels=LABELS, **F32).fit(BALANCED)


# ---------------------------------------------------------------------------
# semsoft classify --input ... --calibrate file
# ---------------------------------------------------------------------------


def write_file(path: Path, texts: list[str]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "text"])
        writer.writerows([str(i), text] for i, text in enumerate(texts))
    return path


def classify(inp: Path, out: Path, *extra: str) -> int:
    argv = ["classify", "--input", str(inp), "--output", str(out), "--labels", ",".join(LABELS)]
    return main([*argv, "--model", MODEL, "--dtype", "float32", "--batch-size", "8", *extra])


def p_columns(path: Path, prefix: str = "p_") -> np.ndarray:
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return np.array([[float(r[prefix + label]) for label in LABELS] for r in rows])


def test_cli_file_mode_resume_and_refusals(tmp_path, capsys):
    texts = BALANCED[:20] + [BALANCED[0]] * 5 + BALANCED[20:]  # 45 rows, 40 distinct
    inp = write_file(tmp_path / "in.csv", texts)
    raw_out, out = tmp_path / "raw.csv", tmp_path / "out.csv"
    assert classify(inp, raw_out) == 0
    capsys.readouterr()
    raw = p_columns(raw_out)
    distinct = [texts.index(t) for t in dict.fromkeys(texts)]

    # The default, --file-strength auto: the guard reads the distinct texts' mean top
    # probability (.77 here, a sure model), applies nothing, and the record says so.
    auto = tmp_path / "auto.csv"
    assert classify(inp, auto, "--calibrate", "file") == 0
    summary = capsys.readouterr().out
    record = json.loads(settings_path(auto).read_text())
    assert record["settings"]["file_strength"] == "auto"
    guarded = FileCalibration.from_dict(record["file_calibration"])
    assert guarded == FileCalibration.estimate(raw[distinct])
    assert guarded.guard and guarded.strength == 0.0
    assert guarded.confidence == pytest.approx(raw[distinct].max(1).mean(), rel=0, abs=1e-12)
    np.testing.assert_allclose(p_columns(auto), raw, rtol=0, atol=1e-12)
    said = f"not applied (the guard: mean top probability {guarded.confidence:.3f} > 0.5"
    assert said in summary
    # Resumed, the recorded decision is the one applied and named again.
    whole = auto.read_text()
    auto.write_text("\n".join(whole.split("\n")[:20]) + "\n")
    assert classify(inp, auto, "--calibrate", "file", "--resume") == 0
    assert auto.read_text() == whole and said in capsys.readouterr().out

    # The full correction, by hand.
    assert classify(inp, out, "--calibrate", "file", "--file-strength", "1") == 0
    summary = capsys.readouterr().out
    record = json.loads(settings_path(out).read_text())
    correction = FileCalibration.from_dict(record["file_calibration"])
    assert record["settings"]["calibrate"] == "file"
    assert record["settings"]["file_strength"] == 1.0
    # Each text once, --labels order.
    assert correction == FileCalibration.estimate(raw[distinct], strength=1.0)
    np.testing.assert_allclose(p_columns(out), correction.apply(raw), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(
        p_columns(out, "constrained_"), p_columns(raw_out, "constrained_")
    )
    assert "file correction (--calibrate file): bias positive" in summary
    assert summary.rstrip().endswith("from 40 distinct text(s), applied at strength 1")

    # Strength 0 is a strength, not "unset": the rows come out as scored, the bias is
    # still recorded (once applied at full strength by `or 1.0`).
    zero = tmp_path / "zero.csv"
    assert classify(inp, zero, "--calibrate", "file", "--file-strength", "0") == 0
    assert "applied at strength 0" in capsys.readouterr().out
    np.testing.assert_allclose(p_columns(zero), raw, rtol=0, atol=1e-12)
    assert json.loads(settings_path(zero).read_text())["file_calibration"]["strength"] == 0.0

    # Killed in the write pass: --resume reuses the recorded correction, byte for byte.
    full = out.read_text()
    lines = full.split("\n")
    cut = tmp_path / "cut.csv"
    cut.write_text("\n".join(lines[:12]) + "\n" + lines[12][:7])
    settings_path(cut).write_bytes(settings_path(out).read_bytes())
    assert classify(inp, cut, "--calibrate", "file", "--file-strength", "1", "--resume") == 0
    assert cut.read_text() == full
    assert "11 kept from before" in capsys.readouterr().out
    # Killed in the first pass (the record has no correction, nothing written): the
    # resumed run estimates it again, to the same rows.
    early = tmp_path / "early.csv"
    body = json.loads(settings_path(out).read_text())
    del body["file_calibration"]
    settings_path(early).write_text(json.dumps(body))
    assert classify(inp, early, "--calibrate", "file", "--file-strength", "1", "--resume") == 0
    assert early.read_text() == full

    capsys.readouterr()
    refusals = [
        (classify(inp, cut, "--calibrate", "file", "--file-strength", "0.5", "--resume"),
         "file_strength: 1.0 then, 0.5 now"),
        (classify(inp, auto, "--calibrate", "file", "--file-strength", "0.5", "--resume"),
         'file_strength: "auto" then, 0.5 now'),
        (classify(inp, cut, "--calibrate", "file", "--resume"),
         'file_strength: 1.0 then, "auto" now'),
        (classify(inp, tmp_path / "x.csv", "--calibrate", "file", "--file-strength", "1.5"),
         r"--file-strength=1.5 must be 'auto' or a number in [0, 1]"),
        (classify(inp, tmp_path / "x.csv", "--file-strength", "1"),
         "--file-strength goes with --calibrate file"),
        (classify(inp, tmp_path / "x.csv", "--file-strength", "auto"),
         "--file-strength goes with --calibrate file"),
        (classify(write_file(tmp_path / "few.csv", BALANCED[:31] * 2), tmp_path / "x.csv",
                  "--calibrate", "file"),
         "needs at least 32 distinct texts to estimate the label bias"),
        (main(["classify", "Great fun.", "--labels", "positive,negative", "--model", MODEL,
               "--calibrate", "file"]),
         "one text has no file to learn from"),
    ]  # fmt: skip
    err = capsys.readouterr().err
    for status, message in refusals:
        assert status == 2
        assert message in err, (message, err)
    with pytest.raises(SystemExit) as stopped:
        classify(inp, tmp_path / "x.csv", "--calibrate", "file", "--file-strength", "high")
    assert stopped.value.code == 2
    assert "--file-strength: 'high' must be 'auto' or a number in [0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()
