"""The math core against an independent reference implementation of the paper's formula."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from semsoft_plugin import (
    LabelTokens,
    OutputEmbeddings,
    SemanticSoftmax,
    SemsoftConfig,
    constrained_softmax,
    semantic_softmax,
    semantic_softmax_details,
)
from semsoft_plugin.core.config import MAX_K, VOTES

PAPER = dict(
    center=False, own_vote=False, vote="per_label", semantic_weight=1.0
)


def reference_paper(logits: np.ndarray, emb: np.ndarray, label_ids: list[int], k: int, tau: float):
    """The paper's formula written plainly, one loop per sum (float64)."""
    z = logits - logits.max()
    p = np.exp(z) / np.exp(z).sum()
    kept = sorted(range(len(p)), key=lambda v: -p[v])[:k]

    def cos(a, b):
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    scores = []
    for label in label_ids:
        scores.append(sum(p[v] * max(0.0, cos(emb[v], emb[label]) - tau) for v in kept))
    total = sum(scores)
    if total == 0:
        return None
    return [s / total for s in scores]


def random_case(seed: int, vocab: int = 64, dim: int = 8, labels: int = 4):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, generator=g) * 3
    emb = torch.randn(vocab, dim, generator=g)
    ids = torch.randperm(vocab, generator=g)[:labels].tolist()
    return logits, emb, ids


@pytest.mark.parametrize("k", [1, 5, 20, 64])
@pytest.mark.parametrize("tau", [-0.5, 0.0, 0.1, 0.3])
@pytest.mark.parametrize("seed", range(3))
def test_paper_formula_matches_reference(k, tau, seed):
    logits, emb, ids = random_case(seed)
    expected = reference_paper(logits.double().numpy(), emb.double().numpy(), ids, k, tau)
    result = semantic_softmax_details(logits, emb, ids, k=k, tau=tau, **PAPER)
    if expected is None:
        assert bool(result.fallback)
        torch.testing.assert_close(result.semantic, constrained_softmax(logits, ids))
    else:
        assert not bool(result.fallback)
        np.testing.assert_allclose(result.semantic.numpy(), expected, rtol=1e-4, atol=1e-6)


def test_paper_config_is_the_paper_formula():
    logits, emb, ids = random_case(7)
    cfg = SemsoftConfig.preset("paper").replace(k=10, tau=0.05)
    expected = reference_paper(logits.double().numpy(), emb.double().numpy(), ids, 10, 0.05)
    np.testing.assert_allclose(semantic_softmax(logits, emb, ids, cfg).numpy(), expected, rtol=1e-4)


def test_batched_equals_rows_and_shapes():
    _, emb, ids = random_case(1)
    logits = torch.randn(5, 64)
    batched = semantic_softmax(logits, emb, ids)
    assert batched.shape == (5, 4)
    for row in range(5):
        single = semantic_softmax(logits[row], emb, ids)
        assert single.shape == (4,)
        torch.testing.assert_close(batched[row], single)


def test_fallback_is_flagged_constrained_and_finite():
    logits, emb, ids = random_case(2)
    result = semantic_softmax_details(logits, emb, ids, k=3, tau=0.999, **PAPER)
    assert bool(result.fallback)
    assert float(result.coverage) == 0.0
    torch.testing.assert_close(result.semantic, result.constrained)
    assert torch.isfinite(result.semantic).all()


def test_own_vote_keeps_antonyms_apart():
    # Two labels whose embeddings are nearly identical (antonyms share contexts).
    emb = torch.randn(10, 6)
    emb[1] = emb[0] + 0.05 * torch.randn(6)
    logits = torch.full((10,), -10.0)
    logits[0] = 5.0  # the model is confident in label 0
    paper = semantic_softmax(logits, emb, [0, 1], k=10, tau=0.0, **PAPER)
    own = semantic_softmax(
        logits, emb, [0, 1], k=10, tau=0.0, center=False, own_vote=True, semantic_weight=1.0
    )
    assert paper[0] < 0.6  # the paper's formula splits the vote between antonyms
    assert own[0] > 0.99  # a label's own token votes for it alone


