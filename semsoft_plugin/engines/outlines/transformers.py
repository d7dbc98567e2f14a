"""Outlines choice generators on transformers models: one processor, semsoft first.

How it plugs in (checked against Outlines 1.3.3):

* Outlines compiles the choice into a regex and, for transformers models, into an
  in-place masking logits processor (outlines_core, xgrammar or llguidance). The
  only supported way to add a processor is `outlines.Generator(model,
  processor=...)` / `SteerableGenerator.from_processor`, and that processor is
  then the *only* one: passing `logits_processor=` to a call collides with it.
  This module therefore hands Outlines one processor, `ChoiceLogitsProcessor`,
  that runs [`SemanticSoftmaxLogitsProcessor`][semsoft_plugin.engines.hf.SemanticSoftmaxLogitsProcessor] in
  `"constrain"` mode first (it sees the raw logits) and Outlines' own regex mask
  second.
* Agreement with the calibrated argmax: at the decision step the semsoft processor
  leaves only the labels' first tokens, at `log P_sem`; afterwards it forces the
  rest of the chosen label, then EOS. Every one of these tokens spells a prefix of
  a label, so Outlines' mask (applied after) cannot remove any of them and changes
  nothing: greedy decoding emits the calibrated argmax, sampling draws from
  `P_sem`. The processor checks this on every step and raises if the Outlines
  mask ever removed a token it kept (e.g. a wrapped generator whose regex does not
  match the labels given). Outlines' own decision would be different: its prefix
  mask also allows label *fragments* (`"s"`, `"sad"`...) and each fragment
  competes alone, so the label it emits need not be the one the scores favour.
* Position and template: the scores are taken inside the very `generate` call
  Outlines makes, at the first generated token, so they follow Outlines' prompt
  formatting exactly (a string prompt goes through the chat template with a
  generation prompt when the tokenizer has one).
* Label spelling: Outlines writes the choice verbatim, with no leading space, at
  the start of the answer; the labels are scored exactly so
  (`LabelSet(..., leading_space=False)`). Some labels then start with a word
  fragment (SmolLM2 writes `"sadness"` as `"s" "ad" "ness"`), whose output
  embedding says little about the label, so each label's embedding is read from its
  leading-space word (`" sadness"`) instead; `generator.labels.report()` lists
  both.
  Choices that all start with one space (`Literal[" joy", " sad"]`) are scored as
  leading-space words. Verbalizers cannot be used: Outlines' regex only allows the
  choice text itself.
* The output head runs in float32 during the generator's calls
  ([`float32_head`][semsoft_plugin.engines.hf.float32_head], what `hf.classify` and
  `Classifier` use): a bf16 model's scores then equal theirs, and a row's scores do
  not move with the batch it is in (bf16 logits fall on a coarse grid).
* Temperatures: `temperature` is the sampling temperature, as on every engine (given
  to the generator, it is the calls' default; `temperature > 0` samples, `0` is
  greedy); the method's final temperature is `score_temperature`.
* A fit's correction (`fitted_correction=`, loaded from the file `Classifier.save_fit`
  and `semsoft tune --output` write by `semsoft_plugin.app.outlines_fit.load_fit`) is
  applied at the decision step itself, to each row alone: the label tokens' scores
  become `log` of the corrected probabilities (a bias member's
  `softmax(log p + offset)`, or the probe on the hidden state entering the output
  layer at that step, read by `semsoft_plugin.engines.hf_hidden.HiddenAtDecision`
  during the same `generate` call), so the emitted label is the corrected argmax.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from semsoft_plugin.core.result import ScoredLabel
from semsoft_plugin.core.softmax import SemanticSoftmaxResult
from semsoft_plugin.engines.hf import SemanticSoftmaxLogitsProcessor, float32_head
from semsoft_plugin.engines.hf_hidden import HiddenAtDecision
from semsoft_plugin.engines.outlines.base import ChoiceGenerator, ChoiceOptions, Correction, Engine
from semsoft_plugin.engines.outlines.choices import choice_label_set

__all__ = [
    "ChoiceLogitsProcessor",
    "TransformersChoiceGenerator",
    "outlines_mask",
    "sampling_kwargs",
]


class ChoiceLogitsProcessor:
    """Semantic Softmax constraint followed by an Outlines mask, as one processor.

    Parameters
    ----------
    semsoft : SemanticSoftmaxLogitsProcessor
        In `"constrain"` mode, with the tokenizer's EOS as `eos_token_id`.
    outlines_processor : Any
        An Outlines logits processor (any backend)
        Applied to what the semsoft processor returns. It only ever removes tokens;
        on a step where semsoft constrained a row, every token semsoft kept must
        survive it, else `RuntimeError` (the regex and the labels disagree).
    fitted_correction : Correction | None
        A fit's correction, optional
        Applied to each row's label probabilities at its decision step, before the
        label tokens' scores are set (so greedy emits the corrected argmax); a probe
        reads the hidden state from `hidden`, which the generator sets for the
        duration of a call.

    Attributes
    ----------
    corrected : dict
        Batch row -> its corrected `[L]` probabilities, for the last generation.
    """

    def __init__(
        self,
        semsoft: SemanticSoftmaxLogitsProcessor,
        outlines_processor: Any,
        fitted_correction: Correction | None = None,
    ) -> None:
        if semsoft.mode != "constrain":
            raise ValueError(
                f"the semsoft processor must be in constrain mode, not {semsoft.mode!r}"
            )
        self.semsoft = semsoft
        self.outlines_processor = outlines_processor
        self.fitted_correction = fitted_correction
        self.hidden: HiddenAtDecision | None = None
        self.corrected: dict[int, Tensor] = {}

    def reset(self) -> None:
        """Start a new generation (Outlines calls this before every call)."""
        self.semsoft.reset()
        self.outlines_processor.reset()
        self.corrected = {}

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        before = self.semsoft.results if self.fitted_correction is not None else []
        scores = self.semsoft(input_ids, scores)
        if self.fitted_correction is not None:
            scores = self._correct(self.fitted_correction, before, scores)
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

    def _correct(self, correction: Correction, before: list[Any], scores: Tensor) -> Tensor:
        """The rows that decided on this step (a result that was not there before) get
        the corrected probabilities as their label tokens' scores. The hidden state is
        the output layer's input on this very step (the last call the hook saw), never
        a later step's."""
        after = self.semsoft.results
        rows = [
            b
            for b, r in enumerate(after)
            if r is not None and (b >= len(before) or before[b] is not r)
        ]
        if not rows:
            return scores
        probs = torch.stack([after[b].probs for b in rows]).to(torch.float64)  # type: ignore[union-attr]
        hidden = None
        if correction.needs_hidden:
            if self.hidden is None or not self.hidden.calls:
                raise RuntimeError(
                    f"the fitted correction ({correction.procedure}) needs the decision "
                    "step's hidden state, which the output layer did not give"
                )
            hidden = self.hidden.calls[-1][rows].numpy()
        fixed = torch.as_tensor(
            correction.apply(probs.numpy(), self.semsoft.labels.names, hidden),
            dtype=torch.float64,
        )
        answer_ids = torch.tensor(self.semsoft.labels.answer_token_ids, device=scores.device)
        for j, b in enumerate(rows):
            self.corrected[b] = fixed[j]
            scores[b, answer_ids] = fixed[j].clamp_min(1e-30).log().to(scores.device, scores.dtype)
        return scores


