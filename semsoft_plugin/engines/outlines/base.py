"""What the Outlines choice generators of every engine share.

`model_engine` names an Outlines model's engine, so that the package's entry points
([`semsoft_plugin.engines.outlines.Generator`][semsoft_plugin.engines.outlines.Generator], [`wrap`][semsoft_plugin.engines.outlines.wrap])
pick the generator class for it; `ChoiceGenerator` is the interface those classes
implement, so a caller holds one type whatever the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from semsoft_plugin.core.config import SemsoftConfig
from semsoft_plugin.core.labels import LabelSet
from semsoft_plugin.core.result import ScoredLabel

__all__ = [
    "ChoiceGenerator",
    "ChoiceOptions",
    "Correction",
    "Engine",
    "method_config",
    "model_engine",
]

Engine = Literal["transformers", "vllm"]


class Correction(Protocol):
    """What a generator needs of a fit's correction (the app's `FittedCorrection`, read
    from a config file by `semsoft_plugin.fit.fitted.load_fitted`): engines take the
    loaded object, as they may not import the app that reads the file."""

    @property
    def procedure(self) -> str:
        """The family member that won (`"offset"`, `"batch"`, `"contextual"`,
        `"probe"`)."""

    @property
    def needs_hidden(self) -> bool:
        """Whether `apply` reads the decision step's hidden state."""

    def check_labels(self, names: Any) -> None:
        """`ValueError` unless `names` are the fitted labels."""

    def apply(self, probs: Any, classes: Any, hidden: Any = None) -> Any:
        """`[N, L]` corrected probabilities in `classes` order, row by row."""


def model_engine(model: Any) -> Engine:
    """`"transformers"` or `"vllm"`; ValueError for any other model."""
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


def method_config(config: SemsoftConfig | None, overrides: dict[str, Any]) -> SemsoftConfig:
    """The Semantic Softmax settings of a generator: `config` with the keyword
    overrides, the same on every engine. The method's final temperature is
    `score_temperature` (`temperature` is the sampling temperature on every
    engine); anything that is not a setting, or an old name (`method_temperature`), is
    refused by name ([`SemsoftConfig.replace`][semsoft_plugin.core.config.SemsoftConfig.replace])."""
    return (config or SemsoftConfig()).replace(**overrides)


@dataclass(frozen=True)
class ChoiceOptions:
    """What a choice generator is asked to do besides its choices, made once from the
    keywords of [`Generator`][semsoft_plugin.engines.outlines.Generator] /
    [`wrap`][semsoft_plugin.engines.outlines.wrap] and passed down whole to the engine's
    class, as vLLM passes `SamplingParams` (the request's options travel as one object,
    never as a keyword block each layer repeats).

    Attributes
    ----------
    config : SemsoftConfig
        The Semantic Softmax settings (with the keyword overrides applied).
    variants : Mapping[str, Iterable[str]] | None
        Label -> spellings that count as the label (transformers models only).
    fitted_correction : Correction | None
        A fit's correction applied at the decision step (on vLLM models: greedy only,
        the probe's hidden state read back from the logits row).
    temperature : float | None
        The sampling temperature, the calls' default (`None`: greedy).

    Examples
    --------
    >>> from semsoft_plugin.engines.outlines.base import ChoiceOptions
    >>> ChoiceOptions.of(k=20, temperature=0.7).config.k
    20
    """

    config: SemsoftConfig = field(default_factory=SemsoftConfig)
    variants: Mapping[str, Iterable[str]] | None = None
    fitted_correction: Correction | None = None
    temperature: float | None = None

    @classmethod
    def of(
        cls,
        options: ChoiceOptions | None = None,
        /,
        *,
        config: SemsoftConfig | None = None,
        variants: Mapping[str, Iterable[str]] | None = None,
        fitted_correction: Correction | None = None,
        temperature: float | None = None,
        **overrides: Any,
    ) -> ChoiceOptions:
        """`options` as given, or the options the keywords name (not both).

        Parameters
        ----------
        options : ChoiceOptions | None
            Options made earlier.
        config : SemsoftConfig | None
            The settings (default `SemsoftConfig()`).
        variants : Mapping[str, Iterable[str]] | None
            Label spellings.
        fitted_correction : Correction | None
            A fit's correction.
        temperature : float | None
            The sampling temperature.
        **overrides : Any
            Any [`SemsoftConfig`][semsoft_plugin.core.config.SemsoftConfig] field; an unknown name
            or an old one is refused by name (`method_config`).

        Returns
        -------
        ChoiceOptions
            The options.
        """
        keywords = (config, variants, fitted_correction, temperature)
        if options is not None:
            if any(v is not None for v in keywords) or overrides:
                raise ValueError("give options= or the option keywords, not both")
            return options
        return cls(method_config(config, overrides), variants, fitted_correction, temperature)


class ChoiceGenerator(ABC):
    """A choice generator whose outputs carry calibrated probabilities.

    Made by [`Generator`][semsoft_plugin.engines.outlines.Generator] or
    [`wrap`][semsoft_plugin.engines.outlines.wrap]; called like an Outlines generator.

    Attributes
    ----------
    model : Any
        The Outlines model
    labels : LabelSet
        The choices, bound to the model's tokenizer as Outlines writes them.
    """

    engine: Engine  # the engine of the models a subclass drives
    labels: LabelSet

    def __init__(self, model: Any) -> None:
        found = model_engine(model)  # ValueError for a model no subclass drives
        if found != self.engine:
            raise ValueError(
                f"{type(self).__name__} drives {self.engine} models, not {found} models: "
                "use semsoft_plugin.engines.outlines.Generator"
            )
        self.model = model

    @abstractmethod
    def __call__(self, prompt: Any, **inference_kwargs: Any) -> ScoredLabel | list[ScoredLabel]:
        """Generate the label for one prompt (a list of labels when
        `num_return_sequences` > 1), as Outlines does."""

    def batch(
        self, prompts: list[Any], **inference_kwargs: Any
    ) -> list[ScoredLabel] | list[list[ScoredLabel]]:
        """Generate one label per prompt (a list per prompt when
        `num_return_sequences` > 1), as Outlines does."""
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise ValueError("prompts must be a list of prompts")
        return self._batch(list(prompts), inference_kwargs)

    @abstractmethod
    def _batch(
        self, prompts: list[Any], inference_kwargs: dict[str, Any]
    ) -> list[ScoredLabel] | list[list[ScoredLabel]]:
        """[`batch`][semsoft_plugin.engines.vllm.batch] on a checked list of prompts."""
