"""``Classifier``: a scikit-learn estimator over a zero-shot LLM classifier.

One object holds the model, the labels, the prompt and the Semantic Softmax settings;
``predict_proba(texts)`` returns an ``[N, L]`` float64 array whose rows sum to one, in
the order of ``classes_``, so scikit-learn's metrics take it unchanged::

    clf = Classifier("default", labels=["positive", "negative"])
    log_loss(y, clf.predict_proba(texts), labels=clf.classes_)

A scikit-learn estimator (``clone``, ``Pipeline``, ``GridSearchCV``) without importing
scikit-learn (:mod:`semsoft_plugin.app.estimator`); the model is a parameter that copies
cheaply (:mod:`semsoft_plugin.app.handles`), so no copy of the classifier copies the weights.

The one way the project scores texts (``semsoft classify`` goes through it), through the
adapters' batch functions (:func:`semsoft_plugin.engines.hf.classify`,
:func:`semsoft_plugin.engines.vllm.classify_vllm`): ``semsoft eval``'s forward pass, the
decision step only. No engine is imported until a method needs it, nor numpy:
``import semsoft_plugin`` stays torch-only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from semsoft_plugin.app import file_mode, handles
from semsoft_plugin.app.classifier_fit import corrected_rows
from semsoft_plugin.app.classifier_settings import checked_settings
from semsoft_plugin.app.estimator import EstimatorProtocol
from semsoft_plugin.app.predictions import Predictions, probability_rows
from semsoft_plugin.app.texts import TextFitter, text_list
from semsoft_plugin.core.calibration import CONTENT_FREE, FileCalibration, debias
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.labels import LabelSet, label_names
from semsoft_plugin.core.result import LabelResult
from semsoft_plugin.engines.prompting import PromptTemplate, build_inputs

if TYPE_CHECKING:
    import numpy as np

__all__ = ["BACKENDS", "Classifier", "NotFittedError"]

BACKENDS = handles.BACKENDS


class NotFittedError(ValueError, AttributeError):
    """Used before ``fit`` where ``fit`` supplies something (the labels with
    ``labels=None``, the file correction with ``calibrate="file"``); a ``ValueError`` and an
    ``AttributeError``, as scikit-learn's own ``NotFittedError``."""


@dataclass(frozen=True)
class _Setup:
    """What the parameters resolve to for one label list, checked; rebuilt when a
    parameter is assigned (:meth:`EstimatorProtocol._cache`)."""

    loaded: handles.Loaded
    labels: LabelSet
    prompt: PromptTemplate
    config: SemsoftConfig
    fitter: TextFitter


