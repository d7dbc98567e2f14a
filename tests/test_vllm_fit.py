"""A fitted probe applied inside the vLLM engine (issue 41): the engine serves the fits of
``SEMSOFT_FIT_DIR``, a request names one with ``semsoft_fit``, its processor scores the
decision step's logits row with the probe (h read back from the row), and the reader gets
the fitted row from the engine's worker through ``collective_rpc``.

Checked on SmolLM2-135M in float32 against the hook probe on transformers (the same
probe on the hidden state ``output_hidden_states`` gives): rows equal within 1e-3; a bad
fit, a fit for other labels or another model and an unknown name refused at admission,
before any text is scored; a row edited before the processor not scored, with the
reason. The probe is fitted on transformers before any engine starts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from _probe import fit_plain
from _vllm import ENGINE_ARGS, SENTIMENT, chat, token_prompt

vllm = pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from semsoft_plugin.core.config import SemsoftConfig  # noqa: E402
from semsoft_plugin.engines import vllm as sv  # noqa: E402
from semsoft_plugin.engines.reader_contract import FitNotApplied  # noqa: E402
from semsoft_plugin.engines.vllm.reader_tables import (  # noqa: E402
    EXTENSION,
    FIT_PROCESSOR,
    fitted_rows,
)
from semsoft_plugin.fit.fit_file import FitIdentity, output_layer_sha256  # noqa: E402
from semsoft_plugin.fit.fitted import FittedCorrection, save_fitted  # noqa: E402

pytestmark = [pytest.mark.slow]

REVIEWS = [
    ("I loved this movie, the acting was wonderful.", 0),
    ("A dull, lifeless film. I walked out.", 1),
    ("Best thing I have seen all year!", 0),
    ("The plot made no sense and the jokes fell flat.", 1),
    ("Charming, funny and warm.", 0),
    ("Two hours of my life I will not get back.", 1),
    ("A masterpiece of quiet storytelling.", 0),
    ("Boring, loud and far too long.", 1),
    ("It was fine, I guess, nothing special.", 1),
    ("The cast is superb and the music unforgettable.", 0),
    ("I fell asleep halfway through.", 1),
    ("A delight from start to finish.", 0),
]
PROMPTS = [
    chat(
        f"Classify the sentiment of this review: '{text}' Answer positive or negative.",
        "Sentiment:",
    )  # fmt: skip
    for text, _ in REVIEWS
]


@pytest.fixture(scope="session")
def fits(hf_model, checkpoint, tmp_path_factory) -> dict[str, Any]:
    """A probe fitted on the hook's hidden states (transformers, float32) and a fit
    folder: the good fit and the bad ones, each under its name."""
    from safetensors.numpy import save_file

    from semsoft_plugin.engines import hf
    from semsoft_plugin.engines.hf_hidden import HiddenAtDecision

    model, tokenizer = hf_model
    with HiddenAtDecision(model) as hook:
        results = hf.classify(model, tokenizer, PROMPTS, SENTIMENT, batch_size=4, max_tokens=1,
                              keep_logits=True)  # fmt: skip
    hidden = hook.rows(tokenizer, PROMPTS, 4).double().numpy()
    targets = np.array([y for _, y in REVIEWS])
    probe = fit_plain(hidden, targets, 2)
    folder = tmp_path_factory.mktemp("fits")
    labels = tuple(SENTIMENT)
    layer = output_layer_sha256(checkpoint)
    prompt = {"user": "Classify the sentiment of this review: '{text}' Answer positive or "
              "negative.", "answer_prefix": "Sentiment:", "system": None}  # fmt: skip

    def save(name: str, correction: FittedCorrection, output_layer: str = layer) -> None:
        identity = FitIdentity(correction.labels, prompt, output_layer)
        save_fitted(folder / f"{name}.json", SemsoftConfig(), correction, identity)

    save("sentiment", FittedCorrection("probe", labels, probe=probe))
    # The same data fitted with the labels the other way round: the request's order is kept.
    swapped = fit_plain(hidden, 1 - targets, 2)
    save("swapped", FittedCorrection("probe", labels[::-1], probe=swapped))
    save("topics", FittedCorrection("probe", ("sports", "politics"), probe=probe))
    save("other_model", FittedCorrection("probe", labels, probe=probe), "0" * 64)
    small = fit_plain(hidden[:, :7], targets, 2)  # a probe of another hidden size
    save("wrong_size", FittedCorrection("probe", labels, probe=small))
    save("offset", FittedCorrection("offset", labels, offset=(0.5, -0.5)))
    # Finite values that would overflow the scores to NaN: refused at load.
    huge = dataclasses.replace(probe, weight=np.full_like(probe.weight, 1e308))
    save("huge", FittedCorrection("probe", labels, probe=huge))
    tiny = dataclasses.replace(probe, scale=np.full_like(probe.scale, 1e-320))
    save("tiny_scale", FittedCorrection("probe", labels, probe=tiny))
    save("truncated", FittedCorrection("probe", labels, probe=probe))
    weights = folder / "truncated.json.probe.safetensors"
    weights.write_bytes(weights.read_bytes()[:300])
    save("tampered", FittedCorrection("probe", labels, probe=probe))
    save_file({"x": np.zeros(2)}, str(folder / "tampered.json.probe.safetensors"))
    logits = torch.stack([r.logits for r in results])
    return {"folder": folder, "probe": probe, "hidden": hidden, "swapped": swapped,
            "logits": logits}  # fmt: skip


@pytest.fixture(scope="session")
def fit_llm(checkpoint, fits) -> Any:
    """An in-process engine serving the fit folder (the processor and worker extension
    of ``semsoft_plugin.engines.vllm.fits``). Session-scoped like conftest's engines: an
    in-process engine torn down mid-session takes vLLM's process-wide parallel state with
    it, and the session's other engines then fail."""
    from vllm import LLM

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEMSOFT_FIT_DIR", str(fits["folder"]))
        engine = LLM(str(checkpoint), logits_processors=[FIT_PROCESSOR],
                     worker_extension_cls=EXTENSION, **ENGINE_ARGS)  # fmt: skip
        yield engine
    del engine


