"""``Classifier``: a scikit-learn-shaped estimator over a zero-shot LLM classifier.

One object holds the model, the labels, the prompt and the Semantic Softmax settings;
``predict_proba(texts)`` returns an ``[N, L]`` float64 array whose rows sum to one, in
the order of ``classes_``, so scikit-learn's metrics take it unchanged::

    clf = Classifier.from_pretrained("default", ["positive", "negative"])
    log_loss(y, clf.predict_proba(texts), labels=clf.classes_)

It is the one way the project scores texts: ``semsoft classify`` (one text or a whole
file) goes through it, and it goes through the engine adapters' batch functions,
:func:`semsoft_plugin.engines.hf.classify` (transformers) and
:func:`semsoft_plugin.engines.vllm.classify_vllm` (a ``vllm.LLM``), so the batching, padding
and scoring live in one place per engine. Both run the same forward pass as
``semsoft eval``: the decision step is the first token after the prompt's answer
prefix, and only that step is computed (observe mode, one new token), since the
calibrated label is the argmax of the scores it yields.

No engine is imported until a method needs it, nor numpy (which the estimator's
outputs are): ``import semsoft_plugin`` stays torch-only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from semsoft_plugin.app.predictions import Predictions, probability_rows
from semsoft_plugin.app.texts import text_list, token_prefixes
from semsoft_plugin.core.calibration import CONTENT_FREE, batch_calibrate, debias
from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.result import LabelResult
from semsoft_plugin.engines.prompting import (
    DEFAULT_TEMPLATE,
    PromptTemplate,
    build_inputs,
    encode_prompts,
    format_prompt,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["BACKENDS", "Classifier"]

BACKENDS = ("hf", "vllm")
CALIBRATIONS = (None, "contextual", "batch")
# Batch calibration divides by the batch's mean distribution: over a handful of texts
# that mean is mostly the texts' own content, not the prompt's bias.
MIN_BATCH_CALIBRATION = 16


def _is_vllm(model: Any) -> bool:
    return type(model).__module__.split(".")[0] == "vllm" and hasattr(model, "llm_engine")


class Classifier:
    """Calibrated zero-shot classification of texts by an LLM, scikit-learn style.

    Parameters
    ----------
    model : a transformers causal LM, or a ``vllm.LLM`` (scored through
        :func:`~semsoft_plugin.engines.vllm.classify_vllm`; the engine needs
        ``max_logprobs >= k``)
    tokenizer : the model's tokenizer; ``None`` for a ``vllm.LLM`` (its own is used)
    labels : label names (scored as leading-space whole words after the answer
        prefix; listed in this order in the prompt's ``{labels}``); with transformers
        also a ready :class:`~semsoft_plugin.core.labels.LabelSet`. ``classes_`` holds them
        sorted and every output's columns follow ``classes_``: scikit-learn's metrics
        assume probability columns in sorted label order (``log_loss`` warns and
        misreads them otherwise).
    prompt : a :class:`~semsoft_plugin.engines.prompting.PromptTemplate`, or a user message with
        ``{text}`` (and optionally ``{labels}``) and the default answer prefix
        ``"Answer:"``; default: the prompt of ``semsoft classify``
    config : Semantic Softmax settings (e.g. ``SemsoftConfig.load`` of a ``semsoft
        tune`` file); keyword ``overrides`` change single fields
    batch_size : texts per forward pass (transformers; vLLM schedules its own)
    progress : show the adapter's progress bar (default: when there is more than one
        batch)
    max_text_tokens : at most this many tokens of each text are scored (a cost bound);
        default: as many as the model's context holds with the prompt around them
    truncate : what to do with a text longer than that: ``True`` (default) keeps its
        first tokens, cut at a token boundary, and reports the number of tokens dropped
        in ``Predictions.truncated``; ``False`` refuses it (``ValueError`` naming its
        index and length). A text is never scored at positions the model was not
        trained for: the context is ``max_position_embeddings`` (transformers) or the
        engine's ``max_model_len`` (vLLM), less the one decision token.
    calibrate : ``None``, ``"batch"`` or ``"contextual"``: also divide out the prompt's
        label bias, estimated as the mean distribution of the texts of each call (batch
        calibration, Zhou et al., 2024; no extra pass, at least 16 texts a call; it
        assumes the call's texts are not dominated by one label) or read from
        content-free inputs scored the same way (Zhao et al., 2021; see
        :meth:`content_free_bias`: three forward passes per classifier)
    exact_head : transformers: compute the decision step's logits with a float32 head
        (:func:`~semsoft_plugin.engines.hf.float32_head`) when the model is bf16/fp16, so
        different texts do not tie on bf16's coarse grid (a vLLM engine built by
        :meth:`from_pretrained` runs its head in float32 the same way)
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        labels: Sequence[str] | LabelSet,
        *,
        prompt: PromptTemplate | str | None = None,
        config: SemsoftConfig | None = None,
        batch_size: int = 8,
        progress: bool | None = False,
        calibrate: str | None = None,
        exact_head: bool = True,
        max_text_tokens: int | None = None,
        truncate: bool = True,
        **overrides: Any,
    ) -> None:
        if max_text_tokens is not None and (
            isinstance(max_text_tokens, bool)
            or not isinstance(max_text_tokens, int)
            or max_text_tokens < 1
        ):
            raise ValueError(f"max_text_tokens={max_text_tokens!r} must be a positive int")
        if calibrate not in CALIBRATIONS:
            raise ValueError(f"calibrate={calibrate!r} must be one of {CALIBRATIONS}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive int")
        self.backend = "vllm" if _is_vllm(model) else "hf"
        if tokenizer is None:
            if self.backend != "vllm":
                raise ValueError("tokenizer is None: give the model's tokenizer")
            tokenizer = model.get_tokenizer()
        if isinstance(labels, LabelSet):
            if self.backend == "vllm":
                raise ValueError("a vLLM Classifier takes label names, not a LabelSet")
            label_set = labels
        else:
            # Built once here: bad labels fail now, and every batch reuses the set.
            label_set = LabelSet(labels, tokenizer)
        if isinstance(prompt, str):
            prompt = PromptTemplate(user=prompt)
        if prompt is not None and not isinstance(prompt, PromptTemplate):
            raise ValueError(
                f"prompt must be a PromptTemplate or a str, got {type(prompt).__name__}"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.labels = label_set
        self.prompt: PromptTemplate = prompt or DEFAULT_TEMPLATE
        self.config = (config or SemsoftConfig()).replace(**overrides)
        # What fit() starts from, however often it runs (fit replaces self.config).
        self.start_config = self.config
        self.batch_size = batch_size
        self.progress = progress
        self._classes = tuple(sorted(label_set.names))
        self.calibrate = calibrate
        self.exact_head = exact_head
        self.max_text_tokens = max_text_tokens
        self.truncate = bool(truncate)
        self._bias: np.ndarray | None = None
        self._overhead: int | None = None

    @classmethod
    def from_pretrained(
        cls,
        model: str = "default",
        labels: Sequence[str] = (),
        *,
        backend: str = "hf",
        engine_args: Mapping[str, Any] | None = None,
        dtype: str = "auto",
        **kwargs: Any,
    ) -> Classifier:
        """A classifier on a model by name (``"default"``, ``"qwen2.5-coder-1.5b"``) or
        checkpoint directory, as :func:`semsoft_plugin.engines.models.resolve` finds it.

        Parameters
        ----------
        backend : ``"hf"`` (transformers; ``dtype`` of the weights, default
            ``models.default_dtype()``: bf16 where the CPU has native bf16, else float32) or ``"vllm"`` (a ``vllm.LLM`` built
            with the plugin and ``max_logprobs = k``; ``engine_args`` go to it, e.g.
            ``{"tensor_parallel_size": 4}`` or ``{"dtype": "float32"}``; the head runs in
            float32 unless ``hf_overrides`` sets another ``head_dtype``)
        **kwargs : the constructor's keywords (``prompt``, ``config``, ``batch_size``, ...)
        """
        from semsoft_plugin.engines import models

        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} must be one of {BACKENDS}")
        if engine_args and backend != "vllm":
            raise ValueError(f"engine_args {dict(engine_args)!r} apply only to backend='vllm'")
        if backend == "hf":
            loaded, tokenizer = models.load(model, dtype=dtype)
            return cls(loaded, tokenizer, labels, **kwargs)
        from vllm import LLM

        from semsoft_plugin.core.request import ENTRY_POINT

        k = (kwargs.get("config") or SemsoftConfig()).replace(k=kwargs.get("k")).k
        args = {"max_logprobs": k, **dict(engine_args or {})}
        # The decision step's logits from a float32 head (vLLM's own option): in bf16 they
        # fall on a coarse grid, so different texts tie and scores move with the batch.
        args["hf_overrides"] = {"head_dtype": "float32", **dict(args.get("hf_overrides") or {})}
        # If the entry point is installed too, the second copy of the processor stands down.
        llm = LLM(str(models.resolve(model)), logits_processors=[ENTRY_POINT], **args)
        return cls(llm, None, labels, **kwargs)

    # -- scikit-learn surface -------------------------------------------------
    @property
    def classes_(self) -> np.ndarray:
        """The label names sorted (as ``np.unique`` sorts them): the column order of
        :meth:`predict_proba`, as scikit-learn expects."""
        import numpy as np

        return np.array(self._classes)

    def predict_proba(self, texts: Iterable[str]) -> np.ndarray:
        """``[N, L]`` float64 calibrated probabilities (Semantic Softmax), rows sum to 1."""
        return self.predict_details(texts).probs

    def predict(self, texts: Iterable[str]) -> np.ndarray:
        """The calibrated label of each text (an element of ``classes_``)."""
        import numpy as np

        return np.array(self.predict_details(texts).label)

    def fit(
        self,
        texts: Sequence[str],
        y: Sequence[str],
        *,
        grid: Mapping[str, Sequence[Any]] | None = None,
        temperature: bool = True,
        n_folds: int = 5,
        margin: float = 1.0,
        seed: int = 0,
    ) -> Classifier:
        """Fit the settings to a few labelled texts (50-200 are enough); returns ``self``.

        One forward pass per text; then :func:`semsoft_plugin.core.fitting.fit_config` on the
        kept decision-step scores: from the classifier's config (the label-free default
        unless one was given), the pool weight ``semantic_weight`` over a grid and a final
        ``temperature`` are fitted, and the start is *kept* unless the fit beats it by
        ``margin`` standard errors of out-of-fold NLL (stratified ``n_folds`` folds), so
        a few uninformative labels leave the classifier as it was.

        Afterwards :meth:`predict_proba` uses ``fitted_config_``, a plain
        :class:`SemsoftConfig`: ``fitted_config_.save(path)`` writes the file that
        ``--config``, ``SemsoftConfig.load`` and the vLLM per-request options take
        (``sampling_params(labels, config=...)`` / ``semsoft_*`` ``vllm_xargs``).
        ``fit_result_`` says what was chosen and why.

        Parameters
        ----------
        texts : the labelled texts
        y : their labels, elements of ``classes_``
        grid : config field -> values searched (default: ``semantic_weight`` 0, 0.1, ..., 1)
        temperature : also fit a final temperature
        n_folds, margin, seed : the rule (see :mod:`semsoft_plugin.core.fitting`)
        """
        from semsoft_plugin.core import fitting

        if self.calibrate is not None:
            raise ValueError(
                f"fit with calibrate={self.calibrate!r}: the fit scores the uncalibrated "
                "probabilities; build the classifier with calibrate=None to fit it"
            )
        names = list(self.labels.names)
        index = {name: i for i, name in enumerate(names)}
        given = [] if isinstance(y, str) else [str(label) for label in y]
        if len(given) != len(texts):
            raise ValueError(f"y must hold one label per text ({len(texts)}), got {len(given)}")
        unknown = [label for label in given if label not in index]
        if unknown:
            raise ValueError(f"y holds {unknown[0]!r}, which is not a label; labels: {names}")
        targets = [index[label] for label in given]
        start = self.start_config
        axes = {"semantic_weight": fitting.DEFAULT_WEIGHTS} if grid is None else dict(grid)
        store_k = max(c.k for c in fitting.grid_configs(axes, start))
        kept = self._kept(self.inputs(texts), store_k)
        result = fitting.fit_config(
            kept, self._embeddings(), self.labels, targets, start=start, grid=axes,
            temperature=temperature, n_folds=n_folds, margin=margin, seed=seed,
        )  # fmt: skip
        self.fit_result_ = result
        self.fitted_config_ = result.config
        self.config = result.config
        return self

    def _kept(self, inputs: list[Any], store_k: int) -> Any:
        """The decision step's top ``store_k`` raw scores and every label token's
        (:class:`~semsoft_plugin.core.kept_scores.KeptScores`), from this classifier's engine."""
        import torch

        from semsoft_plugin.core.kept_scores import KeptScores, compress, kept_from_top_logprobs
        from semsoft_plugin.core.kept_scores import label_token_ids as token_ids_of

        token_ids = token_ids_of(self.labels)
        if self.backend == "vllm":
            results = self._classify(inputs, keep_logprobs=store_k, token_ids=token_ids)
            return kept_from_top_logprobs(results, token_ids)
        # The fit keeps logits from hf.classify's default float32 head, as it always has.
        classified = self._classify(inputs, keep_logits=True, exact_head=True)
        rows = torch.stack([c.logits for c in classified if c.logits is not None])
        ids = torch.tensor(token_ids)
        top_ids, top_logits, label_logits = compress(rows, store_k, ids)
        return KeptScores(top_ids, top_logits, ids, label_logits)

    def _embeddings(self) -> Any:
        if self.backend == "vllm":
            from semsoft_plugin.engines.scoring import output_embeddings

            return output_embeddings(self.model)
        from semsoft_plugin.core.embeddings import from_model

        return from_model(self.model)

    # -- everything ---------------------------------------------------------
    def inputs(self, texts: Iterable[str]) -> list[Any]:
        """The prompts (chat message lists, or strings without a chat template), each
        text cut to the length bound (see ``max_text_tokens``)."""
        return self._fitted(text_list(texts))[0]

    # -- the length bound ------------------------------------------------------
    def context_length(self) -> int | None:
        """Tokens the model attends to: the vLLM engine's ``max_model_len``, else the
        transformers config's ``max_position_embeddings`` (``None`` if it has none)."""
        if self.backend == "vllm":
            return int(self.model.llm_engine.model_config.max_model_len)
        n = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def _prompt_length(self, text: str) -> int:
        item = build_inputs(self.prompt, [text], list(self.labels.names), self.tokenizer)[0]
        return len(encode_prompts(self.tokenizer, [format_prompt(self.tokenizer, item)])[0])

    def _fitted(self, texts: list[str]) -> tuple[list[Any], list[int]]:
        """The prompts for ``texts`` within the length bound, and the tokens cut per text.

        The prompt is encoded exactly as the engines encode it, so the bound holds for
        the tokens they see: at most ``context_length() - 1`` (the decision token
        follows the prompt), and at most ``max_text_tokens`` of the text. A text whose
        UTF-8 length plus the prompt's own tokens is within both bounds needs no check
        (a token is at least one byte); only longer ones are tokenised here.
        """
        context = self.context_length()
        budget = None if context is None else context - 1
        if self._overhead is None:
            self._overhead = self._prompt_length("x")
        cut = [0] * len(texts)
        fitted = list(texts)
        for index, text in enumerate(texts):
            size = len(text.encode("utf-8"))
            small_enough = self.max_text_tokens is None or size <= self.max_text_tokens
            if small_enough and (budget is None or size + self._overhead + 8 <= budget):
                continue
            fitted[index], cut[index] = self._fit_one(index, text, budget)
        prompts = build_inputs(self.prompt, fitted, list(self.labels.names), self.tokenizer)
        return prompts, cut

    def _fit_one(self, index: int, text: str, budget: int | None) -> tuple[str, int]:
        """One text cut at a token boundary to fit; (text, tokens dropped)."""
        size, prefix = token_prefixes(self.tokenizer, text)
        keep = size if self.max_text_tokens is None else min(size, self.max_text_tokens)
        for _ in range(4):  # the cut text can tokenise with the prompt a token longer
            piece = prefix(keep)
            over = 0 if budget is None else self._prompt_length(piece) - budget
            if over <= 0:
                break
            keep -= over
            if keep < 1:
                raise ValueError(
                    f"texts[{index}]: the prompt without the text is about "
                    f"{self._overhead} tokens; it leaves no room for text in the context of "
                    f"{budget + 1 if budget is not None else '?'} tokens"
                )
        else:
            raise ValueError(f"texts[{index}] could not be cut to fit the context")
        dropped = size - keep
        if dropped and not self.truncate:
            limit = "max_text_tokens" if keep == self.max_text_tokens else "the context"
            raise ValueError(
                f"texts[{index}] has {size} tokens; {limit} leaves room for {keep} "
                "(pass truncate=True to score its first tokens)"
            )
        return piece, dropped

    def predict_details(self, texts: Iterable[str]) -> Predictions:
        """Labels, calibrated and constrained probabilities, coverage, fallback flags and
        the tokens cut from each text (see ``max_text_tokens``)."""
        import numpy as np

        inputs, cut = self._fitted(text_list(texts))
        classes = self._classes
        if self.calibrate == "batch" and len(inputs) < MIN_BATCH_CALIBRATION:
            raise ValueError(
                f"calibrate='batch' needs at least {MIN_BATCH_CALIBRATION} texts per call, got "
                f"{len(inputs)}: the bias is their mean distribution (for one text at a time use "
                "semsoft_plugin.core.calibration.RunningBias, or calibrate='contextual')"
            )
        if not inputs:
            empty = np.zeros((0, len(classes)))
            return Predictions(
                classes, [], empty, empty.copy(), np.zeros(0), np.zeros(0, bool), np.zeros(0, int)
            )
        probs, constrained, coverage, fallback = self._score(inputs)
        p = probability_rows(probs, classes)
        if self.calibrate == "contextual":
            p = debias(p, self.content_free_bias())
        elif self.calibrate == "batch":
            p = batch_calibrate(p)
        return Predictions(
            labels=classes,
            label=[classes[i] for i in p.argmax(axis=1)],
            probs=p,
            constrained=probability_rows(constrained, classes),
            coverage=np.array(coverage, dtype=np.float64),
            fallback=np.array(fallback, dtype=bool),
            truncated=np.array(cut, dtype=np.int64),
        )

    def content_free_bias(self) -> np.ndarray:
        """``[L]`` (``classes_`` order): the mean Semantic Softmax distribution of the
        content-free inputs ("N/A", "", "[MASK]") in this prompt, the label bias that
        ``calibrate="contextual"`` divides out. Three forward passes, computed once."""
        if self._bias is None:
            inputs = build_inputs(
                self.prompt, list(CONTENT_FREE), list(self.labels.names), self.tokenizer
            )
            probs = self._score(inputs)[0]
            self._bias = probability_rows(probs, self._classes).mean(axis=0)
        return self._bias

    def _score(self, inputs: list[Any]) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        """Per input: Semantic Softmax and constrained dicts, coverage, fallback."""
        results = self._classify(inputs)
        return (
            [r.probs for r in results],
            [r.constrained_probs for r in results],
            [r.coverage for r in results],
            [r.fallback for r in results],
        )

    def _classify(self, inputs: list[Any], **options: Any) -> list[LabelResult]:
        """One observe-mode decision step per input (only that step decides the
        calibrated label) on this classifier's engine, through the adapter's batch
        function; ``options`` go to it, over the classifier's own settings."""
        names = list(self.labels.names)
        if self.backend == "vllm":
            from semsoft_plugin.engines.vllm import classify_vllm

            own = {"mode": "observe", "max_tokens": 1, "use_tqdm": bool(self.progress)}
            return classify_vllm(self.model, inputs, names, self.config, **{**own, **options})
        from semsoft_plugin.engines.hf import classify

        own = {
            "config": self.config, "mode": "observe", "max_new_tokens": 1,
            "batch_size": self.batch_size, "progress": self.progress,
            "exact_head": self.exact_head,
        }  # fmt: skip
        return classify(self.model, self.tokenizer, inputs, self.labels, **{**own, **options})

    def __repr__(self) -> str:
        return (
            f"Classifier(backend={self.backend!r}, labels={list(self.labels.names)}, "
            f"config={self.config})"
        )
