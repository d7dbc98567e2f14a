"""The few-label fit: temperature math, folds, the rule that keeps the default,
``Classifier.fit`` on a real model, and its config file round trip into a vLLM request."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from semsoft_plugin.core.config import SemsoftConfig  # noqa: E402
from semsoft_plugin.core.fit_policy import FitPolicy  # noqa: E402
from semsoft_plugin.core.kept_scores import grid_probs  # noqa: E402
from semsoft_plugin.core.softmax import semantic_softmax_details  # noqa: E402
from semsoft_plugin.fit import fitting, folds, label_offsets  # noqa: E402
from semsoft_plugin.fit.temperature_scaling import (  # noqa: E402
    LOG_T_BOUNDS,
    apply_temperature,
    fit_temperature,
    nll,
)

LABELS = ["positive", "negative"]


def _softmax(z: np.ndarray) -> np.ndarray:
    return apply_temperature(z, 1.0)


def _sample(probs: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([rng.choice(probs.shape[1], p=p) for p in probs])


# -- temperature math -------------------------------------------------------------------


def test_fit_temperature_recovers_the_generating_temperature() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=(3000, 5)) * 2.0
    y = _sample(_softmax(z), 1)
    assert fit_temperature(z * 2.5, y) == pytest.approx(2.5, rel=0.08)
    assert fit_temperature(z / 3.0, y) == pytest.approx(1 / 3.0, rel=0.08)


def test_fit_temperature_finds_scipys_optimum() -> None:
    optimize = pytest.importorskip("scipy.optimize")
    rng = np.random.default_rng(3)
    z = rng.normal(size=(400, 4)) * 3.0
    y = rng.integers(0, 4, size=400)
    t = fit_temperature(z, y)

    def loss(log_t: float) -> float:
        return float(nll(apply_temperature(z, np.exp(log_t)), y).mean())

    found = optimize.minimize_scalar(
        loss, bounds=LOG_T_BOUNDS, method="bounded", options={"xatol": 1e-9}
    )
    assert np.log(t) == pytest.approx(found.x, abs=1e-4)
    assert loss(np.log(t)) <= found.fun + 1e-9


def test_apply_temperature_invariants() -> None:
    rng = np.random.default_rng(2)
    p = _softmax(rng.normal(size=(20, 6)) * 4)
    log_p = np.log(p)
    np.testing.assert_allclose(apply_temperature(log_p, 1.0), p, atol=1e-12)
    for t in (0.1, 0.7, 3.0):
        q = apply_temperature(log_p, t)
        np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-12)
        assert (np.argsort(q, 1) == np.argsort(p, 1)).all()  # order kept
        # T > 1 flattens (the top label loses), T < 1 sharpens
        assert ((q.max(1) < p.max(1)) if t > 1 else (q.max(1) > p.max(1))).all()
    np.testing.assert_allclose(apply_temperature(log_p, 1e9), 1 / 6, atol=1e-6)


def test_core_temperature_is_the_last_step_on_every_row() -> None:
    """The core's ``temperature`` is ``apply_temperature`` of its T=1 output, fallback
    rows included: what the fit computes is what every adapter applies."""
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(40, 8, generator=gen)
    logits = torch.randn(3, 40, generator=gen) * 3
    # A row whose kept tokens vote for no label (k=1 on a token far from both): fallback.
    logits[2, 7] = 50.0
    ids = [3, 5]
    cfg = SemsoftConfig(k=1, tau=0.99, vote="shared", center=False, semantic_weight=1.0)
    plain = semantic_softmax_details(logits, emb, ids, cfg)
    assert bool(plain.fallback[2])
    for t in (0.3, 2.0):
        hot = semantic_softmax_details(logits, emb, ids, cfg.replace(score_temperature=t))
        want = apply_temperature(np.log(plain.probs.double().numpy()), t)
        np.testing.assert_allclose(hot.probs.double().numpy(), want, atol=1e-5)
    default = SemsoftConfig()
    base = semantic_softmax_details(logits, emb, ids, default).probs.double().numpy()
    hot = semantic_softmax_details(logits, emb, ids, default.replace(score_temperature=0.5))
    np.testing.assert_allclose(
        hot.probs.double().numpy(), apply_temperature(np.log(base), 0.5), atol=1e-5
    )


def test_stratified_folds_are_scikit_learns() -> None:
    pytest.importorskip("sklearn")
    import warnings

    from sklearn.model_selection import KFold, StratifiedKFold

    rng = np.random.default_rng(0)
    for trial in range(25):
        y = rng.integers(0, int(rng.integers(2, 7)), size=int(rng.integers(12, 90)))
        k = int(rng.integers(2, 6))
        counts = np.bincount(y)
        counts = counts[counts > 0]
        split = KFold if counts.min() < k else StratifiedKFold
        want = np.empty(len(y), dtype=np.int64)
        for fold, (_, held) in enumerate(
            split(k, shuffle=True, random_state=trial).split(np.zeros(len(y)), y)
        ):
            want[held] = fold
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = folds.stratified_folds(y, k, trial)
        assert (got == want).all(), trial


# -- the rule ------------------------------------------------------------------------


def _grid_of(start_logits: np.ndarray) -> np.ndarray:
    """Grid entries that differ from the start: pulled toward another distribution."""
    other = np.random.default_rng(9).normal(size=start_logits.shape) * 2
    return np.stack([_softmax((1 - a) * start_logits + a * other) for a in (0.0, 0.2, 0.5, 1.0)])


def test_labels_without_evidence_keep_the_defaults_decisions_and_nearly_its_scores() -> None:
    """Labels drawn from the default's own distribution (100 labels): the default is right.
    The grid (a weight and a temperature per fold) must not replace it; the temperature,
    the rule's floor, is adopted, near 1, and costs at most 2 / N nats of expected NLL
    under the true distribution (a one-parameter fit's excess risk is about 1 / (2 N)).
    Without the temperature in the family, the default is kept."""
    z = np.random.default_rng(4).normal(size=(100, 4)) * 3
    start = _softmax(z)
    grid = _grid_of(z)
    entropy = (start * -np.log(start)).sum(1).mean()
    for seed in range(8):
        y = _sample(start, seed)
        entry, t, kept, stats = fitting.fit_probs(
            grid, start, y, single={"temperature": 0}, policy=FitPolicy(random_state=seed)
        )
        assert not kept and stats["procedure"] == "temperature", (seed, stats["procedures"])
        assert entry == 0 and 0.8 < t < 1.25, (seed, t)
        fitted = fitting.fitted_probs(grid, start, entry, t, kept, stats["offset"])
        assert (start * -np.log(fitted)).sum(1).mean() - entropy < 2 / len(y), seed
        _, _, kept, stats = fitting.fit_probs(
            grid, start, y, single={"temperature": 0},
            policy=FitPolicy(random_state=seed, family=("grid",)),
        )  # fmt: skip
        assert kept, (seed, stats["procedures"])


def test_fit_adopts_a_real_improvement_and_finds_its_temperature() -> None:
    """The same default, over-confident by a factor 3: the fit replaces it, picks the
    start's own weight and a temperature near 3."""
    z = np.random.default_rng(4).normal(size=(150, 4)) * 3
    start = _softmax(z)
    y = _sample(_softmax(z / 3), 0)
    entry, t, kept, stats = fitting.fit_probs(_grid_of(z), start, y, single={"temperature": 0})
    assert not kept and entry == 0
    assert t == pytest.approx(3.0, rel=0.35)
    assert stats["gain"] > stats["gain_se"] > 0


def test_fit_refuses_bad_input() -> None:
    grid = np.full((2, 6, 3), 1 / 3)
    with pytest.raises(ValueError, match="label indices"):
        fitting.fit_probs(grid, grid[0], np.array([0, 1, 2, 3, 0, 1]))
    with pytest.raises(ValueError, match="at least 4"):
        fitting.fit_probs(grid[:, :3], grid[0, :3], np.array([0, 1, 2]))


_BOOL, _NUMBER = "must be True or False", "must be a finite number >= 0"
_FAMILY, _SEED = "must be a sequence of member names or None", "must be an integer >= 0"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("fit_score_temperature", "yes", f"FitPolicy(fit_score_temperature='yes'): {_BOOL}"),
        ("temperature_floor", 1, f"FitPolicy(temperature_floor=1): {_BOOL}"),
        ("f1_guard", "no", f"FitPolicy(f1_guard='no'): {_BOOL}"),
        ("succession", None, f"FitPolicy(succession=None): {_BOOL}"),
        ("margin", -1, f"FitPolicy(margin=-1): {_NUMBER}"),
        ("f1_z", float("nan"), f"FitPolicy(f1_z=nan): {_NUMBER}"),
        ("f1_z", True, f"FitPolicy(f1_z=True): {_NUMBER}"),
        ("f1_tolerance", float("inf"), f"FitPolicy(f1_tolerance=inf): {_NUMBER}"),
        ("family", "grid", f"FitPolicy(family='grid'): {_FAMILY}"),
        ("family", ("grid", 3), f"FitPolicy(family=('grid', 3)): {_FAMILY}"),
        ("grid", [("semantic_weight", (0.5,))],
         "FitPolicy(grid=[('semantic_weight', (0.5,))]): must be a mapping field -> values or None"),
        ("file_strength", 2.0, "file_strength=2.0 must be 'auto' or a number in [0, 1]"),
        ("random_state", -1, f"FitPolicy(random_state=-1): {_SEED}"),
        ("random_state", 1.5, f"FitPolicy(random_state=1.5): {_SEED}"),
    ],
)  # fmt: skip
def test_fit_policy_refuses_bad_values_by_name(field: str, value: object, message: str) -> None:
    import re

    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        FitPolicy(**{field: value})