def _prompts(llm: Any) -> list[Any]:
    tokenizer = llm.get_tokenizer()
    return [token_prompt(tokenizer, p) for p in PROMPTS]


@pytest.mark.vllm
def test_vllm_rows_equal_the_hook_probe(fit_llm, fits) -> None:
    """Constrain and observe mode, a fit whose columns are in the other order: each row
    is the hook probe's within 1e-3 (float32), and the emitted label is its argmax."""
    want = fits["probe"].probs(fits["hidden"])
    prompts = _prompts(fit_llm)
    constrain = sv.sampling_params(SENTIMENT, fit="sentiment")
    observe = sv.sampling_params(SENTIMENT, fit="sentiment", mode="observe", max_tokens=3)
    swapped = sv.sampling_params(SENTIMENT, fit="swapped")
    outputs = fit_llm.generate(prompts * 3, [constrain] * 12 + [observe] * 12 + [swapped] * 12,
                               use_tqdm=False)  # fmt: skip
    swapped_want = fits["swapped"].probs(fits["hidden"])[:, ::-1]
    for i, out in enumerate(outputs):
        params = [constrain, observe, swapped][i // 12]
        result = sv.label_scores(out, params, fit_llm)
        got = np.array([result.probs[label] for label in SENTIMENT])
        expected = swapped_want[i % 12] if i >= 24 else want[i % 12]
        np.testing.assert_allclose(got, expected, atol=1e-3)
        assert result.label == SENTIMENT[int(np.argmax(expected))]
        if params is not observe:
            assert out.outputs[0].text.strip() == result.label


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("name", "refused"),
    [
        ("nowhere", r"semsoft_fit='nowhere' is not a fit this engine serves"),
        ("topics", r"fitted for the labels \['sports', 'politics'\]"),
        ("other_model", r"other_model.*output layer has sha256 0000000000000000"),
        ("wrong_size", r"wrong_size.*hidden states of size 7, this model's are 576"),
        ("offset", r"offset.*only a probe fit is applied inside the engine"),
        ("huge", r"huge.*refused at load.*weight holds 1e\+308, outside"),
        ("tiny_scale", r"tiny_scale.*refused at load.*scale holds 9.99989e-321, outside"),
        ("truncated", r"truncated.*refused at load"),
        ("tampered", r"tampered.*refused at load"),
        ("../sentiment", r"semsoft_fit='../sentiment' must be the name of a fit"),
    ],
)
def test_a_bad_fit_is_refused_before_any_text_is_scored(fit_llm, name, refused) -> None:
    """A name that is no fit name is refused at admission; a fit the engine cannot
    serve is refused when the request joins the engine (vLLM's admission call hands
    over no engine config; the server's middleware refuses it with HTTP 400 first:
    test_server_rows_equal_the_hook_probe_and_bad_fits_are_400): no fitted score is read, the reader names it."""
    from vllm.exceptions import VLLMValidationError

    prompt = _prompts(fit_llm)[:1]
    extra = {**sv.sampling_params(SENTIMENT, fit="sentiment").extra_args, "semsoft_fit": name}
    params = SamplingParams(max_tokens=3, temperature=0, logprobs=50, extra_args=extra)
    if name.startswith("../"):
        with pytest.raises((VLLMValidationError, ValueError), match=refused):
            fit_llm.generate(prompt, params, use_tqdm=False)
    else:
        out = fit_llm.generate(prompt, params, use_tqdm=False)[0]
        with pytest.raises(FitNotApplied, match=refused):
            sv.label_scores(out, params, fit_llm)
    # The engine goes on serving.
    assert fit_llm.generate(prompt, SamplingParams(max_tokens=1), use_tqdm=False)


