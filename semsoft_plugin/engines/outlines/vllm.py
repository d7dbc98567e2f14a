"""Outlines choice generators on vLLM offline models, through the plugin's vLLM adapter.

Outlines would send the regex through vLLM's structured outputs, which mask the logits
before any logits processor runs (the silent vote gone, the probe's hidden state unreadable).
The request goes through
[`sampling_params`][semsoft_plugin.engines.vllm.sampling_params] instead, its processor
doing the label constraint, and is read back with
[`label_scores`][semsoft_plugin.engines.vllm.label_scores]. `temperature` is vLLM's
sampling temperature (unset is greedy), `variants=` is refused, and a fit's correction is
applied to the decision step's row as the engine computed it (greedy only). What the engine
needs and why: docs/outlines.md ("How it plugs in").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from semsoft_plugin.core.result import ScoredLabel
from semsoft_plugin.engines.outlines.base import (
    ChoiceGenerator,
    ChoiceOptions,
    Correction,
    Engine,
)
from semsoft_plugin.engines.outlines.choices import choice_label_set
from semsoft_plugin.engines.vllm.params import check_engine_logprobs, own_row_key, sampling_params
from semsoft_plugin.engines.vllm.reader import label_scores, output_hidden

__all__ = ["VLLMChoiceGenerator"]


class VLLMChoiceGenerator(ChoiceGenerator):
    """A choice generator on an `outlines.from_vllm_offline` model.

    Parameters
    ----------
    model : Any
        An Outlines vLLM offline model
    choices : Sequence[str]
        The label strings, as Outlines writes them
    options : ChoiceOptions
        The settings, the sampling temperature and a fit's correction
        (`ChoiceOptions`); `variants` are not supported (`ValueError`): vLLM's request
        options carry label names only; a correction goes with greedy decoding only
        (module docstring)

    Attributes
    ----------
    processor : None
        No processor is handed to Outlines: the engine's own semsoft processor
        constrains the labels.
    """

    engine: Engine = "vllm"

    def __init__(
        self,
        model: Any,
        choices: Sequence[str],
        options: ChoiceOptions,
    ) -> None:
        super().__init__(model)
        fitted_correction, variants, temperature = (
            options.fitted_correction, options.variants, options.temperature
        )  # fmt: skip
        if variants:  # an empty mapping has nothing to drop
            raise ValueError(
                "variants= is not supported on vLLM models: the engine's processor scores "
                "the label names it is sent, and no vLLM request option carries other "
                "spellings; use a transformers model (outlines.from_transformers) for variants"
            )
        # Checks the choices on the engine's tokenizer exactly as for transformers.
        self.labels = choice_label_set(choices, model.model.get_tokenizer(), None)
        self.processor = None
        self.correction = fitted_correction
        if fitted_correction is not None:
            fitted_correction.check_labels(self.labels.names)
            _check_greedy(temperature, fitted_correction)
            if fitted_correction.needs_hidden:
                from semsoft_plugin.engines.vllm.reader_tables import hidden_refusal

                why = hidden_refusal(model.model)
                if why is not None:
                    raise ValueError(f"fitted_correction (probe): {why}")
        cfg = options.config
        check_engine_logprobs(model.model.llm_engine.model_config, cfg.k, "k")
        self._options: dict[str, Any] = {"config": cfg, "leading_space": self.labels.leading_space}
        if temperature is not None:
            self._options["temperature"] = temperature

    def __call__(self, prompt: Any, **inference_kwargs: Any) -> ScoredLabel | list[ScoredLabel]:
        """Generate the label for one prompt, as Outlines does."""
        return self._generate([prompt], inference_kwargs)[0]

    def _batch(
        self, prompts: list[Any], inference_kwargs: dict[str, Any]
    ) -> list[ScoredLabel] | list[list[ScoredLabel]]:
        return self._generate(prompts, inference_kwargs)

    def _generate(self, prompts: list[Any], inference_kwargs: dict[str, Any]) -> list[ScoredLabel]:
        kwargs = dict(inference_kwargs)
        if kwargs.pop("sampling_params", None) is not None:
            raise ValueError(
                "sampling_params= is not supported with vLLM models: the choice needs the "
                "semsoft request options; pass the SamplingParams fields as keywords"
            )
        sampling = {k: kwargs.pop(k) for k in list(kwargs) if k not in ("use_tqdm", "lora_request")}
        correction = self.correction
        if correction is not None:
            _check_greedy(sampling.get("temperature"), correction)
            # The row as the engine computed it, read and never written: one token.
            sampling.update(mode="observe", max_tokens=1, hidden=correction.needs_hidden)
        params = sampling_params(list(self.labels.names), **{**self._options, **sampling})
        # Formatted as Outlines formats it: a str becomes a user turn when there is a
        # chat template, and goes through LLM.chat (generation prompt added).
        formatted = [self.model.type_adapter.format_input(p) for p in prompts]
        llm = self.model.model
        # A kept hidden state is one request's row: one row key per prompt.
        hidden = correction is not None and correction.needs_hidden
        each = [own_row_key(params) for _ in formatted] if hidden else params
        if formatted and isinstance(formatted[0], list):
            outputs = llm.chat(messages=formatted, sampling_params=each, **kwargs)
        else:
            outputs = llm.generate(prompts=formatted, sampling_params=each, **kwargs)
        if correction is not None:
            return self._corrected(correction, outputs, each, llm)
        scored = []
        for output in outputs:
            text = output.outputs[0].text
            if text not in self.labels.names:
                raise RuntimeError(
                    f"vLLM generated {text!r}, which is not one of the labels "
                    f"{list(self.labels.names)}: is the semsoft processor loaded on the engine?"
                )
            result = label_scores(output, params, llm)
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

    def _corrected(
        self, correction: Correction, outputs: list[Any], params: Any, llm: Any
    ) -> list[ScoredLabel]:
        """Each observed row's scores with the fit's correction applied (the probe on the
        hidden state read back from the row), and its argmax as the label."""
        import numpy as np

        names = list(self.labels.names)
        each = params if isinstance(params, list) else [params] * len(outputs)
        results = [
            label_scores(o, p, llm, check_text=False) for o, p in zip(outputs, each, strict=True)
        ]
        if any(r.probs is None for r in results):
            raise RuntimeError(
                "no top-k token voted for any label and the label tokens are outside the "
                "returned top-k: raise k"
            )
        probs = np.array([[r.probs[n] for n in names] for r in results if r.probs], float)
        hidden = None
        if correction.needs_hidden:
            steps = [r.decision_step or 0 for r in results]
            hidden = torch.stack(output_hidden(llm, outputs, each, steps)).numpy()
        corrected = correction.apply(probs, tuple(names), hidden)
        return [
            ScoredLabel(
                names[int(np.argmax(row))],
                {n: float(p) for n, p in zip(names, row, strict=True)},
                r.constrained_probs,
                r.fallback,
                r.coverage,
            )
            for row, r in zip(corrected, results, strict=True)
        ]


def _check_greedy(temperature: Any, correction: Correction) -> None:
    """`ValueError` for a sampling temperature with a fit's correction: the label is the
    corrected argmax, chosen outside the engine's sampler."""
    if temperature not in (None, 0, 0.0):
        raise ValueError(
            f"temperature={temperature!r} with a fitted correction ({correction.procedure}) on "
            "a vLLM model: the corrected label is chosen as the argmax outside the engine's "
            "sampler, so only greedy decoding is supported; leave temperature unset or 0"
        )
