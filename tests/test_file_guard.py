"""The file mode's label-free guard (issue 36 item 2), without a model: the decision on
rows whose confidence is set here, the settings record that carries it across a
``--resume`` (and an older record without it), and the one name ``file_strength`` the
app layer takes (``"auto"`` or a number in [0, 1]) on the Python and command-line paths.

The real small model's decisions are in tests/test_file_mode.py.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from semsoft_plugin.app import file_mode
from semsoft_plugin.app.classifier_settings import check_file_strength
from semsoft_plugin.app.classify_args import file_strength, strength_arg
from semsoft_plugin.app.columns import ResultColumns
from semsoft_plugin.app.file_settings import recorded_calibration, settings_path, write_settings
from semsoft_plugin.core.calibration import GUARD_CONFIDENCE, FileCalibration

# A sure model on a file that truly is 95/5: 38 rows of the first label at .9, two of
# the second. Its lean is the file's content.
SURE_95_5 = np.array([[0.9, 0.1]] * 38 + [[0.2, 0.8]] * 2)
# An unsure model on a balanced three-label file (a third of the rows per label), whose
# prompt leans every row toward the first label: the true label's row is still its
# argmax but the first label's share is raised everywhere.
UNSURE_BIASED = np.array([[0.5, 0.25, 0.25], [0.42, 0.4, 0.18], [0.43, 0.15, 0.42]] * 12)


def test_a_sure_95_5_file_is_left_as_it_is():
    guarded = FileCalibration.estimate(SURE_95_5)
    assert guarded.guard and guarded.strength == 0.0
    assert guarded.confidence == pytest.approx(SURE_95_5.max(1).mean(), abs=1e-12)
    np.testing.assert_allclose(guarded.apply(SURE_95_5), SURE_95_5, rtol=0, atol=1e-12)
    # The full correction would push the majority's mean share (.865) toward uniform:
    # the harm the guard avoids.
    full = FileCalibration.estimate(SURE_95_5, strength=1.0).apply(SURE_95_5)
    assert full[:, 0].mean() < 0.6 < SURE_95_5[:, 0].mean()


def test_an_unsure_biased_file_gets_the_full_correction():
    guarded = FileCalibration.estimate(UNSURE_BIASED)
    assert guarded.guard and guarded.strength == 1.0
    assert guarded.confidence == pytest.approx(UNSURE_BIASED.max(1).mean(), abs=1e-12)
    assert guarded.confidence <= GUARD_CONFIDENCE
    full = FileCalibration.estimate(UNSURE_BIASED, strength=1.0)
    assert guarded.bias == full.bias
    np.testing.assert_allclose(
        guarded.apply(UNSURE_BIASED), full.apply(UNSURE_BIASED), rtol=0, atol=1e-15
    )
    # Raw, the first label wins every row; corrected, each row's true label wins.
    assert (UNSURE_BIASED.argmax(1) == 0).all()
    assert list(guarded.apply(UNSURE_BIASED).argmax(1)) == [0, 1, 2] * 12


def test_the_record_keeps_the_guards_decision(tmp_path):
    correction = FileCalibration.estimate(UNSURE_BIASED)
    back = FileCalibration.from_dict(json.loads(json.dumps(correction.to_dict())))
    assert back == correction and back.guard and back.confidence == correction.confidence
    # Through the settings record, as a --resume reads it.
    output = tmp_path / "scored.csv"
    write_settings(output, {"file_strength": "auto"}, {}, correction)
    assert recorded_calibration(output) == correction
    record = json.loads(settings_path(output).read_text())
    assert record["file_calibration"]["guard"] is True
    assert record["settings"]["file_strength"] == "auto"


def test_a_record_from_before_the_guard_still_reads(tmp_path):
    output = tmp_path / "old.csv"
    old = {"bias": [0.6, 0.4], "strength": 0.5, "rows": 40}  # no guard, no confidence
    body = {"semsoft_classify": 1, "settings": {}, "provenance": {}, "file_calibration": old}
    settings_path(output).write_text(json.dumps(body))
    correction = recorded_calibration(output)
    assert correction == FileCalibration((0.6, 0.4), 0.5, 40, guard=False, confidence=None)
    assert correction.matches(0.5) and not correction.matches("auto")
    assert "applied at strength 0.5" in file_mode.describe(["a", "b"], correction)


def test_the_summary_says_what_the_guard_did():
    columns = ResultColumns(("a", "b", "c"), "")
    rows = [dict(zip(columns.p, map(float, p), strict=True)) for p in UNSURE_BIASED]
    applied = file_mode.describe(columns.labels, file_mode.estimate_rows(columns, rows, "auto"))
    assert applied.endswith(
        "from 36 distinct text(s), applied at strength 1 (the guard: mean top probability "
        "0.450 <= 0.5)"
    ), applied
    sure = file_mode.describe(["yes", "no"], FileCalibration.estimate(SURE_95_5))
    assert sure.endswith(
        "not applied (the guard: mean top probability 0.895 > 0.5: a sure model's lean is "
        "taken as the file's content)"
    ), sure
    fixed = file_mode.estimate_rows(columns, rows, 0.5)
    assert file_mode.describe(columns.labels, fixed).endswith("applied at strength 0.5")


def test_a_fitted_correction_is_checked_against_the_strength_asked():
    guarded = FileCalibration.estimate(SURE_95_5)
    full = FileCalibration.estimate(SURE_95_5, strength=1.0)
    assert file_mode.checked_fit(guarded, "auto", ["a", "b"], ["a", "b"]) is guarded
    assert file_mode.checked_fit(full, 1, ["a", "b"], ["a", "b"]) is full
    # The guard chose 0 here: asking for strength 0 by hand is still another setting.
    with pytest.raises(
        ValueError,
        match=r"file_strength=0\.0, but file_calibration_ was fitted at 'auto' \(the guard "
        r"chose 0\): call fit\(texts\) again",
    ):
        file_mode.checked_fit(guarded, 0.0, ["a", "b"], ["a", "b"])
    with pytest.raises(
        ValueError, match=r"file_strength='auto', but file_calibration_ was fitted at 1\.0"
    ):
        file_mode.checked_fit(full, "auto", ["a", "b"], ["a", "b"])


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), "high", True, None])
def test_a_bad_strength_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"file_strength=.* must be 'auto' or a number in \[0, 1\]"):
        check_file_strength(bad, "file")


def test_only_the_default_goes_without_the_file_mode():
    check_file_strength("auto", None)
    check_file_strength("auto", "contextual")
    check_file_strength(0.5, "file")
    with pytest.raises(ValueError, match=r"file_strength=1\.0 applies only to the file mode"):
        check_file_strength(1.0, None)


def test_the_command_line_reads_auto_or_a_number():
    assert strength_arg("auto") == "auto" and strength_arg("0.5") == 0.5
    with pytest.raises(argparse.ArgumentTypeError, match="'high' must be 'auto' or a number"):
        strength_arg("high")
    given = argparse.Namespace(calibrate="file", file_strength=None)
    assert file_strength(given) == "auto"
    assert file_strength(argparse.Namespace(calibrate="file", file_strength=0.0)) == 0.0
    assert file_strength(argparse.Namespace(calibrate=None, file_strength=None)) is None