@pytest.mark.vllm
def test_a_row_edited_before_the_processor_is_not_scored_with_the_fit(fit_llm) -> None:
    """Observe mode keeps logit_bias (constrain mode refuses it): the biased row is not
    W h + b, so the reader names why instead of returning fitted scores."""
    prompt = _prompts(fit_llm)[:1]
    params = sv.sampling_params(SENTIMENT, fit="sentiment", mode="observe", max_tokens=2,
                                logit_bias={11: 3.0})  # fmt: skip
    out = fit_llm.generate(prompt, params, use_tqdm=False)[0]
    with pytest.raises(
        FitNotApplied, match=r"not applied.*residual .* exceeds the tolerance 0.25.*logit_bias"
    ):
        sv.label_scores(out, params, fit_llm)


@pytest.mark.vllm
def test_an_engine_without_the_fit_processor_refuses_a_fit(llm) -> None:
    """The plain processor's engine names what it needs to serve fits (the reader
    raises it; the server's middleware answers it with HTTP 400)."""
    tokenizer = llm.get_tokenizer()
    params = sv.sampling_params(SENTIMENT, fit="sentiment")
    out = llm.generate([token_prompt(tokenizer, PROMPTS[0])], params, use_tqdm=False)[0]
    with pytest.raises(FitNotApplied, match=FIT_PROCESSOR):
        sv.label_scores(out, params, llm)


