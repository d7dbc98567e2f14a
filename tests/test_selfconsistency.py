"""Self-consistency and verbal confidence: label matching, votes, and the eval methods on SmolLM2."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from semsoft_eval.selfconsistency import (
    VERBAL_INSTRUCTION,
    consistency,
    generate,
    match_label,
    self_consistency,
    self_consistency_probs,
    verbal_probs,
    verbal_prompt,
    verbal_readings,
)

EMOTIONS = ["joy", "sadness", "anger", "disappointment", "disapproval"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (" joy", 0),
        (" Joy.", 0),
        (" sadness\nConfidence: 80%", 1),
        ("The emotion is anger.", 2),
        ("anger and joy", 2),  # the label named first
        (" disappoint", 3),  # unique prefix
        (" joyful", 0),  # the label is a prefix of the word
        (" disap", None),  # prefix of two labels: ambiguous
        (" surprise", None),
        ("", None),
        (" it", None),  # under 3 characters: no prefix reading
        ("Confidence: 90%", None),  # no answer line at all
    ],
)
def test_match_label(text: str, expected: int | None) -> None:
    assert match_label(text, EMOTIONS) == expected


def test_consistency_modal_agreement_and_n_correct() -> None:
    answers = ["Paris", "paris.", "Lyon", "", "The Paris", "Marseille"]
    c = consistency(answers, ["Paris"], match="exact")
    assert c.modal == "Paris" and c.agreement == pytest.approx(3 / 6)
    assert (c.n, c.n_valid, c.n_correct, c.modal_correct) == (6, 5, 3, True)
    empty = consistency(["", "  "])
    assert (empty.modal, empty.agreement, empty.n_correct) == ("", 0.0, None)
    tie = consistency(["Lyon", "Paris", "Paris", "Lyon"])
    assert tie.modal == "Lyon"  # ties go to the first sampled


def test_verbal_prompt_appends_the_request_to_the_user_message() -> None:
    messages = [
        {"role": "user", "content": "Which emotion?"},
        {"role": "assistant", "content": "Emotion:"},
    ]
    wrapped = verbal_prompt(messages)
    assert wrapped[0]["content"].endswith(VERBAL_INSTRUCTION)
    assert wrapped[1] == {"role": "assistant", "content": "Emotion:"}
    assert messages[0]["content"] == "Which emotion?"  # not modified in place
    assert verbal_prompt("plain text\nEmotion:") == "plain text\nEmotion:"


def _prompts(tokenizer) -> list:
    from semsoft_eval.prompts import TEMPLATES
    from semsoft_plugin.engines.prompting import build_inputs

    texts = ["A gorgeous, witty, seductive movie.", "The plot is a mess and the acting is worse."]
    return build_inputs(TEMPLATES["sentiment"], texts, ["negative", "positive"], tokenizer)


@pytest.mark.slow
def test_self_consistency_probs_on_the_default_model(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    prompts = _prompts(tokenizer)
    before = torch.random.get_rng_state()
    result = self_consistency(model, tokenizer, prompts, ["negative", "positive"], n=4, seed=3)
    assert torch.equal(before, torch.random.get_rng_state())  # the global RNG is untouched
    assert result.probs.shape == (2, 2)
    np.testing.assert_allclose(result.probs.sum(1), 1.0)
    for row, samples in zip(result.probs, result.samples, strict=True):
        votes = [match_label(s, ["negative", "positive"]) for s in samples]
        readable = [v for v in votes if v is not None]
        if readable:
            assert row[1] == pytest.approx(readable.count(1) / len(readable))
    assert result.n_unparsed == sum(
        match_label(s, ["negative", "positive"]) is None for row in result.samples for s in row
    )
    again = self_consistency_probs(model, tokenizer, prompts, ["negative", "positive"], n=4, seed=3)
    np.testing.assert_array_equal(again, result.probs)  # same seed, same samples


@pytest.mark.slow
def test_verbal_probs_on_the_default_model(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    prompts = _prompts(tokenizer)
    probs, unparsed = verbal_probs(model, tokenizer, prompts, ["negative", "positive"])
    assert probs.shape == (2, 2) and np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(1), 1.0)
    assert 0 <= unparsed <= 2
    readings = verbal_readings(
        model, tokenizer, [verbal_prompt(p) for p in prompts], max_tokens=16, keep_entropy=True
    )
    for row, reading in zip(probs, readings, strict=True):
        assert reading.answer_entropy is not None and reading.answer_entropy >= 0
        label = match_label(reading.answer, ["negative", "positive"])
        if label is not None and reading.confidence is not None:
            assert row[label] == pytest.approx(reading.confidence)


@pytest.mark.slow
def test_generate_rejects_identical_greedy_samples(model_and_tokenizer) -> None:
    model, tokenizer = model_and_tokenizer
    with pytest.raises(ValueError, match="identical"):
        generate(model, tokenizer, ["hi"], n=3, temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, tokenizer, ["hi"], temperature=-1.0)


@pytest.mark.slow
@pytest.mark.vllm
def test_self_consistency_through_vllm(default_checkpoint, model_and_tokenizer) -> None:
    pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    _, tokenizer = model_and_tokenizer
    # A small token budget splits the prompts into chunks: seeded sampling must survive
    # the discarded partial-prefill samples (vLLM's CPU runner crashed on them).
    llm = LLM(
        model=str(default_checkpoint),
        enforce_eager=True,
        max_model_len=512,
        max_num_batched_tokens=32,
        seed=0,
    )
    prompts = _prompts(tokenizer)
    probs = self_consistency_probs(llm, None, prompts, ["negative", "positive"], n=5)
    assert probs.shape == (2, 2)
    np.testing.assert_allclose(probs.sum(1), 1.0)
    out = generate(llm, None, prompts, n=5, temperature=0.7, max_tokens=4)
    assert [len(t) for t in out.texts] == [5, 5]
