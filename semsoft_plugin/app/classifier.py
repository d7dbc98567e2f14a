"""`Classifier`: a scikit-learn estimator over a zero-shot LLM classifier.

One object holds the model, the labels, the prompt and the Semantic Softmax settings;
`predict_proba(texts)` returns an `[N, L]` float64 array whose rows sum to one, in
the order of `classes_`, so scikit-learn's metrics take it unchanged:

```python
clf = Classifier("default", labels=["positive", "negative"])
log_loss(y, clf.predict_proba(texts), labels=clf.classes_)
```

The parts, each its own module of `semsoft_plugin.app`: the parameters checked
(`classifier_settings`), what they resolve to and the scoring (`scorer.Scorer`), the
labelled fit (`classifier_fit`) and the fitted state it leaves (`fitted_state.FittedState`).
Clones, the shared model and passes, the lazy import: docs/few-labels.md ("With scikit-learn").
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.utils import ClassifierTags, InputTags, Tags, TargetTags

from semsoft_plugin.app import file_mode, handles
from semsoft_plugin.app.classifier_fit import fit_labelled, fit_targets
from semsoft_plugin.app.classifier_settings import (
    MOVED_PARAMS,
    checked_settings,
    fit_plan,
    fold_ids,
)
from semsoft_plugin.app.engine_settings import EngineSettings
from semsoft_plugin.app.fitted_state import FittedState, label_rows
from semsoft_plugin.app.predictions import Predictions
from semsoft_plugin.app.scorer import Scorer
from semsoft_plugin.app.texts import TextFitter, text_list
from semsoft_plugin.core.calibration import CONTENT_FREE, FileCalibration, debias
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.fit_policy import FitPolicy
from semsoft_plugin.core.labels import LabelSet, label_names
from semsoft_plugin.engines.fit_identity import run_identity
from semsoft_plugin.engines.prompting import PromptTemplate, build_inputs
from semsoft_plugin.fit.fit_family import FitResult
from semsoft_plugin.fit.fit_file import FitIdentity
from semsoft_plugin.fit.fitted import FittedCorrection
from semsoft_plugin.fit.folds import check_fit_data

__all__ = ["BACKENDS", "MOVED_PARAMS", "Classifier", "NotFittedError"]

BACKENDS = handles.BACKENDS
# The parameters that hold a frozen settings value, whose fields `set_params` reaches
# as `name__field`, and the value each defaults to.
_VALUES: dict[str, Any] = {
    "config": SemsoftConfig,
    "engine": EngineSettings,
    "fit_policy": FitPolicy,
}
_REPR_WIDTH = 60  # a longer parameter repr (a loaded model) is shown as <its type>


class NotFittedError(SklearnNotFittedError):
    """Used before `fit` where `fit` supplies something (the labels with
    `labels=None`, the file correction with `calibrate="file"`): scikit-learn's own
    `NotFittedError` (a `ValueError` and an `AttributeError`)."""


class Classifier(ClassifierMixin, BaseEstimator):
    """Calibrated zero-shot classification of texts by an LLM, a scikit-learn estimator.

    Parameters are stored as given and checked where they are used (`fit`,
    `predict*`; [`from_pretrained`][semsoft_plugin.app.classifier.Classifier.from_pretrained] checks them and loads the model at once), as
    scikit-learn requires of an estimator.

    Parameters
    ----------
    model : Any
        A model name (`"default"`, `"smollm2-135m"`) or checkpoint directory
        (`semsoft_plugin.engines.models.resolve`), loaded on first use and shared in this
        process; or a loaded transformers causal LM or `vllm.LLM` (through [`classify_vllm`][semsoft_plugin.engines.vllm.classify_vllm],
        with `max_logprobs >= k`), shared by reference with every clone
    tokenizer : Any
        A loaded transformers model's tokenizer; `None` for a name or a
        `vllm.LLM` (its own is used)
    labels : Sequence[str] | LabelSet | None
        Label names in the prompt's order, any ordered sequence (another estimator's `classes_`,
        `dict_keys`; not a set), or with transformers a [`LabelSet`][semsoft_plugin.core.labels.LabelSet];
        `None`: the sorted labels of `y` in [`fit`][semsoft_plugin.app.classifier.Classifier.fit].
        Outputs follow `classes_`, sorted: docs/glossary.md ("The labels' order")
    prompt : PromptTemplate | str | None
        A `semsoft_plugin.engines.prompting.PromptTemplate`, or a user message with
        `{text}` (and optionally `{labels}`) and the default answer prefix
        `"Answer:"`; default: the prompt of `semsoft classify`
    config : SemsoftConfig | None
        Semantic Softmax settings (e.g. `SemsoftConfig.load` of a `semsoft tune` file), the
        start [`fit`][semsoft_plugin.app.classifier.Classifier.fit] keeps unless a member wins;
        default `SemsoftConfig()`. `GridSearchCV` reaches a field as `config__k`
    calibrate : str | None
        `None`, `"contextual"` (divide out the prompt's label bias read from content-free
        inputs, Zhao et al. 2021) or `"file"` (the mean distribution of the texts given to
        `fit(texts)`, [`semsoft_plugin.app.file_mode`][semsoft_plugin.app.file_mode]); opt-in
    max_text_tokens : int | None
        At most this many tokens of each text are scored (a cost bound); default: as many
        as the model's context holds with the prompt around them
    truncate : bool
        A longer text: `True` keeps its first tokens and reports the tokens dropped in
        `Predictions.truncated`; `False` refuses it, naming its index and length
    backend : str | None
        A named model's engine, `"transformers"` (the default) or `"vllm"`; a loaded
        model's is its own (`"hf"` is refused, naming `"transformers"`)
    engine : EngineSettings | None
        How the engine runs ([`EngineSettings`][semsoft_plugin.app.engine_settings.EngineSettings]:
        batch size, progress bar, float32 head, dtype, vLLM's `engine_args`); default
        `EngineSettings()`
    fit_policy : FitPolicy | None
        What [`fit`][semsoft_plugin.app.classifier.Classifier.fit] searches and the rule that
        keeps a member ([`FitPolicy`][semsoft_plugin.core.fit_policy.FitPolicy]: family, grid,
        score temperature, margin, guard, floor, seed); default `FitPolicy()`
    cv : int | Any
        The folds [`fit`][semsoft_plugin.app.classifier.Classifier.fit]'s rule scores each
        member on: an int >= 2 (stratified, drawn with `fit_policy.random_state`, lowered to
        half the items where there are fewer), a scikit-learn splitter or an iterable of splits

    Attributes
    ----------
    classes_ : np.ndarray
        The label names sorted (available before `fit` when `labels` is given)
    labels_ : tuple[str, ...]
        After `fit`: the label names, in prompt order
    fitted_config_ : SemsoftConfig
        After `fit`: the [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig] every
        prediction uses
    fit_result_ : FitResult | None
        After `fit`: what the fit chose and why
        ([`FitResult`][semsoft_plugin.fit.fit_family.FitResult]; `None` if it searched nothing or
        the fit was loaded by [`load_fit`][semsoft_plugin.app.classifier.Classifier.load_fit])
    fitted_correction_ : FittedCorrection | None
        After `fit`: what a bias member or the probe adds after `fitted_config_`, row by row
        ([`FittedCorrection`][semsoft_plugin.fit.fitted.FittedCorrection]), or `None`;
        [`save_fit`][semsoft_plugin.app.classifier.Classifier.save_fit] writes both to one config
        file
    file_calibration_ : FileCalibration
        After `fit` with `calibrate="file"`: the
        [`FileCalibration`][semsoft_plugin.core.calibration.FileCalibration] every prediction
        applies (its bias in `classes_` order)

    Examples
    --------
    ```python
    from sklearn.metrics import log_loss
    from semsoft_plugin import Classifier

    clf = Classifier.from_pretrained("default", ["positive", "negative"])
    texts = ["Funny, warm and beautifully shot.", "Flat characters and a predictable ending."]
    proba = clf.predict_proba(texts)     # [2, 2] float64, columns in clf.classes_ order
    log_loss(["positive", "negative"], proba, labels=clf.classes_)
    clf.predict(texts)                   # one label per text

    # 25-200 labelled texts: fit the scores, kept only where they beat the default
    clf.fit(train_texts, train_labels)
    clf.fit_result_.procedure            # what was adopted, e.g. "offset"
    clf.save_fit("fitted.json")          # Classifier(...).load_fit("fitted.json") reads it back
    ```
    """

    # Parameters passed by reference to a clone instead of deep-copied (loaded models).
    _shared_params = ("model", "tokenizer")

    def __new__(cls, *args: Any, **kwargs: Any) -> Classifier:
        """Refuse a parameter of an earlier version naming where it went (here, so that
        `__init__` keeps scikit-learn's explicit signature, with no `**kwargs`)."""
        for old in kwargs:
            if old in MOVED_PARAMS:
                raise TypeError(
                    f"Classifier got an unexpected keyword argument {old!r}: it moved to "
                    f"{MOVED_PARAMS[old]}"
                )
        return super().__new__(cls)

    def __init__(
        self,
        model: Any = "default",
        tokenizer: Any = None,
        labels: Sequence[str] | LabelSet | None = None,
        *,
        prompt: PromptTemplate | str | None = None,
        config: SemsoftConfig | None = None,
        calibrate: str | None = None,
        max_text_tokens: int | None = None,
        truncate: bool = True,
        backend: str | None = None,
        engine: EngineSettings | None = None,
        fit_policy: FitPolicy | None = None,
        cv: Any = 5,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.labels = labels
        self.prompt = prompt
        self.config = config
        self.calibrate = calibrate
        self.max_text_tokens = max_text_tokens
        self.truncate = truncate
        self.backend = backend
        self.engine = engine
        self.fit_policy = fit_policy
        self.cv = cv

    @classmethod
    def from_pretrained(
        cls, model: str = "default", labels: Sequence[str] | None = None, **kwargs: Any
    ) -> Classifier:
        """A classifier on a model by name or checkpoint directory, its settings checked
        and the model loaded now (so a bad option or label fails before any text).

        Parameters
        ----------
        model : str
            A model name or checkpoint directory.
        labels : Sequence[str] | None
            The label names (`None`: from [`fit`][semsoft_plugin.app.classifier.Classifier.fit]).
        **kwargs : Any
            The constructor's other parameters.

        Returns
        -------
        Classifier
            The classifier, its model loaded.
        """
        classifier = cls(model, None, labels, **kwargs)
        if labels is not None:
            classifier._scorer()
        return classifier

    # -- the scikit-learn protocol -------------------------------------------------
    def __sklearn_tags__(self) -> Tags:
        """scikit-learn's tags: a classifier of texts (1-D strings), multiclass, usable
        before `fit` when the labels are given but not in file mode."""
        tags: Tags = super().__sklearn_tags__()
        tags.target_tags = TargetTags(required=self.calibrate != "file")
        tags.classifier_tags = ClassifierTags()
        tags.input_tags = InputTags(one_d_array=True, two_d_array=False, string=True)
        tags.requires_fit = self.labels is None or self.calibrate == "file"
        return tags

    def set_params(self, **params: Any) -> Classifier:
        """scikit-learn's `set_params`; a nested field (`config__k`, `engine__batch_size`,
        `fit_policy__margin`) replaces the frozen value with a copy, never changing the
        object the user passed."""
        nested: dict[str, dict[str, Any]] = {}
        for key in [k for k in params if "__" in k]:
            name, field = key.split("__", 1)
            if name not in _VALUES:
                raise ValueError(f"Invalid parameter {name!r} for estimator {self!r}")
            nested.setdefault(name, {})[field] = params.pop(key)
        for name, fields in nested.items():
            current = params.get(name, getattr(self, name))
            params[name] = (current or _VALUES[name]()).set_params(**fields)
        super().set_params(**params)
        return self

    def __sklearn_is_fitted__(self) -> bool:
        """Whether [`fit`][semsoft_plugin.app.classifier.Classifier.fit] or [`load_fit`][semsoft_plugin.app.classifier.Classifier.load_fit] ran (scikit-learn's `check_is_fitted`)."""
        return self.__dict__.get("_fitted") is not None

    def __sklearn_clone__(self) -> Classifier:
        """A new unfitted estimator with a copy of each parameter; `_shared_params` (the
        loaded model) are the same objects, so a clone costs no copy of the weights
        (scikit-learn's `clone` would deep-copy a parameter that is not an estimator)."""
        params = self.get_params(deep=False)
        shared = {name: params.pop(name) for name in self._shared_params}
        return type(self)(**shared, **copy.deepcopy(params))

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if not name.startswith("_") and not name.endswith("_"):
            # a parameter changed: what was derived from the parameters is stale
            self.__dict__.pop("_runtime", None)

    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = super().__getstate__()
        state.pop("_runtime", None)  # a loaded model is rebuilt from its name, not pickled
        return state

    def __repr__(self, N_CHAR_MAX: int = 700) -> str:  # noqa: N803 (scikit-learn's name)
        """`Name(param=value, ...)` for the parameters that differ from the defaults, a
        loaded model shown as `<its type>`."""
        shown = []
        for name, value in self.get_params(deep=False).items():
            default = _DEFAULTS.get(name, _NO_DEFAULT)
            if _same(value, default):
                continue
            text = repr(value)
            if len(text) > _REPR_WIDTH or "\n" in text:
                text = f"<{type(value).__name__}>"
            shown.append(f"{name}={text}")
        return f"{type(self).__name__}({', '.join(shown)})"

    # -- fitted state ---------------------------------------------------------------
    def _state(self) -> FittedState:
        fitted: FittedState | None = self.__dict__.get("_fitted")
        if fitted is None:
            raise NotFittedError(
                f"This {type(self).__name__} instance is not fitted yet: call fit (or load_fit)"
            )
        return fitted

    @property
    def labels_(self) -> tuple[str, ...]:
        """After `fit`: the label names, in prompt order."""
        return self._state().labels

    @property
    def fitted_config_(self) -> SemsoftConfig:
        """After `fit`: the settings every prediction uses."""
        return self._state().config

    @property
    def fitted_correction_(self) -> FittedCorrection | None:
        """After `fit`: what a bias member or the probe adds after `fitted_config_`."""
        return self._state().correction

    @property
    def fit_result_(self) -> FitResult | None:
        """After `fit`: what the fit chose and why (`None`: nothing was searched)."""
        return self._state().result

    @property
    def file_calibration_(self) -> FileCalibration:
        """After `fit` with `calibrate="file"`: the file correction every prediction
        applies."""
        found = self._state().file_calibration
        if found is None:
            raise NotFittedError("file_calibration_ is fitted by fit(texts) with calibrate='file'")
        return found

    @property
    def classes_(self) -> np.ndarray:
        """The label names sorted (as `np.unique` sorts them): the column order of
        [`predict_proba`][semsoft_plugin.app.classifier.Classifier.predict_proba], as scikit-learn expects."""
        return np.array(sorted(self._names()))

    # -- predictions -------------------------------------------------------------------
    def predict_proba(self, texts: Iterable[str]) -> np.ndarray:
        """Calibrated probabilities (Semantic Softmax), rows summing to 1.

        Parameters
        ----------
        texts : Iterable[str]
            A list, tuple, 1-D numpy array or pandas Series of strings.

        Returns
        -------
        np.ndarray
            `[N, L]` float64, columns in `classes_` order.
        """
        return self.predict_details(texts).probs

    def predict(self, texts: Iterable[str]) -> np.ndarray:
        """The calibrated label of each text.

        Parameters
        ----------
        texts : Iterable[str]
            A list, tuple, 1-D numpy array or pandas Series of strings.

        Returns
        -------
        np.ndarray
            `[N]` elements of `classes_`.
        """
        return np.array(self.predict_details(texts).label)

    def predict_details(self, texts: Iterable[str]) -> Predictions:
        """Labels, calibrated and constrained probabilities, coverage, fallback flags and
        the tokens cut from each text (see `max_text_tokens`). With a `calibrate`
        correction, `probs` and `label` are corrected, `constrained_probs` is not.
        Each distinct text runs one forward pass, and none that an earlier call (of this
        classifier or a copy) already ran (`semsoft_plugin.app.pass_cache`).

        Parameters
        ----------
        texts : Iterable[str]
            A list, tuple, 1-D numpy array or pandas Series of strings.

        Returns
        -------
        Predictions
            The arrays, columns in `classes_` order.
        """
        values = text_list(texts)
        scorer = self._scorer()
        correction = self._file_calibration(scorer) if self.calibrate == "file" else None
        raw = self._raw_details(scorer, values)  # scored after the check above
        if correction is not None:
            return raw.with_probs(correction.apply(raw.probs))
        if self.calibrate == "contextual":
            return raw.with_probs(debias(raw.probs, self._content_free_bias(scorer)))
        return raw

    def content_free_bias(self) -> np.ndarray:
        """The mean Semantic Softmax distribution of the content-free inputs ("N/A", "",
        "[MASK]") in this prompt, the label bias `calibrate="contextual"` divides out.
        Three forward passes, computed once.

        Returns
        -------
        np.ndarray
            `[L]` in `classes_` order.
        """
        return self._content_free_bias(self._scorer())

    def inputs(self, texts: Iterable[str]) -> list[Any]:
        """The prompts (chat message lists, or strings without a chat template), each
        text cut to the length bound (see `max_text_tokens`).

        Parameters
        ----------
        texts : Iterable[str]
            The texts.

        Returns
        -------
        list[Any]
            One prompt per text.
        """
        return self._scorer().fitter.prompts(text_list(texts))[0]

    def context_length(self) -> int | None:
        """Tokens the model attends to (`handles.Loaded.context_length`).

        Returns
        -------
        int | None
            The context, or `None` where the model does not say.
        """
        return self._scorer().loaded.context_length()

    # -- fit -------------------------------------------------------------------------
    def fit(
        self, texts: Iterable[str], y: Iterable[str] | None = None, sample_weight: Any = None
    ) -> Classifier:
        """Fit the settings to a few labelled texts (25-200 are enough), or, with
        `calibrate="file"` and no `y`, estimate the file correction from the texts to
        classify.

        One kept forward pass per distinct text (none for a text an earlier call already
        ran); then [`fit_config`][semsoft_plugin.fit.fit_family.fit_config] on the kept
        decision-step scores (the fit `semsoft tune` runs), from `config`, as `fit_policy`
        says: each member of its family is checked out of fold on the `cv` folds, and the rule
        keeps the start unless a member wins (the docs page "Fit on a few labels" says how).
        To score a `config` as given, fit with `FitPolicy(family=())`, which only reads
        the labels. Refused before any text is scored, each naming the value: fewer than 4
        items or one label only, a policy that can fit nothing or names an inert member.
        Afterwards the predictions use `fitted_config_` and `fitted_correction_` after it,
        each row alone; `fit_result_` says what was chosen and why; the parameters are
        not changed. With `calibrate="file"`, `fit(texts)` (no `y`) estimates
        `file_calibration_` from the distinct texts (at least 32); `fit(texts, y)` with it
        is refused unless `FitPolicy(family=())`.

        Parameters
        ----------
        texts : Iterable[str]
            The labelled texts (with `calibrate="file"`, the texts to classify): a list,
            tuple, 1-D numpy array or pandas Series of strings.
        y : Iterable[str] | None
            Their labels, elements of `classes_` (with `labels=None`: any strings,
            which become the labels); `None` only with `calibrate="file"`.
        sample_weight : Any
            `[N]` finite non-negative weights (`None`: 1 each): each item's NLL counts
            with its weight in the fit, in the out-of-fold rule and in the probe. An item of
            weight 0 is dropped (it is not scored); integer weights fit as the items
            repeated would.

        Returns
        -------
        Classifier
            `self`.
        """
        values = text_list(texts)
        unlabelled = y is None and self.calibrate == "file"
        given = self._names() if self.labels is not None else None
        names, targets = fit_targets(values, y, given, unlabelled=unlabelled)
        params = self.get_params(deep=False)
        checked_settings(params)
        engine = handles.engine_of(self)
        policy = fit_plan(params, engine, handles.hidden_refusal(self))
        weights = _checked_weights(sample_weight, len(values))
        if self.calibrate == "file" and (unlabelled or not policy.family):
            if weights is not None:
                raise ValueError("sample_weight applies to the labelled fit, not calibrate='file'")
            scorer = self._scorer(names)
            self._fitted = None
            self._fit_file(scorer, names, values)
            return self
        if self.calibrate is not None:
            raise ValueError(
                f"fit(texts, y) with calibrate={self.calibrate!r}: the fit scores uncorrected "
                "probabilities, so its choice would not hold once corrected; fit with "
                "calibrate=None (calibrate='file': fit(texts) without y, or "
                "fit_policy=FitPolicy(family=()) to only read the labels)"
            )
        assert targets is not None
        # A splitter's folds index the items as given, so they are drawn before any drop.
        folds = fold_ids(self.cv, targets) if policy.family else None
        if weights is not None:
            keep = np.flatnonzero(weights > 0)  # weight 0: as if the item were not given
            values, targets = [values[i] for i in keep], [targets[i] for i in keep]
            weights = None if (weights[keep] == 1.0).all() else weights[keep]  # 1 each: unweighted
            folds = None if folds is None else np.unique(folds[keep], return_inverse=True)[1]
        n_folds = int(self.cv if folds is None else len(np.unique(folds)))
        if policy.family:
            check_fit_data([names[t] for t in targets], n_folds, policy.margin)
        scorer = self._scorer(names)
        self._fitted = None  # a refit starts afresh
        if not policy.family:
            self._fitted = FittedState(tuple(names), scorer.config)
            return self
        self._fitted = fit_labelled(
            scorer, values, targets, policy, n_folds=n_folds, folds=folds, sample_weight=weights
        )
        return self

    def save_fit(self, path: Any) -> None:
        """Write `fitted_config_` and `fitted_correction_` to a config file (JSON; a
        probe's weights beside it with safetensors: [`semsoft_plugin.fit.fitted`][semsoft_plugin.fit.fitted]).

        Parameters
        ----------
        path : Any
            The file to write.
        """
        if self.__dict__.get("_fitted") is None:
            raise NotFittedError("save_fit needs a fitted classifier: call fit first")
        state = self._state()
        correction = state.correction
        identity = None if correction is None else self._identity(list(correction.labels))
        state.save(path, identity)

    def load_fit(self, path: Any) -> Classifier:
        """Take the fit a config file holds (`semsoft tune`'s or [`save_fit`][semsoft_plugin.app.classifier.Classifier.save_fit]'s) as
        this classifier's `fitted_config_` and `fitted_correction_` (its labels must
        be this classifier's).

        Parameters
        ----------
        path : Any
            The config file.

        Returns
        -------
        Classifier
            `self`.
        """
        handles.check_backend(self.backend)  # a bad backend fails before the file is read
        names = self._names()
        self._fitted = FittedState.load(
            path, names, calibrate=self.calibrate, identity=self._identity(names)
        )
        return self

    def _identity(self, labels: list[str]) -> FitIdentity:
        """What this classifier applies a fit with: `labels` (prompt order), its prompt
        and its model's output layer, found without loading the model."""
        prompt, _ = checked_settings(self.get_params(deep=False))
        return run_identity(labels, prompt, self.model, allow_download=True)

    def _fit_file(self, scorer: Scorer, names: list[str], values: list[str]) -> None:
        """The file mode's fit: the correction of the distinct `values`, no search."""
        raw = self._raw_details(scorer, list(dict.fromkeys(values)), fitted=None)
        estimated = FileCalibration.estimate(raw.probs, strength=self._policy().file_strength)
        self._fitted = FittedState(tuple(names), scorer.config, file_calibration=estimated)

    def _file_calibration(self, scorer: Scorer) -> FileCalibration:
        """The fitted file correction, checked against the parameters now."""
        fitted: FittedState | None = self.__dict__.get("_fitted")
        found = None if fitted is None else fitted.file_calibration
        labels = None if fitted is None else fitted.labels
        names = scorer.labels.names
        strength = self._policy().file_strength
        return file_mode.checked_fit(found, strength, labels, names, NotFittedError)

    # -- the parameters, resolved ------------------------------------------------------
    def check_params(self) -> None:
        """Check every parameter that needs no model (each bad value refused by name):
        what a caller runs before loading anything (`classify_dataset` before its
        actors start)."""
        checked_settings(self.get_params(deep=False))

    def _policy(self) -> FitPolicy:
        return self.fit_policy or FitPolicy()

    def _names(self) -> list[str]:
        """The label names in prompt order: the `labels` parameter's, else fit's."""
        if self.labels is not None:
            return label_names(self.labels)
        fitted: FittedState | None = self.__dict__.get("_fitted")
        if fitted is None:
            raise NotFittedError(
                "labels=None: the labels come from fit(texts, y); fit the classifier or "
                "give labels=[...]"
            )
        return list(fitted.labels)

    def _scorer(self, names: list[str] | None = None) -> Scorer:
        """The loaded model, label set, prompt and settings, checked; cached per label
        list until a parameter is assigned."""
        names = self._names() if names is None else names
        cache = self.__dict__.setdefault("_runtime", {})
        key = ("scorer", tuple(names))
        if key not in cache:
            cache[key] = self._build_scorer(names)
        scorer: Scorer = cache[key]
        return scorer

    def _build_scorer(self, names: list[str]) -> Scorer:
        prompt, config = checked_settings(self.get_params(deep=False))
        engine = self.engine or EngineSettings()
        loaded = handles.loaded(
            self.model, self.tokenizer, backend=self.backend, dtype=engine.dtype,
            engine_args=engine.engine_args, k=config.k,
        )  # fmt: skip
        if isinstance(self.labels, LabelSet):
            if loaded.backend == "vllm":
                raise ValueError("a vLLM Classifier takes label names, not a LabelSet")
            label_set = self.labels
        else:
            label_set = LabelSet(names, loaded.tokenizer)
        fitter = TextFitter(
            loaded.tokenizer, prompt, names, context=loaded.context_length(),
            max_text_tokens=self.max_text_tokens, truncate=bool(self.truncate),
        )  # fmt: skip
        return Scorer(
            loaded, label_set, prompt, config, fitter, engine.batch_size, engine.progress,
            bool(engine.exact_head),
        )  # fmt: skip

    # -- scoring -------------------------------------------------------------------------
    def _raw_details(
        self, scorer: Scorer, values: list[str], fitted: FittedState | None | bool = True
    ) -> Predictions:
        """[`predict_details`][semsoft_plugin.app.classifier.Classifier.predict_details] before any `calibrate` correction, with the fit's
        settings and correction (`fitted=None`: the parameters' settings alone)."""
        state = self.__dict__.get("_fitted") if fitted is True else fitted
        assert state is None or isinstance(state, FittedState)
        inputs, cut = scorer.fitter.prompts(values)
        names = list(scorer.labels.names)
        classes = tuple(sorted(names))
        order = [names.index(c) for c in classes]
        state = FittedState(tuple(names), scorer.config) if state is None else state
        hidden = state.needs_hidden
        kept, states = scorer.kept(inputs, state.config.k, hidden=hidden)
        probs, result = state.kept_probs(
            kept, scorer.loaded.embeddings(), scorer.labels, classes,
            None if states is None else states.numpy(),
        )  # fmt: skip
        return Predictions(
            labels=classes,
            label=[classes[i] for i in probs.argmax(axis=1)] if len(probs) else [],
            probs=probs,
            constrained_probs=label_rows(result.constrained_probs, order),
            coverage=result.coverage.double().numpy(),
            fallback=result.fallback.numpy().astype(bool),
            truncated=np.array(cut, dtype=np.int64),
        )

    def _content_free_bias(self, scorer: Scorer) -> np.ndarray:
        cache = self.__dict__.setdefault("_runtime", {})
        fitted: FittedState | None = self.__dict__.get("_fitted")
        config = scorer.config if fitted is None else fitted.config
        key = ("bias", tuple(scorer.labels.names), config)
        if key not in cache:
            names = list(scorer.labels.names)
            inputs = build_inputs(scorer.prompt, list(CONTENT_FREE), names, scorer.loaded.tokenizer)
            result, _ = scorer.results(inputs, config)
            order = [names.index(c) for c in sorted(names)]
            cache[key] = label_rows(result.probs, order).mean(axis=0)
        bias: np.ndarray = cache[key]
        return bias


# `__new__` takes any keyword to refuse a moved one by name; the class's signature is still
# `__init__`'s (what scikit-learn and `help()` introspect).
Classifier.__signature__ = inspect.Signature(
    list(inspect.signature(Classifier.__init__).parameters.values())[1:]
)
_NO_DEFAULT = object()


def _defaults() -> dict[str, Any]:
    parameters = inspect.signature(Classifier.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


_DEFAULTS = _defaults()


def _same(value: Any, default: Any) -> bool:
    if value is default:
        return True
    if type(value) is not type(default):
        return False
    try:
        return bool(value == default)
    except (TypeError, ValueError):  # an array compares elementwise
        return False


def _checked_weights(sample_weight: Any, n: int) -> np.ndarray | None:
    """`sample_weight` as `[n]` float64, each finite and >= 0 with a positive sum;
    `None` stays `None`."""
    if sample_weight is None:
        return None
    weights = np.asarray(sample_weight, dtype=np.float64)
    if weights.shape != (n,):
        raise ValueError(
            f"sample_weight must hold one weight per text ({n}), got shape {weights.shape}"
        )
    bad = np.flatnonzero(~np.isfinite(weights) | (weights < 0))
    if len(bad):
        raise ValueError(
            f"sample_weight[{bad[0]}] = {float(weights[bad[0]])!r} must be a finite number >= 0"
        )
    if weights.sum() <= 0:
        raise ValueError("sample_weight sums to zero: no item would count")
    return weights
