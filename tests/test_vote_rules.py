"""The vote rules as a table (``core/softmax.py``): one function per rule behind a
dispatch, and the constrained softmax returned at once when the pool weight is 0.

``tests/data/vote_rule_rows.json`` holds rows the code before the dispatch produced (one
``_score`` of flag branches, commit 585b67d) on a seeded 64-token vocabulary: every vote
rule with and without own votes and centring, pooled and alone, a quantile threshold,
score temperatures, a masked tail, a masked answer token and rows that fall back. The
rows must stay equal within 1e-7."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from semsoft_plugin.core import softmax
from semsoft_plugin.core.config import VOTES, SemsoftConfig
from semsoft_plugin.core.softmax import SemanticSoftmax
from semsoft_plugin.core.tokens import LabelTokens

DATA = json.loads((Path(__file__).parent / "data" / "vote_rule_rows.json").read_text("utf-8"))
EMBEDDINGS = torch.tensor(DATA["embeddings"])
LOGITS = torch.tensor([[float(x) for x in row] for row in DATA["logits"]])
LABELS = LabelTokens(tuple(DATA["answer"]), tuple(tuple(o) for o in DATA["own"]), None)
CASES = DATA["cases"]


@pytest.mark.parametrize("case", CASES, ids=[json.dumps(c["config"]) for c in CASES])
def test_rows_equal_the_code_before_the_dispatch(case: dict) -> None:
    result = SemanticSoftmax(EMBEDDINGS, LABELS, SemsoftConfig(**case["config"]))(LOGITS)
    torch.testing.assert_close(result.probs, torch.tensor(case["probs"]), atol=1e-7, rtol=0)
    want = torch.tensor(case["constrained_probs"])
    torch.testing.assert_close(result.constrained_probs, want, atol=1e-7, rtol=0)
    torch.testing.assert_close(result.coverage, torch.tensor(case["coverage"]), atol=1e-7, rtol=0)
    if case["config"].get("semantic_weight", 0.0) > 0:
        # At weight 0 no vote is computed, so no row falls back (the rows are the same).
        assert result.fallback.tolist() == case["fallback"]


def test_the_fixture_reaches_every_rule_and_a_fallback() -> None:
    assert {c["config"].get("vote", "residual") for c in CASES} == set(VOTES)
    assert any(any(c["fallback"]) for c in CASES)


def test_one_rule_per_vote_setting() -> None:
    assert set(softmax._VOTE_RULES) == set(VOTES)


def test_weight_zero_computes_no_vote(monkeypatch: pytest.MonkeyPatch) -> None:
    """At ``semantic_weight=0`` the rows are the constrained softmax and no rule runs (row 2
    has a masked answer token, which the pool counts at the smallest kept probability)."""

    def refuse(*_: object) -> None:
        raise AssertionError("a vote rule ran at semantic_weight=0")

    monkeypatch.setattr(softmax, "_VOTE_RULES", dict.fromkeys(VOTES, refuse))
    monkeypatch.setattr(softmax, "_pooled", refuse)
    result = SemanticSoftmax(EMBEDDINGS, LABELS, SemsoftConfig())(LOGITS)
    rows = [0, 1, 3, 4, 5, 6]
    torch.testing.assert_close(
        result.probs[rows], result.constrained_probs[rows], atol=1e-6, rtol=0
    )
    assert not bool(result.fallback.any())
    with pytest.raises(AssertionError, match="a vote rule ran"):
        SemanticSoftmax(EMBEDDINGS, LABELS, SemsoftConfig(semantic_weight=0.3))(LOGITS)