def test_own_vote_variants_count_for_their_label():
    emb = torch.eye(6)
    logits = torch.tensor([0.0, 0.0, 3.0, -9.0, -9.0, -9.0])
    labels = LabelTokens((0, 1), ((0, 2), (1,)))  # token 2 is a spelling variant of label 0
    # The semantic distribution alone (no pooling with the constrained 50/50).
    p = semantic_softmax(logits, emb, labels, k=6, tau=0.0, center=False, semantic_weight=1.0)
    assert p[0] > 0.9


@pytest.mark.parametrize("own_vote", [True, False])
def test_anchor_token_supplies_the_label_embedding(own_vote):
    # The anchor's row stands in for the answer token's row as E_l; the answer token still
    # carries the constrained softmax and (with own_vote) its own vote. The semantic
    # distribution alone (weight 1): the default pools none of it in.
    logits, emb, ids = random_case(7, labels=3)
    anchors = (40, 41, 42) if 40 not in ids else (43, 44, 45)
    tokens = LabelTokens(tuple(ids), tuple((t,) for t in ids), anchors)
    got = semantic_softmax_details(
        logits, emb, tokens, k=20, center=False, own_vote=own_vote, semantic_weight=1.0
    )
    swapped = emb.clone()
    swapped[ids] = emb[list(anchors)]
    want = semantic_softmax_details(
        logits,
        swapped,
        LabelTokens.from_ids(ids),
        k=20,
        center=False,
        own_vote=own_vote,
        semantic_weight=1.0,
    )
    if own_vote:  # the answer tokens' rows matter only through E_l then
        torch.testing.assert_close(got.semantic, want.semantic)
    torch.testing.assert_close(got.constrained, constrained_softmax(logits, ids))
    plain = semantic_softmax(
        logits, emb, ids, k=20, center=False, own_vote=own_vote, semantic_weight=1.0
    )
    assert not torch.allclose(got.semantic, plain)


@pytest.mark.parametrize(
    "anchors, match",
    [
        ((1,), "anchor_token_ids has 1 entries for 2 labels"),
        ((1, -3), "anchor token id -3"),
        ((1, 999), "999 is outside the vocabulary"),
    ],
)
def test_bad_anchor_ids_raise(anchors, match):
    logits, emb, _ = random_case(6)
    with pytest.raises(ValueError, match=match):
        semantic_softmax(logits, emb, LabelTokens((2, 3), ((2,), (3,)), anchors))


# Labels A = e1, B = e2; two kept tokens of probability 1/2 each: t2 = (1, 1), as near A
# as B (cos 1/sqrt 2), and t3 = (1, 0), on A (cos 1) and orthogonal to B. The label tokens
# fall outside the top k = 2. By hand, P(A):
#   per_label: (.5 c + .5) / (.5 c + .5 + .5 c) with c = 1/sqrt 2     = 1/sqrt 2
#   shared:    t2 splits 1/2 : 1/2, t3 all to A: .5 * .5 + .5       = 3/4
#   residual:  claimed t2 .5 c (split), t3 .5 (to A); the unclaimed 1 - .5 c - .5 follows
#              the claimed votes (no answer token kept): A = (.5 c / 2 + .5) / (.5 c + .5)
#   nearest:   t2 claims its margin 0, t3 all of .5 for A, the rest follows: A = 1
_C = 1 / math.sqrt(2)
VOTE_CASE = {
    "per_label": _C,
    "shared": 0.75,
    "residual": (0.5 * _C / 2 + 0.5) / (0.5 * _C + 0.5),
    "nearest": 1.0,
}


@pytest.mark.parametrize("vote", sorted(VOTE_CASE))
def test_each_vote_rule_gives_its_hand_computed_value(vote):
    emb = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    logits = torch.tensor([-20.0, -20.0, 5.0, 5.0])
    cfg = SemsoftConfig(k=2, center=False, own_vote=False, vote=vote, semantic_weight=1.0)
    p = semantic_softmax(logits, emb, [0, 1], cfg)
    want = VOTE_CASE[vote]
    torch.testing.assert_close(p, torch.tensor([want, 1 - want]), atol=1e-5, rtol=0)
    # The four rules differ here, so a vote value that had no effect would fail above.
    assert len({round(v, 4) for v in VOTE_CASE.values()}) == 4


def test_temperature_sharpens_and_flattens():
    logits, emb, ids = random_case(3)
    base = semantic_softmax(logits, emb, ids, tau=0.0)
    hot = semantic_softmax(logits, emb, ids, tau=0.0, score_temperature=4.0)
    cold = semantic_softmax(logits, emb, ids, tau=0.0, score_temperature=0.25)
    assert hot.max() < base.max() < cold.max()


