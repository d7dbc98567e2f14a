"""Outlines adapter: calibrated probabilities for existing choice generators.

Change one import (`wrap(gen, labels)` keeps a generator that already exists):

```python
# from outlines import Generator
from semsoft_plugin.engines.outlines import Generator

gen = Generator(model, Literal["joy", "sadness", "anger"])
label = gen(prompt)            # "sadness": the same str Outlines returns
label.probs                    # {"joy": 0.07, "sadness": 0.88, "anger": 0.05}
```

Choice output types only (`choices`), else `ValueError`; one class per engine
(`transformers`, `vllm`; interface in `base`), chosen from the model: docs/outlines.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from semsoft_plugin.core.labels import LabelSet, label_names
from semsoft_plugin.engines.outlines.base import ChoiceGenerator, ChoiceOptions, model_engine
from semsoft_plugin.engines.outlines.choices import choice_labels
from semsoft_plugin.engines.outlines.transformers import (
    ChoiceLogitsProcessor,
    TransformersChoiceGenerator,
    outlines_mask,
)

__all__ = ["Generator", "wrap"]


def Generator(  # noqa: N802 - mirrors outlines.Generator, which is a function too
    model: Any,
    output_type: Any,
    backend: str | None = None,
    *,
    options: ChoiceOptions | None = None,
    **keywords: Any,
) -> ChoiceGenerator:
    """Drop-in for `outlines.Generator` when the output type is a choice.

    Parameters
    ----------
    model : Any
        An Outlines model from `outlines.from_transformers` or
        `outlines.from_vllm_offline`
    output_type : Any
        A choice
        `Literal[...]` of strings, an `Enum` with string values,
        `outlines.types.Choice`, or a regex of literal alternatives.
    backend : {"outlines_core", "xgrammar", "llguidance"}, optional
        Outlines' structured-generation backend for the regex mask (default
        outlines_core); transformers models only.
    options : ChoiceOptions | None
        The generator's options as one object (`ChoiceOptions`),
        passed down whole to the engine's class; or, instead, its keywords:
    **keywords : Any
        `config` and its fields (`k`, `tau`, ...), `temperature` (the sampling one; unset is
        greedy), `variants` and `fitted_correction` (transformers models only): docs/outlines.md
        ("The same settings on both engines"); from a fit file use
        [`load_fit`][semsoft_plugin.engines.outlines.fit.load_fit].

    Returns
    -------
    ChoiceGenerator
        The engine's class (`TransformersChoiceGenerator` or
        `VLLMChoiceGenerator`). Called with a prompt it returns a
        [`ScoredLabel`][semsoft_plugin.core.result.ScoredLabel]; `.batch` a list.

    Raises
    ------
    ValueError
        For an output type that is not a choice, choices that cannot be told
        apart at their first token, or a model that is neither a transformers nor a
        vLLM offline model.
    """
    choices = choice_labels(output_type)
    options = ChoiceOptions.of(options, **keywords)
    if model_engine(model) == "vllm":
        from semsoft_plugin.engines.outlines.vllm import VLLMChoiceGenerator

        if backend is not None:
            raise ValueError(f"backend={backend!r} applies to transformers models only")
        # Outlines would send the regex to vLLM's structured outputs, which mask the
        # logits before any logits processor: the silent vote would be gone.
        return VLLMChoiceGenerator(model, choices, options)
    # Built exactly as outlines.Generator builds it: the mask is Outlines' own.
    mask = outlines_mask(model, output_type, backend)
    return TransformersChoiceGenerator(model, choices, mask, options)


def wrap(
    generator: Any,
    labels: Any,
    *,
    options: ChoiceOptions | None = None,
    **keywords: Any,
) -> ChoiceGenerator:
    """Add calibrated probabilities to an existing Outlines choice generator.

    Parameters
    ----------
    generator : Any
        An `outlines.Generator` made with a choice output type
        Its own mask (any backend) stays and runs after the label constraint.
    labels : Any
        The choices the generator allows: list of str, a LabelSet built with its model's
        tokenizer, or a choice output type (a `str` is refused). Outlines keeps only the
        compiled mask, so they must be given; a mismatch raises `RuntimeError` at the first call.
    options : ChoiceOptions | None
        The options as one object, as in [`Generator`][semsoft_plugin.engines.outlines.Generator].
    **keywords : Any
        As in [`Generator`][semsoft_plugin.engines.outlines.Generator] (`temperature=` the sampling
        one)
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
    options = ChoiceOptions.of(options, **keywords)
    if isinstance(generator, SteerableGenerator):
        mask = generator.logits_processor
        if mask is None:
            raise ValueError("the generator has no output type: there is no choice to score")
        if isinstance(mask, ChoiceLogitsProcessor):
            raise ValueError("the generator is already wrapped")
        return TransformersChoiceGenerator(generator.model, choices, mask, options)
    if isinstance(generator, BlackBoxGenerator) and model_engine(generator.model) == "vllm":
        from semsoft_plugin.engines.outlines.vllm import VLLMChoiceGenerator

        own = choice_labels(generator.output_type)
        if set(own) != set(choices):
            raise ValueError(f"labels {choices!r} differ from the generator's choices {own!r}")
        return VLLMChoiceGenerator(generator.model, choices, options)
    raise ValueError(
        f"cannot wrap {type(generator).__name__}: give an outlines.Generator built on a "
        "transformers or vLLM-offline model"
    )
