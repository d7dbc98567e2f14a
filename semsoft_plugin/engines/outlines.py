"""Outlines adapter: calibrated probabilities for existing choice generators.

Change one import::

    # from outlines import Generator
    from semsoft_plugin.engines.outlines import Generator

    gen = Generator(model, Literal["joy", "sadness", "anger"])
    label = gen(prompt)            # "sadness": the same str Outlines returns
    label.probs                    # {"joy": 0.07, "sadness": 0.88, "anger": 0.05}

or keep a generator that already exists: ``gen = wrap(gen, ["joy", "sadness", "anger"])``.

Supported output types are the *choices*: ``Literal[...]``, an ``Enum``,
``outlines.types.Choice``, and a regex (``outlines.types.Regex`` / ``regex(...)``)
that spells a finite set of literal strings, such as ``(joy|sadness|anger)``.
Anything else (JSON schema, free regex, CFG, ``int``...) raises ``ValueError``:
nothing is generated unscored.

How it plugs in (transformers models, checked against Outlines 1.3.3):

* Outlines compiles the choice into a regex and, for transformers models, into an
  in-place masking logits processor (outlines_core, xgrammar or llguidance). The
  only supported way to add a processor is ``outlines.Generator(model,
  processor=...)`` / ``SteerableGenerator.from_processor``, and that processor is
  then the *only* one: passing ``logits_processor=`` to a call collides with it.
  This module therefore hands Outlines one processor, :class:`ChoiceLogitsProcessor`,
  that runs :class:`~semsoft_plugin.engines.hf.SemanticSoftmaxLogitsProcessor` in
  ``"constrain"`` mode first (it sees the raw logits) and Outlines' own regex mask
  second.
* Agreement with the calibrated argmax: at the decision step the semsoft processor
  leaves only the labels' first tokens, at ``log P_sem``; afterwards it forces the
  rest of the chosen label, then EOS. Every one of these tokens spells a prefix of
  a label, so Outlines' mask (applied after) cannot remove any of them and changes
  nothing: greedy decoding emits the calibrated argmax, sampling draws from
  ``P_sem``. The processor checks this on every step and raises if the Outlines
  mask ever removed a token it kept (e.g. a wrapped generator whose regex does not
  match the labels given). Outlines' own decision would be different: its prefix
  mask also allows label *fragments* (``"s"``, ``"sad"``...) and each fragment
  competes alone, so the label it emits need not be the one the scores favour.
* Position and template: the scores are taken inside the very ``generate`` call
  Outlines makes, at the first generated token, so they follow Outlines' prompt
  formatting exactly (a string prompt goes through the chat template with a
  generation prompt when the tokenizer has one).
* Label spelling: Outlines writes the choice verbatim, with no leading space, at
  the start of the answer; the labels are scored exactly so
  (``LabelSet(..., leading_space=False)``). Some labels then start with a word
  fragment (SmolLM2 writes ``"sadness"`` as ``"s" "ad" "ness"``), whose output
  embedding says little about the label, so each label's embedding is read from its
  leading-space word (``" sadness"``) instead; ``generator.labels.report()`` lists
  both.
  Choices that all start with one space (``Literal[" joy", " sad"]``) are scored as
  leading-space words. Verbalizers cannot be used: Outlines' regex only allows the
  choice text itself.

vLLM models (``outlines.from_vllm_offline``): Outlines would send the regex through
vLLM's structured outputs, which mask the logits before any logits processor runs,
so the silent vote would be gone. The request goes through the plugin's vLLM adapter
instead (:func:`semsoft_plugin.engines.vllm.sampling_params`: its processor does the label
constraint, the scores are read back with :func:`semsoft_plugin.engines.vllm.label_scores`),
with the prompt formatted as Outlines formats it. The engine needs the processor
(``LLM(..., logits_processors=[semsoft_plugin.engines.vllm.SemanticSoftmaxLogitsProcessor])``
or the installed entry point) and ``max_logprobs >= k`` (50 by default).
``constrained_probs`` is None there when a label's first token is outside the
returned top-k.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.labels import LabelSet, label_names
from semsoft_plugin.core.result import ScoredLabel
from semsoft_plugin.core.softmax import SemanticSoftmaxResult
from semsoft_plugin.engines.choices import choice_label_set, choice_labels
from semsoft_plugin.engines.hf import SemanticSoftmaxLogitsProcessor

__all__ = [
    "ChoiceGenerator",
    "ChoiceLogitsProcessor",
    "Generator",
    "ScoredLabel",
    "choice_labels",
    "wrap",
]

# ---------------------------------------------------------------------------
# transformers models: one processor, semsoft first, Outlines' mask second
# ---------------------------------------------------------------------------


class ChoiceLogitsProcessor:
    """Semantic Softmax constraint followed by an Outlines mask, as one processor.

    Parameters
    ----------
    semsoft : SemanticSoftmaxLogitsProcessor
        In ``"constrain"`` mode, with the tokenizer's EOS as ``eos_token_id``.
    outlines_processor : an Outlines logits processor (any backend)
        Applied to what the semsoft processor returns. It only ever removes tokens;
        on a step where semsoft constrained a row, every token semsoft kept must
        survive it, else ``RuntimeError`` (the regex and the labels disagree).
    """

    def __init__(self, semsoft: SemanticSoftmaxLogitsProcessor, outlines_processor: Any) -> None:
        if semsoft.mode != "constrain":
            raise ValueError(
                f"the semsoft processor must be in constrain mode, not {semsoft.mode!r}"
            )
        self.semsoft = semsoft
        self.outlines_processor = outlines_processor

    def reset(self) -> None:
        """Start a new generation (Outlines calls this before every call)."""
        self.semsoft.reset()
        self.outlines_processor.reset()

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        scores = self.semsoft(input_ids, scores)
        kept = torch.isfinite(scores)
        constrained_rows = ~kept.all(dim=-1)
        scores = self.outlines_processor(input_ids, scores)
        removed = kept & ~torch.isfinite(scores) & constrained_rows.unsqueeze(-1)
        if removed.any():
            row, token = (int(i) for i in removed.nonzero()[0])
            raise RuntimeError(
                f"the Outlines mask removed token {token} that the label constraint "
                f"allowed (batch row {row}): the generator's output type does not match "
                f"the labels {list(self.semsoft.labels.names)}"
            )
        return scores


def _result_rows(proc: SemanticSoftmaxLogitsProcessor) -> list[SemanticSoftmaxResult]:
    rows = proc.results
    if any(r is None for r in rows):
        raise RuntimeError("the decision step was not reached: nothing was generated")
    return rows  # type: ignore[return-value]


class ChoiceGenerator:
    """A choice generator whose outputs carry calibrated probabilities.

    Made by :func:`Generator` or :func:`wrap`; called like an Outlines generator.

    Attributes
    ----------
    model : the Outlines model
    labels : LabelSet
        The choices, bound to the model's tokenizer as Outlines writes them.
    processor : ChoiceLogitsProcessor
        The one processor handed to Outlines (semsoft constraint, then its mask).
    """

    def __init__(
        self,
        model: Any,
        choices: Sequence[str],
        outlines_processor: Any,
        *,
        config: SemsoftConfig | None = None,
        variants: Mapping[str, Iterable[str]] | None = None,
        **overrides: Any,
    ) -> None:
        self.model = model
        self._vllm = _check_model(model) == "vllm"
        if self._vllm:
            self._init_vllm(choices, config, variants, overrides)
            return
        from outlines.generator import SteerableGenerator

        tokenizer = model.hf_tokenizer
        self.labels = choice_label_set(choices, tokenizer, variants)
        self.semsoft = SemanticSoftmaxLogitsProcessor(
            model.model,
            self.labels,
            config,
            mode="constrain",
            tokenizer=tokenizer,  # the label set is checked against the model's tokenizer
            eos_token_id=tokenizer.eos_token_id,
            **overrides,
        )
        self.processor: ChoiceLogitsProcessor | None = ChoiceLogitsProcessor(
            self.semsoft, outlines_processor
        )
        self._generator = SteerableGenerator.from_processor(model, self.processor)
        # The label and EOS, nothing more; used when the caller sets no length.
        self._min_new_tokens = max(len(s) for s in self.labels.token_sequences) + 1

    def _kwargs(self, inference_kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs = dict(inference_kwargs)
        if "logits_processor" in kwargs:
            raise ValueError(
                "logits_processor= is not supported: the choice constraint is already "
                "the generator's processor"
            )
        limit = kwargs.get("max_new_tokens")
        if limit is None and "max_length" not in kwargs:
            kwargs["max_new_tokens"] = self._min_new_tokens
        elif limit is not None and limit < self._min_new_tokens:
            raise ValueError(
                f"max_new_tokens={limit} is too short for the longest label plus EOS "
                f"({self._min_new_tokens} tokens)"
            )
        return kwargs

    def _scored(self, texts: list[str], rows: list[SemanticSoftmaxResult]) -> list[ScoredLabel]:
        chosen = self.semsoft.chosen_labels
        out = []
        for text, result, index in zip(texts, rows, chosen, strict=True):
            if text not in self.labels.names:
                raise RuntimeError(
                    f"generated {text!r}, which is not one of the labels {list(self.labels.names)}"
                )
            if index is not None and index >= 0 and self.labels.names[index] != text:
                raise RuntimeError(f"generated {text!r} but the constraint chose index {index}")
            out.append(ScoredLabel.from_result(text, self.labels.names, result))
        return out

    def __call__(self, prompt: Any, **inference_kwargs: Any) -> ScoredLabel | list[ScoredLabel]:
        """Generate the label for one prompt (a list of labels when
        ``num_return_sequences`` > 1), as Outlines does."""
        if self._vllm:
            return self._vllm_generate([prompt], inference_kwargs)[0]
        text = self._generator(prompt, **self._kwargs(inference_kwargs))
        texts = [text] if isinstance(text, str) else list(text)
        scored = self._scored(texts, _result_rows(self.semsoft))
        return scored[0] if isinstance(text, str) else scored

    def batch(
        self, prompts: list[Any], **inference_kwargs: Any
    ) -> list[ScoredLabel] | list[list[ScoredLabel]]:
        """Generate one label per prompt (a list per prompt when
        ``num_return_sequences`` > 1), as Outlines does."""
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise ValueError("prompts must be a list of prompts")
        if self._vllm:
            return self._vllm_generate(list(prompts), inference_kwargs)
        texts = self._generator.batch(list(prompts), **self._kwargs(inference_kwargs))
        flat = [t for item in texts for t in ([item] if isinstance(item, str) else item)]
        scored = self._scored(flat, _result_rows(self.semsoft))
        if all(isinstance(item, str) for item in texts):
            return scored
        samples = len(flat) // len(texts)
        return [scored[i : i + samples] for i in range(0, len(scored), samples)]

    # -- vLLM offline: the semsoft vLLM adapter's constraint instead of Outlines' regex
    def _init_vllm(
        self,
        choices: Sequence[str],
        config: SemsoftConfig | None,
        variants: Mapping[str, Iterable[str]] | None,
        overrides: dict[str, Any],
    ) -> None:
        from semsoft_plugin.engines import vllm as semsoft_vllm

        if variants:
            raise ValueError("variants are not supported for vLLM models")
        self._semsoft_vllm = semsoft_vllm
        # Checks the choices on the engine's tokenizer exactly as for transformers.
        self.labels = choice_label_set(choices, self.model.model.get_tokenizer(), None)
        self.processor = None
        self._options: dict[str, Any] = {
            "config": config,
            "leading_space": self.labels.leading_space,
        }
        self._options.update(overrides)

    def _vllm_generate(self, prompts: list[Any], inference_kwargs: dict[str, Any]) -> Any:
        kwargs = dict(inference_kwargs)
        if kwargs.pop("sampling_params", None) is not None:
            raise ValueError(
                "sampling_params= is not supported with vLLM models: the choice needs the "
                "semsoft request options; pass the SamplingParams fields as keywords"
            )
        sampling = {k: kwargs.pop(k) for k in list(kwargs) if k not in ("use_tqdm", "lora_request")}
        params = self._semsoft_vllm.sampling_params(
            list(self.labels.names), **self._options, **sampling
        )
        # Formatted as Outlines formats it: a str becomes a user turn when there is a
        # chat template, and goes through LLM.chat (generation prompt added).
        formatted = [self.model.type_adapter.format_input(p) for p in prompts]
        llm = self.model.model
        if formatted and isinstance(formatted[0], list):
            outputs = llm.chat(messages=formatted, sampling_params=params, **kwargs)
        else:
            outputs = llm.generate(prompts=formatted, sampling_params=params, **kwargs)
        scored = []
        for output in outputs:
            text = output.outputs[0].text
            if text not in self.labels.names:
                raise RuntimeError(
                    f"vLLM generated {text!r}, which is not one of the labels "
                    f"{list(self.labels.names)}: is the semsoft processor loaded on the engine?"
                )
            result = self._semsoft_vllm.label_scores(output, params, llm)
            if result.probs is None:
                raise RuntimeError(
                    "no top-k token voted for any label and the label tokens are outside "
                    "the returned top-k: raise k"
                )
            scored.append(
                ScoredLabel(
                    text, result.probs, result.constrained_probs, result.fallback, result.coverage
                )
            )
        return scored


def _check_model(model: Any) -> str:
    """``"transformers"`` or ``"vllm"``; ValueError for any other model."""
    from outlines.models.transformers import Transformers
    from outlines.models.vllm_offline import VLLMOffline

    if isinstance(model, Transformers):
        return "transformers"
    if isinstance(model, VLLMOffline):
        return "vllm"
    raise ValueError(
        f"model of type {type(model).__name__} is not supported: give an Outlines model "
        "from outlines.from_transformers or outlines.from_vllm_offline"
    )


def Generator(  # noqa: N802 - mirrors outlines.Generator, which is a function too
    model: Any,
    output_type: Any,
    backend: str | None = None,
    *,
    config: SemsoftConfig | None = None,
    variants: Mapping[str, Iterable[str]] | None = None,
    **overrides: Any,
) -> ChoiceGenerator:
    """Drop-in for ``outlines.Generator`` when the output type is a choice.

    Parameters
    ----------
    model : an Outlines model from ``outlines.from_transformers``
    output_type : a choice
        ``Literal[...]`` of strings, an ``Enum`` with string values,
        ``outlines.types.Choice``, or a regex of literal alternatives.
    backend : {"outlines_core", "xgrammar", "llguidance"}, optional
        Outlines' structured-generation backend for the regex mask (default
        outlines_core).
    config, **overrides : Semantic Softmax settings
    variants : mapping label -> spellings that count as the label (see
        :class:`~semsoft_plugin.core.labels.LabelSet`)

    Returns
    -------
    ChoiceGenerator
        Called with a prompt it returns a :class:`ScoredLabel`; ``.batch`` a list.

    Raises
    ------
    ValueError
        For an output type that is not a choice, choices that cannot be told
        apart at their first token, or a model that is not a transformers model.
    """
    choices = choice_labels(output_type)
    if _check_model(model) == "vllm":
        if backend is not None:
            raise ValueError(f"backend={backend!r} applies to transformers models only")
        # Outlines would send the regex to vLLM's structured outputs, which mask the
        # logits before any logits processor: the silent vote would be gone.
        return ChoiceGenerator(model, choices, None, config=config, **overrides)
    from outlines.backends import get_regex_logits_processor
    from outlines.types.dsl import python_types_to_terms, to_regex

    # Built exactly as outlines.Generator builds it: the mask is Outlines' own.
    regex = to_regex(python_types_to_terms(output_type))
    mask = get_regex_logits_processor(backend, model, regex)
    return ChoiceGenerator(model, choices, mask, config=config, variants=variants, **overrides)


def wrap(
    generator: Any,
    labels: Any,
    *,
    config: SemsoftConfig | None = None,
    variants: Mapping[str, Iterable[str]] | None = None,
    **overrides: Any,
) -> ChoiceGenerator:
    """Add calibrated probabilities to an existing Outlines choice generator.

    Parameters
    ----------
    generator : an ``outlines.Generator`` made with a choice output type
        Its own mask (any backend) stays and runs after the label constraint.
    labels : list of str, a LabelSet or a choice output type
        The choices the generator allows. An Outlines transformers generator keeps
        only its compiled mask, not its output type, so they must be given; a
        mismatch is detected at the first call (``RuntimeError``). A LabelSet gives
        its names, and must have been built with the generator's model's tokenizer
        (``ValueError`` naming both otherwise). A ``str`` is refused, as everywhere
        (:func:`~semsoft_plugin.core.labels.label_names`).
    config, variants, **overrides : as in :func:`Generator`
    """
    from outlines.generator import BlackBoxGenerator, SteerableGenerator

    if isinstance(labels, LabelSet):
        model = getattr(generator, "model", None)
        tokenizer = getattr(model, "hf_tokenizer", None)
        if tokenizer is None and hasattr(getattr(model, "model", None), "get_tokenizer"):
            tokenizer = model.model.get_tokenizer()  # type: ignore[union-attr]
        if tokenizer is not None:
            labels.check_tokenizer(tokenizer, where="outlines.wrap")
        labels = list(labels.names)
    if isinstance(labels, str):
        label_names(labels)  # raises: a string is not a label list
    if isinstance(labels, Sequence):
        choices = list(dict.fromkeys(labels))
        if not all(isinstance(c, str) for c in choices):
            raise ValueError(f"labels {labels!r} must be strings")
    else:
        choices = choice_labels(labels)
    if isinstance(generator, SteerableGenerator):
        mask = generator.logits_processor
        if mask is None:
            raise ValueError("the generator has no output type: there is no choice to score")
        if isinstance(mask, ChoiceLogitsProcessor):
            raise ValueError("the generator is already wrapped")
        return ChoiceGenerator(
            generator.model,
            choices,
            mask,
            config=config,
            variants=variants,
            **overrides,
        )
    if isinstance(generator, BlackBoxGenerator) and _check_model(generator.model) == "vllm":
        own = choice_labels(generator.output_type)
        if set(own) != set(choices):
            raise ValueError(f"labels {choices!r} differ from the generator's choices {own!r}")
        return ChoiceGenerator(generator.model, choices, None, config=config, **overrides)
    raise ValueError(
        f"cannot wrap {type(generator).__name__}: give an outlines.Generator built on a "
        "transformers or vLLM-offline model"
    )