@pytest.mark.vllm
def test_model_runner_v2_applies_a_fit(fit_llm, fits) -> None:
    """Model Runner V2 cannot run on this CPU (no Triton): its interface is driven
    directly. A constrain row gets log P_fit on its label tokens, an observe row is left
    as it was, and both rows are kept for the readers, equal to the hook probe's."""
    from _vllm import FreshConfig
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState

    from semsoft_plugin.core.labels import LabelSet
    from semsoft_plugin.engines.vllm.fits import FittedSemanticSoftmax
    from semsoft_plugin.engines.vllm.reader_tables import fitted_key, fitted_rows

    config = fit_llm.llm_engine.vllm_config.model_config
    slots, vocab = 2, config.get_vocab_size()
    all_tokens = torch.zeros((slots, 32), dtype=torch.int64)
    prompt_len = np.array([5, 5], dtype=np.int32)
    all_tokens[0, :5], all_tokens[1, :5] = torch.arange(1, 6), torch.arange(6, 11)
    state = LogitsProcRequestState(
        device=torch.device("cpu"), max_num_reqs=slots, vocab_size=vocab,
        all_token_ids=SimpleNamespace(gpu=all_tokens), prompt_len=SimpleNamespace(np=prompt_len),
        prefill_len=SimpleNamespace(np=prompt_len.copy()),
        total_len=SimpleNamespace(gpu=torch.zeros(slots, dtype=torch.int32)),
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEMSOFT_FIT_DIR", str(fits["folder"]))
        proc = FittedSemanticSoftmax(FreshConfig(config), state)
    constrain = sv.sampling_params(SENTIMENT, fit="sentiment")
    assert proc.add_request(0, constrain) is True
    observe = sv.sampling_params(SENTIMENT, fit="sentiment", mode="observe", max_tokens=3)
    assert proc.add_request(1, observe) is True
    original = fits["logits"][:2, :vocab].clone()
    idx = np.array([0, 1])
    ctx = LogitsContext(
        expanded_idx_mapping=torch.tensor(idx), idx_mapping=torch.tensor(idx), idx_mapping_np=idx,
        expanded_local_pos=torch.zeros(2, dtype=torch.int64), input_ids=torch.zeros(2, dtype=torch.int64),
        pos=torch.tensor([4, 4]), seq_lens_upper_bound_np=np.array([5, 5]),
    )  # fmt: skip
    out = proc.apply(original.clone(), ctx)
    want = fits["probe"].probs(fits["hidden"][:2])
    keys = [p.extra_args["semsoft_row_key"] for p in (constrain, observe)]
    rows = fitted_rows([fitted_key(keys[0], "sentiment", list(range(1, 6)), []),
                        fitted_key(keys[1], "sentiment", list(range(6, 11)), [])])  # fmt: skip
    for i in range(2):
        np.testing.assert_allclose(rows[i]["probs"], want[i], atol=1e-4)
    answers = list(LabelSet(SENTIMENT, fit_llm.get_tokenizer()).answer_token_ids)
    assert sorted(torch.isfinite(out[0]).nonzero().flatten().tolist()) == sorted(answers)
    np.testing.assert_allclose(out[0, answers].exp().numpy(), want[0], atol=1e-4)
    assert torch.equal(out[1], original[1])


@pytest.mark.vllm
def test_model_runner_v2_keeps_the_hidden_state(fit_llm, fits) -> None:
    """Model Runner V2's interface (driven directly: no Triton here) keeps a
    `semsoft_hidden` request's `h`, read back from its row, equal to the hook's within
    1e-4, and leaves the observed row as it was."""
    from _vllm import FreshConfig
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState

    from semsoft_plugin.engines.vllm.processor import SemanticSoftmaxLogitsProcessor
    from semsoft_plugin.engines.vllm.reader_tables import HIDDEN, fitted_key, read_hidden

    config = fit_llm.llm_engine.vllm_config.model_config
    vocab = config.get_vocab_size()
    all_tokens = torch.zeros((1, 32), dtype=torch.int64)
    all_tokens[0, :5] = torch.arange(21, 26)
    prompt_len = np.array([5], dtype=np.int32)
    state = LogitsProcRequestState(
        device=torch.device("cpu"), max_num_reqs=1, vocab_size=vocab,
        all_token_ids=SimpleNamespace(gpu=all_tokens), prompt_len=SimpleNamespace(np=prompt_len),
        prefill_len=SimpleNamespace(np=prompt_len.copy()),
        total_len=SimpleNamespace(gpu=torch.zeros(1, dtype=torch.int32)),
    )  # fmt: skip
    proc = SemanticSoftmaxLogitsProcessor(FreshConfig(config), state)
    params = sv.sampling_params(SENTIMENT, mode="observe", max_tokens=1, hidden=True)
    assert proc.add_request(0, params) is True
    row = fits["logits"][2:3, :vocab].clone()
    idx = np.array([0])
    ctx = LogitsContext(
        expanded_idx_mapping=torch.tensor(idx), idx_mapping=torch.tensor(idx), idx_mapping_np=idx,
        expanded_local_pos=torch.zeros(1, dtype=torch.int64), input_ids=torch.zeros(1, dtype=torch.int64),
        pos=torch.tensor([4]), seq_lens_upper_bound_np=np.array([5]),
    )  # fmt: skip
    out = proc.apply(row.clone(), ctx)
    assert torch.equal(out, row)
    local = SimpleNamespace(collective_rpc=lambda _m, args: [fitted_rows(*args)])
    key = fitted_key(params.extra_args["semsoft_row_key"], HIDDEN, list(range(21, 26)), [])
    (hidden,) = read_hidden(local, [key])
    np.testing.assert_allclose(hidden.double().numpy(), fits["hidden"][2], atol=1e-4)


def test_a_server_client_cannot_ask_for_a_hidden_state() -> None:
    from semsoft_plugin.core.request import KEY_HIDDEN, parse_request

    args = {"semsoft_labels": SENTIMENT, KEY_HIDDEN: 1}
    assert parse_request(args).hidden is True
    with pytest.raises(ValueError, match="semsoft_hidden keeps a hidden state in the engine"):
        parse_request(args, server=True)


def test_fit_names_are_names_never_paths() -> None:
    from semsoft_plugin.core.request import KEY_FIT, parse_request

    base = {"semsoft_labels": SENTIMENT}
    assert parse_request({**base, KEY_FIT: "sst2-qwen_v1.2"}).fit == "sst2-qwen_v1.2"
    for bad in ("", "/etc/passwd", "..", ".hidden", "a b", "x" * 65, 3, ["a"]):
        with pytest.raises(ValueError, match="must be the name of a fit"):
            parse_request({**base, KEY_FIT: bad})


@pytest.fixture(scope="module")
def fit_server(checkpoint, fits, tmp_path_factory) -> Any:
    """The OpenAI server (its engine in its own process) serving the fit folder, with a
    LoRA adapter (non-zero weights, so its rows differ from the base model's) served as
    the model ``tuned``, one sequence at a time: vLLM 0.32's CPU LoRA kernels change a row
    when base and adapter requests share a batch (a base row .97 where alone it is .91, and
    top-k lists cut short), which is vLLM's arithmetic, not whose row a response gets. One
    at a time, concurrent clients still interleave their requests and the middleware's
    reads, which is where rows were handed across. One server for every test here: two at
    once, beside the session's in-process engines, outgrow a 24 GiB machine."""
    peft = pytest.importorskip("peft")
    from _server import plugin_server

    from semsoft_plugin.engines import models

    model, _ = models.load(str(checkpoint), dtype="float32")
    torch.manual_seed(0)
    config = peft.LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"],
                             init_lora_weights=False)  # fmt: skip
    adapter = tmp_path_factory.mktemp("lora") / "tuned"
    peft.get_peft_model(model, config).save_pretrained(str(adapter))
    del model  # the server loads its own copy
    log = tmp_path_factory.mktemp("fit_server") / "server.log"
    extra = ["--worker-extension-cls", EXTENSION, "--enable-lora", "--max-lora-rank", "8",
             "--lora-modules", f"tuned={adapter}", "--max-num-seqs", "1"]  # fmt: skip
    env = {"SEMSOFT_FIT_DIR": str(fits["folder"])}
    with plugin_server(checkpoint, log, FIT_PROCESSOR, extra, env) as url:
        yield url


