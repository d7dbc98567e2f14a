"""The few-label fit over the whole family (``fit_family`` / ``--fit-family``): each member
recovered from labels it generated, the default kept on labels from its own
distribution, the probe chosen where the hidden state separates the classes and refused
on vLLM, and a fitted Classifier's correction applied row by row, saved and loaded with
the config file ``semsoft tune`` writes and ``semsoft classify --config`` reads, and by
an Outlines generator (``engines.outlines.fit.load_fit``)."""

from __future__ import annotations

import json
import math
import warnings
from typing import Literal

import numpy as np
import pytest
from _probe import fit_plain, zero_label_rows

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.engines.fit_identity import run_identity
from semsoft_plugin.engines.prompting import DEFAULT_TEMPLATE
from semsoft_plugin.fit import f1_guard, fit_family, fitting, temperature_scaling
from semsoft_plugin.fit.fit_file import FitIdentity
from semsoft_plugin.fit.probe import LinearProbe, probe_member
from semsoft_plugin.fit.temperature_scaling import apply_temperature

MODEL = "smollm2-135m"
NO_PROBE = ("grid", "temperature", "offset", "batch", "contextual")
RULE = FitPolicy()  # the rule's defaults, which the guard's tests check against


def _softmax(z: np.ndarray) -> np.ndarray:
    return apply_temperature(z, 1.0)


