"""The probe fitted through vLLM (issue 41): `Classifier(backend="vllm").fit` includes the
probe, its hidden state read back from the decision step's logits row inside the engine
(`h = W⁺ (z - b)`, each row judged by its residual) and taken from the engine's worker
through `collective_rpc` (the worker extension `FittedRows`: the one channel out of the
engine); Outlines on vLLM applies a saved probe the same way.

Checked on SmolLM2-135M in float32, on the 48 SST-2 rows of tests/data, against the same
fits on transformers (the hidden state from the hook): the probe's rows within 1e-2
(measured 1.3e-6), with no transformers model built while vLLM scores; in vLLM's default
offline mode (the engine core in its own process) too; the kept passes hold `h` (`[576]`
float32), never the vocabulary row; a row that is not `W h + b` is refused naming its
residual.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import _vllm  # noqa: F401  (the in-process engine's settings, before vLLM loads)
import numpy as np
import pytest
import torch
from conftest import TEST_DATA

vllm = pytest.importorskip("vllm")

from semsoft_plugin import Classifier  # noqa: E402
from semsoft_plugin.app.engine_settings import EngineSettings  # noqa: E402
from semsoft_plugin.app.pass_cache import PASSES, KeptPass, PassCache  # noqa: E402
from semsoft_plugin.core.fit_policy import FitPolicy  # noqa: E402
from semsoft_plugin.fit.fitting import FAMILY  # noqa: E402

pytestmark = [pytest.mark.slow]

MODEL = "smollm2-135m"
LABELS = ["negative", "positive"]
# The probe alone, adopted whenever it gains at all: these tests compare the engines'
# rows, not the rule. Margin 0, and no macro-F1 guard: on the 48 SST-2 rows the guard
# cannot show that the probe keeps macro-F1, so it would keep the default on both
# engines, and the rows compared would be the default's, not the probe's.
PROBE_POLICY = FitPolicy(family=("probe",), margin=0.0, f1_guard=False)
PROBE_ONLY = {"fit_policy": PROBE_POLICY, "cv": 4}


def _sst2() -> tuple[list[str], list[str]]:
    lines = (TEST_DATA / "sst2" / "dev.txt").read_text(encoding="utf-8").splitlines()
    rows = [line.split(" ", 1) for line in lines if line.strip()]
    return [text.strip() for _, text in rows], [LABELS[int(label)] for label, _ in rows]


@pytest.fixture(scope="module")
def hf_fit() -> Classifier:
    """The probe fitted on transformers (float32), the hidden state from the hook."""
    texts, y = _sst2()
    engine = EngineSettings(dtype="float32", batch_size=8)
    return Classifier(MODEL, labels=LABELS, engine=engine, **PROBE_ONLY).fit(texts, y)


@pytest.fixture
def without_extension(llm, monkeypatch) -> Any:
    """conftest's engine as if built without the worker extension (what
    `hidden_refusal` reads), for the refusals decided before any text is scored."""
    config = llm.llm_engine.vllm_config.parallel_config
    monkeypatch.setattr(config, "worker_extension_cls", "")
    return llm


def test_a_kept_pass_without_h_is_not_read_back_for_the_probe() -> None:
    """PASSES gives a pass to the probe only if it kept `h`, and `h` is `[H]`: what a
    pass costs is its top-k, its label scores and `h`, never a vocabulary row."""
    cache = PassCache()
    ids, top, labels = torch.arange(50), torch.zeros(50), torch.zeros(2)
    cache.put("plain", KeptPass(ids, top, labels))
    assert cache.get("plain", hidden=True) is None and cache.get("plain") is not None
    cache.put("probe", KeptPass(ids, top, labels, torch.zeros(576)))
    assert cache.get("probe", hidden=True).hidden.shape == (576,)
    assert cache.nbytes == 2 * (50 * 8 + 50 * 4 + 2 * 4) + 576 * 4


@pytest.mark.vllm
def test_a_probe_fitted_through_vllm_equals_one_fitted_through_transformers(
    llm, hf_fit, monkeypatch
) -> None:
    """Same texts, labels and settings: the probe adopted on both engines, its out-of-fold
    NLL and its rows within 1e-2; no transformers model is built while vLLM scores; each
    kept pass holds `h` (`[576]` float32), not the vocabulary row; the default family on
    vLLM includes the probe."""
    import transformers

    from semsoft_plugin.engines import models

    texts, y = _sst2()
    want = hf_fit.predict_proba(texts)

    def built(*_: object, **__: object) -> None:
        raise AssertionError("a transformers model was built while vLLM scored")

    monkeypatch.setattr(transformers.PreTrainedModel, "__init__", built)
    monkeypatch.setattr(models, "load", built)
    # The cache is process-wide: earlier tests' vLLM passes (kept without `h`) are not this
    # fit's, so start from an empty one and look only at what this fit kept.
    PASSES.clear()
    clf = Classifier(llm, labels=LABELS, **PROBE_ONLY).fit(texts, y)
    got = clf.predict_proba(texts)
    for fitted in (hf_fit, clf):
        assert fitted.fit_result_.procedure == "probe" and not fitted.fit_result_.kept_default
        assert fitted.fitted_correction_.procedure == "probe"
    nll = [f.fit_result_.procedures["probe"]["nll"] for f in (hf_fit, clf)]
    assert nll[0] == pytest.approx(nll[1], abs=1e-2)
    np.testing.assert_allclose(got, want, atol=1e-2)
    assert (got.argmax(1) == want.argmax(1)).all()
    vocab = llm.llm_engine.model_config.get_vocab_size()
    kept = [p for key, p in PASSES._entries.items() if key[2] == ("vllm",)]
    assert len(kept) >= len(texts)
    for p in kept:
        assert p.hidden.shape == (576,) and p.hidden.dtype == torch.float32
        assert max(t.numel() for t in (p.top_ids, p.top_logits, p.label_logits)) < vocab
    default = Classifier(llm, labels=LABELS, cv=4).fit(texts, y)
    assert set(default.fit_result_.procedures) == set(FAMILY)


@pytest.mark.vllm
def test_a_row_that_is_not_w_h_b_refuses_the_probe_naming_its_residual(
    llm, monkeypatch
) -> None:
    """The engine judges each row by its reconstruction residual; with a tolerance no
    float32 row meets (0), the fit is refused with the residual and the reason, never
    fitted on rows it could not read."""
    from semsoft_plugin.engines.vllm import processor, reader_tables

    def strict(keys: Any, picked: Any, inverse: Any, tolerance: float = 0.25) -> None:
        reader_tables.keep_hidden(keys, picked, inverse, 0.0)

    monkeypatch.setattr(processor, "keep_hidden", strict)
    texts, y = _sst2()
    fresh = [f"{text} !" for text in texts]  # not in PASSES: scored again
    with pytest.raises(
        ValueError,
        match=r"'probe' needs the decision step's hidden state: prompt \d+: the hidden state "
        r"cannot be read back.*reconstruction residual .* exceeds the tolerance 0.0.*leave "
        r"'probe' out of fit_family",
    ):
        Classifier(llm, labels=LABELS, **PROBE_ONLY).fit(fresh, y)


@pytest.mark.vllm
def test_an_engine_without_the_worker_extension_leaves_the_probe_out_or_refuses_it(
    without_extension,
) -> None:
    """A `vllm.LLM` given without `FittedRows` cannot return `h`: the default family
    leaves the probe out, a family naming it is refused before any text is scored."""
    texts, y = _sst2()
    with pytest.raises(ValueError, match=r"'probe' needs.*worker_extension_cls="):
        Classifier(without_extension, labels=LABELS, **PROBE_ONLY).fit(texts, y)
    default = Classifier(without_extension, labels=LABELS, cv=4).fit(texts[:16], y[:16])
    assert "probe" not in default.fit_result_.procedures


@pytest.mark.vllm
def test_vllm_structured_outputs_are_refused_with_a_hidden_read(llm) -> None:
    """Why Outlines' own route (vLLM's structured outputs) could not carry the probe:
    `GPUModelRunner.sample_tokens` applies the grammar bitmask before the sampler runs any
    logits processor, so the row would be masked; such a request is refused at admission,
    and the semsoft adapter's own label constraint leaves the row whole (h read back)."""
    from vllm.sampling_params import StructuredOutputsParams

    from semsoft_plugin.engines import vllm as sv

    with pytest.raises(ValueError, match="drop structured outputs"):
        sv.sampling_params(LABELS, mode="observe", max_tokens=1, hidden=True,
                           structured_outputs=StructuredOutputsParams(choice=LABELS))  # fmt: skip
    tokenizer = llm.get_tokenizer()
    prompt = {"prompt_token_ids": tokenizer.encode("Review: great fun. Sentiment:")}
    whole = sv.sampling_params(LABELS, mode="observe", max_tokens=1, hidden=True)
    out = llm.generate([prompt], whole, use_tqdm=False)
    assert sv.output_hidden(llm, out, whole, [0])[0].shape == (576,)
    with pytest.raises(ValueError, match="kept no hidden state"):  # taken: read once
        sv.output_hidden(llm, out, whole, [0])