@pytest.mark.vllm
def test_server_rows_equal_the_hook_probe_and_bad_fits_are_400(fit_server, fits, checkpoint):
    """Over HTTP the fitted rows come back in each choice's semsoft_fitted, which
    openai_label_probs reads as it reads any scores (within 1e-3 of the hook probe); a
    bad fit, a fit for other labels or another model, an unknown name are a 400 naming
    it, and the kept-alive connection goes on serving."""
    import openai
    from _vllm import CONTINUE

    from semsoft_plugin.engines import openai as sopenai

    client = openai.OpenAI(base_url=fit_server, api_key="none", max_retries=0)
    want = fits["probe"].probs(fits["hidden"])
    request = sopenai.openai_request(SENTIMENT, extra_body=CONTINUE, fit="sentiment")
    for i, messages in enumerate(PROMPTS):
        response = client.chat.completions.create(model="smollm2", messages=messages, **request)
        probs = sopenai.openai_label_probs(response, request, checkpoint)
        np.testing.assert_allclose([probs[label] for label in SENTIMENT], want[i], atol=1e-3)
        assert response.choices[0].message.content.strip() == max(probs, key=probs.__getitem__)
    refused = {
        "nowhere": "is not a fit this engine serves",
        "topics": "fitted for the labels",
        "other_model": "output layer has sha256",
        "truncated": "refused at load",
    }
    for name, message in refused.items():
        bad = sopenai.openai_request(SENTIMENT, extra_body=CONTINUE, fit="sentiment")
        bad["extra_body"]["vllm_xargs"]["semsoft_fit"] = name
        with pytest.raises(openai.BadRequestError, match=message):
            client.chat.completions.create(model="smollm2", messages=PROMPTS[0], **bad)
        again = client.chat.completions.create(model="smollm2", messages=PROMPTS[0], **request)
        assert sopenai.openai_label_probs(again, request, checkpoint)


