"""The OpenAI client helpers without vLLM: build a request, read a response.

The response is built from a real model's decision-step logits (SmolLM2-135M through
transformers) in the shape an OpenAI-compatible chat server returns with
``return_tokens_as_token_ids``; the reader runs in a subprocess in which ``vllm`` cannot
be imported, and must give exactly what Semantic Softmax gives on the dense logits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from semsoft_plugin import LabelSet, SemanticSoftmax, SemsoftConfig
from semsoft_plugin.core.embeddings import from_model
from semsoft_plugin.engines.prompting import encode_prompts, format_prompt

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
LABELS = ["positive", "negative", "neutral"]
PROMPT = "Review: 'a wonderful, moving film'. Sentiment (positive, negative or neutral):"

# Hides vllm (and openai: the helpers need neither), then reads the response twice:
# from the OpenAIRequest object alone, and from its keywords as plain JSON.
RUNNER = r"""
import json, sys
HIDDEN = {"vllm", "openai"}
class Hidden:
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        find = getattr(self.inner, "find_spec", None)
        return find(name, path, target) if find else None
    def __getattr__(self, attr):
        return getattr(self.inner, attr)
for name in list(sys.modules):
    if name.partition(".")[0] in HIDDEN:
        del sys.modules[name]
sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
from semsoft_plugin.engines.openai import openai_label_scores, openai_request
from semsoft_plugin.engines.scoring import MissingLabelLogprobs
labels, options, checkpoint, response = json.loads(sys.stdin.read())
request = openai_request(labels, **options)
try:
    scores = openai_label_scores(response, request, checkpoint)
except MissingLabelLogprobs as refused:
    print("REPORT" + json.dumps({"missing": list(refused.labels), "kwargs": request,
        "vllm": [m for m in sys.modules if m.startswith("vllm")]}))
    sys.exit(0)
again = openai_label_scores(response, json.loads(json.dumps(request)), checkpoint)
assert again == scores
print("REPORT" + json.dumps({
    "kwargs": request, "probs": scores.probs, "label": scores.label,
    "coverage": scores.coverage, "vllm": [m for m in sys.modules if m.startswith("vllm")],
}))
"""


def _chat_response(logits: torch.Tensor, k: int) -> dict:
    """One chat choice whose only generated token is the argmax, with its top-k."""
    log_p = torch.log_softmax(logits.float(), -1)
    top_lp, top_ids = torch.topk(log_p, k)
    pick = int(top_ids[0])
    tops = [
        {"token": f"token_id:{int(t)}", "logprob": float(v)}
        for t, v in zip(top_ids, top_lp, strict=True)
    ]
    entry = {"token": f"token_id:{pick}", "logprob": float(top_lp[0]), "top_logprobs": tops}
    return {"choices": [{"index": 0, "logprobs": {"content": [entry]}}]}


@pytest.mark.parametrize(
    "options",
    [{}, {"k": 20, "tau": 0.1, "vote": "nearest", "semantic_weight": 0.5}, {"k": 20, "semantic_weight": 1.0}],
)
def test_openai_reader_without_vllm_equals_dense(model_and_tokenizer, default_checkpoint, options):
    model, tokenizer = model_and_tokenizer
    (ids,) = encode_prompts(tokenizer, [format_prompt(tokenizer, PROMPT)])
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    config = SemsoftConfig().replace(**options)
    label_set = LabelSet(LABELS, tokenizer)
    scorer = SemanticSoftmax(from_model(model), label_set, config)
    dense = scorer(logits)
    top_lp, top_ids = torch.topk(torch.log_softmax(logits, -1), config.k)
    # The reader sees the top-k only: it gives what the core gives on that sparse row,
    # which is the dense result; where the default's pool needs an answer token's
    # log-prob the server did not return, it refuses naming the label (reader contract).
    want = scorer.score_top_k(top_ids, top_lp)
    kept = set(top_ids.tolist())
    not_kept = [n for n, t in zip(LABELS, label_set.answer_token_ids, strict=True) if t not in kept]
    exact = not not_kept or config.semantic_weight == 1.0
    if exact:
        torch.testing.assert_close(want.semantic, dense.semantic, rtol=1e-5, atol=1e-6)
    payload = [LABELS, options, str(default_checkpoint), _chat_response(logits, config.k)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.split("REPORT", 1)[1])
    assert report["vllm"] == []
    assert report.get("missing", []) == ([] if exact else not_kept)
    if not exact:
        return
    # The options round-trip through the request's extra body, labels included.
    xargs = report["kwargs"]["extra_body"]["vllm_xargs"]
    assert xargs["semsoft_labels"] == LABELS and xargs["semsoft_k"] == config.k
    assert report["kwargs"]["top_logprobs"] == config.k
    got = torch.tensor([report["probs"][label] for label in LABELS])
    torch.testing.assert_close(got, want.semantic, rtol=1e-4, atol=1e-5)
    assert report["coverage"] == pytest.approx(float(want.coverage), rel=1e-4, abs=1e-6)
    assert report["label"] == LABELS[int(want.semantic.argmax())]


def test_openai_reader_refuses_keywords_without_options():
    from semsoft_plugin.engines.openai import openai_label_scores, openai_request

    plain = dict(openai_request(LABELS, plugin=False))  # no vllm_xargs in it
    with pytest.raises(ValueError, match="carry no semsoft options"):
        openai_label_scores({"choices": []}, plain, "unused")
    with pytest.raises(ValueError, match="api='x'"):
        openai_request(LABELS, api="x")
