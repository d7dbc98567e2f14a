"""The ``probe`` method: logistic regression on the decision step's hidden state, kept in
the forward passes by the transformers backend (old caches extended on request)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _probe import fit_plain, zero_label_rows

from semsoft_eval import probe
from semsoft_plugin.fit import probe as app_probe
from semsoft_plugin.fit.probe import CS, fit_probe
from semsoft_plugin.fit.temperature_scaling import nll


def _features(n: int, signal: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three labels; 40 features, the first three carrying ``signal`` times the label."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    x = rng.normal(size=(n, 40))
    x[np.arange(n), y] += signal
    return x, y


def test_the_probe_learns_a_signal_and_stays_near_the_prior_without_one() -> None:
    fold_ids = np.arange(90) % 5
    x, y = _features(90, 3.0, 0)
    probs, choices = probe.cross_fit_probe(x, y, fold_ids, 3, label_rows=zero_label_rows(x, 3))
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-9)
    assert (probs.argmax(1) == y).mean() > 0.8 and nll(probs, y).mean() < 0.5
    assert all(c["C"] in CS for c in choices)
    x, y = _features(90, 0.0, 1)
    probs, choices = probe.cross_fit_probe(x, y, fold_ids, 3, label_rows=zero_label_rows(x, 3))
    assert nll(probs, y).mean() < np.log(3) + 0.1  # no signal: about the uniform prior
    assert min(c["C"] for c in choices) <= 1e-2  # the inner folds chose a strong penalty


def test_the_probe_is_out_of_fold_and_gives_unseen_labels_a_floor() -> None:
    x, y = _features(60, 2.0, 2)
    y[:2] = 3  # a fourth label with two items, both in fold 0
    fold_ids = np.r_[0, 0, np.arange(58) % 3]
    probs, _ = probe.cross_fit_probe(x, y, fold_ids, 5, label_rows=zero_label_rows(x, 5))
    for fold in range(3):
        held = fold_ids == fold
        want = fit_plain(x[~held], y[~held], 5).probs(x[held])
        np.testing.assert_allclose(probs[held], want)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-9)
    # label 4 is never seen, label 3 only in fold 0: the add-one floor where unseen
    for fold in range(3):
        held = fold_ids == fold
        floor = 1 / (int((~held).sum()) + 5)
        np.testing.assert_allclose(probs[held, 4], floor)
        assert (probs[held, 3] == floor).all() == (fold == 0)


def _label_data(n: int, seed: int, extra: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hidden states, label rows `W_L` and labels drawn from `softmax(2 W_L h)`; with
    `extra`, a third of the items relabelled 3 and marked by `extra` in a direction the
    label rows do not read."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 30))
    rows = rng.normal(size=(4, 30)) * 0.3
    rows[:, -1] = 0.0  # the direction `extra` writes to
    logits = 2.0 * x @ rows.T
    y = np.array([rng.choice(4, p=np.exp(r - r.max()) / np.exp(r - r.max()).sum()) for r in logits])
    if extra:
        marked = rng.random(n) < 1 / 3
        y[marked] = 3
        x[marked, -1] += extra
    return x, rows, y


def test_without_a_signal_beyond_the_label_logits_the_probe_keeps_its_ranking() -> None:
    """Labels drawn from the label rows' own scores: the probe is the label logits with a
    temperature, so it names their label and scores no worse than they do."""
    x, rows, y = _label_data(240, 0, 0.0)
    train, test = np.arange(120), np.arange(120, 240)
    fitted = fit_probe(x[train], y[train], 4, label_rows=rows)
    probs = fitted.probs(x[test])
    own = x[test] @ rows.T
    assert (probs.argmax(1) == own.argmax(1)).mean() >= 0.95
    own_probs = np.exp(own - own.max(1, keepdims=True))
    own_probs /= own_probs.sum(1, keepdims=True)
    assert nll(probs, y[test]).mean() <= nll(own_probs, y[test]).mean() + 0.05
    # and a plain probe on the same 120 items cannot find those 30 directions as well
    plain = fit_plain(x[train], y[train], 4).probs(x[test])
    assert nll(probs, y[test]).mean() < nll(plain, y[test]).mean()


def test_a_signal_the_label_rows_miss_is_learnt() -> None:
    x, rows, y = _label_data(240, 1, 4.0)
    train, test = np.arange(120), np.arange(120, 240)
    probs = fit_probe(x[train], y[train], 4, label_rows=rows).probs(x[test])
    own = x[test] @ rows.T
    third = y[test] == 3
    assert (probs.argmax(1) == 3)[third].mean() > (own.argmax(1) == 3)[third].mean() + 0.3
    assert (probs.argmax(1) == y[test]).mean() > (own.argmax(1) == y[test]).mean() + 0.1


def test_the_label_rows_fold_into_one_linear_map_and_the_span_is_exact(monkeypatch) -> None:
    """`LinearProbe.probs` is `softmax(beta W_L h + A x + c)` of the fit, and fitting in
    the training rows' span (N < H) gives the fit of the whole space."""
    x, rows, y = _label_data(40, 2, 2.0)  # 40 rows, 30 features
    x = np.c_[x, np.random.default_rng(5).normal(size=(40, 30))]  # now 60 features > 40 rows
    rows = np.c_[rows, np.zeros((4, 30))]
    monkeypatch.setattr(app_probe, "CS", (0.05,))
    fitted = fit_probe(x, y, 4, label_rows=rows)
    assert fitted.strength == 0.05
    standard = (x - fitted.mean) / fitted.scale
    whole = app_probe._fit_anchored(standard, x @ rows.T, y, np.ones(40), 0.05)
    z = whole.scores(standard, x @ rows.T)
    want = np.exp(z - z.max(1, keepdims=True))
    np.testing.assert_allclose(fitted.probs(x), want / want.sum(1, keepdims=True), atol=1e-5)