def test_centering_uses_the_mean_once_per_matrix():
    emb = torch.randn(32, 4) + 3.0  # a strong common direction
    wrapped = OutputEmbeddings(emb)
    torch.testing.assert_close(wrapped.mean, emb.mean(0))
    rows = wrapped.unit_rows(torch.tensor([0, 1]), center=True)
    expected = torch.nn.functional.normalize(emb[[0, 1]] - emb.mean(0), dim=-1)
    torch.testing.assert_close(rows, expected)


def test_padded_vocabulary_rows_are_ignored():
    emb = torch.randn(12, 4)
    wrapped = OutputEmbeddings(emb, vocab_size=10)
    torch.testing.assert_close(wrapped.mean, emb[:10].mean(0))
    logits = torch.randn(12)
    logits[10:] = 50.0  # padding columns must never be kept
    result = SemanticSoftmax(wrapped, [0, 1], k=12)(logits)
    assert float(result.top_k_mass) == pytest.approx(1.0, abs=1e-5)


def test_neg_inf_logits_are_masked_tokens():
    logits, emb, ids = random_case(4)
    logits[ids[0]] = float("-inf")
    p = semantic_softmax(logits, emb, ids)
    assert torch.isfinite(p).all() and p.sum().item() == pytest.approx(1.0, abs=1e-5)


# --- bad inputs --------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, match",
    [
        (float("nan"), "NaN"),
        (float("inf"), r"\+inf"),
    ],
)
def test_non_finite_logits_raise(bad, match):
    logits, emb, ids = random_case(5)
    logits[3] = bad
    with pytest.raises(ValueError, match=match):
        semantic_softmax(logits, emb, ids)


def test_all_masked_row_raises():
    _, emb, ids = random_case(5)
    with pytest.raises(ValueError, match="entirely -inf"):
        semantic_softmax(torch.full((64,), float("-inf")), emb, ids)


@pytest.mark.parametrize(
    "labels, match",
    [
        ([], "empty"),
        ([1, 1], "same answer token id 1"),
        ([1, 999], "999 is outside the vocabulary"),
        ([1, -2], "-2"),
    ],
)
def test_bad_label_ids_raise(labels, match):
    logits, emb, _ = random_case(6)
    with pytest.raises(ValueError, match=match):
        semantic_softmax(logits, emb, labels)


@pytest.mark.parametrize(
    "option, value",
    [
        ("k", 0),
        ("k", 1.5),
        ("tau", 1.0),
        ("tau", -2),
        ("temperature", 0.0),
        ("temperature", math.nan),
        ("center", 1),
    ],
)
def test_bad_options_raise_naming_the_value(option, value):
    logits, emb, ids = random_case(6)
    with pytest.raises(ValueError, match=option):
        semantic_softmax(logits, emb, ids, **{option: value})


def test_unknown_option_raises():
    with pytest.raises(ValueError, match="unknown Semantic Softmax option"):
        SemsoftConfig().replace(kk=3)


def test_logits_wider_than_embeddings_raise():
    with pytest.raises(ValueError, match="only 8 rows"):
        semantic_softmax(torch.randn(10), torch.randn(8, 3), [0, 1])


def test_config_round_trip(tmp_path):
    cfg = SemsoftConfig(
        k=17, tau=0.12, center=False, vote="shared", score_temperature=1.5, semantic_weight=0.4
    )
    cfg.save(tmp_path / "c.json")
    assert SemsoftConfig.load(tmp_path / "c.json") == cfg
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        SemsoftConfig.load(tmp_path / "bad.json")


# --- properties --------------------------------------------------------------

ANY_K = st.integers(1, MAX_K)
ANY_TAU = st.floats(-1.0, 1.0, exclude_max=True)
SOME_TEMPERATURE = st.floats(0.05, 20.0)


