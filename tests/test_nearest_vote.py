"""The nearest-label vote (``vote="nearest"``) by hand on a small embedding matrix, and the
float32 head of the transformers adapter against a float32 model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from semsoft_plugin import SemanticSoftmax, constrained_softmax

# Five tokens: the labels " no" and " yes" (antonyms: cosine 0.6), " No" (the answer the
# model actually gives: nearest to " no", but close to " yes" too), a token equally near
# both labels, and a filler near neither.
NO, YES, NO_CAP, BOTH, FILLER = 0, 1, 2, 3, 4
EMB = torch.tensor(
    [
        [1.0, 0.0, 0.0, 0.0],
        [0.6, 0.8, 0.0, 0.0],
        [0.9, 0.3, 0.3162, 0.0],
        [0.8, 0.6, 0.0, 0.0],
        [0.0, 0.0, 0.0, 1.0],
    ]
)
EMB = EMB / EMB.norm(dim=-1, keepdim=True)


def _logits(p: list[float]) -> torch.Tensor:
    return torch.tensor(p, dtype=torch.float64).log().float()


def _scorer(**options: object) -> SemanticSoftmax:
    settings = {"k": 5, "tau": 0.0, "center": False, "semantic_weight": 1.0}
    return SemanticSoftmax(EMB, [NO, YES], **{**settings, **options})  # type: ignore[arg-type]


def _cos(a: int, b: int) -> float:
    return float(EMB[a] @ EMB[b])


def test_nearest_vote_hand_computed():
    # The abuse-data mechanism: " No" .73, " no" .14, " yes" .01 (+ the rest).
    p = [0.14, 0.01, 0.73, 0.02, 0.10]
    result = _scorer(vote="nearest")(_logits(p))
    # " No" votes for " no" alone, claiming its margin over " yes".
    claim_cap = p[NO_CAP] * (_cos(NO_CAP, NO) - _cos(NO_CAP, YES))
    # The token equally near both labels has margin 0.2 (cos .8 vs .96): it goes to " yes".
    claim_both = p[BOTH] * (_cos(BOTH, YES) - _cos(BOTH, NO))
    claimed = p[NO] + p[YES] + claim_cap + claim_both
    constrained = np.array([p[NO], p[YES]]) / (p[NO] + p[YES])
    expected = np.array([p[NO] + claim_cap, p[YES] + claim_both]) + (1 - claimed) * constrained
    np.testing.assert_allclose(result.semantic.numpy(), expected, atol=1e-5)
    # Coverage counts every token that has any label neighbour (all but the filler).
    assert float(result.coverage) == pytest.approx(0.90, abs=1e-6)


def test_shared_claim_leaks_to_the_antonym_and_nearest_does_not():
    p = [0.14, 0.01, 0.73, 0.02, 0.10]
    constrained = constrained_softmax(_logits(p), [NO, YES])
    shared = _scorer(vote="residual")(_logits(p)).semantic
    nearest = _scorer(vote="nearest")(_logits(p)).semantic
    # The model's answer is " No"; sharing its claim by cosine hands " yes" a large part
    # of it, below even the constrained softmax; the nearest vote keeps it with " no".
    assert float(shared[0]) < float(constrained[0]) - 0.2
    assert float(nearest[0]) >= float(constrained[0])


def test_a_token_equally_near_two_labels_claims_nothing():
    emb = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.7071, 0.7071, 0.0]])
    logits = _logits([0.2, 0.1, 0.7])
    result = SemanticSoftmax(
        emb, [0, 1], k=3, tau=0.0, center=False, vote="nearest",
        semantic_weight=1.0,
    )(logits)  # fmt: skip
    torch.testing.assert_close(
        result.semantic, constrained_softmax(logits, [0, 1]), atol=1e-6, rtol=0
    )


def test_case_variant_as_own_token_votes_fully():
    # Declared as the label's own spelling, " No" votes for " no" with its whole mass.
    from semsoft_plugin.core.tokens import LabelTokens

    tokens = LabelTokens(answer_token_ids=(NO, YES), own_token_ids=((NO, NO_CAP), (YES,)))
    p = [0.14, 0.01, 0.73, 0.02, 0.10]
    result = SemanticSoftmax(
        EMB, tokens, k=5, tau=0.0, center=False, vote="nearest",
        semantic_weight=1.0,
    )(_logits(p))  # fmt: skip
    claim_both = p[BOTH] * (_cos(BOTH, YES) - _cos(BOTH, NO))
    claimed = p[NO] + p[YES] + p[NO_CAP] + claim_both
    constrained = np.array([p[NO], p[YES]]) / (p[NO] + p[YES])
    expected = np.array([p[NO] + p[NO_CAP], p[YES] + claim_both]) + (1 - claimed) * constrained
    np.testing.assert_allclose(result.semantic.numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_nearest_vote_invariants_on_random_rows(seed):
    generator = torch.Generator().manual_seed(seed)
    emb = torch.randn(200, 16, generator=generator)
    logits = torch.randn(4, 200, generator=generator) * 3
    for a in (0.0, 0.5, 1.0):
        vote = "nearest" if a > 0 else "residual"  # at weight 0 the vote has no effect
        result = SemanticSoftmax(emb, [3, 7, 11], k=30, vote=vote, semantic_weight=a)(logits)
        assert torch.isfinite(result.semantic).all()
        torch.testing.assert_close(result.semantic.sum(-1), torch.ones(4), atol=1e-5, rtol=0)
        if a == 0.0:
            torch.testing.assert_close(result.semantic, result.constrained, atol=1e-6, rtol=0)


def test_single_label_set_is_one():
    result = SemanticSoftmax(EMB, [NO], k=5, vote="nearest", semantic_weight=1.0)(
        _logits([0.2, 0.2, 0.2, 0.2, 0.2])
    )
    torch.testing.assert_close(result.semantic, torch.ones(1))


# -- the float32 head -------------------------------------------------------------------


@pytest.fixture(scope="module")
def models_by_dtype(default_checkpoint):
    from semsoft_plugin.engines import models

    bf16, tokenizer = models.load(str(default_checkpoint), dtype="bfloat16")
    fp32, _ = models.load(str(default_checkpoint), dtype="float32")
    return bf16, fp32, tokenizer


def test_float32_head_equals_a_float32_product_of_the_same_hidden_state(models_by_dtype):
    from semsoft_plugin.engines.hf import float32_head

    bf16, _, tokenizer = models_by_dtype
    ids = tokenizer(["The film was wonderful, I loved it"], return_tensors="pt")
    with torch.inference_mode():
        hidden = bf16.model(**ids).last_hidden_state[:, -1]
        with float32_head(bf16):
            exact = bf16(**ids, logits_to_keep=1).logits[:, -1]
        rounded = bf16(**ids, logits_to_keep=1).logits[:, -1]
    expected = hidden.float() @ bf16.lm_head.weight.float().T
    assert exact.dtype == torch.float32 and rounded.dtype == torch.bfloat16
    torch.testing.assert_close(exact, expected, atol=1e-4, rtol=1e-5)
    # bf16 output rounds tens of thousands of logits onto a few thousand values.
    assert exact.unique().numel() > 10 * rounded.unique().numel()
    # The hook is gone after the block.
    with torch.inference_mode():
        again = bf16(**ids, logits_to_keep=1).logits
    assert again.dtype == torch.bfloat16


def test_float32_head_leaves_a_float32_model_alone(models_by_dtype):
    from semsoft_plugin.engines.hf import float32_head

    _, fp32, tokenizer = models_by_dtype
    ids = tokenizer(["ok"], return_tensors="pt")
    with torch.inference_mode():
        plain = fp32(**ids, logits_to_keep=1).logits
        with float32_head(fp32):
            hooked = fp32(**ids, logits_to_keep=1).logits
    assert torch.equal(plain, hooked)


def test_classify_scores_from_the_float32_head_have_no_rounding_ties(models_by_dtype):
    from semsoft_plugin.engines.hf import classify

    bf16, _, tokenizer = models_by_dtype
    texts = [
        "A tedious mess that goes nowhere for two hours.",
        "I wanted to walk out after twenty minutes.",
        "Dull, slow and far too long.",
        "The plot made no sense and the acting was flat.",
    ]
    exact = classify(bf16, tokenizer, texts, ["positive", "negative"], keep_logits=True)
    rounded = classify(
        bf16, tokenizer, texts, ["positive", "negative"], keep_logits=True, exact_head=False
    )
    exact_p = {round(r.constrained_probs["positive"], 9) for r in exact}
    assert len(exact_p) == len(texts)
    for a, b in zip(exact, rounded, strict=True):
        assert a.logits is not None and b.logits is not None
        # Same hidden states: the rounded logits are the exact ones to bf16 precision
        # (within one bf16 step, 2**-7 relative: the bf16 product rounds its own way).
        torch.testing.assert_close(a.logits, b.logits, atol=2**-7, rtol=2**-7)