def test_two_policies_fit_side_by_side_in_two_threads() -> None:
    """The rule is the policy passed, not module state: on labels drawn from the start
    the floor decides (on: the temperature is adopted; off: the start is kept), and fits
    under both policies running at once in two threads each give what their policy gives
    alone."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    z = np.random.default_rng(4).normal(size=(100, 4)) * 3
    start, grid = _softmax(z), _grid_of(z)
    y = _sample(start, 0)
    policies = (FitPolicy(), FitPolicy(temperature_floor=False))

    def fit(policy: FitPolicy) -> tuple:
        return fitting.fit_probs(grid, start, y, single={"temperature": 0}, policy=policy)

    alone = [fit(policy) for policy in policies]
    assert alone[0][2] is False and alone[0][3]["procedure"] == "temperature"
    assert alone[1][2] is True  # the same labels without the floor: the start is kept
    together = Barrier(2)

    def in_step(policy: FitPolicy) -> list[tuple]:
        out = []
        for _ in range(3):
            together.wait()
            out.append(fit(policy))
        return out

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(in_step, policies))
    for policy, want, got in zip(policies, alone, runs, strict=True):
        for result in got:
            assert result == want, policy


# -- the bias corrections (label_offsets) ------------------------------------------------


def _offset_data(n: int, offset: np.ndarray, temperature: float, seed: int):
    """Base log-probabilities, and labels drawn from softmax(base / T + offset)."""
    z = np.random.default_rng(seed).normal(size=(n, len(offset))) * 2
    base = np.log(_softmax(z))
    return base, _sample(_softmax(base / temperature + offset), seed + 1)


def _centred(b) -> np.ndarray:
    b = np.asarray(b, dtype=np.float64)
    return b - b.mean()


def test_fit_offset_recovers_a_known_offset_and_temperature() -> None:
    truth = np.array([1.0, -0.5, 0.0, -0.5])
    base, y = _offset_data(4000, truth, 1.0, 0)
    t, b = label_offsets.fit_offset(base, y, 1e-4)
    assert t == pytest.approx(1.0, abs=0.06)
    np.testing.assert_allclose(_centred(b), truth, atol=0.12)
    assert abs(b.sum()) < 1e-3  # the ridge fixes the constant a softmax ignores
    base, y = _offset_data(4000, truth, 2.0, 1)
    t, b = label_offsets.fit_offset(base, y, 1e-4)
    assert t == pytest.approx(2.0, rel=0.08)
    np.testing.assert_allclose(_centred(b), truth, atol=0.12)


def test_fit_offset_finds_scipys_optimum() -> None:
    optimize = pytest.importorskip("scipy.optimize")
    base, y = _offset_data(300, np.array([0.5, -1.0, 0.2]), 1.5, 3)
    strength = 0.05
    t, b = label_offsets.fit_offset(base, y, strength)

    def loss(theta: np.ndarray) -> float:
        p = label_offsets.apply_offset(base, 1.0 / theta[0], theta[1:])
        return float(nll(p, y).mean() + 0.5 * strength * theta[1:] @ theta[1:])

    found = optimize.minimize(loss, np.r_[1.0, np.zeros(3)], method="BFGS", options={"gtol": 1e-9})
    assert loss(np.r_[1 / t, b]) <= found.fun + 1e-9
    np.testing.assert_allclose(np.r_[1 / t, b], found.x, atol=1e-4)


def test_inner_folds_choose_a_weak_penalty_for_an_offset_and_a_strong_one_for_none() -> None:
    base, y = _offset_data(400, np.array([1.5, -1.0, 0.0, -0.5]), 1.0, 5)
    _, b, strength = label_offsets.fit_offset_cv(base, y)
    assert strength <= 0.1 and np.abs(_centred(b)).max() > 1.0
    base, y = _offset_data(400, np.zeros(4), 1.0, 6)
    _, b, strength = label_offsets.fit_offset_cv(base, y)
    assert np.abs(b).max() < 0.25


BASE_GRID = {"temperature": 0}


def _grid_with_base(base: np.ndarray) -> np.ndarray:
    return np.concatenate([_softmax(base)[None], _grid_of(base)[1:]])


def test_the_fit_finds_a_known_label_offset() -> None:
    """300 items: with 150 this offset's macro-F1 gain (+.025) is within the guard's noise
    (standard error .048), and the guard stops it."""
    truth = np.array([1.5, -0.5, 0.0, -1.0])
    base, y = _offset_data(300, truth, 1.0, 10)
    start = _softmax(base)
    entry, t, kept, stats = fitting.fit_probs(
        _grid_with_base(base), start, y, single=BASE_GRID, bias=label_offsets.MEMBERS,
        content_free=start[:3],
    )  # fmt: skip
    assert not kept and stats["procedure"] == "offset" and entry == 0
    np.testing.assert_allclose(_centred(stats["offset"]), truth, atol=0.5)
    assert t == pytest.approx(1.0, abs=0.3)
    # what the outcome gives on items is softmax(base / T + offset)
    np.testing.assert_allclose(
        fitting.fitted_probs(_grid_with_base(base), start, entry, t, kept, stats["offset"]),
        label_offsets.apply_offset(base, t, stats["offset"]),
    )


def test_the_fit_with_the_bias_members_still_finds_a_known_temperature() -> None:
    base, y = _offset_data(500, np.zeros(4), 3.0, 12)
    start = _softmax(base)
    _, t, kept, stats = fitting.fit_probs(
        _grid_with_base(base), start, y, single=BASE_GRID, bias=label_offsets.MEMBERS,
        content_free=start[:3],
    )  # fmt: skip
    assert not kept
    assert t == pytest.approx(3.0, rel=0.2)
    assert t == pytest.approx(fit_temperature(base, y), rel=0.03)  # what scaling alone finds
    assert stats["offset"] is None or np.abs(_centred(stats["offset"])).max() < 0.5


def _prompt_biased(n: int, seed: int):
    """Labels from softmax(truth); the model's scores carry a prompt bias ``c`` on top."""
    truth = np.random.default_rng(seed).normal(size=(n, 4)) * 2.5
    bias = np.array([0.55, 0.25, 0.15, 0.05])
    return np.log(_softmax(truth + np.log(bias))), _sample(_softmax(truth), seed + 1), bias


