"""The do-no-harm options of the core (vote="residual", tau_quantile) and batch calibration,
each pinned by a small hand-computed case and its invariants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from semsoft_plugin import SemanticSoftmax, SemsoftConfig, constrained_softmax
from semsoft_plugin.core.calibration import batch_calibrate

# Four tokens in 4-D: two labels (a, b), a synonym of a, and a filler unrelated to both.
A, B, SYN, FILLER = 0, 1, 2, 3
EMB = torch.tensor(
    [
        [1.0, 0.0, 0.0, 0.0],  # a
        [0.0, 1.0, 0.0, 0.0],  # b
        [0.8, 0.0, 0.6, 0.0],  # synonym of a: cos 0.8 to a, 0 to b
        [0.0, 0.0, 0.0, 1.0],  # filler: cos 0 to both
    ]
)


def _logits(p: list[float]) -> torch.Tensor:
    return torch.tensor(p, dtype=torch.float64).log().float()


def test_residual_hand_computed():
    p = [0.30, 0.10, 0.20, 0.40]  # a, b, synonym, filler
    tau = 0.2
    result = SemanticSoftmax(
        EMB, [A, B], k=4, tau=tau, center=False, semantic_weight=1.0
    )(_logits(p))
    closeness_syn = (0.8 - tau) / (1 - tau)  # 0.75: the synonym votes with 3/4 of its mass
    claimed = p[A] + p[B] + closeness_syn * p[SYN]
    constrained = np.array([p[A], p[B]]) / (p[A] + p[B])
    expected = np.array([p[A] + closeness_syn * p[SYN], p[B]]) + (1 - claimed) * constrained
    np.testing.assert_allclose(result.probs.numpy(), expected, atol=1e-6)
    assert not bool(result.fallback)


def test_residual_without_neighbours_is_exactly_constrained():
    # Only the label tokens and the filler hold mass: nothing for the silent vote to add.
    logits = _logits([0.05, 0.15, 1e-9, 0.80])
    for tau in (0.0, 0.3, 0.9):
        result = SemanticSoftmax(
            EMB, [A, B], k=4, tau=tau, center=False, semantic_weight=1.0
        )(logits)
        torch.testing.assert_close(
            result.probs, constrained_softmax(logits, [A, B]), atol=1e-6, rtol=0
        )


def test_residual_when_no_token_votes_falls_back_to_constrained():
    # k=1 keeps only the filler: no vote at all, flagged, the constrained softmax returned.
    logits = _logits([0.05, 0.15, 0.0001, 0.7999])
    result = SemanticSoftmax(EMB, [A, B], k=1, tau=0.1, center=False, semantic_weight=1.0)(logits)
    assert bool(result.fallback)
    torch.testing.assert_close(result.probs, constrained_softmax(logits, [A, B]))


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_tau_quantile_is_the_quantile_of_vocabulary_cosines(q):
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(300, 16, generator=g)
    scorer = SemanticSoftmax(emb, [3, 7, 11], tau_quantile=q, center=True, semantic_weight=1.0)
    # Fewer rows than the sample size: the sample is the whole vocabulary.
    rows = emb - emb.double().mean(0).float()
    rows = torch.nn.functional.normalize(rows, dim=-1)
    cos = (rows @ rows[[3, 7, 11]].T).double().numpy()
    np.testing.assert_allclose(scorer.thresholds.numpy(), np.quantile(cos, q, axis=0), atol=1e-5)


def test_tau_quantile_is_the_same_on_every_construction():
    emb = torch.randn(20000, 8, generator=torch.Generator().manual_seed(1))
    first = SemanticSoftmax(emb, [1, 2], tau_quantile=0.99, semantic_weight=1.0).thresholds
    second = SemanticSoftmax(emb.clone(), [1, 2], tau_quantile=0.99, semantic_weight=1).thresholds
    torch.testing.assert_close(first, second, rtol=0, atol=0)


@pytest.mark.parametrize("q", [0.0, 1.0, 1.5, True, "0.9"])
def test_bad_tau_quantile_raises_naming_the_value(q):
    with pytest.raises(ValueError, match="tau_quantile"):
        SemsoftConfig(tau_quantile=q)


def test_paper_config_turns_the_new_options_off():
    paper = SemsoftConfig.preset("paper")
    assert paper.vote == "per_label" and paper.tau_quantile is None


# --- batch calibration (Zhou et al., 2024) ---------------------------------------


def test_batch_calibration_hand_computed():
    probs = np.array([[0.9, 0.1], [0.6, 0.4]])
    mean = probs.mean(0)  # [0.75, 0.25]
    scaled = probs / mean
    np.testing.assert_allclose(
        batch_calibrate(probs), scaled / scaled.sum(1, keepdims=True), atol=1e-12
    )


def test_batch_with_uniform_mean_is_unchanged():
    probs = np.array([[0.8, 0.2], [0.2, 0.8], [0.5, 0.5]])
    np.testing.assert_allclose(batch_calibrate(probs), probs, atol=1e-12)


def test_batch_calibration_is_permutation_equivariant():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(5), size=40)
    order = rng.permutation(40)
    np.testing.assert_allclose(
        batch_calibrate(probs)[order], batch_calibrate(probs[order]), atol=1e-12
    )


def test_batch_calibration_with_a_given_bias_and_bad_input():
    probs = np.array([[0.9, 0.1]])
    np.testing.assert_allclose(batch_calibrate(probs, bias=np.array([0.5, 0.5])), probs, atol=1e-12)
    with pytest.raises(ValueError, match="NaN"):
        batch_calibrate(np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match="shape"):
        batch_calibrate(np.ones(3))
    with pytest.raises(ValueError, match="bias"):
        batch_calibrate(probs, bias=np.array([1.0, 0.0, 0.0]))


# --- with the real default model ---------------------------------------------------


def test_semantic_weight_pools_with_the_constrained_hand_computed():
    # P ∝ P_con^(1-a) P_sem^a, the residual semantic of the hand case above.
    p = [0.30, 0.10, 0.20, 0.40]
    tau, a = 0.2, 0.5
    semantic = (
        SemanticSoftmax(
            EMB, [A, B], k=4, tau=tau, center=False, semantic_weight=1.0
        )(_logits(p))
        .probs.double()
        .numpy()
    )
    constrained = np.array([p[A], p[B]]) / (p[A] + p[B])
    pooled = constrained ** (1 - a) * semantic**a
    pooled /= pooled.sum()
    got = SemanticSoftmax(
        EMB, [A, B], k=4, tau=tau, center=False, semantic_weight=a
    )(_logits(p))
    np.testing.assert_allclose(got.probs.numpy(), pooled, atol=1e-6)
    assert pooled[0] < semantic[0]  # halfway (in log space) back to the constrained 0.75
    assert pooled[0] > constrained[0]


@pytest.mark.parametrize("vote", ["residual", "shared"])
def test_semantic_weight_limits(vote):
    g = torch.Generator().manual_seed(5)
    emb = torch.randn(30, 6, generator=g)
    logits = torch.randn(4, 30, generator=g) * 2
    ids = [int(i) for i in logits[0].argsort()[-3:]]  # kept in row 0 at least
    alone = SemanticSoftmax(emb, ids, k=30, vote=vote, semantic_weight=1.0)(logits)
    none = SemanticSoftmax(emb, ids, k=30, semantic_weight=0.0)(logits)  # votes: no effect
    # Weight 0 is exactly the constrained softmax.
    torch.testing.assert_close(none.probs, constrained_softmax(logits, ids), atol=1e-6, rtol=0)
    torch.testing.assert_close(
        alone.probs, alone.probs / alone.probs.sum(-1, keepdim=True)
    )
    mid = SemanticSoftmax(emb, ids, k=30, vote=vote, semantic_weight=0.5)(logits).probs
    # Log-linear: the log-ratio of two labels moves by exactly half.
    ratio = lambda q: (q[:, 0] / q[:, 1]).double().log()  # noqa: E731
    torch.testing.assert_close(
        ratio(mid), 0.5 * ratio(alone.probs) + 0.5 * ratio(none.probs), atol=1e-4, rtol=0
    )


def test_pool_reads_answer_log_probs_and_bounds_the_missing_ones():
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(40, 8, generator=g)
    logits = torch.randn(40, generator=g) * 2
    order = logits.argsort()
    labels = [int(order[-1]), int(order[5])]  # one kept, one far outside the top 10
    scorer = SemanticSoftmax(emb, labels, k=10, semantic_weight=0.5)
    alone = SemanticSoftmax(emb, labels, k=10, semantic_weight=1.0)
    log_p = torch.log_softmax(logits.double(), -1)
    sem = alone(logits).probs.double().clamp_min(1e-30)

    def pool(con: torch.Tensor) -> torch.Tensor:
        want = con.sqrt() * sem.sqrt()
        return want / want.sum()

    # Full logits: the exact constrained softmax.
    exact = torch.softmax(log_p[labels], -1)
    torch.testing.assert_close(scorer(logits).probs.double(), pool(exact), atol=1e-6, rtol=0)
    top = torch.topk(log_p.float(), 10)
    sparse = torch.full_like(logits, float("-inf")).scatter(0, top.indices, top.values)
    # Only the top-K: the missing answer token counts with the smallest kept probability.
    bounded = torch.softmax(torch.stack([log_p[labels[0]], log_p[order[-10]]]), -1)
    torch.testing.assert_close(scorer(sparse).probs.double(), pool(bounded), atol=1e-6, rtol=0)
    # The top-K plus the answer tokens' log-probs (what classify_vllm fetches): exact again.
    sparse[labels[1]] = log_p[labels[1]].float()
    torch.testing.assert_close(scorer(sparse).probs, scorer(logits).probs, atol=1e-6, rtol=0)


def test_pool_keeps_the_constrained_where_the_votes_say_nothing():
    # Label c: answer token outside the top-K, no kept token near it -> semantic 0. The
    # pool gives it its constrained share instead of 0 (an infinite NLL if c is right).
    emb = torch.eye(5)
    p = [0.5, 0.3, 0.15, 0.04, 0.01]  # a, b, two fillers, c
    scorer = SemanticSoftmax(emb, [0, 1, 4], k=4, tau=0.2, center=False, semantic_weight=1.0)
    alone = scorer(_logits(p)).probs.double()
    assert float(alone[2]) == 0.0
    pooled = SemanticSoftmax(emb, [0, 1, 4], k=4, tau=0.2, center=False, semantic_weight=0.5)
    got = pooled(_logits(p)).probs.double()
    con = torch.tensor([p[0], p[1], p[4]], dtype=torch.float64)
    con /= con.sum()
    sem = torch.where(alone > 0, alone, con)
    want = (con * sem).sqrt()
    torch.testing.assert_close(got, want / want.sum(), atol=1e-6, rtol=0)
    assert float(got[2]) > 0.01


def test_semantic_weight_is_checked():
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="semantic_weight"):
            SemsoftConfig(semantic_weight=bad)
    assert SemsoftConfig.preset("paper").semantic_weight == 1.0
    assert SemsoftConfig.preset("shared").semantic_weight == 1.0


@pytest.mark.slow
def test_fragment_spellings_are_not_own_tokens(model_and_tokenizer):
    from semsoft_plugin.core.labels import LabelSet

    _, tokenizer = model_and_tokenizer
    labels = LabelSet(["negative", "positive"], tokenizer, auto_variants=True)
    upper = tokenizer.encode(" NEGATIVE", add_special_tokens=False)
    assert len(upper) > 1  # a fragment first token (" N") on this tokenizer
    assert upper[0] not in labels.labels[0].own_token_ids
    capital = tokenizer.encode(" Negative", add_special_tokens=False)
    assert len(capital) == 1 and capital[0] in labels.labels[0].own_token_ids
    # A variant the user names is taken whatever its length.
    given = LabelSet(["negative", "positive"], tokenizer, variants={"negative": ["NEGATIVE"]})
    assert upper[0] in given.labels[0].own_token_ids


@pytest.mark.slow
def test_contextual_classifier_divides_out_the_content_free_bias(model_and_tokenizer):
    from semsoft_plugin import Classifier
    from semsoft_plugin.core.calibration import CONTENT_FREE, debias

    model, tokenizer = model_and_tokenizer
    texts = ["A wonderful, moving film.", "Dull and far too long.", "It was fine."]
    plain = Classifier(model, tokenizer, ["positive", "negative"])
    calibrated = Classifier(model, tokenizer, ["positive", "negative"], calibrate="contextual")
    base = plain.predict_details(texts)
    # The bias is the plain classifier's mean over the content-free inputs, by hand.
    from semsoft_plugin.engines.hf import classify
    from semsoft_plugin.engines.prompting import build_inputs

    scorer = plain._scorer()
    inputs = build_inputs(scorer.prompt, list(CONTENT_FREE), ["positive", "negative"], tokenizer)
    cf = [r.probs for r in classify(model, tokenizer, inputs, scorer.labels, mode="observe", max_tokens=1)]
    bias = np.array([[d[c] for c in plain.classes_] for d in cf]).mean(0)
    np.testing.assert_allclose(calibrated.content_free_bias(), bias, atol=1e-6)
    got = calibrated.predict_details(texts)
    np.testing.assert_allclose(got.probs, debias(base.probs, bias), atol=1e-6)
    np.testing.assert_allclose(got.probs.sum(1), 1.0, atol=1e-12)
    np.testing.assert_allclose(got.constrained_probs, base.constrained_probs)  # the baseline is reported as is
    assert got.label == [calibrated.classes_[i] for i in got.probs.argmax(1)]
    with pytest.raises(ValueError, match="calibrate='mean'"):
        Classifier(model, tokenizer, ["positive", "negative"], calibrate="mean").predict(["x"])
    # No per-call batch calibration (a row's score would depend on its batch): the
    # file mode (tests/test_file_mode.py) estimates the bias once, in fit(texts).
    with pytest.raises(ValueError, match="calibrate='batch' must be one of"):
        Classifier(model, tokenizer, ["positive", "negative"], calibrate="batch").predict(["x"])


def test_residual_needs_only_the_top_k():
    # A reader that sees only the top-K log-probs (vLLM, an OpenAI server) scores exactly
    # what the full logits give, even with a label token outside the top-K.
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(40, 8, generator=g)
    logits = torch.randn(40, generator=g) * 2
    labels = [int(logits.argsort()[-1]), int(logits.argsort()[5])]  # one kept, one far out
    scorer = SemanticSoftmax(emb, labels, k=10, semantic_weight=1.0)
    top = torch.topk(torch.log_softmax(logits, -1), 10)
    sparse = torch.full_like(logits, float("-inf")).scatter(0, top.indices, top.values)
    torch.testing.assert_close(scorer(logits).probs, scorer(sparse).probs)


def test_vllm_request_carries_the_new_options():
    pytest.importorskip("vllm")
    from semsoft_plugin.core import request as sreq
    from semsoft_plugin.engines import vllm as sv

    params = sv.sampling_params(["a", "b"], vote="shared", tau_quantile=0.9, semantic_weight=0.3)
    assert params.extra_args["semsoft_semantic_weight"] == 0.3
    assert params.extra_args["semsoft_vote"] == "shared"
    assert params.extra_args["semsoft_tau_quantile"] == 0.9
    request = sreq.parse_request(params.extra_args)
    assert request.config.vote == "shared" and request.config.tau_quantile == 0.9
    default = sreq.parse_request(sv.sampling_params(["a", "b"]).extra_args)
    assert default.config == SemsoftConfig()
