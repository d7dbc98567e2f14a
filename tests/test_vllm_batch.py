"""``classify_vllm`` and the eval's vLLM backend on an offline engine: both give the
transformers adapter's (and backend's) probabilities, fetch what lies outside the top-k
with a follow-up request, and keep the log-probabilities the eval asks for.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _vllm import ATOL, EMOTIONS, PROMPTS, SENTIMENT

vllm = pytest.importorskip("vllm")

from semsoft_plugin.core.labels import LabelSet  # noqa: E402
from semsoft_plugin.engines import vllm as sv  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_classify_vllm_matches_transformers(llm, hf_results):
    prompts = [PROMPTS["review"], PROMPTS["short"]]
    results = sv.classify_vllm(llm, prompts, SENTIMENT)
    for result, name in zip(results, ("review", "short"), strict=True):
        want = hf_results[name]
        assert result.label == result.text.strip()
        assert set(vars(result)) >= {"label", "probs", "constrained_probs", "fallback", "coverage"}
        for label in SENTIMENT:
            assert result.probs[label] == pytest.approx(want.probs[label], abs=ATOL)
            assert result.constrained_probs[label] == pytest.approx(
                want.constrained_probs[label], abs=ATOL
            )


def test_classify_vllm_fetches_missing_constrained_probs(llm, hf_model):
    # Rare words as labels: their tokens are far outside the top-k, so the constrained
    # softmax needs the one-token follow-up request.
    from semsoft_plugin.engines import hf

    labels = ["zebra", "quartz"]
    prompt = [PROMPTS["review"]]
    got = sv.classify_vllm(llm, prompt, labels, mode="observe")[0]
    model, tok = hf_model
    want = hf.classify(model, tok, prompt, labels, mode="observe")[0]
    for label in labels:
        assert got.constrained_probs[label] == pytest.approx(
            want.constrained_probs[label], abs=ATOL
        )
        assert got.probs[label] == pytest.approx(want.probs[label], abs=ATOL)


def test_classify_vllm_names_max_logprobs_when_too_low(llm):
    with pytest.raises(ValueError, match="max_logprobs"):
        sv.classify_vllm(llm, ["x"], SENTIMENT, k=100)


def test_classify_vllm_keeps_top_and_named_token_logprobs(llm, hf_model):
    """What the eval keeps: the top log-probabilities and exact values for named
    tokens, including tokens far outside the top-k (read by the follow-up request)."""
    from semsoft_plugin.engines import hf

    model, tok = hf_model
    prompt = [PROMPTS["dog"]]
    rare = [tok.encode(" zebra")[0], tok.encode(" quartz")[0]]
    got = sv.classify_vllm(llm, prompt, EMOTIONS, keep_logprobs=40, token_ids=rare, max_tokens=1)[0]
    logits = hf.classify(model, tok, prompt, EMOTIONS, keep_logits=True, max_new_tokens=1)[0].logits
    want = torch.log_softmax(logits.float(), -1)
    top = torch.topk(want, 40)
    assert len(got.top_logprobs) == 40
    assert set(got.top_logprobs) == set(top.indices.tolist())
    for token, value in got.top_logprobs.items():
        assert value == pytest.approx(float(want[token]), abs=ATOL)
    assert not set(rare) & set(got.top_logprobs)
    for token in rare:
        assert got.token_logprobs[token] == pytest.approx(float(want[token]), abs=ATOL)
    with pytest.raises(ValueError, match="keep_logprobs=100"):
        sv.classify_vllm(llm, prompt, EMOTIONS, keep_logprobs=100)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sv.classify_vllm(llm, prompt, EMOTIONS, token_ids=[10**9])


def test_eval_backend_vllm_equals_the_transformers_backend(llm, tokenizer, hf_model, tmp_path):
    """`semsoft eval --backend vllm`: the kept passes give every method the same
    probabilities as the transformers backend, on GoEmotions' 28 labels (multi-token
    ones included) with chunked prefill."""
    from semsoft_eval.data import load_builtin, sample
    from semsoft_eval.evaluate import evaluate
    from semsoft_eval.methods import DEFAULT_METHODS, semantic_probs
    from semsoft_eval.methods import constrained_probs as _constrained
    from semsoft_eval.preparation import prepare
    from semsoft_plugin.core.config import SemsoftConfig

    data = sample(load_builtin("goemotions"), 6, 0)
    common = dict(sequence=True, progress=False)
    vllm_run = prepare(
        "smollm2-135m", data, backend="vllm", loaded=(llm, tokenizer), cache_dir=tmp_path, **common
    )
    hf_run = prepare("smollm2-135m", data, loaded=hf_model, cache_dir="", **common)
    assert vllm_run.labels.multi_token_labels
    assert vllm_run.forward.store_k == 50  # the engine's max_logprobs
    for config in (SemsoftConfig(), SemsoftConfig.preset("paper").replace(k=20, tau=0.1)):
        got = semantic_probs(vllm_run.forward, vllm_run.embeddings, vllm_run.labels, config)
        want = semantic_probs(hf_run.forward, hf_run.embeddings, hf_run.labels, config)
        np.testing.assert_allclose(got.probs, want.probs, atol=ATOL)
    for content_free in (False, True):
        np.testing.assert_allclose(
            _constrained(vllm_run.forward, vllm_run.labels, content_free=content_free),
            _constrained(hf_run.forward, hf_run.labels, content_free=content_free),
            atol=ATOL,
        )
    np.testing.assert_allclose(
        torch.softmax(vllm_run.forward.sequence_logprob.double(), -1),
        torch.softmax(hf_run.forward.sequence_logprob.double(), -1),
        atol=ATOL,
    )
    # The adapter's own scores equal the rescoring from the kept values.
    np.testing.assert_allclose(
        vllm_run.forward.semantic_check.numpy(),
        semantic_probs(
            vllm_run.forward, vllm_run.embeddings, vllm_run.labels, SemsoftConfig()
        ).probs,
        atol=1e-5,
    )
    # The whole report, from the vLLM cache written above.
    assert vllm_run.cache_file is not None and vllm_run.cache_file.is_file()
    report = evaluate(
        "smollm2-135m",
        data,
        backend="vllm",
        loaded=(llm, tokenizer),
        cache_dir=tmp_path,
        n_folds=2,
        n_bootstrap=20,
        progress=False,
    )
    assert report["run"]["backend"] == "vllm"
    assert report["run"]["cache_file"] == str(vllm_run.cache_file)
    assert report["run"]["cache_check_max_abs_diff"] < 1e-5
    assert set(report["methods"]) == set(DEFAULT_METHODS)
    json.dumps(report, allow_nan=False)


def test_backend_protocol_gives_the_same_decision_step_on_both_engines(llm, hf_model):
    """The eval's seam: both Backend implementations give the same top-k (ids, in
    order, for the top few; values as log-probabilities within 1e-3) and the same
    label-token values, on one real model in float32."""
    from semsoft_eval.backend_factory import as_backend
    from semsoft_eval.backends import Backend

    model, tok = hf_model
    engines = [as_backend(llm), as_backend(model, tok)]
    assert [e.name for e in engines] == ["vllm", "transformers"]
    assert all(isinstance(e, Backend) for e in engines)
    labels = LabelSet(EMOTIONS, tok)
    token_ids = list(labels.answer_token_ids)
    prompts = [PROMPTS["dog"], PROMPTS["review"]]
    got, want = (
        e.decision_step(prompts, labels, token_ids, store_k=20, progress=False) for e in engines
    )
    np.testing.assert_array_equal(got.top_ids[:, :5], want.top_ids[:, :5])
    # transformers keeps raw logits, vLLM log-probabilities: one constant per row apart
    shift = want.top_values[:, :1] - got.top_values[:, :1]
    np.testing.assert_allclose(got.top_values[:, :5] + shift, want.top_values[:, :5], atol=1e-3)
    np.testing.assert_allclose(got.label_values + shift, want.label_values, atol=1e-3)
    assert got.vocab_size == want.vocab_size
