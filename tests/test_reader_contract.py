"""The reader contract (issue 26, item 1): exact scores or a named refusal.

A server's response is rebuilt from the real model's decision-step logits (SmolLM2-135M
through transformers), in the shape a vLLM completions response has with ``logprobs: 50``
and ``return_tokens_as_token_ids``: the top-50 plus the sampled token, which an engine
that constrains to a label puts in with its true (low) raw log-prob. The issue's case:
labels ``superb,dreadful``: both answer tokens are far outside the top-50 (ranks ~4,000
and ~19,000), the engine emits " superb" (transformers: superb .906), and the old reader
counted " dreadful" at the smallest kept probability, an upper bound, giving superb .109.
"""

from __future__ import annotations

import pytest
import torch

from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.engines import hf
from semsoft_plugin.engines.openai import openai_label_probs, openai_label_scores, openai_request

pytestmark = pytest.mark.slow

PROMPT = "I loved this film, the acting was wonderful."
LABELS = ["superb", "dreadful"]


@pytest.fixture(scope="module")
def decision(model_and_tokenizer):
    """transformers' result for the issue's prompt and its full decision-step log-probs."""
    model, tokenizer = model_and_tokenizer
    want = hf.classify(model, tokenizer, [PROMPT], LABELS, keep_logits=True)[0]
    return want, torch.log_softmax(want.logits.float(), -1)


def _completion(log_p: torch.Tensor, emitted: int, text: str, k: int = 50) -> dict:
    """A completions choice: one generated token ``emitted`` with the step's top-k (plus
    the emitted token, as vLLM adds it), tokens written as ``token_id:N``."""
    values, ids = torch.topk(log_p, k)
    top = {f"token_id:{int(t)}": float(v) for t, v in zip(ids, values, strict=True)}
    top[f"token_id:{emitted}"] = float(log_p[emitted])
    logprobs = {
        "tokens": [f"token_id:{emitted}"],
        "token_logprobs": [float(log_p[emitted])],
        "top_logprobs": [top],
    }
    return {"model": "smollm2", "choices": [{"index": 0, "text": text, "logprobs": logprobs}]}


def test_reader_never_returns_a_bound_for_a_label_outside_the_top_k(
    decision, model_and_tokenizer, default_checkpoint
):
    """The issue's example: the reader either returns transformers' scores (the engine's
    exact log-probs fetched) or refuses naming the label it lacks; never superb .109."""
    from semsoft_plugin.engines.reader_contract import read_scores
    from semsoft_plugin.engines.scoring import MissingLabelLogprobs

    want, log_p = decision
    _, tokenizer = model_and_tokenizer
    answers = LabelSet(LABELS, tokenizer).answer_token_ids
    assert want.label == "superb" and want.probs["superb"] > 0.85
    assert not set(answers) & set(torch.topk(log_p, 50).indices.tolist())
    response = _completion(log_p, answers[0], " superb")
    request = openai_request(LABELS, api="completions")
    with pytest.raises(MissingLabelLogprobs, match="'dreadful'") as refused:
        openai_label_probs(response, request, default_checkpoint)
    assert refused.value.labels == ("dreadful",) and refused.value.token_ids == (answers[1],)

    asked: list[list[int]] = []

    def fetch(token_ids: list[int]) -> dict[int, float]:  # what the engine's follow-up returns
        asked.append(token_ids)
        return {t: float(log_p[t]) for t in token_ids}

    step = response["choices"][0]["logprobs"]["top_logprobs"][0]
    got = read_scores(
        request.semsoft, step, " superb", model=default_checkpoint, emitted_ids=[answers[0]],
        fetch=fetch,
    )  # fmt: skip
    assert asked == [[answers[1]]]
    assert got.label == "superb"
    for label in LABELS:
        assert got.probs[label] == pytest.approx(want.probs[label], abs=1e-4)
        assert got.constrained_probs[label] == pytest.approx(
            want.constrained_probs[label], abs=1e-4
        )


def test_constrained_pick_and_argmax_always_agree(
    decision, model_and_tokenizer, default_checkpoint
):
    """A greedy constrained pick that is not the scores' argmax is refused naming both;
    a sampled pick (temperature > 0) may be any label and is reported as emitted."""
    from semsoft_plugin.engines.reader_contract import EmittedLabelMismatch, read_scores

    _, log_p = decision
    _, tokenizer = model_and_tokenizer
    answers = LabelSet(LABELS, tokenizer).answer_token_ids
    request = openai_request(LABELS, api="completions")
    step = _completion(log_p, answers[1], " dreadful")["choices"][0]["logprobs"]["top_logprobs"][0]
    known = {t: float(log_p[t]) for t in answers}
    with pytest.raises(EmittedLabelMismatch, match="'dreadful'.*'superb'"):
        read_scores(
            request.semsoft, step, " dreadful", model=default_checkpoint,
            emitted_ids=[answers[1]], known=known,
        )  # fmt: skip
    sampled = read_scores(
        request.semsoft, step, " dreadful", model=default_checkpoint,
        emitted_ids=[answers[1]], known=known, greedy=False,
    )  # fmt: skip
    assert sampled.label == "dreadful" and sampled.probs["superb"] > 0.85