def outlines_mask(model: Any, output_type: Any, backend: str | None) -> Any:
    """Outlines' own regex mask for a choice, built exactly as `outlines.Generator`
    builds it (`backend`: outlines_core by default, xgrammar or llguidance)."""
    from outlines.backends import get_regex_logits_processor
    from outlines.types.dsl import python_types_to_terms, to_regex

    regex = to_regex(python_types_to_terms(output_type))
    return get_regex_logits_processor(backend, model, regex)


def sampling_kwargs(temperature: Any) -> dict[str, Any]:
    """`generate` keywords that make `temperature` the sampling temperature, as on
    vLLM: `> 0` samples at that temperature, `0` is greedy (transformers would
    otherwise ignore a temperature without `do_sample=True`)."""
    number = isinstance(temperature, int | float) and not isinstance(temperature, bool)
    if not number or not temperature >= 0:  # NaN fails >= 0 too
        raise ValueError(f"temperature={temperature!r} must be a number >= 0 (sampling)")
    if temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": float(temperature)}


def _result_rows(proc: SemanticSoftmaxLogitsProcessor) -> list[SemanticSoftmaxResult]:
    rows = proc.results
    if any(r is None for r in rows):
        raise RuntimeError("the decision step was not reached: nothing was generated")
    return rows  # type: ignore[return-value]


