"""``Classifier`` as a scikit-learn estimator (``BaseEstimator``, ``ClassifierMixin``):
``clone`` (sharing the weights), the parameters, ``Pipeline``, ``GridSearchCV`` with a
scorer, a named suite of scikit-learn's estimator checks on texts (clone invariance,
``set_params`` round trip, fit idempotence, rows summing to 1, unseen labels refused,
pickling), metadata routing, and labels as any ordered sequence."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("sklearn")

from _reviews import LABELS, NAMES, TEXTS  # noqa: E402
from sklearn.base import clone, is_classifier  # noqa: E402
from sklearn.metrics import accuracy_score, log_loss  # noqa: E402
from sklearn.model_selection import GridSearchCV, StratifiedKFold  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import FunctionTransformer  # noqa: E402

from semsoft_plugin.app import handles  # noqa: E402
from semsoft_plugin.app.classifier import Classifier, NotFittedError  # noqa: E402
from semsoft_plugin.app.engine_settings import EngineSettings  # noqa: E402
from semsoft_plugin.core.config import SemsoftConfig  # noqa: E402
from semsoft_plugin.core.fit_policy import FitPolicy  # noqa: E402
from semsoft_plugin.core.labels import label_names  # noqa: E402

MODEL = "smollm2-135m"
# float32 weights: in bf16 a row moves with its batch's padding (by up to .023 on this
# model), which the batch-invariance check below would see.
F32 = {"engine": EngineSettings(dtype="float32")}
Y = np.array(NAMES)
# fit() that only reads the labels: the search below varies the classifier's own settings.
FIXED = {"fit_policy": FitPolicy(family=())}


@pytest.fixture(scope="module")
def clf() -> Classifier:
    classifier = Classifier(MODEL, labels=LABELS, **F32)
    classifier.predict_proba(TEXTS[:1])  # loads the model (once per process)
    return classifier


def _weights(classifier: Classifier) -> object:
    """The torch module that holds the classifier's weights."""
    return classifier._scorer().loaded.model


# -- clone and the parameters -----------------------------------------------------


def test_clone_shares_the_weights_of_a_named_model(clf):
    loads = len(handles._LOADED)
    copy = clone(clf)
    assert copy is not clf and copy.get_params() == clf.get_params()
    assert "_runtime" not in vars(copy)  # nothing derived is copied, and nothing fitted
    assert _weights(copy) is _weights(clf)  # the same module: no second load, no deep copy
    assert len(handles._LOADED) == loads
    np.testing.assert_array_equal(copy.predict_proba(TEXTS[:2]), clf.predict_proba(TEXTS[:2]))


def test_clone_shares_a_loaded_model_by_reference(clf):
    """A loaded model given as the parameter: scikit-learn's own clone would deep-copy it
    (``clone(param, safe=False)``); ``__sklearn_clone__`` passes it by reference."""
    loaded = clf._scorer().loaded
    given = Classifier(
        loaded.model, loaded.tokenizer, LABELS, config=SemsoftConfig(semantic_weight=0.5)
    )
    copy = clone(given)
    assert copy.model is loaded.model and copy.tokenizer is loaded.tokenizer
    assert copy.get_params()["config__semantic_weight"] == 0.5
    assert copy.labels == LABELS and copy.labels is not given.labels  # the rest is copied


def test_get_params_set_params_round_trip(clf):
    params = clf.get_params(deep=False)
    assert set(params) == set(Classifier._get_param_names())
    assert len(params) <= 12
    assert {"model", "labels", "config", "engine", "fit_policy", "cv"} <= set(params)
    assert Classifier(**params).get_params(deep=False) == params  # stored unchanged
    other = clone(clf)
    given = SemsoftConfig()
    other.set_params(config=given)
    assert other.set_params(config__semantic_weight=1.0, config__score_temperature=0.5) is other
    assert given.semantic_weight == 0.0  # the value passed is never changed in place
    assert other.get_params()["config__semantic_weight"] == 1.0
    assert other._scorer().config.semantic_weight == 1.0
    assert other._scorer().config.score_temperature == 0.5
    with pytest.raises(
        ValueError, match="Invalid parameter 'semantic_wieght' for estimator Classifier"
    ):
        other.set_params(semantic_wieght=0.5)
    with pytest.raises(ValueError, match="SemsoftConfig has no field 'semantic_wieght'"):
        other.set_params(config__semantic_wieght=0.5)
    # A parameter set after use takes effect: what was derived from the old one is dropped.
    other.set_params(labels=["good", "bad"])
    assert list(other.classes_) == ["bad", "good"]
    assert other.predict_proba(TEXTS[:1]).shape == (1, 2)


