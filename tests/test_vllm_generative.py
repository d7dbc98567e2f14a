"""``semsoft eval --methods generative-scoring``: vLLM's own label scoring, read offline,
against a direct ``POST /generative_scoring`` to a real server (issue 36 item 3).

The server returns, per item, only the *first* label token's probability normalised over
the ``label_token_ids`` it was sent; a three-label set therefore takes one request per
label (each with another label first) to get the distribution the method returns.
"""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
from _vllm import SENTIMENT

from semsoft_eval.data import EvalData

LABELS = [*SENTIMENT, "neutral"]
TEXTS = [
    "I loved this movie, the acting was wonderful.",
    "The food was cold and the waiter was rude.",
    "The package arrived on Tuesday.",
    "Not bad at all, though the ending dragged.",
]


def _data() -> EvalData:
    return EvalData(
        "three-way", list(TEXTS), list(LABELS), np.array([0, 1, 2, 0]), task="sentiment"
    )


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


@pytest.mark.vllm
@pytest.mark.slow
def test_generative_scoring_method_equals_a_direct_request(llm, tokenizer, server):
    """The method's probabilities equal ``POST /generative_scoring`` (``apply_softmax``
    true) on the same token ids within 1e-5, label by label (one request per label, the
    query being the prompts' shared chat-template head and the items the rest), and the
    constrained softmax of the kept passes (both are the label tokens' softmax)."""
    pytest.importorskip("vllm")
    from semsoft_eval.calibrate import folds
    from semsoft_eval.methods import MethodInputs, score_methods
    from semsoft_eval.preparation import prepare
    from semsoft_plugin.core.config import SemsoftConfig
    from semsoft_plugin.engines.prompting import encode_prompts, format_prompt

    run = prepare(
        "smollm2-135m", _data(), backend="vllm", loaded=(llm, tokenizer), cache_dir="",
        progress=False,
    )  # fmt: skip
    inputs = MethodInputs(
        run.forward, run.embeddings, run.labels, run.data.targets, config=SemsoftConfig(),
        paper=SemsoftConfig(), fold_ids=folds(len(TEXTS), 2, 0), backend=run.backend,
        prompts=run.inputs,
    )  # fmt: skip
    out = score_methods(["constrained", "generative-scoring"], inputs)
    got = out["generative-scoring"]
    assert got.probs.shape == (len(TEXTS), len(LABELS))
    assert got.extra == {"server_requests_per_item": 2}

    encoded = encode_prompts(tokenizer, [format_prompt(tokenizer, p) for p in run.inputs])
    shared = 0
    while all(len(e) > shared + 1 and e[shared] == encoded[0][shared] for e in encoded):
        shared += 1
    assert shared > 5  # the chat template's head: a real query, not an empty one
    ids = list(run.labels.answer_token_ids)
    url = server.removesuffix("/v1") + "/generative_scoring"
    direct = np.zeros_like(got.probs)
    for j in range(len(LABELS)):
        first = [ids[j], *ids[:j], *ids[j + 1 :]]
        reply = _post(
            url,
            {
                "model": "smollm2",
                "query": encoded[0][:shared],
                "items": [e[shared:] for e in encoded],
                "label_token_ids": first,
                "apply_softmax": True,
            },
        )
        assert [d["index"] for d in reply["data"]] == list(range(len(TEXTS)))
        direct[:, j] = [d["score"] for d in reply["data"]]
    np.testing.assert_allclose(direct.sum(1), 1.0, atol=1e-9)
    np.testing.assert_allclose(got.probs, direct, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got.probs, out["constrained"].probs, rtol=0, atol=1e-5)
    # Not a constant: the items get different scores.
    assert np.ptp(got.probs[:, 0]) > 0.01


def test_generative_scoring_is_refused_without_vllm():
    """On transformers (no label-scoring endpoint of its own) and without a backend the
    method refuses by name instead of returning the constrained softmax as if it were
    vLLM's; it is asked for by name, never in the default list."""
    from types import SimpleNamespace

    from semsoft_eval.backend_transformers import TransformersBackend
    from semsoft_eval.methods import ALL_METHODS, DEFAULT_METHODS, METHODS, MethodInputs

    assert "generative-scoring" in ALL_METHODS and "generative-scoring" not in DEFAULT_METHODS
    run = METHODS["generative-scoring"].run
    common = dict(
        forward=None, embeddings=None, labels=SimpleNamespace(answer_token_ids=(1, 2)), targets=np.zeros(2, dtype=int),
        config=None, paper=None, fold_ids=np.zeros(2, dtype=int), prompts=["a", "b"],
    )  # fmt: skip
    with pytest.raises(ValueError, match="backend='vllm'"):
        run(MethodInputs(**common, backend=TransformersBackend(None, None)))
    with pytest.raises(ValueError, match="give the run's backend"):
        run(MethodInputs(**common, backend=None))
