"""The vLLM server under hostile input: the table of bodies the admission middleware and
vLLM refuse with a 400 (on every route that takes sampling options), every refusal over
one kept-alive connection that must stay usable, and a bounded Hypothesis fuzz of bad
``vllm_xargs`` sent beside good requests, which must score as when sent alone.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pytest
from _vllm import ATOL, CLASH, CONTINUE, EMOTIONS, PROMPTS, SENTIMENT, VLLM_REFUSED

vllm = pytest.importorskip("vllm")

from semsoft_plugin.core import request as sreq  # noqa: E402
from semsoft_plugin.core.labels import LabelSet  # noqa: E402
from semsoft_plugin.engines import openai as sopenai  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _post(server: str, path: str, body: str | dict) -> tuple[int, dict]:
    """POST a raw JSON body (a str is sent as is: ``1e999``, ``NaN`` ...)."""
    data = body if isinstance(body, str) else json.dumps(body)
    request = urllib.request.Request(
        server + path, data=data.encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            raw = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read().decode(), error.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, {"stream": raw}


def _chat_body(labels, xargs=None, **fields) -> dict:
    body = {
        "model": "smollm2",
        "messages": PROMPTS["review"],
        **sopenai.openai_request(labels)["extra_body"],
        **{k: v for k, v in sopenai.openai_request(labels).items() if k != "extra_body"},
        **CONTINUE,
    }
    if xargs is not None:
        body["vllm_xargs"] = xargs
    body.update(fields)
    return body


def _error(reply: dict) -> str:
    return reply["error"]["message"]


def _hf_tokenizer():
    from transformers import AutoTokenizer

    from semsoft_plugin.engines import models

    return AutoTokenizer.from_pretrained(str(models.resolve("smollm2-135m")))


def test_server_refuses_the_hostile_table_with_400(server):
    good = sopenai.openai_request(SENTIMENT)["extra_body"]["vllm_xargs"]
    text = json.dumps(_chat_body(SENTIMENT, {**good, "semsoft_k": 7}))
    cases = {
        "k=1e999": (
            text.replace('"semsoft_k": 7', '"semsoft_k": 1e999'),
            r"semsoft_k=inf .*SERVER_MAX_K",
        ),
        "k=NaN": (
            text.replace('"semsoft_k": 7', '"semsoft_k": NaN'),
            r"semsoft_k=nan .*SERVER_MAX_K",
        ),
        "k=true": (
            text.replace('"semsoft_k": 7', '"semsoft_k": true'),
            r"semsoft_k=True .*SERVER_MAX_K",
        ),
        "guided_choice": (_chat_body(SENTIMENT, guided_choice=SENTIMENT), "guided_choice"),
        "response_format": (
            _chat_body(SENTIMENT, response_format={"type": "json_object"}),
            "structured outputs",
        ),
        "clash": (_chat_body(CLASH), "'annoy' and 'annoyance'"),
        "shared prefix": (
            _chat_body(
                ["x" * 60 + f"{i:04d}" for i in range(sreq.SERVER_MAX_LABELS)], max_tokens=2
            ),
            "x0000' and 'x",
        ),
        "stream, bad mode": (
            _chat_body(SENTIMENT, {**good, "semsoft_mode": "force"}, stream=True),
            "semsoft_mode='force' must be one of",
        ),
    }
    for name, (body, message) in cases.items():
        status, reply = _post(server, "/chat/completions", body)
        assert status == 400, (name, reply)
        assert re.search(message, _error(reply)), (name, _error(reply))
    completions = {
        "model": "smollm2",
        "prompt": "Review: 'great'. Sentiment:",
        **{
            k: v
            for k, v in sopenai.openai_request(SENTIMENT, api="completions").items()
            if k != "extra_body"
        },
        **sopenai.openai_request(SENTIMENT, api="completions")["extra_body"],
    }
    for extra, message in (
        ({"guided_choice": SENTIMENT}, "guided_choice"),
        ({"stream": True, "vllm_xargs": {**good, "semsoft_k": 0}}, "semsoft_k=0"),
    ):
        status, reply = _post(server, "/completions", {**completions, **extra})
        assert status == 400 and message in _error(reply), reply
    # Issue 26 items 10-12: every route that takes sampling options, labels the engine
    # cannot emit as text, stops that would cut a label, near-miss keys.
    root = server.removesuffix("/v1")
    k_true = {**good, "semsoft_k": True}
    routed = {
        "/invocations": _chat_body(SENTIMENT, k_true),
        "/v1/chat/completions/batch": {**_chat_body(SENTIMENT, k_true), "messages": [PROMPTS["review"]]},
        "/v1/messages": {
            "model": "smollm2", "max_tokens": 4, "stream": True, "vllm_xargs": good,
            "messages": [{"role": "user", "content": "Great film. Sentiment?"}],
        },
        "/v1/responses": {"model": "smollm2", "input": "Great film.", "vllm_xargs": good},
        "/inference/v1/generate": {
            "model": "smollm2", "token_ids": [1, 2, 3],
            "sampling_params": {"max_tokens": 2, "extra_args": good},
        },
    }  # fmt: skip
    for path, body in routed.items():
        status, reply = _post(root, path, body)
        assert status == 400, (path, reply)
        assert f"is not supported on {path}" in _error(reply), (path, _error(reply))
    positive = LabelSet(SENTIMENT, _hf_tokenizer()).answer_token_ids[0]
    refused = {
        "special label": (_chat_body(["<|im_end|>", "positive"]), r"'<\|im_end\|>'.*special"),
        "endoftext label": (_chat_body(["negative", "<|endoftext|>"]), "special token"),
        "stop cuts": (_chat_body(SENTIMENT, stop=[" pos"]), "stop=' pos' would cut the label 'positive'"),
        "stop equals": (_chat_body(SENTIMENT, stop="negative"), "would cut the label 'negative'"),
        "stop ids": (_chat_body(SENTIMENT, stop_token_ids=[positive]), "stop_token_ids"),
        "SEMSOFT_LABELS": (
            _chat_body(SENTIMENT, {"SEMSOFT_LABELS": SENTIMENT}), "did you mean 'semsoft_labels'"
        ),
        "semsoft-labels": (
            _chat_body(SENTIMENT, {"semsoft-labels": SENTIMENT}), "did you mean 'semsoft_labels'"
        ),
        "top-level key": ({**_chat_body(SENTIMENT), "semsoft_k": 7}, "send semsoft options in vllm_xargs"),
    }  # fmt: skip
    for name, (body, message) in refused.items():
        status, reply = _post(server, "/chat/completions", body)
        assert status == 400, (name, reply)
        assert re.search(message, _error(reply)), (name, _error(reply))
    # A stop that cannot cut a label still serves.
    status, reply = _post(server, "/chat/completions", _chat_body(SENTIMENT, stop=["\n"]))
    assert status == 200, reply


def test_every_refusal_is_a_400_and_the_kept_alive_connection_stays_usable(server):
    """Issue 34 items 4, 6 and 7 on a real server: vLLM's own ``VLLMValidationError``
    (``n=2`` when greedy, ``top_p=0``, ``temperature=-1``, ``max_tokens=-1``, ...) escaped
    the admission middleware ("Exception in ASGI application") and the next valid request
    on that kept-alive connection got "Connection reset by peer"; beam search was
    admitted (200, the text " Positive"). Every one is sent over ONE connection: each is
    a 400 naming the value, the socket is never reopened, and a valid request on it
    then scores."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(server)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    good = sopenai.openai_request(SENTIMENT)["extra_body"]["vllm_xargs"]
    cases = {
        name: (_chat_body(SENTIMENT, **fields), message)
        for name, (fields, message) in VLLM_REFUSED.items()
    }
    cases["n=2 greedy, streamed"] = (
        _chat_body(SENTIMENT, n=2, temperature=0, stream=True),
        VLLM_REFUSED["n=2 greedy"][1],
    )
    cases["NFC and NFD labels"] = (
        _chat_body(SENTIMENT, {**good, "semsoft_labels": ["caf\u00e9", "cafe\u0301"]}),
        r"U\+0066 U\+00E9\) and '.+' \(U\+0063 U\+0061 U\+0066 U\+0065 U\+0301\) print al",
    )
    cases["hidden character"] = (
        _chat_body(SENTIMENT, {**good, "semsoft_labels": ["yes\x00", "no"]}),
        r"'yes\\x00' holds .*U\+0000",
    )
    cases["bad k"] = (_chat_body(SENTIMENT, {**good, "semsoft_k": 0}), "semsoft_k=0")

    def send(body: dict) -> tuple[int, dict]:
        connection.request(
            "POST", url.path + "/chat/completions", json.dumps(body),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        response = connection.getresponse()
        assert response.getheader("connection", "").lower() != "close", response.headers
        return response.status, json.loads(response.read())

    status, reply = send(_chat_body(SENTIMENT))
    assert status == 200, reply
    opened = connection.sock.getsockname()
    for name, (body, message) in cases.items():
        status, reply = send(body)
        assert status == 400, (name, reply)
        assert re.search(message, _error(reply)), (name, _error(reply))
        assert connection.sock is not None and connection.sock.getsockname() == opened, name
    status, reply = send(_chat_body(SENTIMENT))
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"].strip() in SENTIMENT, reply
    assert connection.sock.getsockname() == opened
    connection.close()


def test_server_fuzz_bad_xargs_interleaved_with_good(server, checkpoint, tokenizer):
    """Hypothesis-generated bad ``vllm_xargs`` (random types, sizes, unicode, huge
    numbers, NaN/inf, unknown keys, near-miss keys, legacy guided fields, streaming or
    not, labels the engine cannot emit, stops that cut a label), on every route that
    takes sampling options (only chat/completions and completions read semsoft options),
    each sent concurrently with a good request: every bad one is a 400 naming a semsoft
    option or vLLM's own field check, every good one scores as when sent alone, and the
    server is alive at the end. Loopback only; bounded to 40 examples."""
    from concurrent.futures import ThreadPoolExecutor

    import openai
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    client = openai.OpenAI(base_url=server, api_key="none", max_retries=0)
    pool = [
        (PROMPTS["review"], SENTIMENT),
        (PROMPTS["short"], SENTIMENT),
        (PROMPTS["dog"], EMOTIONS),
    ]

    def good(i: int) -> tuple[dict, list[str]]:
        messages, labels = pool[i % len(pool)]
        return {**_chat_body(labels), "messages": messages}, labels

    def score(body: dict, labels: list[str]) -> dict[str, float]:
        status, reply = _post(server, "/chat/completions", body)
        assert status == 200, reply
        return sopenai.openai_label_probs(reply, labels, checkpoint, client=client)

    alone = [score(*good(i)) for i in range(len(pool))]

    scalars = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.booleans(),
        st.none(),
        st.text(max_size=300),
    )
    values = st.one_of(
        scalars,
        st.lists(scalars, max_size=80),
        st.lists(st.text(min_size=0, max_size=70), min_size=0, max_size=70),
        st.dictionaries(st.text(max_size=4), scalars, max_size=3),
    )
    keys = st.one_of(
        st.sampled_from(sorted(sreq._KEYS)), st.text(max_size=20).map("semsoft_".__add__)
    )

    def refused_here(xargs: dict) -> bool:
        """The verdict here (parse_request with the server's limits, or the label check)."""
        try:
            request = sreq.parse_request(xargs, server=True)
            LabelSet(list(request.labels), tokenizer, leading_space=request.leading_space)
        except (ValueError, TypeError):
            return True
        return False

    counter = iter(range(10**6))
    seen = {"bad": 0, "good": 0}

    # Issue 26: the routes other than chat/completions refuse any semsoft body; labels the
    # engine cannot emit and stops that cut a label are refused on the supported route.
    positive = LabelSet(SENTIMENT, tokenizer).answer_token_ids[0]
    routes = st.sampled_from(
        ["/v1/chat/completions"] * 3
        + ["/v1/chat/completions/batch", "/invocations", "/v1/messages", "/v1/responses"]
    )
    cuts = st.sampled_from(
        [None, None, None, {"stop": [" pos"]}, {"stop": "negative"},
         {"stop_token_ids": [positive]}, {"labels": ["<|im_end|>", "negative"]},
         {"labels": ["positive", "<|endoftext|>"]}, {"key": "SEMSOFT_LABELS"},
         {"key": "semsoft-labels"}]
    )  # fmt: skip
    root = server.removesuffix("/v1")

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        key=keys, value=values, stream=st.booleans(), guided=st.booleans(), route=routes, cut=cuts
    )
    def run(key, value, stream, guided, route, cut):
        base = sopenai.openai_request(SENTIMENT)["extra_body"]["vllm_xargs"]
        xargs = {**base, key: value}
        body = _chat_body(SENTIMENT, xargs, stream=stream)
        if cut is not None and "labels" in cut:
            xargs["semsoft_labels"] = cut["labels"]
        elif cut is not None and "key" in cut:
            xargs[cut["key"]] = SENTIMENT
        elif cut is not None:
            body.update(cut)
        if guided:
            body["guided_choice"] = SENTIMENT
        elif route == "/v1/chat/completions" and cut is None and not refused_here(xargs):
            return  # a valid value by chance: not a bad request
        i = next(counter)
        good_body, labels = good(i)
        with ThreadPoolExecutor(2) as workers:
            bad_reply = workers.submit(_post, root, route, json.dumps(body))
            good_probs = workers.submit(score, good_body, labels)
            status, reply = bad_reply.result()
            probs = good_probs.result()
        assert status == 400, (xargs, reply)
        assert reply["error"]["message"], reply
        for label in labels:
            assert probs[label] == pytest.approx(alone[i % len(pool)][label], abs=ATOL)
        seen["bad"] += 1
        seen["good"] += 1

    started = time.monotonic()
    run()
    assert seen["bad"] >= 20, seen
    assert time.monotonic() - started < 120
    with urllib.request.urlopen(server.removesuffix("/v1") + "/health", timeout=5) as r:
        assert r.status == 200
    assert score(*good(0)) == pytest.approx(alone[0], abs=ATOL)