def test_the_pool_weight_and_temperature_change_the_probabilities(clf):
    low = clone(clf).set_params(config__semantic_weight=0.0).predict_proba(TEXTS[:4])
    high = clone(clf).set_params(config__semantic_weight=1.0).predict_proba(TEXTS[:4])
    hot = clone(clf).set_params(config__semantic_weight=0.0, config__score_temperature=4.0)
    hot = hot.predict_proba(TEXTS[:4])
    assert np.abs(low - high).max() > 1e-3
    assert (np.abs(hot - 0.5) < np.abs(low - 0.5)).all()  # a higher temperature flattens


def test_settings_are_checked_where_used_not_in_init():
    bad = Classifier(MODEL, labels=LABELS, calibrate="mean", cv=1, **F32)  # no error yet
    assert bad.calibrate == "mean"
    with pytest.raises(ValueError, match="calibrate='mean' must be one of"):
        bad.predict(TEXTS[:1])
    with pytest.raises(ValueError, match="cv=1 must be an int >= 2, a splitter"):
        bad.set_params(calibrate=None).fit(TEXTS, Y)
    with pytest.raises(ValueError, match="prompt=3 must be a PromptTemplate"):
        Classifier(MODEL, labels=LABELS, prompt=3).predict(TEXTS[:1])
    # The settings values check their own fields when built (frozen: never half-valid).
    with pytest.raises(ValueError, match=r"EngineSettings\(batch_size=0\)"):
        EngineSettings(batch_size=0)
    with pytest.raises(ValueError, match=r"FitPolicy\(margin=-1\.0\)"):
        FitPolicy(margin=-1.0)
    with pytest.raises(ValueError, match="tokenizer=str is given with the model named"):
        Classifier(MODEL, "a tokenizer", LABELS).predict(TEXTS[:1])


def test_fit_keeps_the_parameters_and_sets_trailing_underscore_attributes(clf):
    """scikit-learn's fit checks on texts (``check_estimators_fit_returns_self``,
    ``check_estimators_overwrite_params``, ``check_dont_overwrite_parameters``,
    ``check_dict_unchanged``, ``check_fit_idempotent``), which it runs on numbers only."""
    import joblib

    est = clone(clf).set_params(fit_policy=FitPolicy(grid={"semantic_weight": (0.0, 1.0)}), cv=3)
    before = {name: joblib.hash(value) for name, value in est.get_params().items()}
    public = set(vars(est))
    assert est.fit(TEXTS, Y) is est
    assert {name: joblib.hash(value) for name, value in est.get_params().items()} == before
    added = set(vars(est)) - public - {"_runtime"}
    assert added == {"_fitted"}  # the fitted state, one object the classifier asks
    assert {"labels_", "fitted_config_", "fit_result_", "fitted_correction_"} <= set(dir(est))
    assert est.fitted_config_ == est.fit_result_.config
    assert est.fit_result_.fitted.semantic_weight in (0.0, 1.0)
    first = est.predict_proba(TEXTS)
    state = {k: v for k, v in vars(est).items() if k != "_runtime"}
    est.predict(TEXTS[:3])
    assert {k: v for k, v in vars(est).items() if k != "_runtime"} == state
    np.testing.assert_allclose(est.fit(TEXTS, Y).predict_proba(TEXTS), first, atol=1e-12)


def test_rows_do_not_depend_on_the_batch_or_its_order(clf):
    """``check_methods_subset_invariance`` and ``check_methods_sample_order_invariance``
    on texts."""
    whole = clf.predict_proba(TEXTS)
    parts = np.vstack([clf.predict_proba(TEXTS[i : i + 5]) for i in range(0, len(TEXTS), 5)])
    np.testing.assert_allclose(parts, whole, atol=1e-5)
    order = np.random.default_rng(0).permutation(len(TEXTS))
    np.testing.assert_allclose(
        clf.predict_proba([TEXTS[i] for i in order]), whole[order], atol=1e-5
    )


def test_pickle_holds_the_parameters_not_the_weights(clf):
    """``check_estimators_pickle`` on texts: a pickled classifier is its parameters (a
    worker process loads the named model once), and predicts the same."""
    fitted = clone(clf).set_params(**FIXED).fit(TEXTS, Y)
    blob = pickle.dumps(fitted)
    assert len(blob) < 20_000
    back = pickle.loads(blob)
    assert back.fitted_config_ == fitted.fitted_config_
    np.testing.assert_array_equal(back.predict_proba(TEXTS[:3]), fitted.predict_proba(TEXTS[:3]))