@st.composite
def configs(draw, k=ANY_K, tau=ANY_TAU, score_temperature=SOME_TEMPERATURE):
    """Any valid SemsoftConfig, every field drawn (the refused combinations left out: at
    weight 0 the vote settings keep their defaults; tau_quantile with the default tau)."""
    weight = draw(st.one_of(st.just(0.0), st.floats(0.0, 1.0)))
    fields = {"k": draw(k), "score_temperature": draw(score_temperature), "semantic_weight": weight}
    if weight > 0:
        fields.update(
            vote=draw(st.sampled_from(VOTES)), center=draw(st.booleans()),
            own_vote=draw(st.booleans()),
        )  # fmt: skip
        if draw(st.booleans()):
            fields["tau_quantile"] = draw(st.floats(0.01, 0.99))
        else:
            fields["tau"] = draw(tau)
    return SemsoftConfig(**fields)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), configs(k=st.integers(1, 40), tau=st.floats(-0.5, 0.9)))
def test_properties(seed, cfg):
    logits, emb, ids = random_case(seed, vocab=40, labels=5)
    opts = cfg.to_dict()
    p = semantic_softmax(logits, emb, ids, **opts)
    # sums to 1, no NaN
    assert torch.isfinite(p).all()
    assert p.sum().item() == pytest.approx(1.0, abs=1e-5)
    assert (p >= 0).all()
    # invariant to adding a constant to all logits
    torch.testing.assert_close(
        semantic_softmax(logits + 7.5, emb, ids, **opts), p, atol=1e-5, rtol=1e-4
    )
    # equivariant under permuting the labels
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))
    permuted = semantic_softmax(logits, emb, [ids[i] for i in perm], **opts)
    torch.testing.assert_close(permuted, p[perm], atol=1e-5, rtol=1e-4)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.floats(-0.5, 0.9))
def test_k_equal_v_is_the_full_sum(seed, tau):
    logits, emb, ids = random_case(seed, vocab=30, labels=3)
    result = semantic_softmax_details(logits, emb, ids, k=30, tau=tau, **PAPER)
    assert float(result.top_k_mass) == pytest.approx(1.0, abs=1e-5)
    p = torch.softmax(logits.double(), -1)
    unit = torch.nn.functional.normalize(emb.double(), dim=-1)
    w = (unit @ unit[ids].T - tau).clamp_min(0)
    full = p @ w
    if full.sum() > 0:
        np.testing.assert_allclose(
            result.semantic.numpy(), (full / full.sum()).numpy(), rtol=1e-4, atol=1e-6
        )
    else:
        assert bool(result.fallback)
    # K larger than V is clamped to V
    torch.testing.assert_close(
        semantic_softmax(logits, emb, ids, k=500, tau=tau, **PAPER), result.semantic
    )


def test_constrained_softmax_is_the_label_softmax():
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    expected = torch.softmax(torch.tensor([[2.0, 4.0]]), -1)
    torch.testing.assert_close(constrained_softmax(logits, [1, 3]), expected)


# --- the full allowed range of every numeric option (issue 17) ----------------

MASK = float("-inf")
# Finite float32 magnitudes up to 1e30, -inf masks, and ordinary logits.
logit_value = st.one_of(
    st.floats(-50, 50),
    st.floats(-1e30, 1e30),
    st.sampled_from([MASK, MASK, 0.0, 1e30, -1e30, 88.0, -104.0]),
)
# The whole of (0, inf) in float64, the smallest and largest included explicitly.
temperature = st.one_of(
    st.floats(min_value=0.0, exclude_min=True, allow_infinity=False, allow_nan=False),
    st.sampled_from([5e-324, 1e-45, 1e-30, 1e-6, 1.0, 1e6, 1e300, 1.7976931348623157e308]),
)
DTYPES = {
    "float32": (torch.float32, 3.4e38),
    "float64": (torch.float64, 1.7e308),
    "float16": (torch.float16, 65504.0),
    "bfloat16": (torch.bfloat16, 3.38e38),
}


@st.composite
def full_range_case(draw):
    vocab = draw(st.integers(2, 48))
    rows = draw(st.integers(1, 3))
    values = draw(
        st.lists(
            st.lists(logit_value, min_size=vocab, max_size=vocab), min_size=rows, max_size=rows
        )
    )
    dtype_name = draw(st.sampled_from(sorted(DTYPES)))
    n_labels = draw(st.integers(2, min(5, vocab)))
    label_ids = draw(st.permutations(range(vocab)))[:n_labels]
    cfg = draw(configs(score_temperature=temperature))
    emb_dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    return values, dtype_name, label_ids, cfg, draw(st.integers(0, 2**16)), emb_dtype


