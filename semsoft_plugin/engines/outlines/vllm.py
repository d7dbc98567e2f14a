"""Outlines choice generators on vLLM offline models, through the plugin's vLLM adapter.

For `outlines.from_vllm_offline` models Outlines would send the regex through vLLM's
structured outputs, which mask the logits before any logits processor runs, so the
silent vote would be gone. The request goes through the plugin's vLLM adapter instead
([`semsoft_plugin.engines.vllm.sampling_params`][semsoft_plugin.engines.vllm.sampling_params]: its processor does the label
constraint, the scores are read back with [`semsoft_plugin.engines.vllm.label_scores`][semsoft_plugin.engines.vllm.label_scores]),
with the prompt formatted as Outlines formats it. The engine needs the processor
(`LLM(..., logits_processors=[semsoft_plugin.engines.vllm.SemanticSoftmaxLogitsProcessor])`
or the installed entry point) and `max_logprobs >= k` (50 by default).
`constrained_probs` is None there when a label's first token is outside the
returned top-k.

`temperature` is vLLM's sampling temperature here as on transformers models (given to
the generator it is the calls' default; 0, the default, is greedy); the method's final
temperature is `score_temperature`. `variants=` is refused: the engine's processor
binds the label names it is sent (`semsoft_labels`), and no request option carries
other spellings, so the scores could not count them. `fitted_correction=` is refused
too: the probe reads the decision step's hidden state, which vLLM's generate runner does
not return, and a bias offset would have to act inside the engine's processor (no request
option carries one) for the emitted label to be the corrected argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from semsoft_plugin.core.result import ScoredLabel
from semsoft_plugin.engines.outlines.base import ChoiceGenerator, ChoiceOptions, Engine
from semsoft_plugin.engines.outlines.choices import choice_label_set
from semsoft_plugin.engines.vllm.params import check_engine_logprobs, sampling_params
from semsoft_plugin.engines.vllm.reader import label_scores

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
        The settings and the sampling temperature (`ChoiceOptions`); its
        `variants` and `fitted_correction` are not supported (`ValueError` naming
        each): vLLM's request options carry label names only, and no option carries an
        offset or returns the hidden state (module docstring)

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
        if fitted_correction is not None:
            raise ValueError(
                f"fitted_correction ({fitted_correction.procedure}) is not supported on vLLM "
                "models: the engine's processor decides the label and no vLLM request option "
                "carries an offset or returns the hidden state; use a transformers model "
                "(outlines.from_transformers), or a fit without a correction"
            )
        if variants:  # an empty mapping has nothing to drop
            raise ValueError(
                "variants= is not supported on vLLM models: the engine's processor scores "
                "the label names it is sent, and no vLLM request option carries other "
                "spellings; use a transformers model (outlines.from_transformers) for variants"
            )
        # Checks the choices on the engine's tokenizer exactly as for transformers.
        self.labels = choice_label_set(choices, model.model.get_tokenizer(), None)
        self.processor = None
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
        params = sampling_params(list(self.labels.names), **{**self._options, **sampling})
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