def test_the_fit_finds_batch_calibration() -> None:
    base, y, _ = _prompt_biased(200, 20)
    start = _softmax(base)
    entry, t, kept, stats = fitting.fit_probs(
        _grid_with_base(base), start, y, single=BASE_GRID, bias=("batch",)
    )
    assert not kept and stats["procedure"] == "batch"
    want = -np.log(start.mean(0))  # the mean of the fitted rows
    np.testing.assert_allclose(_centred(stats["offset"]), _centred(want) / t, atol=1e-9)


def test_the_fit_finds_contextual_calibration() -> None:
    base, y, bias = _prompt_biased(200, 30)
    start = _softmax(base)
    content_free = np.stack([bias, bias])  # content-free inputs that read the bias exactly
    _, t, kept, stats = fitting.fit_probs(
        _grid_with_base(base), start, y, single=BASE_GRID, bias=("contextual",),
        content_free=content_free,
    )  # fmt: skip
    assert not kept and stats["procedure"] == "contextual"
    np.testing.assert_allclose(_centred(stats["offset"]) * t, _centred(-np.log(bias)), atol=1e-9)
    assert t == pytest.approx(1.0, abs=0.3)


def test_the_whole_family_keeps_the_defaults_decisions_on_its_own_labels() -> None:
    """Labels drawn from the start itself: no member that changes a decision replaces
    it; the fit stays at its floor, the temperature."""
    z = np.random.default_rng(4).normal(size=(100, 4)) * 3
    start = _softmax(z)
    content_free = _softmax(np.random.default_rng(5).normal(size=(3, 4)))
    adopted = []
    for seed in range(10):
        _, _, keep, stats = fitting.fit_probs(
            _grid_of(z), start, _sample(start, seed), single={"temperature": 0},
            policy=FitPolicy(random_state=seed), bias=label_offsets.MEMBERS,
            content_free=content_free,
        )  # fmt: skip
        assert set(stats["procedures"]) == {"grid", "temperature", *label_offsets.MEMBERS}
        adopted.append("kept" if keep else stats["procedure"])
    assert adopted.count("temperature") >= 8, adopted