def _as_logits(values: list[list[float]], dtype_name: str) -> Tensor:
    dtype, biggest = DTYPES[dtype_name]
    x = torch.tensor(values, dtype=torch.float64)
    # Finite values stay finite in the narrow dtypes (+inf is a ValueError by design);
    # each row keeps at least one unmasked token (an all -inf row is a ValueError too).
    x = torch.where(torch.isfinite(x), x.clamp(-biggest, biggest), x)
    x[:, 0] = torch.where(torch.isfinite(x[:, 0]), x[:, 0], torch.zeros_like(x[:, 0]))
    return x.to(dtype)


@settings(max_examples=300, deadline=None)
@given(full_range_case())
def test_outputs_are_distributions_over_the_whole_option_range(case):
    values, dtype_name, label_ids, cfg, seed, emb_dtype = case
    logits = _as_logits(values, dtype_name)
    emb = torch.randn(logits.shape[-1], 6, generator=torch.Generator().manual_seed(seed))
    result = semantic_softmax_details(logits, emb.to(emb_dtype), label_ids, cfg)
    for p in (result.semantic, result.constrained):
        assert p.dtype == torch.float32
        assert torch.isfinite(p).all(), (p, cfg)
        assert bool(((p >= 0) & (p <= 1)).all()), p
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[0]), atol=1e-5, rtol=0)
    for stat in (result.coverage, result.top_k_mass):
        assert torch.isfinite(stat).all() and bool(((stat >= 0) & (stat <= 1 + 1e-6)).all())


def _tied_case() -> tuple[Tensor, Tensor, list[int]]:
    """Two labels with exactly equal P_sem (mirror-image embeddings and logits), a third
    with less."""
    emb = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.7, 0.7, 0.1]])
    logits = torch.tensor([2.0, 2.0, 0.5, 1.0])
    return logits, emb, [0, 1, 2]


@pytest.mark.parametrize("t", [5e-324, 1e-45, 1e-30, 1e-8])
def test_tiny_temperature_is_a_hard_argmax_with_ties_split(t):
    logits, emb, ids = _tied_case()
    p = semantic_softmax(logits, emb, ids, score_temperature=t)
    torch.testing.assert_close(p, torch.tensor([0.5, 0.5, 0.0]))
    one = semantic_softmax(torch.tensor([3.0, 1.0, 0.5, 0.0]), emb, ids, score_temperature=t)
    torch.testing.assert_close(one, torch.tensor([1.0, 0.0, 0.0]))


@pytest.mark.parametrize("t", [1e30, 1e300, 1.7976931348623157e308])
def test_huge_temperature_is_uniform(t):
    logits, emb, ids = _tied_case()
    p = semantic_softmax(logits, emb, ids, score_temperature=t)
    torch.testing.assert_close(p, torch.full((3,), 1 / 3))


def test_temperature_one_is_untouched_and_others_keep_the_order():
    logits, emb, ids = _tied_case()
    base = semantic_softmax(logits, emb, ids)
    for t in (0.5, 2.0):
        p = semantic_softmax(logits, emb, ids, score_temperature=t)
        want = torch.softmax(base.double().log() / t, -1).float()
        torch.testing.assert_close(p, want)


