"""semsoft_eval.confidence: the target map, the entropy guard, AUROC2, answer matching, parsing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from semsoft_eval.confidence import (
    PAPER_TARGETS,
    auroc2,
    auroc2_interval,
    ceiling_rate,
    check_label_entropy,
    format_confidence,
    label_entropy,
    match_answer,
    normalize_answer,
    parse_confidence,
    split_answer_confidence,
    target_from_samples,
    targets_from_samples,
)

# --- the map -------------------------------------------------------------------------


def test_paper_map_for_ten_samples() -> None:
    expected = [0.05, 0.15, 0.25, 0.35, 0.45, 0.50, 0.60, 0.70, 0.80, 0.90, 0.95]
    assert [target_from_samples(k, 10) for k in range(11)] == pytest.approx(expected, abs=1e-12)
    assert {k: round(target_from_samples(k) * 100) for k in range(11)} == PAPER_TARGETS


def test_map_generalises_by_share() -> None:
    assert target_from_samples(1, 20) == pytest.approx(0.10)  # half-way between 5% and 15%
    assert target_from_samples(3, 5) == pytest.approx(0.60)  # 6 of 10
    assert target_from_samples(20, 20) == pytest.approx(0.95)
    assert target_from_samples(0, 3) == pytest.approx(0.05)
    assert target_from_samples(1, 1) == pytest.approx(0.95)
    np.testing.assert_allclose(targets_from_samples([0, 5, 10]), [0.05, 0.5, 0.95])


@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_map_is_monotone_and_bounded(case: tuple[int, int]) -> None:
    n, k = case
    value = target_from_samples(k, n)
    assert 0.05 <= value <= 0.95
    if k < n:
        assert target_from_samples(k + 1, n) > value


@pytest.mark.parametrize(
    ("k", "n", "message"),
    [
        (11, 10, "outside"),
        (-1, 10, "outside"),
        (1, 0, "positive"),
        (1.5, 10, "int"),
        (True, 10, "int"),
    ],
)
def test_map_rejects_bad_counts(k: object, n: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        target_from_samples(k, n)  # type: ignore[arg-type]


# --- the guard -----------------------------------------------------------------------

COLLAPSED = [0.95] * 97 + [0.05, 0.45, 0.90]  # the modal-filter outcome: nearly all at 95%
RESCUE = [0.95] * 48 + [0.05] * 37 + [0.15, 0.25, 0.35, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9] + [0.5] * 6


def test_guard_refuses_collapsed_set_with_numbers_and_reason() -> None:
    with pytest.raises(ValueError) as error:
        check_label_entropy(COLLAPSED, what="modal-filter set")
    text = str(error.value)
    assert "label entropy collapse in the modal-filter set" in text
    assert "97.0% of 100" in text and "95%" in text
    assert "bits" in text and "0.509" in text  # the figures and the paper's result


def test_guard_passes_the_paper_rescue_mix() -> None:
    stats = check_label_entropy(RESCUE)
    assert stats["n"] == 100
    assert stats["top_share"] == pytest.approx(0.48)
    assert stats["top_value"] == pytest.approx(0.95)
    assert 1.4 < stats["entropy_bits"] < 2.2


def test_guard_thresholds_and_entropy_values() -> None:
    assert label_entropy([0.05, 0.95])["entropy_bits"] == pytest.approx(1.0)
    assert label_entropy([0.5] * 10)["entropy_bits"] == 0.0
    with pytest.raises(ValueError, match="collapse"):
        check_label_entropy([0.05] * 10)  # collapsed at the floor too
    # 85/15: enough entropy (0.61 bits) and top share under 90%
    assert check_label_entropy([0.05] * 85 + [0.15] * 15)["top_share"] == pytest.approx(0.85)
    with pytest.raises(ValueError, match="top share"):
        check_label_entropy([0.05] * 85 + [0.15] * 15, max_top_share=0.8)
    with pytest.raises(ValueError, match="empty"):
        check_label_entropy([])
    with pytest.raises(ValueError, match="probability"):
        check_label_entropy([95.0, 5.0])  # percentages, not probabilities


# --- AUROC2 and the ceiling rate -----------------------------------------------------


def test_auroc2_interval_brackets_the_estimate_and_narrows_with_more_wrong_answers() -> None:
    rng = np.random.default_rng(1)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray]:
        correct = rng.random(n) < 0.7
        return correct, np.clip(0.5 + 0.2 * (correct - 0.5) + rng.normal(0, 0.2, n), 0, 1)

    small, large = sample(60), sample(600)
    low, high = auroc2_interval(*small)
    assert low <= auroc2(*small) <= high and high - low > 0
    low_l, high_l = auroc2_interval(*large)
    assert low_l <= auroc2(*large) <= high_l
    assert high_l - low_l < (high - low) / 2  # about 1/sqrt(10) as wide
    assert auroc2_interval(*small) == (low, high)  # seeded
    assert auroc2_interval([True, False, True, False], [0.9, 0.1, 0.8, 0.2]) == (1.0, 1.0)
    assert all(math.isnan(v) for v in auroc2_interval([True, True], [0.2, 0.9]))
    with pytest.raises(ValueError, match="level=1"):
        auroc2_interval([True, False], [0.9, 0.1], level=1)


def test_auroc2_known_value_and_nan_rule() -> None:
    correct = [True, False, True, False]
    assert auroc2(correct, [0.9, 0.1, 0.8, 0.2]) == 1.0
    assert auroc2(correct, [0.1, 0.9, 0.2, 0.8]) == 0.0
    # pairs (correct, wrong): (.9,.4) win, (.9,.6) win, (.5,.4) win, (.5,.6) loss -> 3/4
    assert auroc2([1, 0, 1, 0], [0.9, 0.4, 0.5, 0.6]) == pytest.approx(0.75)
    assert auroc2(correct, [0.5] * 4) == 0.5  # ties are chance
    assert math.isnan(auroc2([True, True], [0.2, 0.9]))
    assert math.isnan(auroc2([False, False, False], [0.2, 0.9, 0.1]))
    with pytest.raises(ValueError, match="2 values for 3"):
        auroc2([True, False, True], [0.1, 0.2])
    with pytest.raises(ValueError, match="NaN"):
        auroc2([True, False], [0.1, float("nan")])


def test_ceiling_rate() -> None:
    assert ceiling_rate([0.95, 0.9, 0.89, 0.1]) == 0.5
    assert ceiling_rate([0.95, 0.9, 0.89, 0.1], threshold=0.95) == 0.25
    with pytest.raises(ValueError, match="percentages"):
        ceiling_rate([95, 50])
    with pytest.raises(ValueError, match="no confidences"):
        ceiling_rate([])


# --- answers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Beatles!", "beatles"),
        ("  An   Apple a day ", "apple day"),
        ("14 December 1972 UTC.", "14 december 1972 utc"),
        ("Rock 'n' Roll", "rock n roll"),
        ("THE", ""),
        ("theatre", "theatre"),  # articles only as whole words
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_match_answer_aliases() -> None:
    aliases = ["14 December 1972 UTC", "December 1972"]
    assert match_answer("december 1972.", aliases)
    assert not match_answer("It was in December 1972", aliases)
    assert match_answer("It was in December 1972", aliases, mode="contains")
    assert not match_answer("Scottish", ["Scott"], mode="contains")  # whole words only
    assert not match_answer("", aliases, mode="contains")
    assert not match_answer("the", ["The"])  # normalises to nothing: never a match
    with pytest.raises(ValueError, match="list of strings"):
        match_answer("x", "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mode"):
        match_answer("x", ["x"], mode="fuzzy")  # type: ignore[arg-type]


# --- the verbal-confidence parser ----------------------------------------------------

PARSER_TABLE = [
    ("Paris\nConfidence: 85%", 0.85),
    ("Confidence: 85 %", 0.85),
    ("confidence 0.85", 0.85),
    ("CONFIDENCE=0.35", 0.35),
    ("Confidence: .9", 0.9),
    ("Confidence level: 70", 0.70),
    ("Confidence (0-100): 70", 0.70),
    ("My confidence is about 0.6.", 0.6),
    ("Confidence: 8/10", 0.8),
    ("Certainty: 3 out of 5", 0.6),
    ("7 out of 10 confidence", 0.7),
    ("I'm 90% sure it is Paris.", 0.9),
    ("I am 75 percent confident", 0.75),
    ("Answer: Paris (80% confidence)", 0.8),
    ("Paris, I'm 90% sure", 0.9),
    ("85 percent", 0.85),
    ("Paris\n85%", 0.85),
    ("Confidence: 80-90%", 0.85),
    ("Confidence: 0", 0.0),
    ("Confidence: 100%", 1.0),
    # unparseable: None, never a guess
    ("Paris", None),
    ("Confidence: high", None),
    ("Confidence: very confident", None),
    ("Confidence: 150%", None),
    ("Confidence: 1", None),  # 1% or 100%?
    ("I'm not 100% sure", None),
    ("The population grew 20% in 2010.", None),
    ("Confidence: NN%", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), PARSER_TABLE)
def test_parse_confidence_table(text: str, expected: float | None) -> None:
    value = parse_confidence(text)
    if expected is None:
        assert value is None
    else:
        assert value == pytest.approx(expected)


def test_unparsed_outputs_can_be_counted() -> None:
    outputs = [text for text, _ in PARSER_TABLE]
    unparsed = sum(parse_confidence(t) is None for t in outputs)
    assert unparsed == sum(expected is None for _, expected in PARSER_TABLE) == 9


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        (" Paris\nConfidence: 85%", "Paris"),
        ("Answer: Paris (80% confidence)", "Paris"),
        ("Paris, I'm 90% sure", "Paris"),
        ("\n\nBobby Scott.\n", "Bobby Scott"),
        (" joy\nConfidence: 70%", "joy"),
        ("Confidence: 70%", ""),
    ],
)
def test_split_answer_confidence(text: str, answer: str) -> None:
    assert split_answer_confidence(text)[0] == answer


@given(st.integers(0, 100))
def test_format_then_parse_round_trips(percent: int) -> None:
    text = format_confidence(percent / 100)
    assert text == f"Confidence: {percent}%"
    assert parse_confidence(text) == pytest.approx(percent / 100)


def test_guard_names_the_remedy_for_each_end() -> None:
    with pytest.raises(ValueError, match="filtered subset"):
        check_label_entropy([0.95] * 20)
    with pytest.raises(ValueError, match="rarely right"):
        check_label_entropy([0.05] * 20)