def test_the_bias_members_refuse_what_they_cannot_fit() -> None:
    grid = _grid_of(np.random.default_rng(0).normal(size=(12, 3)))
    y = np.arange(12) % 3
    with pytest.raises(ValueError, match="unknown bias member 'vector'"):
        fitting.fit_probs(grid, grid[0], y, single=BASE_GRID, bias=("vector",))
    with pytest.raises(ValueError, match="'contextual' needs content_free"):
        fitting.fit_probs(grid, grid[0], y, single=BASE_GRID, bias=("contextual",))
    with pytest.raises(ValueError, match=r"single\['temperature'\]"):
        fitting.fit_probs(grid, grid[0], y, bias=("offset",))
    with pytest.raises(ValueError, match="strength=0"):
        label_offsets.fit_offset(np.log(grid[0]), y, 0)


def test_cross_fit_applies_each_folds_offset() -> None:
    truth = np.array([1.5, -0.5, 0.0, -1.0])
    base, y = _offset_data(120, truth, 1.0, 40)
    grid, start = _grid_with_base(base), _softmax(base)
    fold_ids = np.arange(120) % 3
    probs, choices = fitting.cross_fit(grid, start, y, fold_ids, single=BASE_GRID, bias=("offset",))
    for fold, choice in enumerate(choices):
        held = fold_ids == fold
        entry, t, keep, stats = fitting.fit_probs(
            grid[:, ~held], start[~held], y[~held], single=BASE_GRID, bias=("offset",)
        )
        assert choice["procedure"] == stats["procedure"] and choice["offset"] == stats["offset"]
        want = fitting.fitted_probs(grid[:, held], start[held], entry, t, keep, stats["offset"])
        np.testing.assert_allclose(probs[held], want)
    assert any(c["procedure"] == "offset" and not c["kept_default"] for c in choices)


