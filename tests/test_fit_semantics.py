"""What ``Classifier.fit`` does and refuses (issues 42 and 43 on the Python side): a fit
that can fit nothing, a member with nothing to fit and an inert ``fit_grid`` are refused;
a parameter the user fixed is kept; two labels and enough items per fold are checked
(in the core, so ``semsoft tune`` has the same check) before any scoring; texts are an
ordered sequence; one name per concept (``backend="transformers"``,
``fit_score_temperature``); ``sample_weight`` is a weighted NLL."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")

from _reviews import LABELS, NAMES, TEXTS  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402

from semsoft_plugin.app.classifier import Classifier  # noqa: E402
from semsoft_plugin.app.engine_settings import EngineSettings  # noqa: E402
from semsoft_plugin.app.pass_cache import PASSES  # noqa: E402
from semsoft_plugin.core.config import SemsoftConfig  # noqa: E402
from semsoft_plugin.core.fit_policy import FitPolicy  # noqa: E402
from semsoft_plugin.engines import hf  # noqa: E402
from semsoft_plugin.fit import fit_family, fitting, folds  # noqa: E402

MODEL = "smollm2-135m"
F32 = {"engine": EngineSettings(dtype="float32")}
Y = list(NAMES)


@pytest.fixture
def no_scoring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any forward pass fails the test: each refusal comes before the work."""

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a text was scored before the refusal")

    monkeypatch.setattr(hf, "classify", refuse)
    PASSES.clear()


def _clf(**params: object) -> Classifier:
    return Classifier(MODEL, labels=LABELS, **F32, **params)  # type: ignore[arg-type]


# -- refused before any scoring ----------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"fit_policy": FitPolicy(family=("offset",), grid={}, fit_score_temperature=False)},
         r"fit_policy.grid=\{\} is what the member 'grid' searches, which "
         r"fit_policy.family=\('offset',\) leaves out"),
        ({"fit_policy": FitPolicy(family=("temperature",), fit_score_temperature=False)},
         "names 'temperature', but fit_policy.fit_score_temperature=False: there is no "
         "temperature to fit"),
        ({"fit_policy": FitPolicy(family=("grid",), grid={}, fit_score_temperature=False)},
         "names 'grid', but the grid is empty and fit_policy.fit_score_temperature=False"),
        ({"fit_policy": FitPolicy(grid={"score_temperature": [1.0, 2.0]})},
         "fit_policy.grid cannot search score_temperature"),
        ({"cv": 0}, "cv=0 must be an int >= 2"),
        ({"cv": 1}, "cv=1 must be an int >= 2"),
        ({"cv": "5"}, "cv='5' must be an int >= 2, a splitter or an iterable"),
    ],
)  # fmt: skip
def test_a_fit_that_cannot_fit_is_refused_before_scoring(no_scoring, params, match) -> None:
    with pytest.raises(ValueError, match=match):
        _clf(**params).fit(TEXTS, Y)


def test_one_label_and_too_few_items_are_refused_before_scoring(no_scoring) -> None:
    with pytest.raises(ValueError, match="at least two labels \\(classes\\) among its items; all 10 are 'positive'"):
        _clf().fit(TEXTS[:10], ["positive"] * 10)
    with pytest.raises(ValueError, match=r"at least 4 labelled items \(2 folds of 2\), got 3"):
        _clf().fit(TEXTS[:3], Y[:3])
    with pytest.raises(ValueError, match="sample_weight.2. = -1.0 must be a finite number >= 0"):
        _clf().fit(TEXTS[:4], Y[:4], sample_weight=[1, 1, -1, 1])
    with pytest.raises(ValueError, match="all 4 are .positive."):  # zero weights drop items
        _clf().fit(TEXTS[:8], Y[:8], sample_weight=[1, 0, 1, 0, 1, 0, 1, 0])


def test_the_core_fit_refuses_the_same_so_semsoft_tune_does() -> None:
    """``semsoft tune`` fits through ``fit_family.fit_from_grid`` -> ``fitting.fit_probs``,
    which run the same check on their targets."""
    probs = np.full((2, 10, 2), 0.5)
    configs = [SemsoftConfig(), SemsoftConfig(semantic_weight=1.0)]
    with pytest.raises(ValueError, match="all 10 are 0"):
        fit_family.fit_from_grid(probs, configs[:1], configs[0], np.zeros(10, dtype=int))
    with pytest.raises(ValueError, match="n_folds=1 must be an integer >= 2"):
        fitting.fit_probs(probs[:1], probs[1], np.arange(10) % 2, n_folds=1)
    with pytest.raises(ValueError, match="10 items cannot fill 20 folds: give at least 20"):
        folds.stratified_folds(np.arange(10) % 2, 20)
    with pytest.raises(ValueError, match="n_folds=0 must be an integer >= 2"):
        folds.stratified_folds(np.arange(10) % 2, 0)  # not "need at least 0 items for 0 folds"


@pytest.mark.parametrize(
    ("texts", "name"),
    [({"a": "A fine film.", "b": "A dull film."}, "dict"), ({"A fine film.", "A dull film."}, "set"),
     ((t for t in TEXTS), "generator")],
)  # fmt: skip
def test_texts_must_be_an_ordered_sequence(no_scoring, texts, name) -> None:
    for method in ("predict_proba", "predict"):
        with pytest.raises(ValueError, match=f"1-D numpy array or pandas Series of strings, not a {name}"):
            getattr(_clf(), method)(texts)
    with pytest.raises(ValueError, match=f"not a {name}"):
        _clf().fit(texts, ["positive", "negative"])