@pytest.mark.parametrize("gap", [90.0, 100.0])
def test_subnormal_vote_mass_still_sums_to_one(gap):
    # The top token votes for no label; the only vote comes from a token of
    # probability e^-gap (~1e-40 to 1e-44, float32 subnormals).
    emb = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.9, 0.1, 0.0]])
    logits = torch.tensor([0.0, -gap, -1e30, -1e30])
    result = semantic_softmax_details(logits, emb, [1, 2], k=2, tau=0.5, **PAPER)
    assert not bool(result.fallback)
    torch.testing.assert_close(result.semantic, torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize("k", [1, MAX_K])
@pytest.mark.parametrize("tau", [-1.0, math.nextafter(1.0, 0.0)])
@pytest.mark.parametrize("t", [5e-324, 1e-45, 1e300, 1.7976931348623157e308])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_every_option_at_its_bounds(k, tau, t, dtype_name):
    """The corners of the allowed range, which random draws may miss."""
    values = [[1e30, -1e30, MASK, 3.0, 0.0, -2.0, MASK, 1.0]] * 2
    logits = _as_logits(values, dtype_name)
    emb = torch.randn(8, 5, generator=torch.Generator().manual_seed(1))
    for own_vote, vote in itertools.product((False, True), VOTES):
        cfg = SemsoftConfig(
            k=k, tau=tau, score_temperature=t, own_vote=own_vote, vote=vote, semantic_weight=1.0
        )
        p = semantic_softmax(logits, emb, [3, 5, 7], cfg)
        assert torch.isfinite(p).all() and bool(((p >= 0) & (p <= 1)).all())
        torch.testing.assert_close(p.sum(-1), torch.ones(2), atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------
# The sparse entry point (ids + log-probs of the top-k) on a real model's logits
# ---------------------------------------------------------------------------


def _real_logits(model_and_tokenizer, texts):
    """Next-token logits [B, V] of a real model (SmolLM2-135M) for ``texts``."""
    from semsoft_plugin.engines.prompting import encode_prompts, format_prompt

    model, tokenizer = model_and_tokenizer
    rows = []
    for ids in encode_prompts(tokenizer, [format_prompt(tokenizer, t) for t in texts]):
        with torch.no_grad():
            rows.append(model(torch.tensor([ids])).logits[0, -1].float())
    return torch.stack(rows)


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {},
        PAPER,
        {"semantic_weight": 1.0},
        {"vote": "nearest", "semantic_weight": 0.5},
        {"vote": "shared", "tau_quantile": 0.9, "semantic_weight": 1.0},
        {"k": 5, "score_temperature": 0.5},
    ],
    ids=["default", "paper", "residual", "nearest", "tau_quantile", "small_k"],
)
def test_sparse_top_k_equals_dense_on_real_logits(model_and_tokenizer, options):
    from semsoft_plugin import LabelSet
    from semsoft_plugin.core.embeddings import from_model

    model, tokenizer = model_and_tokenizer
    texts = [
        "Review: 'a wonderful, moving film'. Sentiment (positive, negative or neutral):",
        "Review: 'dull and far too long'. Sentiment (positive, negative or neutral):",
        "The capital of France is",
    ]
    logits = _real_logits(model_and_tokenizer, texts)
    labels = LabelSet(["positive", "negative", "neutral"], tokenizer)
    scorer = SemanticSoftmax(from_model(model), labels, SemsoftConfig(**options))
    dense = scorer(logits)
    log_p = torch.log_softmax(logits, -1)
    top_lp, top_ids = torch.topk(log_p, scorer.config.k, dim=-1)
    # The top-k plus every answer token's log-prob (what the readers pass: the pool
    # with the constrained softmax reads them), with any common offset per row (an
    # engine returns log-probs, not logits): ratios only.
    answers = torch.tensor(labels.answer_token_ids)
    for row in range(len(texts)):
        extra = answers[~torch.isin(answers, top_ids[row])]
        ids = torch.cat([top_ids[row], extra])
        sparse = scorer.score_top_k(ids, log_p[row, ids] + 3.0)
        torch.testing.assert_close(sparse.semantic, dense.semantic[row], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(sparse.coverage, dense.coverage[row], rtol=1e-5, atol=1e-6)
        assert bool(sparse.fallback) == bool(dense.fallback[row])
        assert torch.isfinite(sparse.semantic).all()
    # A batch [B, K] gives what each row [K] gives.
    batch = scorer.score_top_k(top_ids, top_lp)
    for row in range(len(texts)):
        one = scorer.score_top_k(top_ids[row], top_lp[row])
        torch.testing.assert_close(one.semantic, batch.semantic[row], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "ids, values, match",
    [
        ([[1, 2]], [[0.0]], "same non-empty shape"),
        ([[]], [[]], "same non-empty shape"),
        ([1.0, 2.0], [0.0, -1.0], "integer token ids"),
        ([1, 64], [0.0, -1.0], "token id 64 outside the vocabulary"),
        ([-1, 2], [0.0, -1.0], "token id -1"),
        ([3, 3], [0.0, -1.0], "repeats a token id"),
        ([1, 2], [float("nan"), -1.0], "NaN"),
    ],
)
def test_sparse_top_k_bad_input_raises_naming_it(ids, values, match):
    logits, emb, label_ids = random_case(0)
    scorer = SemanticSoftmax(emb, label_ids)
    with pytest.raises(ValueError, match=match):
        scorer.score_top_k(torch.tensor(ids), torch.tensor(values))