# -- a real model -----------------------------------------------------------------------


def _sst2(n: int) -> tuple[list[str], list[str]]:
    from semsoft_eval.data import load_builtin, sample

    data = sample(load_builtin("sst2"), n, 0)
    return list(data.texts), [data.labels[i] for i in data.targets]


@pytest.fixture(scope="module")
def fitted(default_checkpoint):
    from semsoft_plugin import Classifier
    from semsoft_plugin.engines import models

    model, tokenizer = models.load(str(default_checkpoint), dtype="float32")
    texts, y = _sst2(40)
    family = ("grid", "temperature", "offset", "batch", "contextual")  # the probe: test_fit_family
    from semsoft_plugin.app.engine_settings import EngineSettings
    from semsoft_plugin.core.fit_policy import FitPolicy

    policy = FitPolicy(margin=0.0, family=family)
    clf = Classifier(model, tokenizer, sorted(set(y)), engine=EngineSettings(batch_size=8), fit_policy=policy)
    assert clf.fit(texts, y) is clf
    return clf, texts, y


@pytest.mark.slow
def test_fit_on_a_small_real_set_picks_a_valid_config(fitted) -> None:
    clf, texts, _ = fitted
    cfg = clf.fitted_config_
    assert isinstance(cfg, SemsoftConfig) and clf.config is None  # the parameter is kept
    result = clf.fit_result_
    assert result.n == 40 and result.n_folds == 5
    assert result.fitted.semantic_weight in fitting.DEFAULT_WEIGHTS
    assert 0.05 <= result.fitted.score_temperature <= 20
    start = SemsoftConfig()
    # Only the fitted fields move; the rest is the start's.
    only = result.fitted.replace(semantic_weight=start.semantic_weight, score_temperature=1.0)
    assert only == start
    assert cfg == (start if result.kept_default else result.fitted)
    # The fit's own scores (compact grid over the kept pass) are what predict_proba gives.
    probs = clf.predict_proba(texts[:8])
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-9)
    scorer = clf._scorer()
    kept, _ = scorer.kept(clf.inputs(texts[:8]), cfg.k)
    mine, _ = grid_probs(kept, scorer.loaded.embeddings(), scorer.labels, [cfg])
    order = [list(clf.labels).index(c) for c in clf.classes_]
    if clf.fitted_correction_ is not None:  # a bias member's offset after the config
        assert clf.fitted_correction_.offset == tuple(result.offset)
        mine[0] = label_offsets.apply_offset(np.log(mine[0]), 1.0, result.offset)
    np.testing.assert_allclose(probs, mine[0][:, order], atol=2e-5)