@pytest.mark.vllm
def test_hidden_states_are_taken_in_chunks_that_the_worker_table_holds(llm, monkeypatch):
    """`classify_vllm(hidden=True)` sends `HIDDEN_CHUNK` prompts at a time and takes each
    chunk's rows from the worker's table before the next: the same `h` as one call, and
    nothing left behind in the table."""
    from semsoft_plugin.engines.vllm import batch, reader_tables

    texts = [f"Review: {text}\nSentiment:" for text in _sst2()[0][:5]]
    whole = batch.classify_vllm(llm, texts, LABELS, mode="observe", max_tokens=1, hidden=True)
    monkeypatch.setattr(batch, "HIDDEN_CHUNK", 2)
    before = len(reader_tables._TABLE)
    chunked = batch.classify_vllm(llm, texts, LABELS, mode="observe", max_tokens=1, hidden=True)
    assert len(reader_tables._TABLE) == before
    for a, b in zip(whole, chunked, strict=True):
        assert a.hidden.shape == (576,)
        np.testing.assert_allclose(b.hidden.numpy(), a.hidden.numpy(), atol=1e-5)


@pytest.mark.vllm
@pytest.mark.outlines
def test_outlines_on_vllm_applies_a_saved_probe_like_outlines_on_transformers(
    llm, hf_model, hf_fit, tmp_path
) -> None:
    """One fit file, one prompt: Outlines on vLLM (the probe on `h` read back from the
    row) gives Outlines on transformers' rows (the hook's `h`) within 1e-3, and the
    corrected argmax as the label; a sampling temperature with a correction, and the probe
    on an engine without the worker extension, are refused by name."""
    outlines = pytest.importorskip("outlines")
    from semsoft_plugin.core.config import SemsoftConfig
    from semsoft_plugin.engines.fit_identity import run_identity
    from semsoft_plugin.engines.outlines.fit import OUTLINES_PROMPT, load_fit
    from semsoft_plugin.fit.fitted import FittedCorrection, save_fitted

    correction = hf_fit.fitted_correction_
    path = tmp_path / "probe.json"
    made_on = run_identity(list(correction.labels), OUTLINES_PROMPT, MODEL)
    save_fitted(path, SemsoftConfig(), FittedCorrection("probe", correction.labels,
                                                        probe=correction.probe), made_on)  # fmt: skip
    choice = Literal["negative", "positive"]
    model, tokenizer = hf_model
    on_hf = load_fit(outlines.from_transformers(model, tokenizer), choice, path)
    on_vllm = load_fit(outlines.from_vllm_offline(llm), choice, path)
    texts = _sst2()[0][::12]
    for hf_row, vllm_row in zip(on_hf.batch(texts), on_vllm.batch(texts), strict=True):
        np.testing.assert_allclose([vllm_row.probs[n] for n in LABELS],
                                   [hf_row.probs[n] for n in LABELS], atol=1e-3)  # fmt: skip
        assert str(vllm_row) == str(hf_row) == max(LABELS, key=vllm_row.probs.__getitem__)
    with pytest.raises(ValueError, match="only greedy decoding is supported"):
        load_fit(outlines.from_vllm_offline(llm), choice, path, temperature=0.7)