# -- Pipeline and GridSearchCV -----------------------------------------------------


def test_pipeline(clf):
    strip = FunctionTransformer(lambda texts: [t.strip() for t in texts])
    pipe = make_pipeline(strip, clone(clf).set_params(**FIXED))
    padded = [f"  {t}  " for t in TEXTS[:4]]
    assert pipe.fit(padded, Y[:4]) is pipe
    np.testing.assert_allclose(pipe.predict_proba(padded), clf.predict_proba(TEXTS[:4]), atol=1e-6)
    assert pipe.score(padded, Y[:4]) == accuracy_score(Y[:4], clf.predict(TEXTS[:4]))
    pipe.set_params(classifier__config__semantic_weight=1.0)
    assert pipe[-1].config.semantic_weight == 1.0
    copy = clone(pipe)
    assert _weights(copy[-1]) is _weights(clf)


def test_grid_search_over_the_pool_weight_with_a_scorer(clf):
    loads = len(handles._LOADED)
    grid = [0.0, 0.5, 1.0]
    folds = StratifiedKFold(n_splits=3)
    base = clone(clf).set_params(**FIXED)
    search = GridSearchCV(base, {"config__semantic_weight": grid}, scoring="neg_log_loss", cv=folds)
    assert is_classifier(base)
    search.fit(TEXTS, Y)
    assert len(handles._LOADED) == loads  # every candidate and fold shared the one model
    assert _weights(search.best_estimator_) is _weights(clf)
    # The scorer read predict_proba's columns as classes_ says: the scores by hand.
    expected = []
    for weight in grid:
        probs = clone(base).set_params(config__semantic_weight=weight).predict_proba(TEXTS)
        losses = [
            -log_loss(Y[test], probs[test], labels=clf.classes_)
            for _, test in folds.split(TEXTS, Y)
        ]
        expected.append(np.mean(losses))
    np.testing.assert_allclose(search.cv_results_["mean_test_score"], expected, rtol=1e-5)
    assert np.ptp(expected) > 1e-4  # the weight mattered to the score
    best = grid[int(np.argmax(expected))]
    assert search.best_params_ == {"config__semantic_weight": best}
    assert search.best_estimator_.fitted_config_.semantic_weight == best


def test_grid_search_over_the_fit_policy(clf):
    """A field of the fit's policy reaches each candidate's fit: its result records it."""
    base = clone(clf).set_params(fit_policy=FitPolicy(family=("temperature", "offset")), cv=3)
    search = GridSearchCV(base, {"fit_policy__margin": [0.0, 2.0]}, scoring="neg_log_loss", cv=2)
    search.fit(TEXTS, Y)
    assert len(search.cv_results_["mean_test_score"]) == 2
    best = search.best_estimator_
    assert best.fit_result_.policy.margin == search.best_params_["fit_policy__margin"]
    assert best.fit_result_.policy.family == ("temperature", "offset")
    assert base.fit_policy.margin == 1.0  # the base's own value is untouched