class TransformersChoiceGenerator(ChoiceGenerator):
    """A choice generator on an `outlines.from_transformers` model.

    Parameters
    ----------
    model : Any
        An Outlines transformers model
    choices : Sequence[str]
        The label strings, as Outlines writes them
    outlines_processor : Any
        The Outlines mask for the choices (`outlines_mask`, or
        a wrapped generator's own); it runs after the label constraint
    options : ChoiceOptions
        The settings, label variants, a fit's correction (applied at the decision step
        after the settings; its labels must be the choices) and the sampling
        temperature (`ChoiceOptions`)

    Attributes
    ----------
    semsoft : SemanticSoftmaxLogitsProcessor
        The label constraint, in `"constrain"` mode.
    processor : ChoiceLogitsProcessor
        The one processor handed to Outlines (semsoft constraint, then its mask).
    """

    engine: Engine = "transformers"

    def __init__(
        self,
        model: Any,
        choices: Sequence[str],
        outlines_processor: Any,
        options: ChoiceOptions,
    ) -> None:
        super().__init__(model)
        from outlines.generator import SteerableGenerator

        temperature, fitted_correction = options.temperature, options.fitted_correction
        self._sampling = {} if temperature is None else sampling_kwargs(temperature)

        tokenizer = model.hf_tokenizer
        self.labels = choice_label_set(choices, tokenizer, options.variants)
        self.semsoft = SemanticSoftmaxLogitsProcessor(
            model.model,
            self.labels,
            options.config,
            mode="constrain",
            tokenizer=tokenizer,  # the label set is checked against the model's tokenizer
            eos_token_id=tokenizer.eos_token_id,
        )
        if fitted_correction is not None:
            fitted_correction.check_labels(self.labels.names)
        self.processor = ChoiceLogitsProcessor(self.semsoft, outlines_processor, fitted_correction)
        self._generator = SteerableGenerator.from_processor(model, self.processor)
        # The label and EOS, nothing more; used when the caller sets no length.
        self._min_new_tokens = max(len(s) for s in self.labels.token_sequences) + 1

    def _kwargs(self, inference_kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs = dict(inference_kwargs)
        if "do_sample" in kwargs:  # transformers' own terms, taken as given
            pass
        elif "temperature" in kwargs:  # the sampling temperature, as on vLLM
            kwargs.update(sampling_kwargs(kwargs.pop("temperature")))
        else:
            kwargs.update(self._sampling)
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

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """The block of one generate call: the float32 head, and the hidden-state hook
        a probe reads at the decision step."""
        correction = self.processor.fitted_correction
        probe = correction is not None and correction.needs_hidden
        with (
            float32_head(self.model.model),
            HiddenAtDecision(self.model.model if probe else None) as hook,
        ):
            self.processor.hidden = hook
            try:
                yield
            finally:
                self.processor.hidden = None

    def _scored(self, texts: list[str], rows: list[SemanticSoftmaxResult]) -> list[ScoredLabel]:
        chosen = self.semsoft.chosen_labels
        out = []
        for row, (text, result, index) in enumerate(zip(texts, rows, chosen, strict=True)):
            if text not in self.labels.names:
                raise RuntimeError(
                    f"generated {text!r}, which is not one of the labels {list(self.labels.names)}"
                )
            if index is not None and index >= 0 and self.labels.names[index] != text:
                raise RuntimeError(f"generated {text!r} but the constraint chose index {index}")
            scored = ScoredLabel.from_result(text, self.labels.names, result)
            fixed = self.processor.corrected.get(row)
            if fixed is not None:
                probs = dict(zip(self.labels.names, fixed.tolist(), strict=True))
                scored = ScoredLabel(
                    text, probs, scored.constrained_probs, scored.fallback, scored.coverage
                )
            out.append(scored)
        return out

    def __call__(self, prompt: Any, **inference_kwargs: Any) -> ScoredLabel | list[ScoredLabel]:
        """Generate the label for one prompt (a list of labels when
        `num_return_sequences` > 1), as Outlines does."""
        kwargs = self._kwargs(inference_kwargs)
        with self._running():
            text = self._generator(prompt, **kwargs)
        texts = [text] if isinstance(text, str) else list(text)
        scored = self._scored(texts, _result_rows(self.semsoft))
        return scored[0] if isinstance(text, str) else scored

    def _batch(
        self, prompts: list[Any], inference_kwargs: dict[str, Any]
    ) -> list[ScoredLabel] | list[list[ScoredLabel]]:
        kwargs = self._kwargs(inference_kwargs)
        with self._running():
            texts = self._generator.batch(prompts, **kwargs)
        flat = [t for item in texts for t in ([item] if isinstance(item, str) else item)]
        scored = self._scored(flat, _result_rows(self.semsoft))
        if all(isinstance(item, str) for item in texts):
            return scored
        samples = len(flat) // len(texts)
        return [scored[i : i + samples] for i in range(0, len(scored), samples)]