@pytest.mark.vllm
@pytest.mark.outlines
def test_outlines_on_an_engine_without_the_worker_extension_refuses_the_probe(
    without_extension, hf_fit, tmp_path
) -> None:
    outlines = pytest.importorskip("outlines")
    from semsoft_plugin.core.config import SemsoftConfig
    from semsoft_plugin.engines.fit_identity import run_identity
    from semsoft_plugin.engines.outlines.fit import OUTLINES_PROMPT, load_fit
    from semsoft_plugin.fit.fitted import FittedCorrection, save_fitted

    correction = hf_fit.fitted_correction_
    path = tmp_path / "probe.json"
    made_on = run_identity(list(correction.labels), OUTLINES_PROMPT, MODEL)
    save_fitted(path, SemsoftConfig(), FittedCorrection("probe", correction.labels,
                                                        probe=correction.probe), made_on)  # fmt: skip
    with pytest.raises(ValueError, match=r"fitted_correction \(probe\).*worker_extension_cls"):
        load_fit(outlines.from_vllm_offline(without_extension), Literal["negative", "positive"],
                 path)  # fmt: skip


SCRIPT = """
import json, sys
from semsoft_plugin import Classifier
from semsoft_plugin.app.engine_settings import EngineSettings
from semsoft_plugin.core.fit_policy import FitPolicy

if __name__ == "__main__":
    texts, y, labels = json.loads(open(sys.argv[1]).read())
    args = dict(enforce_eager=True, max_model_len=512, dtype="float32", seed=0)
    # as in the test module (PROBE_POLICY): the rows compared are the probe's
    policy = FitPolicy(family=("probe",), margin=0.0, f1_guard=False)
    clf = Classifier("smollm2-135m", labels=labels, backend="vllm",
                     engine=EngineSettings(engine_args=args), fit_policy=policy,
                     cv=4).fit(texts, y)
    print("FIT " + json.dumps([clf.fit_result_.procedure, clf.predict_proba(texts).tolist()]))
"""