def test_cv_takes_a_splitter(clf, tmp_path):
    """`cv` as scikit-learn's: an int (stratified folds drawn with the policy's seed) or a
    splitter, whose folds the rule scores on; a splitter that leaves items out is refused."""
    policy = FitPolicy(family=("temperature",))
    by_int = clone(clf).set_params(fit_policy=policy, cv=3).fit(TEXTS, Y)
    split = StratifiedKFold(3, shuffle=True, random_state=0)
    by_splitter = clone(clf).set_params(fit_policy=policy, cv=split).fit(TEXTS, Y)
    assert by_int.fit_result_.n_folds == by_splitter.fit_result_.n_folds == 3
    # the same folds (the int draws StratifiedKFold(shuffle=True, random_state=seed)'s):
    assert by_int.fitted_config_ == by_splitter.fitted_config_
    # the fit file records the policy the fit ran under (its family resolved)
    from semsoft_plugin.fit.fitted import read_fit

    by_int.save_fit(tmp_path / "fit.json")
    assert read_fit(tmp_path / "fit.json").policy == by_int.fit_result_.policy
    assert by_int.fit_result_.policy.family == ("temperature",)

    class HalfHeldOut:
        def split(self, x, y=None):
            yield np.arange(len(x) // 2, len(x)), np.arange(len(x) // 2)

        def get_n_splits(self, *args):
            return 1

    with pytest.raises(ValueError, match=r"holds out \d+ of \d+ items"):
        clone(clf).set_params(fit_policy=policy, cv=HalfHeldOut()).fit(TEXTS, Y)


def test_moved_parameters_are_refused_naming_their_place():
    with pytest.raises(TypeError, match=r"'semantic_weight': it moved to config=SemsoftConfig"):
        Classifier(MODEL, labels=LABELS, semantic_weight=0.5)
    with pytest.raises(TypeError, match=r"'n_folds': it moved to cv"):
        Classifier(MODEL, labels=LABELS, n_folds=3)
    with pytest.raises(TypeError, match=r"'batch_size': it moved to engine=EngineSettings"):
        Classifier(MODEL, labels=LABELS, batch_size=4)
    with pytest.raises(TypeError, match=r"'fit_family': it moved to fit_policy=FitPolicy\(family"):
        Classifier(MODEL, labels=LABELS, fit_family=())


# -- the estimator suite on texts ----------------------------------------------------
# scikit-learn's check_estimator feeds numbers; these are its checks that apply to a text
# classifier, on texts, by name.


def test_it_is_a_scikit_learn_estimator(clf):
    from sklearn.base import BaseEstimator, ClassifierMixin

    assert isinstance(clf, BaseEstimator) and isinstance(clf, ClassifierMixin)
    html = clf._repr_html_()
    assert "Classifier" in html and "smollm2-135m" in html
    deep = clf.get_params(deep=True)
    assert set(deep) >= set(clf.get_params(deep=False))
    assert deep["engine__dtype"] == "float32"  # a nested field, as GridSearchCV reaches it


def test_clone_invariance(clf):
    copy = clone(clf)
    assert copy.get_params() == clf.get_params() and type(copy) is type(clf)
    assert not hasattr(copy, "fitted_config_")  # an unfitted copy
    np.testing.assert_array_equal(copy.predict_proba(TEXTS[:4]), clf.predict_proba(TEXTS[:4]))


def test_set_params_round_trip(clf):
    est = clone(clf)
    nested = (
        ("config__semantic_weight", 0.3),
        ("config__k", 20),
        ("fit_policy__family", ("offset",)),
    )
    for name, value in nested:
        assert est.set_params(**{name: value}) is est
        assert est.get_params()[name] == value
    assert clone(est).get_params() == est.get_params()
    assert Classifier(**est.get_params(deep=False)).get_params() == est.get_params()


def test_fit_is_idempotent(clf):
    est = clone(clf).set_params(fit_policy=FitPolicy(family=("temperature",)), cv=3)
    first = est.fit(TEXTS, Y).predict_proba(TEXTS)
    config = est.fitted_config_
    second = est.fit(TEXTS, Y).predict_proba(TEXTS)
    assert est.fitted_config_ == config
    np.testing.assert_array_equal(first, second)


def test_predict_proba_rows_sum_to_one(clf):
    for weight in (0.0, 0.3, 1.0):
        probs = clone(clf).set_params(config__semantic_weight=weight).predict_proba(TEXTS)
        assert probs.shape == (len(TEXTS), 2) and probs.dtype == np.float64
        np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-12)
        assert np.isfinite(probs).all() and (probs >= 0).all()


def test_unseen_labels_are_refused(clf):
    est = clone(clf)
    with pytest.raises(ValueError, match="'neutral', which is not a label"):
        est.fit(TEXTS[:4], ["positive", "negative", "neutral", "positive"])
    assert not hasattr(est, "fitted_config_")  # refused before anything was fitted


def test_pickling_round_trips_predictions(clf):
    est = clone(clf).set_params(fit_policy=FitPolicy(family=("temperature",)), cv=3).fit(TEXTS, Y)
    back = pickle.loads(pickle.dumps(est))
    assert back.fitted_config_ == est.fitted_config_ and back.get_params() == est.get_params()
    np.testing.assert_array_equal(back.predict_proba(TEXTS), est.predict_proba(TEXTS))


def test_the_real_tags_say_texts():
    from sklearn.utils import get_tags

    tags = get_tags(Classifier(MODEL, labels=LABELS))
    assert tags.estimator_type == "classifier" and tags.input_tags.string
    assert not tags.input_tags.two_d_array and not tags.requires_fit
    assert get_tags(Classifier(MODEL)).requires_fit  # labels=None: they come from fit


