"""Confidence targets, the label-entropy guard, AUROC2, and reading answers and stated confidences.

The second seed of the project (Cacioli, 2026, "Distilling Self-Consistency into Verbal
Confidence"): sample `n = 10` answers at `T = 0.7`, map the number of correct samples
to a confidence target, and teach the model to state it. This module holds the pieces
that need no engine: the target map, the guard that refuses a collapsed training set,
the two figures the paper reports (AUROC2 and the ceiling rate), SQuAD-style answer
matching for open QA, and a parser for the confidences models write ("Confidence: 85%",
"I'm 90% sure", ...). It imports numpy and scikit-learn only.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np

__all__ = [
    "PAPER_TARGETS",
    "target_from_samples",
    "targets_from_samples",
    "label_entropy",
    "check_label_entropy",
    "auroc2",
    "auroc2_interval",
    "ceiling_rate",
    "normalize_answer",
    "match_answer",
    "parse_confidence",
    "split_answer_confidence",
    "format_confidence",
]

# n_correct out of 10 samples -> stated confidence in percent (the paper's table). Below
# half the target is the middle of the bin (1/10 -> 15%), from half up it is the share
# itself, and it never reaches 0% or 100%.
PAPER_TARGETS: dict[int, int] = {
    0: 5, 1: 15, 2: 25, 3: 35, 4: 45, 5: 50, 6: 60, 7: 70, 8: 80, 9: 90, 10: 95,
}  # fmt: skip
_PAPER_X = np.arange(11, dtype=np.float64)
_PAPER_Y = np.array([PAPER_TARGETS[k] for k in range(11)], dtype=np.float64) / 100.0


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"n={n!r} must be a positive int (the number of samples)")
    return int(n)


def targets_from_samples(n_correct: Sequence[int] | np.ndarray, n: int = 10) -> np.ndarray:
    """Vectorised `target_from_samples`: one probability per item."""
    n = _check_n(n)
    counts = np.asarray(n_correct)
    if counts.size and not np.issubdtype(counts.dtype, np.integer):
        raise ValueError(f"n_correct must hold integers, got dtype {counts.dtype}")
    if counts.size and (counts.min() < 0 or counts.max() > n):
        bad = counts[(counts < 0) | (counts > n)][0]
        raise ValueError(f"n_correct={int(bad)} is outside 0..n={n}")
    return np.interp(10.0 * counts.astype(np.float64) / n, _PAPER_X, _PAPER_Y)


def target_from_samples(n_correct: int, n: int = 10) -> float:
    """The confidence target for an item with `n_correct` of `n` sampled answers right.

    For `n = 10` this is the paper's table, `PAPER_TARGETS` (as a probability:
    `target_from_samples(7) == 0.70`, `target_from_samples(0) == 0.05`).

    Other `n`: the paper's map is read at the same share, `10 * n_correct / n`, and
    interpolated linearly between its points. This keeps what the table encodes (never
    0% nor 100%, 5% for no correct sample, 95% for all, 50% at half) and gives exactly the
    table again when `n` is 10 (or a multiple of 10 at shares that are whole tenths):
    `target_from_samples(1, 20) == 0.10`, `target_from_samples(3, 5) == 0.60`.

    Raises
    ------
    ValueError
        when `n` is not a positive int or `n_correct` is not an int in `0..n`.
    """
    if isinstance(n_correct, bool) or not isinstance(n_correct, int | np.integer):
        raise ValueError(f"n_correct={n_correct!r} must be an int")
    return float(targets_from_samples(np.array([n_correct]), n)[0])


def label_entropy(targets: Iterable[float], *, bin_width: float = 0.05) -> dict[str, float]:
    """Shannon entropy (bits) of the targets' histogram and the share of the commonest bin.

    Targets are probabilities in `[0, 1]`, binned to multiples of `bin_width` (the
    paper's targets all fall on distinct 5-point bins).
    """
    values = np.asarray(list(targets), dtype=np.float64)
    if values.size == 0:
        raise ValueError("no targets given: the training set is empty")
    if not np.isfinite(values).all() or values.min() < 0 or values.max() > 1:
        bad = values[~np.isfinite(values) | (values < 0) | (values > 1)][0]
        raise ValueError(f"target {bad!r} is not a probability in [0, 1]")
    if not 0 < bin_width <= 1:
        raise ValueError(f"bin_width={bin_width!r} must be in (0, 1]")
    bins, counts = np.unique(np.rint(values / bin_width).astype(np.int64), return_counts=True)
    shares = counts / counts.sum()
    top = int(counts.argmax())
    return {
        "entropy_bits": float(-(shares * np.log2(shares)).sum() + 0.0),
        "top_share": float(shares[top]),
        "top_value": float(bins[top] * bin_width),
        "n": int(values.size),
        "n_values": int(bins.size),
    }


def check_label_entropy(
    targets: Iterable[float],
    *,
    min_entropy_bits: float = 0.5,
    max_top_share: float = 0.9,
    bin_width: float = 0.05,
    what: str = "training set",
) -> dict[str, float]:
    """Refuse a training set whose confidence targets have collapsed to (nearly) one value.

    The paper's negative result: keeping only items whose modal answer is correct leaves
    nearly every target at 95%, the fine-tuned model learns to say 95% whatever happens,
    and its verbal AUROC2 goes nowhere (0.554 -> 0.509); trained on all items it rose to
    0.774. A target set carries at most its entropy in information about correctness, so
    the guard measures it before any training.

    The defaults refuse a set when its histogram (5-point bins) has under 0.5 bits of
    entropy or one bin holds more than 90% of the items. For scale: the paper's rescue
    mix (48% at 95, 37% at 5, the other 15% between) has 1.4 to 1.9 bits, depending on
    how the 15% spread, and passes; 97% at 95 has about 0.2 bits and is refused.

    Parameters
    ----------
    targets : Iterable[float]
        Confidence targets as probabilities in `[0, 1]`
    min_entropy_bits : float
        Refuse below this entropy (bits)
    max_top_share : float
        Refuse when the commonest bin holds more than this share
    bin_width : float
        Histogram bin width (probability)
    what : str
        How the set is named in the error message

    Returns
    -------
    dict
        `entropy_bits`, `top_share`, `top_value`, `n`, `n_values` of a healthy set.

    Raises
    ------
    ValueError
        naming the figures and the reason, when the set has collapsed.
    """
    if not 0 <= max_top_share <= 1:
        raise ValueError(f"max_top_share={max_top_share!r} must be in [0, 1]")
    stats = label_entropy(targets, bin_width=bin_width)
    collapsed = stats["entropy_bits"] < min_entropy_bits or stats["top_share"] > max_top_share
    if collapsed:
        if stats["top_value"] >= 0.5:
            remedy = (
                "Train on all items instead of a filtered subset, or mix in items the model "
                "gets wrong (the paper's rescue mix: 48% at 95, 37% at 5, the rest between)"
            )
        else:
            remedy = (
                "The model is rarely right on these questions: use a stronger model or easier "
                "questions, so that the set holds items it gets right (the paper's rescue mix: "
                "48% at 95, 37% at 5, the rest between)"
            )
        raise ValueError(
            f"label entropy collapse in the {what}: {stats['top_share']:.1%} of "
            f"{stats['n']} confidence targets are {stats['top_value']:.0%}, entropy "
            f"{stats['entropy_bits']:.2f} bits (needs >= {min_entropy_bits:.2f} bits and "
            f"top share <= {max_top_share:.0%}). A model fine-tuned on near-constant targets "
            "learns to state that one value whatever its answer (Cacioli 2026: training only "
            "on items whose modal answer was correct left verbal AUROC2 at 0.509, from "
            f"0.554). {remedy}"
        )
    return stats


def _binary(correct: Any, name: str) -> np.ndarray:
    values = np.asarray(correct)
    if values.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {values.shape}")
    if values.dtype != bool:
        if not np.isin(values, (0, 1)).all():
            raise ValueError(f"{name} must hold booleans or 0/1")
        values = values.astype(bool)
    return values


def _probabilities(confidence: Any, size: int | None = None) -> np.ndarray:
    values = np.asarray(confidence, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"confidence must be one-dimensional, got shape {values.shape}")
    if size is not None and values.size != size:
        raise ValueError(f"confidence has {values.size} values for {size} items")
    if not np.isfinite(values).all():
        raise ValueError("confidence holds NaN or infinite values")
    return values


def auroc2(correct: Sequence[bool] | np.ndarray, confidence: Sequence[float] | np.ndarray) -> float:
    """ROC AUC of `confidence` for telling correct from incorrect answers (type-2 AUROC).

    0.5 is chance, 1.0 means every correct answer got a higher confidence than every
    wrong one. NaN when all items are one class (the AUC is undefined there); callers
    writing reports turn that NaN into an explicit "undefined".
    """
    from sklearn.metrics import roc_auc_score

    hits = _binary(correct, "correct")
    scores = _probabilities(confidence, hits.size)
    if hits.size == 0 or hits.all() or not hits.any():
        return math.nan
    return float(roc_auc_score(hits, scores))


def auroc2_interval(
    correct: Sequence[bool] | np.ndarray,
    confidence: Sequence[float] | np.ndarray,
    *,
    level: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `auroc2`, items resampled with their labels.

    An AUROC2 rests on the wrong answers: with 10 wrong among 100 the interval is about
    0.3 wide, so a difference of 0.1 between two signals on such a set says little.
    Resamples that hold one class only have no AUC and are skipped (`scipy.stats.bootstrap`
    would return NaN for the whole interval instead). `(nan, nan)` when the set itself
    holds one class.
    """
    from sklearn.metrics import roc_auc_score

    if not 0 < level < 1:
        raise ValueError(f"level={level!r} must be in (0, 1)")
    if n_resamples < 1:
        raise ValueError(f"n_resamples={n_resamples!r} must be >= 1")
    hits = _binary(correct, "correct")
    scores = _probabilities(confidence, hits.size)
    if hits.size == 0 or hits.all() or not hits.any():
        return math.nan, math.nan
    rows = np.random.default_rng(seed).integers(0, hits.size, size=(n_resamples, hits.size))
    values = [
        roc_auc_score(hits[row], scores[row]) for row in rows if 0 < hits[row].sum() < row.size
    ]
    low, high = np.percentile(values, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def ceiling_rate(confidence: Sequence[float] | np.ndarray, threshold: float = 0.9) -> float:
    """Share of answers stated with confidence `>= threshold` (the paper's ceiling rate).

    Confidences are probabilities in `[0, 1]`; percentages are refused rather than
    silently rescaled.
    """
    values = _probabilities(confidence)
    if values.size == 0:
        raise ValueError("no confidences given")
    if values.min() < 0 or values.max() > 1:
        raise ValueError(
            f"confidence {values[(values < 0) | (values > 1)][0]!r} is outside [0, 1] "
            "(give probabilities, not percentages)"
        )
    if not 0 <= threshold <= 1:
        raise ValueError(f"threshold={threshold!r} must be in [0, 1]")
    return float((values >= threshold).mean())


# --- Open-QA answer checking (SQuAD v1.1's evaluation script, then alias matching) ---------

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, squeeze whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def match_answer(
    prediction: str,
    aliases: Sequence[str],
    *,
    mode: Literal["exact", "contains"] = "exact",
) -> bool:
    """Whether a predicted answer matches any gold alias after `normalize_answer`.

    `"exact"`: the normalised strings are equal (SQuAD's exact match). `"contains"`:
    some normalised alias occurs in the normalised prediction as a whole-word span (the
    "has answer" rule of open-domain QA, for models that answer in a phrase:
    "It was Bobby Scott" matches "Bobby Scott", "Scottish" does not match "Scott").
    Aliases that normalise to nothing (`"the"`) never match.
    """
    if isinstance(aliases, str):
        raise ValueError("aliases must be a list of strings, not one string")
    if mode not in ("exact", "contains"):
        raise ValueError(f"mode={mode!r} must be 'exact' or 'contains'")
    predicted = normalize_answer(prediction)
    if not predicted:
        return False
    for alias in aliases:
        gold = normalize_answer(alias)
        if not gold:
            continue
        if predicted == gold:
            return True
        if mode == "contains" and f" {gold} " in f" {predicted} ":
            return True
    return False


# --- Verbal confidence ------------------------------------------------------------------

_NUMBER = r"(\d{1,3}(?:\.\d+)?|\.\d+)"
_RANGE = rf"{_NUMBER}(?:\s*%?\s*(?:-|–|to)\s*{_NUMBER})?"
_UNIT = r"(%|\s*percent\b|\s*per\s*cent\b|\s*/\s*(?:100|10|5)\b|\s+out\s+of\s+(?:100|10|5)\b)?"
_KEYWORD = r"(?:confidence|confident|certainty|certain|sure|probability|likelihood)"
_FILLER = (
    r"(?:\s+(?:level|score|rating|estimate))?(?:\s*\([^)]*\))?"
    r"(?:\s*(?::|=|-|–|is|of|at|was|would\s+be|about|around|approximately|roughly|~|≈))*\s*"
)
# "Confidence: 85%", "confidence level is 0.85", "Certainty: 8/10"
_AFTER_KEYWORD = re.compile(rf"\b{_KEYWORD}{_FILLER}{_RANGE}{_UNIT}", re.IGNORECASE)
# "I'm 90% sure", "85 percent confident", "(80% confidence)"; a unit is required here
_BEFORE_KEYWORD = re.compile(
    rf"{_RANGE}(%|\s*percent\b|\s*per\s*cent\b|\s*/\s*(?:100|10|5)\b|\s+out\s+of\s+(?:100|10|5)\b)"
    rf"\s+(?:\w+\s+)?{_KEYWORD}",
    re.IGNORECASE,
)
# a line holding only a percentage, e.g. "Paris\n85%" or "(85%)"
_LONE_PERCENT = re.compile(rf"^\W*{_RANGE}(%|\s*percent)\W*$", re.IGNORECASE | re.MULTILINE)
_NEGATION = re.compile(r"\b(?:not|n't|never|no)\s+(?:\w+\s+){0,2}$", re.IGNORECASE)


def _to_probability(number: str, unit: str | None) -> float | None:
    value = float(number)
    unit = (unit or "").strip().lower().replace(" ", "")
    if unit in ("%", "percent", "percent.", "percent,") or unit.startswith("per"):
        scale = 100.0
    elif unit.startswith("/") or unit.startswith("outof"):
        scale = float(unit.removeprefix("/").removeprefix("outof"))
    elif "." in number:
        # A bare decimal: 0.85 is a probability, 85.5 a percentage.
        scale = 1.0 if value <= 1 else 100.0
    elif value == 1:
        return None  # a bare "1" is 1% or 100%: ambiguous, not guessed
    else:
        scale = 100.0  # a bare integer 0 or 2..100 is a percentage
    probability = value / scale
    return probability if 0 <= probability <= 1 else None


def _read_match(match: re.Match[str], text: str) -> float | None:
    if _NEGATION.search(text[: match.start()]):
        return None  # "I'm not 100% sure" states no confidence
    low, high, unit = match.group(1), match.group(2), match.group(3)
    first = _to_probability(low, unit)
    if high is None:
        return first
    second = _to_probability(high, unit)
    if first is None or second is None or second < first:
        return None
    return round((first + second) / 2, 10)  # a stated interval "80-90%": its centre


def parse_confidence(text: str) -> float | None:
    """The confidence a model stated in `text`, as a probability; `None` when there is none.

    Handles what models write: `"Confidence: 85%"`, `"confidence 0.85"`,
    `"Confidence level: 85"`, `"85 percent"` / `"85% confident"`,
    `"I'm 90% sure"`, `"Certainty: 8/10"`, `"7 out of 10"`, a range
    `"80-90%"` (its centre) and a line holding only a percentage. A number marked
    by a confidence keyword wins over a lone percentage; the first such statement is
    read.

    Returns `None` (never a guess) for words (`"Confidence: high"`), numbers out of
    range (`"Confidence: 150%"`), a bare `1` (1% or 100%?), negated statements
    (`"I'm not 100% sure"`) and text with no statement at all; count those.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a string, got {type(text).__name__}")
    for pattern in (_AFTER_KEYWORD, _BEFORE_KEYWORD, _LONE_PERCENT):
        match = pattern.search(text)
        if match is not None:
            return _read_match(match, text)
    return None


# where a statement begins, so that the answer before it can be cut off
_STATEMENT_START = re.compile(
    rf"(?:\b{_KEYWORD}\b|\bI(?:'?m|\s+am)\b[^\n\d]{{0,24}}(?=\d)|\(\s*(?=\d))", re.IGNORECASE
)
_ANSWER_PREFIX = re.compile(r"^\s*(?:final\s+)?answer\s*[:\-]\s*", re.IGNORECASE)


def split_answer_confidence(text: str) -> tuple[str, float | None]:
    """Split `"Paris\\nConfidence: 85%"` into the answer text and the stated confidence.

    The answer is the first non-empty line before any confidence statement, without an
    `"Answer:"` prefix or trailing punctuation; the confidence is `parse_confidence`
    of the whole text.
    """
    confidence = parse_confidence(text)
    starts = [len(text)]
    for pattern in (_STATEMENT_START, _BEFORE_KEYWORD, _LONE_PERCENT):
        match = pattern.search(text)
        if match is not None:
            starts.append(match.start())
    head = text[: min(starts)]
    lines = [line.strip() for line in head.splitlines() if line.strip()]
    answer = _ANSWER_PREFIX.sub("", lines[0]) if lines else ""
    return answer.strip().rstrip(".,;:(").strip(), confidence


def format_confidence(probability: float) -> str:
    """The statement the distillation recipe teaches: `"Confidence: 85%"`."""
    if not 0 <= probability <= 1:
        raise ValueError(f"probability={probability!r} must be in [0, 1]")
    return f"Confidence: {round(probability * 100)}%"