def test_the_span_falls_back_to_the_classic_svd_where_numpys_does_not_converge(monkeypatch) -> None:
    """LAPACK's divide-and-conquer SVD can fail on finite rows (200 hidden states of
    Qwen2.5-Coder-1.5B did); the probe is then fitted on the classic driver's span, and
    it is the same probe."""
    x, rows, y = _label_data(40, 2, 2.0)
    want = fit_probe(x, y, 4, label_rows=rows).probs(x)

    def no_convergence(*args: object, **kwargs: object) -> None:
        raise np.linalg.LinAlgError("SVD did not converge")

    monkeypatch.setattr(np.linalg, "svd", no_convergence)
    np.testing.assert_allclose(fit_probe(x, y, 4, label_rows=rows).probs(x), want, atol=1e-6)


def test_the_probe_refuses_an_rows_of_another_shape() -> None:
    x, rows, y = _label_data(40, 3, 0.0)
    with pytest.raises(ValueError, match=r"label_rows of shape \(4, 29\).*\[4, 30\]"):
        fit_probe(x, y, 4, label_rows=rows[:, :29])


@pytest.fixture(scope="module")
def float32_backend(default_checkpoint):
    from semsoft_eval.backend_factory import as_backend
    from semsoft_plugin.engines import models

    model, tokenizer = models.load(str(default_checkpoint), dtype="float32")
    return as_backend(model, tokenizer)


@pytest.mark.slow
def test_kept_hidden_states_are_the_last_layers_at_the_decision_step(
    float32_backend, tmp_path
) -> None:
    from semsoft_eval.preparation import prepare
    from semsoft_plugin.engines.prompting import encode_prompts, format_prompt

    prepared = prepare("smollm2-135m", "sst2", limit=24, cache_dir=tmp_path, progress=False,
                       loaded=float32_backend, batch_size=5)  # fmt: skip
    hidden = prepared.forward.hidden
    assert hidden is not None and hidden.dtype == torch.float32
    assert tuple(hidden.shape) == (24, prepared.model.config.hidden_size)
    model, tokenizer = prepared.model, prepared.tokenizer
    for i in (0, 7, 23):  # alone, unpadded, against output_hidden_states
        ids = torch.tensor(
            encode_prompts(tokenizer, [format_prompt(tokenizer, prepared.inputs[i])])
        )
        with torch.inference_mode():
            out = model(input_ids=ids, output_hidden_states=True)
        torch.testing.assert_close(hidden[i], out.hidden_states[-1][0, -1].float(),
                                   atol=2e-3, rtol=1e-4)  # fmt: skip
    assert not torch.allclose(hidden[0], hidden[7])


@pytest.mark.slow
def test_probe_on_kept_passes_and_an_old_cache_without_hidden_states(
    float32_backend, tmp_path
) -> None:
    from semsoft_eval.evaluate import evaluate
    from semsoft_eval.forward import Forward
    from semsoft_eval.methods import DEFAULT_METHODS, MethodInputs, score_methods
    from semsoft_eval.preparation import prepare
    from semsoft_plugin.core.config import SemsoftConfig

    assert "probe" not in DEFAULT_METHODS
    options = {"limit": 40, "cache_dir": tmp_path, "progress": False, "loaded": float32_backend}
    prepared = prepare("smollm2-135m", "sst2", **options)
    cache = prepared.cache_file
    assert cache is not None and prepared.forward.hidden is not None
    # An old cache: the same passes without the hidden states.
    old = prepared.forward
    old.hidden = None
    old.save(cache)
    loaded = Forward.load(cache)
    assert loaded.hidden is None
    inputs = MethodInputs(
        loaded, prepared.embeddings, prepared.labels, prepared.data.targets, SemsoftConfig(),
        SemsoftConfig.preset("paper"), np.arange(40) % 5,
    )  # fmt: skip
    with pytest.raises(ValueError, match="method 'probe' needs the decision step's hidden"):
        score_methods(["probe"], inputs)
    # Asking for the probe extends the cache; the other passes are the cache's own.
    report = evaluate("smollm2-135m", "sst2", methods=["constrained", "temperature", "probe"],
                      n_bootstrap=0, **options)  # fmt: skip
    extended = Forward.load(cache)
    assert extended.hidden is not None and torch.equal(extended.top_ids, loaded.top_ids)
    row = report["methods"]["probe"]
    assert 0 <= row["accuracy"] <= 1 and np.isfinite(row["nll"]) and row["nll"] > 0
    # What the method scored is the out-of-fold probe on the kept hidden states.
    inputs.forward = extended
    probs = score_methods(["probe"], inputs)["probe"].probs
    rows = app_probe.label_logit_rows(prepared.embeddings, prepared.labels)
    want, _ = probe.cross_fit_probe(extended.hidden.numpy(), prepared.data.targets,
                                    np.arange(40) % 5, 2, label_rows=rows)  # fmt: skip
    np.testing.assert_allclose(probs, want)