SCRIPT = """
import json, sys
from vllm import LLM
from semsoft_plugin.engines import vllm as sv
from semsoft_plugin.engines.prompting import format_prompt
from semsoft_plugin.engines.vllm.reader_tables import EXTENSION, FIT_PROCESSOR

if __name__ == "__main__":
    checkpoint, prompts = sys.argv[1], json.loads(sys.argv[2])
    llm = LLM(checkpoint, logits_processors=[FIT_PROCESSOR], worker_extension_cls=EXTENSION,
              enforce_eager=True, max_logprobs=50, max_model_len=512, dtype="float32", seed=0)
    tokenizer = llm.get_tokenizer()
    inputs = [{"prompt_token_ids": tokenizer.encode(format_prompt(tokenizer, p)[0],
                                                    add_special_tokens=False)} for p in prompts]
    params = sv.sampling_params(["positive", "negative"], fit="sentiment")
    outs = llm.generate(inputs, params, use_tqdm=False)
    rows = [sv.label_scores(o, params, llm).probs for o in outs]
    print("ROWS " + json.dumps(rows))
"""


@pytest.mark.vllm
def test_offline_engine_in_its_own_process(checkpoint, fits, tmp_path) -> None:
    """vLLM's default offline mode (the engine core in another process): the fitted rows
    cross the process boundary through collective_rpc, equal to the hook probe's."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "offline.py"
    script.write_text(SCRIPT)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "SEMSOFT_FIT_DIR": str(fits["folder"]), "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
           "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
    done = subprocess.run([sys.executable, str(script), str(checkpoint), json.dumps(PROMPTS[:3])],
                          env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("ROWS ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    rows = json.loads(lines[0][len("ROWS ") :])
    want = fits["probe"].probs(fits["hidden"][:3])
    got = np.array([[row[label] for label in SENTIMENT] for row in rows])
    np.testing.assert_allclose(got, want, atol=1e-3)


# -- a fitted row, or a kept hidden state, belongs to one request ---------------------------


def _row(result: Any) -> np.ndarray:
    return np.array([result.probs[label] for label in SENTIMENT])


@pytest.mark.vllm
def test_each_request_reads_its_own_fitted_row_offline(fit_llm) -> None:
    """One prompt, one fit, in one `generate`: labels in opposite orders, a clean request
    beside a `logit_bias` one, a duplicate prompt under one `SamplingParams`. Each
    request reads its own row (within 1e-6 of the row sent alone), whatever else shares
    the batch; a second read of one output gives the same row."""
    prompt = _prompts(fit_llm)[:1]
    forward = sv.sampling_params(SENTIMENT, fit="sentiment")
    backward = sv.sampling_params(SENTIMENT[::-1], fit="sentiment")
    alone = _row(sv.label_scores(fit_llm.generate(prompt, forward, use_tqdm=False)[0],
                                 forward, fit_llm))  # fmt: skip
    assert alone.max() > 0.9  # a confident row: a swap would show as 1 - p
    outs = fit_llm.generate(prompt * 2, [forward, backward], use_tqdm=False)
    for out, params in zip(outs, (forward, backward), strict=True):
        result = sv.label_scores(out, params, fit_llm)
        np.testing.assert_allclose(_row(result), alone, atol=1e-6)
        assert out.outputs[0].text.strip() == result.label == SENTIMENT[int(alone.argmax())]
        np.testing.assert_array_equal(_row(sv.label_scores(out, params, fit_llm)), _row(result))

    clean = sv.sampling_params(SENTIMENT, fit="sentiment", mode="observe", max_tokens=1)
    biased = sv.sampling_params(SENTIMENT, fit="sentiment", mode="observe", max_tokens=1,
                                logit_bias={11: 3.0})  # fmt: skip
    for order in ([clean, biased], [biased, clean]):
        outs = fit_llm.generate(prompt * 2, order, use_tqdm=False)
        for out, params in zip(outs, order, strict=True):
            if params is clean:
                got = _row(sv.label_scores(out, params, fit_llm, check_text=False))
                np.testing.assert_allclose(got, alone, atol=1e-6)
            else:
                with pytest.raises(FitNotApplied, match="residual"):
                    sv.label_scores(out, params, fit_llm, check_text=False)

    twins = fit_llm.generate(prompt * 2, forward, use_tqdm=False)  # one SamplingParams
    rows = [_row(sv.label_scores(out, forward, fit_llm)) for out in twins]
    np.testing.assert_allclose(rows[0], alone, atol=1e-6)
    np.testing.assert_array_equal(rows[0], rows[1])


@pytest.mark.vllm
def test_a_duplicate_prompt_gets_its_own_hidden_state(fit_llm) -> None:
    """`classify_vllm(hidden=True)` gives each prompt its own row key: a prompt listed
    twice returns two equal hidden states (the first read took a shared one before)."""
    results = sv.classify_vllm(fit_llm, [PROMPTS[0], PROMPTS[0], PROMPTS[1]], SENTIMENT,
                               mode="observe", max_tokens=1, hidden=True)  # fmt: skip
    hidden = [r.hidden for r in results]
    assert all(h is not None and h.shape == (576,) for h in hidden)
    torch.testing.assert_close(hidden[0], hidden[1], rtol=0, atol=1e-6)
    assert not torch.allclose(hidden[0], hidden[2])


def test_a_row_key_is_minted_per_request_and_never_taken_from_a_server_client() -> None:
    """Each `sampling_params` call mints its own key (two requests that the processor
    cannot tell apart, such as two LoRA adapters, still keep two rows); a server
    client's key is refused; a fit request built by hand without one is refused."""
    from semsoft_plugin.core.request import KEY_ROW_KEY, parse_request
    from semsoft_plugin.engines.vllm.params import validate_params
    from semsoft_plugin.engines.vllm.reader_tables import fitted_key

    one, two = (sv.sampling_params(SENTIMENT, fit="sentiment") for _ in range(2))
    keys = [p.extra_args[KEY_ROW_KEY] for p in (one, two)]
    assert keys[0] != keys[1] and len(keys[0]) == 32
    prompt = list(range(1, 6))
    assert fitted_key(keys[0], "sentiment", prompt, []) != fitted_key(
        keys[1], "sentiment", prompt, []
    )
    # every request gets its own key: its one parse in a process is found by it
    assert len(sv.sampling_params(SENTIMENT).extra_args[KEY_ROW_KEY]) == 32
    with pytest.raises(ValueError, match="semsoft_row_key is minted by the server"):
        parse_request(dict(one.extra_args), server=True)
    for bad in ("x" * 32, 7, "ABCDEF" * 5 + "00"):
        with pytest.raises(ValueError, match="semsoft_row_key=.* must be 32 lower-case hex"):
            parse_request({**one.extra_args, KEY_ROW_KEY: bad})
    hand = SamplingParams(max_tokens=1, logprobs=50, extra_args={
        k: v for k, v in one.extra_args.items() if k != KEY_ROW_KEY})  # fmt: skip
    with pytest.raises(ValueError, match="needs its own semsoft_row_key"):
        validate_params(hand)