class Classifier(EstimatorProtocol):
    """Calibrated zero-shot classification of texts by an LLM, a scikit-learn estimator.

    Parameters are stored as given and checked where they are used (``fit``,
    ``predict*``; :meth:`from_pretrained` checks them and loads the model at once), as
    scikit-learn requires of an estimator.

    Parameters
    ----------
    model : a model name (``"default"``, ``"smollm2-135m"``) or checkpoint directory, as
        :func:`semsoft_plugin.engines.models.resolve` finds it, loaded on first use and
        shared by every classifier naming it in this process; or a loaded transformers
        causal LM or ``vllm.LLM`` (scored through
        :func:`~semsoft_plugin.engines.vllm.classify_vllm`; the engine needs
        ``max_logprobs >= k``), shared by reference with every clone
    tokenizer : a loaded transformers model's tokenizer; ``None`` for a name or a
        ``vllm.LLM`` (its own is used)
    labels : label names, any ordered sequence (list, tuple, numpy array such as another
        estimator's ``classes_``, ``dict_keys``; not a set, which has no order), scored as
        leading-space whole words after the answer prefix and listed in this order in the
        prompt's ``{labels}``; with transformers also a ready
        :class:`~semsoft_plugin.core.labels.LabelSet`; ``None``: the sorted labels of
        ``y`` in :meth:`fit`. ``classes_`` holds them sorted and every output's columns
        follow ``classes_``: scikit-learn's metrics assume probability columns in sorted
        label order (``log_loss`` warns and misreads them otherwise).
    prompt : a :class:`~semsoft_plugin.engines.prompting.PromptTemplate`, or a user message with
        ``{text}`` (and optionally ``{labels}``) and the default answer prefix
        ``"Answer:"``; default: the prompt of ``semsoft classify``
    config : Semantic Softmax settings (e.g. ``SemsoftConfig.load`` of a ``semsoft
        tune`` file); default ``SemsoftConfig()``
    k, semantic_weight, score_temperature : override these fields of ``config`` (``None``: the
        config's): the settings a search varies (``GridSearchCV`` over
        ``semantic_weight``)
    batch_size : texts per forward pass (transformers; vLLM schedules its own)
    progress : show the adapter's progress bar (default: when there is more than one
        batch)
    calibrate : ``None``, ``"contextual"`` or ``"file"``: also divide out the prompt's
        label bias, read from content-free inputs (Zhao et al., 2021; three passes, see
        :meth:`content_free_bias`), or (the file mode, :mod:`~semsoft_plugin.app.file_mode`)
        the mean distribution of the distinct texts given to ``fit(texts)``, estimated
        once and applied to each row alone. Opt-in: it harms a file where one label is
        truly the majority, which the guard below spares only when the model is sure
    file_strength : with ``calibrate="file"``, ``"auto"`` (the guard,
        :mod:`~semsoft_plugin.core.calibration`: all of the correction when the fit texts'
        mean top probability is at most 1/2, none above, where a sure model's lean is the
        texts' content) or the share applied in [0, 1], dividing by ``bias ** file_strength``
    exact_head : transformers: compute the decision step's logits with a float32 head
        (:func:`~semsoft_plugin.engines.hf.float32_head`) when the model is bf16/fp16, so
        different texts do not tie on bf16's coarse grid (a vLLM engine loaded by name
        runs its head in float32 the same way)
    max_text_tokens : at most this many tokens of each text are scored (a cost bound);
        default: as many as the model's context holds with the prompt around them
    truncate : what to do with a text longer than that: ``True`` (default) keeps its
        first tokens, cut at a token boundary, and reports the number of tokens dropped
        in ``Predictions.truncated``; ``False`` refuses it (``ValueError`` naming its
        index and length). A text is never scored at positions the model was not
        trained for: the context is ``max_position_embeddings`` (transformers) or the
        engine's ``max_model_len`` (vLLM), less the one decision token.
    backend : a named model's engine, ``"hf"`` (transformers, the default) or ``"vllm"``
        (a ``vllm.LLM`` built with the plugin and ``max_logprobs = k``); a loaded model's
        is its own
    dtype : a named transformers model's weights (``"auto"``: bf16 where the CPU has
        native bf16, else float32: ``models.default_dtype()``)
    engine_args : a named vLLM model's ``vllm.LLM`` arguments, e.g.
        ``{"tensor_parallel_size": 4}``; the head runs in float32 unless ``hf_overrides``
        sets another ``head_dtype``
    fit_grid : what :meth:`fit` searches: config field -> values (default:
        ``semantic_weight`` over 0, 0.1, ..., 1; ``{}``: nothing)
    fit_temperature : whether :meth:`fit` also fits a final temperature. With
        ``fit_grid={}`` and ``fit_temperature=False`` (or ``fit_family=()``) fit only
        reads the labels, as a search over this classifier's own settings wants
        (``GridSearchCV`` over ``semantic_weight`` or ``score_temperature``)
    fit_family : the members :meth:`fit` may choose (:data:`~semsoft_plugin.core.fitting.FAMILY`:
        ``"grid"``, ``"temperature"``, ``"offset"``, ``"batch"``, ``"contextual"``,
        ``"probe"``, the last refused on vLLM); ``None``: all the engine supports
    n_folds, margin, random_state : :meth:`fit`'s rule: the start is kept unless the fit
        beats it by ``margin`` standard errors of out-of-fold NLL over ``n_folds``
        stratified folds (fold seed ``random_state``; :mod:`semsoft_plugin.core.fitting`)

    Attributes
    ----------
    classes_ : the label names sorted (available before ``fit`` when ``labels`` is given)
    labels_ : after ``fit``: the label names, in prompt order
    fitted_config_ : after ``fit``: the :class:`SemsoftConfig` every prediction uses
    fit_result_ : after ``fit``: what the fit chose and why (``None`` if it searched
        nothing or the fit was loaded by :meth:`load_fit`)
    fitted_correction_ : after ``fit``: what a bias member or the probe adds after
        ``fitted_config_``, row by row (:class:`~semsoft_plugin.app.fitted.FittedCorrection`),
        or ``None``; :meth:`save_fit` writes both to one config file
    file_calibration_ : after ``fit`` with ``calibrate="file"``: the
        :class:`~semsoft_plugin.core.calibration.FileCalibration` every prediction applies
        (its bias in ``classes_`` order)
    """

    _shared_params = ("model", "tokenizer")

    def __init__(
        self,
        model: Any = "default",
        tokenizer: Any = None,
        labels: Sequence[str] | LabelSet | None = None,
        *,
        prompt: PromptTemplate | str | None = None,
        config: SemsoftConfig | None = None,
        k: int | None = None,
        semantic_weight: float | None = None,
        score_temperature: float | None = None,
        batch_size: int = 8,
        progress: bool | None = False,
        calibrate: str | None = None,
        file_strength: float | str = "auto",
        exact_head: bool = True,
        max_text_tokens: int | None = None,
        truncate: bool = True,
        backend: str | None = None,
        dtype: str = "auto",
        engine_args: Mapping[str, Any] | None = None,
        fit_grid: Mapping[str, Sequence[Any]] | None = None,
        fit_temperature: bool = True,
        fit_family: Sequence[str] | None = None,
        n_folds: int = 5,
        margin: float = 1.0,
        random_state: int = 0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.labels = labels
        self.prompt = prompt
        self.config = config
        self.k = k
        self.semantic_weight = semantic_weight
        self.score_temperature = score_temperature
        self.batch_size = batch_size
        self.progress = progress
        self.calibrate = calibrate
        self.file_strength = file_strength
        self.exact_head = exact_head
        self.max_text_tokens = max_text_tokens
        self.truncate = truncate
        self.backend = backend
        self.dtype = dtype
        self.engine_args = engine_args
        self.fit_grid = fit_grid
        self.fit_temperature = fit_temperature
        self.fit_family = fit_family
        self.n_folds = n_folds
        self.margin = margin
        self.random_state = random_state

    @classmethod
    def from_pretrained(
        cls, model: str = "default", labels: Sequence[str] | None = None, **kwargs: Any
    ) -> Classifier:
        """A classifier on a model by name or checkpoint directory (``model``, ``labels``
        and ``**kwargs`` as the constructor's), its settings checked and the model loaded
        now (so a bad option or label fails before any text)."""
        classifier = cls(model, None, labels, **kwargs)
        if labels is not None:
            classifier._setup()
        return classifier

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's tags (scikit-learn >= 1.6): a classifier of texts (1-D strings),
        multiclass, usable before ``fit`` when the labels are given but not in file mode."""
        from sklearn.utils import ClassifierTags, InputTags, Tags, TargetTags

        return Tags(
            estimator_type="classifier",
            target_tags=TargetTags(required=self.calibrate != "file"),
            classifier_tags=ClassifierTags(),
            input_tags=InputTags(one_d_array=True, two_d_array=False, string=True),
            requires_fit=self.labels is None or self.calibrate == "file",
        )

    # -- scikit-learn surface -------------------------------------------------
    @property
    def classes_(self) -> np.ndarray:
        """The label names sorted (as ``np.unique`` sorts them): the column order of
        :meth:`predict_proba`, as scikit-learn expects."""
        import numpy as np

        return np.array(sorted(self._names()))

    def predict_proba(self, texts: Iterable[str]) -> np.ndarray:
        """``[N, L]`` float64 calibrated probabilities (Semantic Softmax), rows sum to 1."""
        return self.predict_details(texts).probs

    def predict(self, texts: Iterable[str]) -> np.ndarray:
        """The calibrated label of each text (an element of ``classes_``)."""
        import numpy as np

        return np.array(self.predict_details(texts).label)

    def score(self, texts: Iterable[str], y: Iterable[str], sample_weight: Any = None) -> float:
        """Accuracy of :meth:`predict` against ``y`` (scikit-learn's ``accuracy_score``,
        what a classifier's ``score`` is; ``GridSearchCV`` uses it without a scorer)."""
        from sklearn.metrics import accuracy_score

        return float(accuracy_score(y, self.predict(texts), sample_weight=sample_weight))

    def fit(self, texts: Iterable[str], y: Iterable[str] | None = None) -> Classifier:
        """Fit the settings to a few labelled texts (50-200 are enough), or, with
        ``calibrate="file"`` and no ``y``, estimate the file correction from the texts to
        classify; returns ``self``.

        One forward pass per text; then :func:`semsoft_plugin.core.fit_family.fit_config` on
        the kept decision-step scores (the fit ``semsoft tune`` runs): from the
        classifier's settings (``config`` with ``k``, ``semantic_weight``,
        ``score_temperature``), each member of ``fit_family`` is checked out of fold (the
        fields of ``fit_grid`` with a final temperature if ``fit_temperature``, a
        temperature alone, the bias corrections, the probe), and the start is *kept*
        unless one beats it by ``margin`` standard errors of out-of-fold NLL (stratified
        ``n_folds`` folds), so a few uninformative labels leave the classifier as it
        was. With nothing to search, no text is scored.

        Afterwards the predictions use ``fitted_config_`` and, where a bias member or the
        probe won, ``fitted_correction_`` after it, each row alone (its score never
        depends on its batch). ``save_fit(path)`` writes both to the file ``semsoft
        classify --config`` and :meth:`load_fit` read; without a correction it is a plain
        :class:`SemsoftConfig` file, which the vLLM per-request options also take.
        ``fit_result_`` says what was chosen and why. The parameters are not changed.

        With ``calibrate="file"``, ``fit(texts)`` scores each distinct text once (at
        least 32) and keeps their mean label distribution as ``file_calibration_``. The
        labelled search scores uncorrected probabilities, so ``fit(texts, y)`` with
        ``calibrate="file"`` is refused unless it searches nothing (``fit_grid={}``,
        ``fit_temperature=False``: it reads the labels and estimates the correction on
        ``texts``, as a ``GridSearchCV`` over ``file_strength`` wants).

        Parameters
        ----------
        texts : the labelled texts; with ``calibrate="file"``, the texts to classify
        y : their labels, elements of ``classes_`` (with ``labels=None``: any strings,
            which become the labels); ``None`` only with ``calibrate="file"``
        """
        from semsoft_plugin.app.classifier_fit import checked_family, fit_labelled, fit_targets
        from semsoft_plugin.core import fitting

        values = text_list(texts)
        names, targets = fit_targets(self, values, y)
        unlabelled = targets is None
        searched = bool(checked_family(self.fit_family, handles.engine_of(self)))
        setup = self._setup(names)
        self._forget_fit()
        default = {"semantic_weight": fitting.DEFAULT_WEIGHTS}
        axes = default if self.fit_grid is None else dict(self.fit_grid)
        searched = searched and bool(axes or self.fit_temperature)
        if self.calibrate == "file" and (unlabelled or not searched):
            self._fit_file(setup, names, values)
            return self
        if self.calibrate is not None:
            raise ValueError(
                f"fit(texts, y) with calibrate={self.calibrate!r}: the fit scores uncorrected "
                "probabilities, so its choice would not hold once corrected; fit with "
                "calibrate=None (calibrate='file': fit(texts) without y, or fit_grid={} and "
                "fit_temperature=False to only read the labels)"
            )
        result, correction = None, None
        if searched and targets is not None:
            result, correction = fit_labelled(self, setup, values, targets, axes)
        self.labels_ = tuple(names)
        self.fit_result_ = result
        self.fitted_config_ = setup.config if result is None else result.config
        self.fitted_correction_ = correction
        return self

    def save_fit(self, path: Any) -> None:
        """Write ``fitted_config_`` and ``fitted_correction_`` to a config file (JSON; a
        probe's weights beside it with safetensors: :mod:`semsoft_plugin.app.fitted`)."""
        from semsoft_plugin.app.classifier_fit import fit_identity
        from semsoft_plugin.app.fitted import save_fitted

        if "fitted_config_" not in self.__dict__:
            raise NotFittedError("save_fit needs a fitted classifier: call fit first")
        correction = self.__dict__.get("fitted_correction_")
        identity = None if correction is None else fit_identity(self, correction.labels)
        save_fitted(path, self.fitted_config_, correction, identity)

    def load_fit(self, path: Any) -> Classifier:
        """Take the fit a config file holds (``semsoft tune``'s or :meth:`save_fit`'s) as
        this classifier's ``fitted_config_`` and ``fitted_correction_`` (its labels must
        be this classifier's); returns ``self``."""
        from semsoft_plugin.app.classifier_fit import loaded_fit

        config, correction = loaded_fit(self, path)
        self._forget_fit()
        self.labels_, self.fit_result_ = tuple(self._names()), None
        self.fitted_config_, self.fitted_correction_ = config, correction
        return self

    def _forget_fit(self) -> None:
        fitted = ("labels_", "fit_result_", "fitted_config_", "fitted_correction_")
        for name in (*fitted, "file_calibration_"):
            self.__dict__.pop(name, None)  # a refit starts afresh

    def _fit_file(self, setup: _Setup, names: list[str], values: list[str]) -> None:
        """The file mode's fit: the correction of the distinct ``values``, no search."""
        raw = self._raw_details(setup, list(dict.fromkeys(values)))
        self.file_calibration_ = FileCalibration.estimate(raw.probs, strength=self.file_strength)
        self.labels_, self.fit_result_, self.fitted_config_ = tuple(names), None, setup.config

    def _file_calibration(self, setup: _Setup) -> FileCalibration:
        """The fitted file correction, checked against the parameters now."""
        fitted, fit_labels = self.__dict__.get("file_calibration_"), self.__dict__.get("labels_")
        names = setup.labels.names
        return file_mode.checked_fit(fitted, self.file_strength, fit_labels, names, NotFittedError)

    # -- the parameters, resolved --------------------------------------------
    def _names(self) -> list[str]:
        """The label names in prompt order: the ``labels`` parameter's, else fit's."""
        if self.labels is not None:
            return label_names(self.labels)
        if "labels_" not in self.__dict__:
            raise NotFittedError(
                "labels=None: the labels come from fit(texts, y); fit the classifier or "
                "give labels=[...]"
            )
        return list(self.labels_)

    def _setup(self, names: list[str] | None = None) -> _Setup:
        """The loaded model, label set, prompt and settings, checked; cached per label
        list until a parameter is assigned."""
        names = self._names() if names is None else names
        cache = self._cache()
        key = ("setup", tuple(names))
        if key not in cache:
            cache[key] = self._build_setup(names)
        setup: _Setup = cache[key]
        return setup

    def _build_setup(self, names: list[str]) -> _Setup:
        prompt, config = checked_settings(self)
        loaded = handles.loaded(
            self.model, self.tokenizer, backend=self.backend, dtype=self.dtype,
            engine_args=self.engine_args, k=config.k,
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
        return _Setup(loaded, label_set, prompt, config, fitter)

    def _config(self, setup: _Setup) -> SemsoftConfig:
        """The settings predictions use: fit's, else the parameters'."""
        fitted: SemsoftConfig | None = self.__dict__.get("fitted_config_")
        return setup.config if fitted is None else fitted

    # -- scoring ----------------------------------------------------------------
    def inputs(self, texts: Iterable[str]) -> list[Any]:
        """The prompts (chat message lists, or strings without a chat template), each
        text cut to the length bound (see ``max_text_tokens``)."""
        values = text_list(texts)
        return self._setup().fitter.prompts(values)[0]

    def context_length(self) -> int | None:
        """Tokens the model attends to (:meth:`handles.Loaded.context_length`)."""
        return self._setup().loaded.context_length()

    def predict_details(self, texts: Iterable[str]) -> Predictions:
        """Labels, calibrated and constrained probabilities, coverage, fallback flags and
        the tokens cut from each text (see ``max_text_tokens``). With a ``calibrate``
        correction, ``probs`` and ``label`` are corrected, ``constrained_probs`` is not."""
        values = text_list(texts)
        setup = self._setup()
        correction = self._file_calibration(setup) if self.calibrate == "file" else None
        raw = self._raw_details(setup, values)  # scored after the check above
        if correction is not None:
            return raw.with_probs(correction.apply(raw.probs))
        if self.calibrate == "contextual":
            return raw.with_probs(debias(raw.probs, self._content_free_bias(setup)))
        return raw

    def _raw_details(self, setup: _Setup, values: list[str]) -> Predictions:
        """:meth:`predict_details` before any ``calibrate`` correction."""
        import numpy as np

        inputs, cut = setup.fitter.prompts(values)
        classes = tuple(sorted(setup.labels.names))
        if not inputs:
            empty = np.zeros((0, len(classes)))
            return Predictions(
                classes, [], empty, empty.copy(), np.zeros(0), np.zeros(0, bool), np.zeros(0, int)
            )
        results, p = corrected_rows(self, setup, inputs, classes)  # with the fit's correction
        constrained: list[Any] = [r.constrained_probs for r in results]
        return Predictions(
            labels=classes,
            label=[classes[i] for i in p.argmax(axis=1)],
            probs=p,
            constrained_probs=probability_rows(constrained, classes),
            coverage=np.array([r.coverage for r in results], dtype=np.float64),
            fallback=np.array([r.fallback for r in results], dtype=bool),
            truncated=np.array(cut, dtype=np.int64),
        )

    def content_free_bias(self) -> np.ndarray:
        """``[L]`` (``classes_`` order): the mean Semantic Softmax distribution of the
        content-free inputs ("N/A", "", "[MASK]") in this prompt, the label bias that
        ``calibrate="contextual"`` divides out. Three forward passes, computed once."""
        return self._content_free_bias(self._setup())

    def _content_free_bias(self, setup: _Setup) -> np.ndarray:
        cache = self._cache()
        key = ("bias", tuple(setup.labels.names), self._config(setup))
        if key not in cache:
            names = list(setup.labels.names)
            inputs = build_inputs(setup.prompt, list(CONTENT_FREE), names, setup.loaded.tokenizer)
            probs: list[Any] = [r.probs for r in self._classify(setup, inputs)]
            cache[key] = probability_rows(probs, sorted(names)).mean(axis=0)
        bias: np.ndarray = cache[key]
        return bias

    def _classify(self, setup: _Setup, inputs: list[Any], **options: Any) -> list[LabelResult]:
        """One observe-mode decision step per input (only that step decides the
        calibrated label) on this classifier's engine, through the adapter's batch
        function; ``options`` go to it, over the classifier's own settings."""
        names = list(setup.labels.names)
        config = self._config(setup)
        model = setup.loaded.model
        if setup.loaded.backend == "vllm":
            from semsoft_plugin.engines.vllm import classify_vllm

            own = {"mode": "observe", "max_tokens": 1, "progress": bool(self.progress)}
            return classify_vllm(model, inputs, names, config, **{**own, **options})
        from semsoft_plugin.engines.hf import classify

        own = {
            "config": config, "mode": "observe", "max_tokens": 1,
            "batch_size": self.batch_size, "progress": self.progress,
            "exact_head": self.exact_head,
        }  # fmt: skip
        tokenizer = setup.loaded.tokenizer
        return classify(model, tokenizer, inputs, setup.labels, **{**own, **options})