def test_reader_says_when_the_text_was_cut(decision, model_and_tokenizer, default_checkpoint):
    """A stop string or max_tokens that cut the label (" sup" of " superb") is named."""
    from semsoft_plugin.engines.reader_contract import CutLabel, read_scores

    _, log_p = decision
    _, tokenizer = model_and_tokenizer
    answers = LabelSet(LABELS, tokenizer).answer_token_ids
    known = {t: float(log_p[t]) for t in answers}
    request = openai_request(LABELS, api="completions").semsoft
    step = {int(t): float(v) for v, t in zip(*torch.topk(log_p, 50), strict=True)}
    for text in (" sup", ""):
        with pytest.raises(CutLabel, match="the text was cut.*'superb'"):
            read_scores(
                request, step, text, model=default_checkpoint, emitted_ids=[answers[0]],
                known=known,
            )  # fmt: skip
    whole = read_scores(
        request, step, " superb", model=default_checkpoint, emitted_ids=[answers[0]], known=known
    )
    assert whole.label == "superb"


def test_completions_responses_get_no_completions_advice(default_checkpoint):
    """Item 12: a token text that maps to no unique id is named; the advice to use the
    completions API is given to chat responses only."""
    request = openai_request(LABELS, api="completions")
    step = {"token_id:1": -0.1}
    response = {
        "choices": [
            {
                "text": " x",
                "logprobs": {
                    "tokens": ["\ufffd"],
                    "token_logprobs": [-0.1],
                    "top_logprobs": [step],
                },
            }
        ]
    }
    with pytest.raises(ValueError, match="maps to no unique token id") as refused:
        openai_label_scores(response, request, default_checkpoint)
    assert "completions API" not in str(refused.value)


def _echoed(log_p: torch.Tensor, emitted: int, prompt_ids: list[int]) -> dict:
    """The completions choice of ``_completion`` as an ``echo: true`` response: the
    prompt's tokens first (the first without a log-prob), its length told only by
    ``prompt_logprobs`` (no ``prompt_token_ids``: the request lacked return_token_ids)."""
    response = _completion(log_p, emitted, " superb")
    choice = response["choices"][0]
    logprobs = choice["logprobs"]
    prompt_tokens = [f"token_id:{t}" for t in prompt_ids]
    logprobs["tokens"] = prompt_tokens + logprobs["tokens"]
    logprobs["token_logprobs"] = (
        [None] + [-1.0] * (len(prompt_ids) - 1) + logprobs["token_logprobs"]
    )
    logprobs["top_logprobs"] = [None] * len(prompt_ids) + logprobs["top_logprobs"]
    choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": -1.0}} for t in prompt_ids[1:]]
    choice["text"] = PROMPT + " superb"
    return response


def test_a_refusal_for_a_follow_up_that_cannot_be_asked_names_its_labels(
    decision, model_and_tokenizer, default_checkpoint
):
    """Issue 34 item 13: an ``echo: true`` completions response without its prompt ids,
    read with ``client=``: the follow-up cannot be asked. The refusal used to name the
    labels ``[]``; it names 'dreadful', the label whose answer token is missing, and why."""
    from semsoft_plugin.engines.scoring import MissingLabelLogprobs

    _, log_p = decision
    _, tokenizer = model_and_tokenizer
    answers = LabelSet(LABELS, tokenizer).answer_token_ids
    response = _echoed(log_p, answers[0], tokenizer(PROMPT)["input_ids"])
    request = openai_request(LABELS, api="completions")
    never_called = object()  # the follow-up is refused before the client is used
    with pytest.raises(MissingLabelLogprobs, match=r"label\(s\) \['dreadful'\]") as refused:
        openai_label_scores(response, request, default_checkpoint, client=never_called)
    assert refused.value.labels == ("dreadful",) and refused.value.token_ids == (answers[1],)
    assert "return_token_ids" in str(refused.value)
    with pytest.raises(TypeError, match="must name the labels"):
        MissingLabelLogprobs([], [answers[1]], "no labels")


def test_reader_takes_the_label_logprobs_the_server_added(
    decision, model_and_tokenizer, default_checkpoint
):
    """A choice that carries ``semsoft_label_logprobs`` (what the server's middleware
    adds for answer tokens outside the top-k) is read exactly with no follow-up."""
    want, log_p = decision
    _, tokenizer = model_and_tokenizer
    answers = LabelSet(LABELS, tokenizer).answer_token_ids
    response = _completion(log_p, answers[0], " superb")
    response["choices"][0]["semsoft_label_logprobs"] = {
        f"token_id:{answers[1]}": float(log_p[answers[1]])
    }
    got = openai_label_scores(
        response, openai_request(LABELS, api="completions"), default_checkpoint
    )
    assert got.label == "superb"
    for label in LABELS:
        assert got.probs[label] == pytest.approx(want.probs[label], abs=1e-4)
