"""Outlines choice generators on transformers models: one processor, semsoft first.

Outlines takes one logits processor only, so `ChoiceLogitsProcessor` runs
[`SemanticSoftmaxLogitsProcessor`][semsoft_plugin.engines.hf.SemanticSoftmaxLogitsProcessor]
in `"constrain"` mode first, on the raw logits, then Outlines' own regex mask, and checks
that the mask removed none of the label tokens it kept: greedy decoding emits the calibrated
argmax. The scores are taken inside the `generate` call Outlines makes, the labels spelled as
Outlines writes them, the head in float32; a fit's correction is applied at the decision
step to each row alone. Why, and what it costs: docs/outlines.md ("How it plugs in").
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
        An Outlines logits processor (any backend), applied to what the semsoft processor
        returns: every token semsoft kept on a constrained row must survive it, else
        `RuntimeError` (the regex and the labels disagree).
    fitted_correction : Correction | None
        A fit's correction, optional, applied to each row's label probabilities at its
        decision step, before the label tokens' scores are set (greedy emits the corrected
        argmax); a probe reads the hidden state from `hidden`, set by the generator per call.

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
        """Run Outlines' generator on one prompt with the processor armed, then score its text."""
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