def test_import_of_the_package_needs_no_sklearn():
    """``import semsoft_plugin`` is torch-only; ``Classifier`` is exported lazily and its
    module imports scikit-learn."""
    code = (
        "import sys, semsoft_plugin; assert 'sklearn' not in sys.modules, 'sklearn imported'; "
        "from semsoft_plugin import Classifier; assert 'sklearn' in sys.modules; "
        "assert Classifier.__module__ == 'semsoft_plugin.app.classifier'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_metadata_routing_passes_sample_weight(clf):
    """With scikit-learn's metadata routing on, ``sample_weight`` given to a search reaches
    ``fit`` once the estimator requests it."""
    import sklearn
    from sklearn.model_selection import cross_validate

    seen = []

    class Recording(Classifier):
        def fit(self, texts, y=None, sample_weight=None):  # type: ignore[no-untyped-def]
            seen.append(None if sample_weight is None else list(sample_weight))
            return super().fit(texts, y, sample_weight=sample_weight)

    weights = np.arange(1, len(TEXTS) + 1, dtype=float)
    with sklearn.config_context(enable_metadata_routing=True):
        est = Recording(MODEL, labels=LABELS, **FIXED, **F32)
        est.set_fit_request(sample_weight=True).set_score_request(sample_weight=False)
        cross_validate(est, TEXTS, Y, cv=2, params={"sample_weight": weights})
    assert len(seen) == 2 and all(s is not None and len(s) == len(TEXTS) // 2 for s in seen)


# -- labels: any ordered sequence -------------------------------------------------


def test_labels_as_any_ordered_sequence():
    y = np.array(["negative", "positive", "negative"])
    assert label_names(np.unique(y)) == ["negative", "positive"]
    assert label_names({"positive": 1, "negative": 0}.keys()) == ["positive", "negative"]
    assert all(type(name) is str for name in label_names(np.unique(y)))
    for unordered in ({"positive", "negative"}, frozenset({"positive", "negative"})):
        with pytest.raises(ValueError, match="which has no order"):
            label_names(unordered)
    with pytest.raises(ValueError, match="one-dimensional"):
        label_names(np.array([["positive", "negative"]]))
    with pytest.raises(ValueError, match="label 0 is not a string"):
        label_names(np.array([0, 1]))


def test_a_classifier_takes_another_estimators_classes(clf):
    want = clf.predict_proba(TEXTS[:3])
    for labels in (np.unique(Y), clf.classes_, dict.fromkeys(LABELS).keys()):
        other = Classifier(MODEL, labels=labels, **F32)
        assert list(other.classes_) == sorted(LABELS)
        got = other.predict_proba(TEXTS[:3])
        # the prompt lists the labels in their given order, so only the same order scores alike
        if list(labels) == LABELS:
            np.testing.assert_allclose(got, want, atol=1e-12)
        assert got.shape == (3, 2) and np.allclose(got.sum(1), 1)


def test_labels_from_fit(clf):
    est = Classifier(MODEL, **FIXED, **F32)
    with pytest.raises(NotFittedError, match="labels=None"):
        est.predict(TEXTS[:1])
    assert not hasattr(est, "classes_")
    est.fit(TEXTS, Y)
    assert list(est.classes_) == list(np.unique(Y)) and est.labels_ == ("negative", "positive")
    with pytest.raises(ValueError, match=r"y\[0\] = 1 is a int, not a label name"):
        Classifier(MODEL, **FIXED, **F32).fit(TEXTS[:2], [1, 0])


@pytest.mark.slow
def test_a_vllm_classifier_clones_and_searches_on_one_engine(llm):
    """A ``vllm.LLM`` given as the model: clones and search candidates use that engine
    (no second engine), and the rows match the transformers classifier's in float32."""
    base = Classifier(llm, None, LABELS, **FIXED)
    copy = clone(base)
    assert copy.model is llm and copy._scorer().loaded.backend == "vllm"
    search = GridSearchCV(
        base, {"config__semantic_weight": [0.0, 1.0]}, scoring="neg_log_loss", cv=2
    )
    search.fit(TEXTS[:8], Y[:8])
    assert search.best_estimator_.model is llm
    want = Classifier(MODEL, labels=LABELS, **F32).predict_proba(TEXTS[:4])
    np.testing.assert_allclose(copy.predict_proba(TEXTS[:4]), want, atol=2e-3)