@pytest.mark.vllm
def test_the_probe_fitted_with_the_engine_in_its_own_process(hf_fit, tmp_path) -> None:
    """vLLM's default offline mode (the engine core in another process): the hidden
    states cross the process boundary through collective_rpc, and the probe fitted on
    them gives transformers' rows within 1e-2."""
    texts, y = _sst2()
    script, data = tmp_path / "fit.py", tmp_path / "data.json"
    script.write_text(SCRIPT)
    data.write_text(json.dumps([texts, y, LABELS]))
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
           "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # fmt: skip
    done = subprocess.run([sys.executable, str(script), str(data)], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("FIT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    procedure, rows = json.loads(lines[0][len("FIT ") :])
    assert procedure == "probe"
    np.testing.assert_allclose(np.array(rows), hf_fit.predict_proba(texts), atol=1e-2)


def _norm_weight(worker, delta):  # type: ignore[no-untyped-def]
    """Runs in the vLLM worker: add `delta` to one RMSNorm weight in place (None: report
    the weight's shape). A norm, because vLLM's CPU linear layers run from weights
    packed at load, which an edit of `weight` does not reach."""
    weight = worker.model_runner.get_model().model.layers[3].input_layernorm.weight
    if delta is not None:
        weight.data.add_(delta.to(weight.device, weight.dtype))
    return tuple(weight.shape)


@pytest.mark.vllm
def test_a_vllm_engine_whose_weights_changed_in_place_is_not_read_from_old_passes(llm) -> None:
    """The passes a vLLM-backed classifier keeps are read back only while the worker's
    weights are the ones that made them (read through the worker extension). Here, beside
    the other tests of the session engine `llm`, not in test_pass_cache.py: a test module
    that runs earlier would start that engine before the modules that build and delete
    engines of their own, whose teardown takes vLLM's process-wide state with it."""
    PASSES.clear()
    texts = ["A tender, funny and beautifully acted film.", "Dull, slow and far too long."]
    clf = Classifier(llm, labels=LABELS)
    before = clf.predict_proba(texts)
    (shape,) = llm.collective_rpc(_norm_weight, args=(None,))
    delta = 0.5 * torch.randn(shape, generator=torch.Generator().manual_seed(0))
    llm.collective_rpc(_norm_weight, args=(delta,))
    try:
        old = PASSES.resize(0)  # what a fresh process computes: nothing kept
        try:
            fresh = Classifier(llm, labels=LABELS).predict_proba(texts)
        finally:
            PASSES.resize(old)
        assert np.abs(fresh - before).max() > 1e-3
        np.testing.assert_allclose(clf.predict_proba(texts), fresh, atol=1e-6, rtol=0)
    finally:
        llm.collective_rpc(_norm_weight, args=(-delta,))