def test_rows_that_share_a_key_in_one_step_are_never_handed_across() -> None:
    """Two requests that share a row key and a prompt (one `SamplingParams` for both)
    but got different rows (a LoRA adapter the processor cannot see): neither row is
    kept for the other's reader; equal rows are kept once."""
    from semsoft_plugin.engines.vllm.reader_tables import _one_row

    row = {"probs": [0.9, 0.1], "residual": 0.01}
    assert _one_row(None, row, "f") is row
    assert _one_row(row, {"probs": [0.9 + 1e-9, 0.1], "residual": 0.02}, "f") is row
    refused = _one_row(row, {"probs": [0.2, 0.8], "residual": 0.01}, "f")
    assert "probs" not in refused and "shared one semsoft_row_key" in refused["reason"]


@pytest.mark.vllm
def test_concurrent_server_clients_each_get_their_own_fitted_row(fit_server, checkpoint) -> None:
    """Two clients, the same prompt and fit, labels in opposite orders, 24 concurrent
    rounds, both sending the same `X-Request-Id`; a clean client beside a `logit_bias`
    one: every response holds its own row, within 1e-6 of the row sent alone."""
    from concurrent.futures import ThreadPoolExecutor

    import openai
    from _vllm import CONTINUE

    from semsoft_plugin.engines import openai as sopenai

    client = openai.OpenAI(base_url=fit_server, api_key="none", max_retries=0)
    forward = sopenai.openai_request(SENTIMENT, extra_body=CONTINUE, fit="sentiment")
    backward = sopenai.openai_request(SENTIMENT[::-1], extra_body=CONTINUE, fit="sentiment")
    observe = sopenai.openai_request(SENTIMENT, extra_body=CONTINUE, fit="sentiment",
                                     mode="observe")  # fmt: skip
    same_id = {"X-Request-Id": "semsoft-shared-id"}

    def row(request: Any, **extra: Any) -> np.ndarray:
        response = client.chat.completions.create(
            model="smollm2", messages=PROMPTS[0], extra_headers=same_id, **request, **extra
        )
        probs = sopenai.openai_label_probs(response, request, checkpoint)
        return np.array([probs[label] for label in SENTIMENT])

    alone = row(forward)
    assert alone.max() > 0.9
    np.testing.assert_allclose(row(backward), alone, atol=1e-6)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(row, r) for _ in range(24) for r in (forward, backward)]
        for future in futures:
            np.testing.assert_allclose(future.result(), alone, atol=1e-6)

    def biased() -> None:
        with pytest.raises(FitNotApplied, match="residual"):
            row(observe, logit_bias={"11": 3.0})

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(f) for _ in range(8) for f in (lambda: row(observe), biased)]
        for future in futures:
            got = future.result()
            if got is not None:
                np.testing.assert_allclose(got, alone, atol=1e-6)