def test_one_name_per_concept() -> None:
    with pytest.raises(ValueError, match="backend='hf' is now spelled 'transformers'"):
        Classifier(MODEL, labels=LABELS, backend="hf").predict(TEXTS[:1])
    with pytest.raises(TypeError, match=r"'fit_temperature': it moved to fit_policy=FitPolicy\(fit_score_temperature"):
        Classifier(MODEL, labels=LABELS, fit_temperature=False)
    assert "fit_policy__fit_score_temperature" in Classifier(fit_policy=FitPolicy()).get_params()


# -- what the policy leaves out of the search is kept ---------------------------------------


@pytest.mark.slow
def test_a_pool_weight_the_grid_leaves_out_is_kept_by_fit_and_by_a_search() -> None:
    """The config is the fit's start; a field the policy's grid does not search is kept
    (`FitPolicy(grid={})`: only a temperature on the start's weight), so a `GridSearchCV`
    value of `config__semantic_weight` is the value scored."""
    pytest.importorskip("pandas")
    import pandas as pd

    keep = FitPolicy(grid={})
    start = SemsoftConfig(semantic_weight=0.3)
    clf = _clf(config=start, fit_policy=keep, cv=3).fit(pd.Series(TEXTS, index=range(100, 112)), Y)
    assert clf.fitted_config_.semantic_weight == 0.3
    assert all("semantic_weight" not in e for e in clf.fit_result_.in_sample)  # not searched
    assert clf.fit_result_.fitted.semantic_weight == 0.3
    search = GridSearchCV(_clf(cv=3, fit_policy=FitPolicy(family=("temperature", "offset"))),
                          {"config__semantic_weight": [0.0, 1.0]}, cv=2)  # fmt: skip
    search.fit(np.array(TEXTS), Y)
    for weight in (0.0, 1.0):
        fitted = _clf(cv=3, config=SemsoftConfig(semantic_weight=weight), fit_policy=keep)
        assert fitted.fit(TEXTS, Y).fitted_config_.semantic_weight == weight
    assert search.best_estimator_.fitted_config_.semantic_weight == search.best_params_[
        "config__semantic_weight"
    ]


# -- sample_weight: a weighted NLL ---------------------------------------------------------


def _grid_probs(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 3
    logits = rng.normal(size=(n, 3)) + 2.5 * np.eye(3)[y]
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return p[None], y


def test_core_integer_weights_fit_as_the_items_repeated() -> None:
    probs, y = _grid_probs(0, 30)
    weights = (np.arange(30) % 3) + 1
    repeat = np.repeat(np.arange(30), weights)
    policy = FitPolicy(family=("temperature",))
    options = {"policy": policy, "single": {"temperature": 0}, "n_folds": 3}
    _, t_w, _, stats_w = fitting.fit_probs(probs, probs[0], y, sample_weight=weights, **options)
    _, t_r, _, stats_r = fitting.fit_probs(probs[:, repeat], probs[0][repeat], y[repeat], **options)
    assert t_w == pytest.approx(t_r, abs=1e-6) and t_w != pytest.approx(1.0, abs=1e-3)
    assert stats_w["scores"] == pytest.approx(stats_r["scores"], abs=1e-9)
    assert stats_w["nll_start"] == pytest.approx(stats_r["nll_start"], abs=1e-12)
    unweighted = fitting.fit_probs(probs, probs[0], y, **options)[1]
    assert abs(unweighted - t_w) > 1e-4  # the weights mattered


@pytest.mark.slow
def test_integer_weights_give_the_repeated_datas_fit() -> None:
    weights = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    repeat = np.repeat(np.arange(len(TEXTS)), weights)
    est = {"fit_policy": FitPolicy(family=("temperature",), margin=0.0), "cv": 3}
    weighted = _clf(**est).fit(TEXTS, Y, sample_weight=weights)
    repeated = _clf(**est).fit([TEXTS[i] for i in repeat], [Y[i] for i in repeat])
    t_w = weighted.fit_result_.fitted.score_temperature
    t_r = repeated.fit_result_.fitted.score_temperature
    assert t_w == pytest.approx(t_r, abs=1e-6)
    plain = _clf(**est).fit(TEXTS, Y).fit_result_.fitted.score_temperature
    assert abs(plain - t_w) > 1e-4  # the weights mattered


@pytest.mark.slow
def test_zero_weights_equal_dropping_the_items() -> None:
    weights = [1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0]
    keep = [i for i, w in enumerate(weights) if w]
    est = {"fit_policy": FitPolicy(family=("temperature",)), "cv": 3}
    weighted = _clf(**est).fit(TEXTS, Y, sample_weight=weights)
    dropped = _clf(**est).fit([TEXTS[i] for i in keep], [Y[i] for i in keep])
    assert weighted.fitted_config_ == dropped.fitted_config_
    assert weighted.fit_result_.to_dict() == dropped.fit_result_.to_dict()
    np.testing.assert_array_equal(weighted.predict_proba(TEXTS), dropped.predict_proba(TEXTS))