@pytest.mark.slow
def test_fit_refuses_labels_it_does_not_know(fitted) -> None:
    clf, texts, y = fitted
    with pytest.raises(ValueError, match="'neutral', which is not a label"):
        clf.fit(texts[:4], ["neutral", *y[1:4]])
    with pytest.raises(ValueError, match="one label per text"):
        clf.fit(texts[:4], y[:3])


@pytest.mark.slow
@pytest.mark.vllm
def test_fit_round_trip_through_a_config_file_into_a_vllm_request(fitted, tmp_path) -> None:
    """The fitted setting (weight and temperature) saved, loaded, sent as a vLLM request's
    options (sampling_params -> extra_args -> parse_request) scores as transformers does."""
    pytest.importorskip("vllm")
    from vllm import LLM

    from semsoft_plugin import Classifier
    from semsoft_plugin.core.request import parse_request
    from semsoft_plugin.engines import vllm as sv
    from semsoft_plugin.engines.vllm import classify_vllm
    from semsoft_plugin.engines.vllm.params import sampling_params

    clf, texts, _ = fitted
    config = clf.fit_result_.fitted  # the fitted one even where the rule kept the start
    assert config.score_temperature != 1.0
    path = tmp_path / "fitted.json"
    config.save(path)
    loaded = SemsoftConfig.load(path)
    assert loaded == config
    labels = list(clf.labels)
    params = sampling_params(labels, config=loaded, mode="observe")
    parsed = parse_request(params.extra_args)
    assert parsed is not None and parsed.config == config

    llm = LLM(
        str(_checkpoint()),
        logits_processors=[sv.SemanticSoftmaxLogitsProcessor],
        enforce_eager=True, max_logprobs=loaded.k, max_model_len=512, seed=0, dtype="float32",
    )  # fmt: skip
    try:
        inputs = clf.inputs(texts[:6])
        results = classify_vllm(llm, inputs, labels, loaded, mode="observe", max_tokens=1)
    finally:
        del llm
    got = np.array([[r.probs[n] for n in labels] for r in results])
    want_clf = Classifier(clf.model, clf.tokenizer, labels, config=SemsoftConfig.load(path))
    want = want_clf.predict_proba(texts[:6])
    order = [list(want_clf.classes_).index(n) for n in labels]
    np.testing.assert_allclose(got, want[:, order], atol=2e-3)
    # and the temperature acted: the default scores differ
    plain = Classifier(clf.model, clf.tokenizer, labels).predict_proba(texts[:6])
    assert np.abs(plain - want).max() > 1e-3


def _checkpoint():
    from semsoft_plugin.engines import models

    return models.resolve("smollm2-135m")


def test_cross_fit_keeps_the_start_where_a_fold_has_too_few_items_to_fit():
    """A tiny evaluation (three items outside each fold) runs: each fold keeps the
    label-free start instead of raising, as the fit's rule keeps it without evidence."""
    rng = np.random.default_rng(0)
    grid = rng.dirichlet(np.ones(3), size=(4, 6))
    start = rng.dirichlet(np.ones(3), size=6)
    probs, choices = fitting.cross_fit(
        grid, start, np.array([0, 1, 2, 0, 1, 2]), np.array([0, 0, 0, 1, 1, 1])
    )
    np.testing.assert_array_equal(probs, start)
    assert [c["kept_default"] for c in choices] == [True, True]