@pytest.mark.vllm
def test_the_server_refuses_what_cannot_carry_or_would_ignore_a_fit(fit_server) -> None:
    """Settings a fit makes meaningless, a client's own row key, a stream and a request
    without its token ids are each a 400 naming why; the connection goes on serving."""
    import openai
    from _vllm import CONTINUE

    from semsoft_plugin.engines import openai as sopenai

    client = openai.OpenAI(base_url=fit_server, api_key="none", max_retries=0)
    good = sopenai.openai_request(SENTIMENT, extra_body=CONTINUE, fit="sentiment")
    cases = {
        "semsoft_score_temperature": ("semsoft_score_temperature'\\] beside semsoft_fit", 2.0),
        "semsoft_semantic_weight": ("semsoft_semantic_weight'\\] beside semsoft_fit", 0.3),
        "semsoft_preset": ("semsoft_preset'\\] beside semsoft_fit", "pooled"),
        "semsoft_row_key": ("semsoft_row_key is minted by the server", "0" * 32),
    }
    for key, (message, value) in cases.items():
        bad = sopenai.openai_request(SENTIMENT, extra_body=CONTINUE, fit="sentiment")
        bad["extra_body"]["vllm_xargs"][key] = value
        with pytest.raises(openai.BadRequestError, match=message):
            client.chat.completions.create(model="smollm2", messages=PROMPTS[0], **bad)
    with pytest.raises(openai.BadRequestError, match="semsoft_fit with stream=true"):
        client.chat.completions.create(model="smollm2", messages=PROMPTS[0], stream=True, **good)
    quiet = sopenai.openai_request(SENTIMENT, extra_body=CONTINUE, fit="sentiment")
    quiet["extra_body"].pop("return_token_ids")
    with pytest.raises(openai.BadRequestError, match="semsoft_fit needs return_token_ids=true"):
        client.chat.completions.create(model="smollm2", messages=PROMPTS[0], **quiet)
    assert client.chat.completions.create(model="smollm2", messages=PROMPTS[0], **good)


@pytest.mark.vllm
def test_two_requests_that_differ_only_by_lora_adapter_keep_their_rows(
    fit_server, checkpoint
) -> None:
    """The processor cannot see a request's LoRA adapter; the row key the middleware mints
    per request keeps the base model's row and the adapter's apart, 12 concurrent rounds."""
    from concurrent.futures import ThreadPoolExecutor

    import openai
    from _vllm import CONTINUE

    from semsoft_plugin.engines import openai as sopenai

    client = openai.OpenAI(base_url=fit_server, api_key="none", max_retries=0)
    request = sopenai.openai_request(SENTIMENT, extra_body=CONTINUE, fit="sentiment")

    def row(model: str) -> np.ndarray:
        response = client.chat.completions.create(model=model, messages=PROMPTS[0], **request)
        probs = sopenai.openai_label_probs(response, request, checkpoint)
        return np.array([probs[label] for label in SENTIMENT])

    alone = {model: row(model) for model in ("smollm2", "tuned")}
    assert np.abs(alone["smollm2"] - alone["tuned"]).max() > 1e-3  # the adapter moves the row
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [(m, pool.submit(row, m)) for _ in range(12) for m in ("smollm2", "tuned")]
        for model, future in futures:
            np.testing.assert_allclose(future.result(), alone[model], atol=1e-6)
