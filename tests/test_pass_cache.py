"""Each text scored once across model selection (issue 45 item 6): the process-wide cache
of kept forward passes (:mod:`semsoft_plugin.app.pass_cache`), shared by clones, keyed by
everything the pass depends on, bounded by an LRU on bytes, never changing a score; and
the only way ``predict_proba`` scores a repeated text once.

Passes are counted where they run: the transformers adapter's ``classify``, one input
per forward pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.model_selection import GridSearchCV, cross_val_score  # noqa: E402

from semsoft_plugin.app.classifier import Classifier  # noqa: E402
from semsoft_plugin.app.engine_settings import EngineSettings  # noqa: E402
from semsoft_plugin.app.pass_cache import PASSES, KeptPass, PassCache  # noqa: E402
from semsoft_plugin.core.config import SemsoftConfig  # noqa: E402
from semsoft_plugin.core.fit_policy import FitPolicy  # noqa: E402
from semsoft_plugin.engines import hf  # noqa: E402
from semsoft_plugin.engines.prompting import PromptTemplate  # noqa: E402

MODEL = "smollm2-135m"
LABELS = ["negative", "positive"]
F32 = {"engine": EngineSettings(dtype="float32")}
SST2 = Path(__file__).parent / "data" / "sst2" / "dev.txt"
REVIEWS = Path(__file__).parent / "data" / "reviews" / "reviews.tsv"


def _sst2(n: int) -> tuple[list[str], np.ndarray]:
    """``n`` distinct labelled texts, alternating negative and positive: the stored SST-2
    sample's 48, then the 12 reviews written for the tests."""
    rows = [line.split(" ", 1) for line in SST2.read_text("utf-8").splitlines() if line.strip()]
    extra = [line.split("\t", 1) for line in REVIEWS.read_text("utf-8").splitlines()[1:]]
    rows += [("0" if label == "negative" else "1", text) for label, text in extra]
    neg = [t.strip() for label, t in rows if label == "0"]
    pos = [t.strip() for label, t in rows if label == "1"]
    texts = [t for pair in zip(neg, pos, strict=False) for t in pair][:n]
    y = np.array(["negative", "positive"] * (n // 2))
    assert len(set(texts)) == n
    return texts, y


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inputs of each forward-pass batch the transformers adapter runs, from a cleared
    cache."""
    counted: list[int] = []
    real = hf.classify

    def counting(model, tokenizer, inputs, labels, **kwargs):  # type: ignore[no-untyped-def]
        inputs = list(inputs)
        counted.append(len(inputs))
        return real(model, tokenizer, inputs, labels, **kwargs)

    monkeypatch.setattr(hf, "classify", counting)
    PASSES.clear()
    return counted


# -- the cache itself ----------------------------------------------------------------


def _kept(width: int, hidden: int = 0) -> KeptPass:
    return KeptPass(
        torch.zeros(width, dtype=torch.long), torch.zeros(width), torch.zeros(2),
        torch.zeros(hidden) if hidden else None,
    )  # fmt: skip


def test_the_cache_is_an_lru_bounded_by_bytes() -> None:
    one = _kept(10).nbytes  # 10 int64 + 10 float32 + 2 float32
    assert one == 10 * 8 + 10 * 4 + 2 * 4
    cache = PassCache(max_bytes=3 * one)
    for key in "abc":
        cache.put((1, key), _kept(10))
    assert cache.get((1, "a")) is not None  # "a" is now the most recently used
    cache.put((1, "d"), _kept(10))  # over the bound: "b", the least recently used, goes
    assert cache.get((1, "b")) is None and len(cache) == 3 and cache.nbytes <= 3 * one
    assert cache.get((1, "a")) is not None and cache.get((1, "d")) is not None
    cache.put((1, "huge"), _kept(1000))  # larger than the bound: not kept
    assert cache.get((1, "huge")) is None and cache.nbytes <= 3 * one
    assert cache.get((1, "a"), hidden=True) is None  # no hidden state was kept with it
    cache.put((1, "h"), _kept(10, hidden=4))
    assert cache.get((1, "h"), hidden=True) is not None
    cache.drop_model(1)
    assert len(cache) == 0 and cache.nbytes == 0
    assert cache.resize(0) == 3 * one
    cache.put((2, "x"), _kept(1))
    assert len(cache) == 0  # a bound of 0 keeps nothing
    with pytest.raises(ValueError, match="max_bytes=-1 must be an int >= 0"):
        cache.resize(-1)


# -- keyed by everything the pass depends on -------------------------------------------


@pytest.mark.slow
def test_each_thing_the_pass_depends_on_is_in_its_key(passes, default_checkpoint) -> None:
    from semsoft_plugin.engines import models

    text = ["A tender, funny and beautifully acted film."]
    base = Classifier(MODEL, labels=LABELS, **F32)
    want = base.predict_proba(text)
    assert passes == [1]
    assert clone(base).set_params(
        config__semantic_weight=0.7, config__score_temperature=2.0
    ).predict_proba(text).shape == (1, 2)
    assert passes == [1]  # a setting the pass does not depend on: read back
    np.testing.assert_array_equal(clone(base).predict_proba(text), want)
    assert passes == [1]
    model, tokenizer = models.load(str(default_checkpoint), dtype="float32")
    changed = {
        "weights": Classifier(model, tokenizer, LABELS),
        "prompt": clone(base).set_params(prompt="Review: {text}\nIs it positive or negative?"),
        "answer prefix": clone(base).set_params(
            prompt=PromptTemplate(
                user="Review: {text}\nIs it positive or negative?", answer_prefix="Sentiment:"
            )
        ),
        "labels": clone(base).set_params(labels=["negative", "positive", "neutral"]),
        "k": clone(base).set_params(config__k=20),
        "dtype": clone(base).set_params(engine__dtype="bfloat16"),
        "engine settings (head)": clone(base).set_params(engine__exact_head=False),
    }
    for what, classifier in changed.items():
        before = len(passes)
        classifier.predict_proba(text)
        assert len(passes) == before + 1, f"{what}: the changed pass was read back"
        classifier.predict_proba(text)
        assert len(passes) == before + 1, f"{what}: the same pass ran twice"
    base.predict_proba(["Another text altogether."])
    assert passes[-1] == 1  # the text itself


# -- one pass per text -------------------------------------------------------------


@pytest.mark.slow
def test_grid_search_runs_one_forward_pass_per_text(passes) -> None:
    """``GridSearchCV`` over ``semantic_weight`` with 3 folds on 60 texts: 60 forward
    passes (each fit, each prediction and each candidate reads the kept passes), where it
    ran 630 before; ``cross_val_score`` afterwards runs none."""
    texts, y = _sst2(60)
    policy = FitPolicy(family=("temperature",))
    base = Classifier(MODEL, labels=LABELS, fit_policy=policy, **F32)
    search = GridSearchCV(base, {"config__semantic_weight": [0.0, 0.3, 1.0]}, cv=3)
    search.fit(texts, y)
    assert sum(passes) == 60
    best = search.best_params_["config__semantic_weight"]
    assert search.best_estimator_.fitted_config_.semantic_weight == best  # the value scored
    cross_val_score(clone(base).set_params(config__semantic_weight=0.3), texts, y, cv=3)
    assert sum(passes) == 60


@pytest.mark.slow
def test_predict_proba_scores_a_repeated_text_once(passes) -> None:
    clf = Classifier(MODEL, labels=LABELS, **F32)
    texts = ["Dull, slow and far too long."] * 64
    probs = clf.predict_proba(texts)
    assert sum(passes) == 1
    assert (probs == probs[0]).all()


@pytest.mark.slow
def test_a_kept_pass_never_changes_a_score(passes) -> None:
    texts, _ = _sst2(6)
    clf = Classifier(MODEL, labels=LABELS, config=SemsoftConfig(semantic_weight=0.3), **F32)
    fresh = clf.predict_details(texts)
    again = clone(clf).predict_details(texts)  # read back
    assert sum(passes) == 6
    old = PASSES.resize(0)  # nothing kept: every call runs its passes
    try:
        uncached = clone(clf).predict_details(texts)
    finally:
        PASSES.resize(old)
    assert sum(passes) == 12
    for got in (again, uncached):
        np.testing.assert_array_equal(got.probs, fresh.probs)
        np.testing.assert_array_equal(got.constrained_probs, fresh.constrained_probs)
        np.testing.assert_array_equal(got.coverage, fresh.coverage)


# -- never a stale pass: a model or tokenizer changed in place ------------------------


def _uncached(clf: Classifier, texts: list[str]) -> np.ndarray:
    """What a fresh process returns: the same classifier with nothing kept."""
    old = PASSES.resize(0)
    try:
        return clone(clf).predict_proba(texts)
    finally:
        PASSES.resize(old)


def _mlp(model):  # type: ignore[no-untyped-def]
    return model.model.layers[3].mlp.down_proj.weight


@pytest.mark.slow
def test_weights_changed_in_place_are_never_read_from_old_passes(default_checkpoint) -> None:
    """After each in-place change of the weights (under `no_grad`, an optimizer step,
    `load_state_dict`, and through `p.data`, which version counters miss) both the same
    classifier and a new one return what a fresh process returns, within 1e-6."""
    from semsoft_plugin.engines import models

    PASSES.clear()
    texts = ["A tender, funny and beautifully acted film.", "Dull, slow and far too long."]
    model, tokenizer = models.load(str(default_checkpoint), dtype="float32")
    generator = torch.Generator().manual_seed(0)

    def noise() -> torch.Tensor:
        return 0.05 * torch.randn(_mlp(model).shape, generator=generator)

    def with_no_grad() -> None:
        with torch.no_grad():
            _mlp(model).add_(noise())

    def optimizer_step() -> None:
        weight = _mlp(model)
        optimizer = torch.optim.SGD([weight], lr=1.0)
        weight.grad = noise()
        optimizer.step()
        weight.grad = None

    def load_state_dict() -> None:
        state = {k: v.clone() for k, v in model.state_dict().items()}
        state["model.layers.3.mlp.down_proj.weight"] += noise()
        model.load_state_dict(state)

    def through_data() -> None:
        _mlp(model).data.add_(noise())

    clf = Classifier(model, tokenizer, LABELS)
    for change in (with_no_grad, optimizer_step, load_state_dict, through_data):
        before = clf.predict_proba(texts)
        change()
        fresh = _uncached(clf, texts)
        assert np.abs(fresh - before).max() > 1e-3, f"{change.__name__} changed nothing"
        np.testing.assert_allclose(clf.predict_proba(texts), fresh, atol=1e-6, rtol=0)
        again = Classifier(model, tokenizer, LABELS).predict_proba(texts)
        np.testing.assert_allclose(again, fresh, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_a_peft_adapter_switched_off_and_on_is_seen(default_checkpoint) -> None:
    """A LoRA adapter with non-zero weights (`init_lora_weights=False`): switched off
    with `disable_adapter()` the base model's scores come back, switched on again the
    adapter's, each what a fresh process returns."""
    peft = pytest.importorskip("peft")
    from semsoft_plugin.engines import models

    PASSES.clear()
    texts = ["A tender, funny and beautifully acted film.", "Dull, slow and far too long."]
    model, tokenizer = models.load(str(default_checkpoint), dtype="float32")
    base = _uncached(Classifier(model, tokenizer, LABELS), texts)
    torch.manual_seed(0)
    config = peft.LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"],
                             init_lora_weights=False)  # fmt: skip
    tuned = peft.get_peft_model(model, config)
    clf = Classifier(tuned, tokenizer, LABELS)
    adapted = clf.predict_proba(texts)
    np.testing.assert_allclose(adapted, _uncached(clf, texts), atol=1e-6, rtol=0)
    assert np.abs(adapted - base).max() > 1e-3  # the adapter moves the scores
    with tuned.disable_adapter():
        np.testing.assert_allclose(clf.predict_proba(texts), base, atol=1e-6, rtol=0)
    np.testing.assert_allclose(clf.predict_proba(texts), adapted, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_an_edited_chat_template_is_seen(default_checkpoint) -> None:
    from semsoft_plugin.engines import models

    PASSES.clear()
    texts = ["A tender, funny and beautifully acted film.", "Dull, slow and far too long."]
    model, tokenizer = models.load(str(default_checkpoint), dtype="float32")
    before = Classifier(model, tokenizer, LABELS).predict_proba(texts)
    tokenizer.chat_template = (
        "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}### assistant:{% endif %}"
    )
    clf = Classifier(model, tokenizer, LABELS)
    fresh = _uncached(clf, texts)
    assert np.abs(fresh - before).max() > 1e-3
    np.testing.assert_allclose(clf.predict_proba(texts), fresh, atol=1e-6, rtol=0)


def test_the_state_digest_sees_every_kind_of_change() -> None:
    """`module_state` changes with a weight's bytes (however written), a buffer, a hook;
    `tokenizer_state` with the chat template. Unchanged, it is the same."""
    from semsoft_plugin.engines.model_state import module_state

    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    first = module_state(module)
    assert module_state(module) == first
    module[0].weight.data[1, 2] += 1e-7  # one element, below float32's sum resolution
    second = module_state(module)
    assert second != first
    module[1].running_mean.add_(1.0)
    third = module_state(module)
    assert third != second
    handle = module[0].register_forward_hook(lambda *_: None)
    assert module_state(module) != third
    handle.remove()
    assert module_state(module) == third