def _sample(probs: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([rng.choice(probs.shape[1], p=p) for p in probs])


def _grid(base: np.ndarray) -> np.ndarray:
    """Entry 0 is the start at T = 1; the others are pulled toward another distribution."""
    other = np.random.default_rng(9).normal(size=base.shape) * 2
    return np.stack([_softmax(base)] + [_softmax((1 - a) * base + a * other) for a in (0.2, 0.5)])


def _fit(base, y, content_free, family=NO_PROBE, external=None, seed=0, **rule):
    """`fit_probs` on `_grid(base)` under `FitPolicy(family=..., random_state=seed, **rule)`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fitting.fit_probs(
            _grid(base), _softmax(base), y, single={"temperature": 0},
            policy=FitPolicy(family=family, random_state=seed, **rule),
            content_free=content_free, external=external,
        )  # fmt: skip


# -- each member, by hand ----------------------------------------------------------------

BIAS = np.array([0.6, 0.25, 0.1, 0.05])


def _scores(seed: int, n: int = 300) -> np.ndarray:
    """Log-probabilities of a model with a prompt bias toward label 0."""
    return np.log(_softmax(np.random.default_rng(seed).normal(size=(n, 4)) * 2.5 + np.log(BIAS)))


def _member_cases(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per member: the true log-scores its correction makes of the model's, and the
    content-free inputs' probabilities (misleading except for ``"contextual"``)."""
    base = _scores(seed)
    wrong = _softmax(np.random.default_rng(seed + 50).normal(size=(3, 4)))
    return {
        "temperature": (base / 3, wrong),
        "offset": (base + np.array([1.5, -0.5, 0.0, -1.0]), wrong),
        "batch": (base - np.log(np.exp(base).mean(0)), wrong),
        "contextual": (base - np.log(BIAS), np.stack([BIAS, BIAS])),
    }


def test_each_member_is_recovered_from_labels_it_generated() -> None:
    """Labels drawn from each member's own correction of the scores (300 per draw): the fit
    over the whole family adopts that member (the simplest that ties the best within the
    margin) in at least 5 of 6 draws, with its parameter, or the macro-F1 guard stopped it
    (its out-of-fold macro-F1 gain not shown at the guard's level) and the fit changed no
    decision. (A member with as many free parameters can tie or win a draw by chance: a
    1-SE rule, not an oracle.)"""
    found: dict[str, int] = {}
    for seed in range(6):
        for member, (truth, content_free) in _member_cases(seed).items():
            y = _sample(_softmax(truth), seed + 100)
            _, t, kept, stats = _fit(_scores(seed), y, content_free, seed=seed)
            checked = stats["procedures"][member]
            if checked["shows_gain"] and not checked["passes"]:  # the guard stopped it
                bound = checked["f1_change"] - RULE.f1_z * checked["f1_change_se"]
                assert bound < -RULE.f1_tolerance, (member, checked)
                adopted = stats["procedures"].get(stats["procedure"], {})
                assert kept or adopted["f1_change_se"] == adopted["f1_change"] == 0
                found[member] = found.get(member, 0) + 1
                continue
            assert not kept, (member, stats["procedures"])
            if stats["procedure"] != member:
                continue
            found[member] = found.get(member, 0) + 1
            if member == "temperature":
                assert t == pytest.approx(3.0, rel=0.3)
            elif member == "offset":
                got = np.asarray(stats["offset"])
                np.testing.assert_allclose(got - got.mean(), [1.5, -0.5, 0.0, -1.0], atol=0.7)
            else:  # the label-free offset, then a temperature near 1
                assert t == pytest.approx(1.0, abs=0.3)
    assert all(found.get(m, 0) >= 5 for m in ("temperature", "offset", "batch", "contextual")), (
        found
    )


def test_the_whole_family_keeps_the_defaults_decisions_on_its_own_distribution() -> None:
    """Labels drawn from the start itself: no member that changes a decision, the probe
    on uninformative hidden states included, replaces it; the fit stays at its floor,
    the temperature."""
    base = _scores(7, 120)
    hidden = np.random.default_rng(8).normal(size=(120, 16))
    adopted = []
    for seed in range(6):
        y = _sample(np.exp(base), seed)
        probe = {"probe": probe_member(hidden, y, 4, label_rows=zero_label_rows(hidden, 4), seed=seed)}
        _, _, keep, stats = _fit(base, y, _softmax(base[:3]), (*NO_PROBE, "probe"), probe, seed)
        assert set(stats["procedures"]) == set(fitting.FAMILY)
        adopted.append("kept" if keep else stats["procedure"])
    assert adopted.count("temperature") >= 5, adopted


def test_a_member_that_buys_nll_with_the_winning_label_is_not_adopted() -> None:
    """The rule's macro-F1 guard: a member whose out-of-fold NLL beats the start's by far
    but that names one label for every item (macro-F1 far below the start's) is refused,
    and adopted once the guard is off (so the guard, not the NLL, refuses it)."""
    rng = np.random.default_rng(4)
    y = np.arange(90) % 3
    # The start names the right label on 60% of items, always 99% sure: a poor NLL.
    right = rng.random(90) < 0.6
    named = np.where(right, y, (y + 1) % 3)
    base = np.log(np.full((90, 3), 0.005) + 0.985 * np.eye(3)[named])

    def always_label_0(train: np.ndarray, held: np.ndarray) -> np.ndarray:
        return np.tile([0.36, 0.32, 0.32], (len(held), 1))  # NLL ~1.1, argmax always 0

    family, member = ("probe",), {"probe": always_label_0}
    _, _, kept, stats = _fit(base, y, None, family, member)
    checked = stats["procedures"]["probe"]
    assert checked["gain"] > 0.5 and checked["f1_change"] < -0.3
    assert kept and not checked["passes"]
    _, _, kept, stats = _fit(base, y, None, family, member, f1_guard=False)
    assert not kept and stats["procedure"] == "probe"


def test_the_guards_macro_f1_change_is_scikit_learns_over_the_labels_the_items_hold() -> None:
    """`f1_change` is scikit-learn's macro-F1 difference with `labels=` the labels the
    targets hold (weights as counts: the items repeated), not each one over the labels it
    predicts: there, a member that stops naming a label the items lack seems to gain."""
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(7)
    y = rng.integers(0, 5, 60)
    y[y == 4] = 3  # label 4: never a target, named by both below
    start = np.where(rng.random(60) < 0.6, y, rng.integers(0, 5, 60))
    member = np.where(rng.random(60) < 0.7, y, rng.integers(0, 5, 60))
    held = np.unique(y)
    expected = f1_score(y, member, labels=held, average="macro") - f1_score(
        y, start, labels=held, average="macro"
    )
    change, se = f1_guard.f1_change(y, start, member, 5)
    assert change == pytest.approx(expected, abs=1e-12) and 0 < se < 0.2
    w = rng.integers(1, 4, 60)
    change_w, _ = f1_guard.f1_change(y, start, member, 5, w.astype(float))
    repeated, _ = f1_guard.f1_change(np.repeat(y, w), np.repeat(start, w), np.repeat(member, w), 5)
    assert change_w == pytest.approx(repeated, abs=1e-12)
    # The start names label 2, which no item holds; the member names 1 there instead: label
    # 1 loses precision. Per own labels, scikit-learn's default counts that as a gain.
    y, start, member = np.array([0, 0, 1, 1]), np.array([0, 2, 1, 1]), np.array([0, 1, 1, 1])
    own_labels = f1_score(y, member, average="macro") - f1_score(y, start, average="macro")
    assert own_labels > 0.1
    assert f1_guard.f1_change(y, start, member, 3)[0] == pytest.approx(-0.1, abs=1e-12)
    assert f1_guard.f1_change(y, start, start.copy(), 3) == (0.0, 0.0)


def test_the_guard_refuses_a_member_whose_macro_f1_gain_is_within_its_noise() -> None:
    """A member that rights six wrong decisions and breaks six right ones (its macro-F1
    about the start's, but within a wide noise) is refused however much NLL it buys;
    with the bound at the point estimate (`f1_z=0`) the same draw passes."""
    rng = np.random.default_rng(0)
    y = np.arange(40) % 4
    named = np.where(rng.random(40) < 0.5, y, (y + 1) % 4)
    base = np.log(np.full((40, 4), 0.002) + 0.992 * np.eye(4)[named])
    fix = rng.choice(np.flatnonzero(named != y), 6, replace=False)
    broken = rng.choice(np.flatnonzero(named == y), 6, replace=False)
    renamed = named.copy()
    renamed[fix], renamed[broken] = y[fix], (y[broken] + 2) % 4

    def renaming(train: np.ndarray, held: np.ndarray) -> np.ndarray:
        return 0.55 * np.eye(4)[renamed[held]] + 0.45 / 4  # a far better NLL than 0.992

    family, member = ("probe",), {"probe": renaming}
    _, _, _, stats = _fit(base, y, None, family, member)
    checked = stats["procedures"]["probe"]
    assert checked["gain"] > 3 * checked["gain_se"] > 0
    assert checked["f1_change"] >= -RULE.f1_tolerance
    assert checked["f1_change"] - RULE.f1_z * checked["f1_change_se"] < -RULE.f1_tolerance
    assert not checked["passes"]
    _, _, kept, stats = _fit(base, y, None, family, member, f1_z=0.0)
    assert not kept and stats["procedure"] == "probe"


def test_succession_targets_keep_a_few_separable_labels_from_certainty() -> None:
    """25 labels one temperature separates: the hard targets drive T to its bound (every
    answer ~certain, an error on new items costs ~1/T nats); the fit's targets stop at
    an answer as sure as 25 right answers show, ``(N + 1) / (N + 2)`` on average."""
    rng = np.random.default_rng(5)
    y = np.arange(25) % 2
    margin = rng.uniform(0.5, 2.0, size=25)
    z = np.stack([margin * (1 - 2 * y), -margin * (1 - 2 * y)], 1) / 2  # always right
    rows = temperature_scaling.succession_targets(y, 2)
    np.testing.assert_allclose(rows.sum(1), 1.0)
    np.testing.assert_allclose(rows[np.arange(25), y], 26 / 27)
    hard_t = temperature_scaling.fit_temperature(z, y)
    soft_t = temperature_scaling.fit_temperature(z, rows)
    assert hard_t == pytest.approx(math.exp(temperature_scaling.LOG_T_BOUNDS[0]), rel=1e-3)
    assert soft_t > 5 * hard_t
    sure = temperature_scaling.apply_temperature(z, soft_t).max(1).mean()
    assert 0.9 < sure < 26 / 27 + 0.01
    # an error on a new item: bounded under the fit's targets, ~1/T nats under the hard ones
    new_error = np.array([[1.0, -1.0]]) / 2
    cost = {
        t: temperature_scaling.nll(temperature_scaling.apply_temperature(new_error, t), [1])[0]
        for t in (hard_t, soft_t)
    }
    assert cost[soft_t] < 6.0 < 15.0 < cost[hard_t]
    # many labels: the targets fade to the hard ones
    many = temperature_scaling.succession_targets(np.arange(10_000) % 4, 4)
    assert many.max() == pytest.approx(1.0, abs=1e-3)


def test_the_fits_temperature_is_temperature_scaling_held_to_the_rule_of_succession() -> None:
    """Where the labels do not separate, the fit's `T` is temperature scaling's to the
    search's precision; where one `T` would make 25 right answers nearly certain, it is the
    `T` at which their labels get `26 / 27` on average; integer weights count items."""
    rng = np.random.default_rng(5)
    y = np.arange(25) % 2
    margin = rng.uniform(0.5, 2.0, size=25)
    z = np.stack([margin * (1 - 2 * y), -margin * (1 - 2 * y)], 1) / 2  # always right
    hard = temperature_scaling.fit_temperature(z, y)
    held = temperature_scaling.succession_temperature(z, y)
    assert held > 5 * hard
    picked = temperature_scaling.apply_temperature(z, held)[np.arange(25), y]
    assert picked.mean() == pytest.approx(26 / 27, abs=1e-9)
    # two errors: the labels no longer separate, and nothing is held
    wrong = y.copy()
    wrong[:2] = 1 - wrong[:2]
    hard_wrong = temperature_scaling.fit_temperature(z, wrong)
    assert temperature_scaling.succession_temperature(z, wrong) == hard_wrong
    # weights 2 on the first five items: the rule's N and mean of the items repeated
    weights = np.r_[np.full(5, 2.0), np.ones(20)]
    repeated = np.r_[np.arange(5), np.arange(25)]
    np.testing.assert_allclose(
        temperature_scaling.succession_temperature(z, y, sample_weight=weights),
        temperature_scaling.succession_temperature(z[repeated], y[repeated]),
        rtol=1e-9,
    )


def test_the_probe_is_chosen_when_the_hidden_state_separates_the_classes() -> None:
    """Scores that know nothing, hidden states that carry the label: the probe wins."""
    rng = np.random.default_rng(3)
    y = np.arange(80) % 2
    base = np.log(_softmax(rng.normal(size=(80, 2)) * 0.3))
    hidden = rng.normal(size=(80, 12))
    hidden[:, 0] += 3.0 * (2 * y - 1)
    probe = {"probe": probe_member(hidden, y, 2, label_rows=zero_label_rows(hidden, 2))}
    entry, t, kept, stats = _fit(base, y, None, ("grid", "temperature", "offset", "probe"), probe)
    assert not kept and stats["procedure"] == "probe"
    assert stats["procedures"]["probe"]["nll"] < 0.3
    # and cross_fit scores each fold with the probe fitted on the other folds
    folds = np.arange(80) % 4
    out, choices = fitting.cross_fit(
        _grid(base), _softmax(base), y, folds, single={"temperature": 0},
        policy=FitPolicy(family=("grid", "probe")), external=probe,
    )  # fmt: skip
    held = folds == 0
    want = fit_plain(hidden[~held], y[~held], 2).probs(hidden[held])
    assert choices[0]["procedure"] == "probe"
    np.testing.assert_allclose(out[held], want)


def test_the_probe_as_arrays_is_scikit_learns_and_round_trips(tmp_path) -> None:
    """With hard targets and label rows that read nothing, the probe is scikit-learn's L2
    logistic regression at its strength: the same `C` with three labels (a softmax over
    all of them), `2 C` with two (two rows `A_0, A_1` cost `|A_1 - A_0|^2 / 4` where the
    sigmoid's one row costs `|w|^2 / 2`)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    for n_labels in (2, 3):
        y = np.arange(60) % n_labels
        x = rng.normal(size=(60, 5)) + y[:, None]
        probe = fit_plain(x, y, n_labels, succession=False)
        scaler = StandardScaler().fit(x)
        c = probe.strength * (2 if n_labels == 2 else 1)
        want = LogisticRegression(C=c, max_iter=1000, tol=1e-10).fit(scaler.transform(x), y)
        np.testing.assert_allclose(
            probe.probs(x), want.predict_proba(scaler.transform(x)), atol=1e-4
        )
        probe.save(tmp_path / "p.safetensors", ["a", "b", "c"][:n_labels])
        again, labels = LinearProbe.load(tmp_path / "p.safetensors")
        assert labels == ["a", "b", "c"][:n_labels]
        np.testing.assert_array_equal(again.probs(x), probe.probs(x))
    with pytest.raises(ValueError, match=r"reads \[N, 5\]"):
        probe.probs(x[:, :4])


def test_unknown_members_and_bad_families_are_refused_by_name() -> None:
    base = _scores(0, 20)
    y = np.arange(20) % 4
    with pytest.raises(ValueError, match="unknown fit family member 'vector'"):
        _fit(base, y, None, ("grid", "vector"))
    with pytest.raises(ValueError, match="must be a sequence of member names"):
        _fit(base, y, None, "probe")
    with pytest.raises(ValueError, match="member 'probe' needs"):
        _fit(base, y, None, ("grid", "probe"))
    with pytest.raises(ValueError, match="checks nothing"):
        _fit(base, y, None, ())
    with pytest.raises(ValueError, match="listed twice"):
        _fit(base, y, None, ("grid", "grid"))


def test_the_default_family_is_what_the_inputs_allow() -> None:
    from semsoft_plugin.app.classifier_settings import checked_family

    assert fit_family.default_family(None, {}) == ("grid", "temperature", "offset", "batch")
    assert fit_family.default_family(np.ones((3, 2)), {"probe": None}) == fitting.FAMILY
    assert checked_family(None, "transformers") == fitting.FAMILY
    # Issue 41: vLLM reads the probe's hidden state back from the logits row.
    assert checked_family(None, "vllm") == fitting.FAMILY
    assert checked_family(("grid", "probe"), "vllm") == ("grid", "probe")
    # An engine that cannot return it (a vllm.LLM without the worker extension): the
    # default leaves the probe out, a family naming it is refused with the reason.
    why = "create it with LLM(..., worker_extension_cls=X)"
    assert "probe" not in checked_family(None, "vllm", why)
    with pytest.raises(ValueError, match=r"'probe' needs the decision step's hidden state.*"
                       r"worker_extension_cls=X.*vllm"):  # fmt: skip
        checked_family(("grid", "probe"), "vllm", why)


# -- the config file -----------------------------------------------------------------------


def test_a_correction_round_trips_through_the_config_file(tmp_path) -> None:
    from semsoft_plugin.fit.fitted import FittedCorrection, read_fit, save_fitted

    config = SemsoftConfig().replace(score_temperature=0.8)
    offset = FittedCorrection("offset", ("neg", "pos"), offset=(0.5, -0.5))
    made_on = FitIdentity(("neg", "pos"), DEFAULT_TEMPLATE.to_dict(), "0" * 64)
    save_fitted(tmp_path / "a.json", config, offset, made_on)
    fit = read_fit(tmp_path / "a.json")
    assert (fit.config, fit.correction) == (config, offset)
    with pytest.raises(ValueError, match="fitted"):  # a plain load refuses, never drops it
        SemsoftConfig.load(tmp_path / "a.json")
    probs = np.array([[0.2, 0.8], [0.5, 0.5]])
    got = offset.apply(probs, ("pos", "neg"))  # columns in another order
    want = _softmax(np.log(probs) + [-0.5, 0.5])
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(offset.apply(probs[1:], ("pos", "neg")), want[1:])  # row alone
    with pytest.raises(ValueError, match=r"for the labels 'neg' \(U\+006E U\+0065 U\+0067\)"):
        offset.apply(probs, ("pos", "other"))
    save_fitted(tmp_path / "plain.json", config, None)
    assert SemsoftConfig.load(tmp_path / "plain.json") == config
    x = np.random.default_rng(0).normal(size=(20, 3))
    probe = FittedCorrection("probe", ("neg", "pos"), probe=fit_plain(x, np.arange(20) % 2, 2))
    save_fitted(tmp_path / "b.json", config, probe, made_on)
    assert (tmp_path / "b.json.probe.safetensors").exists()
    saved = json.loads((tmp_path / "b.json").read_text())["fitted"]["probe"]
    assert saved == "b.json.probe.safetensors"
    again = read_fit(tmp_path / "b.json").correction
    assert again is not None
    np.testing.assert_array_equal(
        again.apply(None, ("neg", "pos"), x), probe.apply(None, ("neg", "pos"), x)
    )


# -- a real model --------------------------------------------------------------------------

FOOD = ["pizza", "noodles", "a salad", "soup", "tacos", "curry", "pancakes", "sushi", "rice",
        "a sandwich", "pasta", "dumplings", "stew", "a burger", "oatmeal", "falafel"]  # fmt: skip
PLACES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Rome", "Dakar", "Perth",
          "Lagos", "Seoul", "Porto", "Bern", "Delhi", "Austin"]  # fmt: skip
LABELS = ["negative", "positive"]


def _topics() -> tuple[list[str], list[str]]:
    """A sentiment prompt on two neutral topics: the label is the topic, which the hidden
    state tells apart and the sentiment label logits do not."""
    texts, y = [], []
    for food, place in zip(FOOD, PLACES, strict=True):
        texts += [f"Today I had {food} for lunch.", f"Last week we flew to {place}."]
        y += ["positive", "negative"]
    return texts, y


@pytest.fixture(scope="module")
def probed():
    from semsoft_plugin import Classifier

    texts, y = _topics()
    from semsoft_plugin.app.engine_settings import EngineSettings

    clf = Classifier(MODEL, labels=LABELS, engine=EngineSettings(dtype="float32", batch_size=4), cv=4)
    assert clf.fit(texts, y) is clf
    return clf, texts, y


@pytest.mark.slow
def test_the_classifier_chooses_the_probe_where_the_hidden_state_separates_the_labels(probed):
    clf, texts, y = probed
    assert clf.fit_policy is None  # the default policy: every member the engine supports
    assert set(clf.fit_result_.procedures) == set(fitting.FAMILY)
    assert clf.fit_result_.procedure == "probe" and not clf.fit_result_.kept_default
    assert clf.fitted_correction_.probe is not None
    assert clf.fitted_config_ == SemsoftConfig()  # the probe changes no setting
    assert (clf.predict(texts) == np.array(y)).mean() == 1.0
    # predict_proba is the probe on the hidden states of the decision step
    _, hidden = clf._scorer().kept(clf.inputs(texts[:6]), 8, hidden=True)
    want = clf.fitted_correction_.probe.probs(hidden.numpy())  # LABELS order = classes_
    np.testing.assert_allclose(clf.predict_proba(texts[:6]), want, atol=1e-6)


@pytest.mark.slow
def test_a_fitted_row_scores_the_same_alone_and_in_a_batch(probed, tmp_path):
    """The probe and an offset, each a fixed fitted correction: a row's probabilities do
    not depend on the rows beside it."""
    from semsoft_plugin.fit.fitted import FittedCorrection, save_fitted

    clf, texts, _ = probed
    batch = clf.predict_proba(texts[:7])
    for i in (0, 3, 6):
        np.testing.assert_allclose(clf.predict_proba([texts[i]])[0], batch[i], atol=1e-5)
    path = tmp_path / "offset.json"
    save_fitted(path, SemsoftConfig(), FittedCorrection("batch", tuple(LABELS), offset=(-2.0, 2.0)),
                run_identity(LABELS, DEFAULT_TEMPLATE, MODEL))  # fmt: skip
    other = clf.__sklearn_clone__().load_fit(path)
    assert other.fit_result_ is None and other.fitted_correction_.procedure == "batch"
    shifted = other.predict_proba(texts[:7])
    plain = clf.__sklearn_clone__().predict_proba(texts[:7])
    np.testing.assert_allclose(shifted, _softmax(np.log(plain) + [-2.0, 2.0]), atol=1e-9)
    for i in (0, 6):
        np.testing.assert_allclose(other.predict_proba([texts[i]])[0], shifted[i], atol=1e-6)


@pytest.mark.slow
def test_the_fit_saved_is_what_semsoft_classify_config_applies(probed, tmp_path, capsys):
    from semsoft_plugin.app.cli import main

    clf, texts, _ = probed
    path = tmp_path / "tuned.json"
    clf.save_fit(path)
    assert (tmp_path / "tuned.json.probe.safetensors").exists()
    assert main(["classify", texts[1], "--labels", ",".join(LABELS), "--config", str(path),
                 "--json", "--model", MODEL, "--dtype", "float32"]) == 0  # fmt: skip
    shown = json.loads(capsys.readouterr().out)
    want = clf.predict_proba([texts[1]])[0]
    probs = shown["probs"]
    got = [v for k, v in sorted(probs.items())]
    np.testing.assert_allclose(got, want, atol=1e-5)
    base = ["classify", texts[1], "--config", str(path), "--model", MODEL]
    assert main([*base, "--labels", ",".join(LABELS), "--semantic-weight", "0.5"]) == 2
    assert "--semantic-weight cannot go with it" in capsys.readouterr().err
    assert main([*base, "--labels", "yes,no"]) == 2
    assert "fitted for the labels 'negative' (U+006E" in capsys.readouterr().err


@pytest.mark.slow
def test_the_classifier_refuses_unknown_members(probed):
    """Refused before any model loads (the probe on vLLM is no longer refused: issue 41,
    tests/test_vllm_probe_fit.py)."""
    from semsoft_plugin import Classifier

    _, texts, y = probed
    with pytest.raises(ValueError, match="unknown fit family member 'vector'"):
        from semsoft_plugin.core.fit_policy import FitPolicy

        Classifier(MODEL, labels=LABELS, fit_policy=FitPolicy(family=("grid", "vector"))).fit(texts, y)


@pytest.mark.slow
def test_the_family_restricted_to_one_member(probed):
    """``fit_family=("offset",)`` checks the offset alone, on the same labels."""
    from semsoft_plugin import Classifier

    _, texts, y = probed
    from semsoft_plugin.app.engine_settings import EngineSettings
    from semsoft_plugin.core.fit_policy import FitPolicy

    clf = Classifier(MODEL, labels=LABELS, engine=EngineSettings(dtype="float32"), cv=4,
                     fit_policy=FitPolicy(margin=0.0, family=("offset",))).fit(texts, y)  # fmt: skip
    assert set(clf.fit_result_.procedures) == {"offset"}
    if not clf.fit_result_.kept_default:
        assert clf.fitted_correction_.procedure == "offset"
        assert len(clf.fitted_correction_.offset) == 2


def test_tune_refuses_an_unknown_member_before_loading() -> None:
    from semsoft_eval.tune import tune_dataset

    with pytest.raises(ValueError, match="unknown fit family member 'vector'"):
        tune_dataset(MODEL, "sst2", family=("vector",))


@pytest.mark.slow
def test_tune_searches_the_family_and_writes_what_classify_reads(tmp_path, capsys) -> None:
    from semsoft_plugin.app.cli import main
    from semsoft_plugin.fit.fitted import read_fit

    out = tmp_path / "tuned.json"
    report = tmp_path / "report.json"
    argv = ["tune", "--dataset", "sst2", "--limit", "24", "--fit-family", "temperature,offset,"
            "batch,contextual,probe", "--cache-dir", str(tmp_path / "c"), "--output", str(out),
            "--report", str(report), "--model", MODEL]  # fmt: skip
    assert main(argv) == 0
    tuned = json.loads(report.read_text())
    assert set(tuned["fit"]["procedures"]) == {"temperature", "offset", "batch", "contextual",
                                               "probe"}  # fmt: skip
    # The printed report gives each member's evidence as the rule read it.
    printed = capsys.readouterr().out
    for name, row in tuned["fit"]["procedures"].items():
        assert (f"| {name} | {row['gain']:+.4f} | {row['gain_se']:.4f} | "
                f"{row['f1_change']:+.3f} | {row['f1_change_se']:.3f} | "
                f"{'yes' if row['passes'] else 'no'} |") in printed  # fmt: skip
    fit = read_fit(out)
    config, correction = fit.config, fit.correction
    assert config == SemsoftConfig().replace(**tuned["config"])
    procedure = tuned["fit"]["procedure"]
    adopted = not tuned["fit"]["kept_default"] and procedure != "temperature"
    assert (correction is not None) == adopted
    assert tuned["correction"] == (None if correction is None else correction.to_dict())
    assert main([*argv[:6], "vector", *argv[7:], "--overwrite"]) == 2
    assert "unknown fit family member 'vector'" in capsys.readouterr().err


# -- the fit in Outlines (issue 36) ----------------------------------------------


@pytest.fixture(scope="module")
def outlines_probed(tmp_path_factory):
    """The probe fitted by the Classifier at the decision step Outlines uses: the prompt
    is the text as one user message with a generation prompt (no answer prefix), the
    labels scored as Outlines writes them (no leading space). Saved with ``save_fit``."""
    outlines = pytest.importorskip("outlines")
    from semsoft_plugin import Classifier, LabelSet
    from semsoft_plugin.app.engine_settings import EngineSettings
    from semsoft_plugin.core.fit_policy import FitPolicy
    from semsoft_plugin.engines import models
    from semsoft_plugin.engines.prompting import PromptTemplate

    model, tokenizer = models.load(MODEL, dtype="float32")
    texts, y = _topics()
    clf = Classifier(model, tokenizer, LabelSet(LABELS, tokenizer, leading_space=False),
                     prompt=PromptTemplate("{text}", answer_prefix=""),
                     engine=EngineSettings(batch_size=4), cv=4,
                     fit_policy=FitPolicy(family=("probe",))).fit(texts, y)  # fmt: skip
    path = tmp_path_factory.mktemp("fit") / "fitted.json"
    clf.save_fit(path)
    return clf, outlines.from_transformers(model, tokenizer), path, texts


@pytest.mark.slow
@pytest.mark.outlines
def test_an_outlines_generator_applies_the_probe_the_classifier_saved(outlines_probed):
    """The same prompt gives the Classifier's probabilities: the probe read the hidden
    state of Outlines' decision step, computed in float32 as the Classifier's was (measured
    1e-9 apart, single and padded; the next step's hidden state gives the probe 0.999 on
    the other label for rows 0 and 6), and greedy emits the probe's argmax (the plain
    generator's differs on 18 of the 32 texts)."""
    from semsoft_plugin.engines.outlines import Generator
    from semsoft_plugin.engines.outlines.fit import load_fit

    clf, model, path, texts = outlines_probed
    assert clf.fitted_correction_.procedure == "probe"
    choice = Literal["negative", "positive"]
    generator = load_fit(model, choice, path)
    plain = Generator(model, choice)
    rows = [0, 1, 6, 7]
    want = clf.predict_proba([texts[i] for i in rows])  # columns: LABELS = classes_
    for i, expected in zip(rows, want, strict=True):
        got = generator(texts[i])
        assert got in LABELS and got == LABELS[int(np.argmax(expected))]
        np.testing.assert_allclose([got.probs[name] for name in LABELS], expected, atol=1e-6)
        other = plain(texts[i]).probs
        assert max(abs(other[n] - got.probs[n]) for n in LABELS) > 1e-2  # the probe acted
    together = generator.batch([texts[i] for i in rows])  # padded rows: each its own
    for got, expected in zip(together, want, strict=True):
        np.testing.assert_allclose([got.probs[name] for name in LABELS], expected, atol=1e-6)
    with pytest.raises(ValueError, match="fitted for the labels"):
        load_fit(model, Literal["yes", "no"], path)


@pytest.mark.slow
@pytest.mark.outlines
def test_an_outlines_generator_applies_a_saved_offset(outlines_probed, tmp_path):
    from semsoft_plugin.engines.outlines import Generator
    from semsoft_plugin.engines.outlines.fit import load_fit
    from semsoft_plugin.fit.fitted import FittedCorrection, save_fitted

    _, model, _, texts = outlines_probed
    from semsoft_plugin.engines.outlines.fit import OUTLINES_PROMPT

    path = tmp_path / "offset.json"
    made_on = run_identity(LABELS, OUTLINES_PROMPT, MODEL)
    save_fitted(path, SemsoftConfig(), FittedCorrection("batch", tuple(LABELS), offset=(-2.0, 2.0)),
                made_on)  # fmt: skip
    choice = Literal["negative", "positive"]
    shifted = load_fit(model, choice, path)(texts[0])
    plain = Generator(model, choice)(texts[0]).probs
    want = _softmax(np.log([[plain[n] for n in LABELS]]) + [-2.0, 2.0])[0]
    np.testing.assert_allclose([shifted.probs[n] for n in LABELS], want, atol=1e-9)
    assert shifted == LABELS[int(np.argmax(want))]
    # wrap() takes the loaded correction the same way (engines do not read files)
    import outlines

    from semsoft_plugin.engines.outlines import wrap
    from semsoft_plugin.fit.fitted import read_fit

    correction = read_fit(path).correction
    wrapped = wrap(outlines.Generator(model, choice), LABELS, fitted_correction=correction)
    assert wrapped(texts[0]).probs == pytest.approx(shifted.probs, abs=1e-9)
